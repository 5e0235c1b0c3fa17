"""The ATen backward recipes of the joint program: an op eager differentiates by one ATen backward
function (a convolution, a training batch norm, a 2-D pool, an attention eager runs as ATen's flash
CPU kernel) is recognized here (`aten_backward`), and its backward is that function, called as
eager's autograd node calls it, on the values that node saves (`AtenBackward`; joint.py records
the call, its "aten" ops).  The backward functions are runtime's (convolution_vjp, batch_norm_vjp,
the pools'), and the attention's below: its forward runs the flash kernel that also returns the
log-sum-exp its backward reads.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for

from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar
from fjit.core.meta import ATTENTION_PARAMS, attention_backend, meta_tensor
from fjit.runtime import (avg_pool2d_vjp, batch_norm_vjp, convolution_vjp, laid_out, max_pool2d,
                          max_pool2d_vjp, max_pool2d_with_indices)

_CONVOLUTIONS = {torch.conv1d: 1, torch.conv2d: 2, torch.conv3d: 3}


def convolution_args(b: BoundSymbol) -> tuple | None:
    """(x, w, bias, stride, padding, dilation, groups) of a convolution with numeric padding on
    tensors of a floating dtype, each size a tuple of the spatial rank; None for anything else."""
    n = _CONVOLUTIONS.get(b.sym.fn)
    if n is None:
        return None
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    given = dict(zip(names, b.args))
    given.update(b.kwargs)
    if set(given) - set(names) or "input" not in given or "weight" not in given:
        return None
    x, w, bias = given["input"], given["weight"], given.get("bias")
    if not (isinstance(x, TensorVar) and isinstance(w, TensorVar) and x.ndim == n + 2
            and (bias is None or isinstance(bias, TensorVar)) and x.dtype.is_floating_point):
        return None
    sizes = []
    for key, default in (("stride", 1), ("padding", 0), ("dilation", 1)):
        v = given.get(key, default)
        v = (v,) * n if type(v) is int else tuple(v) if isinstance(v, (tuple, list)) else None
        if v is None or len(v) != n or not all(type(i) is int for i in v):
            return None    # padding="same"/"valid", or a traced number
        sizes.append(v)
    groups = given.get("groups", 1)
    if type(groups) is not int:
        return None
    return (x, w, bias, *sizes, groups)


_BATCH_NORM = torch.ops.aten._native_batch_norm_legit_functional.default


def batch_norm_args(b: BoundSymbol) -> tuple | None:
    """(x, weight, bias, eps) of a training batch norm as frontend/stateful_ops traces nn.BatchNorm
    (ATen's functional op: output, batch mean and inverse std, new running statistics), on a
    floating tensor, whose only output autograd differentiates is the normalized one."""
    if b.sym.fn is not _BATCH_NORM or len(b.args) != 8 or b.kwargs:
        return None
    x, weight, bias, _, _, training, _, eps = b.args
    outs = b.outputs()
    if training is not True or not isinstance(x, TensorVar) or not x.dtype.is_floating_point \
            or len(outs) != 5 or any(v.requires_grad for v in outs[1:]):
        return None
    return x, weight, bias, eps


_MAX_POOL_PARAMS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")


def _max_pool_args(b: BoundSymbol) -> tuple | None:
    """(x, (kernel_size, stride, padding, dilation, ceil_mode)) of a max pool the frontend routed
    through runtime.max_pool2d (decompositions/nn_ops.py: a contiguous NCHW CPU input), or of a
    torch call of one with literal sizes on such an input (a small one: decompositions/nn_ops.py
    leaves it to ATen)."""
    if b.sym.fn is max_pool2d and len(b.args) == 6 and not b.kwargs and isinstance(b.args[0], TensorVar):
        return b.args[0], tuple(b.args[1:])
    if b.sym.fn not in (F.max_pool2d, torch.max_pool2d):
        return None
    given = dict(zip(_MAX_POOL_PARAMS, b.args), **b.kwargs)
    x = given.get("input")
    if set(given) - set(_MAX_POOL_PARAMS) or given.get("return_indices") or not isinstance(x, TensorVar) \
            or x.ndim != 4 or x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64) \
            or x.strides != tuple(make_contiguous_strides_for(x.shape)) \
            or type(given.get("ceil_mode", False)) is not bool:
        return None
    if (sizes := _literal_sizes(given, (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1)))) is None:
        return None
    kernel, stride, padding, dilation = (tuple(v) for v in sizes)
    return x, (kernel, stride or kernel, padding, dilation, given.get("ceil_mode", False))


def _literal_sizes(given: dict, keys: tuple) -> list | None:
    """A pool's size arguments ((name, default) each) as lists of ints ([] for a default stride),
    or None where one is not literal (a traced number)."""
    sizes = [given.get(key, default) for key, default in keys]
    sizes = [[] if v is None and key == "stride" else [v, v] if type(v) is int else list(v)
             if isinstance(v, (tuple, list)) and all(type(i) is int for i in v) else None
             for (key, _), v in zip(keys, sizes)]
    return None if None in sizes else sizes


_AVG_POOL_PARAMS = ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                    "divisor_override")


def _avg_pool_args(b: BoundSymbol) -> tuple | None:
    """(x, (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)) of a
    2-D average pool with literal sizes, as ATen's avg_pool2d_backward takes them."""
    if b.sym.fn is not F.avg_pool2d:
        return None
    given = dict(zip(_AVG_POOL_PARAMS, b.args), **b.kwargs)
    x = given.get("input")
    if set(given) - set(_AVG_POOL_PARAMS) or not isinstance(x, TensorVar) or x.ndim not in (3, 4):
        return None
    if (sizes := _literal_sizes(given, (("kernel_size", None), ("stride", None), ("padding", 0)))) is None:
        return None
    flags = (given.get("ceil_mode", False), given.get("count_include_pad", True))
    divisor = given.get("divisor_override")
    if not all(type(f) is bool for f in flags) or not (divisor is None or type(divisor) is int):
        return None
    return x, (*sizes, *flags, divisor)


_MAX_POOL_SYMBOL = Symbol("fjit_ops.max_pool2d_with_indices", max_pool2d_with_indices, frozenset({Tag.FALLBACK}))
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _attention_args(b: BoundSymbol) -> tuple | None:
    """(q, k, v, mask, is_causal, scale) of an attention eager runs as ATen's flash CPU kernel,
    whose autograd node then calls that kernel's backward: 4-D CPU operands, no dropout, no GQA
    and a mask that needs no gradient, where torch's own backend choice is that kernel."""
    if b.sym.fn is not F.scaled_dot_product_attention:
        return None
    given = dict(zip(ATTENTION_PARAMS, b.args))
    given.update(b.kwargs)
    q, k, v, mask = (given.get(n) for n in ("query", "key", "value", "attn_mask"))
    is_causal, scale = given.get("is_causal", False), given.get("scale")
    if not all(isinstance(t, TensorVar) and t.ndim == 4 and t.device.type == "cpu" for t in (q, k, v)) \
            or given.get("dropout_p", 0.0) != 0.0 or given.get("enable_gqa", False) is not False \
            or not (mask is None or isinstance(mask, TensorVar) and not mask.requires_grad) \
            or type(is_causal) is not bool or not (scale is None or type(scale) is float):
        return None
    if attention_backend(q, k, v, mask, is_causal, scale) != torch.nn.attention.SDPBackend.FLASH_ATTENTION.value:
        return None
    return q, k, v, mask, is_causal, scale


def dense(v: TensorVar) -> bool:
    """Whether v's elements fill its memory with no gap or overlap, in any dim order."""
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(v.strides, v.shape) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


@dataclasses.dataclass(frozen=True)
class AtenBackward:
    """How eager's autograd node differentiates an op that runs as traced: `fn(g, *saved, *static,
    mask, layouts)` returns the cotangents of `operands` (None where the op has none, or mask says
    none is wanted), as the ATen backward function the node calls does, in `layouts`."""
    operands: tuple     # the op's tensor operands, in the order fn returns their cotangents
    saved: tuple        # forward values fn reads after the cotangent (None where absent)
    static: tuple       # its other arguments
    fn: Callable
    aten: str           # the ATen function fn calls, as the backward trace's comment names it
    forward: BoundSymbol | None = None   # what the joint forward runs instead of the op, where
    #                                     the backward reads a value the op does not return


def aten_backward(b: BoundSymbol) -> AtenBackward | None:
    """A convolution's, a training batch norm's, a 2-D pool's or an attention's backward; None for
    any other op."""
    conv = convolution_args(b)
    if conv is not None:
        x, w, bias, stride, padding, dilation, groups = conv
        return AtenBackward((x, w, bias), (x, w), (list(bias.shape) if bias is not None else None,
                            list(stride), list(padding), list(dilation), groups), convolution_vjp,
                            "convolution_backward")
    bn = batch_norm_args(b)
    if bn is not None:
        x, weight, bias, eps = bn
        _, mean, invstd = b.outputs()[:3]
        return AtenBackward((x, weight, bias), (x, weight, mean, invstd), (eps,), batch_norm_vjp,
                            "native_batch_norm_backward")
    pool = _avg_pool_args(b)
    if pool is not None:
        return AtenBackward((pool[0],), (pool[0],), pool[1], avg_pool2d_vjp, "avg_pool2d_backward")
    pool = _max_pool_args(b)
    if pool is not None:
        x, static = pool
        out = b.outputs()[0]
        indices = TensorVar(f"{out.name}_indices", out.shape, torch.int64, out.device,
                            tuple(make_contiguous_strides_for(out.shape)), False)
        forward = BoundSymbol(_MAX_POOL_SYMBOL, (x, *static), {}, (out, indices),
                              comment="the max pool, also returning the indices its backward reads")
        return AtenBackward((x,), (x, indices), static, max_pool2d_vjp, "max_pool2d_with_indices_backward",
                            forward)
    attention = _attention_args(b)
    if attention is not None:
        q, k, v, mask, is_causal, scale = attention
        out = b.outputs()[0]
        lse = _FLASH(*(meta_tensor(t) for t in (q, k, v)), 0.0, is_causal,
                     attn_mask=meta_tensor(mask) if mask is not None else None, scale=scale)[1]
        logsumexp = TensorVar(f"{out.name}_logsumexp", tuple(lse.shape), lse.dtype, out.device,
                              tuple(lse.stride()), False)
        forward = BoundSymbol(_FLASH_SYMBOL, (q, k, v, mask, is_causal, scale), {}, (out, logsumexp),
                              comment="eager's attention kernel, which also returns the "
                                      "log-sum-exp its backward reads")
        return AtenBackward((q, k, v), (q, k, v, out, logsumexp, mask), (is_causal, scale),
                            attention_vjp, "_scaled_dot_product_flash_attention_for_cpu_backward",
                            forward)
    return None


def _additive(attn_mask, q):
    """A boolean mask as the additive one F.scaled_dot_product_attention gives ATen's kernel."""
    if attn_mask is None or attn_mask.dtype != torch.bool:
        return attn_mask
    return torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill_(attn_mask.logical_not(), -math.inf)


def flash_attention(q, k, v, attn_mask, is_causal, scale):
    """The attention's output and log-sum-exp, by the flash CPU kernel F.scaled_dot_product_attention
    runs."""
    return _FLASH(q, k, v, 0.0, is_causal, attn_mask=_additive(attn_mask, q), scale=scale)


def attention_vjp(g, q, k, v, out, logsumexp, attn_mask, is_causal, scale, mask, layouts):
    """The cotangents of an attention's q, k and v, by the flash CPU kernel's backward (what eager's
    node calls) on the output and log-sum-exp the forward returned."""
    return laid_out(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        g, q, k, v, out, logsumexp, 0.0, is_causal, attn_mask=_additive(attn_mask, q), scale=scale),
        layouts)


_FLASH_SYMBOL = Symbol("fjit_autodiff.flash_attention", flash_attention, frozenset())
