"""What runs: the one torch.autograd.Function that joins a compiled forward and backward to autograd,
and the two helpers by which an op torch autograd keeps runs inside them.

Inside Function.forward and Function.backward grad mode is off, so the kernel executors claim
regions of both programs as they do for any program (executors.kernel_inputs_usable).

Saved tensors go through `ctx.save_for_backward`, so autograd frees them after the backward (or
keeps them for another, under retain_graph=True) as it does eager's.  The backward program takes
its inputs as one list which it empties first, so the values it computes from them are freed
after their last use (the generated program deletes dead values).
"""
from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for

from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar, flatten_values, map_values
from fjit.core.meta import ATTENTION_PARAMS, attention_backend, meta_tensor
from fjit.core.trace import Trace
from fjit.runtime import (avg_pool2d_vjp, batch_norm_vjp, convolution_vjp, laid_out, max_pool2d,
                          max_pool2d_vjp, max_pool2d_with_indices)
from fjit.logs import recompiles


# -- ops torch autograd keeps ------------------------------------------------------------------------

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


def _batch_norm_args(b: BoundSymbol) -> tuple | None:
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
    through runtime.max_pool2d (ops/nn_ops.py: a contiguous NCHW CPU input), or of a torch call of
    one with literal sizes on such an input (a small one: ops/nn_ops.py leaves it to ATen)."""
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
    bn = _batch_norm_args(b)
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


def record(fn, slots, n_leaves, graph_slots, *args, **kwargs):
    """fn(*args, **kwargs) under enable_grad, its differentiable tensor operands replaced by
    detached leaves (slots: (flat position, leaf index)).  Returns the output (detached, for the
    rest of the forward), the outputs at `graph_slots` with their graph, and the leaves."""
    flat = flatten_values((args, kwargs))
    leaves = [None] * n_leaves
    replace = {}
    for k, j in slots:
        if leaves[j] is None:
            leaves[j] = flat[k].detach().requires_grad_()
        replace[k] = leaves[j]
    counter = itertools.count()
    args, kwargs = map_values(lambda x: replace.get(next(counter), x), (args, kwargs))
    with torch.enable_grad():
        out = fn(*args, **kwargs)
    outs = flatten_values(out)
    detached = map_values(lambda x: x.detach() if isinstance(x, torch.Tensor) else x, out)
    return detached, tuple(outs[k] for k in graph_slots), tuple(leaves)


def torch_vjp(graphs, leaves, cotangents):
    """Torch autograd's backward of a recorded op: the cotangents of its leaves (contiguous, as
    the backward trace records them)."""
    pairs = [(o, g) for o, g in zip(graphs, cotangents) if o.requires_grad]
    if not pairs:
        return tuple(torch.zeros_like(x, memory_format=torch.contiguous_format) for x in leaves)
    # retain_graph: a backward under retain_graph=True may run this again; the graph is freed
    # with the saved tensors that hold it.
    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                allow_unused=True, materialize_grads=True, retain_graph=True)
    return tuple(g.contiguous() for g in grads)


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


# -- the programs ----------------------------------------------------------------------------------

def list_callable(trace: Trace):
    """The trace as a function of one list of its inputs, emptied before it runs (see
    Trace.python_callable)."""
    return trace.python_callable(inputs_in_a_list=True)


class Plan:
    """One compiled joint program: the forward and backward functions and how their flat values
    map to the caller's outputs and to autograd's tensors."""

    def __init__(self, joint, forward, backward, output_template, rebuild, differentiable):
        self.forward = forward                  # (*leaves) -> (*outputs, *saved)
        self.backward = backward                # ([*saved, *cotangents]) -> grads per leaf
        # (*leaves) -> (*outputs): torch calls autograd can differentiate, for a backward that
        # must itself be differentiable (create_graph=True)
        self.differentiable = differentiable
        names = [v.name for v in joint.outputs]
        self.n_outputs = len(names)
        self.tensor_outputs = [k for k, v in enumerate(joint.outputs) if hasattr(v, "shape")]
        self.nondiff = [i for i, k in enumerate(self.tensor_outputs) if not joint.differentiable[k]]
        self.cotangents = [i for i, k in enumerate(self.tensor_outputs) if joint.differentiable[k]]
        self.template = output_template
        self.rebuild = rebuild
        self.index = {n: k for k, n in enumerate(names)}

    def flat(self) -> "Plan":
        """This plan returning its outputs' structure of tensors and numbers, not rebuilt."""
        plan = copy.copy(self)
        plan.rebuild = None
        return plan

    def __call__(self, *leaves):
        box = []
        tensors = JointFunction.apply(self, box, *leaves)
        values = box[0]
        for i, k in enumerate(self.tensor_outputs):
            values[k] = tensors[i]
        index = self.index
        out = map_values(lambda x: values[index[x.name]] if hasattr(x, "name") and x.name in index
                         else x, self.template)
        return out if self.rebuild is None else self.rebuild(*out)


_interpreter_stack = torch._C._functorch.peek_interpreter_stack
_has_storage = torch._C._has_storage


class JointFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, plan: Plan, box: list, *leaves):
        flat = plan.forward(*leaves)
        values = list(flat[:plan.n_outputs])
        outs = tuple(values[k] for k in plan.tensor_outputs)
        box.append(values)        # the non-tensor outputs reach the caller through here
        ctx.plan = plan
        saved = flat[plan.n_outputs:]
        # Tensors go through save_for_backward: autograd frees them after a backward without
        # retain_graph, keeps them for one with it, and applies saved-tensor hooks to them.
        ctx.save_for_backward(*(x for x in saved if isinstance(x, torch.Tensor)))
        # The inputs, for a differentiable backward (create_graph=True): plain references the
        # caller holds anyway, not saved tensors, since a module's buffers are written in place
        # after the call (BatchNorm's running statistics) and a saved tensor's version is checked.
        ctx.leaves = leaves
        ctx.numbers = [(j, x) for j, x in enumerate(saved) if not isinstance(x, torch.Tensor)]
        if plan.nondiff:
            ctx.mark_non_differentiable(*(outs[i] for i in plan.nondiff))
        return outs

    @staticmethod
    def backward(ctx, *grads):
        # also for batched cotangents: autograd runs a backward inside a vmap for
        # torch.autograd.grad(is_grads_batched=True) and jacobian(vectorize=True), whose tensors
        # hold no storage the compiled backward's kernels could read; torch's ops batch them
        if torch.is_grad_enabled() or _interpreter_stack() is not None or \
                not all(_has_storage(g) for g in grads if g is not None):
            return (None, None, *_differentiable_backward(ctx, grads))
        plan = ctx.plan
        inputs = list(ctx.saved_tensors)
        for j, x in ctx.numbers:
            inputs.insert(j, x)
        for i in plan.cotangents:
            g = grads[i]
            inputs.append(g if g.is_contiguous() and not g.is_neg() else g.resolve_neg().contiguous())
        del grads
        return (None, None, *plan.backward(inputs))


def _differentiable_backward(ctx, grads) -> tuple:
    """The backward under create_graph=True (a gradient of a gradient: gradient penalties, MAML,
    Hessian-vector products): the compiled backward is a program autograd cannot differentiate,
    so this call recomputes the forward from the saved inputs with torch calls under autograd and
    differentiates that, building the graph the second derivative needs.  Logged on
    fjit.recompiles."""
    plan = ctx.plan
    recompiles.debug("%s: create_graph=True backward runs a differentiable recompute of the "
                     "forward (torch autograd) instead of the compiled backward", plan.name)
    leaves = ctx.leaves
    with torch.enable_grad():
        flat = plan.differentiable(*leaves)
    outs = [flat[k] for k in plan.tensor_outputs]
    pairs = [(outs[i], grads[i]) for i in plan.cotangents
             if grads[i] is not None and outs[i].requires_grad]
    wrt = [(k, x) for k, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
    result = [None] * len(leaves)
    if pairs and wrt:
        found = torch.autograd.grad([o for o, _ in pairs], [x for _, x in wrt],
                                    [g for _, g in pairs], create_graph=True, allow_unused=True,
                                    materialize_grads=True)
        for (k, _), g in zip(wrt, found):
            result[k] = g
    return tuple(result)
