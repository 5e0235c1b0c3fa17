"""Torch-level views, indexing, joins and splits, and factories as decompositions into prims."""
from __future__ import annotations

import math

import torch

from fjit.frontend.proxies import NumberProxy, TensorProxy
from fjit.core.prims import Prim, apply, torch_callables
from fjit.decompositions.math_ops import register


def _sizes(size) -> tuple:
    """`f(2, 3)` and `f((2, 3))` both mean shape (2, 3)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        return tuple(size[0])
    return tuple(size)


# ----------------------------------------------------------------------------------------------
# Views
# ----------------------------------------------------------------------------------------------

@register(*torch_callables("reshape"), torch.Tensor.view)
def _reshape(x, *shape):
    shape = _sizes(shape)
    if any(isinstance(s, torch.dtype) for s in shape):
        raise NotImplementedError   # view(dtype) reinterprets bits
    return apply(Prim.RESHAPE, x, shape)


@register(torch.Tensor.view_as, torch.Tensor.reshape_as)
def _reshape_as(x, other):
    return apply(Prim.RESHAPE, x, tuple(other.shape))


@register(*torch_callables("permute"))
def _permute(x, *dims):
    return apply(Prim.PERMUTE, x, tuple(d % x.ndim for d in _sizes(dims)))


def _swap(x, d0, d1):
    dims = list(range(x.ndim))
    if x.ndim:
        d0, d1 = d0 % x.ndim, d1 % x.ndim
        dims[d0], dims[d1] = dims[d1], dims[d0]
    return apply(Prim.PERMUTE, x, tuple(dims))


register(*torch_callables("transpose"), *torch_callables("swapaxes"), *torch_callables("swapdims"))(_swap)


@register(*torch_callables("t"))
def _t(x):
    return apply(Prim.PERMUTE, x, tuple(reversed(range(x.ndim))))


register(torch.Tensor.T.__get__)(_t)
register(torch.Tensor.mT.__get__)(lambda x: _swap(x, -2, -1))


@register(torch.Tensor.expand, *torch_callables("broadcast_to"))
def _expand(x, *sizes):
    return apply(Prim.EXPAND, x, _sizes(sizes))


@register(torch.Tensor.expand_as)
def _expand_as(x, other):
    return apply(Prim.EXPAND, x, tuple(other.shape))


@register(*torch_callables("squeeze"))
def _squeeze(x, dim=None):
    dims = tuple(range(x.ndim)) if dim is None else ((dim,) if isinstance(dim, int) else tuple(dim))
    return apply(Prim.SQUEEZE, x, dims)


@register(*torch_callables("unsqueeze"))
def _unsqueeze(x, dim):
    return apply(Prim.UNSQUEEZE, x, dim)


@register(*torch_callables("flatten"))
def _flatten(x, start_dim=0, end_dim=-1):
    if x.ndim == 0:
        return apply(Prim.RESHAPE, x, (1,))
    s, e = start_dim % x.ndim, end_dim % x.ndim
    shape = x.shape[:s] + (math.prod(x.shape[s:e + 1]),) + x.shape[e + 1:]
    return apply(Prim.RESHAPE, x, tuple(shape))


@register(*torch_callables("unflatten"))
def _unflatten(x, dim, sizes):
    d = dim % x.ndim
    sizes = list(sizes)
    if -1 in sizes:
        known = math.prod(s for s in sizes if s != -1)
        sizes[sizes.index(-1)] = x.shape[d] // known if known else 0
    return apply(Prim.RESHAPE, x, tuple(x.shape[:d]) + tuple(sizes) + tuple(x.shape[d + 1:]))


@register(*torch_callables("contiguous"))
def _contiguous(x, memory_format=torch.contiguous_format):
    if memory_format is not torch.contiguous_format:
        raise NotImplementedError
    return apply(Prim.CONTIGUOUS, x)


# ----------------------------------------------------------------------------------------------
# Indexing
# ----------------------------------------------------------------------------------------------

def _is_basic(i) -> bool:
    return i is None or i is Ellipsis or type(i) in (int, bool, slice) and not isinstance(i, NumberProxy)


@register(torch.Tensor.__getitem__)
def _getitem(x, index):
    index = index if isinstance(index, tuple) else (index,)
    if any(isinstance(v, (TensorProxy, NumberProxy)) for i in index if type(i) is slice
           for v in (i.start, i.stop, i.step)):
        raise NotImplementedError
    if all(_is_basic(i) and type(i) is not bool for i in index):
        return apply(Prim.SLICE, x, index)
    advanced = [k for k, i in enumerate(index) if not _is_basic(i) or type(i) is bool]
    if len(advanced) == 1 and _is_int_list(index[advanced[0]]):
        return _rows_by_int_list(x, index, advanced[0])
    if len(advanced) == 1 and _is_int_tensor(index[advanced[0]]):
        return _rows_by_index_tensor(x, index, advanced[0])
    raise NotImplementedError   # other advanced indexing: one torch call


def _wrap_negative(i, n):
    """Indices count from the end when negative, as eager indexing does (index_select does not);
    one still out of range fails in index_select as it does in eager."""
    return apply(Prim.WHERE, apply(Prim.LT, i, 0), apply(Prim.ADD, i, n), i)


def _is_int_tensor(i) -> bool:
    """An integer index tensor (a 0-d one of any integer dtype; uint8 of more dims is a mask)."""
    return isinstance(i, TensorProxy) and (i.dtype in (torch.int64, torch.int32) or i.ndim == 0 and i.dtype in (
        torch.int16, torch.int8, torch.uint8))


def _is_int_list(i) -> bool:
    return type(i) is list and all(type(v) is int for v in i)


def _one_advanced(x, index, k):
    """For an index whose k-th entry is the only advanced one (torch applies ints as selects
    first): x with the basic indices applied and a full slice at k, the indexed dim in x, and
    its dim in that result."""
    whole = apply(Prim.SLICE, x, index[:k] + (slice(None),) + index[k + 1:])
    ellipsis = x.ndim - sum(1 for i in index if i is not None and i is not Ellipsis)
    x_dim = out_dim = 0
    for i in index[:k]:
        x_dim += ellipsis if i is Ellipsis else (i is not None)
        out_dim += ellipsis if i is Ellipsis else (i is None or type(i) is slice)
    return whole, x_dim, out_dim


def _rows_by_int_list(x, index, k):
    """x[..., [i, j, ...], ...] with one constant list of ints: each run of consecutive rows is a
    slice along the list's dim, joined by a cat (Falcon's fused_qkv[..., [-2], :]).  A result of
    one run is cloned: eager's advanced indexing never returns a view."""
    whole, x_dim, out_dim = _one_advanced(x, index, k)
    n = x.shape[x_dim]
    rows = [r + n if r < 0 else r for r in index[k]]
    if not rows or any(not 0 <= r < n for r in rows):
        raise NotImplementedError   # eager's own IndexError, or an empty result
    runs: list[list[int]] = []
    for r in rows:
        if runs and runs[-1][1] == r:
            runs[-1][1] += 1
        else:
            runs.append([r, r + 1])
    if len(runs) > 8:
        raise NotImplementedError   # one gather-like torch call beats many slices
    parts = [_along(whole, out_dim, a, b) for a, b in runs]
    return apply(Prim.CLONE, parts[0]) if len(parts) == 1 else apply(Prim.CAT, parts, out_dim)


def _rows_by_index_tensor(x, index, k):
    """x[..., i, ...] with one integer tensor i: the rows along i's dim picked by an index_select
    of i flattened, laid out in i's shape (a 0-d i drops the dim)."""
    whole, x_dim, out_dim = _one_advanced(x, index, k)
    i = index[k]
    rows = apply(Prim.INDEX_SELECT, whole, out_dim,
                 _wrap_negative(apply(Prim.RESHAPE, i, (-1,)) if i.ndim != 1 else i, x.shape[x_dim]))
    shape = tuple(whole.shape[:out_dim]) + tuple(i.shape) + tuple(whole.shape[out_dim + 1:])
    return rows if i.ndim == 1 else apply(Prim.RESHAPE, rows, shape)


def _along(x, d: int, start: int, stop: int):
    """x[start:stop] along dim d (non-negative): a view."""
    return apply(Prim.SLICE, x, (slice(None),) * d + (slice(start, stop),))


@register(*torch_callables("narrow"))
def _narrow(x, dim, start, length):
    d = dim % x.ndim
    start = start % x.shape[d] if start < 0 else start
    return _along(x, d, start, start + length)


@register(*torch_callables("select"))
def _select(x, dim, index):
    return apply(Prim.SLICE, x, (slice(None),) * (dim % x.ndim) + (index,))


# ----------------------------------------------------------------------------------------------
# Joins and splits
# ----------------------------------------------------------------------------------------------

@register(torch.cat, torch.concat, torch.concatenate)
def _cat(tensors, dim=0):
    return apply(Prim.CAT, list(tensors), dim)


@register(torch.stack)
def _stack(tensors, dim=0):
    if not tensors:
        raise NotImplementedError
    d = dim % (tensors[0].ndim + 1)
    return apply(Prim.CAT, [apply(Prim.UNSQUEEZE, t, d) for t in tensors], d)


def _slices(x, dim, sizes):
    d = dim % x.ndim
    out, start = [], 0
    for n in sizes:
        out.append(_along(x, d, start, start + n))
        start += n
    return tuple(out)


@register(*torch_callables("split"))
def _split(x, split_size_or_sections, dim=0):
    n = x.shape[dim % x.ndim]
    if isinstance(split_size_or_sections, int):
        s = split_size_or_sections
        sizes = [min(s, n - i) for i in range(0, n, s)] if n else [0]
    else:
        sizes = list(split_size_or_sections)
    return _slices(x, dim, sizes)


@register(*torch_callables("chunk"))
def _chunk(x, chunks, dim=0):
    n = x.shape[dim % x.ndim]
    size = -(-n // chunks) if n else 0
    sizes = [min(size, n - i) for i in range(0, n, size)] if size else [0] * (0 if n else 1)
    return _slices(x, dim, sizes)


@register(*torch_callables("roll"))
def _roll(x, shifts, dims=None):
    """A cat of the two slices a shift moves, per dim (Swin's shifted windows): prims the kernels
    and the joint backward handle, where a torch call would keep an autograd graph of its own."""
    shifts = (shifts,) if type(shifts) is int else tuple(shifts)
    dims = (dims,) if type(dims) is int else tuple(dims) if dims is not None else ()
    if not dims or len(shifts) != len(dims) or any(type(v) is not int for v in shifts + dims):
        raise NotImplementedError   # a roll of the flattened tensor: one torch call
    out = x
    for shift, dim in zip(shifts, dims):
        d = dim % x.ndim
        n = x.shape[d]
        k = shift % n if n else 0
        if k:
            out = apply(Prim.CAT, [_along(out, d, n - k, n), _along(out, d, 0, n - k)], d)
    return out if out is not x else apply(Prim.CLONE, x)


@register(torch.nn.functional.pad, torch.constant_pad_nd)
def _pad(x, pad, mode="constant", value=None):
    """Constant padding as a cat with filled blocks (a negative pad is a slice); zero padding is a
    copy, as eager's.  Other modes (reflect, replicate, circular) stay one torch call."""
    pad = tuple(pad)
    if mode != "constant" or len(pad) % 2 or len(pad) // 2 > x.ndim \
            or any(type(p) is not int for p in pad) or isinstance(value, (NumberProxy, TensorProxy)):
        raise NotImplementedError
    out = x
    for i in range(len(pad) // 2):
        d, lo, hi = x.ndim - 1 - i, pad[2 * i], pad[2 * i + 1]
        n = out.shape[d]
        if lo < 0 or hi < 0:
            start, stop = max(-lo, 0), n - max(-hi, 0)
            if stop < start:
                raise NotImplementedError   # eager's error
            out = _along(out, d, start, stop)
        def filled(size):
            shape = tuple(out.shape[:d]) + (size,) + tuple(out.shape[d + 1:])
            return [apply(Prim.FULL, shape, 0 if value is None else value, dtype=x.dtype,
                          device=x.device)] if size > 0 else []
        parts = filled(lo) + [out] + filled(hi)
        if len(parts) > 1:
            out = apply(Prim.CAT, parts, d)
    return out if any(p > 0 for p in pad) else apply(Prim.CLONE, out)


@register(*torch_callables("unbind"))
def _unbind(x, dim=0):
    d = dim % x.ndim
    return tuple(apply(Prim.SLICE, x, (slice(None),) * d + (i,)) for i in range(x.shape[d]))


# ----------------------------------------------------------------------------------------------
# Factories
# ----------------------------------------------------------------------------------------------

def _factory_kwargs(kwargs) -> dict:
    out = {"dtype": kwargs.pop("dtype", None), "device": kwargs.pop("device", None)}
    if kwargs.pop("requires_grad", False) or kwargs.pop("layout", torch.strided) is not torch.strided \
            or kwargs.pop("pin_memory", False) or kwargs:
        raise NotImplementedError
    return {k: v for k, v in out.items() if v is not None}


def _filled(value):
    def decomposition(*size, **kwargs):
        return apply(Prim.FULL, _sizes(size), value, **_factory_kwargs(kwargs))
    return decomposition


register(torch.zeros)(_filled(0))
register(torch.ones)(_filled(1))


@register(torch.full)
def _full(size, fill_value, **kwargs):
    return apply(Prim.FULL, tuple(size), fill_value, **_factory_kwargs(kwargs))


def _filled_like(value):
    def decomposition(x, *args, **kwargs):
        kwargs.pop("memory_format", None)
        fill = args[0] if value is None else value
        kw = _factory_kwargs(kwargs)
        kw.setdefault("dtype", x.dtype)
        kw.setdefault("device", x.device)
        return apply(Prim.FULL, tuple(x.shape), fill, **kw)
    return decomposition


register(torch.zeros_like)(_filled_like(0))
register(torch.ones_like)(_filled_like(1))
register(torch.full_like)(_filled_like(None))


def _filled_new(value):
    """x.new_zeros(size), x.new_ones(size), x.new_full(size, fill): x's dtype and device unless
    given; x's values are not read, so a mask built from one folds to a constant."""
    def decomposition(x, *args, **kwargs):
        size, fill = (args[0], args[1]) if value is None else (_sizes(args), value)
        kw = _factory_kwargs(kwargs)
        kw.setdefault("dtype", x.dtype)
        kw.setdefault("device", x.device)
        return apply(Prim.FULL, tuple(size), fill, **kw)
    return decomposition


register(torch.Tensor.new_zeros)(_filled_new(0))
register(torch.Tensor.new_ones)(_filled_new(1))
register(torch.Tensor.new_full)(_filled_new(None))


@register(torch.arange)
def _arange(*args, **kwargs):
    return apply(Prim.IOTA, *args, **_factory_kwargs(kwargs))


def _random(p):
    def decomposition(*size, generator=None, **kwargs):
        if generator is not None:
            raise NotImplementedError
        return apply(p, _sizes(size), **_factory_kwargs(kwargs))
    return decomposition


def _random_like(p):
    def decomposition(x, **kwargs):
        kwargs.pop("memory_format", None)
        kw = _factory_kwargs(kwargs)
        kw.setdefault("dtype", x.dtype)
        kw.setdefault("device", x.device)
        return apply(p, tuple(x.shape), **kw)
    return decomposition


register(torch.rand)(_random(Prim.UNIFORM))
register(torch.randn)(_random(Prim.NORMAL))
register(torch.rand_like)(_random_like(Prim.UNIFORM))
register(torch.randn_like)(_random_like(Prim.NORMAL))
