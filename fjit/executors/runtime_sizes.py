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

A symbolic program's region (core/symbolic.py) knows which of its sizes are expressions of the
program's symbols, so it needs no family or policy: executors/symbolic_kernels.py makes exactly
those parameters, each `Size` carrying its expression of the symbols, and `recording` here notes
every decision the generator takes on them as a condition.
"""
from __future__ import annotations

import collections
import contextlib
import operator
import threading

from fjit import config
from fjit.core.ir import BoundSymbol, TensorVar, flatten_values, map_values
from fjit.passes.fusion import Region


def _read_op(op, reflected: bool = False):
    """A Size's method computing `op` on the values read out of it (and out of a Size operand)."""
    def method(self, other):
        other = other._read() if isinstance(other, Size) else other
        return op(other, self._read()) if reflected else op(self._read(), other)
    return method


class Size(int):
    """A size known at run time: its value in the region being generated (for every comparison
    and decision) and its C expression (for every place it is written into the source).

    `sym`, in a region of a symbolic program (`parametric`): the size as a Python expression of
    the program's symbols (v0, v1, ...).  Then every decision taken on the size while a kernel is
    generated -- a comparison, a truth test, a value read out of it (`int()`, a float, a bit
    operation) -- is recorded (`recording`) as a Python condition on the symbols with its outcome:
    the kernel's source is the same text at every value of the symbols where the recorded
    conditions have the same outcomes, so one build serves them all (SymbolicKernels)."""

    def __new__(cls, value: int, expr: str, div: str = "/", sym: str | None = None, hint: int | None = None):
        self = int.__new__(cls, value)
        self.expr = expr
        self.div = div      # the language's integer division: C's "/", Triton's "//"
        self.sym = sym
        self.hint = hint    # with `sym`: the value at the program's compiling call (`preferred`)
        return self

    def __str__(self):
        return self.expr

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        if not spec:
            return self.expr
        _escaped(self)
        return format(_value(self), spec)

    # exact in C for any int64 operands: +, -, * (the values are sizes and strides, far from
    # overflow); a neutral operand keeps the other side as it is
    def __add__(self, other):
        if not isinstance(other, int):
            return _float_op(self, other, float.__radd__)
        return self if not isinstance(other, Size) and other == 0 else \
            _made(self, other, operator.add, "({} + {})")

    def __radd__(self, other):
        if not isinstance(other, int):
            return _float_op(self, other, float.__add__)
        return self if other == 0 else _made(other, self, operator.add, "({} + {})")

    def __sub__(self, other):
        if not isinstance(other, int):
            return _float_op(self, other, float.__rsub__)
        return self if not isinstance(other, Size) and other == 0 else \
            _made(self, other, operator.sub, "({} - {})")

    def __rsub__(self, other):
        if not isinstance(other, int):
            return _float_op(self, other, float.__sub__)
        return _made(other, self, operator.sub, "({} - {})")

    def __mul__(self, other):
        if not isinstance(other, int):
            return _float_op(self, other, float.__rmul__)
        if not isinstance(other, Size) and other in (0, 1):
            return self if other == 1 else 0
        return _made(self, other, operator.mul, "({} * {})")

    def __rmul__(self, other):
        if not isinstance(other, int):
            return _float_op(self, other, float.__mul__)
        if other in (0, 1):
            return self if other == 1 else 0
        return _made(other, self, operator.mul, "({} * {})")

    def __neg__(self):
        return Size(-_value(self), f"(-{self})", self.div, None if self.sym is None else f"(-{self.sym})",
                    None if self.hint is None else -self.hint)

    def __pos__(self):
        return self

    # Python's floor division and remainder are C's for a numerator >= 0 and a divisor > 0; a
    # negative numerator (the ceiling division -(-n // d)) is -((-n + d - 1) / d); otherwise the
    # value is written as a literal
    def __floordiv__(self, other):
        return _floordiv(self, other) if isinstance(other, int) else _float_op(self, other, float.__rfloordiv__)

    def __rfloordiv__(self, other):
        return _floordiv(other, self) if isinstance(other, int) else _float_op(self, other, float.__floordiv__)

    def __mod__(self, other):
        return _mod(self, other) if isinstance(other, int) else _float_op(self, other, float.__rmod__)

    def __rmod__(self, other):
        return _mod(other, self) if isinstance(other, int) else _float_op(self, other, float.__mod__)

    # decisions: recorded with their outcome
    def __lt__(self, other):
        return _compared(self, other, "<")

    def __le__(self, other):
        return _compared(self, other, "<=")

    def __gt__(self, other):
        return _compared(self, other, ">")

    def __ge__(self, other):
        return _compared(self, other, ">=")

    def __eq__(self, other):
        return _compared(self, other, "==")

    def __ne__(self, other):
        return _compared(self, other, "!=")

    def __bool__(self):
        return _compared(self, 0, "!=")

    # (a dict or set holding sizes looks them up by value: equal values compare, and are recorded
    # then; a value read through the hash alone is not a decision the generator takes on a size)
    __hash__ = int.__hash__

    # anything else reads the value itself: the source may then depend on it, so it is recorded as
    # a condition that the value is the same
    def _read(self):
        _escaped(self)
        return _value(self)

    def __int__(self):
        return self._read()

    __index__ = __trunc__ = __floor__ = __ceil__ = __int__

    def __float__(self):
        return float(self._read())

    def __round__(self, digits=None):
        return round(self._read(), digits)

    def __abs__(self):
        return self if _compared(self, 0, ">=") else -self

    def __invert__(self):
        return ~self._read()

    def bit_length(self):
        # (a power-of-two bucket: what a block size rounded up to a power of two depends on)
        bits = _value(self).bit_length()
        if self.sym is not None and bits > 0:
            note(f"({self.sym} >= {1 << (bits - 1)})", True)
            note(f"({self.sym} < {1 << bits})", True)
        elif self.sym is not None:
            _escaped(self)
        return bits

    __truediv__, __rtruediv__ = _read_op(operator.truediv), _read_op(operator.truediv, True)
    __pow__, __rpow__ = _read_op(operator.pow), _read_op(operator.pow, True)
    __and__, __rand__ = _read_op(operator.and_), _read_op(operator.and_, True)
    __or__, __ror__ = _read_op(operator.or_), _read_op(operator.or_, True)
    __xor__, __rxor__ = _read_op(operator.xor), _read_op(operator.xor, True)
    __lshift__, __rlshift__ = _read_op(operator.lshift), _read_op(operator.lshift, True)
    __rshift__, __rrshift__ = _read_op(operator.rshift), _read_op(operator.rshift, True)
    __divmod__, __rdivmod__ = _read_op(divmod), _read_op(divmod, True)


def _value(n) -> int:
    """The plain int value of a size (or an int), recording nothing."""
    return int.__int__(n) if isinstance(n, Size) else n


def _c(n: int) -> str:
    return str(n) if isinstance(n, Size) else str(int(n))


def _py(n) -> str:
    """`n` in the Python of the recorded conditions: a symbolic size's expression, else its value."""
    if isinstance(n, Size):
        return n.sym if n.sym is not None else str(_value(n))
    return repr(n)


def _symbolic(*operands) -> bool:
    return any(map(symbolic_size, operands))


def _made(a, b, op, form: str) -> "Size":
    """The Size op(a, b) written as `form` of a and b (a Size with either): its value, C
    expression, condition expression and hint."""
    div = (a if isinstance(a, Size) else b).div
    symbolic = _symbolic(a, b)
    return Size(op(_value(a), _value(b)), form.format(_c(a), _c(b)), div,
                form.format(_py(a), _py(b)) if symbolic else None, op(_hint(a), _hint(b)) if symbolic else None)


def _hint(n) -> int:
    """n's value at the program's compiling call (a Size with one), else its value."""
    return n.hint if isinstance(n, Size) and n.hint is not None else _value(n)


def symbolic_size(n) -> bool:
    """Whether `n` is a size of a symbolic program's region (an expression of its symbols)."""
    return isinstance(n, Size) and n.sym is not None


def preferred(n) -> int:
    """A size as a choice that only decides speed reads it (a tiling, a vector width): a symbolic
    program's size gives its value at the program's compiling call, recording nothing, so that
    every set of sizes makes the same choice and shares one kernel; any other size its value."""
    return _hint(n)


def _float_op(size: Size, other, op):
    """size (op) a float: a value read out of the size (recorded), as Python computes it."""
    if isinstance(other, float):
        return op(other, float(size))
    return NotImplemented


_RECORD = threading.local()


@contextlib.contextmanager
def recording():
    """Record, while a kernel is generated, every decision taken on a symbolic size: yields a dict
    {Python condition on the symbols v0, v1, ...: its outcome at the sizes generated for}."""
    old = getattr(_RECORD, "decisions", None)
    decisions = _RECORD.decisions = {}
    try:
        yield decisions
    finally:
        _RECORD.decisions = old


def note(condition: str, outcome) -> None:
    decisions = getattr(_RECORD, "decisions", None)
    if decisions is not None:
        decisions[condition] = outcome


def _compared(a: Size, b, op: str):
    if isinstance(b, bool) or not isinstance(b, (int, float)):
        return NotImplemented
    outcome = {"<": int.__lt__, "<=": int.__le__, ">": int.__gt__, ">=": int.__ge__,
               "==": int.__eq__, "!=": int.__ne__}[op](_value(a), _value(b)) if isinstance(b, int) else \
        {"<": float.__gt__, "<=": float.__ge__, ">": float.__lt__, ">=": float.__le__,
         "==": float.__eq__, "!=": float.__ne__}[op](b, float(_value(a)))
    if _symbolic(a, b):
        note(f"({_py(a)} {op} {_py(b)})", outcome)
    return outcome


def _escaped(n: Size) -> None:
    """n's value was read into the source: the condition that it is the same."""
    if n.sym is not None:
        note(f"({n.sym} == {_value(n)})", True)


def _signs(a: int, b: int) -> tuple[bool, bool]:
    """(a >= 0, b > 0), recorded where either is symbolic: the C form of a // b and a % b depends
    on them."""
    signs = _value(a) >= 0, _value(b) > 0
    if _symbolic(a):
        note(f"({_py(a)} >= 0)", signs[0])
    if _symbolic(b):
        note(f"({_py(b)} > 0)", signs[1])
    return signs


def _floordiv(a: int, b: int) -> int:
    value = _value(a) // _value(b)
    nonnegative, positive = _signs(a, b)
    if not positive:
        for n in (a, b):
            if isinstance(n, Size):
                _escaped(n)
        return value
    if not isinstance(b, Size) and b == 1:
        return a
    div = (a if isinstance(a, Size) else b).div
    symbolic = _symbolic(a, b)
    sym = f"({_py(a)} // {_py(b)})" if symbolic else None
    hint = _hint(a) // _hint(b) if symbolic and _hint(b) != 0 else None
    if nonnegative:
        return Size(value, f"({_c(a)} {div} {_c(b)})", div, sym, hint)
    # (the negation in parentheses: a literal numerator is negative, and C reads "--5" as a
    # decrement)
    return Size(value, f"(-((-({_c(a)}) + {_c(b)} - 1) {div} {_c(b)}))", div, sym, hint)


def _mod(a: int, b: int) -> int:
    value = _value(a) % _value(b)
    nonnegative, positive = _signs(a, b)
    if not nonnegative or not positive:
        for n in (a, b):
            if isinstance(n, Size):
                _escaped(n)
        return value
    symbolic = _symbolic(a, b)
    return Size(value, f"({_c(a)} % {_c(b)})", (a if isinstance(a, Size) else b).div,
                f"({_py(a)} % {_py(b)})" if symbolic else None,
                _hint(a) % _hint(b) if symbolic and _hint(b) != 0 else None)


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


def choose(region: Region, make, policy: Policy, div: str = "/"):
    """The region's kernel as FJIT_KERNEL_SIZES says: `make(region, sizes)` generates and names a
    kernel of a region (`sizes`: the values of its parameters).  auto (the default): literal
    sizes for the family's first sizes, then the sizes that changed as parameters (Policy), each
    source generated once; runtime: every size a parameter; specialized: none.  (A symbolic
    program's regions take their parameters from the program's symbols instead: `parametric`.)"""
    chosen = config.kernel_sizes()
    if chosen is config.KernelSizes.SPECIALIZED:
        return make(region, [])
    every, values = symbolic(region, div=div)
    if not values:
        return make(region, [])
    if chosen is config.KernelSizes.RUNTIME:
        return make(every, values)
    dynamic = policy.dynamic(family(every), values)
    if dynamic is None:
        return make(region, [])
    if len(dynamic) == len(values):
        return make(every, values)
    partial, partial_values = symbolic(region, frozenset(range(len(values))) - dynamic, div)
    return make(partial, partial_values)


def python(n) -> str:
    """A size of a parametric region as a Python expression of the symbols v0, v1, ... (a static
    one as its value)."""
    return _py(n) if isinstance(n, Size) else str(int(n))
