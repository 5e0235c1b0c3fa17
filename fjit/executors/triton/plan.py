"""How a region's kernel is shaped before a line of it is written: the launch strategy (tile sizes,
warps, a loop over the row or not, a two-stage split, softmax's sums computed online), offsets'
width, and the Kernel that describes the launch.

Strategies for a region with reductions, a row of `width` elements per row (`rows` of them):

| row (next power of two) | strategy | tile | warps |
|---|---|---|---|
| <= PERSISTENT_MAX | persistent: one pass, the row tile held in registers; several short rows per program (up to TILE elements) | ROWS x BLOCK | by tile (WARPS) |
| > PERSISTENT_MAX | looped: one loop over the row per level of reductions (a value reduced from values that need an earlier reduction waits for it; softmax's sum of exp(y - max) runs with its max, online), then one loop for the outputs | 1 x LOOP_BLOCK | 8 |
| > PERSISTENT_MAX, few rows, one level of sum/max/min, row outputs only | split: (rows, S) programs reduce a segment each into a workspace, a second kernel combines the S partials per row | 1 x LOOP_BLOCK, then 1 x S | 8, then by S |

A persistent tile of up to PERSISTENT_MAX elements at 16 warps holds 16 elements of each live
value per thread: no register spills for the programs the tests sweep (tests/executors/test_gpu_compile.py
compiles them for sm_90 and sm_80 and checks ptxas's report).

Index arithmetic (render.collapse): a tensor's offset is the sum of its strides times the indices
of the dims of the iteration domain; dims that every tensor walks contiguously together (stride[j] == stride[j+1] *
size[j+1], broadcast dims having stride 0 on both) collapse into one, and size-1 dims vanish, so a
contiguous region indexes as 1-D: `in0 + c`, with no div/mod chain.  Offsets are int32 (Triton's
program ids and aranges) unless some tensor spans 2^31 elements or more.
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fjit.core.ir import TensorVar
from fjit.core.prims import Prim, prim_of

PERSISTENT_MAX = 8192     # largest row tile (elements) one program holds in registers
TILE = 2048               # elements per program for short rows: several rows per program
LOOP_BLOCK = 2048         # elements per iteration of a looped row (8 per thread at 8 warps)
LOOP_WARPS = 8
SPLIT_MAX_ROWS = 64       # a looped region with fewer rows than this may be split
SPLIT_PROGRAMS = 512      # about this many programs for a split reduction's first stage
ELEMENTWISE_BLOCK = 1024  # elements per program of an elementwise kernel (4096 for huge ones)
WARPS = ((256, 1), (1024, 2), (2048, 4), (4096, 8))   # (tile elements up to, warps); 16 above
INT32_LIMIT = 2**31


@dataclasses.dataclass
class Kernel:
    name: str
    source: str
    grid: tuple
    block: int
    num_warps: int
    scalar_args: list      # non-finite literals (k<j>), in kernel-argument order
    params: list           # argument names before the constexprs: in<k>/s<k> (region input k),
    #                        k<j> (literal j), out<k> (region output k), ws<j> (workspace j)
    signature: dict = dataclasses.field(default_factory=dict)   # argument -> Triton type
    constexprs: dict = dataclasses.field(default_factory=dict)  # constexpr argument -> value
    mode: str = "elementwise"
    second: "Kernel | None" = None   # a split reduction's second stage
    workspaces: list = dataclasses.field(default_factory=list)   # (numel, dtype) of ws<j>
    sizes: list = dataclasses.field(default_factory=list)   # values of its runtime sizes sz<k>

    def stages(self) -> list:
        """The kernels one launch of the region runs, in order."""
        return [self] + ([self.second] if self.second is not None else [])


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


def needs_int64(tensors: list, domain: tuple) -> bool:
    """Whether some offset can reach 2^31: a tensor spanning that many elements, or the domain."""
    if math.prod(domain) >= INT32_LIMIT:
        return True
    for v in tensors:
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(v.shape, v.strides))
        if max(span, math.prod(v.shape)) >= INT32_LIMIT:
            return True
    return False


def online_sums(region, reductions: list, level: dict) -> dict:
    """sum(exp(y - amax(y))) reductions (softmax's), as id(sum) -> the amax: a looped kernel
    computes both in one pass (the online softmax: the running sum is rescaled whenever the
    running max grows)."""
    producer = {b.outputs()[0].name: b for b in region.bsyms}
    pairs = {}
    for b in reductions:
        e = producer.get(b.args[0].name)
        d = producer.get(e.args[0].name) if e is not None and prim_of(e) is Prim.EXP else None
        if d is None or prim_of(d) is not Prim.SUB or not all(isinstance(a, TensorVar) for a in d.args):
            continue
        m = producer.get(d.args[1].name)
        if prim_of(b) is not Prim.SUM or m is None or prim_of(m) is not Prim.AMAX:
            continue
        values = (b.outputs()[0], e.outputs()[0], d.outputs()[0], m.outputs()[0])
        if m.args[0].name == d.args[0].name and level.get(d.args[0].name, 0) == 0 and all(
                v.dtype in (torch.float32, torch.float64) and v.dtype == values[0].dtype for v in values):
            pairs[id(b)] = m
    return pairs
