"""How a region's kernel is shaped before a line of it is written: the launch strategy (tile sizes,
warps, a loop over the row or not, a two-stage split) and the index arithmetic (collapsed dims).

Strategies for a region with reductions, a row of `width` elements per row (`rows` of them):

| row (next power of two) | strategy | tile | warps |
|---|---|---|---|
| <= PERSISTENT_MAX | persistent: one pass, the row tile held in registers; several short rows per program (up to TILE elements) | ROWS x BLOCK | by tile (WARPS) |
| > PERSISTENT_MAX | looped: one loop over the row per level of reductions (a value reduced from values that need an earlier reduction waits for it; softmax's sum of exp(y - max) runs with its max, online), then one loop for the outputs | 1 x LOOP_BLOCK | 8 |
| > PERSISTENT_MAX, few rows, one level of sum/max/min, row outputs only | split: (rows, S) programs reduce a segment each into a workspace, a second kernel combines the S partials per row | 1 x LOOP_BLOCK, then 1 x S | 8, then by S |

A persistent tile of up to PERSISTENT_MAX elements at 16 warps holds 16 elements of each live
value per thread: no register spills for the programs the tests sweep (tests/test_gpu_compile.py
compiles them for sm_90 and sm_80 and checks ptxas's report).

Index arithmetic: a tensor's offset is the sum of its strides times the indices of the dims of the
iteration domain; dims that every tensor walks contiguously together (stride[j] == stride[j+1] *
size[j+1], broadcast dims having stride 0 on both) collapse into one, and size-1 dims vanish, so a
contiguous region indexes as 1-D: `in0 + c`, with no div/mod chain.  Offsets are int32 (Triton's
program ids and aranges) unless some tensor spans 2^31 elements or more.
"""
from __future__ import annotations

import dataclasses
import math

from fjit.core.ir import TensorVar

PERSISTENT_MAX = 8192     # largest row tile (elements) one program holds in registers
TILE = 2048               # elements per program for short rows: several rows per program
LOOP_BLOCK = 2048         # elements per iteration of a looped row (8 per thread at 8 warps)
LOOP_WARPS = 8
SPLIT_MAX_ROWS = 64       # a looped region with fewer rows than this may be split
SPLIT_PROGRAMS = 512      # about this many programs for a split reduction's first stage
ELEMENTWISE_BLOCK = 1024  # elements per program of an elementwise kernel (4096 for huge ones)
WARPS = ((256, 1), (1024, 2), (2048, 4), (4096, 8))   # (tile elements up to, warps); 16 above
INT32_LIMIT = 2**31


def pow2ceil(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def warps_for(tile: int) -> int:
    return next((w for limit, w in WARPS if tile <= limit), 16)


@dataclasses.dataclass(frozen=True)
class Plan:
    mode: str          # "elementwise", "persistent", "looped" or "split"
    rows: int          # rows of the domain (1 for an elementwise region)
    width: int         # elements per row (the whole domain for an elementwise region)
    block: int         # BLOCK: elements of a row per tile (per iteration when looped)
    rows_per_program: int
    num_warps: int
    grid: tuple
    segments: int = 1          # split: programs per row in the first stage
    segment: int = 0           # split: elements of a row per first-stage program
    finish_block: int = 1      # split: BLOCK of the second stage (segments, rounded up)
    finish_warps: int = 1


def plan(rows: int, width: int, reduction: bool, splittable: bool, interpret: bool) -> Plan:
    """The launch strategy of a region (see the table above)."""
    if not reduction:
        cap = ELEMENTWISE_BLOCK if width < 1 << 22 else 4 * ELEMENTWISE_BLOCK
        block = min(pow2ceil(width), 1 << 16 if interpret else cap)
        warps = max(1, min(16, block // 256))    # 8 elements per thread: long math chains fit
        return Plan("elementwise", 1, width, block, 1, warps, (-(-width // block),))
    b = pow2ceil(width)
    if b <= PERSISTENT_MAX:
        per = 1
        while per * 2 * b <= TILE and per * 2 * 256 <= rows:   # keep >= 256 programs on big inputs
            per *= 2
        if interpret:   # the interpreter pays per program: as many rows as fit the tile
            per = max(per, min(TILE // b, pow2ceil(rows)))
        return Plan("persistent", rows, width, b, per, warps_for(per * b), (-(-rows // per),))
    if splittable and rows < SPLIT_MAX_ROWS and width > 2 * LOOP_BLOCK:
        segments = min(-(-width // LOOP_BLOCK), max(2, SPLIT_PROGRAMS // rows))
        segment = -(-(-(-width // segments)) // LOOP_BLOCK) * LOOP_BLOCK
        segments = -(-width // segment)
        fb = pow2ceil(segments)
        return Plan("split", rows, width, LOOP_BLOCK, 1, LOOP_WARPS, (rows, segments),
                    segments, segment, fb, warps_for(fb))
    return Plan("looped", rows, width, LOOP_BLOCK, 1, LOOP_WARPS, (rows,))


def domain_strides(v: TensorVar, domain: tuple, n_outer: int, row: bool) -> tuple:
    """v's stride along each dim of `domain` (0 where it broadcasts); a per-row value (`row`)
    has its row dims' strides and 0 along the row."""
    out = []
    for j in range(len(domain)):
        if row:
            t = j if j < n_outer and j < len(v.shape) else -1
        else:
            t = j - (len(domain) - len(v.shape))
        out.append(0 if t < 0 or v.shape[t] == 1 else v.strides[t])
    return tuple(out)


def collapse(sizes: tuple, strides: dict) -> tuple[tuple, dict]:
    """`sizes` with size-1 dims dropped and adjacent dims merged wherever every tensor's strides
    (name -> one stride per dim) allow; the strides along the merged dims."""
    dims = [(s, {k: st[j] for k, st in strides.items()}) for j, s in enumerate(sizes) if s != 1]
    merged: list = []
    for size, st in dims:
        if merged and all(merged[-1][1][k] == st[k] * size for k in st):
            merged[-1] = (merged[-1][0] * size, st)
        else:
            merged.append((size, st))
    return tuple(s for s, _ in merged), {k: tuple(st[k] for _, st in merged) for k in strides}


def needs_int64(tensors: list, domain: tuple) -> bool:
    """Whether some offset can reach 2^31: a tensor spanning that many elements, or the domain."""
    if math.prod(domain) >= INT32_LIMIT:
        return True
    for v in tensors:
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(v.shape, v.strides))
        if max(span, math.prod(v.shape)) >= INT32_LIMIT:
            return True
    return False
