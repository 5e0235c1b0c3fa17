"""How C spells a kernel's values: the C type of each dtype (half types held in float, stored as
their 16 bits), literals of Python numbers, what C accepts beyond the shared rules (CPU tensors),
and which prims C computes in a form of its own (x ** 2, x ** 3, vecmath's float32 functions).
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, TensorVar
from fjit.core.prims import prim_of
from fjit.executors import render
from fjit.executors.c import vecmath
from fjit.executors.render import HALF
from fjit.executors.runtime_sizes import Size

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


def vector_form(b: BoundSymbol) -> bool:
    """Whether `b` is computed by one of vecmath's vectorizable float32 functions."""
    try:
        return prim_of(b) in vecmath.VECTOR_FORMS and render.computes_in(b) == torch.float32
    except (TypeError, RuntimeError):
        return False


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
