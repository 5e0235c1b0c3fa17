"""Region -> Triton kernel source.

The kernel reads like Triton's vector-add tutorial: program id, offsets, mask, loads, compute,
stores.  Shapes and strides are literals (a trace is specialized to them), so the source itself is
the cache key: identical regions over identical layouts share one kernel.  Half-precision values are
computed in float32 and rounded after every op, as torch's eager kernels round each op's result.
Only `tl.*` math is used (no libdevice), so the same source runs under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import BOOL_RESULT, Prim, prim_of
from fjit.executors import render
from fjit.executors.render import HALF as _HALF, computes_in, index_decomposition, index_terms
from fjit.passes.fusion import Region

TL_DTYPE = {torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
            torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
            torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8",
            torch.bool: "tl.int1"}
# Triton's names of the types in a compiled kernel's signature (pointers add a leading '*')
PTR_TYPE = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16",
            torch.bfloat16: "bf16", torch.int64: "i64", torch.int32: "i32", torch.int16: "i16",
            torch.int8: "i8", torch.uint8: "u8", torch.bool: "i1"}
SCALAR_TYPE = {float: "fp32", int: "i64", bool: "i1"}

# Triton's overrides of the shared expressions: tl.* math only (no libdevice), so that the same
# source runs under TRITON_INTERPRET=1; {t} is the computation dtype.
_TL_EXPRS = {
    **render.BASE,
    Prim.EXP: "tl.exp({0})", Prim.EXP2: "tl.exp2({0})", Prim.EXPM1: "(tl.exp({0}) - 1)",
    Prim.LOG: "tl.log({0})", Prim.LOG2: "tl.log2({0})", Prim.LOG10: "(tl.log2({0}) * 0.30102999566398120)",
    Prim.LOG1P: "tl.log(1 + {0})", Prim.SQRT: "tl.sqrt({0})", Prim.RSQRT: "(1 / tl.sqrt({0}))",
    Prim.SIN: "tl.sin({0})", Prim.COS: "tl.cos({0})", Prim.TAN: "(tl.sin({0}) / tl.cos({0}))",
    Prim.TANH: "(1 - 2 / (tl.exp(2 * {0}) + 1))", Prim.SIGMOID: "(1 / (1 + tl.exp(-{0})))",
    Prim.ERF: "tl.erf({0})", Prim.FLOOR: "tl.floor({0})", Prim.CEIL: "tl.ceil({0})",
    Prim.TRUNC: "tl.where({0} >= 0, tl.floor({0}), tl.ceil({0}))",
    Prim.SINH: "((tl.exp({0}) - tl.exp(-{0})) * 0.5)", Prim.COSH: "((tl.exp({0}) + tl.exp(-{0})) * 0.5)",
    Prim.ROUND: "_round_half_even({0})",
    Prim.ISINF: "(tl.abs({0}) == float('inf'))", Prim.ISFINITE: "(tl.abs({0}) < float('inf'))",
    Prim.ABS: "tl.abs({0})",
    Prim.MAXIMUM: "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    Prim.MINIMUM: "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    Prim.CLAMP_MIN: "tl.maximum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    Prim.CLAMP_MAX: "tl.minimum({0}, {1}, propagate_nan=tl.PropagateNan.ALL)",
    Prim.SIGN: "(({0} > 0).to({t}) - ({0} < 0).to({t}))",
    Prim.LOGICAL_AND: "(({0} != 0) & ({1} != 0))", Prim.LOGICAL_OR: "(({0} != 0) | ({1} != 0))",
    Prim.LOGICAL_XOR: "(({0} != 0) ^ ({1} != 0))",
    Prim.WHERE: "tl.where({0}, {1}, {2})",
}
_REDUCE = {Prim.SUM: "tl.sum", Prim.AMAX: "tl.max", Prim.AMIN: "tl.min"}
TRITON = render.Language("triton", _TL_EXPRS, frozenset(TL_DTYPE), frozenset(_REDUCE), "float('inf')")

_HELPERS = '''
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


def supported(b: BoundSymbol) -> bool:
    """Whether this generator can emit `b` inside a region."""
    if not render.supported(b, TRITON):
        return False
    p = prim_of(b)
    if p in _REDUCE:
        return p is not Prim.SUM or b.args[0].dtype != torch.bool
    if p is not Prim.CONVERT and computes_in(b) == torch.float64 and any(
            isinstance(a, NumberVar) or isinstance(a, float) and not math.isfinite(a) for a in b.args):
        return False    # a float kernel argument is float32 in Triton; torch keeps a double
    return True


@dataclasses.dataclass
class Kernel:
    name: str
    source: str
    grid: tuple
    block: int
    num_warps: int
    scalar_args: list      # NumberVars and non-finite literals, in kernel-argument order
    params: list           # argument names before BLOCK: in<k>/s<k> (region input k), k<j>, out<k>
    signature: dict = dataclasses.field(default_factory=dict)   # argument -> Triton type
    constexprs: dict = dataclasses.field(default_factory=dict)  # constexpr argument -> value

    def stages(self) -> list:
        """The kernels one launch of the region runs, in order."""
        return [self]


class _Emitter:
    def __init__(self, region: Region, interpret: bool):
        self.r = region
        self.interpret = interpret
        self.lines: list[str] = []
        self.values: dict[str, tuple[str, torch.dtype]] = {}   # var name -> (expr, compute dtype)
        self.params: list[str] = []
        self.signature: dict[str, str] = {}
        self.scalars: list = []
        self.counter = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    # -- indexing -------------------------------------------------------------------------------
    def index_terms(self, shape: tuple, strides: tuple, rows_only: bool = False) -> str:
        terms = index_terms(self.r, shape, strides, rows_only)
        if rows_only:
            return " + ".join(terms) if terms else "0"
        if not any(t.startswith("i") for t in terms):
            terms.append("c * 0")   # constant along the row: still a block of pointers
        return " + ".join(terms)

    def operand(self, a, ct: torch.dtype) -> str:
        if isinstance(a, (TensorVar, NumberVar)):
            expr, dt = self.values[a.name]
            return expr if dt == ct or ct is None else f"{expr}.to({TL_DTYPE[ct]})"
        if isinstance(a, bool):
            return "1" if a else "0"
        if isinstance(a, float) and not math.isfinite(a):
            name = f"k{len(self.scalars)}"
            self.params.append(name)
            self.signature[name] = "fp32"
            self.scalars.append(a)
            self.values[f"__lit{name}"] = (name, torch.float32)
            return name
        return repr(a)

    # -- the kernel ------------------------------------------------------------------------------
    def generate(self, name: str) -> Kernel:
        r = self.r
        rows, width = math.prod(r.outer), math.prod(r.inner)
        big = any(math.prod(v.shape) >= 2**31 for v in r.inputs + r.outputs
                  if isinstance(v, TensorVar))
        pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
        if r.has_reduction:
            block = 1 << max(width - 1, 0).bit_length()
            self.emit(f"r = {pid}")
            self.emit("c = tl.arange(0, BLOCK)")
            self.emit(f"mask = c < {width}")
            grid = (rows,)
        else:
            cap = 1 << 16 if self.interpret else 1024 if width < 1 << 22 else 4096
            block = min(1 << max(width - 1, 0).bit_length(), cap)
            self.emit(f"c = {pid} * BLOCK + tl.arange(0, BLOCK)")
            self.emit(f"mask = c < {width}")
            grid = (-(-width // block),)
        for index, expr in index_decomposition("i", r.inner, "c", "//") + \
                index_decomposition("o", r.outer, "r", "//"):
            self.emit(f"{index} = {expr}")
        for k, v in enumerate(r.inputs):
            if isinstance(v, NumberVar):
                self.params.append(f"s{k}")
                self.signature[f"s{k}"] = SCALAR_TYPE[v.pytype]
                self.scalars.append(v)
                self.values[v.name] = (f"s{k}", torch.float32)
                continue
            self.params.append(f"in{k}")
            self.signature[f"in{k}"] = "*" + PTR_TYPE[v.dtype]
            val = self.fresh()
            off = self.index_terms(v.shape, v.strides)
            load = f"tl.load(in{k} + {off}, mask=mask, other=0)"
            ct = torch.float32 if v.dtype in _HALF else v.dtype
            self.emit(f"{val} = {load}" + (".to(tl.float32)" if v.dtype in _HALF else ""))
            self.values[v.name] = (val, ct)
        for b in r.bsyms:
            self.emit_bsym(b)
        for k, v in enumerate(r.outputs):
            self.params.append(f"out{k}")
            self.signature[f"out{k}"] = "*" + PTR_TYPE[v.dtype]
            expr, dt = self.values[v.name]
            value = expr if dt == v.dtype else f"{expr}.to({TL_DTYPE[v.dtype]})"
            if v.name in r.row_vars:
                self.emit(f"tl.store(out{k} + {self.index_terms(v.shape, v.strides, rows_only=True)}, {value})")
            else:
                self.emit(f"tl.store(out{k} + {self.index_terms(v.shape, v.strides)}, {value}, mask=mask)")
        warps = 4 if block <= 2048 else 8 if block <= 8192 else 16
        head = f"@triton.jit\ndef {name}({', '.join(self.params + ['BLOCK: tl.constexpr'])}):"
        source = f"import triton\nimport triton.language as tl\n{_HELPERS}\n\n{head}\n" + \
            "\n".join(self.lines) + "\n"
        signature = dict(self.signature)
        signature["BLOCK"] = "constexpr"
        return Kernel(name, source, grid, block, warps, self.scalars, self.params, signature,
                      {"BLOCK": block})

    def emit_bsym(self, b: BoundSymbol) -> None:
        p = prim_of(b)
        out = b.outputs()[0]
        val = self.fresh()
        if p in _REDUCE:
            x = b.args[0]
            expr, dt = self.values[x.name]
            ct = torch.float32 if out.dtype in _HALF else out.dtype
            if dt != ct:
                expr = f"{expr}.to({TL_DTYPE[ct]})"
            start = render.identity(p, ct)
            neutral = TRITON.literal_inf(start < 0) if isinstance(start, float) else str(start)
            self.emit(f"{val} = {_REDUCE[p]}(tl.where(mask, {expr}, {neutral}), axis=0)")
            if p is not Prim.SUM and ct.is_floating_point:   # torch's max/min propagate NaN
                nan = self.fresh()
                self.emit(f"{nan} = tl.max(tl.where(mask & ({expr} != {expr}), 1, 0), axis=0)")
                self.emit(f"{val} = tl.where({nan} > 0, float('nan'), {val})")
            self.finish(out, val, ct)
            return
        if p is Prim.CONVERT:
            expr, dt = self.values[b.args[0].name]
            target = b.args[1]
            if target == torch.bool:
                self.emit(f"{val} = {expr} != 0")
                self.finish(out, val, torch.bool)
            else:
                ct = torch.float32 if target in _HALF else target
                self.emit(f"{val} = {expr}.to({TL_DTYPE[ct]})" if dt != ct else f"{val} = {expr}")
                self.finish(out, val, ct)
            return
        ct = computes_in(b)
        if p is Prim.WHERE:
            ops = [self.operand(b.args[0], None)] + [self.operand(a, ct) for a in b.args[1:]]
        else:
            ops = [self.operand(a, ct) for a in b.args]
        template = _TL_EXPRS[p]
        self.emit(f"{val} = {template.format(*ops, t=TL_DTYPE[ct])}")
        self.finish(out, val, torch.bool if p in BOOL_RESULT else ct)

    def finish(self, out: TensorVar, val: str, ct: torch.dtype) -> None:
        if out.dtype in _HALF:   # round to the half type as torch does, keep computing in f32
            if out.dtype == torch.bfloat16:
                self.emit(f"{val} = _round_to_bf16({val})")
            else:
                self.emit(f"{val} = {val}.to(tl.float16).to(tl.float32)")
            ct = torch.float32
        self.values[out.name] = (val, ct)


def generate(region: Region, name: str, interpret: bool) -> Kernel:
    return _Emitter(region, interpret).generate(name)
