"""Region -> C kernel source, for CPU tensors of any size.

A region becomes one C function.  An elementwise region is a loop nest over its domain with the
dims every tensor walks alike merged (a contiguous region is one flat loop), the innermost loop over
consecutive elements so that the compiler vectorizes it; the work is cut into items (rows, or
blocks of BLOCK elements of a flat loop) that an OpenMP loop shares among `fj_nt` threads when the
region has at least PARALLEL_MIN elements (a row reduction of costly values: PARALLEL_MIN_COSTLY_ROWS).
A region with reductions is a loop over rows (shared
among threads the same way) and one loop over the row per reduction level, recomputing the cheap
elementwise values rather than storing them; each reduction keeps LANES partial accumulators (lane
= element index mod LANES) combined pairwise in a fixed order, so a result never depends on the
thread count and the loop vectorizes without reassociating anything; a float32 sum adds blocks of
SUM_BLOCK elements in float lanes, folded into double lanes (accumulators.py).

CEmitter writes the function around the loops and the code of one element; the loop nests are
written by its collaborators (accumulators.RowLoops, elementwise.ElementLoops), which it hands the
region's emission state and the calls they may make on it (emission.py).

Shapes and strides are literals, or (runtime_sizes.py) parameters sz0, sz1, ... that the kernel
takes after its tensors, so that one build serves every size; either way the source is the cache key.
Values are computed in the dtype torch computes them in: a Python number is rounded to that dtype
first (`x * 0.1` on float32 is `x * (float)0.1`, as torch's CPU kernels do), integers wrap (the
kernel is built with -fwrapv), max/min propagate NaN.  Float products and float64 sums accumulate
in double, float32 sums in blocks of float lanes (SUM_BLOCK).
A prim's form is its block's, as language.py chooses it: float32 exp, log, tanh, sigmoid, erf, sin
and cos use the vectorizable forms of vecmath.py (their measured error against torch is each
form's `ulp`); the other transcendental functions, and all of float64's, are the C library's
scalar ones.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import Prim, prim_of
from fjit.executors import render
from fjit.executors.c import vecmath
from fjit.executors.c.accumulators import REDUCE, ColumnSums, RowLoops, costly
from fjit.executors.c.elementwise import ElementLoops
from fjit.executors.c.emission import Emission, indent
from fjit.executors.c.language import C, C_TYPE, HALF_NAME, PARTS, literal, storage
from fjit.executors.render import HALF, contiguous_strides, held, index_decomposition, \
    index_terms, small_power
from fjit.executors.runtime_sizes import Size, symbolic_size
from fjit.passes.fusion import Region


# A region of at least this many elements shares its work among threads (fewer: no thread pool is
# entered).
PARALLEL_MIN = 1 << 15
# ... and a region with row reductions and a costly value per element (softmax's exp) from this
# many: torch's softmax shares rows of 16 among threads from 4096 elements too.
PARALLEL_MIN_COSTLY_ROWS = 1 << 12


@dataclasses.dataclass
class Kernel:
    name: str
    source: str
    params: list      # (kind, index): ("in", k) region input k (tensor or number), ("out", k);
    #                   ("size", value): a runtime size's value for this region (runtime_sizes.py)
    arg_types: list   # ctypes type names, in parameter order: "p" pointer, "d" double, "q" int64
    threaded: bool = False   # its last parameter is the thread count (int64 fj_nt)


class CEmitter(render.RegionEmitter):
    """A region's C function: the kernel around its loop nests and the code of one element, spelled
    in C (render.RegionEmitter's hooks).  The loop nests are written by collaborators, each given
    this emitter (the calls of emission.Emitter, all it uses of it) and the region's Emission
    (`state`, which they fill and the element code reads): `row_loops` for a region with reductions
    (accumulators.RowLoops), `element_loops` for an elementwise one (elementwise.ElementLoops), and
    `columns`, the column sums added along either (accumulators.ColumnSums)."""

    lang = C

    def __init__(self, region: Region):
        super().__init__(region)
        self.state = Emission(region)
        self.exact = False        # libm instead of the vector forms (the guarded chunk's rerun)
        self.guarded = False      # a guarded vector form was emitted
        # inputs read through views of one value share its pointer: gcc vectorizes a loop over
        # more than ~10 pointers only without alias checks, which restrict no longer spares it
        # inside an OpenMP region (an unrolled matmul's K slices of one operand)
        first: dict = {}
        self.pointer = {k: first.setdefault(region.bases[k][0].name if k in region.bases else v.name, k)
                        for k, v in enumerate(region.inputs)}
        numel = math.prod(region.domain)
        threshold = PARALLEL_MIN_COSTLY_ROWS if region.has_reduction and any(map(costly, region.bsyms)) \
            else PARALLEL_MIN
        # A kernel whose sizes are parameters (runtime_sizes.py) decides threads at run time, so
        # that one source serves sizes on both sides of the threshold; not with column sums,
        # whose order of additions is fixed by the chunks -- except in a symbolic program, whose
        # column sums always take CHUNKS ranges (ColumnSums)
        self.runtime_threads = isinstance(numel, Size) and (not region.columns or symbolic_size(numel))
        self.parallel = self.runtime_threads or numel >= threshold
        self.parallel_if = f" && {numel} >= {threshold}" if self.runtime_threads else ""
        self.columns = ColumnSums(region, self.parallel)
        self.row_loops = RowLoops(self, self.state, self.columns)
        self.element_loops = ElementLoops(self, self.state)

    # -- indexing -------------------------------------------------------------------------------
    def offset(self, v: TensorVar, rows_only: bool = False) -> str:
        """The element offset of `v` (broadcast to the domain) at the current loop indices."""
        if v.name in self.state.flat:
            return self.state.flat[v.name]
        if not rows_only and v.shape == self.r.domain and v.strides == contiguous_strides(self.r.domain):
            width = math.prod(self.r.inner)
            return f"r * {width} + c" if self.r.outer else "c"
        return " + ".join(index_terms(self.r, v.shape, v.strides, rows_only)) or "0"

    def index_lines(self, names: str, sizes: tuple, flat: str) -> list[str]:
        return [f"int64_t {n} = {e};" for n, e in index_decomposition(names, sizes, flat, "/")]

    def assign_levels(self) -> int:
        """Each value's level; the number of passes over a row."""
        level = self.state.level = {v.name: 0 for v in self.r.inputs}
        level.update(render.levels(self.row_bsyms(), REDUCE))
        passes = max([1] + [level[b.outputs()[0].name] for b in self.row_bsyms() if prim_of(b) in REDUCE])
        for v in self.r.outputs:
            if v.name not in self.state.rows and v.name not in self.columns.names:
                passes = max(passes, level[v.name] + 1)
        for b in self.columns.sums:
            passes = max(passes, level[b.args[0].name] + 1)
            level[b.outputs()[0].name] = level[b.args[0].name]
        return passes

    def row_bsyms(self) -> list:
        """The region's prims but its column sums (which only the passes' element loops add to)."""
        return [b for b in self.r.bsyms if b.outputs()[0].name not in self.columns.names]

    # -- the language ----------------------------------------------------------------------------
    def cast(self, expr: str, dt: torch.dtype) -> str:
        return f"(({C_TYPE[dt]}){expr})"

    def convert(self, expr: str, dt: torch.dtype, target: torch.dtype) -> str:
        return self.cast(expr, target)

    def literal(self, value, ct: torch.dtype | None) -> str:
        return literal(value, ct if ct is not None else torch.float64)

    def define(self, var: str, expr: str, dt: torch.dtype, half: torch.dtype | None) -> list[str]:
        return [f"{C_TYPE[dt]} {var} = {expr if half is None else self.rounded(expr, half)};"]

    def rounded(self, val: str, half: torch.dtype) -> str:
        return f"fj_round_{HALF_NAME[half]}({val})"

    def form(self, b: BoundSymbol, ct: torch.dtype, ops: list, lines: list) -> str:
        """C's form of the prim; a guarded vector form adds its range check to `lines`."""
        if power := small_power(b):
            return power.format(*ops)
        f = "f" if ct == torch.float32 else ""
        form = PARTS.form(prim_of(b), ct, vector=not self.exact)
        if form.guard is not None and self.columns.sums:   # a rerun would add a row twice
            form = PARTS.form(prim_of(b), ct, vector=False)
        if form.guard is not None:
            self.guarded = True
            lines.append(f"fj_bad |= {form.guard.format(*ops, f=f)};")
        return form.expr.format(*ops, f=f)

    def load(self, v: TensorVar, k: int, offset: str | None = None) -> str:
        """Input k's element at `offset` (v's offset at the loop indices by default, or its copy
        in a tile buffer), in the type it is computed in."""
        element = self.state.staged[v.name] if offset is None and v.name in self.state.staged else \
            self.element(v, k, self.offset(v) if offset is None else offset)
        return f"fj_from_{HALF_NAME[v.dtype]}({element})" if v.dtype in HALF else element

    def element(self, v: TensorVar, k: int, offset: str) -> str:
        """Input k's stored element at `offset`, in the value it views where the kernel reads
        through its views."""
        if k in self.r.bases:
            offset = f"{self.r.bases[k][1]} + {offset}"
        return f"in{self.pointer[k]}[{offset}]"

    def store(self, v: TensorVar, values: dict) -> str:
        value = self.operand(v, held(v.dtype), values)
        return f"fj_to_{HALF_NAME[v.dtype]}({value})" if v.dtype in HALF else value

    # -- the kernel ------------------------------------------------------------------------------
    def generate(self, name: str, sizes: list[int] = ()) -> Kernel:
        """The kernel; `sizes` are the values of the region's runtime sizes sz0, sz1, ... (its
        Sizes, where runtime_sizes.symbolic made it), parameters after the outputs."""
        r = self.r
        params, arg_types, signature = [], [], []
        names: dict[str, tuple] = {}
        for k, v in enumerate(r.inputs):
            if isinstance(v, NumberVar):
                c_type, code = ("int64_t", "q") if v.pytype is int else ("double", "d")
                signature.append(f"{c_type} s{k}")
                names[v.name] = (f"s{k}", torch.int64 if v.pytype is int else torch.float64)
            else:
                signature.append(f"const {storage(v.dtype)} *restrict in{k}")
                code = "p"
            params.append(("in", k))
            arg_types.append(code)
        for k, v in enumerate(r.outputs):
            signature.append(f"{storage(v.dtype)} *restrict out{k}")
            params.append(("out", k))
            arg_types.append("p")
        for k, value in enumerate(sizes):
            signature.append(f"int64_t sz{k}")
            params.append(("size", value))
            arg_types.append("q")
        passes = self.assign_levels()
        before, after = [], []
        if r.columns:
            before, body, after = self.columns.wrap(self.row_loops.row_loop(passes, names), r.outputs)
            items = self.columns.items
        elif r.has_cat:
            body, items = self.element_loops.piece_body(names)
        else:
            body, items = self.row_loops.reduction_body(passes, names) if r.has_reduction else \
                self.element_loops.flat_body(names)
        threaded = self.parallel and (self.runtime_threads or items > 1)
        if threaded:
            signature.append("int64_t fj_nt")
            pragma = "#pragma omp parallel for num_threads(fj_nt) schedule(static)"
            if self.runtime_threads:
                # a branch, not the pragma's if clause: entering OpenMP's runtime with if(0)
                # still costs about a microsecond, which a small kernel notices
                inner = [indent(x) for x in body]
                body = [f"if (fj_nt > 1{self.parallel_if}) {{", pragma] + inner + ["} else {"] + inner + ["}"]
            else:
                body = [pragma + " if(fj_nt > 1)"] + body
        body = before + body + after
        source = vecmath.PRELUDE + f"\nvoid {name}({', '.join(signature)})\n{{\n" + \
            "\n".join(indent(line) for line in body) + "\n}\n"
        return Kernel(name, source, params, arg_types + (["q"] if threaded else []), threaded)

    def guarded_twice(self, emit) -> list[str]:
        """`emit()`'s lines; if they use a guarded vector form, a flag set when an argument is out
        of its range, and the same work done again with the C library when it is."""
        self.guarded, self.exact = False, False
        fast = emit()
        if not self.guarded:
            return fast
        self.exact = True
        exact = emit()
        self.exact = False
        return ["int fj_bad = 0;"] + fast + ["if (fj_bad) {"] + [indent(x) for x in exact] + ["}"]

    def element_code(self, upto: int, names: dict, store_level: int | None,
                     lines: list | None = None, indexed: bool = True) -> tuple[list, dict]:
        """One iteration over an element: loads, elementwise values of level <= upto, stores
        (`indexed`: the inner dims' indices worked out from `c` first)."""
        r, state = self.r, self.state
        lines = [] if lines is None else lines
        if not state.flat and indexed:
            lines += self.index_lines("i", r.inner, "c")
        local = dict(names)
        for k, v in enumerate(r.inputs):
            if isinstance(v, TensorVar) and v.name not in state.side and v.name not in names:
                var = f"x{k}"
                lines.append(f"{C_TYPE[held(v.dtype)]} {var} = {self.load(v, k)};")
                local[v.name] = (var, held(v.dtype))
        for b in r.bsyms:
            out = b.outputs()[0]
            if prim_of(b) in REDUCE or out.name in state.rows or state.level[out.name] > upto or \
                    out.name in r.private:
                continue
            if prim_of(b) is Prim.CAT:
                self.element_loops.piece_value(b, local, lines)
                continue
            buffer = state.scratch.get(out.name)
            if buffer is not None and state.level[out.name] < upto:
                self.bind(out, f"{buffer}[c]", out.dtype, local, lines)   # an earlier pass's
                continue
            self.compute(b, local, lines)
            if buffer is not None:
                lines.append(f"{buffer}[c] = {local[out.name][0]};")
        for k, v in enumerate(r.outputs):
            if v.name not in state.rows and v.name not in self.columns.names and (
                    store_level is None or state.level[v.name] == store_level):
                target = state.staged_out.get(v.name) or f"out{k}[{self.offset(v)}]"
                lines.append(f"{target} = {self.store(v, local)};")
        if store_level is not None:
            lines += self.columns.accumulate(upto, state.level, local)
        return lines, local


def generate(region: Region, name: str, sizes: list[int] = ()) -> Kernel:
    return CEmitter(region).generate(name, sizes)
