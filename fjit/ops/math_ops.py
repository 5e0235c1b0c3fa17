"""Torch-level math ops (elementwise, casts, reductions) as decompositions into prims.

A decomposition takes the op's arguments (proxies for tensors) and calls prims.  It raises
NotImplementedError for a case it does not cover, and the op then stays a single opaque call (the
torch executor runs it either way; the prims are what the fusion pass and the Triton executor see).
The dispatcher checks every decomposition's result metadata against torch's meta result.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fjit.core.prims import PRIMS, ROWS, Kind, Prim, torch_callables
from fjit.frontend.record import DECOMPOSITIONS, trace_call
from fjit.frontend.context import current
from fjit.frontend.proxies import NumberProxy, TensorProxy

_HALF = (torch.float16, torch.bfloat16)


def prim(p: Prim, *args, **kwargs):
    """Record prim `p` applied to proxies (what decompositions are written in)."""
    sym = PRIMS[p]
    return trace_call(current(), sym, sym.fn, args, kwargs)


def register(*funcs):
    def deco(decomposition):
        for f in funcs:
            DECOMPOSITIONS[f] = decomposition
        return decomposition
    return deco


_methods = torch_callables


def _dims(x, dim) -> tuple:
    """Reduced dims, normalized; torch's meta call has already validated them.  A 0-d tensor
    accepts dim 0 or -1 and has nothing to reduce."""
    if dim is None or dim == () or dim == [] or x.ndim == 0:
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % x.ndim for d in dims)


def _no_empty_reduction(x, dims):
    """max/min-based decompositions have no identity: an empty reduced dim stays one torch call."""
    if any(x.shape[d] == 0 for d in dims):
        raise NotImplementedError


def _upcast(x):
    return prim(Prim.CONVERT, x, torch.float32) if x.dtype in _HALF else x


def _downcast(y, dtype):
    return prim(Prim.CONVERT, y, dtype) if y.dtype != dtype else y


def _no_kwargs(kwargs):
    if kwargs:
        raise NotImplementedError


# ----------------------------------------------------------------------------------------------
# Elementwise
# ----------------------------------------------------------------------------------------------

def _unary(p):
    def decomposition(x, **kwargs):
        _no_kwargs(kwargs)
        return prim(p, x)
    return decomposition


def _binary(p, swap=False):
    def decomposition(a, b, **kwargs):
        alpha = kwargs.pop("alpha", None)
        if p is Prim.DIV and "rounding_mode" in kwargs:
            mode = kwargs.pop("rounding_mode")
            p2 = {None: Prim.DIV, "trunc": Prim.TRUNC_DIVIDE, "floor": Prim.FLOOR_DIVIDE}[mode]
        else:
            p2 = p
        _no_kwargs(kwargs)
        # (a runtime float alpha is multiplied in whatever its value: comparing it would specialize)
        if alpha is not None and (isinstance(alpha, NumberProxy) or alpha != 1):
            b = prim(Prim.MUL, b, alpha)
        return prim(p2, b, a) if swap else prim(p2, a, b)
    return decomposition


# Every torch callable a row names is exactly its prim.
for _row in ROWS.values():
    for _name in _row.torch_names:
        if _row.kind is Kind.UNARY:
            register(*_methods(_name))(_unary(_row.prim))
        elif _row.kind is Kind.BINARY:
            register(*_methods(_name))(_binary(_row.prim))
            if _row.reflected and _row.reflected.startswith("__r"):
                register(getattr(torch.Tensor, _row.reflected))(_binary(_row.prim, swap=True))
register(torch.nn.functional.sigmoid, torch.special.expit)(_unary(Prim.SIGMOID))
register(torch.nn.functional.tanh)(_unary(Prim.TANH))
register(torch.special.erf)(_unary(Prim.ERF))


@register(*_methods("round"))
def _round(x, decimals=0, **kwargs):
    _no_kwargs(kwargs)
    if decimals:
        raise NotImplementedError
    return prim(Prim.ROUND, x)


@register(*_methods("square"))
def _square(x):
    return prim(Prim.MUL, x, x) if x.dtype != torch.bool else prim(Prim.POW, x, 2)


@register(torch.where)
def _where(cond, a=None, b=None):
    if a is None or b is None:
        raise NotImplementedError   # where(cond) is nonzero: data-dependent
    return prim(Prim.WHERE, cond, a, b)


@register(torch.Tensor.where)
def _where_method(x, condition, y):
    return prim(Prim.WHERE, condition, x, y)    # x.where(cond, y): self is the "true" branch


@register(*_methods("clamp"), *_methods("clip"))
def _clamp(x, min=None, max=None):
    if min is None and max is None:
        raise NotImplementedError
    if min is not None:
        x = prim(Prim.CLAMP_MIN, x, min)
    if max is not None:
        x = prim(Prim.CLAMP_MAX, x, max)
    return x


@register(torch.relu, torch.Tensor.relu, F.relu)
def _relu(x, inplace=False):
    # its own prim, not clamp_min(x, 0): the values agree, the gradients do not (relu's passes
    # a NaN's and blocks 0's; clamp's blocks a NaN's and passes 0's)
    return prim(Prim.RELU, x)


@register(F.gelu)
def _gelu(x, approximate="none"):
    y = _upcast(x)
    if approximate == "tanh":
        inner = prim(Prim.MUL, prim(Prim.ADD, y, prim(Prim.MUL, prim(Prim.MUL, prim(Prim.MUL, y, y), y),
                                                        0.044715)), math.sqrt(2 / math.pi))
        out = prim(Prim.MUL, prim(Prim.MUL, y, 0.5), prim(Prim.ADD, prim(Prim.TANH, inner), 1.0))
    else:
        out = prim(Prim.MUL, prim(Prim.MUL, y, 0.5),
                   prim(Prim.ADD, prim(Prim.ERF, prim(Prim.MUL, y, 1 / math.sqrt(2))), 1.0))
    return _downcast(out, x.dtype)


@register(F.silu)
def _silu(x, inplace=False):
    y = _upcast(x)
    return _downcast(prim(Prim.MUL, y, prim(Prim.SIGMOID, y)), x.dtype)


# ----------------------------------------------------------------------------------------------
# Casts
# ----------------------------------------------------------------------------------------------

@register(torch.Tensor.to)
def _to(x, *args, **kwargs):
    if len(args) == 1 and isinstance(args[0], torch.dtype) and not kwargs:
        return prim(Prim.CONVERT, x, args[0])
    if not args and set(kwargs) == {"dtype"}:
        return prim(Prim.CONVERT, x, kwargs["dtype"])
    raise NotImplementedError   # device moves and copies stay torch calls


for _name, _dtype in (("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                      ("bfloat16", torch.bfloat16), ("int", torch.int32), ("long", torch.int64),
                      ("bool", torch.bool), ("short", torch.int16), ("char", torch.int8),
                      ("byte", torch.uint8)):
    register(getattr(torch.Tensor, _name))((lambda dt: lambda x, **kw: prim(Prim.CONVERT, x, dt))(_dtype))


@register(torch.Tensor.type_as)
def _type_as(x, other):
    return prim(Prim.CONVERT, x, other.dtype)


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------

@register(*_methods("sum"))
def _sum(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = prim(Prim.CONVERT, x, dtype)
    return prim(Prim.SUM, x, _dims(x, dim), keepdim)


@register(*_methods("prod"))
def _prod(x, dim=None, keepdim=False, *, dtype=None):
    if dtype is not None:
        x = prim(Prim.CONVERT, x, dtype)
    return prim(Prim.PROD, x, _dims(x, dim), keepdim)


@register(*_methods("mean"))
def _mean(x, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or x.dtype
    y = _upcast(prim(Prim.CONVERT, x, dtype) if dtype is not None else x)
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    return _downcast(prim(Prim.DIV, prim(Prim.SUM, y, dims, keepdim), n), out_dtype)


def _var_impl(x, dim, correction, keepdim):
    y = _upcast(x)
    dims = _dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    mean = prim(Prim.DIV, prim(Prim.SUM, y, dims, True), n)
    diff = prim(Prim.SUB, y, mean)
    ss = prim(Prim.SUM, prim(Prim.MUL, diff, diff), dims, keepdim)
    return prim(Prim.DIV, ss, max(n - correction, 0)), y


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@register(*_methods("var"))
def _var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    v, _ = _var_impl(x, dim, _correction(unbiased, correction), keepdim)
    return _downcast(v, x.dtype)


@register(*_methods("std"))
def _std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    v, _ = _var_impl(x, dim, _correction(unbiased, correction), keepdim)
    return _downcast(prim(Prim.SQRT, v), x.dtype)


def _minmax_reduction(reduce_prim, arg_prim, binary_prim):
    def decomposition(x, dim=None, keepdim=False, **kwargs):
        _no_kwargs(kwargs)
        if isinstance(dim, TensorProxy):
            return prim(binary_prim, x, dim)
        if dim is None:
            return prim(reduce_prim, x, _dims(x, None), False)
        return (prim(reduce_prim, x, _dims(x, dim), keepdim), prim(arg_prim, x, dim, keepdim))
    return decomposition


register(*_methods("max"))(_minmax_reduction(Prim.AMAX, Prim.ARGMAX, Prim.MAXIMUM))
register(*_methods("min"))(_minmax_reduction(Prim.AMIN, Prim.ARGMIN, Prim.MINIMUM))


@register(*_methods("amax"))
def _amax(x, dim=(), keepdim=False):
    return prim(Prim.AMAX, x, _dims(x, dim), keepdim)


@register(*_methods("amin"))
def _amin(x, dim=(), keepdim=False):
    return prim(Prim.AMIN, x, _dims(x, dim), keepdim)


@register(*_methods("argmax"))
def _argmax(x, dim=None, keepdim=False):
    return prim(Prim.ARGMAX, x, dim, keepdim)


@register(*_methods("argmin"))
def _argmin(x, dim=None, keepdim=False):
    return prim(Prim.ARGMIN, x, dim, keepdim)


@register(*_methods("any"))
def _any(x, dim=None, keepdim=False):
    dims = _dims(x, dim)
    _no_empty_reduction(x, dims)
    nz = prim(Prim.NE, x, 0) if x.dtype != torch.bool else x
    return prim(Prim.AMAX, nz, dims, keepdim)


@register(*_methods("all"))
def _all(x, dim=None, keepdim=False):
    dims = _dims(x, dim)
    _no_empty_reduction(x, dims)
    nz = prim(Prim.NE, x, 0) if x.dtype != torch.bool else x
    return prim(Prim.AMIN, nz, dims, keepdim)
