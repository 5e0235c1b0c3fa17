"""VJP rules: one row per prim, as JAX's `ad.primitive_transposes[p] = rule`.

A rule runs while the backward trace is being recorded: it gets the forward bound symbol `b` (its
TensorVars give shapes and dtypes), the cotangent `g` of b's output (a proxy) and `value(var)`,
which returns a proxy for a forward value (saved by the forward or recomputed in the backward, as
joint.py decides: a rule asks only for what it reads, so nothing else is kept).  It returns
`[(forward var, its cotangent contribution), ...]` for the tensor operands that need one; the
caller reduces broadcast dims and casts to each operand's dtype (`fit`), and sums contributions.

Prims in NONDIFF have no cotangent flowing through them (integer or bool results, factories,
rounding: torch's gradient there is zero or undefined).  A prim in neither table keeps torch autograd
for the torch-level op it belongs to (joint.py records that op with torch and calls
torch.autograd.grad in the backward): correct, just not fused.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import TensorVar, Var
from fjit.core.prims import Prim
from fjit.ops.math_ops import prim

VJP: dict = {}

NONDIFF = frozenset({
    Prim.FLOOR, Prim.CEIL, Prim.ROUND, Prim.TRUNC, Prim.SIGN, Prim.LOGICAL_NOT, Prim.BITWISE_NOT,
    Prim.ISNAN, Prim.ISINF, Prim.ISFINITE, Prim.FLOOR_DIVIDE, Prim.TRUNC_DIVIDE, Prim.EQ, Prim.NE,
    Prim.LT, Prim.LE, Prim.GT, Prim.GE, Prim.LOGICAL_AND, Prim.LOGICAL_OR, Prim.LOGICAL_XOR,
    Prim.BITWISE_AND, Prim.BITWISE_OR, Prim.BITWISE_XOR, Prim.SHIFT_LEFT, Prim.SHIFT_RIGHT,
    Prim.ARGMAX, Prim.ARGMIN, Prim.FULL, Prim.IOTA, Prim.UNIFORM, Prim.NORMAL})


def vjp(*prims):
    def register(rule):
        for p in prims:
            VJP[p] = rule
        return rule
    return register


def has_rule(p: Prim | None) -> bool:
    return p in VJP or p in NONDIFF


def _t(x) -> bool:
    return isinstance(x, TensorVar)


def fit(g, var: TensorVar, shape: tuple):
    """The contribution `g` to var's cotangent, summed over the dims var was broadcast along and
    typed as var.  `shape` is the value g stands for: g may be that value lazily broadcast (size-1
    or missing dims: cotangents stay so until a rule needs the full shape, see `full`, so the
    elementwise work on them fuses; an expand is a view the partitioner does not take).  A sum
    over a dim g only broadcasts along is a multiplication by its size."""
    shape, target = tuple(shape), tuple(var.shape)
    lead = len(shape) - len(target)
    factor = 1
    offset = len(shape) - g.ndim          # g's dim j is shape's dim j + offset
    factor *= math.prod(shape[:max(0, min(lead, offset))])
    dims = tuple(j for j in range(g.ndim) if j + offset < lead)
    if dims:
        factor *= math.prod(shape[j + offset] for j in dims if g.shape[j] == 1)
        g = prim(Prim.SUM, g, dims, False)
    offset = len(target) - g.ndim         # now g's dim j is target's dim j + offset
    summed = []
    for i, size in enumerate(target):
        if size != 1 or shape[lead + i] == 1:
            continue
        j = i - offset
        if j >= 0 and g.shape[j] != 1:
            summed.append(j)
        else:
            factor *= shape[lead + i]
    if summed:
        g = prim(Prim.SUM, g, tuple(summed), True)
    if factor != 1:
        g = prim(Prim.MUL, g, factor)
    return prim(Prim.CONVERT, g, var.dtype) if g.dtype != var.dtype else g


def full(g, var: TensorVar):
    """A cotangent of exactly var's shape."""
    if tuple(g.shape) == tuple(var.shape):
        return g
    if g.ndim < var.ndim:
        g = prim(Prim.RESHAPE, g, (1,) * (var.ndim - g.ndim) + tuple(g.shape))
    return prim(Prim.EXPAND, g, tuple(var.shape))


def _zeros_like(g):
    return prim(Prim.FULL, (), 0, dtype=g.dtype, device=g.device)


# -- elementwise, unary: d out / d x as a function of x and out ------------------------------------

def _unary(derivative):
    def rule(b, g, value):
        x = b.args[0]
        return [(x, prim(Prim.MUL, g, derivative(x, b.output, value)))]
    return rule


def _square(v):
    return prim(Prim.MUL, v, v)


_UNARY = {
    Prim.ABS: lambda x, o, v: prim(Prim.SIGN, v(x)),
    Prim.EXP: lambda x, o, v: v(o),
    Prim.EXP2: lambda x, o, v: prim(Prim.MUL, v(o), math.log(2.0)),
    Prim.EXPM1: lambda x, o, v: prim(Prim.ADD, v(o), 1),
    Prim.LOG: lambda x, o, v: prim(Prim.RECIPROCAL, v(x)),
    Prim.LOG2: lambda x, o, v: prim(Prim.RECIPROCAL, prim(Prim.MUL, v(x), math.log(2.0))),
    Prim.LOG10: lambda x, o, v: prim(Prim.RECIPROCAL, prim(Prim.MUL, v(x), math.log(10.0))),
    Prim.LOG1P: lambda x, o, v: prim(Prim.RECIPROCAL, prim(Prim.ADD, v(x), 1)),
    Prim.SQRT: lambda x, o, v: prim(Prim.DIV, 0.5, v(o)),
    Prim.RSQRT: lambda x, o, v: prim(Prim.MUL, prim(Prim.MUL, _square(v(o)), v(o)), -0.5),
    Prim.SIN: lambda x, o, v: prim(Prim.COS, v(x)),
    Prim.COS: lambda x, o, v: prim(Prim.NEG, prim(Prim.SIN, v(x))),
    Prim.TAN: lambda x, o, v: prim(Prim.ADD, _square(v(o)), 1),
    Prim.ASIN: lambda x, o, v: prim(Prim.RSQRT, prim(Prim.SUB, 1, _square(v(x)))),
    Prim.ACOS: lambda x, o, v: prim(Prim.NEG, prim(Prim.RSQRT, prim(Prim.SUB, 1, _square(v(x))))),
    Prim.ATAN: lambda x, o, v: prim(Prim.RECIPROCAL, prim(Prim.ADD, _square(v(x)), 1)),
    Prim.SINH: lambda x, o, v: prim(Prim.COSH, v(x)),
    Prim.COSH: lambda x, o, v: prim(Prim.SINH, v(x)),
    Prim.TANH: lambda x, o, v: prim(Prim.SUB, 1, _square(v(o))),
    Prim.SIGMOID: lambda x, o, v: prim(Prim.MUL, v(o), prim(Prim.SUB, 1, v(o))),
    Prim.ERF: lambda x, o, v: prim(Prim.MUL, prim(Prim.EXP, prim(Prim.NEG, _square(v(x)))),
                                   2.0 / math.sqrt(math.pi)),
    Prim.RECIPROCAL: lambda x, o, v: prim(Prim.NEG, _square(v(o))),
}
for _p, _d in _UNARY.items():
    VJP[_p] = _unary(_d)


@vjp(Prim.NEG)
def _neg(b, g, value):
    return [(b.args[0], prim(Prim.NEG, g))]


@vjp(Prim.CLONE, Prim.CONTIGUOUS, Prim.CONVERT, Prim.EXPAND)
def _identity(b, g, value):
    """Same values, maybe broadcast or another dtype: `fit` sums expanded dims and casts."""
    return [(b.args[0], g)]


@vjp(Prim.RESHAPE, Prim.SQUEEZE, Prim.UNSQUEEZE)
def _reshape(b, g, value):
    x = b.args[0]
    return [(x, prim(Prim.RESHAPE, full(g, b.output), tuple(x.shape)))]


# -- elementwise, binary ---------------------------------------------------------------------------

def _val(x, value):
    """A forward operand as the backward sees it: a proxy for a traced value, else the constant."""
    return value(x) if isinstance(x, Var) else x


def _operands(b, value):
    return _val(b.args[0], value), _val(b.args[1], value)


@vjp(Prim.ADD)
def _add(b, g, value):
    return [(b.args[0], g), (b.args[1], g)]


@vjp(Prim.SUB)
def _sub(b, g, value):
    return [(b.args[0], g), (b.args[1], prim(Prim.NEG, g))] if _t(b.args[1]) else [(b.args[0], g)]


@vjp(Prim.MUL)
def _mul(b, g, value):
    a, c = b.args[:2]
    out = []
    if _t(a):
        out.append((a, prim(Prim.MUL, g, _val(c, value))))
    if _t(c):
        out.append((c, prim(Prim.MUL, g, _val(a, value))))
    return out


@vjp(Prim.DIV)
def _div(b, g, value):
    a, c = b.args[:2]
    va, vc = _operands(b, value)
    out = []
    if _t(a):
        out.append((a, prim(Prim.DIV, g, vc)))
    if _t(c):     # -g * a / c^2, computed as torch does
        out.append((c, prim(Prim.DIV, prim(Prim.MUL, prim(Prim.NEG, g), va), _square(vc))))
    return out


@vjp(Prim.POW)
def _pow(b, g, value):
    a, c = b.args[:2]
    va, vc = _operands(b, value)
    out = []
    if _t(a):   # c * a^(c-1), and 0 where c == 0 (torch's convention, also at a == 0)
        if _t(c):
            d = prim(Prim.MUL, vc, prim(Prim.POW, va, prim(Prim.SUB, vc, 1)))
            d = prim(Prim.WHERE, prim(Prim.EQ, vc, 0), 0.0, d)
        elif isinstance(c, Var):     # a runtime float exponent
            d = prim(Prim.MUL, prim(Prim.POW, va, vc - 1), vc)
        else:
            d = prim(Prim.MUL, prim(Prim.POW, va, vc - 1), vc) if vc != 0 else _zeros_like(g)
        out.append((a, prim(Prim.MUL, g, d)))
    if _t(c):   # out * log(a), and 0 where a == 0 and c >= 0
        d = prim(Prim.MUL, value(b.output), prim(Prim.LOG, va))
        zero = prim(Prim.LOGICAL_AND, prim(Prim.EQ, va, 0), prim(Prim.GE, vc, 0))
        out.append((c, prim(Prim.MUL, g, prim(Prim.WHERE, zero, 0.0, d))))
    return out


@vjp(Prim.MAXIMUM, Prim.MINIMUM)
def _max_min(b, g, value):
    """torch (derivatives.yaml): each operand gets g unless it loses (for maximum: is smaller),
    ties split g in half.  A NaN loses nothing, so both operands get g where either is NaN."""
    a, c = b.args[:2]
    va, vc = _operands(b, value)
    loses = Prim.LT if b.sym.name == "maximum" else Prim.GT
    tie = prim(Prim.EQ, va, vc)
    half = prim(Prim.MUL, g, 0.5)
    out = []
    for var, mine, other in ((a, va, vc), (c, vc, va)):
        if _t(var):
            share = prim(Prim.WHERE, prim(loses, mine, other), _zeros_like(g), g)
            out.append((var, prim(Prim.WHERE, tie, half, share)))
    return out


@vjp(Prim.RELU)
def _relu(b, g, value):
    """torch's threshold_backward: g where not x <= 0 (so a NaN passes it, 0 does not)."""
    (x,) = b.args[:1]
    blocked = prim(Prim.LE, value(x), 0)
    return [(x, prim(Prim.WHERE, blocked, _zeros_like(g), g))]


@vjp(Prim.CLAMP_MIN, Prim.CLAMP_MAX)
def _clamp(b, g, value):
    """torch (clamp_backward_min_max): x gets g where it is not clamped (x >= min), a tensor
    bound where it clamps (x < min).  Neither gets it where x or the bound is NaN."""
    x, bound = b.args[:2]
    vx, vb = _operands(b, value)
    is_min = b.sym.name == "clamp_min"
    keep = prim(Prim.GE if is_min else Prim.LE, vx, vb)
    out = [(x, prim(Prim.WHERE, keep, g, _zeros_like(g)))]
    if _t(bound):
        clamps = prim(Prim.LT if is_min else Prim.GT, vx, vb)
        out.append((bound, prim(Prim.WHERE, clamps, g, _zeros_like(g))))
    return out


@vjp(Prim.ATAN2)
def _atan2(b, g, value):
    a, c = b.args[:2]
    va, vc = _operands(b, value)
    r = prim(Prim.DIV, g, prim(Prim.ADD, _square(va), _square(vc)))
    out = []
    if _t(a):
        out.append((a, prim(Prim.MUL, r, vc)))
    if _t(c):
        out.append((c, prim(Prim.MUL, prim(Prim.NEG, r), va)))
    return out


@vjp(Prim.REMAINDER, Prim.FMOD)
def _remainder(b, g, value):
    """a - c * q with q = floor(a / c) (remainder) or trunc(a / c) (fmod): dq is zero."""
    a, c = b.args[:2]
    out = [(a, g)] if _t(a) else []
    if _t(c):
        va, vc = _operands(b, value)
        q = prim(Prim.FLOOR if b.sym.name == "remainder" else Prim.TRUNC, prim(Prim.DIV, va, vc))
        out.append((c, prim(Prim.MUL, prim(Prim.NEG, g), q)))
    return out


@vjp(Prim.WHERE)
def _where(b, g, value):
    cond, a, c = b.args[:3]
    vcond = _val(cond, value)
    out = []
    if _t(a):
        out.append((a, prim(Prim.WHERE, vcond, g, _zeros_like(g))))
    if _t(c):
        out.append((c, prim(Prim.WHERE, vcond, _zeros_like(g), g)))
    return out


# -- reductions ------------------------------------------------------------------------------------

def _unreduce(g, x: TensorVar, dims, keepdim):
    """A reduced cotangent broadcast back over the reduced dims of x."""
    if not keepdim:
        g = prim(Prim.RESHAPE, g, tuple(1 if d in dims else s for d, s in enumerate(x.shape)))
    return g   # broadcast along dims lazily (see fit)


@vjp(Prim.SUM)
def _sum(b, g, value):
    x, dims, keepdim = b.args[:3]
    return [(x, _unreduce(g, x, dims, keepdim))]


@vjp(Prim.AMAX, Prim.AMIN)
def _amax(b, g, value):
    """torch: the cotangent is split evenly among the elements equal to the extremum."""
    x, dims, keepdim = b.args[:3]
    out = _unreduce(value(b.output), x, dims, keepdim)
    hit = prim(Prim.CONVERT, prim(Prim.EQ, value(x), out), g.dtype)
    share = prim(Prim.DIV, _unreduce(g, x, dims, keepdim), prim(Prim.SUM, hit, dims, True))
    return [(x, prim(Prim.MUL, hit, share))]


# -- shapes and data movement ----------------------------------------------------------------------

@vjp(Prim.PERMUTE)
def _permute(b, g, value):
    perm = b.args[1]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [(b.args[0], prim(Prim.PERMUTE, g, inverse))]


@vjp(Prim.SLICE)
def _slice(b, g, value):
    """Scatter into zeros: a functional setitem on a value the backward owns."""
    x, index = b.args[:2]
    z = prim(Prim.EXPAND, _zeros_like(g), tuple(x.shape)).contiguous()
    z[index] = g
    return [(x, z)]


@vjp(Prim.CAT)
def _cat(b, g, value):
    tensors, dim = b.args[0], b.args[1] if len(b.args) > 1 else b.kwargs.get("dim", 0)
    dim = dim % g.ndim
    out, start = [], 0
    for t in tensors:
        # torch.cat skips 1-D empty tensors whatever the others' rank (a KV cache's empty start)
        size = t.shape[dim] if t.ndim == g.ndim else 0
        if _t(t) and size:
            index = (slice(None),) * dim + (slice(start, start + size),)
            out.append((t, prim(Prim.SLICE, g, index)))
        start += size
    return out


@vjp(Prim.INDEX_SELECT)
def _index_select(b, g, value):
    x, dim, index = b.args[:3]
    z = prim(Prim.EXPAND, _zeros_like(g), tuple(x.shape)).contiguous()
    return [(x, torch.index_add(z, dim, value(index), g))]


@vjp(Prim.GATHER)
def _gather(b, g, value):
    x, dim, index = b.args[:3]
    z = prim(Prim.EXPAND, _zeros_like(g), tuple(x.shape)).contiguous()
    return [(x, torch.scatter_add(z, dim, value(index), g))]


@vjp(Prim.MATMUL)
def _matmul(b, g, value):
    """Two matmuls; 1-d operands are made 2-d first, broadcast batch dims are summed by `fit`."""
    a, c = b.args[:2]
    va, vc = value(a), value(c)
    if a.ndim == 1:
        va, g = prim(Prim.UNSQUEEZE, va, 0), prim(Prim.UNSQUEEZE, g, -2 if c.ndim > 1 else 0)
    if c.ndim == 1:
        vc, g = prim(Prim.UNSQUEEZE, vc, -1), prim(Prim.UNSQUEEZE, g, -1)
    # A cotangent gets its operand's layout: F.linear's weight is used transposed, and a
    # transposed gradient would make AccumulateGrad's += read it with strides (3x slower).
    if _column_major(a):
        ga = _transposed(prim(Prim.MATMUL, vc, _transposed(g)))
    else:
        ga = prim(Prim.MATMUL, g, _transposed(vc))
    if c.ndim == 2 and va.ndim > 2:
        # A linear layer on N-d activations: the weight's gradient is one matmul of the flattened
        # operands, as eager's, not a batched matmul and a sum over the batch (4x slower on
        # MLP-Mixer's training step)
        va = prim(Prim.RESHAPE, va, (-1, va.shape[-1]))
        g = prim(Prim.RESHAPE, g, (-1, g.shape[-1]))
    if _column_major(c):
        gc = _transposed(prim(Prim.MATMUL, _transposed(g), va))
    else:
        gc = prim(Prim.MATMUL, _transposed(va), g)
    return [(a, _squeeze_to(ga, a)), (c, _squeeze_to(gc, c))]


def _column_major(v: TensorVar) -> bool:
    return v.ndim >= 2 and v.strides[-2] == 1 and v.strides[-1] != 1


def _transposed(v):
    perm = tuple(range(v.ndim - 2)) + (v.ndim - 1, v.ndim - 2)
    return prim(Prim.PERMUTE, v, perm)


def _squeeze_to(g, var: TensorVar):
    """A cotangent of a 1-d operand that was made 2-d: back to 1-d after summing batch dims."""
    if var.ndim != 1:
        return g
    g = prim(Prim.SUM, g, tuple(range(g.ndim - 2)), False) if g.ndim > 2 else g
    return prim(Prim.RESHAPE, g, tuple(var.shape))
