"""Sizes a C or Triton kernel takes at run time, so that one build serves every sequence length and
batch size.

A region's sizes and strides are concrete: the generator decides its loop structure from them
(one flat loop or rows, threads or not, tiles, scratch buffers within budget).  `symbolic(region)`
gives the same region with every size, stride and view offset of 2 or more replaced by a `Size`:
an int whose value is the concrete one, which every decision reads, and which renders in the
source as a kernel parameter (`sz0`, `sz1`, ...) or an expression of them.  The kernel then gets
the values as int64 arguments (the launcher's literals).

Why a kernel generated so is right: the source is generated from this region, with this
region's values deciding; every `Size` renders as an expression that evaluates, with this
region's values bound to its parameters, to the value it holds (`Size` arithmetic renders only
operations exact in C's int64 for the operands at hand; anything else falls back to the plain
int, a literal in the source).  So the source with this region's arguments computes what a
specialized source would.  Another region shares the binary only when its own source is the
same text, which by the same argument is right with its own arguments.  Parameters are taken by
role in a fixed walk of the region (`symbolic`), so regions that differ only in their sizes
produce the same text.

Literal sizes let the C compiler fold divisions and unroll short loops, so by default only the
sizes seen to change are parameters (`Policy`, FJIT_KERNEL_SIZES).
"""
from __future__ import annotations

import collections
import threading

from fjit import config
from fjit.core.ir import BoundSymbol, TensorVar, flatten_values, map_values
from fjit.passes.fusion import Region


class Size(int):
    """A size known at run time: its value in the region being generated (for every comparison
    and decision) and its C expression (for every place it is written into the source)."""

    def __new__(cls, value: int, expr: str, div: str = "/"):
        self = int.__new__(cls, value)
        self.expr = expr
        self.div = div      # the language's integer division: C's "/", Triton's "//"
        return self

    def _make(self, value: int, expr: str) -> "Size":
        return Size(value, expr, self.div)

    def __str__(self):
        return self.expr

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return self.expr if not spec else format(int(self), spec)

    # exact in C for any int64 operands: +, -, * (the values are sizes and strides, far from
    # overflow); a neutral operand keeps the other side as it is
    def __add__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return self if other == 0 and not isinstance(other, Size) else \
            self._make(int(self) + int(other), f"({self} + {_c(other)})")

    def __radd__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return self if other == 0 else self._make(int(other) + int(self), f"({_c(other)} + {self})")

    def __sub__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return self if other == 0 and not isinstance(other, Size) else \
            self._make(int(self) - int(other), f"({self} - {_c(other)})")

    def __rsub__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        return self._make(int(other) - int(self), f"({_c(other)} - {self})")

    def __mul__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        if not isinstance(other, Size) and other in (0, 1):
            return self if other == 1 else 0
        return self._make(int(self) * int(other), f"({self} * {_c(other)})")

    def __rmul__(self, other):
        if not isinstance(other, int):
            return NotImplemented
        if other in (0, 1):
            return self if other == 1 else 0
        return self._make(int(other) * int(self), f"({_c(other)} * {self})")

    def __neg__(self):
        return self._make(-int(self), f"(-{self})")

    # Python's floor division and remainder are C's for a numerator >= 0 and a divisor > 0; a
    # negative numerator (the ceiling division -(-n // d)) is -((-n + d - 1) / d); otherwise the
    # value is written as a literal
    def __floordiv__(self, other):
        return _floordiv(self, other) if isinstance(other, int) else NotImplemented

    def __rfloordiv__(self, other):
        return _floordiv(other, self) if isinstance(other, int) else NotImplemented

    def __mod__(self, other):
        return _mod(self, other) if isinstance(other, int) else NotImplemented

    def __rmod__(self, other):
        return _mod(other, self) if isinstance(other, int) else NotImplemented


def _c(n: int) -> str:
    return str(n) if isinstance(n, Size) else str(int(n))


def _floordiv(a: int, b: int) -> int:
    value = int(a) // int(b)
    if int(b) <= 0:
        return value
    if not isinstance(b, Size) and b == 1:
        return a
    div = (a if isinstance(a, Size) else b).div
    if int(a) >= 0:
        return Size(value, f"({_c(a)} {div} {_c(b)})", div)
    # (the negation in parentheses: a literal numerator is negative, and C reads "--5" as a
    # decrement)
    return Size(value, f"(-((-({_c(a)}) + {_c(b)} - 1) {div} {_c(b)}))", div)


def _mod(a: int, b: int) -> int:
    value = int(a) % int(b)
    if int(a) < 0 or int(b) <= 0:
        return value
    return Size(value, f"({_c(a)} % {_c(b)})", (a if isinstance(a, Size) else b).div)


def symbolic(region: Region, literal: frozenset = frozenset(), div: str = "/") -> tuple[Region, list[int]]:
    """The region with its sizes, strides and view offsets of 2 or more as `Size`s, and the value
    of each parameter sz0, sz1, ... in order ([] where the region has none).  `literal`: positions
    (in the order the values are met, as with `literal` empty) kept as literals, not parameters.
    `div`: the target language's integer division ("/" in C, "//" in Triton).

    Parameters are taken by role, so that a size equal to another by chance at one length (a
    sequence length of 64 beside a hidden size of 64) does not change the source: each dim of the
    region's domain is a parameter of its own; a tensor's dim of the same value as the domain dim
    it lines up with is that parameter; a stride that is the product of the sizes inside it (a
    contiguous layout) is that product; any other value is a parameter shared by equal values."""
    values: list[int] = []
    met = [0]

    def parameter(n: int):
        met[0] += 1
        if met[0] - 1 in literal:
            return int(n)
        values.append(int(n))
        return Size(n, f"sz{len(values) - 1}", div)

    def scalar(n):
        return n if not isinstance(n, int) or isinstance(n, bool) or n < 2 else parameter(n)

    domain = tuple(map(scalar, region.outer + region.inner))
    others: dict[int, int] = {}

    def other(n):
        if not isinstance(n, int) or isinstance(n, bool) or n < 2:
            return n
        if n not in others:
            others[n] = parameter(n)
        return others[n]

    variables: dict[str, TensorVar] = {}

    def var(v):
        if not isinstance(v, TensorVar):
            return v
        if v.name not in variables:
            lead = len(domain) - len(v.shape)
            shape = tuple(domain[lead + j] if 0 <= lead + j and domain[lead + j] == n else other(n)
                          for j, n in enumerate(v.shape))
            strides, inside = [], 1
            for n, st in zip(reversed(shape), reversed(v.strides)):
                strides.append(inside if st == inside and st >= 2 else other(st))
                inside = inside * n
            variables[v.name] = v.replaced(shape=shape, strides=tuple(reversed(strides)))
        return variables[v.name]

    inputs, outputs = [var(v) for v in region.inputs], [var(v) for v in region.outputs]
    bsyms = [_with_vars(b, var) for b in region.bsyms]
    bases = {k: (var(base), other(offset)) for k, (base, offset) in region.bases.items()}
    n_outer = len(region.outer)
    return Region(bsyms, domain[:n_outer], domain[n_outer:], set(region.row_vars),
                  set(region.keepdim_rows), set(region.columns), inputs, outputs,
                  set(region.private), bases), values


def _with_vars(b: BoundSymbol, var) -> BoundSymbol:
    """`b` reading and making the symbolic copies of its tensors (its other arguments as they are:
    dims and numbers are not sizes)."""
    return b.replace(args=map_values(var, b.args), kwargs=map_values(var, b.kwargs),
                     output=map_values(var, b.output))


class Policy:
    """Which sizes of a region are parameters (FJIT_KERNEL_SIZES=auto), per family (`family`: the
    region with every size a parameter, as a key).  The family's first sizes get literal sizes (the
    specialized kernel); from then on, the sizes that have differed from the first at some call
    are parameters and the rest stay literals, as torch.compile's automatic dynamic shapes make a
    dim symbolic once it changes.  Over sequence lengths, the length is a parameter and the hidden
    sizes stay literals the C compiler folds.  Remembers the last MEMORY families."""

    MEMORY = 4096

    def __init__(self):
        self._families: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def dynamic(self, family: str, values: list[int]) -> frozenset | None:
        """The positions of `values` that are parameters for this call: None for the family's
        first sizes (every size literal)."""
        with self._lock:
            first, varied = self._families.get(family, (tuple(values), frozenset()))
            if len(first) == len(values):
                varied = varied | {k for k, (a, b) in enumerate(zip(first, values)) if a != b}
            self._families[family] = (first, varied)
            self._families.move_to_end(family)
            while len(self._families) > self.MEMORY:
                self._families.popitem(last=False)
            return varied or None


def varying_sizes(first: Region, second: Region, div: str = "/") -> frozenset:
    """The positions (symbolic's order) of the sizes that differ between two instances of one
    region at other values of its symbols: the sizes that are expressions of them."""
    a, b = symbolic(first, div=div)[1], symbolic(second, div=div)[1]
    return frozenset(k for k, (x, y) in enumerate(zip(a, b)) if x != y)


def family(every: Region) -> str:
    """A region's family: what its source with every size a parameter depends on (its ops, their
    operands' dtypes, shapes and strides as parameters, its loop domain), without generating it.
    A key only: two regions of one family share no binary unless their own sources are equal."""
    names: dict[str, int] = {}     # a value's name -> its number in order of appearance

    def var(v):
        if isinstance(v, TensorVar):
            return f"%{names.setdefault(v.name, len(names))}:{v.dtype}:{v.shape}:{v.strides}"
        return f"%{names.setdefault(v.name, len(names))}" if hasattr(v, "name") else repr(v)
    parts = [str(every.outer), str(every.inner), *map(var, every.inputs), *map(var, every.outputs),
             *(f"{k}:{var(base)}:{offset}" for k, (base, offset) in sorted(every.bases.items()))]
    for b in every.bsyms:
        parts.append(f"{b.sym.qualname}({', '.join(map(var, flatten_values((b.args, b.kwargs))))})"
                     f"->{', '.join(map(var, b.outputs()))}")
    for group in (every.row_vars, every.keepdim_rows, every.columns, every.private):
        parts.append(" ".join(sorted(str(names.get(n, n)) for n in group)))
    return "\n".join(parts)


def choose(region: Region, make, policy: Policy, div: str = "/", varying: frozenset | None = None):
    """The region's kernel as FJIT_KERNEL_SIZES says: `make(region, sizes)` generates and names a
    kernel of a region (`sizes`: the values of its parameters).  auto (the default): literal
    sizes for the family's first sizes, then the sizes that changed as parameters (Policy), each
    source generated once; runtime: every size a parameter; specialized: none.  `varying`: the
    region is an instance of a symbolic program's region, and these are the positions of its
    sizes that are expressions of symbols (varying_sizes): auto makes exactly those parameters
    from the first instance (the sizes that changed first, then others, would each be one more
    build; a static size as a parameter costs the compiler's unrolling and vector forms)."""
    chosen = config.kernel_sizes()
    if chosen is config.KernelSizes.SPECIALIZED:
        return make(region, [])
    every, values = symbolic(region, div=div)
    if not values:
        return make(region, [])
    if chosen is config.KernelSizes.RUNTIME:
        return make(every, values)
    dynamic = policy.dynamic(family(every), values) if varying is None else varying or None
    if dynamic is None:
        return make(region, [])
    if len(dynamic) == len(values):
        return make(every, values)
    partial, partial_values = symbolic(region, frozenset(range(len(values))) - dynamic, div)
    return make(partial, partial_values)
