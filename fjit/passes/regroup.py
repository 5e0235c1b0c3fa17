"""Rewrites that put a trace's prims in the shape a kernel takes, before fusion partitions them.

Each moves work to where a kernel can read it at the index it computes: `sink_relabels` computes an
elementwise prim in the shape a reshape views it in, `absorb_into_cats` hands a concatenation
the elementwise prims only it reads, which a kernel then computes along each piece of the
concatenated dim (a rotary embedding's `cat([-x2, x1])`), instead of running them and the
concatenation as separate ops, and `delay_column_sums` moves a bias gradient's sum to the kernel
reading its value.  Once regions are made, `read_through_views` has a kernel read an input that
views another value from that value.  (The C executor's matmul and copy rewrites are
passes/matmuls.py.)
"""
from __future__ import annotations

from typing import Callable

import torch
from torch._prims_common import make_contiguous_strides_for as contiguous_strides

from fjit.core.ir import BoundSymbol, Tag, TensorVar, Var, flatten_values
from fjit.core.prims import Prim, prim_of
from fjit.core.symbolic import same, shape_rules_for
from fjit.core.trace import Trace

# The most prims a concatenation takes into its kernel (each in the code of the piece reading it).
MAX_ABSORBED = 12


def sink_relabels(flat: list, trace: Trace, supported: Callable[[BoundSymbol], bool]) -> list:
    """An elementwise prim whose only reader is a reshape viewing its result in another shape (a
    residual add's [B, L, D] read as [B*L, D] by the next norm, a kernel's value reshaped for a
    matmul's cotangent) is computed in that shape instead, from views of its operands: the view
    then no longer stands between it and what reads it, so they fuse.  Only where each tensor
    operand has the result's shape and views as the new one, and a prim a kernel takes reads the
    view (else the move only adds views); repeated up a chain of such prims."""
    outputs = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    changed = True
    while changed:
        changed = False
        uses = _uses(flat)
        made = {b.outputs()[0].name: i for i, b in enumerate(flat) if len(b.outputs()) == 1}
        fused_reads = {v.name for b in flat if supported(b) for v in b.inputs()}
        for i, r in enumerate(flat):
            if prim_of(r) is not Prim.RESHAPE:    # a torch-level view of one reshape prim too
                r = r.subsymbols[0] if len(r.subsymbols) == 1 else r
            if prim_of(r) is not Prim.RESHAPE or not isinstance(r.args[0], TensorVar):
                continue
            y, z = r.args[0], r.outputs()[0]
            p = made.get(y.name)
            e = flat[p] if p is not None else None
            if e is None or not e.sym.has(Tag.ELEMENTWISE) or e.kwargs or len(uses.get(y.name, ())) != 1 or \
                    z.name not in fused_reads or \
                    y.name in outputs or tuple(z.strides) != tuple(contiguous_strides(tuple(z.shape))):
                continue
            operands = [a for a in e.inputs() if isinstance(a, TensorVar)]
            views = [_view_as(a, z) for a in operands]
            if any(a.shape != y.shape or v is None for a, v in zip(operands, views)):
                continue
            relabeled = {a.name: BoundSymbol(r.sym, (a, tuple(z.shape)), {}, v)
                         for a, v in zip(operands, views)}
            args = tuple(relabeled[a.name].output if isinstance(a, TensorVar) else a for a in e.args)
            flat = flat[:p] + list(relabeled.values()) + [e.replace(args=args, output=z)] + \
                flat[p + 1:i] + flat[i + 1:]
            changed = True
            break
    return flat


def delay_column_sums(flat: list, supported: Callable[[BoundSymbol], bool]) -> list:
    """A sum over the leading dims of a value no kernel here computes (a bias gradient: the sum
    of a cotangent a matmul returned) is moved to just after the next prim reading that value, so
    it joins the kernel that reads it anyway (a layer norm's or an activation's backward) as a
    column sum instead of a pass of its own: a region opened by a column sum takes no row
    reductions after it.  Never past a prim that reads the sum, changes the grad or autocast mode, or
    has an effect (an impure op)."""
    flat, moved = list(flat), set()
    i = 0
    while i < len(flat):
        b = flat[i]
        x = b.args[0] if prim_of(b) is Prim.SUM and b.args and id(b) not in moved else None
        dims = tuple(b.args[1]) if x is not None and len(b.args) > 1 and isinstance(b.args[1], (tuple, list)) else ()
        if not (isinstance(x, TensorVar) and dims and dims == tuple(range(len(dims))) and len(dims) < x.ndim
                and supported(b)):
            i += 1
            continue
        out = {v.name for v in b.outputs()}
        j = i + 1
        while j < len(flat) and not (flat[j].sym.has(Tag.MODE) or flat[j].sym.has(Tag.IMPURE)) and \
                not {v.name for v in flat[j].inputs()} & out:
            if any(v.name == x.name for v in flat[j].inputs()):
                if supported(flat[j]):
                    flat[i:j + 1] = flat[i + 1:j + 1] + [b]
                    moved.add(id(b))
                break
            j += 1
        i += 1
    return flat


def broadcasts_to(shape: tuple, domain: tuple) -> bool:
    """Whether a value of `shape` broadcasts to `domain` (torch's rule, from the last dim)."""
    if len(shape) > len(domain):
        return False
    return all(s == d or s == 1 for s, d in zip(reversed(shape), reversed(domain)))


def _view_as(a: TensorVar, z: TensorVar) -> TensorVar | None:
    """a viewed in z's shape (a reshape that moves no data), or None where that would copy."""
    try:
        strides = torch.empty_strided(a.shape, a.strides, dtype=a.dtype, device="meta").view(z.shape).stride()
    except RuntimeError:
        return None
    return TensorVar(f"{a.name}_as_{z.name}", tuple(z.shape), a.dtype, a.device, tuple(strides),
                     a.requires_grad)


def _uses(flat: list) -> dict:
    uses: dict = {}
    for b in flat:
        for v in b.inputs():
            uses.setdefault(v.name, []).append(b)
    return uses


def _elementwise(b: BoundSymbol | None, supported) -> bool:
    return b is not None and b.sym.has(Tag.ELEMENTWISE) and not b.kwargs and len(b.outputs()) == 1 \
        and isinstance(b.outputs()[0], TensorVar) and supported(b)


def _last_dim_slice(b: BoundSymbol | None) -> tuple | None:
    """(x, start) where `b` views x narrowed along its last dim from `start`, step 1, else None."""
    if b is not None and prim_of(b) is not Prim.SLICE and len(b.subsymbols) == 1:
        b = b.subsymbols[0]
    if b is None or prim_of(b) is not Prim.SLICE or not isinstance(b.args[0], TensorVar):
        return None
    x, y = b.args[0], b.outputs()[0]
    if x.ndim == 0 or tuple(x.shape[:-1]) != tuple(y.shape[:-1]) or x.strides[-1] == 0:
        return None
    try:
        view = torch.empty_strided(x.shape, x.strides, dtype=x.dtype, device="meta")[b.args[1]]
    except (RuntimeError, IndexError, TypeError):
        return None
    if tuple(view.shape) != tuple(y.shape) or tuple(view.stride()) != tuple(x.strides) or \
            view.storage_offset() % x.strides[-1]:
        return None
    return x, view.storage_offset() // x.strides[-1]


def _narrowed(a: TensorVar, start: int, width: int, like: BoundSymbol, name: str) -> tuple:
    """(bsyms, value): `a` (broadcast along the last dim or not) narrowed to [start, start+width)
    along its last dim, as a SLICE prim of `like`'s symbol; `a` itself where it broadcasts."""
    if a.ndim == 0 or a.shape[-1] == 1:
        return [], a
    index = (Ellipsis, slice(start, start + width))
    view = torch.empty_strided(a.shape, a.strides, dtype=a.dtype, device="meta")[index]
    out = TensorVar(name, tuple(view.shape), a.dtype, a.device, tuple(view.stride()), a.requires_grad)
    sym = like.sym if prim_of(like) is Prim.SLICE else like.subsymbols[0].sym
    return [BoundSymbol(sym, (a, index), {}, out)], out


def absorb_into_cats(flat: list, trace: Trace, supported: Callable[[BoundSymbol], bool]) -> tuple:
    """(flat, absorbed): each concatenation a kernel takes (`supported`) with the elementwise prims
    only it reads, directly or through others (`absorbed`: id(cat) -> those prims, placed right
    before it), so the kernel computes them at each piece's index and they and the concatenated
    value are never stored apart.  A piece that is a last-dim slice of an elementwise value only
    slices read (a cotangent's halves, `cat([g2, -g1])`) is computed from slices of that value's
    operands instead, where every one of those slices is the concatenation's."""
    outputs = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    absorbed: dict = {}
    k = 0
    while k < len(flat):
        c = flat[k]
        k += 1
        if prim_of(c) is not Prim.CAT or not supported(c):
            continue
        found = _cat_chain(flat, c, outputs, supported)
        if found is None:
            continue
        privates, views, dropped, renamed = found
        dropped |= {id(p) for p in privates}
        at = flat.index(c)
        before = [b for b in flat[:at] if id(b) not in dropped]
        c = c.replace(args=_substituted(c.args, renamed))
        flat = before + views + privates + [c] + [b for b in flat[at + 1:] if id(b) not in dropped]
        absorbed[id(c)] = privates
        k = len(before) + len(views) + len(privates) + 1
    return flat, absorbed


def _cat_chain(flat: list, c: BoundSymbol, outputs: set, supported) -> tuple | None:
    """(privates in trace order, new views they read, ids of the bsyms they replace, the vars
    they make by name) for the concatenation `c`, or None when it has none."""
    made = {v.name: b for b in flat for v in b.outputs()}
    position = {id(b): j for j, b in enumerate(flat)}
    # a prim made under another grad or autocast mode than the cat's stays where it is
    since = max([j for j, b in enumerate(flat[:position[id(c)]]) if b.sym.has(Tag.MODE)], default=-1)
    uses = _uses(flat)
    mine: set = set()        # names read only inside c's chain
    privates, views, dropped, pushed = [], [], set(), []
    work = [v for v in c.args[0] if isinstance(v, TensorVar)]
    while work:
        v = work.pop()
        p = made.get(v.name)
        if p is None or v.name in outputs or len(uses.get(v.name, ())) != 1 or position[id(p)] < since:
            continue
        if len(privates) + len(pushed) == MAX_ABSORBED:
            break
        if _elementwise(p, supported) and tuple(p.outputs()[0].shape) == tuple(v.shape):
            privates.append((position[id(p)], p))
            mine.add(v.name)
            work += [u for u in p.inputs() if isinstance(u, TensorVar)]
            continue
        sliced = _last_dim_slice(p)
        e = made.get(sliced[0].name) if sliced else None
        if e is None or not _elementwise(e, supported) or sliced[0].name in outputs or position[id(e)] < since or \
                tuple(e.outputs()[0].shape) != tuple(sliced[0].shape):
            continue
        pushed.append((p, e, v))
        mine.add(v.name)
    for p, e, v in pushed:
        readers = uses[e.outputs()[0].name]
        if not all(_last_dim_slice(r) and r.outputs()[0].name in mine for r in readers):
            continue     # something else reads the whole value: computing it twice would cost
        start = _last_dim_slice(p)[1]
        args, out = [], TensorVar(v.name, tuple(v.shape), v.dtype, v.device,
                                  tuple(contiguous_strides(tuple(v.shape))), v.requires_grad)
        for j, a in enumerate(e.args):
            if isinstance(a, TensorVar):
                made_view, a = _narrowed(a, start, v.shape[-1], p, f"{v.name}_in{j}")
                views += made_view
            args.append(a)
        privates.append((position[id(p)], e.replace(args=tuple(args), output=out)))
        dropped |= {id(p), id(e)}
    if not privates:
        return None
    # a pushed value's first readers (in c's chain) get the contiguous var of the same name
    renamed = {p.outputs()[0].name: p.outputs()[0] for _, p in privates}
    chain = [p.replace(args=_substituted(p.args, renamed)) for _, p in sorted(privates, key=lambda x: x[0])]
    return chain, views, dropped, renamed


def _substituted(args, renamed: dict):
    if isinstance(args, (tuple, list)):
        return type(args)(_substituted(a, renamed) for a in args)
    if isinstance(args, TensorVar) and args.name in renamed:
        return renamed[args.name]
    return args


def read_through_views(items: list, kernels: set) -> None:
    """`items`: a partition's BoundSymbols and regions, `kernels` the ids of those made kernels.
    A kernel input that a chain of views makes from another value is read from that value at
    the view's strides and offset (`Region.bases`): the views then cost no call where nothing else
    reads them (a program runs ~100 of them a training step of a small transformer)."""
    chains: dict = {}         # name -> (the value its chain of views starts from, the views)
    for item in items:
        if not isinstance(item, BoundSymbol) or not (item.sym.has(Tag.SHAPE) or item.sym.has(Tag.VIEW)) or \
                item.sym.has(Tag.RANDOM) or item.sym.has(Tag.IMPURE) or len(item.outputs()) != 1:
            continue
        x, out = item.args[0] if item.args else None, item.outputs()[0]
        if isinstance(x, TensorVar) and isinstance(out, TensorVar) and out.dtype == x.dtype and \
                [v.name for v in item.inputs() if isinstance(v, TensorVar)] == [x.name]:
            base, views = chains.get(x.name, (x, []))
            chains[out.name] = (base, views + [item])
    for region in (i for i in items if id(i) in kernels):      # the regions made kernels
        for k, v in enumerate(region.inputs):
            if isinstance(v, TensorVar) and v.name in chains:
                offset = _view_offset(v, *chains[v.name])
                if offset is not None:
                    region.bases[k] = (chains[v.name][0], offset)


def _view_offset(v: TensorVar, base: TensorVar, views: list) -> int | None:
    """The element offset of `v` in `base`'s storage, where its views give v's shape and strides
    (in a symbolic program, an expression of the symbols: the views replay under its shape rules,
    and shapes compare without a guard)."""
    try:
        with shape_rules_for(base):
            m = root = torch.empty_strided(base.shape, base.strides, dtype=base.dtype, device="meta")
            for b in views:
                m = b.sym.fn(m, *b.args[1:], **b.kwargs)
    except Exception:       # noqa: BLE001 -- a view meta tensors cannot replay: read as it is
        return None
    # (a reshape that copies is no view: its elements are not where its strides say in base)
    if not isinstance(m, torch.Tensor) or m._base is not root or not same(tuple(m.shape), tuple(v.shape)) \
            or not same(tuple(m.stride()), tuple(v.strides)):
        return None
    return m.storage_offset()
