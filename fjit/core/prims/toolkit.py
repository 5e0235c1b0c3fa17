"""What prim blocks write their decompositions and VJP rules with.

A VJP rule runs while the backward trace is being recorded: it gets the forward bound symbol `b`
(its TensorVars give shapes and dtypes), the cotangent `g` of b's output (a proxy) and
`value(var)`, which returns a proxy for a forward value (saved by the forward or recomputed in the
backward, as autodiff/joint.py decides: a rule asks only for what it reads, so nothing else is
kept).  It returns `[(forward var, its cotangent contribution), ...]` for the tensor operands that
need one; the caller reduces broadcast dims and casts to each operand's dtype, and sums
contributions.
"""
from __future__ import annotations

from fjit.core.ir import TensorVar, Var
from fjit.core.prims.registry import Prim, apply


def is_tensor(x) -> bool:
    return isinstance(x, TensorVar)


def operand(x, value):
    """A forward operand as the backward sees it: a proxy for a traced value, else the constant."""
    return value(x) if isinstance(x, Var) else x


def operands(b, value):
    return operand(b.args[0], value), operand(b.args[1], value)


def square(v):
    return apply(Prim.MUL, v, v)


def zeros_like(g):
    """A 0-d zero of g's dtype and device (it broadcasts)."""
    return apply(Prim.FULL, (), 0, dtype=g.dtype, device=g.device)


def derivative(d):
    """The rule of a unary prim whose derivative is d(x, out, value): g * d."""
    def rule(b, g, value):
        x = b.args[0]
        return [(x, apply(Prim.MUL, g, d(x, b.output, value)))]
    return rule


def full(g, var: TensorVar):
    """A cotangent of exactly var's shape."""
    if tuple(g.shape) == tuple(var.shape):
        return g
    if g.ndim < var.ndim:
        g = apply(Prim.RESHAPE, g, (1,) * (var.ndim - g.ndim) + tuple(g.shape))
    return apply(Prim.EXPAND, g, tuple(var.shape))


def unreduce(g, x: TensorVar, dims, keepdim):
    """A reduced cotangent broadcast back over the reduced dims of x."""
    if not keepdim:
        g = apply(Prim.RESHAPE, g, tuple(1 if d in dims else s for d, s in enumerate(x.shape)))
    return g   # broadcast along dims lazily (see autodiff.rules.fit)


def no_kwargs(kwargs):
    """A decomposition covers no keyword it was not written for: the op stays one torch call."""
    if kwargs:
        raise NotImplementedError


def reduced_dims(x, dim) -> tuple:
    """Reduced dims, normalized; torch's meta call has already validated them.  A 0-d tensor
    accepts dim 0 or -1 and has nothing to reduce."""
    if dim is None or dim == () or dim == [] or x.ndim == 0:
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % x.ndim for d in dims)


def identity(b, g, value):
    """Same values, maybe broadcast or another dtype: the caller sums expanded dims and casts."""
    return [(b.args[0], g)]
