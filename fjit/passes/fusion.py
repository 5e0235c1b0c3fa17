"""Fusion partitioning: split a trace's prims into regions a kernel generator can claim.

Torch-level ops are first replaced by their prims.  A region is a run of prims over one iteration
domain `outer + inner`: elementwise prims over the whole domain, and reductions over exactly the inner
dims (so softmax, layer norm and RMS norm are one region each: a row of `inner` per program).  A pure
elementwise region has no outer dims.  Where the generator takes them (`columns`), a region also
takes sums over its outer dims of its values (a bias's or a norm weight's gradient, summed over
the batch and sequence dims), which then become its outer dims if it had none.  Prims a region
cannot take (matmul, factories, views, ...) stay torch calls; they are emitted before the open
regions when they do not read from them, so the regions on either side of them still fuse.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
from torch._prims_common import make_contiguous_strides_for as contiguous_strides

from fjit.core.ir import BoundSymbol, Tag, TensorVar, Var, flatten_values
from fjit.core.prims import Prim, prim_of
from fjit.core.symbolic import same
from fjit.core.trace import Trace
from fjit.passes.regroup import (absorb_into_cats, broadcasts_to, delay_column_sums, read_through_views,
                                 sink_relabels, split_ops)

# The widest row a reduction region takes by default (a generator without looped kernels).
MAX_ROW = 1 << 16
# The most prims a kernel computes again rather than loading their values (see _rematerialize).
MAX_REMATERIALIZED = 12
# The most regions the partitioner keeps open at once (see partition).
MAX_OPEN = 4
# The most tensors a region reads from outside and makes (any may be an output), checked from
# REGION_COUNTED prims on: ctypes passes a kernel at most 1024 arguments (a 256-step scan recorded
# step by step made one region of 1276).
MAX_OPERANDS, REGION_COUNTED = 256, 32


@dataclasses.dataclass
class Region:
    bsyms: list
    outer: tuple
    inner: tuple
    row_vars: set = dataclasses.field(default_factory=set)      # names of per-row values
    keepdim_rows: set = dataclasses.field(default_factory=set)  # row values shaped outer+[1]*k
    columns: set = dataclasses.field(default_factory=set)       # sums over the outer dims
    inputs: list = dataclasses.field(default_factory=list)      # external Vars, in first-use order
    outputs: list = dataclasses.field(default_factory=list)     # Vars used after the region
    private: set = dataclasses.field(default_factory=set)       # names only a CAT's pieces read
    bases: dict = dataclasses.field(default_factory=dict)       # input k -> (var it views, offset)

    @property
    def domain(self) -> tuple:
        return self.outer + self.inner

    @property
    def has_reduction(self) -> bool:
        return bool(self.row_vars)

    @property
    def has_cat(self) -> bool:
        return any(prim_of(b) is Prim.CAT for b in self.bsyms)

    def too_many_operands(self, new: list) -> bool:
        """Whether the region with the prims `new` would read and make over MAX_OPERANDS tensors."""
        ps = (*self.bsyms, *new)
        return len(self.bsyms) >= REGION_COUNTED and len({v.name for p in ps for v in p.outputs()} | {
            v.name for p in ps for v in p.inputs() if isinstance(v, TensorVar)}) > MAX_OPERANDS


@dataclasses.dataclass(eq=False)
class _Open:
    """A region the partitioner is still growing: the names its ops made, and the views of them
    taken since, which run right after it (`view_names`: what they made)."""
    region: Region
    made: set
    views: list = dataclasses.field(default_factory=list)
    view_names: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class FusionPolicy:
    """What a kernel executor's regions may hold: the prims its generator emits (`supported`),
    and the shapes of work it takes beyond elementwise regions and row reductions."""
    supported: Callable[[BoundSymbol], bool]
    # A torch-level op is replaced by its prims when all of them are supported; with
    # split_partial_ops also when only some are (the rest then run as single prims, which on a GPU
    # costs little next to the fusion won, but on a CPU can cost more than the op's own torch call)
    split_partial_ops: bool = True
    whole_ops: frozenset = frozenset()   # qualnames of torch-level ops never split into their prims
    max_row: int | None = MAX_ROW        # widest row a reduction region takes (None: any)
    columns: bool = False                # a region takes sums over its outer dims
    read_views: bool = False             # a kernel reads an input view from the value it views
    cpu_rewrites: bool = False           # thin matmuls and copies become prims (passes/regroup.py)
    external_rows: bool = False          # per-row values may read per-row inputs


class Partitioner:
    """Greedy, in trace order, within an executor's FusionPolicy."""

    def __init__(self, policy: FusionPolicy):
        self.policy = policy

    def _try_add(self, region: Region | None, b: BoundSymbol, supported, privates=()) -> Region | None:
        """`region` extended by `b` (a CAT: with the prims only its pieces read), a new region for
        `b` when region is None, or None."""
        if not supported(b) or region is not None and region.too_many_operands([*privates, b]):
            return None
        out = b.outputs()[0]
        tensors = [v for v in b.inputs() if isinstance(v, TensorVar)]
        if region is not None and any(v.name in region.columns for v in tensors):
            return None       # a column sum is complete only when the region is
        if prim_of(b) is Prim.CAT:
            # an elementwise region over the concatenated value; its pieces read nothing the region
            # computes (that would be at another index)
            if region is None:
                region = Region([], (), tuple(out.shape))
            elif region.has_reduction or region.columns or not same(region.domain, tuple(out.shape)) or \
                    {v.name for p in (*privates, b) for v in p.inputs()} & \
                    {v.name for p in region.bsyms for v in p.outputs()}:
                return None
            region.bsyms += [*privates, b]
            region.private |= {p.outputs()[0].name for p in privates}
            return region
        if b.sym.has(Tag.REDUCTION):
            if region is not None and region.has_cat:
                return None   # a kernel computes a concatenation's pieces in elementwise loops
            x = tensors[0]
            dims, keepdim = tuple(b.args[1]), b.args[2]
            k = len(dims)
            if region is not None and self._column(region, b, x, dims, out):
                region.outer, region.inner = x.shape[:k], x.shape[k:]
                region.bsyms.append(b)
                region.columns.add(out.name)
                return region
            width = math.prod(x.shape[x.ndim - k:])
            max_row = self.policy.max_row
            if dims != tuple(range(x.ndim - k, x.ndim)) or max_row is not None and width > max_row:
                return None
            outer, inner = x.shape[:x.ndim - k], x.shape[x.ndim - k:]
            if region is None:
                region = Region([], outer, inner)
            elif (region.has_reduction or region.columns) and not same((region.outer, region.inner), (outer, inner)):
                return None
            elif not region.has_reduction and not same(region.domain, outer + inner):
                return None
            elif x.name in region.row_vars:
                return None
            region.outer, region.inner = outer, inner
            region.bsyms.append(b)
            region.row_vars.add(out.name)
            if keepdim:
                region.keepdim_rows.add(out.name)
            return region
        # elementwise
        if region is None:
            if math.prod(out.shape) == 0:
                return None
            return Region([b], (), tuple(out.shape))
        rows = [v for v in tensors if v.name in region.row_vars]
        if (rows and len(rows) == len(tensors) and out.shape != region.domain) or self._row_of_inputs(region, b):
            region.bsyms.append(b)
            region.row_vars.add(out.name)
            if all(v.name in region.keepdim_rows for v in rows):
                region.keepdim_rows.add(out.name)
            return region
        if not same(tuple(out.shape), tuple(region.domain)):   # (symbolic: not provably the domain, apart)
            return None
        if any(v.name in region.row_vars and v.name not in region.keepdim_rows for v in tensors):
            return None   # torch would broadcast an [M] value along the last dim, not per row
        if not all(v.name in region.row_vars or broadcasts_to(v.shape, region.domain) for v in tensors):
            return None
        region.bsyms.append(b)
        return region

    def _row_of_inputs(self, region: Region, b: BoundSymbol) -> bool:
        """Whether the elementwise `b` is a per-row value of a reduction region that reads inputs
        of the region's own per-row shape (`outer + [1] * len(inner)`, or broadcast to it): a
        softmax backward's -sum(g * e) / s**2 reads the forward's row sums s, and as a region of
        its own it cut the row kernel in two, each pass reading the rows from memory."""
        out = b.outputs()[0]
        row = tuple(region.outer) + (1,) * len(region.inner)
        if not (self.policy.external_rows and region.has_reduction and tuple(out.shape) == row
                and math.prod(region.inner) > 1):
            return False
        # (a value the region made broadcasts to the row only as a keepdim row value: its full
        # domain values and column sums span an inner dim over 1)
        return all(v.name in region.keepdim_rows or v.name not in region.row_vars and broadcasts_to(v.shape, row)
                   for v in b.inputs() if isinstance(v, TensorVar))

    def _column(self, region: Region, b: BoundSymbol, x: TensorVar, dims: tuple, out) -> bool:
        """Whether `b`, a reduction of x over `dims`, is a column sum the region takes: a float sum
        over the leading dims of a value of the whole domain, that are the region's outer dims
        (or become them: a region without reductions), into a contiguous result."""
        k = len(dims)
        return (self.policy.columns and prim_of(b) is Prim.SUM and 0 < k < x.ndim and dims == tuple(range(k))
                and x.dtype in (torch.float32, torch.float64) and out.dtype == x.dtype
                and tuple(x.shape) == region.domain and x.name not in region.row_vars
                and (not (region.has_reduction or region.columns)
                     or (tuple(x.shape[:k]), tuple(x.shape[k:])) == (tuple(region.outer), tuple(region.inner)))
                and tuple(out.strides) == tuple(contiguous_strides(tuple(out.shape)))
                and (any(v.name == x.name for c in region.bsyms for v in c.outputs())
                     or tuple(x.strides) == tuple(contiguous_strides(tuple(x.shape)))))

    def partition(self, trace: Trace) -> list:
        """Items in execution order: BoundSymbols (torch) and Regions."""
        verdicts: dict[int, bool] = {}    # id(prim) -> supported: each prim is asked up to 3 times

        def supported(b: BoundSymbol) -> bool:
            verdict = verdicts.get(id(b))
            if verdict is None:
                verdict = verdicts[id(b)] = self.policy.supported(b)
            return verdict
        policy = self.policy
        flat = split_ops(trace.bsyms, supported, policy.whole_ops, policy.split_partial_ops, policy.cpu_rewrites)
        flat = sink_relabels(flat, trace, supported)
        flat = delay_column_sums(flat, supported) if self.policy.columns else flat
        flat, absorbed = absorb_into_cats(flat, trace, supported)
        privates = {id(p) for ps in absorbed.values() for p in ps}
        items: list = []
        # Regions still open, oldest first.  An op joins the newest region that takes it; a region
        # closes when an op it cannot take reads it, but a view of its values waits with it, so a
        # column sum after a reshape for a matmul still joins.  Independent chains traced
        # interleaved (a rotary embedding's q and k halves, forward and backward) fuse each.  No
        # open region reads another.
        open_: list[_Open] = []

        def close(entry: _Open) -> None:
            open_[:] = [e for e in open_ if e is not entry]
            items.append(entry.region)
            items.extend(entry.views)

        def close_read_by(reads: set, keep: _Open | None = None) -> None:
            for entry in [e for e in open_ if e is not keep and reads & e.made]:
                close(entry)

        for b in flat:
            if id(b) in privates:        # joins with the CAT reading it
                continue
            if b.sym.has(Tag.MODE):      # a region runs under one mode
                for entry in list(open_):
                    close(entry)
            group = [*absorbed.get(id(b), ()), b]
            reads = {v.name for p in group for v in p.inputs()}
            made = {v.name for p in group for v in p.outputs()}
            # (a region never takes an op that reads one of the views waiting for it)
            joined = next((e for e in reversed(open_) if not reads & e.view_names and
                           self._try_add(e.region, b, supported, group[:-1]) is not None), None)
            if joined is not None:
                joined.made |= made
                close_read_by(reads, keep=joined)
                continue
            viewed = next((e for e in reversed(open_) if reads & e.made), None)
            if viewed is not None and (b.sym.has(Tag.SHAPE) or b.sym.has(Tag.VIEW)) and \
                    not (b.sym.has(Tag.RANDOM) or b.sym.has(Tag.IMPURE)):
                close_read_by(reads, keep=viewed)
                viewed.made |= made
                viewed.view_names |= made
                viewed.views.append(b)
                continue
            close_read_by(reads)
            fresh = self._try_add(None, b, supported, group[:-1])
            if fresh is None:
                items.extend(group)
                continue
            if len(open_) == MAX_OPEN:
                close(open_[0])
            open_.append(_Open(fresh, made))
        for entry in list(open_):
            close(entry)
        _connect(items, trace)
        return items

    def fuse(self, trace: Trace, stage: str, kernel_call: Callable[[Region], BoundSymbol],
             worth: Callable[[Region], bool] = lambda region: True) -> Trace | None:
        """The trace with each region `worth` a kernel replaced by `kernel_call(region)` (the rest
        stay prims), or None when no region is."""
        items = self.partition(trace)
        kernels = {id(i) for i in items if isinstance(i, Region) and i.outputs and worth(i)}
        if not kernels:
            return None
        if _rematerialize(items, trace, kernels):
            _connect(items, trace)
        if self.policy.read_views:
            read_through_views(items, kernels)
        bsyms = []
        for item in items:
            if not isinstance(item, Region):
                bsyms.append(item)
            elif item.outputs and worth(item):
                bsyms.append(kernel_call(item))
            elif item.outputs:
                bsyms.extend(item.bsyms)
        return trace.with_stage(stage, bsyms)


def _rematerialize(items: list, trace: Trace, kernels: set) -> bool:
    """Compute again, in a later kernel, the elementwise values it reads from an earlier kernel of
    the same domain, from that kernel's own inputs: a value stored by one kernel and loaded by the
    next costs more memory traffic than its few flops (the backward's recomputed GELU writes x/2,
    x/sqrt(2) and 1 + erf(x/sqrt(2)), three tensors of the activation's size, for the next kernel
    to read).  Only values nothing after the later kernel reads, computed without a row value, in
    chains of at most MAX_REMATERIALIZED prims.  True if any region changed."""
    last_read = {v.name: len(items) for v in flatten_values(trace.output) if isinstance(v, Var)}
    for k, item in enumerate(items):
        for b in item.bsyms if isinstance(item, Region) else (item,):
            for v in b.inputs():
                last_read[v.name] = max(last_read.get(v.name, -1), k)
    producer: dict = {}          # name -> (its region, its prim), for full-domain elementwise values
    position = {id(b): (k, j) for k, r in enumerate(items) if isinstance(r, Region)
                for j, b in enumerate(r.bsyms)}
    changed = False
    for k, item in enumerate(items):
        if not isinstance(item, Region) or id(item) not in kernels or item.has_cat:
            continue     # (a concatenation's pieces read its inputs at their own index)
        copied: list = []
        for v in item.inputs:
            made = producer.get(v.name)
            if made is None or not same(made[0].domain, item.domain):     # (symbolic: no guard)
                continue
            chain = _chain(made[0], v.name, producer)
            if chain is None or any(last_read.get(o.name, -1) > k for c in chain for o in c.outputs()):
                continue
            new = [c for c in chain if c not in copied]
            if len(copied) + len(new) <= MAX_REMATERIALIZED:
                copied += new
        if copied:
            item.bsyms[:0] = sorted(copied, key=lambda b: position[id(b)])
            changed = True
        for b in item.bsyms:
            out = b.outputs()[0]
            if b.sym.has(Tag.ELEMENTWISE) and out.name not in item.row_vars and out.name not in producer:
                producer[out.name] = (item, b)
    return changed


def _chain(region: Region, name: str, producer: dict) -> list | None:
    """The prims of `region` that compute `name` from the region's inputs, in trace order, or None
    when one of them needs a row value (a reduction's result is not recomputed)."""
    chain, stack, seen = [], [name], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        made = producer.get(n)
        if made is None or made[0] is not region:
            if n in region.row_vars:
                return None
            continue
        chain.append(made[1])
        stack.extend(v.name for v in made[1].inputs())
        if len(chain) > MAX_REMATERIALIZED:
            return None
    return chain


def _connect(items: list, trace: Trace) -> None:
    """Fill each region's external inputs and the outputs anything after it reads.  A value that
    a later region recomputes (_rematerialize) is stored, if anything reads it, only by the region
    that computed it first: one definition per name."""
    first: dict = {}
    for item in items:
        if isinstance(item, Region):
            for b in item.bsyms:
                for v in b.outputs():
                    first.setdefault(v.name, item)
    needed_later: set = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    for item in reversed(items):
        if isinstance(item, Region):
            made = {v.name for b in item.bsyms for v in b.outputs()}
            own = {n for n in made if first[n] is item}
            item.outputs = [v for b in item.bsyms for v in b.outputs()
                            if v.name in needed_later and v.name in own]
            seen, inputs = set(), []
            for b in item.bsyms:
                for v in b.inputs():
                    if v.name not in made and v.name not in seen:
                        seen.add(v.name)
                        inputs.append(v)
            item.inputs = inputs
            needed_later -= own
            needed_later.update(v.name for v in inputs)
        else:
            needed_later.update(v.name for v in item.inputs())

