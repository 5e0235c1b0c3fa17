"""torch entry points fjit traces in its own terms: while any thread traces, a call on proxies of
- `torch.autograd.Function.apply` is one opaque op that calls the real apply at run time (tracing
  its forward into prims would lose the custom backward);
- `torch.vmap` is one opaque op (functorch's C++ transforms would unwrap fjit's proxies below
  __torch_function__); its metadata comes from a run on meta tensors;
- `associative_scan` (torch._higher_order_ops) is recorded as the sequential scan it defines, the
  combine function called once a step on that step's slices.

Calls on real tensors, from any thread, go to torch's own functions.
"""
from __future__ import annotations

import sys

import torch
import torch.utils._pytree as pytree

from fjit.core.ir import flatten_values
from fjit.frontend.context import ProcessPatch, current
from fjit.frontend.dispatch import dispatch
from fjit.frontend.proxies import TensorProxy


def _on_proxies(args, kwargs) -> bool:
    """Whether a call is part of a trace: made while tracing, on at least one tensor proxy."""
    return current() is not None and any(isinstance(x, TensorProxy) for x in flatten_values((args, kwargs)))


# -- autograd.Function.apply and vmap: one opaque op each --------------------------------------------

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
    return dispatch(op, args, kwargs)


_VMAP = torch.vmap


def _traced_vmap(func, *vmap_args, **vmap_kwargs):
    batched = _VMAP(func, *vmap_args, **vmap_kwargs)

    def call(*args, **kwargs):
        if not _on_proxies(args, kwargs):
            return batched(*args, **kwargs)
        return dispatch(batched, args, kwargs)
    return call


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
    torch.vmap = torch.func.vmap = _traced_vmap
    homes = _scan_homes()
    if homes:
        _SCAN[:] = [homes[0].associative_scan]
        for home in homes:
            if home.associative_scan is _SCAN[0]:
                home.associative_scan = _traced_associative_scan


def _restore():
    torch.autograd.Function.apply = _APPLY
    torch.vmap = torch.func.vmap = _VMAP
    for home in _scan_homes():
        if home.associative_scan is _traced_associative_scan:
            home.associative_scan = _SCAN[0]
    _SCAN.clear()


library_calls_traced = ProcessPatch(_install, _restore)
