"""torch entry points fjit traces in its own terms: while any thread traces, a call on proxies of
- `torch.autograd.Function.apply` is one op that calls the real apply at run time, with the
  Function's forward traced into its prims (which kernels fuse) and its own backward recorded by
  the joint program on the backward's proxies (Tag.CUSTOM_VJP); a forward that does not trace
  strictly (a sharp edge, an error), returns an input or marks one dirty leaves the op opaque,
  which torch autograd records;
- `associative_scan` (torch._higher_order_ops) is recorded as the sequential scan it defines, the
  combine function called once a step on that step's slices;
- `torch.utils.checkpoint(..., use_reentrant=True)` (CheckpointFunction.apply) is recorded inline
  as one checkpointed region.

Calls on real tensors, from any thread, go to torch's own functions.
"""
from __future__ import annotations

import sys
import types

import torch
import torch.utils._pytree as pytree
from torch.utils.checkpoint import CheckpointFunction

from fjit.core.ir import CUSTOM_VJPS, Symbol, Tag, Var, flatten_values, map_values
from fjit.core.prims import prim_of
from fjit.frontend.context import Mode, ProcessPatch, current
from fjit.frontend.dispatch import dispatch
from fjit.frontend.modes import record_mode_changes
from fjit.frontend.proxies import TensorProxy
from fjit.frontend.record import trace_call, torch_symbol


def _on_proxies(args, kwargs) -> bool:
    """Whether a call is part of a trace: made while tracing, on at least one tensor proxy."""
    return current() is not None and any(isinstance(x, TensorProxy) for x in flatten_values((args, kwargs)))


# -- autograd.Function.apply: its forward traced, or one opaque op --------------------------------------------

_APPLY = torch.autograd.Function.__dict__["apply"]     # the classmethod itself
_APPLY_OPS: dict = {}


def _traced_apply(cls, *args, **kwargs):
    if not _on_proxies(args, kwargs):
        return _APPLY.__func__(cls, *args, **kwargs)
    op = _APPLY_OPS.get(cls)
    if op is None:
        def op(*a, **k):
            return _APPLY.__func__(cls, *a, **k)
        op.__name__ = op.__qualname__ = f"{cls.__qualname__}.apply"
        op = _APPLY_OPS.setdefault(cls, op)
    if cls is CheckpointFunction and not kwargs:
        return _traced_reentrant_checkpoint(*args)
    if not kwargs and _traceable(cls):
        ctx = _FunctionCtx(args)
        plain = torch_symbol(op)
        sym = Symbol(plain.qualname, op, plain.tags - {Tag.FALLBACK} | {Tag.CUSTOM_VJP})
        # recorded as dispatch records (meta tensors untraced, the observer's hook off: the real
        # forward runs on meta tensors), but for the traced forward, which is user code
        if len(current().scopes) == 1:
            record_mode_changes(current())      # a grad-mode or autocast change made before it
        hook = sys.getprofile()
        observer = hook if type(hook) is types.FunctionType else None
        sys.setprofile(None if observer else hook)
        try:
            with torch._C.DisableTorchFunction():
                out = trace_call(current(), sym, op, args, {}, lambda *a: _traced_forward(cls, ctx, a, observer))
        finally:
            sys.setprofile(hook)
        if current().scopes[-1] and current().scopes[-1][-1].sym is sym:
            vjp = lambda now, value, cotangents: _backward(cls, ctx, args, now, value, cotangents)  # noqa: E731
            vjp.materialize_grads = ctx.materialize_grads
            CUSTOM_VJPS[sym] = vjp
        return out
    return dispatch(op, args, kwargs)


def _traced_reentrant_checkpoint(function, preserve_rng_state, *args):
    """torch.utils.checkpoint(function, *args, use_reentrant=True): its CheckpointFunction runs the
    function under no_grad and again, under autograd, in its backward.  Traced, the function's ops
    are recorded inline as one checkpointed region (Trace.checkpointed), under the grad mode of
    the call, as its recomputation runs them: the joint program recomputes the region's values in
    its backward, as for the non-reentrant form.  (Opaque, its meta run could not trace a module
    whose parameters it reads, and the error blamed a data-dependent shape.)"""
    ctx = current()
    outer = ctx.reentrant_checkpoint
    ctx.reentrant_checkpoint = object()       # this call's region
    try:
        return function(*args)
    finally:
        ctx.reentrant_checkpoint = outer


class _Declined(Exception):
    """The forward does not trace as the op's prims: the op stays opaque."""


def _traceable(cls) -> bool:
    """A Function with its own forward and backward: old-style forward(ctx, ...), or forward(...)
    with setup_context(ctx, inputs, output) (not vmap- or jvp-only)."""
    base = torch.autograd.Function
    return cls.backward is not base.backward and cls.forward is not base.forward


def _separate_context(cls) -> bool:
    """Whether cls.forward takes no ctx: its setup_context fills it from the inputs and output."""
    return cls.setup_context is not torch.autograd.Function.setup_context


class _FunctionCtx:
    """The ctx a traced forward gets: what it saves, marks and sets is kept for the backward."""

    def __init__(self, args):
        self.needs_input_grad = tuple(isinstance(a, TensorProxy) and a.requires_grad for a in args)
        self.to_save = ()
        self.materialize_grads = True

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    def save_for_forward(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        raise _Declined("mark_dirty: the forward writes into an input")

    def mark_non_differentiable(self, *tensors):
        raise _Declined("mark_non_differentiable")

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)   # False: an output with no cotangent gets None

    @property
    def saved_tensors(self):
        return self.to_save


def _traced_forward(cls, ctx: _FunctionCtx, args, observer):
    """cls.forward(ctx, *args) on the proxies, its ops flattened to the prims they recorded and
    re-recorded in the op's scope; NotImplementedError (the op stays opaque) where it declines,
    raises, meets a sharp edge (strict mode while it runs: a permissive rewrite would change what
    the real forward does), records an opaque op or returns an input."""
    trace = current()
    mode, raised = trace.mode, trace.raised
    trace.mode = Mode.ERROR
    trace.push_scope()
    sys.setprofile(observer)
    try:
        with torch._C._EnableTorchFunction():      # the user's forward is traced as user code
            if _separate_context(cls):
                out = cls.forward(*args)
                cls.setup_context(ctx, args, out)
            else:
                out = cls.forward(ctx, *args)
    except Exception:      # noqa: BLE001 -- the real forward runs at run time and raises there
        out = None
    finally:
        sys.setprofile(None)
        trace.mode, trace.raised = mode, raised
        scope = trace.pop_scope()
    flat = _prims_of(scope)
    inputs = {id(a) for a in args}
    if out is None or flat is None or any(not isinstance(o, TensorProxy) or id(o) in inputs
                                          for o in flatten_values(out)):
        raise NotImplementedError
    if torch.is_grad_enabled() and any(isinstance(a, TensorProxy) and a.requires_grad for a in args) and \
            any(not o.requires_grad and (o.dtype.is_floating_point or o.dtype.is_complex)
                for o in flatten_values(out)):
        # The forward ran its ops with gradients off (Dynamo's autograd_function_apply runs the
        # Function's forward graph under _set_grad_enabled(False)), but apply makes its outputs
        # differentiable: traced as they are, the joint program saw outputs needing no gradient
        # and dropped every gradient before them (BLOOM through the backend, silently).  Opaque,
        # the real apply gives them their gradient function.
        raise NotImplementedError
    for b in flat:
        trace.record(b)
    return out


def _prims_of(bsyms) -> list | None:
    """The prims the ops made of, in order; None where one is opaque."""
    flat = []
    for b in bsyms:
        if b.subsymbols:
            inner = _prims_of(b.subsymbols)
            if inner is None:
                return None
            flat.extend(inner)
        elif prim_of(b) is not None:
            flat.append(b)
        else:
            return None
    return flat


class _BackwardCtx:
    """The forward's ctx as the backward reads it: its attributes, tensors among them as the
    backward's values.  `value(var)` gives a forward value in the backward; `renamed` maps a
    value's name when traced to the Var that stands for it in the op as the passes left it."""

    def __init__(self, ctx: _FunctionCtx, value, renamed: dict):
        def mapped(x):
            return map_values(lambda t: value(renamed.get(t.ir.name, t.ir)) if isinstance(t, TensorProxy)
                              else t, x)
        for k, v in vars(ctx).items():
            if k not in ("to_save", "materialize_grads"):
                setattr(self, k, mapped(v) if k != "needs_input_grad" else v)
        self.saved_tensors = tuple(mapped(list(ctx.to_save)))


def _backward(cls, ctx: _FunctionCtx, args, now, value, cotangents) -> list:
    """cls.backward on the backward's proxies: [(input Var, its cotangent)].  `args` are the
    apply's arguments when traced, `now` its bound symbol in the trace being differentiated: the
    passes may have renamed an argument since (CSE makes layer 2's attention mask, saved by its
    Function, layer 1's), so the ctx's tensors and the gradients are resolved through `now`'s
    arguments, never by the names the forward saw."""
    renamed = {a.ir.name: v for a, v in zip(args, now.args) if isinstance(a, TensorProxy) and isinstance(v, Var)}
    grads = cls.backward(_BackwardCtx(ctx, value, renamed), *cotangents)
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) < len(args) or any(g is not None for g in grads[len(args):]):
        raise RuntimeError(f"function {cls.__name__}Backward returned an incorrect number of gradients")
    if any(isinstance(g, torch.Tensor) and not isinstance(g, TensorProxy) for g in grads):
        # made without a proxy (torch.zeros(...) outside the tracer's mode): not a traced value
        raise RuntimeError(f"{cls.__name__}.backward returned a tensor it did not compute from its inputs")
    return [(renamed.get(a.ir.name, a.ir), g) for a, g in zip(args, grads)
            if isinstance(a, TensorProxy) and isinstance(g, TensorProxy)]


# -- associative_scan: the sequential scan ----------------------------------------------------------

# The most steps a scan is recorded one by one.  Why sequential: torch's own form on the CPU
# (combine_mode="generic") calls a vmap of the combine function on strided halves at each of
# log2(n) levels, with slices, cats and interleaving stacks between them; traced, every vmap and
# aten.slice there is an opaque op, so no kernel fuses and the program runs as eager does
# (transformers' Mamba takes this path whenever is_compiling() answers True: its training step
# was 1.00x eager through fjit.jit).  Recorded one step at a time, each step is the combine's own
# ops on [batch, ...] slices, which fuse (Mamba: 0.41x eager).  A longer scan would make a trace
# of n times the combine's ops; it keeps torch's form.
SEQUENTIAL_SCAN_MAX = 256
_SCAN_MODULE = "torch._higher_order_ops.associative_scan"
_SCAN: list = []        # torch's associative_scan, while it is replaced


def _traced_associative_scan(combine_fn, xs, dim, reverse=False, combine_mode="pointwise"):
    """torch's associative_scan (same signature, same argument errors) as the inclusive scan it
    defines: out[0] = xs[0], out[t] = combine_fn(out[t-1], xs[t]) along `dim` (from the end with
    `reverse`), each xs[t] a slice without `dim`: what the vmap of torch's generic mode hands the
    combine function, so a combine that is not elementwise gets the same operands."""
    leaves, spec = pytree.tree_flatten(xs)
    if not _on_proxies(leaves, {}) or not leaves or not isinstance(dim, int) or \
            any(not isinstance(x, torch.Tensor) for x in leaves):
        return _SCAN[0](combine_fn, xs, dim, reverse=reverse, combine_mode=combine_mode)
    if not callable(combine_fn):
        raise ValueError(f"Combine_fn must be a callable, but got {combine_fn}")
    if not isinstance(reverse, bool):
        raise RuntimeError("Reverse must be a bool, but got " + str(type(reverse)))
    if combine_mode not in ("pointwise", "generic"):
        raise ValueError(f"Combine_mode must either 'pointwise' or 'generic', but got {combine_mode}")
    if combine_mode == "pointwise" and not all(x.device.type in ("cuda", "xpu") for x in leaves):
        raise ValueError("For combine_mode='pointwise', all input tensors need to be on CUDA or XPU")
    ndim = leaves[0].ndim
    d = dim + ndim if -ndim <= dim < 0 else dim
    if not 0 <= d < ndim or any(x.ndim <= d or x.shape[d] == 0 for x in leaves):
        raise ValueError("All xs leaves must at least have 'dim' number of dimensions and scan dimension > 0")
    n = leaves[0].shape[d]
    if n > SEQUENTIAL_SCAN_MAX or any(x.shape[d] != n for x in leaves):
        return _SCAN[0](combine_fn, xs, dim, reverse=reverse, combine_mode=combine_mode)
    steps, carry = [], None
    for t in (range(n - 1, -1, -1) if reverse else range(n)):
        x_t = pytree.tree_unflatten([x.select(d, t) for x in leaves], spec)
        carry = x_t if carry is None else combine_fn(carry, x_t)
        steps.append(pytree.tree_leaves(carry))
    if reverse:
        steps.reverse()
    return pytree.tree_unflatten([torch.stack([s[k] for s in steps], d) for k in range(len(leaves))], spec)


def _scan_homes() -> list:
    """Where torch keeps associative_scan: its module, and the package that re-exports it."""
    module = sys.modules.get(_SCAN_MODULE)
    package = sys.modules.get(_SCAN_MODULE.rpartition(".")[0])
    return [m for m in (module, package) if m is not None and callable(getattr(m, "associative_scan", None))]


def _install():
    torch.autograd.Function.apply = classmethod(_traced_apply)
    homes = _scan_homes()
    if homes:
        _SCAN[:] = [homes[0].associative_scan]
        for home in homes:
            if home.associative_scan is _SCAN[0]:
                home.associative_scan = _traced_associative_scan


def _restore():
    torch.autograd.Function.apply = _APPLY
    for home in _scan_homes():
        if home.associative_scan is _traced_associative_scan:
            home.associative_scan = _SCAN[0]
    _SCAN.clear()


library_calls_traced = ProcessPatch(_install, _restore)
