"""The C language of kernels: which block parts it reads and which form of a prim it computes (the
language registered for coverage), which prims a C kernel takes (`supported`), the C type of each
dtype (half types held in float, stored as their 16 bits), literals of Python numbers, and what C
accepts beyond the shared rules (CPU tensors).

A block's C forms: `c_vector` (a float32 vector-math form of vecmath.py, Cost.VECTOR), `c_float`
and `c_bool` (for a floating or bool computation dtype), `c`, then the shared infix `expr`.  In
C's templates `{f}` is the float suffix ("f" for float, "" for double): a form calling a C library
function states its cost (an instruction, Cost.ARITHMETIC; a scalar call, Cost.LIBM), and
coverage fails on one that does not.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, TensorVar
from fjit.core.prims import ROWS, Block, Cost, Form, KernelLanguage, Prim, prim_of, register_language
from fjit.executors import render
from fjit.executors.render import HALF
from fjit.executors.runtime_sizes import Size


# The largest tensors a prim calling a scalar C library function may touch to be claimed.
# Vectorized loops (arithmetic, and float32 exp/log/tanh/sigmoid/erf/sin/cos through vecmath) win
# at every size and have no limit; a scalar libm call costs ~10 ns per element against ~1 ns in
# torch's vectorized kernel, so past a few hundred elements the saved dispatch (~2.5 us) is lost.
# Measured with benchmarks/bench_cpu.py --c-crossover.
MAX_NUMEL_LIBM = 256


def _unstated_call(form: Form) -> bool:
    """Whether `form` calls a C library function (written `name{f}(`) without saying what it costs."""
    return form.cost is None and "{f}(" in form.expr


class CParts(KernelLanguage):
    """The block parts C reads, and the form it computes a prim in."""
    name = "c"
    parts = ("c_vector", "c_float", "c_bool", "c", "expr")
    reductions = frozenset({Prim.SUM, Prim.PROD, Prim.AMAX, Prim.AMIN})   # accumulators.py's loops

    def covers(self, block: Block) -> bool:
        # the general form is needed; the others refine it for some dtypes
        return block.prim in self.reductions or "c" in block.kernels or "expr" in block.kernels

    def problems(self, block: Block) -> list[str]:
        return [f"{part} form {form.expr!r} calls a C library function but states no cost "
                f"(Cost.ARITHMETIC where it compiles to an instruction, else Cost.LIBM)"
                for part, form in self.forms(block).items() if _unstated_call(form)]

    def describe(self, block: Block) -> str | None:
        text = super().describe(block)
        if text and any(form.cost is Cost.LIBM for form in self.forms(block).values()):
            text += (f" (a scalar C library call wherever no vector form applies: fused up to "
                     f"{MAX_NUMEL_LIBM} elements)")
        return text

    def general(self, block: Block) -> Form | None:
        return block.kernels.get("c") or block.kernels.get("expr")

    def form(self, p: Prim, ct: torch.dtype, vector: bool = True) -> Form:
        """The form of prim `p` computed in dtype `ct` (`vector`: float32 vector forms allowed)."""
        kernels = ROWS[p].kernels
        if vector and ct == torch.float32 and "c_vector" in kernels:
            return kernels["c_vector"]
        if ct.is_floating_point and "c_float" in kernels:
            return kernels["c_float"]
        if ct == torch.bool and "c_bool" in kernels:
            return kernels["c_bool"]
        return self.general(ROWS[p])


PARTS = register_language(CParts())

# C types of values; half types are held in float (rounded to their dtype after every op, as
# torch's CPU kernels round each op's result) and stored as their 16 bits.
C_TYPE = {torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
          torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
          torch.uint8: "uint8_t", torch.bool: "bool"}
HALF_NAME = {torch.float16: "f16", torch.bfloat16: "bf16"}   # the fj_* conversions' suffix
DTYPES = set(C_TYPE) | set(HALF)


def storage(dt: torch.dtype) -> str:
    """The C type of a tensor's elements in memory.  A bool tensor's are bytes, read into bool
    values: gcc vectorizes no loop that loads _Bool next to floats (a leaky ReLU's backward,
    where(mask, g, g * slope), ran scalar at 2.5 ms a million elements)."""
    return "uint16_t" if dt in HALF else "uint8_t" if dt == torch.bool else C_TYPE[dt]


class CLanguage(render.Language):
    def int_literal(self, n: int) -> str:
        if n == -2**63:
            return "INT64_MIN"      # -9223372036854775808LL is a negated out-of-range literal
        return f"{n}LL" if abs(n) > 1 else str(n)

    def accepts(self, b: BoundSymbol) -> bool:
        return all(v.device.type == "cpu" for v in b.inputs() + b.outputs() if isinstance(v, TensorVar))


def form_of(b: BoundSymbol, vector: bool = True) -> Form | None:
    """The C form that computes the elementwise prim `b` (None: C has none, or its computation
    dtype cannot be told)."""
    p = prim_of(b)
    if p is None or PARTS.general(ROWS[p]) is None:
        return None
    try:
        return PARTS.form(p, render.computes_in(b), vector)
    except (TypeError, RuntimeError):
        return None


def vector_form(b: BoundSymbol) -> bool:
    """Whether `b` is computed by one of vecmath's vectorizable float32 functions."""
    form = form_of(b)
    return form is not None and form.cost is Cost.VECTOR


def calls_libm(b: BoundSymbol) -> bool:
    """Whether the prim's C code calls a scalar C library function (float64's sin, exp; tan, asin,
    pow, ...): a loop calling one is not vectorized.  A form calling one without saying what it
    costs counts as one (coverage flags it)."""
    form = form_of(b)
    return form is not None and render.small_power(b) is None and (
        form.cost is Cost.LIBM or _unstated_call(form))


def literal(value, ct: torch.dtype) -> str:
    """A Python number as a C literal of the computation dtype (never user text: numbers only)."""
    ctype = C_TYPE[ct]
    if isinstance(value, bool):
        return f"(({ctype}){int(value)})"
    if isinstance(value, Size):     # a runtime size (an int64 parameter): a mean's count, say
        return f"(({ctype}){value})"
    if isinstance(value, int):
        return f"(({ctype}){value}LL)" if -2**63 <= value < 2**63 else f"(({ctype}){float(value)!r})"
    if isinstance(value, float):
        if math.isnan(value):
            return f"(({ctype})NAN)"
        if math.isinf(value):
            return f"(({ctype}){'-' if value < 0 else ''}INFINITY)"
        return f"(({ctype}){value!r})"
    raise TypeError(f"no C literal for {type(value).__name__}")


# C as the shared renderer spells it: the prims with a general form (form() picks the form per
# computation dtype), the dtypes its kernels store, the reductions it loops.
C = CLanguage("c", {p: form.expr for p, b in ROWS.items() if (form := PARTS.general(b)) is not None},
              frozenset(DTYPES), PARTS.reductions, "INFINITY")


def supported(b: BoundSymbol) -> bool:
    """Whether C kernels can compute `b` inside a region (CPU tensors only): the prims the shared
    renderer emits in C, and a concatenation along the last dim (computed piece by piece)."""
    return render.supported(b, C) or _cat_along_rows(b)


def _cat_along_rows(b: BoundSymbol) -> bool:
    if prim_of(b) is not Prim.CAT or len(b.outputs()) != 1:
        return False
    out, parts = b.outputs()[0], b.args[0]
    dim = b.args[1] if len(b.args) > 1 else b.kwargs.get("dim", 0)
    return isinstance(out, TensorVar) and out.ndim > 0 and isinstance(dim, int) and \
        dim % out.ndim == out.ndim - 1 and out.dtype in DTYPES and len(parts) > 1 and all(
            isinstance(t, TensorVar) and t.dtype == out.dtype and t.ndim == out.ndim and t.shape[-1] > 0
            and tuple(t.shape[:-1]) == tuple(out.shape[:-1]) for t in parts)
