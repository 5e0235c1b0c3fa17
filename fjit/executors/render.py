"""What the C and Triton kernel generators share: one C-style renderer of a region's math.

Each language's expression table is read from the prim blocks (fjit/core/prims/), where an
expression both languages write alike (`({0} + {1})`) is written once: C calls libm (`exp{f}` with
`f` the float suffix), Triton calls `tl.*`.  One `supported`, one index-term
builder, one table of reduction identities.  What really differs stays in each generator: the
loop nest against the block, half-precision storage, NaN propagation in reductions.

An expression's operands arrive already converted to the prim's computation dtype (half types
computed in float32, as torch's kernels compute them).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import REDUCTIONS, ROWS, Domain, Prim, computation_dtype, prim_of

HALF = (torch.float16, torch.bfloat16)

@dataclasses.dataclass(frozen=True)
class Language:
    name: str
    exprs: dict                     # prim -> expression template
    dtypes: frozenset               # tensor dtypes its kernels read and write
    reductions: frozenset           # reduction prims it emits
    inf: str                        # how it spells infinity

    def expression(self, p: Prim) -> str:
        return self.exprs[p]

    def literal_inf(self, negative: bool) -> str:
        return f"-{self.inf}" if negative else self.inf

    def identity_literal(self, p: Prim, dt: torch.dtype) -> str:
        """`identity(p, dt)` as this language writes it (infinities spelled its way)."""
        start = identity(p, dt)
        return self.literal_inf(start < 0) if isinstance(start, float) else str(start)


def computes_in(b: BoundSymbol) -> torch.dtype:
    """The dtype a kernel computes the elementwise prim `b` in: torch's, half types in float32."""
    dt = computation_dtype(b)
    return torch.float32 if dt in HALF else dt


def supported(b: BoundSymbol, lang: Language) -> bool:
    """Whether `lang`'s generator can emit `b` inside a region: a prim with one tensor result,
    over dtypes the language stores, whose computation dtype lies in the prim's math domain and
    which the language has an expression (or a reduction) for."""
    p = prim_of(b)
    if p is None or len(b.outputs()) != 1 or not isinstance(b.outputs()[0], TensorVar):
        return False
    out = b.outputs()[0]
    tensors = [v for v in b.inputs() if isinstance(v, TensorVar)]
    if not tensors or any(v.dtype not in lang.dtypes for v in tensors + [out]):
        return False
    if any(isinstance(a, (complex, str)) for a in b.args):
        return False
    if p in REDUCTIONS:
        return p in lang.reductions
    if p is Prim.CONVERT:
        return True
    if p not in lang.exprs:
        return False
    try:
        dt = computation_dtype(b)
    except (TypeError, RuntimeError):
        return False
    if dt not in lang.dtypes:
        return False
    domain = ROWS[p].domain
    if domain is Domain.FLOAT:
        return dt.is_floating_point
    if domain is Domain.INT:
        return not dt.is_floating_point
    return True


def identity(p: Prim, dt: torch.dtype):
    """The value a reduction starts from in dtype `dt` (masked lanes read it too): 0 for sum, 1 for
    prod, the lowest value for max and the highest for min (infinities for floats)."""
    if p is Prim.SUM:
        return 0
    if p is Prim.PROD:
        return 1
    if dt == torch.bool:
        return 0 if p is Prim.AMAX else 1
    if dt.is_floating_point:
        return -math.inf if p is Prim.AMAX else math.inf
    info = torch.iinfo(dt)
    return info.min if p is Prim.AMAX else info.max


def index_terms(region, shape: tuple, strides: tuple, rows_only: bool = False) -> list[str]:
    """The terms of the element offset of a tensor of `shape`/`strides`, broadcast to the region's
    domain, at the loop indices o<j> (row dims) and i<k> (dims along the row); `rows_only` keeps the
    row dims only (a per-row value).  Broadcast dims (size 1 or missing) contribute nothing."""
    dom, n_outer = region.domain, len(region.outer)
    terms = []
    for j in range(len(dom)):
        t = j - (len(dom) - len(shape))
        if rows_only:
            t = j if j < n_outer and j < len(shape) else -1
        if t < 0 or shape[t] == 1 or (rows_only and j >= n_outer):
            continue
        idx = f"o{j}" if j < n_outer else f"i{j - n_outer}"
        terms.append(f"{idx} * {strides[t]}" if strides[t] != 1 else idx)
    return terms


def index_decomposition(names: str, sizes: tuple, flat: str, floordiv: str) -> list[tuple[str, str]]:
    """(name, expression) of each dim's index from a flat index `flat` over `sizes`, row-major:
    `{names}0 = flat / (prod of the rest)`, and so on with `% size`."""
    out = []
    for k, size in enumerate(sizes):
        below = math.prod(sizes[k + 1:])
        expr = flat if below == 1 else f"({flat} {floordiv} {below})"
        out.append((f"{names}{k}", f"{expr} % {size}" if k else expr))
    return out


def contiguous_strides(shape: tuple) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def is_square(b: BoundSymbol) -> bool:
    """x ** 2, which torch computes as x * x (exactly; a pow call would round the same, slower)."""
    return prim_of(b) is Prim.POW and type(b.args[1]) in (int, float) and b.args[1] == 2


def is_runtime_value(a) -> bool:
    return isinstance(a, (TensorVar, NumberVar))
