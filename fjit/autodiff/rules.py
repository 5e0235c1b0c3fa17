"""The VJP rules of the compiled backward, as JAX's `ad.primitive_transposes[p] = rule`: read from
the prim blocks (fjit/core/prims/, where each prim's rule is written beside its row), plus `fit`,
which turns a rule's contribution into an operand's cotangent, and `Pieces`, which holds the
cotangents of a value's slices apart until the value's own cotangent is read.

A rule gets the forward bound symbol, the cotangent of its output and `value(var)` (a proxy for a
forward value: saved by the forward or recomputed in the backward, as joint.py decides by
recompute.py's policy), and returns `[(forward var, its cotangent contribution), ...]`
(core/prims/toolkit.py says more).  The caller reduces broadcast dims and casts to each operand's
dtype (`fit`), and sums contributions.

Prims in NONDIFF have no cotangent flowing through them (integer or bool results, factories,
rounding: torch's gradient there is zero or undefined).  A prim in neither table keeps torch autograd
for the torch-level op it belongs to (joint.py records that op with torch and calls
torch.autograd.grad in the backward): correct, just not fused; its block's note says why it has no
rule.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

from fjit.core.ir import TensorVar
from fjit.core.prims import ROWS, Prim, apply
from fjit.core.prims.layout import pad_back
from fjit.core.symbolic import is_one

VJP: dict = {p: b.vjp for p, b in ROWS.items() if b.vjp is not None}
NONDIFF = frozenset(p for p, b in ROWS.items() if b.nondiff)


def has_rule(p: Prim | None) -> bool:
    return p in VJP or p in NONDIFF


def fit(g, var: TensorVar, shape: tuple):
    """The contribution `g` to var's cotangent, summed over the dims var was broadcast along and
    typed as var.  `shape` is the value g stands for: g may be that value lazily broadcast (size-1
    or missing dims: cotangents stay so until a rule needs the full shape, see `full`, so the
    elementwise work on them fuses; an expand is a view the partitioner does not take).  A sum
    over a dim g only broadcasts along is a multiplication by its size."""
    shape, target = tuple(shape), tuple(var.shape)
    lead = len(shape) - len(target)
    factor = 1
    offset = len(shape) - g.ndim          # g's dim j is shape's dim j + offset
    factor *= math.prod(shape[:max(0, min(lead, offset))])
    dims = tuple(j for j in range(g.ndim) if j + offset < lead)
    if dims:
        factor *= math.prod(shape[j + offset] for j in dims if is_one(g.shape[j]))
        g = apply(Prim.SUM, g, dims, False)
    offset = len(target) - g.ndim         # now g's dim j is target's dim j + offset
    summed = []
    for i, size in enumerate(target):
        if not is_one(size) or is_one(shape[lead + i]):
            continue
        j = i - offset
        if j >= 0 and not is_one(g.shape[j]):
            summed.append(j)
        else:
            factor *= shape[lead + i]
    if summed:
        g = apply(Prim.SUM, g, tuple(summed), True)
    if factor != 1:
        g = apply(Prim.MUL, g, factor)
    return apply(Prim.CONVERT, g, var.dtype) if g.dtype != var.dtype else g


@dataclasses.dataclass
class Pieces:
    """A cotangent still held as its parts: `dense` (a sum of whole contributions, or None) and the
    cotangents of basic indexes of the value, each with undo_index's (shape, pads).  The slices a
    split or a rotate-half takes come back as one cat, not a zero-padded copy each and a sum."""

    var: TensorVar
    dense: Any
    pieces: list

    def add(self, g, undo) -> "Pieces":
        if undo is not None:
            self.pieces.append((g, undo))
        else:
            self.dense = g if self.dense is None else apply(Prim.ADD, self.dense, g)
        return self

    def join(self):
        joined = self._cat()
        if joined is not None:
            return joined if self.dense is None else apply(Prim.ADD, self.dense, joined)
        total = self.dense
        for g, undo in self.pieces:
            g = pad_back(g, *undo)
            total = g if total is None else apply(Prim.ADD, total, g)
        return total

    def _cat(self):
        """The pieces as one cat along the one dim they cut (zeros in the gaps), where they cut
        the same dim into disjoint ranges; else None."""
        if len(self.pieces) < 2:
            return None
        shape = tuple(self.var.shape)
        rank = len(shape)

        def cut(pads, d):       # F.pad's amounts run last dim first: (left, right) of dim d
            return pads[2 * (rank - 1 - d)], pads[2 * (rank - 1 - d) + 1]
        dims = {d for _, (_, pads) in self.pieces for d in range(rank) if any(cut(pads, d))}
        if len(dims) != 1:
            return None
        d = dims.pop()
        ranges = sorted(((cut(pads, d)[0], shape[d] - cut(pads, d)[1], g, to)
                         for g, (to, pads) in self.pieces), key=lambda r: r[:2])
        zeros = lambda n: apply(Prim.FULL, shape[:d] + (n,) + shape[d + 1:], 0,  # noqa: E731
                                dtype=self.var.dtype, device=self.var.device)
        parts, at = [], 0
        for start, stop, g, to in ranges:
            if start < at:
                return None                     # overlapping slices: summed as pads
            if start > at:
                parts.append(zeros(start - at))
            parts.append(apply(Prim.RESHAPE, g, to) if tuple(g.shape) != to else g)
            at = stop
        if at < shape[d]:
            parts.append(zeros(shape[d] - at))
        return apply(Prim.CAT, parts, d)
