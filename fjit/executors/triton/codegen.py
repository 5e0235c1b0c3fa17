"""Region -> Triton kernel source.

The kernel reads like Triton's vector-add tutorial: program id, offsets, mask, loads, compute,
stores.  Shapes and strides are literals (a trace is specialized to them), so the source itself is
the cache key: identical regions over identical layouts share one kernel.  Half-precision values are
computed in float32 and rounded after every op, as torch's eager kernels round each op's result.

A region with reductions is a tile of ROWS rows x BLOCK columns: persistent (the whole row in one
tile), looped over the row, or split in two kernels (plan.py has the table).  Per-row values are
[ROWS, 1] tensors, so they broadcast against the tile as torch broadcasts a keepdim result.

The expressions (libdevice on a GPU, precise `tl.*` forms under the interpreter) are lowering.py's.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import Prim, prim_of
from fjit.executors import render
from fjit.executors.render import HALF, collapse, domain_strides, held, index_decomposition, levels
from fjit.executors.triton import plan as P
from fjit.executors.triton.lowering import (ACCUMULATE, COMPILED_F32, HELPERS, INTERPRETER_HELPERS,
                                            PTR_TYPE, REDUCE, SCALAR_TYPE, TL_DTYPE, language,
                                            supported)
from fjit.executors.triton.plan import Kernel
from fjit.passes.fusion import Region

__all__ = ["Kernel", "generate", "supported", "TL_DTYPE"]

class TritonEmitter(render.RegionEmitter):
    """A region's Triton kernel(s): the shared walk in tiles (see the module docstring)."""

    def __init__(self, region: Region, interpret: bool):
        super().__init__(region)
        self.interpret = interpret
        self.lang = language(interpret)
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

    def define(self, var: str, expr: str, dt: torch.dtype, half: torch.dtype | None) -> list[str]:
        return [f"{var} = {expr}"] + ([f"{var} = {self.rounded(var, half)}"] if half else [])

    def form(self, b: BoundSymbol, ct: torch.dtype, ops: list, lines: list) -> str:
        p = prim_of(b)
        template = self.lang.exprs[p]
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

    # -- the kernel ------------------------------------------------------------------------------
    def generate(self, name: str) -> Kernel:
        r, pl = self.r, self.plan
        params, signature = [], {}
        for k, v in enumerate(r.inputs):
            if isinstance(v, NumberVar):
                params.append(f"s{k}")
                signature[f"s{k}"] = SCALAR_TYPE[v.pytype]
                self.values[v.name] = (f"s{k}", torch.float32)
            else:
                params.append(f"in{k}")
                signature[f"in{k}"] = "*" + PTR_TYPE[v.dtype]
        literals = []
        for b in r.bsyms:
            for a in b.args:
                if isinstance(a, float) and not math.isfinite(a) and repr(a) not in self.literals:
                    self.literals[repr(a)] = f"k{len(literals)}"
                    literals.append(a)
        for j in range(len(literals)):
            params.append(f"k{j}")
            signature[f"k{j}"] = "fp32"
        outputs = list(enumerate(r.outputs))
        split = pl.mode == "split"
        for k, v in outputs:
            if not (split and v.name in r.row_vars):
                params.append(f"out{k}")
                signature[f"out{k}"] = "*" + PTR_TYPE[v.dtype]
        constexprs = {"BLOCK": pl.block}
        if pl.mode == "elementwise":
            self.emit_columns(f"{self.pid(0)} * BLOCK")
            self.single_pass(outputs)
        elif pl.mode == "persistent":
            constexprs["ROWS"] = pl.rows_per_program
            self.emit_rows()
            self.emit_columns(None)
            self.single_pass(outputs)
        elif pl.mode == "looped":
            constexprs["ROWS"] = 1
            self.emit_rows()
            self.looped(outputs)
        else:
            constexprs["ROWS"] = 1
            self.emit_rows()
            partials = self.split_first(outputs)
            for j, (_, ct) in enumerate(partials):
                params.append(f"ws{j}")
                signature[f"ws{j}"] = "*" + PTR_TYPE[ct]
        first_lines = self.lines
        second = None
        if split:
            second = self.split_second(name, partials, literals, outputs)
        head = f"@triton.jit\ndef {name}({', '.join(params + [f'{c}: tl.constexpr' for c in constexprs])}):"
        prelude = "import triton\nimport triton.language as tl\n"
        if not self.interpret:
            prelude += "from triton.language.extra import libdevice\n"
        helpers = HELPERS + (INTERPRETER_HELPERS if self.interpret else "")
        body = f"{head}\n" + "\n".join(first_lines) + "\n"
        if second is not None:
            body += "\n\n" + second.source
        source = f"{prelude}{helpers}\n\n{body}"
        kernel = Kernel(name, source, pl.grid, pl.block, pl.num_warps, literals, params,
                        {**signature, **{c: "constexpr" for c in constexprs}}, constexprs, pl.mode)
        if second is not None:
            second.source = source
            kernel.second = second
            kernel.workspaces = [(self.rows * pl.segments, ct) for _, ct in partials]
        return kernel

    def single_pass(self, outputs: list) -> None:
        for k, v in enumerate(self.r.inputs):
            if isinstance(v, TensorVar):
                self.load(k, v)
        for b in self.r.bsyms:
            self.emit_bsym(b)
        for k, v in outputs:
            self.store(k, v)

    def closure(self, names: list) -> tuple[set, set]:
        """The domain prims (ids) and region inputs (names) that computing `names` needs, given
        the per-row values already computed."""
        producer = {b.outputs()[0].name: b for b in self.r.bsyms}
        bsyms, inputs, stack = set(), set(), list(names)
        while stack:
            n = stack.pop()
            if n in self.r.row_vars or n in inputs or (n in producer and id(producer[n]) in bsyms):
                continue
            if n in producer:
                bsyms.add(id(producer[n]))
                stack.extend(v.name for v in producer[n].inputs() if isinstance(v, (TensorVar, NumberVar)))
            else:
                inputs.add(n)
        return bsyms, inputs

    def loop_pass(self, reds: list, outputs: list, count: int, start: str) -> list:
        """One loop over the row: accumulate the reductions `reds`, store `outputs`; the
        accumulators (acc, nan flags or None, dtype) of each reduction."""
        online = {id(self.online[id(b)]) for b in reds if id(b) in self.online}   # their maxes
        bsyms, inputs = self.closure([self.online[id(b)].args[0].name if id(b) in self.online else b.args[0].name
                                      for b in reds] + [v.name for _, v in outputs])
        accs = []
        for b in reds:
            p, out = prim_of(b), b.outputs()[0]
            ct = held(out.dtype)
            neutral = self.lang.identity_literal(p, ct)
            acc, nan = self.fresh(), None
            self.emit(f"{acc} = tl.full([ROWS, BLOCK], {neutral}, {TL_DTYPE[ct]})")
            if p is not Prim.SUM and ct.is_floating_point:
                nan = self.fresh()
                self.emit(f"{nan} = tl.zeros([ROWS, BLOCK], tl.int32)")
            accs.append((acc, nan, ct))
        before = dict(self.values)
        self.emit(f"for k in range(0, {count}, BLOCK):")
        self.depth += 1
        self.emit_columns(start)
        for k, v in enumerate(self.r.inputs):
            if v.name in inputs and isinstance(v, TensorVar):
                self.load(k, v)
        for b in self.r.bsyms:
            if id(b) in bsyms:
                self.emit_bsym(b)
        running = {}   # id(amax) -> its accumulator, for the online sums
        for b, (acc, nan, _) in zip(reds, accs):
            if id(b) in self.online:
                self.online_update(b, acc, running[id(self.online[id(b)])])
                continue
            expr, ct, neutral = self.reduce_input(b)
            running[id(b)] = acc
            if id(b) not in online:   # an online sum's max is updated with it
                update = ACCUMULATE[prim_of(b)].format(acc=acc, x=f"tl.where(mask, {expr}, {neutral})")
                self.emit(f"{acc} = {update}")
            if nan is not None:
                self.emit(f"{nan} = tl.maximum({nan}, tl.where(mask, tl.where({expr} != {expr}, 1, 0), 0))")
        for k, v in outputs:
            self.store(k, v)
        self.depth -= 1
        self.values = before
        return accs

    def online_update(self, b: BoundSymbol, acc: str, macc: str) -> None:
        """The online softmax's step: with the new running max, rescale the running sum of
        exp(y - max) and add this tile's terms (lanes still at -inf add nothing)."""
        y, _, _ = self.reduce_input(self.online[id(b)])
        x, m = self.fresh(), self.fresh()
        self.emit(f"{x} = tl.where(mask, {y}, -float('inf'))")
        self.emit(f"{m} = tl.maximum({macc}, {x})")
        self.emit(f"{acc} = {acc} * tl.where({m} == -float('inf'), 0, tl.exp({macc} - {m})) + "
                  f"tl.where({m} == -float('inf'), 0, tl.exp({x} - {m}))")
        self.emit(f"{macc} = {m}")

    def online_total(self, b: BoundSymbol, acc: str, macc: str) -> str:
        """An online sum's row total: each lane's sum rescaled to the row's max."""
        val, (m, _) = self.fresh(), self.values[self.online[id(b)].outputs()[0].name]
        self.emit(f"{val} = tl.sum({acc} * tl.where({macc} == -float('inf'), 0, tl.exp({macc} - {m})), "
                  "axis=1, keep_dims=True)")
        return val

    def row_prims(self) -> None:
        """Every per-row prim whose operands are all computed, in order."""
        for b in self.r.bsyms:
            out = b.outputs()[0].name
            if out in self.r.row_vars and out not in self.values and prim_of(b) not in REDUCE and all(
                    v.name in self.values for v in b.inputs() if isinstance(v, TensorVar)):
                self.emit_bsym(b)

    def looped(self, outputs: list) -> None:
        r = self.r
        top = max(self.level[b.outputs()[0].name] for b in self.reductions)
        domain_outs = [(k, v) for k, v in outputs if v.name not in r.row_vars]
        for level in range(1, top + 1):
            reds = [b for b in self.reductions if self.level[b.outputs()[0].name] == level]
            stores = [(k, v) for k, v in domain_outs if self.level[v.name] == level - 1]
            accs = self.loop_pass(reds, stores, self.width, "k")
            maxes = {id(b): acc for b, (acc, _, _) in zip(reds, accs)}
            for b, (acc, nan, ct) in zip(reds, accs):
                if id(b) in self.online:
                    val = self.online_total(b, acc, maxes[id(self.online[id(b)])])
                else:
                    val = self.reduce(prim_of(b), acc, ct, nan)
                self.finish(b.outputs()[0], val, ct)
            self.row_prims()
        last = [(k, v) for k, v in domain_outs if self.level[v.name] == top]
        if last:
            self.loop_pass([], last, self.width, "k")
        for k, v in outputs:
            if v.name in r.row_vars:
                self.store(k, v)

    def split_first(self, outputs: list) -> list:
        """A split reduction's first stage: each program reduces one segment of a row into the
        workspaces; [(reduction, partial dtype)]."""
        pl = self.plan
        self.emit(f"seg = {self.pid(1)}")
        stores = [(k, v) for k, v in outputs if v.name not in self.r.row_vars]
        accs = self.loop_pass(self.reductions, stores, pl.segment, f"seg * {pl.segment} + k")
        partials = []
        for j, (b, (acc, nan, ct)) in enumerate(zip(self.reductions, accs)):
            val = self.reduce(prim_of(b), acc, ct, nan)
            self.emit(f"tl.store(ws{j} + r * {pl.segments} + seg, {val}, mask=rmask)")
            partials.append((b, ct))
        return partials

    def split_second(self, name: str, partials: list, literals: list, outputs: list) -> Kernel:
        """The second stage: one program per row combines the row's partials and finishes it."""
        pl, r = self.plan, self.r
        self.lines, self.depth = [], 1
        self.values = {k: v for k, v in self.values.items() if v[0].startswith("s")}
        params = [f"s{k}" for k, v in enumerate(r.inputs) if isinstance(v, NumberVar)]
        params += [f"k{j}" for j in range(len(literals))]
        params += [f"ws{j}" for j in range(len(partials))]
        signature = {p: "fp32" for p in params if p[0] in "sk"}
        signature.update({p: SCALAR_TYPE[v.pytype] for p, v in
                          ((f"s{k}", v) for k, v in enumerate(r.inputs) if isinstance(v, NumberVar))})
        signature.update({f"ws{j}": "*" + PTR_TYPE[ct] for j, (_, ct) in enumerate(partials)})
        self.emit_rows()
        self.emit("s = tl.arange(0, BLOCK)[None, :]")
        self.emit(f"mask = rmask & (s < {pl.segments})")
        for j, (b, ct) in enumerate(partials):
            p = prim_of(b)
            neutral = self.lang.identity_literal(p, ct)
            part, nan = self.fresh(), None
            self.emit(f"{part} = tl.load(ws{j} + r * {pl.segments} + s, mask=mask, other={neutral})")
            if p is not Prim.SUM and ct.is_floating_point:
                nan = self.fresh()
                self.emit(f"{nan} = tl.where({part} != {part}, 1, 0)")
            self.finish(b.outputs()[0], self.reduce(p, part, ct, nan), ct)
        self.row_prims()
        for k, v in outputs:
            if v.name in r.row_vars:
                params.append(f"out{k}")
                signature[f"out{k}"] = "*" + PTR_TYPE[v.dtype]
                self.store(k, v)
        constexprs = {"BLOCK": pl.finish_block, "ROWS": 1}
        head = f"@triton.jit\ndef {name}_finish({', '.join(params + ['BLOCK: tl.constexpr', 'ROWS: tl.constexpr'])}):"
        source = f"{head}\n" + "\n".join(self.lines) + "\n"
        return Kernel(f"{name}_finish", source, (self.rows,), pl.finish_block, pl.finish_warps, literals,
                      params, {**signature, "BLOCK": "constexpr", "ROWS": "constexpr"}, constexprs,
                      "split-finish")


def generate(region: Region, name: str, interpret: bool) -> Kernel:
    return TritonEmitter(region, interpret).generate(name)
