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
import itertools

import torch

from fjit.core.ir import flatten_values, map_values
from fjit.core.trace import Trace
from fjit.logs import recompiles


# -- ops torch autograd keeps: recorded in the forward, differentiated in the backward -------------

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
