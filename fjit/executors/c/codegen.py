"""Region -> C kernel source, for CPU tensors of any size.

A region becomes one C function.  An elementwise region is a loop nest over its domain with the
dims every tensor walks alike merged (a contiguous region is one flat loop), the innermost loop over
consecutive elements so that the compiler vectorizes it; the work is cut into items (rows, or
blocks of BLOCK elements of a flat loop) that an OpenMP loop shares among `fj_nt` threads when the
region has at least PARALLEL_MIN elements.  A region with reductions is a loop over rows (shared
among threads the same way) and one loop over the row per reduction level, recomputing the cheap
elementwise values rather than storing them; each reduction keeps LANES partial accumulators (lane
= element index mod LANES) combined pairwise in a fixed order, so a result never depends on the
thread count and the loop vectorizes without reassociating anything.

Shapes and strides are literals (a trace is specialized to them), so the source is the cache key.
Values are computed in the dtype torch computes them in: a Python number is rounded to that dtype
first (`x * 0.1` on float32 is `x * (float)0.1`, as torch's CPU kernels do), integers wrap (the
kernel is built with -fwrapv), max/min propagate NaN.  Float sums and products accumulate in double.
float32 exp, log, tanh, sigmoid, erf, sin and cos use the vectorizable forms of vecmath.py (their
measured error against torch is in vecmath.ULP_BOUND); the other transcendental functions, and all
of float64's, are the C library's scalar ones.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import BOOL_RESULT, Prim, kernel_table, prim_of
from fjit.executors import render
from fjit.executors.c import vecmath
from fjit.executors.render import contiguous_strides, index_decomposition, index_terms, is_square
from fjit.passes.fusion import Region

# C types of values; half types are held in float (rounded to their dtype after every op, as
# torch's CPU kernels round each op's result) and stored as their 16 bits.
C_TYPE = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
          torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
          torch.uint8: "uint8_t", torch.bool: "bool"}
_HALF = {torch.float16: "f16", torch.bfloat16: "bf16"}
DTYPES = set(C_TYPE) | set(_HALF)


def _held(dt: torch.dtype) -> torch.dtype:
    """The dtype a C variable of dtype `dt` is held in."""
    return torch.float32 if dt in _HALF else dt


def _storage(dt: torch.dtype) -> str:
    return "uint16_t" if dt in _HALF else C_TYPE[dt]

# C's expression of each prim, from the prim blocks (fjit/core/prims/): libm calls ({f} is the
# suffix: "f" for float, "" for double), NaN-propagating max/min macros, Python's remainder.
_C_EXPRS = kernel_table("c")
# float32 prims computed by vecmath's inline vector forms rather than by a libm call
_VEC_EXPRS = {**_C_EXPRS, **vecmath.VECTOR_FORMS}
_CHEAP_LIBM = {Prim.SQRT, Prim.RSQRT, Prim.FLOOR, Prim.CEIL, Prim.TRUNC, Prim.ROUND}
_REDUCE = frozenset({Prim.SUM, Prim.PROD, Prim.AMAX, Prim.AMIN})
C = render.Language("c", _C_EXPRS, frozenset(DTYPES), _REDUCE, "INFINITY")

_PRELUDE = """\
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
/* torch's maximum/minimum/clamp propagate NaN from either side, and keep `a` when a == b
   (maximum(-0.0, 0.0) is -0.0) */
#define FJ_MAX(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) < (b) ? (b) : (a))
#define FJ_MIN(a, b) ((a) != (a) ? (a) : (b) != (b) ? (b) : (a) > (b) ? (b) : (a))
/* Python's modulo: the sign of the divisor (r is fmod(a, b)) */
#define FJ_REMAINDER(a, b, r) ((r) != 0 && (((r) < 0) != ((b) < 0)) ? (r) + (b) : (r))
/* 16-bit floats, converted with round-to-nearest-even as c10 converts them */
static inline float fj_f32(uint32_t b) { float f; memcpy(&f, &b, 4); return f; }
static inline uint32_t fj_bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }
static inline float fj_from_bf16(uint16_t h) { return fj_f32((uint32_t)h << 16); }
static inline uint16_t fj_to_bf16(float f) {
    uint32_t b = fj_bits(f);
    if (f != f) return 0x7FC0;
    return (uint16_t)((b + 0x7FFF + ((b >> 16) & 1)) >> 16);
}
static inline float fj_from_f16(uint16_t h) {
    uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
    float normalized = fj_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    float denormalized = fj_f32((two_w >> 17) | (126u << 23)) - 0.5f;
    return fj_f32(sign | (two_w < (1u << 27) ? fj_bits(denormalized) : fj_bits(normalized)));
}
static inline uint16_t fj_to_f16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = fj_bits(f), shl1_w = w + w, sign = w & 0x80000000u, bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    uint32_t bits = fj_bits(fj_f32((bias >> 1) + 0x07800000u) + base);
    uint32_t nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
static inline float fj_round_bf16(float f) { return fj_from_bf16(fj_to_bf16(f)); }
static inline float fj_round_f16(float f) { return fj_from_f16(fj_to_f16(f)); }
""" + vecmath.SOURCE

# A region of at least this many elements shares its work among threads (fewer: no thread pool is
# entered).  Elements of a flat loop are handed out in blocks of BLOCK; reductions keep LANES
# partial accumulators per row.
PARALLEL_MIN = 1 << 15
BLOCK = 1 << 13
LANES = 16
# Bytes of a row's costly values (exp, tanh, libm calls) a reduction region keeps in per-thread
# stack buffers for its later passes, instead of computing them again (softmax's exp).
SCRATCH_BYTES = 1 << 16


def _vector_form(b: BoundSymbol) -> bool:
    """Whether `b` is computed by one of vecmath's vectorizable float32 functions."""
    try:
        return prim_of(b) in vecmath.VECTOR_FORMS and render.computes_in(b) == torch.float32
    except (TypeError, RuntimeError):
        return False


def is_cube(b: BoundSymbol) -> bool:
    """x ** 3, which torch's CPU kernel computes as x * x * x."""
    return prim_of(b) is Prim.POW and type(b.args[1]) in (int, float) and b.args[1] == 3 \
        and isinstance(b.args[0], TensorVar) and b.args[0].dtype.is_floating_point


def calls_libm(b: BoundSymbol) -> bool:
    """Whether the prim's C code calls a costly scalar C library function (float64's sin, exp;
    tan, asin, pow, ...): a loop calling one is not vectorized."""
    p = prim_of(b)
    return "{f}(" in _C_EXPRS.get(p, "") and p not in _CHEAP_LIBM and not is_square(b) \
        and not is_cube(b) and not _vector_form(b)


def supported(b: BoundSymbol) -> bool:
    """Whether this generator can emit `b` inside a region (CPU tensors only)."""
    return render.supported(b, C) and all(v.device.type == "cpu" for v in b.inputs() + b.outputs()
                                          if isinstance(v, TensorVar))


@dataclasses.dataclass
class Kernel:
    name: str
    source: str
    params: list      # (kind, index): ("in", k) region input k (tensor or number), ("out", k)
    arg_types: list   # ctypes type names, in parameter order: "p" pointer, "d" double, "q" int64
    threaded: bool = False   # its last parameter is the thread count (int64 fj_nt)


def _literal(value, ct: torch.dtype) -> str:
    """A Python number as a C literal of the computation dtype (never user text: numbers only)."""
    ctype = C_TYPE[ct]
    if isinstance(value, bool):
        return f"(({ctype}){int(value)})"
    if isinstance(value, int):
        return f"(({ctype}){value}LL)" if -2**63 <= value < 2**63 else f"(({ctype}){float(value)!r})"
    if isinstance(value, float):
        if math.isnan(value):
            return f"(({ctype})NAN)"
        if math.isinf(value):
            return f"(({ctype}){'-' if value < 0 else ''}INFINITY)"
        return f"(({ctype}){value!r})"
    raise TypeError(f"no C literal for {type(value).__name__}")


def _indent(line: str) -> str:
    return line if line.startswith("#") else "    " + line


def _walk_strides(v: TensorVar, domain: tuple) -> list:
    """`v`'s stride along each dim of `domain` it is broadcast to (0 where it is broadcast)."""
    out = []
    for j in range(len(domain)):
        t = j - (len(domain) - len(v.shape))
        out.append(0 if t < 0 or v.shape[t] == 1 else v.strides[t])
    return out


def _coalesce(domain: tuple, tensors: list) -> tuple[list, dict]:
    """The domain with size-1 dims dropped and neighbouring dims merged where every tensor walks
    them as one (stride of the outer = stride of the inner * its size): sizes and, per tensor
    name, the strides.  A contiguous region becomes one dim."""
    walks = {v.name: _walk_strides(v, domain) for v in tensors}
    sizes: list = []
    strides: dict = {name: [] for name in walks}
    for j, d in enumerate(domain):
        if d == 1:
            continue
        if sizes and all(strides[n][-1] == walks[n][j] * d for n in walks):
            sizes[-1] *= d
            for n in walks:
                strides[n][-1] = walks[n][j]
        else:
            sizes.append(d)
            for n in walks:
                strides[n].append(walks[n][j])
    if not sizes:
        sizes = [1]
        strides = {n: [0] for n in walks}
    return sizes, strides


class _Emitter:
    def __init__(self, region: Region):
        self.r = region
        self.level: dict[str, int] = {}       # value name -> first loop pass it is available in
        self.rows: set = set(region.row_vars)
        self.ctypes_of: dict[str, torch.dtype] = {}   # value name -> dtype its C variable holds
        self.counter = 0
        self.exact = False        # libm instead of the vector forms (the guarded chunk's rerun)
        self.guarded = False      # a guarded vector form was emitted
        self.flat: dict = {}      # elementwise regions: tensor name -> its offset expression
        self.scratch: dict = {}   # reductions: value name -> its row buffer, for later passes

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

    # -- levels: which loop pass over the row can compute each value ------------------------------
    def assign_levels(self) -> int:
        for v in self.r.inputs:
            self.level[v.name] = 0
        passes = 1
        for b in self.r.bsyms:
            out = b.outputs()[0]
            ins = [a for a in b.inputs() if a.name in self.level]
            lvl = max((self.level[a.name] for a in ins), default=0)
            if prim_of(b) in _REDUCE:
                lvl += 1           # known after the pass that reads its input
                passes = max(passes, lvl)
            self.level[out.name] = lvl
        for v in self.r.outputs:
            if v.name not in self.rows:
                passes = max(passes, self.level[v.name] + 1)
        return passes

    # -- values ------------------------------------------------------------------------------------
    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def operand(self, a, ct: torch.dtype | None, names: dict) -> str:
        if isinstance(a, (TensorVar, NumberVar)):
            var = names[a.name]
            held = self.ctypes_of[a.name]
            return var if ct is None or held == ct else f"(({C_TYPE[ct]}){var})"
        return _literal(a, ct if ct is not None else torch.float64)

    def declare(self, lines: list, names: dict, v, expr: str, dt: torch.dtype) -> None:
        """`v` = `expr` (of dtype `dt`) as a new C variable, rounded to `dt` if it is a half type."""
        var = self.fresh()
        if dt in _HALF:
            expr = f"fj_round_{_HALF[dt]}({expr})"
        lines.append(f"{C_TYPE[_held(dt)]} {var} = {expr};")
        names[v.name] = var
        self.ctypes_of[v.name] = _held(dt)

    def load(self, v: TensorVar, k: int) -> str:
        element = f"in{k}[{self.offset(v)}]"
        return f"fj_from_{_HALF[v.dtype]}({element})" if v.dtype in _HALF else element

    def store(self, v: TensorVar, names: dict) -> str:
        value = self.operand(v, _held(v.dtype), names)
        return f"fj_to_{_HALF[v.dtype]}({value})" if v.dtype in _HALF else value

    def expression(self, b: BoundSymbol, names: dict, lines: list) -> tuple[str, torch.dtype]:
        """C expression of an elementwise prim and the dtype of its value (before rounding); a
        guarded vector form adds its range check to `lines`."""
        p = prim_of(b)
        out = b.outputs()[0]
        if p is Prim.CONVERT:
            x = names[b.args[0].name]
            if out.dtype == torch.bool:
                return f"({x} != 0)", torch.bool
            return f"(({C_TYPE[_held(out.dtype)]}){x})", out.dtype
        ct = render.computes_in(b)
        if p is Prim.WHERE:
            ops = [self.operand(b.args[0], None, names)] + [self.operand(a, ct, names) for a in b.args[1:]]
        else:
            ops = [self.operand(a, ct, names) for a in b.args]
        if p is Prim.BITWISE_NOT and ct == torch.bool:
            return f"(!{ops[0]})", torch.bool
        if is_square(b):
            template = "({0} * {0})"
        elif is_cube(b):
            template = "({0} * {0} * {0})"
        elif p is Prim.ABS and ct.is_floating_point:
            template = "fabs{f}({0})"      # the ternary would keep -0.0 negative
        elif ct == torch.float32 and p in vecmath.VECTOR_FORMS and not self.exact:
            template = _VEC_EXPRS[p]
            if p in vecmath.GUARDED:
                self.guarded = True
                lines.append(f"fj_bad |= fabsf({ops[0]}) > FJ_TRIG_LIMIT;")
        else:
            template = _C_EXPRS[p]
        expr = template.format(*ops, f="f" if ct == torch.float32 else "")
        return expr, torch.bool if p in BOOL_RESULT else out.dtype

    # -- the kernel ------------------------------------------------------------------------------
    def generate(self, name: str) -> Kernel:
        r = self.r
        params, arg_types, signature = [], [], []
        names: dict[str, str] = {}
        for k, v in enumerate(r.inputs):
            if isinstance(v, NumberVar):
                c_type, code = ("int64_t", "q") if v.pytype is int else ("double", "d")
                signature.append(f"{c_type} s{k}")
                names[v.name] = f"s{k}"
                self.ctypes_of[v.name] = torch.int64 if v.pytype is int else torch.float64
            else:
                signature.append(f"const {_storage(v.dtype)} *restrict in{k}")
                code = "p"
            params.append(("in", k))
            arg_types.append(code)
        for k, v in enumerate(r.outputs):
            signature.append(f"{_storage(v.dtype)} *restrict out{k}")
            params.append(("out", k))
            arg_types.append("p")
        passes = self.assign_levels()
        body, items = self.reduction_body(passes, names) if r.has_reduction else self.flat_body(names)
        threaded = math.prod(r.domain) >= PARALLEL_MIN and items > 1
        if threaded:
            signature.append("int64_t fj_nt")
            body = ["#pragma omp parallel for num_threads(fj_nt) schedule(static) if(fj_nt > 1)"] + body
        source = _PRELUDE + f"\nvoid {name}({', '.join(signature)})\n{{\n" + \
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
                lines.append(f"{C_TYPE[_held(v.dtype)]} {var} = {self.load(v, k)};")
                local[v.name] = var
                self.ctypes_of[v.name] = _held(v.dtype)
        for b in r.bsyms:
            out = b.outputs()[0]
            if prim_of(b) in _REDUCE or out.name in self.rows or self.level[out.name] > upto:
                continue
            buffer = self.scratch.get(out.name)
            if buffer is not None and self.level[out.name] < upto:
                self.declare(lines, local, out, f"{buffer}[c]", out.dtype)   # an earlier pass's
                continue
            self.declare(lines, local, out, *self.expression(b, local, lines))
            if buffer is not None:
                lines.append(f"{buffer}[c] = {local[out.name]};")
        for k, v in enumerate(r.outputs):
            if v.name not in self.rows and (store_level is None or self.level[v.name] == store_level):
                lines.append(f"out{k}[{self.offset(v)}] = {self.store(v, local)};")
        return lines, local

    def flat_body(self, names: dict) -> tuple[list[str], int]:
        """An elementwise region: items (rows of the merged domain, or blocks of a flat loop), each
        a loop over consecutive elements."""
        r = self.r
        tensors = [v for v in r.inputs if isinstance(v, TensorVar)] + list(r.outputs)
        sizes, strides = _coalesce(r.domain, tensors)
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
        r = self.r
        rows = math.prod(r.outer)
        self.choose_scratch(passes)
        row_lines = self.index_lines("o", r.outer, "r")
        row_lines += self.guarded_twice(lambda: self.row_code(passes, names))
        return [f"for (int64_t r = 0; r < {rows}; r++) {{"] + [_indent(x) for x in row_lines] + ["}"], rows

    def choose_scratch(self, passes: int) -> None:
        """Costly elementwise values (a vector-math or libm call) that a later pass over the row
        reads again: each gets a row buffer, while they fit in SCRATCH_BYTES."""
        r, width, budget = self.r, math.prod(self.r.inner), SCRATCH_BYTES
        for b in r.bsyms:
            o = b.outputs()[0]
            if prim_of(b) in _REDUCE or o.name in self.rows or not (calls_libm(b) or _vector_form(b)):
                continue
            lvl = self.level[o.name]
            later = any(o.name in {v.name for v in b2.inputs()} and self.level[b2.outputs()[0].name] > lvl
                        and b2.outputs()[0].name not in self.rows and prim_of(b2) not in _REDUCE
                        for b2 in r.bsyms)
            size = width * torch.empty((), dtype=_held(o.dtype)).element_size()
            if later and lvl < passes and size <= budget:
                budget -= size
                self.scratch[o.name] = f"fj_s{len(self.scratch)}"

    def row_code(self, passes: int, names: dict) -> list[str]:
        r = self.r
        width = math.prod(r.inner)
        row_lines: list[str] = [f"{C_TYPE[_held(v.dtype)]} {buffer}[{width}];"
                                for v in (b.outputs()[0] for b in r.bsyms)
                                for buffer in [self.scratch.get(v.name)] if buffer]
        row_names = dict(names)
        for p in range(passes + 1):
            # row values of level p: reductions finished by pass p - 1, then elementwise on rows
            for b in r.bsyms:
                o = b.outputs()[0]
                if o.name in self.rows and self.level[o.name] == p and prim_of(b) not in _REDUCE:
                    self.declare(row_lines, row_names, o, *self.expression(b, row_names, row_lines))
            if p == passes:
                break
            reductions = [b for b in r.bsyms if prim_of(b) in _REDUCE and self.level[b.outputs()[0].name] == p + 1]
            if not reductions:
                loop, _ = self.element_code(p, row_names, p)
                row_lines.append(f"for (int64_t c = 0; c < {width}; c++) {{")
                row_lines += ["    " + x for x in loop]
                row_lines.append("}")
                continue
            accs = []
            for b in reductions:
                acc, init = self.accumulator(b)
                row_lines += [f"{init.split()[0]} {acc}[{LANES}];",
                              f"for (int l = 0; l < {LANES}; l++) {acc}[l] = {init.split('= ')[1]}"]
                accs.append((b, acc))
            # LANES partial accumulators, lane = c % LANES: blocks of LANES, then the tail
            row_lines += ["{", "    int64_t c0 = 0;"]
            # (the lane loop must not be unrolled before the vectorizer sees it: unrolled, its
            # NaN-propagating max/min stay scalar)
            for head, tail in (([f"for (; c0 + {LANES} <= {width}; c0 += {LANES}) {{",
                                 "#pragma GCC unroll 1",
                                 f"for (int64_t l = 0; l < {LANES}; l++) {{"], ["}", "}"]),
                               ([f"for (int64_t l = 0; c0 + l < {width}; l++) {{"], ["}"])):
                loop, local = self.element_code(p, row_names, p, ["int64_t c = c0 + l;"])
                for b, acc in accs:
                    loop.append(self.accumulate(b, f"{acc}[l]", local))
                row_lines += [_indent(x) for x in head]
                row_lines += ["        " + x for x in loop]
                row_lines += ["    " + x for x in tail]
            row_lines.append("}")
            for b, acc in accs:
                o = b.outputs()[0]
                combine = self.accumulate(b, f"{acc}[l]", {b.args[0].name: f"{acc}[l + w]"})
                row_lines.append(f"for (int w = {LANES // 2}; w > 0; w >>= 1) "
                                 f"for (int l = 0; l < w; l++) {combine}")
                self.declare(row_lines, row_names, o, f"({C_TYPE[_held(o.dtype)]}){acc}[0]", o.dtype)
        for k, v in enumerate(r.outputs):
            if v.name in self.rows:
                row_lines.append(f"out{k}[{self.offset(v, rows_only=True)}] = "
                                 f"{self.store(v, row_names)};")
        return row_lines

    def accumulator(self, b: BoundSymbol) -> tuple[str, str]:
        p, o = prim_of(b), b.outputs()[0]
        acc = self.fresh()
        if p in (Prim.SUM, Prim.PROD):      # float sums and products accumulate in double
            ctype = "double" if o.dtype.is_floating_point else "int64_t"
        else:
            ctype = C_TYPE[_held(o.dtype)]
        start = render.identity(p, o.dtype)
        if isinstance(start, float):
            text = C.literal_inf(start < 0)
        elif start == -2**63:
            text = "INT64_MIN"          # -9223372036854775808LL is a negated out-of-range literal
        else:
            text = f"{start}LL" if abs(start) > 1 else str(start)
        return acc, f"{ctype} {acc} = {text};"

    def accumulate(self, b: BoundSymbol, acc: str, local: dict) -> str:
        p, x = prim_of(b), b.args[0]
        value = local[x.name]
        if p is Prim.SUM:
            return f"{acc} += {value};"
        if p is Prim.PROD:
            return f"{acc} *= {value};"
        return f"{acc} = {'FJ_MAX' if p is Prim.AMAX else 'FJ_MIN'}({acc}, {value});"


def generate(region: Region, name: str) -> Kernel:
    return _Emitter(region).generate(name)
