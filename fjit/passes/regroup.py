"""Rewrites that put a trace's prims in the shape a kernel takes, before fusion partitions them.

`split_ops` makes the ops the partitioner sees: each torch-level op as its prims where a kernel
takes them.  For the C executor it also turns work BLAS or ATen runs slowly into prims a C kernel
computes: matmuls one of whose dims is a handful (`unroll_thin_matmuls`), and copies ATen makes
slowly through strides (`copies_in_kernels`).

The others move work to where a kernel can read it at the index it computes: `sink_relabels`
computes an elementwise prim in the shape a reshape views it in, `absorb_into_cats` hands a
concatenation the elementwise prims only it reads, which a kernel then computes along each piece
of the concatenated dim (a rotary embedding's `cat([-x2, x1])`), instead of running them and the
concatenation as separate ops, and `delay_column_sums` moves a bias gradient's sum to the kernel
reading its value.  Once regions are made, `read_through_views` has a kernel read an input that
views another value from that value.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch._prims_common import make_contiguous_strides_for as contiguous_strides

from fjit.core.ir import BoundSymbol, Tag, TensorVar, Var, flatten_values
from fjit.core.prims import Prim, prim_of
from fjit.core.prims.layout import reshape_copies
from fjit.core.symbolic import hint, is_symbolic, same, shape_rules_for
from fjit.core.trace import Trace

# The most prims a concatenation takes into its kernel (each in the code of the piece reading it).
MAX_ABSORBED = 12
# The longest inner dim a matmul is unrolled over (unroll_thin_matmuls), and the fewest elements of
# its result (below it a BLAS call costs a few microseconds either way: the trace stays readable).
THIN_MATMUL_K = 8
THIN_MATMUL_MIN_NUMEL = 4096
# The most bytes of w's K rows (K x N) an unrolled kernel reads again for every output row: past
# an L1's share, its K loads an output element run from L2 and MKL's register-blocked kernel is
# faster (float32, 2-core Xeon: K=8 N=512 0.80-0.92x MKL's time, K=8 N=2048 1.47x, K=4 N=4096
# 1.17-1.38x; AlexNet's classifier weight gradients, [4096, 8] @ [8, 9216], made its step 1.08x
# eager's).
THIN_MATMUL_PANEL_BYTES = 16384
# The fewest elements a copy has to be made a kernel's (copies_in_kernels).
COPY_MIN_NUMEL = 1024


def split_ops(bsyms: list, supported: Callable[[BoundSymbol], bool], whole_ops: frozenset,
              split_partial_ops: bool, cpu_rewrites: bool) -> list:
    """The ops a partitioner sees: each torch-level op as its prims where they are all supported
    (or with `split_partial_ops` always, but never the `whole_ops`), with thin matmuls unrolled or
    swapped (unroll_thin_matmuls) and copies made kernels' (copies_in_kernels) where
    `cpu_rewrites`."""
    flat = []
    dense: dict = {}       # copies_in_kernels' copies so far: a value two ops read is copied once
    for b in bsyms:
        if cpu_rewrites and b.sym.qualname not in whole_ops:
            prims = b.subsymbols or [b]
            rewritten = copies_in_kernels(unroll_thin_matmuls(prims, supported), supported, dense)
            if rewritten is not prims:
                flat.extend(rewritten)
                continue
        split = b.subsymbols and b.sym.qualname not in whole_ops and (
            split_partial_ops or all(map(supported, b.subsymbols)))
        flat.extend(b.subsymbols if split else (b,))
    return flat


def unroll_thin_matmuls(flat: list, supported: Callable[[BoundSymbol], bool]) -> list:
    """A float matmul `a @ w` of a 2-D `w` (or one with a's batch dims) over an inner dim of at most
    THIN_MATMUL_K (MLP-Mixer's token MLP over 4 tokens, its backward's cotangent times that weight,
    attention over windows of 4) as the sum of its K broadcast products,
    `a[..., k:k+1] * w[..., k:k+1, :]` added in order of k: elementwise prims a kernel
    computes per output element, reading a and w where they lie, and fuses with the bias add and
    activation around it.  A BLAS call on such a product runs at a fraction of memory speed (MKL:
    0.18 ms for [4096, 4] @ [4, 256], 0.07 ms as one kernel), while w's K rows stay in L1
    (THIN_MATMUL_PANEL_BYTES).  Rounding: each product is rounded
    and the sum runs in k order, where BLAS may fuse multiply-adds; results agree to rounding.
    Returns `flat` itself where it unrolls nothing."""
    out, changed = [], False
    for b in flat:
        unrolled = _unrolled(b) if prim_of(b) is Prim.MATMUL else None
        if unrolled is not None and all(map(supported, unrolled[1])):
            out += unrolled[0] + unrolled[1]
        elif (swapped := _swapped(b) if prim_of(b) is Prim.MATMUL else None) is not None:
            out += swapped
        else:
            out.append(b)
            continue
        changed = True
    return out if changed else flat


def _swapped(m: BoundSymbol) -> list | None:
    """`a @ b` of a transposed 2-D `a` [M, K] and at most THIN_MATMUL_K columns (a weight's
    gradient `g.T @ x` where x has a few features: MLP-Mixer's token MLP) as `(b.T @ a.T).T`,
    copied to the result's layout: MKL takes 5x as long on the first form ([256, 4096] @ [4096, 4]:
    1.0 ms against 0.18 ms)."""
    a, b = m.args[:2] if len(m.args) >= 2 and not m.kwargs else (None, None)
    z = m.outputs()[0]
    if any(isinstance(v, TensorVar) and is_symbolic(v.shape) for v in (a, b, z)):
        return None      # a choice per size, not made for a symbolic program
    if not (isinstance(a, TensorVar) and isinstance(b, TensorVar) and a.ndim == b.ndim == 2
            and b.shape[1] <= THIN_MATMUL_K and a.shape[0] > 4 * b.shape[1] and a.strides[0] == 1
            and a.strides[1] >= a.shape[0] and a.dtype == b.dtype == z.dtype and len(m.outputs()) == 1
            and tuple(z.strides) == tuple(contiguous_strides(tuple(z.shape)))):
        return None
    permute = Prim.PERMUTE.block.symbol

    def var(suffix, shape, strides, grad):
        return TensorVar(f"{z.name}_{suffix}", tuple(shape), z.dtype, z.device, tuple(strides), grad)
    bt = var("bt", b.shape[::-1], b.strides[::-1], b.requires_grad)
    at = var("at", a.shape[::-1], a.strides[::-1], a.requires_grad)
    y = var("t", z.shape[::-1], contiguous_strides(tuple(z.shape[::-1])), z.requires_grad)
    yt = var("tt", z.shape, y.strides[::-1], z.requires_grad)
    return [BoundSymbol(permute, (b, (1, 0)), {}, bt), BoundSymbol(permute, (a, (1, 0)), {}, at),
            BoundSymbol(m.sym, (bt, at), {}, y), BoundSymbol(permute, (y, (1, 0)), {}, yt),
            BoundSymbol(Prim.CONTIGUOUS.block.symbol, (yt,), {}, z)]


def _unrolled(m: BoundSymbol) -> tuple | None:
    """(reads: w made dense and the slices of a and w; products and sums) computing matmul `m` as
    unroll_thin_matmuls says, or None."""
    a, w = m.args[:2] if len(m.args) >= 2 and not m.kwargs else (None, None)
    z = m.outputs()[0]
    # In a symbolic program K must be a static size (the unrolled form has K products); the
    # other sizes decide only whether the form is faster, so they are read at the compiling
    # call's values without a guard (`hint`), and shapes compare as expressions (`same`): the
    # unrolled form is right at every size.
    if not (isinstance(a, TensorVar) and isinstance(w, TensorVar) and a.ndim >= 2
            and (w.ndim == 2 or w.ndim == a.ndim and same(tuple(w.shape[:-2]), tuple(a.shape[:-2])))
            and not is_symbolic(w.shape[-2]) and 0 < w.shape[-2] <= THIN_MATMUL_K
            and same(a.shape[-1], w.shape[-2]) and z.ndim == a.ndim
            and math.prod(map(hint, z.shape)) >= THIN_MATMUL_MIN_NUMEL
            and w.shape[-2] * hint(w.shape[-1]) * w.dtype.itemsize <= THIN_MATMUL_PANEL_BYTES
            and a.dtype == w.dtype == z.dtype and a.dtype in (torch.float32, torch.float64)
            and a.device == w.device == z.device and len(m.outputs()) == 1
            and same(tuple(z.strides), tuple(contiguous_strides(tuple(z.shape))))):
        return None
    with shape_rules_for(a, w, z):
        return _unrolled_products(a, w, z)


def _unrolled_products(a: TensorVar, w: TensorVar, z: TensorVar) -> tuple:
    """_unrolled's (reads, products and sums) of `z = a @ w`, once the form is chosen."""
    reads, sums, total = [], [], None
    if not same(w.strides[-1], 1):     # a transposed weight: rows of w read along the output's rows
        dense = TensorVar(f"{z.name}_w", tuple(w.shape), w.dtype, w.device,
                          tuple(contiguous_strides(tuple(w.shape))), w.requires_grad)
        reads.append(BoundSymbol(Prim.CONTIGUOUS.block.symbol, (w,), {}, dense))
        w = dense
    for k in range(w.shape[-2]):
        pair = []
        for x, index in ((a, (Ellipsis, slice(k, k + 1))), (w, (Ellipsis, slice(k, k + 1), slice(None)))):
            view = torch.empty_strided(x.shape, x.strides, dtype=x.dtype, device="meta")[index]
            v = TensorVar(f"{z.name}_{'aw'[x is w]}{k}", tuple(view.shape), x.dtype, x.device,
                          tuple(view.stride()), x.requires_grad)
            reads.append(BoundSymbol(Prim.SLICE.block.symbol, (x, index), {}, v))
            pair.append(v)
        last = k == w.shape[-2] - 1
        product = z if last and total is None else TensorVar(
            f"{z.name}_p{k}", tuple(z.shape), z.dtype, z.device, tuple(z.strides), z.requires_grad)
        sums.append(BoundSymbol(Prim.MUL.block.symbol, tuple(pair), {}, product))
        if total is not None:
            added = z if last else TensorVar(f"{z.name}_s{k}", tuple(z.shape), z.dtype, z.device,
                                             tuple(z.strides), z.requires_grad)
            sums.append(BoundSymbol(Prim.ADD.block.symbol, (total, product), {}, added))
            product = added
        total = product
    return reads, sums


def copies_in_kernels(flat: list, supported: Callable[[BoundSymbol], bool], dense: dict | None = None) -> list:
    """A reshape that copies (a permuted value read in another shape: attention's heads merged
    back, a window partition, the qkv cotangent's concatenation regrouped) is a contiguous() a
    kernel writes, then a view of it; and a batched matmul operand torch.matmul would copy in its
    own reshape (batch dims that do not merge) is copied so first.  ATen's strided copy of a
    permuted 5-D value took 20-30 us where the kernel takes 10, and the copy joins the kernel
    that computes its input.  `dense` (name -> its copy) holds the copies made by earlier calls
    over the same program: a value two matmuls read (attention's output cotangent, by the
    gradients of its probabilities and of V) is copied once.  Returns `flat` itself where
    nothing copies."""
    out, changed = [], False
    dense = {} if dense is None else dense
    for b in flat:
        p = prim_of(b)
        new = _reshape_copy(b, supported, dense) if p is Prim.RESHAPE else \
            _matmul_copies(b, supported, dense) if p is Prim.MATMUL else None
        if new is None:
            out.append(b)
            # an op's own copy (torch.matmul's recorded with the operand it copies) goes apart
            changed |= p is Prim.CONTIGUOUS and len(flat) > 1 and supported(b) and \
                worth_a_copy_kernel(b.outputs()[0].shape)
        else:
            out += new
            changed = True
    return out if changed else flat


def worth_a_copy_kernel(shape: tuple) -> bool:
    """Whether a copy of this shape is worth a kernel of its own: COPY_MIN_NUMEL elements or more.
    Of a symbolic size, yes, without a guard: either way is right, the kernel copy is the faster
    at all but the smallest sizes, and a guard would split the program by size class."""
    numel = math.prod(shape)
    return True if is_symbolic(numel) else numel >= COPY_MIN_NUMEL


def _dense(x: TensorVar, name: str, supported, dense: dict) -> tuple:
    """(x copied row-major: the contiguous() a kernel takes, or None; the copies to record) where
    `dense` holds no copy of x yet, else (that copy, [])."""
    if x.name in dense:
        return dense[x.name], []
    c = BoundSymbol(Prim.CONTIGUOUS.block.symbol, (x,), {}, TensorVar(
        name, tuple(x.shape), x.dtype, x.device, tuple(contiguous_strides(tuple(x.shape))), x.requires_grad))
    if not supported(c):
        return None, []
    dense[x.name] = c.output
    return c.output, [c]


def _reshape_copy(r: BoundSymbol, supported, dense: dict) -> list | None:
    x, z = r.args[0], r.outputs()[0]
    if not isinstance(x, TensorVar) or not worth_a_copy_kernel(x.shape) or len(r.outputs()) != 1 \
            or tuple(z.strides) != tuple(contiguous_strides(tuple(z.shape))) or not reshape_copies(x, tuple(z.shape)):
        return None
    c, copies = _dense(x, f"{z.name}_dense", supported, dense)
    return None if c is None else [*copies, r.replace(args=(c, *r.args[1:]))]


def _matmul_copies(m: BoundSymbol, supported, dense: dict) -> list | None:
    a, b = m.args[:2] if len(m.args) >= 2 and not m.kwargs else (None, None)
    if not (isinstance(a, TensorVar) and isinstance(b, TensorVar) and a.ndim >= 3
            and (b.ndim == 2 or b.ndim == a.ndim and tuple(a.shape[:-2]) == tuple(b.shape[:-2]))):
        return None
    copies, args = [], []
    for k, x in enumerate((a, b)):
        c, made = _dense(x, f"{m.outputs()[0].name}_in{k}", supported, dense) if x.ndim >= 3 and \
            worth_a_copy_kernel(x.shape) and reshape_copies(x, (-1, *x.shape[-2:])) else (None, [])
        copies += made
        args.append(c if c is not None else x)
    return copies + [m.replace(args=(*args, *m.args[2:]))] if args[0] is not a or args[1] is not b else None


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
        # (v too: a static base sliced to a symbolic length needs the symbolic rules, which a plain
        # meta tensor would take by pinning the length to this call's value with a guard)
        with shape_rules_for(base, v):
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
