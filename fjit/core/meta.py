"""What torch itself decides about values without computing them: each op's exact output metadata
(shape, dtype, strides, type promotion, broadcasting) from a run on meta tensors (memoized), the
layouts the CPU kernels really choose (channels-last), and the SDPA backend torch would pick
(`attention_backend`).

A CPU convolution's real layout can differ from its meta kernel's, which does not know the CPU
backends' rule (suggests_channels_last).

An op's meta result depends only on its arguments' metadata and Python values, and torch's Python
meta kernels cost 0.1-0.5 ms a call; so each result is remembered as a recipe per (func, argument
metadata) -- a new tensor, one of the inputs, or a view of one -- and rebuilt for the next call
alike, in this trace or any other.  Callers disable torch-function tracing around these calls.

Under symbolic sizes (core/symbolic.py) the meta tensors are fake tensors of that environment,
whose shape rules compute with the symbols and record the guards they take; nothing is memoized.
"""
from __future__ import annotations

import contextlib

import torch

from fjit.core.ir import TensorVar, flatten_values, map_values
from fjit.core.symbolic import active, hint, is_one, is_symbolic


def meta_tensor(v: TensorVar) -> torch.Tensor:
    """A meta tensor with `v`'s metadata, its conjugate and negative bits included (so torch's
    answers to `is_conj()`, `resolve_conj()`, `view_as_real` and the rest are eager's).  (A
    complex value requires grad as a float one does: the real part of an FFT's requires grad in
    eager, and dropping it dropped the gradient there.)"""
    sizes = active()
    with contextlib.nullcontext() if sizes is None else sizes.shape_rules():
        m = torch.empty_strided(v.shape, v.strides, dtype=v.dtype, device="meta",
                                requires_grad=v.requires_grad and (v.dtype.is_floating_point or v.dtype.is_complex))
    return _with_bits(m, v.conj_bit, v.neg_bit)


def _with_bits(m: torch.Tensor, conj: bool, neg: bool) -> torch.Tensor:
    """The fresh meta tensor `m` with the conjugate and negative bits set as given: set on `m`
    itself, not through a view (`torch._conj(m)`), so that what views it has it as its `_base`."""
    if conj:
        torch._C._set_conj(m, True)
    if neg:
        torch._C._set_neg(m, True)
    return m


_META_RESULTS: dict = {}
_META_RESULTS_MAX = 4096


class _Unkeyable(Exception):
    pass


class _Out:
    """How to rebuild one tensor of a meta result: one of the inputs, a view of one, or new."""

    __slots__ = ("kind", "index", "shape", "strides", "offset", "dtype", "requires_grad", "conj", "neg")

    def __init__(self, kind, index, m):
        self.kind, self.index = kind, index
        self.shape, self.strides, self.offset = tuple(m.shape), m.stride(), m.storage_offset()
        self.dtype, self.requires_grad = m.dtype, m.requires_grad
        self.conj, self.neg = m.is_conj(), m.is_neg()


def _key_of(x):
    if isinstance(x, torch.Tensor):
        return ("T", tuple(x.shape), x.stride(), x.storage_offset(), x.dtype, x.requires_grad,
                x.is_conj(), x.is_neg())
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(_key_of(y) for y in x))
    if isinstance(x, dict):
        return (dict, tuple((k, _key_of(v)) for k, v in x.items()))
    if isinstance(x, slice):
        return (slice, _key_of(x.start), _key_of(x.stop), _key_of(x.step))
    try:
        hash(x)
    except TypeError:
        raise _Unkeyable from None
    return (type(x), x)     # the type keeps 1, 1.0 and True apart


def run_meta(func, margs, mkwargs):
    """func(*margs, **mkwargs) on meta tensors, from the memo when an equal call was seen."""
    sizes = active()
    if sizes is not None:       # symbolic sizes: torch's shape rules in their environment, no memo
        if _dropout_returning_its_input(func, margs, mkwargs):
            return margs[0]
        with sizes.shape_rules():
            return func(*margs, **mkwargs)
    try:
        # grad mode decides the outputs' requires_grad (what the compiled backward differentiates)
        key = (func, torch.is_grad_enabled(), _key_of(margs), _key_of(mkwargs))
    except _Unkeyable:
        return func(*margs, **mkwargs)
    inputs = [m for m in flatten_values((margs, mkwargs)) if isinstance(m, torch.Tensor)]
    recipe = _META_RESULTS.get(key)
    if recipe is not None:
        return map_values(lambda o: _rebuild(o, inputs) if isinstance(o, _Out) else o, recipe)
    mout = func(*margs, **mkwargs)
    try:
        recipe = map_values(lambda m: _recipe(m, inputs) if isinstance(m, torch.Tensor) else m, mout)
    except _Unkeyable:
        return mout
    if len(_META_RESULTS) >= _META_RESULTS_MAX:
        _META_RESULTS.clear()
    _META_RESULTS[key] = recipe
    return mout


_DROPOUTS = (torch.dropout, torch.nn.functional.dropout, torch.nn.functional.dropout1d,
             torch.nn.functional.dropout2d, torch.nn.functional.dropout3d)


def _dropout_returning_its_input(func, args, kwargs) -> bool:
    """A dropout that eager returns its input itself from (p == 0 or training off: ATen's
    dropout and feature_dropout return the input), which the meta kernel says too.  The Python
    decomposition symbolic shape rules take (`SymbolicSizes.shape_rules`) makes a new tensor,
    which would leave a no-op dropout in a symbolic program."""
    if func not in _DROPOUTS or not args:
        return False
    p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
    training = args[2] if len(args) > 2 else kwargs.get("train" if func is torch.dropout else "training", True)
    inplace = args[3] if len(args) > 3 else kwargs.get("inplace", False)
    return type(p) in (int, float) and type(training) is bool and not inplace and (p == 0 or not training)


def _recipe(m: torch.Tensor, inputs: list) -> _Out:
    for i, x in enumerate(inputs):
        if m is x:
            return _Out("input", i, m)
    if not m._is_view():
        return _Out("new", None, m)
    for i, x in enumerate(inputs):
        # as_strided keeps its input's bits: a view that changes them (conj) is no such view
        if m._base is x and m.dtype == x.dtype and m.layout == torch.strided \
                and (m.is_conj(), m.is_neg()) == (x.is_conj(), x.is_neg()):
            return _Out("view", i, m)
    raise _Unkeyable      # a view of something else: not rebuilt from a recipe


def _rebuild(o: _Out, inputs: list) -> torch.Tensor:
    if o.kind == "input":
        return inputs[o.index]
    if o.kind == "view":
        return torch.as_strided(inputs[o.index], o.shape, o.strides, o.offset)
    return _with_bits(torch.empty_strided(o.shape, o.strides, dtype=o.dtype, device="meta",
                                         requires_grad=o.requires_grad), o.conj, o.neg)


def clear_memo() -> None:
    """Forget every remembered meta result (the benchmarks measure truly cold compiles with it)."""
    _META_RESULTS.clear()


def same_layout(shape, a: tuple, b: tuple) -> bool:
    """Whether strides `a` and `b` lay out a value of `shape` alike (dims of size 1 address
    nothing, so their strides may differ)."""
    return all(is_one(size) or s == t for size, s, t in zip(shape, a, b))


def relaid_channels_last(v: TensorVar) -> bool:
    """Whether the channels-last form of a program (fjit/program_choice.py) makes this 2-D
    convolution input channels-last: a floating 4-D CPU value with more than one channel and more
    than one pixel (with one of either it is both layouts) that ATen does not already take as
    channels-last."""
    return v.ndim == 4 and v.device.type == "cpu" and v.dtype.is_floating_point and \
        v.shape[1] > 1 and v.shape[2] * v.shape[3] > 1 and not suggests_channels_last(v)


def channels_last_strides(shape) -> tuple:
    """A dense 4-D layout with the channels innermost."""
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def suggests_channels_last(v: TensorVar) -> bool:
    """ATen's suggest_memory_format() of a 4-D value is channels_last: its strides are ordered as
    channels-last ones (c10's is_channels_last_strides_2d, ambiguous cases contiguous)."""
    sizes, strides = v.shape, v.strides
    if strides[1] == 0:
        return False
    least = 0
    for d in (1, 3, 2, 0):
        if sizes[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return False
        least = strides[d] * (sizes[d] if sizes[d] > 1 else 1)
    return True


# F.scaled_dot_product_attention's parameters, in order (its calls may pass any positionally)
ATTENTION_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def attention_backend(q: TensorVar, k: TensorVar, v: TensorVar, mask: TensorVar | None = None,
                      is_causal: bool = False, scale: float | None = None) -> int:
    """torch's backend choice (a torch.nn.attention.SDPBackend value) for F.scaled_dot_product_attention
    of CPU operands shaped, laid out and needing gradients as these are, under the current grad
    mode: the choice reads all of that.

    With symbolic sizes the choice is asked at the compiling call's sizes.  On the CPU it reads of
    the sizes only whether the operands agree in batch, heads and head size, whether a sequence
    is empty (a symbol never is: 0 is specialized) and whether the last dim's stride is 1: those
    relations are compared below, which takes them as guards."""
    operands = [t for t in (q, k, v, mask) if t is not None]
    if any(is_symbolic(t.shape) or is_symbolic(t.strides) for t in operands):
        for a, b in ((q, k), (q, v), (k, v)):
            for d in (0, 1, -1):
                if a.ndim == b.ndim == 4:
                    bool(a.shape[d] == b.shape[d])
        for a in operands:
            if a.ndim:
                bool(a.strides[-1] == 1)

    def probe(t: TensorVar) -> torch.Tensor:
        x = torch.empty_strided(tuple(map(hint, t.shape)), tuple(map(hint, t.strides)), dtype=t.dtype)
        return x.requires_grad_() if t.requires_grad else x
    with torch._C.DisableTorchFunction():
        return torch._fused_sdp_choice(probe(q), probe(k), probe(v), attn_mask=None if mask is None else probe(mask),
                                       is_causal=is_causal, scale=scale)

