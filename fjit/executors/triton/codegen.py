"""Region -> Triton kernel source.

The kernel reads like Triton's vector-add tutorial: program id, offsets, mask, loads, compute,
stores (each tile's code: tiles.py).  Shapes and strides are literals, or int64 parameters sz0, sz1, ... (runtime_sizes.py), so
the source itself is the cache key: identical regions over identical layouts share one kernel.  Half-precision values are
computed in float32 and rounded after every op, as torch's eager kernels round each op's result.

A region with reductions is a tile of ROWS rows x BLOCK columns: persistent (the whole row in one
tile), looped over the row, or split in two kernels (plan.py has the table).  Per-row values are
[ROWS, 1] tensors, so they broadcast against the tile as torch broadcasts a keepdim result.

The expressions (libdevice on a GPU, precise `tl.*` forms under the interpreter) are language.py's.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import prim_of
from fjit.executors.render import held
from fjit.executors.triton.language import (ACCUMULATE, HELPERS, INTERPRETER_HELPERS,
                                            PTR_TYPE, SCALAR_TYPE, TL_DTYPE, supported)
from fjit.executors.triton.plan import Kernel
from fjit.executors.triton.tiles import TileEmitter
from fjit.passes.fusion import Region

__all__ = ["Kernel", "generate", "supported", "TL_DTYPE"]


class TritonEmitter(TileEmitter):
    """A region's Triton kernel(s): its tiles in one pass, in loops over the row, or split."""

    # -- the kernel ------------------------------------------------------------------------------
    def generate(self, name: str, sizes: list[int] = ()) -> Kernel:
        """The kernel(s); `sizes` are the values of the region's runtime sizes sz0, sz1, ... (its
        Sizes, fjit/executors/runtime_sizes.py), int64 parameters of every stage."""
        r, pl = self.r, self.plan
        self.sizes = list(sizes)
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
        for k in range(len(self.sizes)):
            params.append(f"sz{k}")
            signature[f"sz{k}"] = "i64"
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
                        {**signature, **{c: "constexpr" for c in constexprs}}, constexprs, pl.mode,
                        sizes=self.sizes)
        if second is not None:
            second.source = source
            kernel.second = second
            kernel.workspaces = [(self.rows * pl.segments, ct) for _, ct in partials]
        return kernel

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
            acc, nan = self.new_tile(p, ct, f"tl.full([ROWS, BLOCK], {{neutral}}, {TL_DTYPE[ct]})",
                                     "tl.zeros([ROWS, BLOCK], tl.int32)")
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
            part, nan = self.new_tile(p, ct, f"tl.load(ws{j} + r * {pl.segments} + s, mask=mask, other={{neutral}})",
                                      "tl.where({0} != {0}, 1, 0)")
            self.finish(b.outputs()[0], self.reduce(p, part, ct, nan), ct)
        self.row_prims()
        for k, v in outputs:
            if v.name in r.row_vars:
                params.append(f"out{k}")
                signature[f"out{k}"] = "*" + PTR_TYPE[v.dtype]
                self.store(k, v)
        for k in range(len(self.sizes)):
            params.append(f"sz{k}")
            signature[f"sz{k}"] = "i64"
        constexprs = {"BLOCK": pl.finish_block, "ROWS": 1}
        head = f"@triton.jit\ndef {name}_finish({', '.join(params + ['BLOCK: tl.constexpr', 'ROWS: tl.constexpr'])}):"
        source = f"{head}\n" + "\n".join(self.lines) + "\n"
        return Kernel(f"{name}_finish", source, (self.rows,), pl.finish_block, pl.finish_warps, literals,
                      params, {**signature, "BLOCK": "constexpr", "ROWS": "constexpr"}, constexprs,
                      "split-finish")


def generate(region: Region, name: str, interpret: bool, sizes: list[int] = ()) -> Kernel:
    return TritonEmitter(region, interpret).generate(name, sizes)
