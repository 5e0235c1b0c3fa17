"""Region -> C kernel source, for CPU tensors of any size.

A region becomes one C function.  An elementwise region is a loop nest over its domain with the
dims every tensor walks alike merged (a contiguous region is one flat loop), the innermost loop over
consecutive elements so that the compiler vectorizes it; the work is cut into items (rows, or
blocks of BLOCK elements of a flat loop) that an OpenMP loop shares among `fj_nt` threads when the
region has at least PARALLEL_MIN elements.  A region with reductions is a loop over rows (shared
among threads the same way) and one loop over the row per reduction level, recomputing the cheap
elementwise values rather than storing them; each reduction keeps LANES partial accumulators (lane
= element index mod LANES) combined pairwise in a fixed order, so a result never depends on the
thread count and the loop vectorizes without reassociating anything; a float32 sum adds blocks of
SUM_BLOCK elements in float lanes, folded into double lanes.

Shapes and strides are literals (a trace is specialized to them), so the source is the cache key.
Values are computed in the dtype torch computes them in: a Python number is rounded to that dtype
first (`x * 0.1` on float32 is `x * (float)0.1`, as torch's CPU kernels do), integers wrap (the
kernel is built with -fwrapv), max/min propagate NaN.  Float products and float64 sums accumulate
in double, float32 sums in blocks of float lanes (SUM_BLOCK).
float32 exp, log, tanh, sigmoid, erf, sin and cos use the vectorizable forms of vecmath.py (their
measured error against torch is in vecmath.ULP_BOUND); the other transcendental functions, and all
of float64's, are the C library's scalar ones.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import Prim, kernel_table, prim_of
from fjit.executors import render
from fjit.executors.c import vecmath
from fjit.executors.c.accumulators import ColumnSums, accumulate, accumulator, float_lanes
from fjit.executors.c.language import C_TYPE, DTYPES, HALF_NAME, CLanguage, literal, storage, \
    vector_form
from fjit.executors.render import HALF, coalesce, contiguous_strides, held, index_decomposition, \
    index_terms, small_power
from fjit.passes.fusion import Region


# C's expression of each prim, from the prim blocks (fjit/core/prims/): libm calls ({f} is the
# suffix: "f" for float, "" for double), NaN-propagating max/min macros, Python's remainder.
_C_EXPRS = kernel_table("c")
# float32 prims computed by vecmath's inline vector forms rather than by a libm call
_VEC_EXPRS = {**_C_EXPRS, **vecmath.VECTOR_FORMS}
_CHEAP_LIBM = {Prim.SQRT, Prim.RSQRT, Prim.FLOOR, Prim.CEIL, Prim.TRUNC, Prim.ROUND}
_REDUCE = frozenset({Prim.SUM, Prim.PROD, Prim.AMAX, Prim.AMIN})


C = CLanguage("c", _C_EXPRS, frozenset(DTYPES), _REDUCE, "INFINITY")
# Whether this generator can emit `b` inside a region (CPU tensors only).
supported = functools.partial(render.supported, lang=C)


# A region of at least this many elements shares its work among threads (fewer: no thread pool is
# entered).  Elements of a flat loop are handed out in blocks of BLOCK; reductions keep LANES
# partial accumulators per row.
PARALLEL_MIN = 1 << 15
BLOCK = 1 << 13
LANES = 16
# A float32 sum adds blocks of SUM_BLOCK elements in LANES float lanes (64 roundings a lane), folded
# into double lanes: |error| <= 64 * 2^-24 * sum|x| at any row length, at float32 vector width
# (tests/executors/test_c_executor.py measures it, and torch's cascade sum, against float64).
SUM_BLOCK = 1024
# Bytes of a row's costly values (exp, tanh, libm calls) a reduction region keeps in per-thread
# stack buffers for its later passes, instead of computing them again (softmax's exp).
SCRATCH_BYTES = 1 << 16


def calls_libm(b: BoundSymbol) -> bool:
    """Whether the prim's C code calls a costly scalar C library function (float64's sin, exp;
    tan, asin, pow, ...): a loop calling one is not vectorized."""
    p = prim_of(b)
    return "{f}(" in _C_EXPRS.get(p, "") and p not in _CHEAP_LIBM and small_power(b) is None \
        and not vector_form(b)


@dataclasses.dataclass
class Kernel:
    name: str
    source: str
    params: list      # (kind, index): ("in", k) region input k (tensor or number), ("out", k)
    arg_types: list   # ctypes type names, in parameter order: "p" pointer, "d" double, "q" int64
    threaded: bool = False   # its last parameter is the thread count (int64 fj_nt)


def _indent(line: str) -> str:
    return line if line.startswith("#") else "    " + line


class CEmitter(render.RegionEmitter):
    """A region's C function: the shared walk in loop nests (see the module docstring)."""

    lang = C

    def __init__(self, region: Region):
        super().__init__(region)
        self.level: dict[str, int] = {}       # value name -> first loop pass it is available in
        self.rows: set = set(region.row_vars)
        self.exact = False        # libm instead of the vector forms (the guarded chunk's rerun)
        self.guarded = False      # a guarded vector form was emitted
        self.flat: dict = {}      # elementwise regions: tensor name -> its offset expression
        self.scratch: dict = {}   # reductions: value name -> its row buffer, for later passes
        self.columns = ColumnSums(region, math.prod(region.domain) >= PARALLEL_MIN)

    # -- indexing -------------------------------------------------------------------------------
    def offset(self, v: TensorVar, rows_only: bool = False) -> str:
        """The element offset of `v` (broadcast to the domain) at the current loop indices."""
        if v.name in self.flat:
            return self.flat[v.name]
        if not rows_only and v.shape == self.r.domain and v.strides == contiguous_strides(self.r.domain):
            width = math.prod(self.r.inner)
            return f"r * {width} + c" if self.r.outer else "c"
        return " + ".join(index_terms(self.r, v.shape, v.strides, rows_only)) or "0"

    def index_lines(self, names: str, sizes: tuple, flat: str) -> list[str]:
        return [f"int64_t {n} = {e};" for n, e in index_decomposition(names, sizes, flat, "/")]

    def assign_levels(self) -> int:
        """Each value's level; the number of passes over a row."""
        self.level = {v.name: 0 for v in self.r.inputs}
        self.level.update(render.levels(self.row_bsyms(), _REDUCE))
        passes = max([1] + [self.level[b.outputs()[0].name] for b in self.row_bsyms() if prim_of(b) in _REDUCE])
        for v in self.r.outputs:
            if v.name not in self.rows and v.name not in self.columns.names:
                passes = max(passes, self.level[v.name] + 1)
        for b in self.columns.sums:
            passes = max(passes, self.level[b.args[0].name] + 1)
            self.level[b.outputs()[0].name] = self.level[b.args[0].name]
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
        if half is not None:
            expr = f"fj_round_{HALF_NAME[half]}({expr})"
        return [f"{C_TYPE[dt]} {var} = {expr};"]

    def form(self, b: BoundSymbol, ct: torch.dtype, ops: list, lines: list) -> str:
        """C's form of the prim; a guarded vector form adds its range check to `lines`."""
        p = prim_of(b)
        if p is Prim.BITWISE_NOT and ct == torch.bool:
            return f"(!{ops[0]})"
        if power := small_power(b):
            template = power
        elif p is Prim.ABS and ct.is_floating_point:
            template = "fabs{f}({0})"      # the ternary would keep -0.0 negative
        elif ct == torch.float32 and p in vecmath.VECTOR_FORMS and not self.exact and not (
                p in vecmath.GUARDED and self.columns.sums):   # a rerun would add a row twice
            template = _VEC_EXPRS[p]
            if p in vecmath.GUARDED:
                self.guarded = True
                lines.append(f"fj_bad |= fabsf({ops[0]}) > FJ_TRIG_LIMIT;")
        else:
            template = _C_EXPRS[p]
        return template.format(*ops, f="f" if ct == torch.float32 else "")

    def load(self, v: TensorVar, k: int) -> str:
        element = f"in{k}[{self.offset(v)}]"
        return f"fj_from_{HALF_NAME[v.dtype]}({element})" if v.dtype in HALF else element

    def store(self, v: TensorVar, values: dict) -> str:
        value = self.operand(v, held(v.dtype), values)
        return f"fj_to_{HALF_NAME[v.dtype]}({value})" if v.dtype in HALF else value

    # -- the kernel ------------------------------------------------------------------------------
    def generate(self, name: str) -> Kernel:
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
        passes = self.assign_levels()
        before, after = [], []
        if r.columns:
            (before, body), items = self.columns.wrap(self.row_loop(passes, names)), self.columns.chunks
            after = self.columns.stores(r.outputs)
        else:
            body, items = self.reduction_body(passes, names) if r.has_reduction else self.flat_body(names)
        threaded = math.prod(r.domain) >= PARALLEL_MIN and items > 1
        if threaded:
            signature.append("int64_t fj_nt")
            body = ["#pragma omp parallel for num_threads(fj_nt) schedule(static) if(fj_nt > 1)"] + body
        body = before + body + after
        source = vecmath.PRELUDE + f"\nvoid {name}({', '.join(signature)})\n{{\n" + \
            "\n".join(_indent(line) for line in body) + "\n}\n"
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
        return ["int fj_bad = 0;"] + fast + ["if (fj_bad) {"] + [_indent(x) for x in exact] + ["}"]

    def element_code(self, upto: int, names: dict, store_level: int | None,
                     lines: list | None = None) -> tuple[list, dict]:
        """One iteration over an element: loads, elementwise values of level <= upto, stores."""
        r = self.r
        lines = [] if lines is None else lines
        if not self.flat:
            lines += self.index_lines("i", r.inner, "c")
        local = dict(names)
        for k, v in enumerate(r.inputs):
            if isinstance(v, TensorVar):
                var = f"x{k}"
                lines.append(f"{C_TYPE[held(v.dtype)]} {var} = {self.load(v, k)};")
                local[v.name] = (var, held(v.dtype))
        for b in r.bsyms:
            out = b.outputs()[0]
            if prim_of(b) in _REDUCE or out.name in self.rows or self.level[out.name] > upto:
                continue
            buffer = self.scratch.get(out.name)
            if buffer is not None and self.level[out.name] < upto:
                self.bind(out, f"{buffer}[c]", out.dtype, local, lines)   # an earlier pass's
                continue
            self.compute(b, local, lines)
            if buffer is not None:
                lines.append(f"{buffer}[c] = {local[out.name][0]};")
        for k, v in enumerate(r.outputs):
            if v.name not in self.rows and v.name not in self.columns.names and (
                    store_level is None or self.level[v.name] == store_level):
                lines.append(f"out{k}[{self.offset(v)}] = {self.store(v, local)};")
        if store_level is not None:
            lines += self.columns.accumulate(upto, self.level, local)
        return lines, local

    def flat_body(self, names: dict) -> tuple[list[str], int]:
        """An elementwise region: items (rows of the merged domain, or blocks of a flat loop), each
        a loop over consecutive elements."""
        r = self.r
        tensors = [v for v in r.inputs if isinstance(v, TensorVar)] + list(r.outputs)
        sizes, strides = coalesce(r.domain, tensors, r.outputs[0])
        width, rows = sizes[-1], math.prod(sizes[:-1])
        lines: list[str] = []
        if rows == 1:
            items = -(-width // BLOCK)
            head = [f"int64_t lo = it * {BLOCK}, hi = lo + {BLOCK} < {width} ? lo + {BLOCK} : {width};"] \
                if items > 1 else [f"int64_t lo = 0, hi = {width};"]
            bases = {}
        else:
            items = rows
            head = [f"int64_t lo = 0, hi = {width};"] + self.index_lines("o", tuple(sizes[:-1]), "it")
            bases = {}
            for k, v in enumerate(tensors):
                terms = [f"o{j} * {s}" if s != 1 else f"o{j}" for j, s in enumerate(strides[v.name][:-1]) if s]
                if terms:
                    bases[v.name] = f"b{k}"
                    head.append(f"int64_t b{k} = {' + '.join(terms)};")
        for v in tensors:
            step = strides[v.name][-1]
            inner = "c" if step == 1 else f"c * {step}" if step else ""
            self.flat[v.name] = " + ".join(t for t in (bases.get(v.name), inner) if t) or "0"

        def emit():
            inner, _ = self.element_code(0, names, None)
            return ["for (int64_t c = lo; c < hi; c++) {"] + [_indent(x) for x in inner] + ["}"]
        lines = [f"for (int64_t it = 0; it < {items}; it++) {{"] + \
            [_indent(x) for x in head + self.guarded_twice(emit)] + ["}"]
        return lines, items

    def reduction_body(self, passes: int, names: dict) -> tuple[list[str], int]:
        rows = math.prod(self.r.outer)
        row_lines = self.row_loop(passes, names)
        return [f"for (int64_t r = 0; r < {rows}; r++) {{"] + [_indent(x) for x in row_lines] + ["}"], rows

    def row_loop(self, passes: int, names: dict) -> list[str]:
        """The work of row `r`."""
        self.choose_scratch(passes)
        return self.index_lines("o", self.r.outer, "r") + \
            self.guarded_twice(lambda: self.row_code(passes, names))

    def choose_scratch(self, passes: int) -> None:
        """Costly elementwise values (a vector-math or libm call) that a later pass over the row
        reads again: each gets a row buffer, while they fit in SCRATCH_BYTES."""
        r, width, budget = self.r, math.prod(self.r.inner), SCRATCH_BYTES
        for b in r.bsyms:
            o = b.outputs()[0]
            if prim_of(b) in _REDUCE or o.name in self.rows or not (calls_libm(b) or vector_form(b)):
                continue
            lvl = self.level[o.name]
            later = any(o.name in {v.name for v in b2.inputs()} and self.level[b2.outputs()[0].name] > lvl
                        and b2.outputs()[0].name not in self.rows and prim_of(b2) not in _REDUCE
                        for b2 in r.bsyms)
            size = width * torch.empty((), dtype=held(o.dtype)).element_size()
            if later and lvl < passes and size <= budget:
                budget -= size
                self.scratch[o.name] = f"fj_s{len(self.scratch)}"

    def row_code(self, passes: int, names: dict) -> list[str]:
        r = self.r
        width = math.prod(r.inner)
        row_lines: list[str] = [f"{C_TYPE[held(v.dtype)]} {buffer}[{width}];"
                                for v in (b.outputs()[0] for b in r.bsyms)
                                for buffer in [self.scratch.get(v.name)] if buffer]
        row_names = dict(names)
        for p in range(passes + 1):
            # row values of level p: reductions finished by pass p - 1, then elementwise on rows
            for b in r.bsyms:
                o = b.outputs()[0]
                if o.name in self.rows and self.level[o.name] == p and prim_of(b) not in _REDUCE:
                    self.compute(b, row_names, row_lines)
            if p == passes:
                break
            reductions = [b for b in self.row_bsyms() if prim_of(b) in _REDUCE and
                          self.level[b.outputs()[0].name] == p + 1]
            if not reductions:
                loop, _ = self.element_code(p, row_names, p)
                row_lines.append(f"for (int64_t c = 0; c < {width}; c++) {{")
                row_lines += ["    " + x for x in loop]
                row_lines.append("}")
                continue
            accs = []
            for b in reductions:
                acc = self.fresh()
                ctype, identity = accumulator(b, C)
                row_lines += [f"{ctype} {acc}[{LANES}];",
                              f"for (int l = 0; l < {LANES}; l++) {acc}[l] = {identity};"]
                accs.append((b, acc))
            # LANES partial accumulators, lane = c % LANES: blocks of LANES, then the tail (a
            # float32 sum's in float lanes per SUM_BLOCK elements, folded into double lanes)
            blocked = {acc for b, acc in accs if float_lanes(b)}
            row_lines += ["{", "    int64_t c0 = 0;"]
            if blocked:
                row_lines += [f"    while (c0 + {LANES} <= {width}) {{",
                              f"    int64_t cb = c0 + {SUM_BLOCK} < {width} ? c0 + {SUM_BLOCK} : {width};"]
                for acc in sorted(blocked):
                    row_lines += [f"    float {acc}_b[{LANES}];",
                                  f"    for (int l = 0; l < {LANES}; l++) {acc}_b[l] = 0;"]
            end = "cb" if blocked else width
            # (the lane loop must not be unrolled before the vectorizer sees it: unrolled, its
            # NaN-propagating max/min stay scalar)
            for head, tail in (([f"for (; c0 + {LANES} <= {end}; c0 += {LANES}) {{",
                                 "#pragma GCC unroll 1",
                                 f"for (int64_t l = 0; l < {LANES}; l++) {{"], ["}", "}"]),
                               ([f"for (int64_t l = 0; c0 + l < {width}; l++) {{"], ["}"])):
                loop, local = self.element_code(p, row_names, p, ["int64_t c = c0 + l;"])
                for b, acc in accs:
                    lane = f"{acc}_b[l]" if acc in blocked and tail == ["}", "}"] else f"{acc}[l]"
                    loop.append(accumulate(b, lane, local[b.args[0].name][0]))
                row_lines += [_indent(x) for x in head]
                row_lines += ["        " + x for x in loop]
                row_lines += ["    " + x for x in tail]
                if blocked and tail == ["}", "}"]:
                    row_lines += [f"    for (int l = 0; l < {LANES}; l++) {acc}[l] += {acc}_b[l];"
                                  for acc in sorted(blocked)] + ["    }"]
            row_lines.append("}")
            for b, acc in accs:
                o = b.outputs()[0]
                combine = accumulate(b, f"{acc}[l]", f"{acc}[l + w]")
                row_lines.append(f"for (int w = {LANES // 2}; w > 0; w >>= 1) "
                                 f"for (int l = 0; l < w; l++) {combine}")
                self.bind(o, f"({C_TYPE[held(o.dtype)]}){acc}[0]", o.dtype, row_names, row_lines)
        for k, v in enumerate(r.outputs):
            if v.name in self.rows:
                row_lines.append(f"out{k}[{self.offset(v, rows_only=True)}] = "
                                 f"{self.store(v, row_names)};")
        return row_lines


def generate(region: Region, name: str) -> Kernel:
    return CEmitter(region).generate(name)
