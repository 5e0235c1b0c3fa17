"""The prims that convert, view, move or make data: convert, the shape prims, cat, contiguous,
index_select, gather, the factories and the random draws.  One block per prim (see registry.py).
Their torch-level sources are many ops each (view, flatten, transpose, getitem, zeros, ...), so
their decompositions live in decompositions/shape_ops.py and decompositions/math_ops.py, as each
block's note says; and none but convert is elementwise, so kernels never take them (a kernel
converts in code)."""
from __future__ import annotations


import torch

from fjit.core.prims.registry import Kind, Prim, apply, define
from fjit.core.symbolic import is_symbolic, shape_rules_for
from fjit.core.prims.toolkit import full, identity, is_tensor, zeros_like

S, D = Kind.SHAPE, Kind.DATA
_SHAPE_OPS = {"decomposition": "torch-level view and indexing ops reach it (decompositions/shape_ops.py)"}


def _no_aten(name, why="the backend keeps it one torch call"):
    return f"aten.{name} has no row in dynamo/aten.py: {why}"


def _slice_lowering(x, index):
    """Basic indexing by a tuple of slices/ints/None: a view."""
    return x[index]


def _reshape_vjp(b, g, value):
    x = b.args[0]
    return [(x, apply(Prim.RESHAPE, full(g, b.output), tuple(x.shape)))]


def _permute_vjp(b, g, value):
    perm = b.args[1]
    inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
    return [(b.args[0], apply(Prim.PERMUTE, g, inverse))]


def _slice_vjp(b, g, value):
    """g padded with zeros to x's shape (one pass) where the index is step-1 slices, ints, None and
    an Ellipsis (a reshape alone where it takes all of x, as `x[:, None]`); otherwise scattered
    into zeros by a functional setitem."""
    x, index = b.args[:2]
    undo = undo_index(index, tuple(x.shape))
    if undo is not None:
        return [(x, pad_back(full(g, b.output), *undo))]
    z = apply(Prim.EXPAND, zeros_like(g), tuple(x.shape)).contiguous()
    z[index] = g
    return [(x, z)]


def undo_index(index, shape: tuple) -> tuple | None:
    """How to put back the cotangent of x[index] for x of `shape`: (the shape to reshape it to, of
    x's rank, with 1 on each int-indexed dim; F.pad's (left, right) amounts, last dim first).  None
    unless every entry is a slice of step 1 with int or None bounds, an int, None or one Ellipsis."""
    index = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in index) > 1:
        return None
    consumed = sum(i is not None and i is not Ellipsis for i in index)
    if Ellipsis in index:
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (len(shape) - consumed) + index[k + 1:]
    index = tuple(i for i in index if i is not None)
    index = index + (slice(None),) * (len(shape) - len(index))
    if len(index) != len(shape):
        return None
    sizes, pads = [], []
    for i, size in zip(index, shape):
        if type(i) is int:
            if not -size <= i < size:
                return None
            i %= size
            sizes.append(1)
            pads.append((i, size - i - 1))
            continue
        if not (isinstance(i, slice) and i.step in (None, 1) and
                all(v is None or type(v) is int for v in (i.start, i.stop))):
            return None
        start, stop = _slice_bounds(i, size)
        sizes.append(stop - start)
        pads.append((start, size - stop))
    return tuple(sizes), tuple(v for pair in reversed(pads) for v in pair)


def _slice_bounds(i: slice, size) -> tuple:
    """(start, stop) of the step-1 slice `i` of a dim of `size`, clamped as Python's slice.indices
    clamps them (stop never before start); of a symbolic size, as min/max expressions of it, which
    take no guard (slice.indices would read the size's value)."""
    if not is_symbolic(size):
        start, stop, _ = i.indices(size)
        return start, max(stop, start)

    def bound(v, default):
        if v is None:
            return default
        return torch.sym_max(size + v, 0) if v < 0 else torch.sym_min(v, size)
    start = bound(i.start, 0)
    return start, torch.sym_max(bound(i.stop, size), start)


def reshape_copies(x, shape) -> bool:
    """Whether reshaping the TensorVar x to `shape` copies (an expanded or transposed x: a
    grouped-query attention's repeated keys) rather than viewing it."""
    try:
        with shape_rules_for(x, *shape):
            torch.empty_strided(x.shape, x.strides, dtype=x.dtype, device="meta").view(shape)
    except (RuntimeError, ValueError):     # ATen's refusal; torch._refs' (symbolic shape rules)
        return True
    except Exception:       # noqa: BLE001 -- a shape of traced numbers: taken for a view, as before
        return False
    return False


def copies_at_some_size(x, shape) -> bool:
    """Whether reshaping the TensorVar x to `shape` copies at some size its symbols may take,
    decided without a guard (torch's size-oblivious view rule: a view only where it is one at
    every size).  Where a symbol may be 1 (core/symbolic.py), a reshape that copies at 2 is a view
    at 1 with other strides: such a reshape is recorded as a contiguous copy, then a view, so the
    program lays it out alike at every size."""
    from torch._prims_common import infer_size, is_contiguous_or_false
    from torch._subclasses.fake_impls import _compute_stride
    from torch.fx.experimental.symbolic_shapes import guard_or_false, sym_eq
    with shape_rules_for(x, *shape):
        m = torch.empty_strided(x.shape, x.strides, dtype=x.dtype, device="meta")
        if is_contiguous_or_false(m):
            return False
        shape = infer_size(shape, m.numel())
        if len(shape) == m.ndim and guard_or_false(sym_eq(tuple(shape), tuple(m.shape))):
            return False
        return _compute_stride(m.size(), m.stride(), shape, size_oblivious=True) is None


def pad_back(g, shape: tuple, pads: tuple):
    """g (the cotangent of a basic index of x) reshaped to `shape` and zero-padded by `pads`
    (undo_index's): a view where the index took all of x."""
    if tuple(g.shape) != shape:
        g = apply(Prim.RESHAPE, g, shape)
    return torch.nn.functional.pad(g, pads) if any(pads) else g


define("CONVERT", Kind.CAST, value="convert_element_type", aliases=True,
       lowering=lambda x, dtype: x.to(dtype), vjp=identity, aten=("_to_copy.default",),
       notes={"decomposition": "Tensor.to, .float, .half, ..., .type_as reach it (decompositions/math_ops.py)"})
define("RESHAPE", S, aliases=True, vjp=_reshape_vjp,
       aten=("view.default", "_unsafe_view.default", "reshape.default"), notes=_SHAPE_OPS)
define("PERMUTE", S, aliases=True, vjp=_permute_vjp, aten=("permute.default",), notes=_SHAPE_OPS)
define("EXPAND", S, aliases=True, lowering=lambda x, shape: x.expand(shape), vjp=identity,
       aten=("expand.default",), notes=_SHAPE_OPS)
define("SLICE", S, aliases=True, lowering=_slice_lowering, vjp=_slice_vjp,
       aten=("slice.Tensor",), notes=_SHAPE_OPS)
define("SQUEEZE", S, aliases=True, lowering=lambda x, dims: torch.squeeze(x, dims), vjp=_reshape_vjp,
       aten=("squeeze.default", "squeeze.dim", "squeeze.dims"), notes=_SHAPE_OPS)
define("UNSQUEEZE", S, aliases=True, vjp=_reshape_vjp, aten=("unsqueeze.default",), notes=_SHAPE_OPS)


def _cat_vjp(b, g, value):
    tensors, dim = b.args[0], b.args[1] if len(b.args) > 1 else b.kwargs.get("dim", 0)
    dim = dim % g.ndim
    out, start = [], 0
    for t in tensors:
        # torch.cat skips 1-D empty tensors whatever the others' rank (a KV cache's empty start)
        size = t.shape[dim] if t.ndim == g.ndim else 0
        if is_tensor(t) and size:
            index = (slice(None),) * dim + (slice(start, start + size),)
            out.append((t, apply(Prim.SLICE, g, index)))
        start += size
    return out


def _index_select_vjp(b, g, value):
    x, dim, index = b.args[:3]
    z = apply(Prim.EXPAND, zeros_like(g), tuple(x.shape)).contiguous()
    return [(x, torch.index_add(z, dim, value(index), g))]


def _gather_vjp(b, g, value):
    x, dim, index = b.args[:3]
    z = apply(Prim.EXPAND, zeros_like(g), tuple(x.shape)).contiguous()
    return [(x, torch.scatter_add(z, dim, value(index), g))]


define("CAT", D, vjp=_cat_vjp, aten=("cat.default",), notes={
    "decomposition": "torch.cat/stack reach it (decompositions/shape_ops.py)"})
define("CONTIGUOUS", D, aliases=True, lowering=lambda x: x.contiguous(), vjp=identity, c="{0}",
       recompute=True,      # a copy: the backward makes it again rather than have the forward save it
       notes={
    **_SHAPE_OPS, "aten": "AOT graphs write it as aten.clone with a memory format (CLONE's row)"})
define("INDEX_SELECT", D, vjp=_index_select_vjp, notes={
    "decomposition": "integer-tensor indexing and F.embedding reach it (decompositions/shape_ops.py, "
                     "decompositions/nn_ops.py); torch.index_select is not claimed",
    "aten": _no_aten("index_select")})
define("GATHER", D, vjp=_gather_vjp, notes={
    "decomposition": "F.cross_entropy reaches it (decompositions/nn_ops.py); torch.gather and F.nll_loss are "
                     "not claimed",
    "aten": _no_aten("gather")})

_FACTORY = {"decomposition": "torch.full, zeros, ones, *_like and friends reach it (decompositions/shape_ops.py)"}
define("FULL", Kind.FACTORY, nondiff=True, aten=("full.default",), notes=_FACTORY)
define("IOTA", Kind.FACTORY, lowering=torch.arange, nondiff=True, notes={
    "decomposition": "torch.arange reaches it (decompositions/shape_ops.py)", "aten": _no_aten("arange")})
_RANDOM = {"decomposition": "torch.rand/randn and their *_like reach it (decompositions/shape_ops.py)",
           "aten": "AOT graphs' random ops have no row in dynamo/aten.py: they stay torch calls"}
define("UNIFORM", Kind.RANDOM, lowering=torch.rand, nondiff=True, notes=_RANDOM)
define("NORMAL", Kind.RANDOM, lowering=torch.randn, nondiff=True, notes=_RANDOM)
