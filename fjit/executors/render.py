"""What the C and Triton kernel generators share: one C-style renderer of a region.

Each language's expression table is read from the prim blocks (fjit/core/prims/), where an
expression both languages write alike (`({0} + {1})`) is written once: C calls libm (`exp{f}` with
`f` the float suffix), Triton calls `tl.*`.  One `supported`, one table of reduction identities,
the layout arithmetic (broadcast strides, collapsed dims, index terms), the levels of reductions,
and RegionEmitter: the walk over a region's prims, written once, that each language's emitter
inherits and spells its way.  What really differs stays in each generator: the loop nest against
the tile, half-precision storage, NaN propagation in reductions.

An expression's operands arrive already converted to the prim's computation dtype (half types
computed in float32, as torch's kernels compute them).
"""
from __future__ import annotations

import dataclasses
import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import BOOL_RESULT, REDUCTIONS, ROWS, Domain, Prim, computation_dtype, prim_of

HALF = (torch.float16, torch.bfloat16)

@dataclasses.dataclass(frozen=True)
class Language:
    """What a C-like language's kernels can hold and write: a subclass overrides `int_literal`
    and `accepts` where the language needs to."""
    name: str
    exprs: dict                     # prim -> expression template
    dtypes: frozenset               # tensor dtypes its kernels read and write
    reductions: frozenset           # reduction prims it emits
    inf: str                        # how it spells infinity

    def literal_inf(self, negative: bool) -> str:
        return f"-{self.inf}" if negative else self.inf

    def int_literal(self, n: int) -> str:
        return str(n)

    def identity_literal(self, p: Prim, dt: torch.dtype) -> str:
        """`identity(p, dt)` as this language writes it."""
        start = identity(p, dt)
        return self.literal_inf(start < 0) if isinstance(start, float) else self.int_literal(start)

    def accepts(self, b: BoundSymbol) -> bool:
        """The language's own limits on a prim `supported` would otherwise emit."""
        return True


def held(dt: torch.dtype) -> torch.dtype:
    """The dtype a kernel holds a value of dtype `dt` in: half types in float32."""
    return torch.float32 if dt in HALF else dt


def computes_in(b: BoundSymbol) -> torch.dtype:
    """The dtype a kernel computes the elementwise prim `b` in: torch's, half types in float32."""
    return held(computation_dtype(b))


def supported(b: BoundSymbol, lang: Language) -> bool:
    """Whether `lang`'s generator can emit `b` inside a region: a prim with one tensor result,
    over dtypes the language stores, whose computation dtype lies in the prim's math domain and
    which the language has an expression (or a reduction) for, within the language's own limits."""
    return _emittable(b, lang) and lang.accepts(b)


def _emittable(b: BoundSymbol, lang: Language) -> bool:
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
    if p not in lang.exprs and small_power(b) is None:
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


def small_power(b: BoundSymbol) -> str | None:
    """The product a literal square (any dtype) or a float32/float64 cube is computed as, as
    ATen's pow kernels special-case both (exactly: a pow call would round the same, slower, and
    Triton has none); None for another power.  A half type's cube is left out: ATen's CPU kernel
    rounds x * x before multiplying again, its CUDA kernel does not."""
    if prim_of(b) is not Prim.POW or type(b.args[1]) not in (int, float):
        return None
    if b.args[1] == 2:
        return "({0} * {0})"
    if b.args[1] == 3 and isinstance(b.args[0], TensorVar) and b.args[0].dtype in (torch.float32, torch.float64):
        return "({0} * {0} * {0})"
    return None


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
    row dims only (a per-row value).  Broadcast dims (size 1, missing, or expanded: stride 0)
    contribute nothing (an input expanded along the row is loaded once a row, where no i<k> is
    declared)."""
    dom, n_outer = region.domain, len(region.outer)
    terms = []
    for j in range(len(dom)):
        t = j - (len(dom) - len(shape))
        if rows_only:
            t = j if j < n_outer and j < len(shape) else -1
        if t < 0 or shape[t] == 1 or (rows_only and j >= n_outer) or \
                isinstance(strides[t], int) and strides[t] == 0:
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


def domain_strides(v: TensorVar, domain: tuple, n_outer: int = 0, row: bool = False) -> tuple:
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


def coalesce(domain: tuple, tensors: list, order_by: TensorVar) -> tuple[tuple, dict]:
    """The domain in `order_by`'s memory order (elements are independent), size-1 dims dropped and
    neighbouring dims merged where every tensor walks them as one: sizes and, per tensor name, the
    strides.  A dense region, channels-last included, becomes one dim."""
    walk = sorted(range(len(domain)), key=lambda j: -domain_strides(order_by, domain)[j])
    sizes, strides = collapse(tuple(domain[j] for j in walk), {
        v.name: tuple(domain_strides(v, domain)[j] for j in walk) for v in tensors})
    return (sizes, strides) if sizes else ((1,), {n: (0,) for n in strides})


def levels(bsyms: list, reductions, joined: dict | None = None) -> dict:
    """How many reductions in a row each value waits for (0: computed from the inputs), by name;
    `joined` (id(reduction) -> another reduction) puts a reduction in the other's pass."""
    level: dict = {}
    for b in bsyms:
        if joined and id(b) in joined:
            level[b.outputs()[0].name] = level[joined[id(b)].outputs()[0].name]
            continue
        deps = [level.get(v.name, 0) for v in b.inputs() if isinstance(v, TensorVar)]
        level[b.outputs()[0].name] = max(deps, default=0) + (prim_of(b) in reductions)
    return level


class RegionEmitter:
    """The walk over a region's prims that every C-like language shares: each prim's operands
    converted to its computation dtype (a WHERE's condition as it is), its expression, bool results,
    half types held in float32 and rounded after every op.  Values are `name -> (expression, dtype
    it is held in)`.  A language's emitter says how it spells a cast, a literal, a definition and a
    rounding (the hooks below) and writes its own loops or tiles around the walk."""

    lang: Language

    def __init__(self, region):
        self.r = region
        self.counter = 0

    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    # -- the language's hooks ---------------------------------------------------------------------
    def cast(self, expr: str, dt: torch.dtype) -> str:
        raise NotImplementedError

    def literal(self, value, ct: torch.dtype | None) -> str:
        """A Python number as a literal of the computation dtype `ct` (None: a WHERE's condition)."""
        raise NotImplementedError

    def define(self, var: str, expr: str, dt: torch.dtype, half: torch.dtype | None) -> list[str]:
        """The statements that make `var` (held in `dt`) `expr`, rounded to `half` if given."""
        raise NotImplementedError

    def rounded(self, val: str, half: torch.dtype) -> str:
        """`val` (float32) rounded to the half type, still float32."""
        raise NotImplementedError

    def number_value(self, expr: str) -> str:
        """A runtime number's float32 expression as `rounded` takes it."""
        return expr

    def form(self, b: BoundSymbol, ct: torch.dtype, ops: list, lines: list) -> str:
        """The prim's expression over its operands; a form may first add statements to `lines`."""
        return (small_power(b) or self.lang.exprs[prim_of(b)]).format(*ops)

    def convert(self, expr: str, dt: torch.dtype, target: torch.dtype) -> str:
        return expr if dt == target else self.cast(expr, target)

    def nonzero(self, expr: str) -> str:
        return f"({expr} != 0)"

    # -- the walk -------------------------------------------------------------------------------
    def operand(self, a, ct: torch.dtype | None, values: dict) -> str:
        if isinstance(a, (TensorVar, NumberVar)):
            expr, dt = values[a.name]
            return expr if ct is None or dt == ct else self.cast(expr, ct)
        return self.literal(a, ct)

    def expression(self, b: BoundSymbol, values: dict, lines: list) -> tuple[str, torch.dtype]:
        """The expression of an elementwise prim and the dtype it is held in (before rounding)."""
        p, out = prim_of(b), b.outputs()[0]
        if p is Prim.CONVERT:
            expr, dt = values[b.args[0].name]
            if out.dtype == torch.bool:
                return self.nonzero(expr), torch.bool
            return self.convert(expr, dt, held(out.dtype)), held(out.dtype)
        ct = computes_in(b)
        ops = [self.operand(a, None if p is Prim.WHERE and j == 0 else ct, values) for j, a in enumerate(b.args)]
        half = computation_dtype(b) if p in (Prim.ADD, Prim.SUB) else None
        if half in HALF:
            # torch's add and sub first convert a scalar operand (a Python number, a 0-d tensor of
            # another dtype) to the half type; mul and div take it in float32 unrounded
            for j, a in enumerate(b.args):
                if isinstance(a, (int, float)) and not isinstance(a, bool):
                    ops[j] = self.literal(float(torch.tensor(a, dtype=torch.float64).to(half)), ct)
                elif isinstance(a, NumberVar):
                    ops[j] = self.rounded(self.number_value(ops[j]), half)
                elif isinstance(a, TensorVar) and a.ndim == 0 and a.dtype != half:
                    ops[j] = self.rounded(ops[j], half)
        return self.form(b, ct, ops, lines), torch.bool if p in BOOL_RESULT else ct

    def bind(self, v: TensorVar, expr: str, dt: torch.dtype, values: dict, lines: list) -> None:
        """`v` = `expr` (held in `dt`) as a new variable, rounded to `v`'s dtype if a half type."""
        var = self.fresh()
        lines += self.define(var, expr, held(dt), v.dtype if v.dtype in HALF else None)
        values[v.name] = (var, held(dt))

    def compute(self, b: BoundSymbol, values: dict, lines: list) -> None:
        """The elementwise prim `b`'s statements, added to `lines`, and its value."""
        self.bind(b.outputs()[0], *self.expression(b, values, lines), values, lines)
