"""The reduction prims: sum, prod, amax, amin over dims, and argmax, argmin over one dim.  One
block per prim (see registry.py).  A reduction has no kernel form: each kernel language loops over
the ones it takes itself (its `reductions`), and `notes` say why a language takes none."""
from __future__ import annotations

import torch

from fjit.core.prims.registry import Kind, Prim, apply, define, torch_callables
from fjit.core.prims.toolkit import reduced_dims, unreduce

R = Kind.REDUCTION
_NO_LOOP = "no generator reduces it ({0}): it stays a torch call"


def _orderable(x):
    """argmax/argmin refuse bool tensors (torch.max(b, dim) does not): the same order as uint8."""
    return x.to(torch.uint8) if x.dtype == torch.bool else x


def _prod_lowering(x, dims, keepdim):
    if not dims:
        return torch.prod(x) if not keepdim else torch.prod(x).reshape((1,) * x.ndim)
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


def _sum(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = apply(Prim.CONVERT, x, dtype)
    return apply(Prim.SUM, x, reduced_dims(x, dim), keepdim)


def _sum_vjp(b, g, value):
    x, dims, keepdim = b.args[:3]
    return [(x, unreduce(g, x, dims, keepdim))]


define("SUM", R, lowering=lambda x, dims, keepdim: torch.sum(x, dims, keepdim=keepdim),
       decompositions=((tuple(torch_callables("sum")), _sum),), vjp=_sum_vjp,
       aten=("sum.dim_IntList", "sum.default"))


def _prod(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = apply(Prim.CONVERT, x, dtype)
    return apply(Prim.PROD, x, reduced_dims(x, dim), keepdim)


define("PROD", R, lowering=_prod_lowering, decompositions=((tuple(torch_callables("prod")), _prod),),
       aten=("prod.dim_int",), notes={
           "vjp": "no rule written (a zero in the product needs torch's special case): autodiff "
                  "records the torch-level op and torch autograd differentiates it",
           "triton": _NO_LOOP.format("the Triton generator reduces sum, amax, amin")})


def _amax(x, dim=(), keepdim=False):
    return apply(Prim.AMAX, x, reduced_dims(x, dim), keepdim)


def _amin(x, dim=(), keepdim=False):
    return apply(Prim.AMIN, x, reduced_dims(x, dim), keepdim)


def _extremum_vjp(b, g, value):
    """torch: the cotangent is split evenly among the elements equal to the extremum."""
    x, dims, keepdim = b.args[:3]
    out = unreduce(value(b.output), x, dims, keepdim)
    hit = apply(Prim.CONVERT, apply(Prim.EQ, value(x), out), g.dtype)
    share = apply(Prim.DIV, unreduce(g, x, dims, keepdim), apply(Prim.SUM, hit, dims, True))
    return [(x, apply(Prim.MUL, hit, share))]


define("AMAX", R, lowering=lambda x, dims, keepdim: torch.amax(x, dims, keepdim=keepdim),
       decompositions=((tuple(torch_callables("amax")), _amax),), vjp=_extremum_vjp,
       aten=("amax.default",))
define("AMIN", R, lowering=lambda x, dims, keepdim: torch.amin(x, dims, keepdim=keepdim),
       decompositions=((tuple(torch_callables("amin")), _amin),), vjp=_extremum_vjp,
       aten=("amin.default",))


def _argmax(x, dim=None, keepdim=False):
    return apply(Prim.ARGMAX, x, dim, keepdim)


def _argmin(x, dim=None, keepdim=False):
    return apply(Prim.ARGMIN, x, dim, keepdim)


_NO_ARG_LOOP = {"c": _NO_LOOP.format("neither generator tracks an index"),
                "triton": _NO_LOOP.format("neither generator tracks an index")}
define("ARGMAX", R, lowering=lambda x, dim, keepdim: torch.argmax(_orderable(x), dim, keepdim=keepdim),
       decompositions=((tuple(torch_callables("argmax")), _argmax),), nondiff=True,
       aten=("argmax.default",), notes=_NO_ARG_LOOP)
define("ARGMIN", R, lowering=lambda x, dim, keepdim: torch.argmin(_orderable(x), dim, keepdim=keepdim),
       decompositions=((tuple(torch_callables("argmin")), _argmin),), nondiff=True,
       aten=("argmin.default",), notes=_NO_ARG_LOOP)
