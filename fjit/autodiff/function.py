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
from typing import Callable

import torch

from fjit.core.ir import BoundSymbol, TensorVar, flatten_values, map_values
from fjit.core.trace import Trace
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


@dataclasses.dataclass(frozen=True)
class AtenBackward:
    """How eager's autograd node differentiates an op that runs as traced: `fn(g, *saved, *static,
    mask)` returns the cotangents of `operands` (None where the op has none, or mask says none
    is wanted), as the ATen backward function the node calls does."""
    operands: tuple     # the op's tensor operands, in the order fn returns their cotangents
    saved: tuple        # forward values fn reads after the cotangent (None where absent)
    static: tuple       # its other arguments
    fn: Callable
    aten: str           # the ATen function fn calls, as the backward trace's comment names it


def aten_backward(b: BoundSymbol) -> AtenBackward | None:
    """A convolution's or a training batch norm's backward; None for any other op."""
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


def _laid_out(grads, channels_last):
    """Each cotangent in the layout the backward trace records for it: channels-last where its
    operand is (the channels-last form's activations), else contiguous."""
    return tuple(None if r is None else r.contiguous(memory_format=torch.channels_last) if cl
                 else r.contiguous() for r, cl in zip(grads, channels_last))


def convolution_vjp(g, x, w, bias_sizes, stride, padding, dilation, groups, mask, channels_last):
    """The cotangents of a convolution's input, weight and bias, by ATen's convolution_backward
    (what eager's autograd node calls)."""
    return _laid_out(torch.ops.aten.convolution_backward.default(
        g, x, w, bias_sizes, stride, padding, dilation, False, [0] * len(stride), groups, mask),
        channels_last)


def batch_norm_vjp(g, x, weight, mean, invstd, eps, mask, channels_last):
    """The cotangents of a training batch norm's input, weight and bias, by ATen's
    native_batch_norm_backward on the batch statistics the forward returned (what eager's node
    calls; the running statistics are not read in training)."""
    return _laid_out(torch.ops.aten.native_batch_norm_backward.default(
        g, x, weight, None, None, mean, invstd, True, eps, mask), channels_last)


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
        if torch.is_grad_enabled():
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
