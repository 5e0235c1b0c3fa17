"""torch.nn.functional ops and matmul as decompositions into prims.

Half-precision inputs are computed in float32 and rounded once at the end, as torch's own kernels do.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fjit.ops.math_ops import _dims, _downcast, _methods, _no_empty_reduction, _upcast, prim, register
from fjit.core.prims import Prim


def _softmax_parts(x, dim, dtype):
    if dim is None:
        raise NotImplementedError   # the deprecated implicit dim
    y = _upcast(prim(Prim.CONVERT, x, dtype) if dtype is not None else x)
    d = _dims(x, dim)
    _no_empty_reduction(x, d)
    shifted = prim(Prim.SUB, y, prim(Prim.AMAX, y, d, True)) if x.ndim else prim(Prim.SUB, y, y)
    return y, d, shifted, dtype or x.dtype


@register(F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax)
def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    _, d, shifted, out_dtype = _softmax_parts(x, dim, dtype)
    e = prim(Prim.EXP, shifted)
    return _downcast(prim(Prim.DIV, e, prim(Prim.SUM, e, d, True)), out_dtype)


@register(F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax, torch.special.log_softmax)
def _log_softmax(x, dim=None, _stacklevel=3, dtype=None):
    _, d, shifted, out_dtype = _softmax_parts(x, dim, dtype)
    lse = prim(Prim.LOG, prim(Prim.SUM, prim(Prim.EXP, shifted), d, True))
    return _downcast(prim(Prim.SUB, shifted, lse), out_dtype)


@register(F.layer_norm, torch.layer_norm)
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    y = _upcast(x)
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    n = math.prod(normalized_shape)
    mean = prim(Prim.DIV, prim(Prim.SUM, y, dims, True), n)
    diff = prim(Prim.SUB, y, mean)
    var = prim(Prim.DIV, prim(Prim.SUM, prim(Prim.MUL, diff, diff), dims, True), n)
    out = prim(Prim.MUL, diff, prim(Prim.RSQRT, prim(Prim.ADD, var, eps)))
    if weight is not None:
        out = prim(Prim.MUL, out, weight)
    if bias is not None:
        out = prim(Prim.ADD, out, bias)
    return _downcast(out, x.dtype)


@register(F.rms_norm, torch.rms_norm)
def _rms_norm(x, normalized_shape, weight=None, eps=None):
    y = _upcast(x)
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    n = math.prod(normalized_shape)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    ms = prim(Prim.DIV, prim(Prim.SUM, prim(Prim.MUL, y, y), dims, True), n)
    out = prim(Prim.MUL, y, prim(Prim.RSQRT, prim(Prim.ADD, ms, eps)))
    if weight is not None:
        out = prim(Prim.MUL, out, _upcast(weight))
    return _downcast(out, x.dtype)


# F.dropout has no decomposition: eager draws its mask with bernoulli_ on the CPU and with a fused
# Philox kernel on CUDA, and no uniform-based mask reproduces either stream.  As one torch call it
# draws eager's numbers from eager's generator, which is what "random ops follow eager" promises.


@register(F.linear)
def _linear(x, weight, bias=None):
    wt = prim(Prim.PERMUTE, weight, tuple(reversed(range(weight.ndim))))
    out = prim(Prim.MATMUL, x, wt)
    return prim(Prim.ADD, out, bias) if bias is not None else out


@register(*_methods("matmul"), *_methods("mm"), *_methods("bmm"), torch.Tensor.__matmul__)
def _matmul(a, b):
    return prim(Prim.MATMUL, a, b)


@register(torch.Tensor.__rmatmul__)
def _rmatmul(a, b):
    return prim(Prim.MATMUL, b, a)


@register(F.cross_entropy)
def _cross_entropy(logits, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if weight is not None or size_average is not None or reduce is not None or label_smoothing \
            or logits.ndim != 2 or target.dtype not in (torch.int64, torch.int32):
        raise NotImplementedError   # probabilities, class weights, smoothing: one torch call
    logp = _log_softmax(logits, 1, dtype=torch.float32 if logits.dtype != torch.float64 else None)
    valid = prim(Prim.NE, target, ignore_index)
    safe = prim(Prim.WHERE, valid, target, 0)
    picked = prim(Prim.SQUEEZE, prim(Prim.GATHER, logp, 1, prim(Prim.UNSQUEEZE, safe, 1)), (1,))
    loss = prim(Prim.WHERE, valid, prim(Prim.NEG, picked), 0.0)
    if reduction == "none":
        return _downcast(loss, logits.dtype)
    total = prim(Prim.SUM, loss, (0,), False)
    if reduction == "sum":
        return _downcast(total, logits.dtype)
    count = prim(Prim.SUM, prim(Prim.CONVERT, valid, torch.float32), (0,), False)
    return _downcast(prim(Prim.DIV, total, count), logits.dtype)


@register(F.embedding)
def _embedding(indices, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    if max_norm is not None:
        raise NotImplementedError   # renormalizes the weight in place
    flat = prim(Prim.RESHAPE, indices, (-1,))
    rows = prim(Prim.INDEX_SELECT, weight, 0, flat)
    return prim(Prim.RESHAPE, rows, tuple(indices.shape) + (weight.shape[-1],))


@register(F.scaled_dot_product_attention)
def _sdpa(q, k, v, *args, **kwargs):
    return prim(Prim.SDPA, q, k, v, *args, **kwargs)
