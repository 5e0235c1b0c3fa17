"""The Triton language of kernels: which block parts it reads (the language registered for
coverage) and the expression of each prim for the interpreter and for a GPU, the reductions, the
types of a compiled kernel's signature, and the jit helpers a kernel may call.

Precise math: compiled for a GPU, tanh, expm1, log1p, sinh, cosh, erf, erfc, ... are libdevice's
(as torch's CUDA kernels call them), and float32 division and square root are IEEE-rounded; under
TRITON_INTERPRET=1 (which cannot run libdevice) they are `tl.*` forms that keep their relative
precision near 0 (Kahan's expm1 and log1p); erfc, which has none, stays a torch call there.
"""
from __future__ import annotations

import dataclasses
import math

import torch

import fjit.config as config
from fjit.core.ir import BoundSymbol, NumberVar
from fjit.core.prims import ROWS, Block, KernelLanguage, Prim, prim_of, register_language
from fjit.executors import render
from fjit.executors.render import computes_in

TL_DTYPE = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
            torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
            torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
            torch.bool: "tl.int1"}
# Triton's names of the types in a compiled kernel's signature (pointers add a leading '*')
PTR_TYPE = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16",
            torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
            torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
SCALAR_TYPE = {float: "fp32", int: "i64", bool: "i1"}


# The reductions Triton's kernels loop over (a tile's tl.* reduction, and a looped row's accumulation).
REDUCE = {Prim.SUM: "tl.sum", Prim.AMAX: "tl.max", Prim.AMIN: "tl.min"}
ACCUMULATE = {Prim.SUM: "{acc} + {x}", Prim.AMAX: "tl.maximum({acc}, {x})", Prim.AMIN: "tl.minimum({acc}, {x})"}


class TritonParts(KernelLanguage):
    """The block parts Triton reads; {t} in them is the computation dtype.  `triton` (or the
    shared `expr`) is the form both the interpreter and a GPU run; `triton_interpreted` runs under
    the interpreter only (tl.* only, with forms that keep small arguments' relative precision),
    `triton_compiled` on a GPU only (libdevice, as torch's CUDA kernels), and `triton_f32` on a GPU
    for a float32 computation torch rounds correctly where Triton's default approximates."""
    name = "triton"
    parts = ("triton_f32", "triton_interpreted", "triton_compiled", "triton", "expr")
    reductions = frozenset(REDUCE)

    def variant(self, block: Block, interpreted: bool) -> str | None:
        kernels = block.kernels
        form = kernels.get("triton_interpreted" if interpreted else "triton_compiled") or \
            kernels.get("triton") or kernels.get("expr")
        return form.expr if form is not None else None

    def covers(self, block: Block) -> bool:
        return block.prim in self.reductions or (
            self.variant(block, True) is not None and self.variant(block, False) is not None)

    def table(self, interpreted: bool) -> dict:
        """prim -> its expression under the interpreter or compiled for a GPU."""
        return {p: e for p, b in ROWS.items() if (e := self.variant(b, interpreted)) is not None}


PARTS = register_language(TritonParts())
INTERPRETED = PARTS.table(interpreted=True)
COMPILED = PARTS.table(interpreted=False)
COMPILED_F32 = {p: b.kernels["triton_f32"].expr for p, b in ROWS.items() if "triton_f32" in b.kernels}


class TritonLanguage(render.Language):
    def accepts(self, b: BoundSymbol) -> bool:
        p = prim_of(b)
        if p in REDUCE:
            return p is not Prim.SUM or b.args[0].dtype != torch.bool
        # a float kernel argument is float32 in Triton; torch keeps a double
        return p is Prim.CONVERT or computes_in(b) != torch.float64 or not any(
            isinstance(a, NumberVar) or isinstance(a, float) and not math.isfinite(a) for a in b.args)


# Compiled for a GPU, and under the interpreter (which has no libdevice: fewer prims).
TRITON = TritonLanguage("triton", COMPILED, frozenset(TL_DTYPE), frozenset(REDUCE), "float('inf')")
TRITON_INTERPRETED = dataclasses.replace(TRITON, exprs=INTERPRETED)

HELPERS = '''
@triton.jit
def _round_half_even(x):
    f = tl.floor(x)
    d = x - f
    odd = (f - 2 * tl.floor(f * 0.5)) != 0
    return tl.where(d > 0.5, f + 1, tl.where(d < 0.5, f, tl.where(odd, f + 1, f)))


@triton.jit
def _round_to_bf16(x):
    # float32 -> nearest bfloat16 (ties to even), kept in float32.  Spelled out in bits because the
    # interpreter's own conversion truncates.
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))
'''
INTERPRETER_HELPERS = '''

@triton.jit
def _expm1(x):
    # exp(x) - 1 without the cancellation near 0 (Kahan): (u - 1) * x / log(u)
    u = tl.exp(x)
    d = u - 1
    exact = (d == -1) | (u == float('inf')) | (x != x)
    return tl.where(u == 1, x, tl.where(exact, d, d * (x / tl.log(u))))


@triton.jit
def _log1p(x):
    # log(1 + x) without the rounding of 1 + x (Kahan): log(u) * x / (u - 1)
    u = 1 + x
    exact = (u == float('inf')) | (u <= 0)
    return tl.where(u == 1, x, tl.where(exact, tl.log(u), tl.log(u) * (x / (u - 1))))


@triton.jit
def _tanh(x):
    a = tl.abs(x)
    e = _expm1(2 * a)
    t = tl.where(a > 20, 1.0, e / (e + 2))
    return tl.where(x < 0, -t, t)


@triton.jit
def _sinh(x):
    e = _expm1(tl.abs(x))
    s = tl.where(e == float('inf'), e, 0.5 * (e + e / (e + 1)))
    return tl.where(x < 0, -s, s)
'''


def spelling(interpret: bool | None = None) -> TritonLanguage:
    """Triton as spelled for the interpreter or for a GPU (by default as TRITON_INTERPRET says)."""
    return TRITON_INTERPRETED if (config.triton_interpret() if interpret is None else interpret) else TRITON


def supported(b: BoundSymbol, interpret: bool | None = None) -> bool:
    """Whether this generator can emit `b` inside a region (for the interpreter or a GPU; by
    default as TRITON_INTERPRET says)."""
    return render.supported(b, spelling(interpret))
