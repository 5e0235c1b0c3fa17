"""How a C kernel's reductions accumulate.

A row reduction (a reduction over a region's inner dims) keeps LANES partial accumulators per row,
in the dtype below (float sums and products in double, a float32 sum first in float lanes: see
codegen.py); `accumulator` declares one, `accumulate` adds a value into it.

A column sum (a sum over a region's outer dims: a bias's or a norm weight's gradient, summed over
the batch and sequence dims of the value the region computes anyway) cuts the rows into CHUNKS
fixed ranges (one when the kernel is not threaded); each range adds its rows' values into a
double accumulator per column of its own, and after the loop over the ranges the accumulators are
added in range order and rounded once.  The ranges depend only on the shapes, so a result never
depends on the thread count.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol
from fjit.core.prims import Prim, prim_of
from fjit.executors.c.language import C_TYPE
from fjit.executors.render import held

# Row ranges of a threaded kernel with column sums (the work a thread pool shares).
CHUNKS = 16


class ColumnSums:
    """The column sums of one region: their accumulators, the wrap of the row loop, the stores."""

    def __init__(self, region, threaded: bool):
        self.sums = [b for b in region.bsyms if b.outputs()[0].name in region.columns]
        self.names = {b.outputs()[0].name for b in self.sums}
        self.width = math.prod(region.inner)
        self.rows = math.prod(region.outer)
        self.chunks = min(self.rows, CHUNKS) if threaded else 1

    def accumulate(self, upto: int, level: dict, values: dict) -> list[str]:
        """In a pass over a row's elements: the values summed that this pass computes, added."""
        return [f"fj_col{j}[c] += {values[b.args[0].name][0]};" for j, b in enumerate(self.sums)
                if level[b.args[0].name] == upto]

    def wrap(self, row_lines: list[str]) -> tuple[list[str], list[str]]:
        """(the accumulators' allocation, the loop over row ranges with `row_lines` per row)."""
        w, n, per = self.width, self.chunks, -(-self.rows // self.chunks)
        before = [f"double *fj_all{j} = (double *)calloc({n * w}, sizeof(double));"
                  for j in range(len(self.sums))]
        loop = [f"for (int64_t ch = 0; ch < {n}; ch++) {{"]
        loop += [f"    double *fj_col{j} = fj_all{j} + ch * {w};" for j in range(len(self.sums))]
        loop += [f"    for (int64_t r = ch * {per}; r < (ch + 1) * {per} && r < {self.rows}; r++) {{"]
        loop += ["        " + x if not x.startswith("#") else x for x in row_lines]
        loop += ["    }", "}"]
        return before, loop

    def stores(self, outputs: list) -> list[str]:
        """After the loop: each column's accumulators added in range order, rounded, stored."""
        lines = []
        position = {v.name: k for k, v in enumerate(outputs)}
        for j, b in enumerate(self.sums):
            out = b.outputs()[0]
            ctype = C_TYPE[out.dtype]
            lines += [f"for (int64_t c = 0; c < {self.width}; c++) {{",
                      "    double s = 0;",
                      f"    for (int64_t ch = 0; ch < {self.chunks}; ch++) s += fj_all{j}[ch * {self.width} + c];"]
            if out.name in position:
                lines.append(f"    out{position[out.name]}[c] = ({ctype})s;")
            lines += ["}", f"free(fj_all{j});"]
        return lines


def float_lanes(b: BoundSymbol) -> bool:
    """A sum of float32 values (float16/bfloat16 ones are held as float32): float lanes."""
    return prim_of(b) is Prim.SUM and held(b.args[0].dtype) == torch.float32


def accumulator(b: BoundSymbol, lang) -> tuple[str, str]:
    """(the C type, the identity literal) of the row reduction `b`'s accumulators."""
    p, o = prim_of(b), b.outputs()[0]
    if p in (Prim.SUM, Prim.PROD):      # float sums and products accumulate in double
        ctype = "double" if o.dtype.is_floating_point else "int64_t"
    else:
        ctype = C_TYPE[held(o.dtype)]
    return ctype, lang.identity_literal(p, o.dtype)


def accumulate(b: BoundSymbol, acc: str, value: str) -> str:
    p = prim_of(b)
    if p is Prim.SUM:
        return f"{acc} += {value};"
    if p is Prim.PROD:
        return f"{acc} *= {value};"
    return f"{acc} = {'FJ_MAX' if p is Prim.AMAX else 'FJ_MIN'}({acc}, {value});"
