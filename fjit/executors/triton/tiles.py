"""One Triton tile's code, the shared region walk spelled in Triton: the tile's rows and columns
(program ids, offsets, masks, the index of each collapsed dim), loads and stores, casts, literals
and half-type rounding, each prim's statements, and the per-row reduction of a tile (torch's
max/min propagate NaN).  codegen.py arranges the tiles into kernels.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, TensorVar
from fjit.core.prims import Prim, prim_of
from fjit.executors import render
from fjit.executors.render import HALF, collapse, domain_strides, held, index_decomposition, levels, small_power
from fjit.executors.runtime_sizes import Size
from fjit.executors.triton import plan as P
from fjit.executors.triton.language import COMPILED_F32, REDUCE, TL_DTYPE, spelling
from fjit.passes.fusion import Region


class TileEmitter(render.RegionEmitter):
    """The walk over a region in Triton tiles; TritonEmitter (codegen.py) makes the kernels."""

    def __init__(self, region: Region, interpret: bool):
        super().__init__(region)
        self.interpret = interpret
        self.lang = spelling(interpret)
        self.lines: list[str] = []
        self.depth = 1
        self.values: dict[str, tuple[str, torch.dtype]] = {}   # var name -> (expr, compute dtype)
        self.literals: dict[str, str] = {}     # repr of a non-finite float -> its k<j> parameter
        self.reductions = [b for b in region.bsyms if prim_of(b) in REDUCE]
        rows, width = math.prod(region.outer), math.prod(region.inner)
        self.rows, self.width = rows, width
        self.level = levels(region.bsyms, REDUCE)
        splittable = all(self.level[b.outputs()[0].name] == 1 for b in self.reductions) and all(
            v.name in region.row_vars or self.level[v.name] == 0 for v in region.outputs)
        # the launch plan (grid, blocks) is computed from the region's sizes; where they are
        # runtime sizes (runtime_sizes.Size) the grid is an expression of them, which a symbolic
        # program's launcher evaluates per call's sizes, and each choice on them is recorded
        self.plan = P.plan(rows, width, region.has_reduction, splittable, interpret)
        self.online = P.online_sums(region, self.reductions, self.level) if self.plan.mode == "looped" else {}
        if self.online:    # an online sum is reduced in its max's pass
            self.level = levels(region.bsyms, REDUCE, self.online)
        self.two_d = region.has_reduction
        self._layout()

    # -- layout -----------------------------------------------------------------------------------
    def _layout(self) -> None:
        r = self.r
        n_outer = len(r.outer)
        tensors = [v for v in r.inputs + r.outputs if isinstance(v, TensorVar)]
        strides = {v.name: domain_strides(v, r.domain, n_outer, v.name in r.row_vars) for v in tensors}
        self.osizes, self.ostr = collapse(r.outer, {k: s[:n_outer] for k, s in strides.items()})
        self.isizes, self.istr = collapse(r.inner, {k: s[n_outer:] for k, s in strides.items()})
        self.int64 = P.needs_int64(tensors, r.domain)
        self.onames = ["r"] if len(self.osizes) == 1 else [f"o{j}" for j in range(len(self.osizes))]
        self.inames = ["c"] if len(self.isizes) == 1 else [f"i{j}" for j in range(len(self.isizes))]

    def offsets(self, name: str) -> tuple[str | None, str | None]:
        """(row part, column part) of a tensor's element offset; None where it has no terms."""
        def terms(names, strides):
            parts = [f"{n} * {s}" if s != 1 else n for n, s in zip(names, strides) if s]
            return " + ".join(parts) or None
        return terms(self.onames, self.ostr[name]), terms(self.inames, self.istr[name])

    def decompose(self, names: str, sizes: tuple, flat: str) -> None:
        """The index of each collapsed dim from the flat index (itself, for one dim)."""
        if len(sizes) > 1:
            for index, expr in index_decomposition(names, sizes, flat, "//"):
                self.emit(f"{index} = {expr}")

    # -- emitting -------------------------------------------------------------------------------
    def emit(self, line: str) -> None:
        self.lines.append("    " * self.depth + line)

    def masks(self) -> tuple[str, str]:
        return ("rmask", "cmask") if self.two_d else ("mask", "mask")

    def emit_columns(self, start: str | None) -> None:
        """c (the tile's columns), its masks, and the column index of each collapsed inner dim."""
        arange = "tl.arange(0, BLOCK)[None, :]" if self.two_d else "tl.arange(0, BLOCK)"
        self.emit(f"c = {start} + {arange}" if start else f"c = {arange}")
        if self.two_d:
            self.emit(f"cmask = c < {self.width}")
            self.emit("mask = rmask & cmask")
        else:
            self.emit(f"mask = c < {self.width}")
        self.decompose("i", self.isizes, "c")

    def pid(self, axis: int) -> str:
        return f"tl.program_id({axis}).to(tl.int64)" if self.int64 else f"tl.program_id({axis})"

    def emit_rows(self) -> None:
        self.emit(f"r = {self.pid(0)} * ROWS + tl.arange(0, ROWS)[:, None]")
        self.emit(f"rmask = r < {self.rows}")
        self.decompose("o", self.osizes, "r")

    def load(self, k: int, v: TensorVar) -> None:
        rows, cols = self.offsets(v.name)
        rmask, cmask = self.masks()
        off, mask = (f"{rows} + {cols}", "mask") if rows and cols else (rows, rmask) if rows else (cols, cmask)
        if not off:   # one element for the whole domain: one per row (a block, not a scalar)
            off, mask = ("r * 0", "rmask") if self.two_d else ("c * 0", "mask")
        val = self.fresh()
        load = f"tl.load(in{k} + {off}, mask={mask}, other=0)"
        self.emit(f"{val} = {load}" + (".to(tl.float32)" if v.dtype in HALF else ""))
        self.values[v.name] = (val, held(v.dtype))

    def store(self, k: int, v: TensorVar) -> None:
        expr, dt = self.values[v.name]
        value = expr if dt == v.dtype else f"{expr}.to({TL_DTYPE[v.dtype]})"
        rows, cols = self.offsets(v.name)
        if v.name in self.r.row_vars:
            self.emit(f"tl.store(out{k} + {rows or 'r * 0'}, {value}, mask=rmask)")
            return
        if self.two_d:
            off = f"{rows or 'r * 0'} + {cols or 'c * 0'}"
        else:
            off = cols or "c * 0"
        self.emit(f"tl.store(out{k} + {off}, {value}, mask=mask)")

    # -- the language ----------------------------------------------------------------------------
    def cast(self, expr: str, dt: torch.dtype) -> str:
        return f"{expr}.to({TL_DTYPE[dt]})"

    def nonzero(self, expr: str) -> str:
        return f"{expr} != 0"

    def literal(self, a, ct: torch.dtype | None) -> str:
        if isinstance(a, bool):
            return "1" if a else "0"
        if isinstance(a, Size):     # a runtime size (an int64 parameter): a mean's count, a float there
            return f"{a}.to({TL_DTYPE[ct]})" if ct is not None and ct.is_floating_point else str(a)
        if isinstance(a, float) and not math.isfinite(a):
            return self.literals[repr(a)]
        if isinstance(a, int) and ct is not None and not ct.is_floating_point and ct is not torch.bool:
            # torch wraps a Python int to the operand's dtype (int8 & 0xFF is int8 & -1); Triton
            # refuses a literal out of the dtype's range when it compiles for a GPU
            bits = torch.iinfo(ct).bits
            a &= (1 << bits) - 1
            if torch.iinfo(ct).min < 0 and a >= 1 << (bits - 1):
                a -= 1 << bits
        return repr(a)

    def rounded(self, val: str, half: torch.dtype) -> str:
        """`val` rounded to the half type, as torch rounds each op's result, still float32."""
        return f"_round_to_bf16({val})" if half == torch.bfloat16 else f"{val}.to(tl.float16).to(tl.float32)"

    def number_value(self, expr: str) -> str:
        return f"tl.full([], {expr}, tl.float32)"     # (the interpreter passes a Python float)

    def define(self, var: str, expr: str, dt: torch.dtype, half: torch.dtype | None) -> list[str]:
        return [f"{var} = {expr}"] + ([f"{var} = {self.rounded(var, half)}"] if half else [])

    def form(self, b: BoundSymbol, ct: torch.dtype, ops: list, lines: list) -> str:
        p = prim_of(b)
        template = small_power(b) or self.lang.exprs[p]
        if not self.interpret and ct == torch.float32 and p in COMPILED_F32:
            template = COMPILED_F32[p]
        return template.format(*ops, t=TL_DTYPE[ct])

    def reduce_input(self, b: BoundSymbol) -> tuple[str, torch.dtype, str]:
        """The reduced value in its accumulation dtype, that dtype, and the masked lanes' value."""
        p, out = prim_of(b), b.outputs()[0]
        expr, dt = self.values[b.args[0].name]
        ct = held(out.dtype)
        if dt != ct:
            expr = self.cast(expr, ct)
        neutral = self.lang.identity_literal(p, ct)
        return expr, ct, neutral

    def reduce(self, p: Prim, tile: str, ct: torch.dtype, nan: str | None) -> str:
        """The per-row reduction of a [ROWS, BLOCK] tile, NaN where `nan` (a tile of 0/1) has a 1."""
        val = self.fresh()
        self.emit(f"{val} = {REDUCE[p]}({tile}, axis=1, keep_dims=True)")
        if nan is not None:
            self.emit(f"{val} = tl.where(tl.max({nan}, axis=1, keep_dims=True) > 0, float('nan'), {val})")
        return val

    def new_tile(self, p: Prim, ct: torch.dtype, tile: str, flag: str) -> tuple[str, str | None]:
        """`tile` (`{neutral}` in it: the identity of the reduction `p`) as a new value, and where
        `p` propagates NaN (torch's max/min of floats), `flag` (`{0}`: that value) as a new one."""
        val, nan = self.fresh(), None
        self.emit(f"{val} = {tile.format(neutral=self.lang.identity_literal(p, ct))}")
        if p is not Prim.SUM and ct.is_floating_point:
            nan = self.fresh()
            self.emit(f"{nan} = {flag.format(val)}")
        return val, nan

    def emit_bsym(self, b: BoundSymbol) -> None:
        p = prim_of(b)
        out = b.outputs()[0]
        if p in REDUCE:   # the whole row is in the tile
            expr, ct, neutral = self.reduce_input(b)
            nan = None
            if p is not Prim.SUM and ct.is_floating_point:   # torch's max/min propagate NaN
                nan = self.fresh()
                self.emit(f"{nan} = tl.where(mask, tl.where({expr} != {expr}, 1, 0), 0)")
            self.finish(out, self.reduce(p, f"tl.where(mask, {expr}, {neutral})", ct, nan), ct)
            return
        lines: list[str] = []
        self.compute(b, self.values, lines)
        for line in lines:
            self.emit(line)

    def finish(self, out: TensorVar, val: str, ct: torch.dtype) -> None:
        if out.dtype in HALF:
            self.emit(f"{val} = {self.rounded(val, out.dtype)}")
            ct = torch.float32
        self.values[out.name] = (val, ct)

    def single_pass(self, outputs: list) -> None:
        for k, v in enumerate(self.r.inputs):
            if isinstance(v, TensorVar):
                self.load(k, v)
        for b in self.r.bsyms:
            self.emit_bsym(b)
        for k, v in outputs:
            self.store(k, v)

    def row_prims(self) -> None:
        """Every per-row prim whose operands are all computed, in order."""
        for b in self.r.bsyms:
            out = b.outputs()[0].name
            if out in self.r.row_vars and out not in self.values and prim_of(b) not in REDUCE and all(
                    v.name in self.values for v in b.inputs() if isinstance(v, TensorVar)):
                self.emit_bsym(b)
