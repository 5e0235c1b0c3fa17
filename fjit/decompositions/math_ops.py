"""Torch-level math ops (elementwise, casts, reductions) as decompositions into prims.

The torch callables that are exactly one prim are registered from the prim blocks
(fjit/core/prims/: a block's torch names get the generic unary or binary decomposition here, its
own decompositions are registered as they are); this module writes the composite ops (square,
clamp, gelu, mean, var, max, any, casts, ...).  A decomposition takes the op's arguments (proxies
for tensors) and calls prims.  It raises NotImplementedError for a case it does not cover, and the
op then stays a single opaque call (the torch executor runs it either way; the prims are what the
fusion pass and the Triton executor see).  The dispatcher checks every decomposition's result
metadata against torch's meta result.

It also holds the helpers every ops module registers its decompositions with (`register`,
`replace`, `call`, `upcast`, `downcast`, `no_empty_reduction`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fjit.core.prims import ROWS, Kind, Prim, apply, torch_callables
from fjit.core.prims.toolkit import no_kwargs, reduced_dims
from fjit.frontend.dispatch import dispatch
from fjit.frontend.record import DECOMPOSITIONS, REPLACEMENTS
from fjit.frontend.proxies import NumberProxy, TensorProxy

_HALF = (torch.float16, torch.bfloat16)


def register(*funcs):
    def deco(decomposition):
        for f in funcs:
            DECOMPOSITIONS[f] = decomposition
        return decomposition
    return deco


def replace(*funcs):
    """A replacement records other torch-level ops in the op's place (each its own op of the
    trace, as eager's composite would call them), where a decomposition records prims under it."""
    def deco(replacement):
        REPLACEMENTS.update(dict.fromkeys(funcs, replacement))
        return replacement
    return deco


def call(f, *args, **kwargs):
    """The torch-level op `f` recorded from inside a decomposition or a replacement: its own op of
    the trace, decomposed in turn."""
    return dispatch(f, args, kwargs)


def no_empty_reduction(x, dims):
    """max/min-based decompositions have no identity: an empty reduced dim stays one torch call."""
    if any(x.shape[d] == 0 for d in dims):
        raise NotImplementedError


def upcast(x):
    """Half types computed in float32, as torch's kernels compute them."""
    return apply(Prim.CONVERT, x, torch.float32) if x.dtype in _HALF else x


def downcast(y, dtype):
    return apply(Prim.CONVERT, y, dtype) if y.dtype != dtype else y


# ----------------------------------------------------------------------------------------------
# Elementwise
# ----------------------------------------------------------------------------------------------

def _unary(p):
    def decomposition(x, **kwargs):
        no_kwargs(kwargs)
        return apply(p, x)
    return decomposition


def _binary(p, swap=False):
    def decomposition(a, b, **kwargs):
        alpha = kwargs.pop("alpha", None)
        if p is Prim.DIV and "rounding_mode" in kwargs:
            mode = kwargs.pop("rounding_mode")
            p2 = {None: Prim.DIV, "trunc": Prim.TRUNC_DIVIDE, "floor": Prim.FLOOR_DIVIDE}[mode]
        else:
            p2 = p
        no_kwargs(kwargs)
        # (a runtime float alpha is multiplied in whatever its value: comparing it would specialize)
        if alpha is not None and (isinstance(alpha, NumberProxy) or alpha != 1):
            if not isinstance(b, TensorProxy):
                raise NotImplementedError   # a number times alpha: torch rounds them its own way
            b = apply(Prim.MUL, b, alpha)
        return apply(p2, b, a) if swap else apply(p2, a, b)
    return decomposition


# Every torch callable a block names is exactly its prim; the blocks' own decompositions follow.
for _block in ROWS.values():
    for _name in _block.torch_names:
        if _block.kind is Kind.UNARY:
            register(*torch_callables(_name))(_unary(_block.prim))
        elif _block.kind is Kind.BINARY:
            register(*torch_callables(_name))(_binary(_block.prim))
            if _block.reflected and _block.reflected.startswith("__r"):
                register(getattr(torch.Tensor, _block.reflected))(_binary(_block.prim, swap=True))
    register(*_block.also)(_unary(_block.prim))
    for _callables, _decomposition in _block.decompositions:
        register(*_callables)(_decomposition)


@register(*torch_callables("square"))
def _square(x):
    return apply(Prim.MUL, x, x) if x.dtype != torch.bool else apply(Prim.POW, x, 2)


@register(*torch_callables("clamp"), *torch_callables("clip"))
def _clamp(x, min=None, max=None):
    if min is None and max is None:
        raise NotImplementedError
    if isinstance(min, TensorProxy) and isinstance(max, TensorProxy):
        # Where min >= max eager's clamp gives the gradient to max alone, and to nothing where
        # x < min == max: not what max-then-min's rules give, so torch's clamp and its backward run
        raise NotImplementedError
    if min is not None:
        x = apply(Prim.CLAMP_MIN, x, min)
    if max is not None:
        x = apply(Prim.CLAMP_MAX, x, max)
    return x


@register(F.gelu)
def _gelu(x, approximate="none"):
    y = upcast(x)
    if approximate == "tanh":
        inner = apply(Prim.MUL, apply(Prim.ADD, y, apply(Prim.MUL, apply(Prim.MUL, apply(Prim.MUL, y, y), y),
                                                        0.044715)), math.sqrt(2 / math.pi))
        out = apply(Prim.MUL, apply(Prim.MUL, y, 0.5), apply(Prim.ADD, apply(Prim.TANH, inner), 1.0))
    else:
        out = apply(Prim.MUL, apply(Prim.MUL, y, 0.5),
                   apply(Prim.ADD, apply(Prim.ERF, apply(Prim.MUL, y, 1 / math.sqrt(2))), 1.0))
    return downcast(out, x.dtype)


# The hard activations as ATen computes them (x * min(max(x + 3, 0), 6) / 6, ...).  hardtanh's and
# hardsigmoid's backward pass the gradient only strictly inside the bounds (hardtanh_backward),
# where clamp's rule passes it at the bounds too: a select between the bounds and x (or the ramp)
# differentiates as eager does.  So does hardswish's gate (hardswish_backward: 0 at x <= -3, the
# gradient at x >= 3 or NaN, x / 3 + 0.5 strictly between), selected between 0, x + 3 and 6.
@register(F.hardtanh)
def _hardtanh(x, min_val=-1.0, max_val=1.0, inplace=False):
    if not x.dtype.is_floating_point or any(isinstance(v, (TensorProxy, NumberProxy)) for v in (min_val, max_val)):
        raise NotImplementedError
    inside = apply(Prim.WHERE, apply(Prim.GE, x, max_val), max_val, x)
    return apply(Prim.WHERE, apply(Prim.LE, x, min_val), min_val, inside)


@register(F.relu6)
def _relu6(x, inplace=False):
    return _hardtanh(x, 0.0, 6.0)


@register(F.hardsigmoid)
def _hardsigmoid(x, inplace=False):
    if not x.dtype.is_floating_point:
        raise NotImplementedError
    y = upcast(x)
    ramp = apply(Prim.DIV, apply(Prim.ADD, y, 3.0), 6.0)
    inside = apply(Prim.WHERE, apply(Prim.GE, y, 3.0), 1.0, ramp)
    return downcast(apply(Prim.WHERE, apply(Prim.LE, y, -3.0), 0.0, inside), x.dtype)


@register(F.hardswish)
def _hardswish(x, inplace=False):
    if not x.dtype.is_floating_point:
        raise NotImplementedError
    y = upcast(x)
    ramp = apply(Prim.WHERE, apply(Prim.LT, y, 3.0), apply(Prim.ADD, y, 3.0), 6.0)    # NaN: 6
    gate = apply(Prim.WHERE, apply(Prim.LE, y, -3.0), 0.0, ramp)
    return downcast(apply(Prim.DIV, apply(Prim.MUL, y, gate), 6.0), x.dtype)


# leaky_relu as ATen computes it (x > 0 ? x : x * slope: NaN and -0.0 go through the multiply)
# and differentiates it (leaky_relu_backward: the gradient where x > 0, else times the slope); a
# torch call instead, torch autograd recorded it in a joint program (CSPDarkNet-53: 67 a step).
@register(F.leaky_relu)
def _leaky_relu(x, negative_slope=0.01, inplace=False):
    if not x.dtype.is_floating_point or isinstance(negative_slope, (TensorProxy, NumberProxy)) \
            or type(negative_slope) not in (int, float):
        raise NotImplementedError
    return apply(Prim.WHERE, apply(Prim.GT, x, 0.0), x, apply(Prim.MUL, x, float(negative_slope)))


@register(F.silu)
def _silu(x, inplace=False):
    y = upcast(x)
    return downcast(apply(Prim.MUL, y, apply(Prim.SIGMOID, y)), x.dtype)


# The ops below were torch calls that torch autograd recorded inside a joint program, each a nested
# autograd graph in the forward and a torch.autograd.grad call in the backward (~0.3 ms a step for
# BLOOM's): ResMLP's affine layers are addcmul (75 a step), Mamba's dt is softplus, EdgeNeXt's
# attention normalizes q and k.  As prims they fuse, with the same formulas as ATen's kernels.
def _same_float(*ts) -> bool:
    return all(isinstance(t, TensorProxy) for t in ts) and ts[0].dtype.is_floating_point \
        and all(t.dtype == ts[0].dtype for t in ts)


@register(*torch_callables("addcmul"))
def _addcmul(x, tensor1, tensor2, *, value=1):
    """x + value * tensor1 * tensor2, multiplied left to right as ATen's kernel does."""
    if not _same_float(x, tensor1, tensor2) or type(value) not in (int, float):
        raise NotImplementedError
    x1, t1, t2 = upcast(x), upcast(tensor1), upcast(tensor2)     # a half type rounds once
    scaled = t1 if value == 1 else apply(Prim.MUL, t1, value)
    return downcast(apply(Prim.ADD, x1, apply(Prim.MUL, scaled, t2)), x.dtype)


@register(*torch_callables("addcdiv"))
def _addcdiv(x, tensor1, tensor2, *, value=1):
    """x + value * (tensor1 / tensor2), as ATen's vectorized kernel."""
    if not _same_float(x, tensor1, tensor2) or type(value) not in (int, float):
        raise NotImplementedError
    ratio = apply(Prim.DIV, upcast(tensor1), upcast(tensor2))
    return downcast(apply(Prim.ADD, upcast(x), ratio if value == 1 else apply(Prim.MUL, ratio, value)),
                    x.dtype)


@register(F.softplus)
def _softplus(x, beta=1.0, threshold=20.0):
    """(x * beta > threshold) ? x : log1p(exp(x * beta)) / beta, as ATen computes it; the prims'
    gradient is softplus_backward's, exp(x * beta) / (exp(x * beta) + 1) below the threshold.  Above
    it the exponential reads 0: at x = inf its gradient would be 0 * inf."""
    if not _same_float(x) or type(beta) not in (int, float) or type(threshold) not in (int, float):
        raise NotImplementedError
    y = upcast(x)
    scaled = apply(Prim.MUL, y, beta) if beta != 1 else y
    over = apply(Prim.GT, scaled, threshold)
    soft = apply(Prim.LOG1P, apply(Prim.EXP, apply(Prim.WHERE, over, 0.0, scaled)))
    soft = apply(Prim.DIV, soft, beta) if beta != 1 else soft
    return downcast(apply(Prim.WHERE, over, y, soft), x.dtype)


@register(F.normalize)
def _normalize(x, p=2.0, dim=1, eps=1e-12, out=None):
    """x / max(||x||_2 over dim, eps).  The norm is 0 where the sum of squares s is 0 and sqrt(s)
    elsewhere, with sqrt reading 1 there: the same values (NaN and inf included), and where s == 0
    the gradient is 0, as linalg.vector_norm's backward masks it, where sqrt's rule gives 0 * inf."""
    if out is not None or p != 2 or not _same_float(x) or type(eps) not in (int, float) \
            or not isinstance(dim, int) or x.ndim == 0:
        raise NotImplementedError
    y = upcast(x)
    s = apply(Prim.SUM, apply(Prim.MUL, y, y), reduced_dims(x, dim), True)
    zero = apply(Prim.EQ, s, 0.0)
    norm = apply(Prim.WHERE, zero, 0.0, apply(Prim.SQRT, apply(Prim.WHERE, zero, 1.0, s)))
    return downcast(apply(Prim.DIV, y, apply(Prim.CLAMP_MIN, norm, eps)), x.dtype)


# ----------------------------------------------------------------------------------------------
# Casts
# ----------------------------------------------------------------------------------------------

@register(torch.Tensor.to)
def _to(x, *args, **kwargs):
    if len(args) == 1 and isinstance(args[0], torch.dtype) and not kwargs:
        return apply(Prim.CONVERT, x, args[0])
    if not args and set(kwargs) == {"dtype"}:
        return apply(Prim.CONVERT, x, kwargs["dtype"])
    raise NotImplementedError   # device moves and copies stay torch calls


for _name, _dtype in (("float", torch.float32), ("double", torch.float64), ("half", torch.float16),
                      ("bfloat16", torch.bfloat16), ("int", torch.int32), ("long", torch.int64),
                      ("bool", torch.bool), ("short", torch.int16), ("char", torch.int8),
                      ("byte", torch.uint8)):
    register(getattr(torch.Tensor, _name))((lambda dt: lambda x, **kw: apply(Prim.CONVERT, x, dt))(_dtype))


@register(torch.Tensor.type_as)
def _type_as(x, other):
    return apply(Prim.CONVERT, x, other.dtype)


# ----------------------------------------------------------------------------------------------
# Reductions
# ----------------------------------------------------------------------------------------------

@register(*torch_callables("mean"))
def _mean(x, dim=None, keepdim=False, *, dtype=None):
    out_dtype = dtype or x.dtype
    y = upcast(apply(Prim.CONVERT, x, dtype) if dtype is not None else x)
    dims = reduced_dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    return downcast(apply(Prim.DIV, apply(Prim.SUM, y, dims, keepdim), n), out_dtype)


def _var_impl(x, dim, correction, keepdim):
    y = upcast(x)
    dims = reduced_dims(x, dim)
    n = math.prod(x.shape[d] for d in dims)
    # The mean is a constant to the backward, as in eager's var_backward (2 (y - mean) g / n): its
    # own term, -2 sum(y - mean) g / n^2, is zero but for rounding, and NaN where a row holds an
    # infinity (inf - inf), which then spread over the row's every gradient
    with torch.no_grad():
        mean = apply(Prim.DIV, apply(Prim.SUM, y, dims, True), n)
    diff = apply(Prim.SUB, y, mean)
    ss = apply(Prim.SUM, apply(Prim.MUL, diff, diff), dims, keepdim)
    return apply(Prim.DIV, ss, max(n - correction, 0)), y


def _correction(unbiased, correction):
    if correction is not None:
        return correction
    return 1 if unbiased is None or unbiased else 0


@register(*torch_callables("var"))
def _var(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    v, _ = _var_impl(x, dim, _correction(unbiased, correction), keepdim)
    return downcast(v, x.dtype)


@register(*torch_callables("std"))
def _std(x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    if isinstance(dim, bool):
        dim, unbiased = None, dim
    v, _ = _var_impl(x, dim, _correction(unbiased, correction), keepdim)
    return downcast(_sqrt_of_variance(v), x.dtype)


def _sqrt_of_variance(v):
    """sqrt(v) whose gradient is 0 where v is 0, as eager's std backward masks it (sqrt's own rule
    gives 0 * inf = NaN there): the root of 1 taken instead and replaced by 0, the same values."""
    zero = apply(Prim.EQ, v, 0)
    return apply(Prim.WHERE, zero, 0.0, apply(Prim.SQRT, apply(Prim.WHERE, zero, 1.0, v)))


def _minmax_reduction(reduce_prim, arg_prim, binary_prim):
    def decomposition(x, dim=None, keepdim=False, **kwargs):
        no_kwargs(kwargs)
        if isinstance(dim, TensorProxy):
            return apply(binary_prim, x, dim)
        if dim is None:
            if x.requires_grad:
                # torch.max(x)'s backward splits the cotangent among the NaNs where the result is
                # NaN (evenly_distribute_backward); amax's, the prim's rule, among no element
                raise NotImplementedError
            return apply(reduce_prim, x, reduced_dims(x, None), False)
        return (apply(reduce_prim, x, reduced_dims(x, dim), keepdim), apply(arg_prim, x, dim, keepdim))
    return decomposition


register(*torch_callables("max"))(_minmax_reduction(Prim.AMAX, Prim.ARGMAX, Prim.MAXIMUM))
register(*torch_callables("min"))(_minmax_reduction(Prim.AMIN, Prim.ARGMIN, Prim.MINIMUM))


def _truth_reduction(reduce_prim):
    """any (the largest truth value: AMAX) or all (the smallest: AMIN) of x != 0 over dims."""
    def decomposition(x, dim=None, keepdim=False):
        dims = reduced_dims(x, dim)
        no_empty_reduction(x, dims)
        nz = apply(Prim.NE, x, 0) if x.dtype != torch.bool else x
        return apply(reduce_prim, nz, dims, keepdim)
    return decomposition


register(*torch_callables("any"))(_truth_reduction(Prim.AMAX))
register(*torch_callables("all"))(_truth_reduction(Prim.AMIN))


@replace(torch.einsum)
def _einsum(equation, *operands):
    """A two-operand einsum without ellipsis or repeated letters (MaxViT's and T5-style attention
    'bghid,bghjd->bghij', SAM's relative positions 'bhwc,hkc->bhwk') as the permutes, reshapes and
    one batched matmul torch's own einsum runs, recorded as those ops: the joint backward
    differentiates them, where the whole op was one call torch autograd kept, graph and all."""
    if len(operands) == 1 and isinstance(operands[0], (tuple, list)):
        operands = tuple(operands[0])
    if not isinstance(equation, str) or len(operands) != 2 or \
            not all(isinstance(t, TensorProxy) for t in operands):
        raise NotImplementedError
    inputs, arrow, out = equation.replace(" ", "").partition("->")
    terms = inputs.split(",")
    a, b = operands
    if not arrow or len(terms) != 2 or not (inputs.replace(",", "") + out).isalpha() or \
            [len(t) for t in terms] != [a.ndim, b.ndim] or any(len(set(t)) != len(t) for t in (*terms, out)) \
            or not set(out) <= set(inputs) - {","} or a.dtype != b.dtype:
        raise NotImplementedError
    size = {c: n for t, x in zip(terms, operands) for c, n in zip(t, x.shape)}
    if any(size[c] != n for t, x in zip(terms, operands) for c, n in zip(t, x.shape)) or \
            any(c not in out and c not in terms[1 - k] for k, t in enumerate(terms) for c in t):
        raise NotImplementedError    # broadcast sizes, or a letter summed within one operand
    batch = [c for c in out if c in terms[0] and c in terms[1]]
    left, right = ([c for c in out if c in t and c not in u] for t, u in (terms, terms[::-1]))
    inner = [c for c in terms[0] if c in terms[1] and c not in out]
    if math.prod(size[c] for c in inner) == 1:
        # nothing to contract (an outer product, summed letters of size 1): torch's einsum then
        # multiplies rather than calling bmm, so autocast does not cast it (a bf16 matmul here
        # gave bfloat16 where eager under autocast gives float32)
        raise NotImplementedError

    def grouped(x, term, order):
        x = call(torch.Tensor.permute, x, tuple(term.index(c) for c in order[0] + order[1] + order[2]))
        return call(torch.Tensor.reshape, x, (*[size[c] for c in order[0]],
                    math.prod(size[c] for c in order[1]), math.prod(size[c] for c in order[2])))
    y = call(torch.matmul, grouped(a, terms[0], (batch, left, inner)), grouped(b, terms[1], (batch, inner, right)))
    y = call(torch.Tensor.reshape, y, tuple(size[c] for c in batch + left + right))
    return call(torch.Tensor.permute, y, tuple((batch + left + right).index(c) for c in out))
