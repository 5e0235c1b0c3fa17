"""A registry of sample inputs per op, driving tests/ops/test_ops.py.

Each `OpInfo` names one torch-level op by its qualified name ("torch.add", "torch.Tensor.to",
"torch.nn.functional.softmax", "operator.getitem"), a callable `fn` that calls it (tensors and
options are positional arguments of `fn`; ints, bools, dtypes and tuples are compile-time constants
for fjit, Python floats are runtime values), the dtypes it is tested in, and `samples(dtype)`, which
returns argument tuples for `fn`: broadcasting shapes, 0-d, empty (a 0-size dim), non-contiguous
(transposed or strided) inputs, Python scalars mixed with tensors, and keyword variants.

Samples are deterministic: each (op, dtype) pair draws from its own seeded generator, so test ids
and values are stable across processes (and across pytest-xdist workers).

`check` says how outputs are compared:
  "close"   torch.testing.assert_close (exact dtype and shape; default tolerances; equal_nan)
  "random"  outputs are random: compare structure, shape, dtype and device only, and require that
            two calls draw different numbers
  callable  check(args, actual) -> None for outputs that are random but constrained (dropout)

`fallback=True` marks ops fjit does not decompose: they go through its automatic torch fallback.
`aliases` are further qualified names a sample exercises (the dunder methods behind operators).
"""
from __future__ import annotations

import dataclasses
import operator
import zlib
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

F16 = torch.float16
F32 = torch.float32
F64 = torch.float64
BF16 = torch.bfloat16
I32 = torch.int32
I64 = torch.int64
BOOL = torch.bool

FLOATS = (F32, BF16)
NUMERIC = (F32, BF16, I64)
INTEGRAL = (I64, BOOL)
INF = float("inf")
NAN = float("nan")


# --------------------------------------------------------------------------------------------------
# Making sample tensors


class Maker:
    """Deterministic sample tensors of a default dtype, from one seeded generator."""

    def __init__(self, dtype: torch.dtype, seed: int):
        self.dtype = dtype
        self.gen = torch.Generator().manual_seed(seed)

    # ---- raw draws (contiguous, always float32/int64/bool before casting) ----
    def _raw(self, shape, dtype, low, high, grid):
        shape = tuple(shape)
        if dtype == BOOL:
            return torch.randint(0, 2, shape, generator=self.gen).bool()
        if not dtype.is_floating_point:
            lo, hi = int(low), int(high)
            return torch.randint(lo, hi + 1, shape, generator=self.gen, dtype=I64).to(dtype)
        if grid:  # multiples of 0.5: exact in every float dtype, with ties and equal pairs
            lo, hi = int(low * 2), int(high * 2)
            return (torch.randint(lo, hi + 1, shape, generator=self.gen).to(F32) / 2).to(dtype)
        t = torch.rand(shape, generator=self.gen, dtype=F32) * (high - low) + low
        return t.to(dtype)

    def __call__(self, shape=(3, 4), low=-3.0, high=3.0, *, nc=False, dtype=None, grid=False):
        """A tensor of `shape`; nc=True makes it non-contiguous (transposed, or strided for 1-D)."""
        dtype = dtype or self.dtype
        shape = tuple(shape)
        if not nc or len(shape) == 0:
            return self._raw(shape, dtype, low, high, grid)
        if len(shape) == 1:
            return self._raw((shape[0] * 2,), dtype, low, high, grid)[::2]
        swapped = shape[:-2] + (shape[-1], shape[-2])
        t = self._raw(swapped, dtype, low, high, grid).transpose(-1, -2)
        assert t.shape == shape and (t.numel() <= 1 or not t.is_contiguous() or 1 in shape[-2:])
        return t

    def strided(self, shape, dim=-1, step=2, **kw):
        """Non-contiguous by a strided slice along `dim` (rather than a transpose)."""
        big = list(shape)
        big[dim] = big[dim] * step
        t = self(big, **kw)
        index = [slice(None)] * len(shape)
        index[dim] = slice(None, None, step)
        return t[tuple(index)]

    def nonzero(self, shape=(3, 4), high=4.0, *, nc=False, dtype=None):
        """Values with |v| in [1, high] (floats: [0.5, high]), random sign: safe divisors."""
        dtype = dtype or self.dtype
        if dtype == BOOL:
            return torch.ones(shape, dtype=BOOL)
        mag = self(shape, 1 if not dtype.is_floating_point else 0.5, high, nc=nc, dtype=dtype)
        sign = self(shape, nc=nc, dtype=BOOL)
        return torch.where(sign, mag, -mag)

    def index(self, shape, size):
        """int64 indices valid for a dim of `size`, negative ones included."""
        return torch.randint(-size, size, tuple(shape), generator=self.gen, dtype=I64)

    def specials(self, dtype=None):
        """Special float values: signed zeros, infinities, NaN, halves, tiny numbers."""
        dtype = dtype or self.dtype
        vals = [0.0, -0.0, INF, -INF, NAN, 0.5, -0.5, 1.5, -2.5, 2.5, 1e-3, -1e-3, 3.0, -7.25]
        return torch.tensor(vals, dtype=F32).to(dtype)


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


# --------------------------------------------------------------------------------------------------
# The registry record


@dataclasses.dataclass(frozen=True)
class OpInfo:
    name: str                                   # qualified torch-level name
    fn: Callable[..., Any]                      # calls the op
    dtypes: tuple                               # dtypes the op is tested in
    make: Callable[[Maker], Iterable[tuple]]    # argument tuples, from a seeded Maker
    variant: str = ""                           # distinguishes several entries of one name
    fallback: bool = False                      # goes through fjit's automatic torch fallback
    check: Any = "close"                        # "close" | "random" | callable(args, actual)
    aliases: tuple = ()                         # further qualified names the samples exercise

    @property
    def id(self) -> str:
        return f"{self.name}[{self.variant}]" if self.variant else self.name

    def samples(self, dtype: torch.dtype) -> list[tuple]:
        """Argument tuples for `fn`, deterministic for (op, variant, dtype)."""
        return [tuple(s) for s in self.make(Maker(dtype, _seed(self.id, dtype)))]


OP_SAMPLES: list[OpInfo] = []


_IDS: set = set()


def op(name, fn, dtypes, make, **kw) -> OpInfo:
    info = OpInfo(name, fn, tuple(dtypes), make, **kw)
    n = 2
    while info.id in _IDS:  # a repeated name without a variant gets a numbered one
        info = dataclasses.replace(info, variant=f"{kw.get('variant', '')}#{n}".lstrip("#")
                                   if kw.get("variant") else f"#{n}")
        n += 1
    _IDS.add(info.id)
    OP_SAMPLES.append(info)
    return info


# --------------------------------------------------------------------------------------------------
# Elementwise unary


def unary_samples(low=-3.0, high=3.0, specials=True, grid=False):
    def make(m: Maker):
        kw = dict(grid=grid)
        yield (m((3, 4), low, high, **kw),)
        yield (m((), low, high, **kw),)
        yield (m((0, 3), low, high, **kw),)
        yield (m((2, 3, 4), low, high, nc=True, **kw),)
        yield (m.strided((5,), low=low, high=high, **kw),)
        if specials and m.dtype.is_floating_point:
            yield (m.specials(),)
    return make


_POS = dict(low=0.1, high=5.0)
_UNIT = dict(low=-0.95, high=0.95)
@dataclasses.dataclass(frozen=True)
class Drawn:
    """How tests/ops/test_properties.py draws a unary op into its random programs."""
    domain: str          # the inputs it takes: any | nonbool | float | intbool
    approx: bool         # compared with a tolerance (transcendental math)
    bounded: bool        # bounded if its input is (False: may produce inf/nan)
    needs_exact: bool    # only on exactly representable inputs (rounding, tests of values)


UNARY = {
    # name: (dtypes, sample kwargs[, how the property tests draw it])
    "abs": (NUMERIC, {}, Drawn("nonbool", False, True, False)),
    "neg": (NUMERIC, {}, Drawn("nonbool", False, True, False)),
    "exp": (NUMERIC + (BOOL,), {}, Drawn("any", True, False, False)),
    "exp2": (NUMERIC, {}, Drawn("any", True, False, False)),
    "expm1": (NUMERIC, {}, Drawn("any", True, False, False)),
    "log": (NUMERIC, _POS, Drawn("any", True, False, False)),
    "log2": (NUMERIC, _POS, Drawn("any", True, False, False)),
    "log10": (NUMERIC, _POS),
    "log1p": (NUMERIC, dict(low=-0.9, high=5.0), Drawn("any", True, False, False)),
    "sqrt": (NUMERIC, _POS, Drawn("any", True, False, False)),
    "rsqrt": (NUMERIC, _POS, Drawn("any", True, False, False)),
    "sin": (NUMERIC, {}, Drawn("any", True, True, False)),
    "cos": (NUMERIC, {}, Drawn("any", True, True, False)),
    "tan": (NUMERIC, dict(low=-1.4, high=1.4), Drawn("any", True, False, False)),
    "asin": (NUMERIC, _UNIT),
    "acos": (NUMERIC, _UNIT),
    "atan": (NUMERIC, {}, Drawn("any", True, True, False)),
    "asinh": (NUMERIC, dict(low=-20.0, high=20.0), Drawn("any", True, True, False)),
    "sinh": (NUMERIC, {}, Drawn("any", True, False, False)),
    "cosh": (NUMERIC, {}),
    "tanh": (NUMERIC, {}, Drawn("any", True, True, False)),
    "sigmoid": (NUMERIC, {}, Drawn("any", True, True, False)),
    "erf": (NUMERIC, {}, Drawn("any", True, True, False)),
    "erfc": (NUMERIC, dict(low=-4.0, high=12.0)),    # into its tail, where 1 - erf(x) is all rounding
    "absolute": (NUMERIC, {}),
    "negative": (NUMERIC, {}),
    "arcsin": (NUMERIC, _UNIT),
    "arccos": (NUMERIC, _UNIT),
    "arctan": (NUMERIC, {}),
    "arcsinh": (NUMERIC, {}),
    "fix": (NUMERIC, dict(grid=True)),
    "floor": (NUMERIC, dict(grid=True), Drawn("nonbool", False, True, True)),
    "ceil": (NUMERIC, dict(grid=True), Drawn("nonbool", False, True, True)),
    "round": (NUMERIC, dict(grid=True), Drawn("nonbool", False, True, True)),       # halves: round half to even
    "trunc": (NUMERIC, dict(grid=True), Drawn("nonbool", False, True, True)),
    "sign": (NUMERIC + (BOOL,), dict(grid=True), Drawn("any", False, True, True)),
    "reciprocal": (NUMERIC, {}, Drawn("any", True, False, False)),
    "square": (NUMERIC, {}, Drawn("any", False, True, False)),
    "logical_not": (NUMERIC + (BOOL,), dict(grid=True), Drawn("any", False, True, True)),
    "bitwise_not": (INTEGRAL, {}, Drawn("intbool", False, True, False)),
    "isnan": (NUMERIC, {}, Drawn("nonbool", False, True, True)),
    "isinf": (NUMERIC, {}, Drawn("nonbool", False, True, True)),
    "isfinite": (NUMERIC, {}, Drawn("nonbool", False, True, True)),
}


def _torch_unary(name):
    f = getattr(torch, name)
    return lambda x: f(x)


def _method_unary(name):
    return lambda x: getattr(x, name)()


for _name, (_dtypes, _kw, *_) in UNARY.items():
    op(f"torch.{_name}", _torch_unary(_name), _dtypes, unary_samples(**_kw))
    # the method form, more briefly
    op(f"torch.Tensor.{_name}", _method_unary(_name), _dtypes[:1],
       lambda m, _kw=_kw: list(unary_samples(**_kw)(m))[:2])

op("torch.round", lambda x, d: torch.round(x, decimals=d), (F32,),
   lambda m: [(m((3, 4), -30, 30), 1), (m((3, 4), -300, 300), -1), (m((), 1, 2), 2)],
   variant="decimals")


# --------------------------------------------------------------------------------------------------
# Elementwise binary


def binary_samples(*, rhs="any", low=-3.0, high=3.0, rlow=None, rhigh=None, grid=False,
                   int_scalar=2, float_scalar=2.5, mixed=True):
    """rhs: "any" (values like lhs), "nonzero" (safe divisors) or "shift" (small non-negative)."""
    rlow = low if rlow is None else rlow
    rhigh = high if rhigh is None else rhigh

    def make(m: Maker):
        def lhs(shape, nc=False, dtype=None):
            return m(shape, low, high, nc=nc, dtype=dtype, grid=grid)

        def other(shape, nc=False, dtype=None):
            if rhs == "nonzero":
                return m.nonzero(shape, nc=nc, dtype=dtype)
            if rhs == "shift":
                return m(shape, 0, 5, nc=nc, dtype=dtype)
            return m(shape, rlow, rhigh, nc=nc, dtype=dtype, grid=grid)

        yield lhs((3, 4)), other((3, 4))
        yield lhs((3, 1)), other((1, 4))                # both sides broadcast
        yield lhs((2, 3, 4)), other((4,))               # rank broadcast
        yield lhs(()), other((3,))                      # 0-d with a dim tensor
        yield lhs((2, 3)), other(())
        yield lhs((0, 4)), other((1, 4))                # empty
        yield lhs((3, 4), nc=True), other((3, 4), nc=True)
        yield lhs((2, 3, 4), nc=True), other((3, 1))
        if int_scalar is not None:
            yield lhs((3, 4)), int_scalar
        if float_scalar is not None and m.dtype != BOOL:
            yield lhs((3, 4)), float_scalar
        if mixed and float_scalar is None:  # integer-only ops: mix integer dtypes only
            if m.dtype == I64:
                yield lhs((3, 4)), other((3, 4), dtype=I32)
        elif mixed:  # type promotion across dtypes and against 0-d tensors
            if m.dtype == F32:
                yield lhs((3, 4)), other((3, 4), dtype=I64)
                yield lhs((3, 4)), other((), dtype=F64)       # 0-d same category: stays f32
            elif m.dtype == BF16:
                yield lhs((3, 4)), other((), dtype=F32)       # stays bf16
                yield lhs((3, 4)), other((3, 4), dtype=F32)   # promotes to f32
            elif m.dtype == I64:
                yield lhs((3, 4)), other((), dtype=F32)       # 0-d float wins category: f32
                yield lhs((3, 4)), other((3, 4), dtype=I32)
    return make


_NUM_NONZERO = dict(rhs="nonzero")
BINARY = {
    # name: (dtypes, sample kwargs)
    "add": (NUMERIC, {}),
    "sub": (NUMERIC, {}),
    "mul": (NUMERIC + (BOOL,), {}),
    "div": (NUMERIC, _NUM_NONZERO),
    "true_divide": (NUMERIC, _NUM_NONZERO),
    "floor_divide": (NUMERIC, _NUM_NONZERO),
    "remainder": (NUMERIC, _NUM_NONZERO),
    "fmod": (NUMERIC, _NUM_NONZERO),
    "maximum": (NUMERIC + (BOOL,), dict(int_scalar=None, float_scalar=None)),
    "minimum": (NUMERIC + (BOOL,), dict(int_scalar=None, float_scalar=None)),
    "atan2": (NUMERIC, dict(int_scalar=None, float_scalar=None)),
    "eq": (NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "ne": (NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "lt": (NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "le": (NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "gt": (NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "ge": (NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "logical_and": (NUMERIC + (BOOL,), dict(grid=True, low=-1, high=1, int_scalar=None,
                                          float_scalar=None)),
    "logical_or": (NUMERIC + (BOOL,), dict(grid=True, low=-1, high=1, int_scalar=None,
                                          float_scalar=None)),
    "logical_xor": (NUMERIC + (BOOL,), dict(grid=True, low=-1, high=1, int_scalar=None,
                                          float_scalar=None)),
    "bitwise_and": (INTEGRAL, dict(float_scalar=None, low=-20, high=20, rlow=-20, rhigh=20)),
    "bitwise_or": (INTEGRAL, dict(float_scalar=None, low=-20, high=20, rlow=-20, rhigh=20)),
    "bitwise_xor": (INTEGRAL, dict(float_scalar=None, low=-20, high=20, rlow=-20, rhigh=20)),
    "bitwise_left_shift": ((I64,), dict(rhs="shift", float_scalar=None, low=-50, high=50)),
    "bitwise_right_shift": ((I64,), dict(rhs="shift", float_scalar=None, low=-50, high=50)),
}
# float specials through the binary ops that are defined on all values
_BINARY_SPECIALS = {"add", "sub", "mul", "div", "maximum", "minimum", "atan2", "eq", "ne", "lt",
                    "le", "gt", "ge", "remainder", "fmod", "floor_divide"}


def _torch_binary(name):
    f = getattr(torch, name)
    return lambda x, y: f(x, y)


def _specials_pair(m: Maker, scalar=True):
    s = m.specials()
    yield s[:, None], s[None, :]
    if scalar:
        yield s, 0.0


for _name, (_dtypes, _kw) in BINARY.items():
    op(f"torch.{_name}", _torch_binary(_name), _dtypes, binary_samples(**_kw))
    op(f"torch.Tensor.{_name}", lambda x, y, _n=_name: getattr(x, _n)(y), (F32,) if F32 in _dtypes
       else (I64,), lambda m, _kw=_kw: list(binary_samples(**_kw)(m))[:2])
    if _name in _BINARY_SPECIALS:
        op(f"torch.{_name}", _torch_binary(_name), (F32,),
           lambda m, _s=_kw.get("float_scalar", 1) is not None: _specials_pair(m, _s),
           variant="specials")

op("torch.add", lambda x, y, a: torch.add(x, y, alpha=a), NUMERIC,
   lambda m: [(m(), m(), 2), (m((2, 3)), m((3,)), -1)] +
             ([(m(), m(), 0.5), (m(()), m((2, 2)), 1.5)] if m.dtype.is_floating_point else []),
   variant="alpha")
op("torch.sub", lambda x, y, a: torch.sub(x, y, alpha=a), NUMERIC,
   lambda m: [(m(), m(), 3)] + ([(m(), m(), 0.25)] if m.dtype.is_floating_point else []),
   variant="alpha")
for _mode in ("trunc", "floor"):
    op("torch.div", lambda x, y, _mode=_mode: torch.div(x, y, rounding_mode=_mode), NUMERIC,
       binary_samples(rhs="nonzero"), variant=f"rounding_mode={_mode}")
    op("torch.div", lambda x, y, _mode=_mode: torch.div(x, y, rounding_mode=_mode), (F32,),
       _specials_pair, variant=f"rounding_mode={_mode},specials")
op("torch.div", lambda x, y, mode: torch.div(x, y, rounding_mode=mode), (F32, I64),
   lambda m: [(m(), m.nonzero(), None), (m(), m.nonzero(), "floor")], variant="rounding_mode_arg")

op("torch.pow", lambda x, y: torch.pow(x, y), (F32, BF16),
   lambda m: [(m((3, 4), 0.1, 3), m((3, 4), -2, 2)),
              (m((3, 1), 0.1, 3), m((1, 4), -2, 2)),
              (m((2, 3), -3, 3), m((2, 3), 0, 3, dtype=I64)),      # negative base, int exponent
              (m(()), 2), (m((3, 4)), 3), (m((0, 2)), 2),
              (m((3, 4), 0.1, 3), 0.5), (m((3, 4), 0.1, 3), -1.5), (m((2, 2)), 0),
              (m((3, 4), 0.1, 3, nc=True), m((4,), -1, 1)),
              (m.specials(), 2.0), (m.specials()[:, None], m.specials()[None, :])])
op("torch.pow", lambda x, y: torch.pow(x, y), (I64,),
   lambda m: [(m((3, 4), -3, 3), m((3, 4), 0, 3)), (m((3, 1), -3, 3), m((1, 4), 0, 3)),
              (m((3, 4), -3, 3), 2), (m((3, 4), -3, 3), 0), (m((2, 2), -3, 3), 0.5),
              (m((), -3, 3), m((3,), 0, 2)), (m((0, 3)), 3)])
op("torch.pow", lambda b, x: torch.pow(b, x), (F32, I64),
   lambda m: [(2.0, m((3, 4), -2, 2)), (2, m((3, 4), 0, 4)), (0.5, m((), 0, 3))],
   variant="scalar_base")


# Python operators ---------------------------------------------------------------------------------

PY_BINARY = {
    # symbol: (operator fn, dunder, dtypes, sample kwargs)
    "+": (operator.add, "add", NUMERIC, {}),
    "-": (operator.sub, "sub", NUMERIC, {}),
    "*": (operator.mul, "mul", NUMERIC + (BOOL,), {}),
    "/": (operator.truediv, "truediv", NUMERIC, _NUM_NONZERO),
    "//": (operator.floordiv, "floordiv", NUMERIC, _NUM_NONZERO),
    "%": (operator.mod, "mod", NUMERIC, _NUM_NONZERO),
    "**": (operator.pow, "pow", (F32, BF16), dict(low=0.1, high=3, rlow=-2, rhigh=2, mixed=False)),
    "&": (operator.and_, "and", INTEGRAL, dict(float_scalar=None, low=-9, high=9)),
    "|": (operator.or_, "or", INTEGRAL, dict(float_scalar=None, low=-9, high=9)),
    "^": (operator.xor, "xor", INTEGRAL, dict(float_scalar=None, low=-9, high=9)),
    "<<": (operator.lshift, "lshift", (I64,), dict(rhs="shift", float_scalar=None)),
    ">>": (operator.rshift, "rshift", (I64,), dict(rhs="shift", float_scalar=None, low=-40,
                                                    high=40)),
    "<": (operator.lt, "lt", NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "<=": (operator.le, "le", NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    ">": (operator.gt, "gt", NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    ">=": (operator.ge, "ge", NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "==": (operator.eq, "eq", NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
    "!=": (operator.ne, "ne", NUMERIC + (BOOL,), dict(grid=True, low=-2, high=2)),
}
for _sym, (_f, _d, _dtypes, _kw) in PY_BINARY.items():
    op(f"operator.{_f.__name__}", lambda x, y, _f=_f: _f(x, y), _dtypes, binary_samples(**_kw),
       variant=_sym, aliases=(f"torch.Tensor.__{_d}__",) +
       (("torch._tensor.TensorBase.pow",) if _sym == "**" else ()))

op("operator.matmul", lambda x, y: x @ y, (F32, BF16, I64),
   lambda m: [(m((3, 4)), m((4, 5))), (m((4,)), m((4,))), (m((2, 3, 4)), m((4, 2)))],
   variant="@", aliases=("torch.Tensor.__matmul__",))
op("operator.neg", lambda x: -x, NUMERIC, unary_samples(), variant="unary -",
   aliases=("torch.Tensor.__neg__",))
op("operator.pos", lambda x: +x, (F32, I64), lambda m: [(m(),)], variant="unary +",
   aliases=("torch.Tensor.__pos__",))
op("operator.abs", lambda x: abs(x), (F32, I64), lambda m: [(m(),), (m(()),)], variant="abs()",
   aliases=("torch.Tensor.__abs__",))
op("operator.invert", lambda x: ~x, INTEGRAL, unary_samples(), variant="~",
   aliases=("torch.Tensor.__invert__",))

# reflected forms: a Python scalar on the left.  Float scalars are passed both as literals (bound
# constants) and as arguments (runtime values).
REFLECTED = [
    # (variant, fn, dtypes, dunder, make)
    ("2 - x", lambda x: 2 - x, NUMERIC, "rsub", None),
    ("2.5 * x", lambda x: 2.5 * x, NUMERIC, "rmul", None),
    ("s * x", lambda x, s: s * x, NUMERIC, "rmul", "float_arg"),
    ("1 + x", lambda x: 1 + x, NUMERIC, "radd", None),
    ("s + x", lambda x, s: s + x, NUMERIC, "radd", "float_arg"),
    ("s - x", lambda x, s: s - x, NUMERIC, "rsub", "float_arg"),
    ("1 / x", lambda x: 1 / x, NUMERIC, "rtruediv", "nonzero"),
    ("x.__rdiv__(3)", lambda x: x.__rdiv__(3), NUMERIC, "rdiv", "nonzero"),
    ("x.__rmatmul__(y)", lambda x: x.__rmatmul__(x.mT), NUMERIC, "rmatmul", "matrix"),
    ("s / x", lambda x, s: s / x, NUMERIC, "rtruediv", "nonzero_float_arg"),
    ("7 // x", lambda x: 7 // x, NUMERIC, "rfloordiv", "nonzero"),
    ("7 % x", lambda x: 7 % x, NUMERIC, "rmod", "nonzero"),
    ("-7.5 % x", lambda x: -7.5 % x, (F32, BF16), "rmod", "nonzero"),
    ("2 ** x", lambda x: 2 ** x, (F32, BF16), "rpow", None),
    ("s ** x", lambda x, s: s ** x, (F32, BF16), "rpow", "pos_float_arg"),
    ("5 & x", lambda x: 5 & x, (I64,), "rand", None),
    ("5 | x", lambda x: 5 | x, (I64,), "ror", None),
    ("5 ^ x", lambda x: 5 ^ x, (I64,), "rxor", None),
    ("True & x", lambda x: True & x, (BOOL,), "rand", None),
    ("1 << x", lambda x: 1 << x, (I64,), "rlshift", "shift"),
    ("1024 >> x", lambda x: 1024 >> x, (I64,), "rrshift", "shift"),
    ("0 < x", lambda x: 0 < x, NUMERIC, "gt", None),
    ("0.5 >= x", lambda x: 0.5 >= x, NUMERIC, "le", None),
    ("1 == x", lambda x: 1 == x, NUMERIC, "eq", "grid"),
    ("1 != x", lambda x: 1 != x, NUMERIC, "ne", "grid"),
]


def _reflected_samples(kind):
    def make(m: Maker):
        if kind in ("nonzero", "nonzero_float_arg"):
            xs = [m.nonzero((3, 4)), m.nonzero(()), m.nonzero((0, 2)), m.nonzero((3, 4), nc=True)]
        elif kind == "shift":
            xs = [m((3, 4), 0, 9), m((), 0, 9)]
        elif kind == "matrix":
            xs = [m((3, 4)), m((2, 3, 4), nc=True)]
        elif kind == "grid":
            xs = [m((3, 4), -2, 2, grid=True), m((), -2, 2, grid=True)]
        elif kind == "pos_float_arg":
            xs = [m((3, 4), -2, 2), m((), -2, 2)]
        else:
            xs = [m((3, 4)), m(()), m((0, 2)), m((3, 4), nc=True)]
        if kind in ("float_arg", "nonzero_float_arg"):
            return [(x, s) for x, s in zip(xs, (2.5, -0.75, 3.0, 1e-3))]
        if kind == "pos_float_arg":
            return [(x, s) for x, s in zip(xs, (2.5, 0.5))]
        return [(x,) for x in xs]
    return make


for _variant, _fn, _dtypes, _dunder, _kind in REFLECTED:
    op(f"torch.Tensor.__{_dunder}__", _fn, _dtypes, _reflected_samples(_kind), variant=_variant)


# --------------------------------------------------------------------------------------------------
# where, clamp, casts


def _where_samples(m: Maker):
    c = m((3, 4), dtype=BOOL)
    yield c, m((3, 4)), m((3, 4))
    yield m((3, 1), dtype=BOOL), m((1, 4)), m((4,))           # three-way broadcast
    yield m((), dtype=BOOL), m((2, 3)), m(())
    yield m((0, 4), dtype=BOOL), m((0, 4)), m((1, 4))
    yield m((3, 4), nc=True, dtype=BOOL), m((3, 4), nc=True), m((3, 4))
    if m.dtype == F32:
        yield c, m((3, 4)), m((3, 4), dtype=I64)              # promotes to f32
        yield c, m((3, 4), dtype=I64), m((), dtype=F64)       # 0-d float: default dtype f32


op("torch.where", lambda c, x, y: torch.where(c, x, y), NUMERIC + (BOOL,), _where_samples)
op("torch.where", lambda c, x, s: torch.where(c, x, s), NUMERIC, lambda m: [
    (m((3, 4), dtype=BOOL), m((3, 4)), 0.0), (m((3, 4), dtype=BOOL), m((2, 3, 4)), 2),
    (m((3, 1), dtype=BOOL), m(()), -1.5)], variant="scalar_other")
op("torch.where", lambda c, x: torch.where(c, 1.0, x), NUMERIC, lambda m: [
    (m((3, 4), dtype=BOOL), m((3, 4))), (m((4,), dtype=BOOL), m((3, 4)))], variant="scalar_self")
op("torch.where", lambda c: torch.where(c, 1.0, 0), (BOOL,), lambda m: [
    (m((3, 4)),), (m(()),)], variant="two_scalars")
op("torch.Tensor.where", lambda c, x, y: x.where(c, y), (F32,), _where_samples)
op("torch.Tensor.masked_fill", lambda x, c, v: x.masked_fill(c, v), NUMERIC + (BOOL,), lambda m: [
    (m((3, 4)), m((3, 4), dtype=BOOL), -100.0 if m.dtype.is_floating_point else 7),
    (m((2, 3, 4)), m((3, 1), dtype=BOOL), 2 if m.dtype != BOOL else True),
    (m((3, 4), nc=True), m((4,), dtype=BOOL), 0),
    (m((3, 4)), m((3, 4), dtype=BOOL), 2.5),                 # into an integer tensor: truncated
    (m((3, 4)), m((3, 4), dtype=BOOL), m(())),
    (m((0, 4)), m((0, 4), dtype=BOOL), 1)])
op("torch.masked_fill", lambda x, c, v: torch.masked_fill(x, c, v), (F32,), lambda m: [
    (m((3, 4)), m((3, 4), dtype=BOOL), float("-inf")), (m(()), m((), dtype=BOOL), 3)])


def _clamp_samples(m: Maker):
    x = m((3, 4), -3, 3, grid=True)
    if m.dtype.is_floating_point:
        yield x, -0.5, 0.5
        yield x, None, 1.5
        yield x, 0.0, None
        yield x, 1.0, -1.0            # min > max: everything becomes max
        yield m.specials(), -1.0, 1.0
    else:
        yield x, -1, 2
        yield x, None, 0
        yield x, 1, None
        yield x, 0.5, 2.5             # float bounds on an int tensor promote to float
    yield m(()), -1, 1
    yield m((0, 3)), -1, 1
    yield m((3, 4), nc=True), m((3, 4)), m((3, 4)) + 1      # tensor bounds
    yield x, m((4,)), None                                  # broadcast tensor min
    yield x, None, m((3, 1))


op("torch.clamp", lambda x, lo, hi: torch.clamp(x, min=lo, max=hi), NUMERIC, _clamp_samples)
op("torch.Tensor.clamp", lambda x, lo, hi: x.clamp(lo, hi), (F32,),
   lambda m: [(m(), -1.0, 1.0), (m(), m((4,)), None)])
op("torch.clamp", lambda x, lo, hi: torch.clamp(x, lo, hi), (F32,),
   lambda m: [(m(), -1.0, 1.0), (m(), m((3, 4), -1, 0), m((3, 4), 0, 1))], variant="positional")

_CAST_TARGETS = (F32, F64, F16, BF16, I64, I32, torch.int8, torch.uint8, BOOL)


def _cast_samples(m: Maker):
    # floats cast to ints truncate toward zero: keep values in range and finite
    for target in _CAST_TARGETS:
        yield m((3, 4), -5, 5), target
    yield m((), -5, 5), I64
    yield m((0, 3)), F64
    yield m((3, 4), -5, 5, nc=True), I64
    if m.dtype.is_floating_point:
        yield m.specials(), F32       # floats keep specials
        yield torch.tensor([70000.0, -1e6, 1e-8], dtype=F32).to(m.dtype), F16  # overflow to inf
        yield m.specials(), BOOL      # nan and -0.0 to bool


for _ctor in ("float", "half", "bfloat16", "double", "int", "long", "bool"):
    op(f"torch.Tensor.{_ctor}", lambda x, _c=_ctor: getattr(x, _c)(), NUMERIC + (BOOL,),
       lambda m: [(m((3, 4), -5, 5),), (m((), -5, 5),), (m((0, 2)),), (m((3, 4), -5, 5, nc=True),)])
op("torch.Tensor.to", lambda x, d: x.to(d), NUMERIC + (BOOL,), _cast_samples, variant="dtype")
op("torch.Tensor.to", lambda x, d: x.to(dtype=d), (F32, I64),
   lambda m: [(m((3, 4), -5, 5), BF16), (m((3, 4), -5, 5), F32)], variant="dtype=")
op("torch.Tensor.to", lambda x, y: x.to(y), (F32, I64, BOOL),
   lambda m: [(m((3, 4), -5, 5), m((2,), dtype=BF16)), (m((3, 4), -5, 5), m((), dtype=I64))],
   variant="other")
op("torch.Tensor.to", lambda x: x.to("cpu", F64), (F32,), lambda m: [(m(),)], variant="device")
op("torch.Tensor.type_as", lambda x, y: x.type_as(y), NUMERIC + (BOOL,),
   lambda m: [(m((3, 4), -5, 5), m((2,), dtype=d)) for d in (F32, BF16, I64, BOOL, F64)])


# --------------------------------------------------------------------------------------------------
# Reductions


def reduction_samples(*, empty_full=True, ties=False, keepdim_none=True):
    """(x, dim, keepdim) triples."""
    def make(m: Maker):
        g = dict(grid=ties, low=-2 if ties else -3, high=2 if ties else 3)
        x = m((3, 4), **g)
        yield x, None, False
        yield x, 0, False
        yield x, -1, True
        yield m((2, 3, 4), **g), (0, 2), False
        yield m((2, 3, 4), **g), (-1, 1), True
        yield m((2, 3, 4), nc=True, **g), 1, False
        yield m.strided((3, 5), **g), 1, True
        yield m((), **g), None, False
        yield m((), **g), 0, True
        yield m((0, 3)), 1, False                       # non-empty reduced dim of an empty tensor
        if empty_full:
            yield m((0, 3)), 0, False                   # reduce over the empty dim
            yield m((0, 3)), None, False
        if keepdim_none:
            yield x, None, True
    return make


op("torch.sum", lambda x, d, k: torch.sum(x, dim=d, keepdim=k), NUMERIC + (BOOL,),
   reduction_samples())
op("torch.sum", lambda x: torch.sum(x), NUMERIC + (BOOL,), unary_samples(specials=False),
   variant="all")
op("torch.sum", lambda x, d, t: torch.sum(x, d, dtype=t), (F32, BF16, I64, BOOL),
   lambda m: [(m(), 1, F64), (m(), None, F32), (m(), 0, I64)], variant="dtype")
op("torch.Tensor.sum", lambda x, d, k: x.sum(d, keepdim=k), (F32,),
   lambda m: list(reduction_samples()(m))[:4])
op("torch.mean", lambda x, d, k: torch.mean(x, dim=d, keepdim=k), FLOATS, reduction_samples())
op("torch.mean", lambda x, t: torch.mean(x, dtype=t), (F32, BF16, I64),
   lambda m: [(m(), F32), (m(), F64)], variant="dtype")
op("torch.Tensor.mean", lambda x, d, k: x.mean(d, k), (F32,),
   lambda m: list(reduction_samples()(m))[:4])
op("torch.prod", lambda x: torch.prod(x), NUMERIC + (BOOL,),
   lambda m: [(m((3, 4), -1.5, 1.5),), (m(()),), (m((0, 3)),), (m((2, 3), nc=True),)],
   variant="all")
op("torch.prod", lambda x, d, k: torch.prod(x, d, keepdim=k), NUMERIC + (BOOL,),
   lambda m: [(m((3, 4), -1.5, 1.5), 0, False), (m((3, 4), -1.5, 1.5), -1, True),
              (m((2, 3, 4), -1.5, 1.5, nc=True), 1, False), (m((0, 3)), 0, False),
              (m(()), 0, False)])
for _r in ("amax", "amin"):
    op(f"torch.{_r}", lambda x, d, k, _r=_r: getattr(torch, _r)(x, dim=d, keepdim=k),
       NUMERIC + (BOOL,),
       lambda m: [(x, d, k) for x, d, k in reduction_samples(empty_full=False, ties=True)(m)
                  if d is not None] +
                 [(m((3, 4)), (), False)] +                      # dim=() reduces everything
                 ([(m.specials()[None], 1, False)] if m.dtype.is_floating_point else []))
    op(f"torch.{_r}", lambda x, _r=_r: getattr(torch, _r)(x), NUMERIC,
       lambda m: [(m(),), (m(()),), (m((2, 3), nc=True),)], variant="all")

_VAR_SAMPLES = [
    # (shape, dim, correction, keepdim, nc)
    ((3, 4), None, 1, False, False), ((3, 4), 1, 0, False, False), ((3, 4), 0, 1, True, False),
    ((2, 3, 4), (0, 2), 2, False, False), ((2, 3, 4), -1, 1, True, True), ((5,), 0, 0, False, True),
    ((1, 4), 0, 0, False, False), ((3, 4), None, 0.5, False, False), ((4, 6), 1, 0, True, True),
]
for _r in ("var", "std"):
    op(f"torch.{_r}",
       lambda x, d, c, k, _r=_r: getattr(torch, _r)(x, dim=d, correction=c, keepdim=k),
       FLOATS, lambda m: [(m(s, nc=nc), d, c, k) for s, d, c, k, nc in _VAR_SAMPLES])
    op(f"torch.{_r}", lambda x, u, _r=_r: getattr(torch, _r)(x, unbiased=u), FLOATS,
       lambda m: [(m(), True), (m(), False), (m((3, 4), nc=True), False)], variant="unbiased")
    op(f"torch.{_r}", lambda x, d, u, k, _r=_r: getattr(torch, _r)(x, d, u, k), FLOATS,
       lambda m: [(m((3, 4)), 1, True, False), (m((2, 3, 4)), (0, 1), False, True)],
       variant="positional")
    op(f"torch.Tensor.{_r}", lambda x, d, _r=_r: getattr(x, _r)(d), (F32,),
       lambda m: [(m(), 0), (m(), None)])

for _r in ("argmax", "argmin"):
    op(f"torch.{_r}", lambda x, d, k, _r=_r: getattr(torch, _r)(x, dim=d, keepdim=k), NUMERIC,
       lambda m: [(x, d, k) for x, d, k in reduction_samples(empty_full=False, ties=True)(m)
                  if not isinstance(d, tuple)] +
                 [(m((3, 4)), None, False), (m((3, 5)), 1, False)] +
                 ([(m.specials()[None], 1, False)] if m.dtype == F32 else []))
    op(f"torch.Tensor.{_r}", lambda x, _r=_r: getattr(x, _r)(), (F32,), lambda m: [(m(),)])

for _r in ("any", "all"):
    def _anyall_samples(m, _r=_r):
        def x(shape=(3, 4), nc=False):
            if m.dtype.is_floating_point or m.dtype == I64:
                t = m(shape, -1, 1, grid=True, nc=nc)   # with zeros
            else:
                t = m(shape, nc=nc)
            return t
        yield x(), None, False
        yield x(), 1, False
        yield x(), 0, True
        yield x((2, 3, 4)), (0, 2), False
        yield x((2, 3, 4), nc=True), -1, False
        yield x(()), None, False
        yield m((0, 3)), None, False
        yield m((0, 3)), 0, False
        yield m((0, 3)), 1, True
        ones = torch.ones((3, 4), dtype=m.dtype)
        yield ones, 1, False
        yield torch.zeros((3, 4), dtype=m.dtype), None, False

    op(f"torch.{_r}", lambda x, d, k, _r=_r: (getattr(torch, _r)(x) if d is None and not k
                                               else getattr(torch, _r)(x, dim=d, keepdim=k)),
       (BOOL, F32, I64, BF16), _anyall_samples)
    op(f"torch.Tensor.{_r}", lambda x, _r=_r: getattr(x, _r)(), (BOOL, F32), lambda m: [(m(),)])

for _r in ("max", "min"):
    op(f"torch.{_r}", lambda x, _r=_r: getattr(torch, _r)(x), NUMERIC + (BOOL,),
       lambda m: [(m(),), (m(()),), (m((2, 3, 4), nc=True),)] +
                 ([(m.specials(),)] if m.dtype.is_floating_point else []),
       variant="all")
    op(f"torch.{_r}", lambda x, d, k, _r=_r: getattr(torch, _r)(x, d, keepdim=k), NUMERIC + (BOOL,),
       lambda m: [(x, d, k) for x, d, k in reduction_samples(empty_full=False, ties=True)(m)
                  if d is not None and not isinstance(d, tuple)] +
                 ([(m.specials()[None], 1, False)] if m.dtype.is_floating_point else []),
       variant="dim")
    op(f"torch.{_r}", lambda x, d, _r=_r: getattr(torch, _r)(x, dim=d).values, NUMERIC,
       lambda m: [(m(), 1), (m((2, 3)), 0)], variant=".values")
    op(f"torch.{_r}", lambda x, d, _r=_r: getattr(torch, _r)(x, d)[1], NUMERIC,
       lambda m: [(m((3, 4), -2, 2, grid=True), 1)], variant="[1]")
    op(f"torch.{_r}", lambda x, y, _r=_r: getattr(torch, _r)(x, y), NUMERIC,
       lambda m: [(m(), m()), (m((3, 1)), m((4,)))], variant="binary")
    op(f"torch.Tensor.{_r}", lambda x, d, _r=_r: getattr(x, _r)(d), (F32,),
       lambda m: [(m(), 1), (m(), -1)])


# --------------------------------------------------------------------------------------------------
# Views and shapes

def _v(m: Maker, shape=(2, 3, 4), nc=False):
    return m(shape, nc=nc)


VIEWS = [
    # (name, fn, make)
    ("torch.reshape", lambda x, s: torch.reshape(x, s), lambda m: [
        (_v(m), (6, 4)), (_v(m), (-1,)), (_v(m), (4, -1, 2)), (_v(m, nc=True), (24,)),
        (_v(m, nc=True), (2, 12)), (m(()), (1, 1)), (m((1,)), ()), (m((0, 3)), (3, 0, 5)),
        (m((0, 3)), (-1,)), (m.strided((3, 4)), (4, 3))]),
    ("torch.Tensor.reshape", lambda x, a, b: x.reshape(a, b), lambda m: [
        (_v(m), 4, 6), (_v(m, nc=True), -1, 2)]),
    ("torch.Tensor.view", lambda x, s: x.view(s), lambda m: [
        (_v(m), (6, 4)), (_v(m), (-1,)), (m(()), (1,)), (m((0, 2)), (2, 0)),
        (m((4, 3, 5), nc=True), (2, 2, 3, 5)),   # splitting only the non-transposed dim
        (m.strided((4, 3), dim=0), (2, 2, 3))]),
    ("torch.Tensor.view", lambda x, a, b: x.view(a, b), lambda m: [(_v(m), 3, 8)]),
    ("torch.permute", lambda x, p: torch.permute(x, p), lambda m: [
        (_v(m), (2, 0, 1)), (_v(m), (-1, 0, 1)), (_v(m, nc=True), (1, 2, 0)), (m(()), ()),
        (m((0, 3)), (1, 0))]),
    ("torch.Tensor.permute", lambda x: x.permute(2, 1, 0), lambda m: [(_v(m),)]),
    ("torch.transpose", lambda x, a, b: torch.transpose(x, a, b), lambda m: [
        (_v(m), 0, 1), (_v(m), -1, 0), (_v(m, nc=True), 1, 2), (_v(m), 1, 1),
        (m((0, 4)), 0, 1)]),
    ("torch.Tensor.transpose", lambda x: x.transpose(-2, -1), lambda m: [(_v(m),)]),
    ("torch.t", lambda x: torch.t(x), lambda m: [(m((3, 4)),), (m((5,)),), (m(()),),
                                                 (m((3, 4), nc=True),), (m((0, 2)),)]),
    ("torch.Tensor.t", lambda x: x.t(), lambda m: [(m((3, 4)),)]),
    ("torch.Tensor.T.__get__", lambda x: x.T, lambda m: [(m((3, 4)),), (m((3, 4), nc=True),)]),
    ("torch.Tensor.mT.__get__", lambda x: x.mT, lambda m: [(m((2, 3, 4)),), (m((3, 4)),)]),
    ("torch.Tensor.expand", lambda x, s: x.expand(s), lambda m: [
        (m((3, 1)), (3, 4)), (m((4,)), (2, 3, 4)), (m((3, 1)), (-1, 5)), (m(()), (2, 3)),
        (m((1, 4), nc=True), (2, 3, 4)), (m((3, 1)), (3, 1)), (m((1, 2)), (0, 2))]),
    ("torch.Tensor.expand", lambda x: x.expand(2, -1, 4), lambda m: [(m((3, 1)),)]),
    ("torch.broadcast_to", lambda x, s: torch.broadcast_to(x, s), lambda m: [
        (m((3, 1)), (3, 4)), (m((4,)), (2, 3, 4)), (m((3, 1)), (-1, 5)), (m(()), (2, 3)),
        (m((1, 4), nc=True), (2, 3, 4))]),
    ("torch.Tensor.broadcast_to", lambda x: x.broadcast_to(2, 3, 4), lambda m: [(m((3, 1)),)]),
    ("torch.Tensor.expand_as", lambda x, y: x.expand_as(y), lambda m: [
        (m((3, 1)), m((3, 4))), (m(()), m((2, 2), dtype=I64)), (m((4,)), m((0, 4)))]),
    ("torch.squeeze", lambda x: torch.squeeze(x), lambda m: [
        (m((1, 3, 1, 4)),), (m(()),), (m((1,)),), (m((1, 0, 1)),), (m((3, 1), nc=True),)]),
    ("torch.squeeze", lambda x, d: torch.squeeze(x, d), lambda m: [
        (m((1, 3, 1)), 0), (m((1, 3, 1)), -1), (m((1, 3, 1)), 1), (m((1, 3, 1)), (0, 2)),
        (m(()), 0)]),
    ("torch.Tensor.squeeze", lambda x: x.squeeze(1), lambda m: [(m((2, 1, 3)),)]),
    ("torch.unsqueeze", lambda x, d: torch.unsqueeze(x, d), lambda m: [
        (m((3, 4)), 0), (m((3, 4)), -1), (m((3, 4)), 1), (m(()), 0), (m((0,)), -1),
        (m((3, 4), nc=True), 2)]),
    ("torch.Tensor.unsqueeze", lambda x: x.unsqueeze(-2), lambda m: [(m((3, 4)),)]),
    ("torch.flatten", lambda x, s, e: torch.flatten(x, s, e), lambda m: [
        (_v(m), 0, -1), (_v(m), 1, 2), (_v(m), 0, 1), (_v(m, nc=True), 0, -1), (m(()), 0, -1),
        (m((2, 0, 3)), 1, 2), (_v(m), 1, 1)]),
    ("torch.Tensor.flatten", lambda x: x.flatten(), lambda m: [(_v(m),), (_v(m, nc=True),)]),
    ("torch.unflatten", lambda x, d, s: torch.unflatten(x, d, s), lambda m: [
        (m((2, 12)), 1, (3, 4)), (m((2, 12)), -1, (2, -1, 3)), (m((6, 2), nc=True), 0, (2, 3)),
        (m((0, 4)), 1, (2, 2))]),
    ("torch.Tensor.unflatten", lambda x: x.unflatten(0, (2, 3)), lambda m: [(m((6, 2)),)]),
    ("torch.narrow", lambda x, d, s, n: torch.narrow(x, d, s, n), lambda m: [
        (_v(m), 0, 1, 1), (_v(m), -1, 1, 2), (_v(m), 1, 0, 0), (_v(m, nc=True), 2, 1, 3),
        (_v(m), 2, -3, 2)]),
    ("torch.Tensor.narrow", lambda x: x.narrow(1, 1, 2), lambda m: [(_v(m),)]),
    ("torch.select", lambda x, d, i: torch.select(x, d, i), lambda m: [
        (_v(m), 0, 1), (_v(m), -1, -1), (_v(m, nc=True), 1, 2), (m((3,)), 0, 2),
        (m((0, 3)), 1, 0)]),
    ("torch.Tensor.select", lambda x: x.select(1, 0), lambda m: [(_v(m),)]),
    ("torch.Tensor.contiguous", lambda x: x.contiguous(), lambda m: [
        (_v(m),), (_v(m, nc=True),), (m.strided((4, 3)),), (m(()),), (m((0, 3), nc=True),)]),
    ("torch.clone", lambda x: torch.clone(x), lambda m: [
        (_v(m),), (_v(m, nc=True),), (m(()),), (m((0, 3)),), (m.specials(),)]),
    ("torch.Tensor.clone", lambda x: x.clone(), lambda m: [(_v(m, nc=True),)]),
]
_VIEW_ALL_DTYPES = ("torch.reshape", "torch.permute", "torch.Tensor.expand", "torch.Tensor.view")
for _name, _fn, _make in VIEWS:
    op(_name, _fn, (F32, BF16, I64, BOOL) if _name in _VIEW_ALL_DTYPES else (F32, I64), _make)

# Indexing: ints, slices (with steps), None, Ellipsis, and int tensors (advanced indexing).
BASIC_INDEX = [
    ("x[1]", lambda x: x[1]),
    ("x[-1]", lambda x: x[-1]),
    ("x[1, 2]", lambda x: x[1, 2]),
    ("x[0, -1, 3]", lambda x: x[0, -1, 3]),
    ("x[1:3]", lambda x: x[1:3]),
    ("x[::2]", lambda x: x[::2]),
    ("x[:, 1::2]", lambda x: x[:, 1::2]),
    ("x[..., ::3]", lambda x: x[..., ::3]),
    ("x[-2:, :-1]", lambda x: x[-2:, :-1]),
    ("x[5:10]", lambda x: x[5:10]),                 # out of range: empty
    ("x[-100:100]", lambda x: x[-100:100]),         # clamped
    ("x[2:1]", lambda x: x[2:1]),                   # empty
    ("x[None]", lambda x: x[None]),
    ("x[:, None, ::2]", lambda x: x[:, None, ::2]),
    ("x[..., 1]", lambda x: x[..., 1]),
    ("x[0, ..., None]", lambda x: x[0, ..., None]),
    ("x[None, ..., None]", lambda x: x[None, ..., None]),
    ("x[...]", lambda x: x[...]),
    ("x[:]", lambda x: x[:]),
    ("x[1, :, 1:4:2]", lambda x: x[1, :, 1:4:2]),
    ("x[[0, 2]]", lambda x: x[[0, 2]]),             # a list constant: advanced indexing
    ("x[..., [-2]]", lambda x: x[..., [-2]]),        # one row, kept as a dim (Falcon's qkv)
    ("x[0, :, [1, 2, 4]]", lambda x: x[0, :, [1, 2, 4]]),    # ints select first in torch
    ("x[:, [3, 3, 0], None]", lambda x: x[:, [3, 3, 0], None]),
    ("x[None, [-1, 1], 2]", lambda x: x[None, [-1, 1], 2]),
]
for _variant, _fn in BASIC_INDEX:
    op("operator.getitem", _fn, (F32, BF16, I64, BOOL),
       lambda m: [(m((3, 5, 6)),), (m((3, 5, 6), nc=True),)], variant=_variant,
       aliases=("torch.Tensor.__getitem__",))
op("operator.getitem", lambda x: x[None], (F32, I64), lambda m: [(m(()),)], variant="0-d[None]")
op("operator.getitem", lambda x: x[...], (F32, I64), lambda m: [(m(()),)], variant="0-d[...]")
op("operator.getitem", lambda x: x[1:], (F32, I64), lambda m: [(m((0, 3)),), (m((4, 0)),)],
   variant="empty[1:]")

ADV_INDEX = [
    # (variant, fn, make(m) -> args); int64 index tensors are inputs of fn
    ("x[i]", lambda x, i: x[i], lambda m: [(m((5, 4)), m.index((3,), 5)),
                                           (m((5, 4)), m.index((2, 3), 5)),
                                           (m((5, 4), nc=True), m.index((), 5)),
                                           (m((5, 4)), m.index((0,), 5))]),
    ("x[:, i]", lambda x, i: x[:, i], lambda m: [(m((3, 5)), m.index((4,), 5)),
                                                 (m((2, 3, 5), nc=True), m.index((2, 2), 3))]),
    ("x[i, j]", lambda x, i, j: x[i, j], lambda m: [(m((4, 5)), m.index((3,), 4), m.index((3,), 5)),
                                                    (m((4, 5)), m.index((3, 1), 4),
                                                     m.index((1, 2), 5))]),   # broadcast indices
    ("x[i, :, j]", lambda x, i, j: x[i, :, j],      # separated: advanced dims go first
     lambda m: [(m((3, 4, 5)), m.index((2,), 3), m.index((2,), 5))]),
    ("x[:, i, j]", lambda x, i, j: x[:, i, j],      # adjacent: advanced dims stay in place
     lambda m: [(m((3, 4, 5, 2)), m.index((2,), 4), m.index((2,), 5))]),
    ("x[1, i]", lambda x, i: x[1, i], lambda m: [(m((3, 4)), m.index((5,), 4))]),
    ("x[i, 1:3]", lambda x, i: x[i, 1:3], lambda m: [(m((3, 4)), m.index((2,), 3))]),
    ("x[..., i]", lambda x, i: x[..., i], lambda m: [(m((2, 3, 4)), m.index((2,), 4))]),
    ("x[None, i]", lambda x, i: x[None, i], lambda m: [(m((3, 4)), m.index((2,), 3))]),
    ("x[i.int()]", lambda x, i: x[i], lambda m: [(m((5, 4)), m.index((3,), 5).to(I32))]),
    ("x[:, i2d]", lambda x, i: x[:, i], lambda m: [(m((3, 6)), m.index((4, 4), 6)),     # LeViT's
                                                   (m((2, 5, 3), nc=True), m.index((2, 3), 5))]),  # bias
    ("x[0, ..., i, None]", lambda x, i: x[0, ..., i, None], lambda m: [
        (m((2, 3, 4, 5)), m.index((2, 2), 4)), (m((2, 3, 4, 5)), m.index((), 4))]),
    ("x[None, i, 1:]", lambda x, i: x[None, i, 1:], lambda m: [(m((4, 5)), m.index((3,), 4))]),
]
for _variant, _fn, _make in ADV_INDEX:
    op("operator.getitem", _fn, (F32, BF16, I64, BOOL), _make, variant=_variant,
       aliases=("torch.Tensor.__getitem__",))


# Joining and splitting ----------------------------------------------------------------------------

op("torch.cat", lambda a, b, d: torch.cat([a, b], dim=d), (F32, BF16, I64, BOOL),
   lambda m: [(m((2, 3)), m((4, 3)), 0), (m((2, 3)), m((2, 1)), -1), (m((2, 3), nc=True),
              m((2, 3)), 1), (m((0, 3)), m((2, 3)), 0), (m((2, 3)), m((0,)), 0),  # legacy empty
              (m((2, 3)), m((2, 3), dtype=I64 if m.dtype != I64 else F32), 0),    # promotes
              (m((1, 2, 3)), m((1, 2, 3), nc=True), 2)])
op("torch.cat", lambda ts, d: torch.cat(ts, d), (F32, I64),
   lambda m: [([m((1, 2)), m((2, 2)), m((3, 2))], 0), ((m((2,)),), 0), ([m((2, 1)), m((2, 3))], 1)],
   variant="list_input")
op("torch.concat", lambda a, b: torch.concat((a, b)), (F32,), lambda m: [(m((2, 3)), m((1, 3)))])
op("torch.stack", lambda a, b, d: torch.stack([a, b], d), (F32, BF16, I64, BOOL),
   lambda m: [(m((2, 3)), m((2, 3)), 0), (m((2, 3)), m((2, 3), nc=True), -1),
              (m(()), m(()), 0), (m((0, 2)), m((0, 2)), 1), (m((2, 3)), m((2, 3)), 2)])
op("torch.stack", lambda ts: torch.stack(ts), (F32,),
   lambda m: [([m((3,)), m((3,)), m((3,))],)], variant="list_input")
op("torch.split", lambda x, s, d: torch.split(x, s, d), (F32, BF16, I64, BOOL),
   lambda m: [(m((5, 4)), 2, 0), (m((5, 4)), [1, 3], 1), (m((5, 4)), 10, 0),
              (m((5, 4), nc=True), 3, 1), (m((0, 4)), 2, 1), (m((2, 6)), (2, 0, 4), -1)])
op("torch.Tensor.split", lambda x: x.split(2), (F32,), lambda m: [(m((5, 3)),)])
op("torch.chunk", lambda x, c, d: torch.chunk(x, c, d), (F32, BF16, I64, BOOL),
   lambda m: [(m((6, 4)), 3, 0), (m((5, 4)), 2, 0), (m((5, 4)), 5, 1), (m((5, 4), nc=True), 2, -1),
              (m((0, 4)), 2, 0)])
op("torch.Tensor.chunk", lambda x: x.chunk(2, 1), (F32,), lambda m: [(m((3, 4)),)])
op("torch.unbind", lambda x, d: torch.unbind(x, d), (F32, BF16, I64, BOOL),
   lambda m: [(m((3, 4)), 0), (m((3, 4)), -1), (m((2, 3, 4), nc=True), 1), (m((0, 3)), 0),
              (m((3,)), 0)])
op("torch.Tensor.unbind", lambda x: x.unbind(), (F32,), lambda m: [(m((2, 3)),)])
op("torch.roll", lambda x, s, d: torch.roll(x, s, d), (F32, BF16, I64, BOOL),
   lambda m: [(m((3, 4)), 1, 0), (m((3, 4)), -5, 1), (m((2, 5, 6), nc=True), (2, -1), (1, 2)),
              (m((3, 4)), 0, 0), (m((3, 4)), 4, -1), (m((0, 3)), 2, 0), (m((2, 3)), (1, 1), (1, 1))])
op("torch.roll", lambda x, s: torch.roll(x, s), (F32,), lambda m: [(m((3, 4)), 5)], variant="flat")
op("torch.Tensor.roll", lambda x: x.roll(-2, 1), (F32,), lambda m: [(m((2, 5)),)])
op("torch.nn.functional.pad", lambda x, p: F.pad(x, p), (F32, BF16, I64, BOOL),
   lambda m: [(m((2, 3)), (1, 2)), (m((2, 3, 4), nc=True), (0, 1, 2, 0)), (m((2, 3)), (0, 0, 0, 0)),
              (m((2, 5)), (-1, -2)), (m((2, 4)), (2, -1, -1, 1)), (m((0, 3)), (1, 1)),
              (m((1, 2, 3)), (1, 1, 1, 1, 1, 1))])
op("torch.nn.functional.pad", lambda x, p, v: F.pad(x, p, value=v), (F32, I64),
   lambda m: [(m((2, 3)), (1, 1), 2.5 if m.dtype.is_floating_point else 3), (m((2, 3)), (0, 2), -INF
              if m.dtype.is_floating_point else -7)], variant="value")
op("torch.nn.functional.pad", lambda x, p, mode: F.pad(x, p, mode=mode), (F32,),
   lambda m: [(m((1, 2, 5)), (2, 1), "reflect"), (m((1, 2, 5)), (1, 1), "replicate"),
              (m((1, 2, 5)), (1, 2), "circular")], variant="mode")
op("torch.constant_pad_nd", lambda x, p: torch.constant_pad_nd(x, p, 1.5), (F32,),
   lambda m: [(m((2, 3)), (1, 0, 0, 1)), (m((3,)), (-1, 2))])


# --------------------------------------------------------------------------------------------------
# Factories (deterministic ones compare exactly; random ones compare metadata)

op("torch.zeros", lambda s, d: torch.zeros(s, dtype=d), (F32,),
   lambda m: [((2, 3), F32), ((0,), I64), ((), BOOL), ((2, 1, 3), BF16), ((4,), None)])
op("torch.zeros", lambda: torch.zeros(2, 3), (F32,), lambda m: [()], variant="varargs")
op("torch.ones", lambda s, d: torch.ones(s, dtype=d), (F32,),
   lambda m: [((2, 3), F32), ((0, 2), I64), ((), BOOL), ((3,), BF16)])
op("torch.ones", lambda n: torch.ones(n, 2), (F32,), lambda m: [(3,), (0,)], variant="varargs")
op("torch.full", lambda s, v: torch.full(s, v), (F32,),
   lambda m: [((2, 3), 1.5), ((2, 3), 7), ((2,), True), ((), -2.25), ((0, 3), 1.0),
              ((2, 2), INF)])
op("torch.full", lambda s, v, d: torch.full(s, v, dtype=d), (F32,),
   lambda m: [((2, 3), 1.5, F64), ((2, 3), 3, BF16), ((2,), 2.0, I64), ((3,), 0, BOOL)],
   variant="dtype")
op("torch.arange", lambda n: torch.arange(n), (F32,), lambda m: [(5,), (0,), (1,)])
op("torch.arange", lambda a, b, s: torch.arange(a, b, s), (F32,),
   lambda m: [(1, 10, 3), (10, 0, -3), (0, 5, 1)], variant="start_end_step")
op("torch.arange", lambda: torch.arange(0, 1, 0.25), (F32,), lambda m: [()], variant="float_lit")
op("torch.arange", lambda a, b, s: torch.arange(a, b, s), (F32,),
   lambda m: [(0.0, 1.0, 0.25), (-1.5, 2.0, 0.5)], variant="float_args")
op("torch.arange", lambda n, d: torch.arange(n, dtype=d), (F32,),
   lambda m: [(5, F32), (4, BF16), (3, F64)], variant="dtype")
for _like in ("zeros_like", "ones_like"):
    op(f"torch.{_like}", lambda x, _l=_like: getattr(torch, _l)(x), NUMERIC + (BOOL,),
       lambda m: [(m((2, 3)),), (m(()),), (m((0, 3)),), (m((2, 3), nc=True),)])
    op(f"torch.{_like}", lambda x, d, _l=_like: getattr(torch, _l)(x, dtype=d), (F32, I64),
       lambda m: [(m((2, 3)), I64), (m((2, 3)), BF16), (m((2, 3)), BOOL)], variant="dtype")
op("torch.Tensor.new_zeros", lambda x: x.new_zeros((2, 5)), NUMERIC + (BOOL,),
   lambda m: [(m((2, 3)),), (m(()),)])
op("torch.Tensor.new_zeros", lambda x, d: x.new_zeros(4, 3, dtype=d), (F32,),
   lambda m: [(m((2, 3)), I64), (m((2, 3)), BF16)], variant="dtype")
op("torch.Tensor.new_ones", lambda x: x.new_ones(3), NUMERIC + (BOOL,), lambda m: [(m((2, 3)),)])
op("torch.Tensor.new_full", lambda x, v: x.new_full((2, 2), v), NUMERIC,
   lambda m: [(m((2, 3)), 2.5 if m.dtype.is_floating_point else 2), (m(()), 1)])
op("torch.full_like", lambda x, v: torch.full_like(x, v), NUMERIC + (BOOL,),
   lambda m: [(m((2, 3)), 2.5 if m.dtype.is_floating_point else 2), (m(()), 1),
              (m((0, 2)), 3), (m((2, 3), nc=True), 0)])
op("torch.full_like", lambda x, v, d: torch.full_like(x, v, dtype=d), (F32, I64),
   lambda m: [(m((2, 3)), 2.5, F64), (m((2, 3)), 1, BOOL)], variant="dtype")

# Random factories: compare shape/dtype/device, and that two calls differ.
op("torch.rand", lambda: torch.rand(4, 5), (F32,), lambda m: [()], check="random")
op("torch.rand", lambda s, d: torch.rand(s, dtype=d), (F32,),
   lambda m: [((3, 4), F32), ((16,), BF16), ((2, 2, 2), F64)], variant="dtype", check="random")
op("torch.randn", lambda: torch.randn(4, 5), (F32,), lambda m: [()], check="random")
op("torch.randn", lambda s, d: torch.randn(s, dtype=d), (F32,),
   lambda m: [((3, 4), F32), ((16,), BF16)], variant="dtype", check="random")
op("torch.rand_like", lambda x: torch.rand_like(x), FLOATS + (F64,),
   lambda m: [(m((3, 4)),), (m((3, 4), nc=True),)], check="random")
op("torch.randn_like", lambda x: torch.randn_like(x), FLOATS + (F64,),
   lambda m: [(m((3, 4)),), (m((5, 2, 2)),)], check="random")
op("torch.rand_like", lambda x: torch.rand_like(x, dtype=F32), (I64,),
   lambda m: [(m((3, 4)),)], variant="dtype", check="random")


# --------------------------------------------------------------------------------------------------
# torch.nn.functional

NNF = "torch.nn.functional"
op(f"{NNF}.relu", lambda x: F.relu(x), NUMERIC, unary_samples())
op(f"{NNF}.gelu", lambda x: F.gelu(x), FLOATS, unary_samples())
op(f"{NNF}.gelu", lambda x, a: F.gelu(x, approximate=a), FLOATS,
   lambda m: [(m(), "tanh"), (m((2, 3, 4), nc=True), "tanh"), (m.specials(), "tanh"),
              (m(), "none")], variant="approximate")
op(f"{NNF}.silu", lambda x: F.silu(x), FLOATS, unary_samples())
op(f"{NNF}.sigmoid", lambda x: F.sigmoid(x), FLOATS, unary_samples())
op(f"{NNF}.softplus", lambda x: F.softplus(x), FLOATS, unary_samples(-30.0, 30.0))
op(f"{NNF}.softplus", lambda x: F.softplus(x, beta=2, threshold=3), FLOATS,
   lambda m: [(m((4, 5), -4.0, 4.0),), (torch.tensor([1.5, 1.49, -1.5, 0.0], dtype=m.dtype),), (m.specials(),)],
   variant="beta_threshold")
op(f"{NNF}.normalize", lambda x: F.normalize(x, dim=-1), FLOATS,
   lambda m: [(m((4, 5)),), (m((2, 3, 4), nc=True),), (torch.zeros(2, 3, dtype=m.dtype),), (m.specials(),)])
op(f"{NNF}.normalize", lambda x: F.normalize(x, p=1.0, dim=0), FLOATS, lambda m: [(m((4, 5)),)], variant="p1")
op(f"{NNF}.adaptive_avg_pool2d", lambda x, s: F.adaptive_avg_pool2d(x, s), FLOATS,
   lambda m: [(m((2, 3, 5, 7)), 1), (m((2, 3, 4, 6), nc=True), (1, 1)), (m((3, 4, 4)), [1, 1]),
              (m((2, 3, 4, 6)), (2, 3)), (m((1, 2, 3, 3)).contiguous(memory_format=torch.channels_last), 1)])
# the hard activations, around and exactly at their bounds (where the gradients' conventions differ)
_BOUNDS = lambda m: [(m((4, 5), -8.0, 8.0),), (m((2, 3, 4), -8.0, 8.0, nc=True),), (m(()),),  # noqa: E731
                     (torch.tensor([-3.0, 3.0, 0.0, 6.0, -6.0, -1.0, 1.0, 2.5], dtype=m.dtype),),
                     (m.specials(),)]
op(f"{NNF}.hardswish", lambda x: F.hardswish(x), FLOATS, _BOUNDS)
op(f"{NNF}.hardsigmoid", lambda x: F.hardsigmoid(x), FLOATS, _BOUNDS)
op(f"{NNF}.relu6", lambda x: F.relu6(x), FLOATS, _BOUNDS)
op(f"{NNF}.hardtanh", lambda x: F.hardtanh(x), FLOATS, _BOUNDS)
op(f"{NNF}.hardtanh", lambda x: F.hardtanh(x, -0.5, 2), FLOATS, _BOUNDS, variant="bounds")
op(f"{NNF}.leaky_relu", lambda x: F.leaky_relu(x), FLOATS, _BOUNDS)
op(f"{NNF}.leaky_relu", lambda x: F.leaky_relu(x, 0.2), FLOATS, _BOUNDS, variant="slope")
op(f"{NNF}.leaky_relu", lambda x: F.leaky_relu(x, -1.5), FLOATS, _BOUNDS, variant="negative_slope")
op(f"{NNF}.tanh", lambda x: F.tanh(x), FLOATS, unary_samples())


def _softmax_samples(m: Maker):
    yield m((3, 5)), -1
    yield m((3, 5)), 0
    yield m((2, 3, 4), nc=True), 1
    yield m(()), 0
    yield m((0, 4)), -1
    yield m((2, 3)) * 30, 1                                     # large logits
    yield torch.tensor([[0.0, -INF, 1.0], [-INF, 2.0, -INF]], dtype=m.dtype), 1   # masked


op(f"{NNF}.softmax", lambda x, d: F.softmax(x, dim=d), FLOATS, _softmax_samples)
op(f"{NNF}.log_softmax", lambda x, d: F.log_softmax(x, dim=d), FLOATS, _softmax_samples)
op(f"{NNF}.softmax", lambda x, d, t: F.softmax(x, d, dtype=t), (F32, BF16),
   lambda m: [(m((3, 5)), -1, F64), (m((3, 5)), 0, F32)], variant="dtype")
op(f"{NNF}.log_softmax", lambda x, t: F.log_softmax(x, -1, dtype=t), (BF16,),
   lambda m: [(m((3, 5)), F32)], variant="dtype")
op("torch.softmax", lambda x, d: torch.softmax(x, d), (F32,), lambda m: [(m(), 1)])
op("torch.Tensor.softmax", lambda x: x.softmax(-1), (F32,), lambda m: [(m(),)])
op("torch.log_softmax", lambda x, d: torch.log_softmax(x, d), (F32,), lambda m: [(m(), 1)])


def _layer_norm_samples(m: Maker):
    yield m((2, 3, 8)), (8,), m((8,)), m((8,)), 1e-5
    yield m((2, 3, 8)), (8,), None, None, 1e-5
    yield m((2, 3, 8)), (3, 8), m((3, 8)), None, 1e-3
    yield m((2, 8, 3), nc=True), (3,), m((3,)), m((3,)), 1e-5
    yield m((4, 8)) * 50 + 100, (8,), m((8,)), m((8,)), 1e-5   # large mean: cancellation
    yield m((0, 8)), (8,), m((8,)), m((8,)), 1e-5
    yield m((5,)), (5,), None, m((5,)), 1e-6


op(f"{NNF}.layer_norm", lambda x, s, w, b, e: F.layer_norm(x, s, w, b, e), FLOATS,
   _layer_norm_samples)


def _rms_norm_samples(m: Maker):
    yield m((2, 3, 8)), (8,), m((8,)), None
    yield m((2, 3, 8)), (8,), None, 1e-6
    yield m((2, 3, 8)), (3, 8), m((3, 8)), 1e-5
    yield m((2, 8, 4), nc=True), (4,), m((4,)), None
    yield m((0, 8)), (8,), m((8,)), None


op(f"{NNF}.rms_norm", lambda x, s, w, e: F.rms_norm(x, s, w, e), FLOATS, _rms_norm_samples)


def _group_norm_samples(m: Maker):
    yield m((2, 6, 4, 4)), 3, m((6,)), m((6,)), 1e-5
    yield m((2, 6, 4, 4)), 1, None, None, 1e-5                  # PoolFormer's one group
    yield m((3, 4, 5)), 4, m((4,)), None, 1e-3
    yield m((2, 4)), 2, None, m((4,)), 1e-5
    yield m((2, 6, 3, 3), nc=True), 2, m((6,)), m((6,)), 1e-5
    yield m((2, 4, 3, 3)) * 50 + 100, 2, m((4,)), m((4,)), 1e-5   # large mean: cancellation
    yield m((0, 4, 2)), 2, m((4,)), m((4,)), 1e-5


op(f"{NNF}.group_norm", lambda x, g, w, b, e: F.group_norm(x, g, w, b, e), FLOATS,
   _group_norm_samples)
op("torch.group_norm", lambda x, g, w, b: torch.group_norm(x, g, w, b), (F32,),
   lambda m: [(m((2, 6, 4)), 3, m((6,)), m((6,)))])

op(f"{NNF}.dropout", lambda x, p: F.dropout(x, p, training=False), FLOATS,
   lambda m: [(m(), 0.5), (m((0, 3)), 0.3), (m((2, 3), nc=True), 0.9)], variant="eval")
op(f"{NNF}.dropout", lambda x, p: F.dropout(x, p, training=True), FLOATS,
   lambda m: [(m(), 0.0), (m(), 1.0)], variant="train,p in {0,1}")


def check_dropout(args, actual, p=0.5):
    """training=True: same shape/dtype; zeroed fraction plausible; kept values scaled by 1/(1-p)."""
    x = args[0]
    assert actual.shape == x.shape and actual.dtype == x.dtype and actual.device == x.device
    zeroed = (actual == 0).double().mean().item()
    n = x.numel()
    sigma = (p * (1 - p) / n) ** 0.5
    assert abs(zeroed - p) < 6 * sigma + 1e-9, f"zeroed fraction {zeroed} for p={p} over {n}"
    kept = actual != 0
    torch.testing.assert_close(actual[kept], (x / (1 - p))[kept])


op(f"{NNF}.dropout", lambda x: F.dropout(x, 0.5, training=True), (F32,),
   lambda m: [(m((64, 64), 0.5, 2),)], variant="train", check=check_dropout)
op(f"{NNF}.dropout", lambda x: F.dropout(x, 0.5), (BF16,),   # training defaults to True
   lambda m: [(m((64, 64), 0.5, 2),)], variant="train_default", check=check_dropout)

op(f"{NNF}.linear", lambda x, w, b: F.linear(x, w, b), FLOATS + (I64,),
   lambda m: [(m((2, 5)), m((3, 5)), m((3,))), (m((2, 5)), m((3, 5)), None),
              (m((5,)), m((3, 5)), m((3,))), (m((2, 4, 5)), m((3, 5)), m((3,))),
              (m((2, 5)), m((3, 5), nc=True), None), (m((0, 5)), m((3, 5)), m((3,))),
              (m((2, 5)), m((1, 5)), m(()))])
op(f"{NNF}.linear", lambda x, w: F.linear(x, w), (F32,), lambda m: [(m((2, 5)), m((3, 5)))],
   variant="no_bias_arg")


def _ce_samples(m: Maker):
    for red in ("mean", "sum", "none"):
        yield m((4, 5)), m.index((4,), 5) % 5, red
    yield m((4, 5), nc=True), m.index((4,), 5) % 5, "mean"
    yield m((2, 5, 3)), m.index((2, 3), 5) % 5, "mean"        # (N, C, d1)
    yield m((2, 5, 3)), m.index((2, 3), 5) % 5, "none"
    yield m((5,)), torch.tensor(2), "sum"                      # unbatched


op(f"{NNF}.cross_entropy", lambda x, t, r: F.cross_entropy(x, t, reduction=r), FLOATS,
   _ce_samples)
op(f"{NNF}.cross_entropy", lambda x, t, r: F.cross_entropy(x, t, reduction=r), (F32,),
   lambda m: [(m((4, 5)), torch.tensor([1, -100, 4, -100]), r) for r in ("mean", "sum", "none")],
   variant="ignore_index")
op(f"{NNF}.cross_entropy", lambda x, t: F.cross_entropy(x, t, label_smoothing=0.1), (F32,),
   lambda m: [(m((4, 5)), torch.tensor([1, 0, 4, 2]))], variant="label_smoothing")

op(f"{NNF}.embedding", lambda i, w: F.embedding(i, w), (F32, BF16, I64),
   lambda m: [(m.index((2, 3), 10) % 10, m((10, 4))), (m.index((5,), 10) % 10, m((10, 4))),
              (torch.tensor(3), m((10, 4))), (m.index((0,), 10) % 10, m((10, 4))),
              (m.index((3,), 4) % 4, m((4, 10), nc=True))])
op(f"{NNF}.embedding", lambda i, w: F.embedding(i, w, padding_idx=0), (F32,),
   lambda m: [(torch.tensor([0, 2, 0, 1]), m((3, 4)))], variant="padding_idx")


def _sdpa_samples(m: Maker):
    q, k, v = m((2, 2, 4, 8)), m((2, 2, 4, 8)), m((2, 2, 4, 8))
    yield q, k, v, None, False
    yield q, k, v, None, True
    yield m((2, 2, 3, 8)), m((2, 2, 5, 8)), m((2, 2, 5, 6)), None, False
    yield m((2, 2, 3, 8)), m((2, 2, 5, 8)), m((2, 2, 5, 6)), None, True   # L != S: top-left causal
    yield q, k, v, m((4, 4), dtype=BOOL) | torch.eye(4, dtype=BOOL), False  # bool mask
    yield q, k, v, m((2, 1, 4, 4)), False                     # float additive mask, broadcast
    # rows masked throughout: eager's math form (a float mask needing a gradient) gives them 0
    dead = m((4, 4), dtype=BOOL) | torch.eye(4, dtype=BOOL)
    dead[2] = False
    yield q, k, v, dead, False
    bias = m((2, 1, 4, 4)).detach().clone()
    bias[:, :, 1] = float("-inf")
    yield q, k, v, bias, False
    yield m((3, 4, 8)), m((3, 4, 8)), m((3, 4, 8)), None, True   # 3-d
    yield m((2, 2, 4, 8), nc=True), m.strided((2, 2, 4, 8), dim=1), v, None, False


op(f"{NNF}.scaled_dot_product_attention",
   lambda q, k, v, mask, c: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=c),
   FLOATS, _sdpa_samples)
op(f"{NNF}.scaled_dot_product_attention",
   lambda q, k, v, s: F.scaled_dot_product_attention(q, k, v, scale=s), (F32,),
   lambda m: [(m((1, 2, 4, 8)), m((1, 2, 4, 8)), m((1, 2, 4, 8)), 0.5)], variant="scale")


# --------------------------------------------------------------------------------------------------
# Matrix products

op("torch.matmul", lambda a, b: torch.matmul(a, b), (F32, BF16, I64),
   lambda m: [(m((3, 4)), m((4, 5))), (m((4,)), m((4,))), (m((4,)), m((4, 5))),
              (m((3, 4)), m((4,))), (m((2, 3, 4)), m((4, 5))), (m((4,)), m((2, 4, 3))),
              (m((2, 1, 3, 4)), m((5, 4, 2))), (m((3, 4), nc=True), m((4, 5), nc=True)),
              (m((0, 4)), m((4, 5))), (m((3, 0)), m((0, 5)))])
op("torch.Tensor.matmul", lambda a, b: a.matmul(b), (F32,), lambda m: [(m((3, 4)), m((4, 2)))])
op("torch.einsum", lambda a, b: torch.einsum("bghid,bghjd->bghij", a, b), (F32, BF16, I64),
   lambda m: [(m((2, 3, 2, 4, 5)), m((2, 3, 2, 6, 5))), (m((1, 2, 1, 3, 4), nc=True), m((1, 2, 1, 3, 4))),
              (m((2, 1, 2, 0, 3)), m((2, 1, 2, 4, 3)))])
op("torch.einsum", lambda a, b: torch.einsum("b h w c, h k c -> b h w k", a, b), (F32,),
   lambda m: [(m((2, 4, 5, 8)), m((4, 7, 8)))], variant="relative_positions")
op("torch.einsum", lambda a, b: torch.einsum("nm,hnm->h", (a, b)), (F32,),
   lambda m: [(m((5, 6)), m((3, 5, 6)))], variant="operand_tuple")
op("torch.einsum", lambda a, b: torch.einsum("ij,ji->i", a, b), (F32,),
   lambda m: [(m((3, 4)), m((4, 3)))], variant="diagonal_of_product")
op("torch.einsum", lambda a, b: torch.einsum("i,j->ij", a, b), (F32,),
   lambda m: [(m((3,)), m((4,)))], variant="outer")
op("torch.einsum", lambda a, b: torch.einsum("ij,kj->", a, b), (F32,),
   lambda m: [(m((3, 4)), m((2, 4)))], variant="summed_in_one_operand")
op("torch.einsum", lambda a, b: torch.einsum("ij,jk->ik", a, b), (F32,),
   lambda m: [(m((3, 1)), m((4, 5)))], variant="broadcast_size")
op("torch.mm", lambda a, b: torch.mm(a, b), (F32, BF16, I64),
   lambda m: [(m((3, 4)), m((4, 5))), (m((3, 4), nc=True), m((4, 5))), (m((1, 4)), m((4, 1))),
              (m((3, 0)), m((0, 2)))])
op("torch.addmm", lambda c, a, b: torch.addmm(c, a, b), (F32, BF16, I64),
   lambda m: [(m((5,)), m((3, 4)), m((4, 5))), (m((3, 5)), m((3, 4), nc=True), m((4, 5))),
              (m((1, 5)), m((3, 0)), m((0, 5))), (m(()), m((2, 4)), m((4, 3)))])
op("torch.addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0), (F32,),
   lambda m: [(m((5,)), m((3, 4)), m((4, 5)))], variant="beta_alpha")
op("torch.addmm", lambda c, a, b: torch.addmm(c, a, b, beta=0), (F32,),
   lambda m: [(m.specials()[:5], m((3, 4)), m((4, 5)))], variant="beta0")
op("torch.Tensor.addmm", lambda c, a, b: c.addmm(a, b), (F32,),
   lambda m: [(m((3, 5)), m((3, 4)), m((4, 5)))])
op("torch.baddbmm", lambda c, a, b: torch.baddbmm(c, a, b), (F32, BF16, I64),
   lambda m: [(m((2, 3, 5)), m((2, 3, 4)), m((2, 4, 5))), (m((5,)), m((2, 3, 4), nc=True), m((2, 4, 5))),
              (m((1, 3, 1)), m((2, 3, 0)), m((2, 0, 5))), (m(()), m((2, 2, 4)), m((2, 4, 3)))])
op("torch.baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=0.125), (F32,),
   lambda m: [(m((2, 3, 5)), m((2, 3, 4)), m((2, 4, 5)))], variant="beta_alpha")
op("torch.baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, beta=0), (F32,),
   lambda m: [(m.specials()[:5], m((2, 3, 4)), m((2, 4, 5)))], variant="beta0")
op("torch.baddbmm", lambda c, a, b: torch.baddbmm(c, a, b, alpha=2), (I64,),
   lambda m: [(m((2, 3, 5)), m((2, 3, 4)), m((2, 4, 5)))], variant="integer_alpha")
op("torch.Tensor.baddbmm", lambda c, a, b: c.baddbmm(a, b, beta=1.0, alpha=0.5), (F32,),
   lambda m: [(m((2, 3, 5)), m((2, 3, 4)), m((2, 4, 5)))])
op("torch.Tensor.baddbmm", lambda c, a, b: c.baddbmm(batch1=a, batch2=b, beta=1.0, alpha=0.5), (F32,),
   lambda m: [(m((2, 1, 5)), m((2, 3, 4)), m((2, 4, 5)))], variant="keywords")
op("torch.addmm", lambda c, a, b: torch.addmm(input=c, mat1=a, mat2=b, alpha=2.0), (F32,),
   lambda m: [(m((5,)), m((3, 4)), m((4, 5)))], variant="keywords")
op("torch.addcmul", lambda x, a, b: torch.addcmul(x, a, b, value=0.5), (F32, BF16, I64),
   lambda m: [(m((3, 4)), m((3, 4)), m((4,))), (m((2, 3, 4), nc=True), m((3, 4)), m(())), (m(()), m((2, 3)), m((2, 3)))])
op("torch.Tensor.addcmul", lambda x, a, b: x.addcmul(a, b), (F32,), lambda m: [(m((3, 4)), m((3, 4)), m((3, 4)))])
op("torch.Tensor.addcdiv", lambda x, a, b: x.addcdiv(a, b), (F32,), lambda m: [(m((3, 4)), m((3, 4)), m.nonzero((3, 4)))])
op("torch.addcdiv", lambda x, a, b: torch.addcdiv(x, a, b, value=-2), (F32, BF16),
   lambda m: [(m((3, 4)), m((3, 4)), m.nonzero((4,))), (m((2, 3, 4), nc=True), m((3, 4)), m.nonzero((3, 4)))])
op("torch.addmv", lambda c, a, b: torch.addmv(c, a, b), (F32, BF16, I64),
   lambda m: [(m((3,)), m((3, 4)), m((4,))), (m(()), m((3, 4), nc=True), m((4,))), (m((3,)), m((3, 0)), m((0,)))])
op("torch.addmv", lambda c, a, b: torch.addmv(c, a, b, beta=2.0, alpha=-1.5), (F32,),
   lambda m: [(m((3,)), m((3, 4)), m((4,)))], variant="beta_alpha")
op("torch.Tensor.addmv", lambda c, a, b: c.addmv(a, b), (F32,),
   lambda m: [(m((3,)), m((3, 4)), m((4,)))])
op("torch.bmm", lambda a, b: torch.bmm(a, b), (F32, BF16, I64),
   lambda m: [(m((2, 3, 4)), m((2, 4, 5))), (m((2, 3, 4), nc=True), m((2, 4, 5), nc=True)),
              (m((0, 3, 4)), m((0, 4, 2)))])


# --------------------------------------------------------------------------------------------------
# Ops fjit does not decompose: its automatic torch fallback (output metadata from meta tensors)

op("torch.cumsum", lambda x, d: torch.cumsum(x, d), (F32, I64),
   lambda m: [(m((3, 4)), 1), (m((3, 4), nc=True), 0), (m(()), 0)], fallback=True)
op("torch.sort", lambda x, d, desc: torch.sort(x, dim=d, descending=desc), (F32, I64),
   lambda m: [(m((3, 5)), -1, False), (m((3, 5)), 0, True)] if m.dtype != I64 else
             [(torch.randperm(15, generator=m.gen).view(3, 5), -1, False)], fallback=True)
op("torch.topk", lambda x, k: torch.topk(x, k), (F32,),
   lambda m: [(m((3, 6)), 2), (m((6,)), 1)], fallback=True)
op("torch.topk", lambda x, k: torch.topk(x, k).values * 2, (F32,),
   lambda m: [(m((3, 6)), 3)], variant="values_then_op", fallback=True)
op("torch.conv2d", lambda x, w, b: torch.conv2d(x, w, b), (F32,),     # 1x1 on <= 4 positions: a matmul
   lambda m: [(m((2, 8, 1, 1)), m((5, 8, 1, 1)), m((5,))), (m((3, 6, 2, 2)), m((4, 6, 1, 1)), None),
              (m((2, 4, 1, 3)), m((3, 4, 1, 1)), m((3,))), (m((2, 4, 3, 3)), m((3, 4, 1, 1)), None),
              (m((2, 4, 2, 2), nc=True), m((3, 4, 1, 1)), m((3,))), (m((2, 3, 4, 4)), m((2, 3, 3, 3)), None)])
op("torch.conv2d", lambda x, w, p: torch.conv2d(x, w, None, 1, p), (F32,),
   lambda m: [(m((2, 4, 2, 2)), m((3, 4, 1, 1)), "same"), (m((2, 4, 1, 1)), m((3, 4, 1, 1)), "valid"),
              (m((2, 4, 2, 2)), m((3, 4, 1, 1)), 1)], variant="padding")
op(f"{NNF}.conv1d", lambda x, w, b: F.conv1d(x, w, b, padding=1), (F32,),
   lambda m: [(m((2, 3, 8)), m((4, 3, 3)), m((4,))), (m((1, 3, 8), nc=True), m((4, 3, 3)), None)],
   fallback=True)
op("torch.cumsum", lambda x: torch.cumsum(x.exp(), 0) + 1, (F32,), lambda m: [(m((4, 3)),)],
   variant="between_decomposed", fallback=True)


# --------------------------------------------------------------------------------------------------
# Aliases and alternative spellings fjit claims: a few samples each

def _two(make_args):
    return lambda m: [make_args(m, (3, 4)), make_args(m, (2, 3))]


_x = lambda m, s: (m(s),)                                        # noqa: E731
_xy = lambda m, s: (m(s), m(s))                                  # noqa: E731
_xg = lambda m, s: (m(s, -2, 2, grid=True), m(s, -2, 2, grid=True))  # noqa: E731
_xnz = lambda m, s: (m(s), m.nonzero(s))                         # noqa: E731
ALIASES = [
    # (name, fn, dtypes, make)
    ("torch.arctan2", lambda x, y: torch.arctan2(x, y), (F32, BF16), _two(_xy)),
    ("torch.Tensor.arctan2", lambda x, y: x.arctan2(y), (F32,), _two(_xy)),
    ("torch.clip", lambda x: torch.clip(x, -1, 1), NUMERIC, _two(_x)),
    ("torch.Tensor.clip", lambda x: x.clip(max=0.5), (F32, BF16), _two(_x)),
    ("torch.divide", lambda x, y: torch.divide(x, y), NUMERIC, _two(_xnz)),
    ("torch.divide", lambda x, y: torch.divide(x, y, rounding_mode="floor"), (F32, I64),
     _two(_xnz)),
    ("torch.Tensor.divide", lambda x, y: x.divide(y), (F32, I64), _two(_xnz)),
    ("torch.multiply", lambda x, y: torch.multiply(x, y), NUMERIC, _two(_xy)),
    ("torch.Tensor.multiply", lambda x, y: x.multiply(y), (F32, I64), _two(_xy)),
    ("torch.subtract", lambda x, y: torch.subtract(x, y, alpha=2), NUMERIC, _two(_xy)),
    ("torch.Tensor.subtract", lambda x, y: x.subtract(y), (F32, I64), _two(_xy)),
    ("torch.greater", lambda x, y: torch.greater(x, y), NUMERIC, _two(_xg)),
    ("torch.greater_equal", lambda x, y: torch.greater_equal(x, y), NUMERIC, _two(_xg)),
    ("torch.less", lambda x, y: torch.less(x, y), NUMERIC, _two(_xg)),
    ("torch.less_equal", lambda x, y: torch.less_equal(x, y), NUMERIC, _two(_xg)),
    ("torch.not_equal", lambda x, y: torch.not_equal(x, y), NUMERIC, _two(_xg)),
    ("torch.Tensor.greater", lambda x, y: x.greater(y), (F32, I64), _two(_xg)),
    ("torch.Tensor.greater_equal", lambda x, y: x.greater_equal(y), (F32, I64), _two(_xg)),
    ("torch.Tensor.less", lambda x, y: x.less(y), (F32, I64), _two(_xg)),
    ("torch.Tensor.less_equal", lambda x, y: x.less_equal(y), (F32, I64), _two(_xg)),
    ("torch.Tensor.not_equal", lambda x, y: x.not_equal(y), (F32, I64), _two(_xg)),
    ("torch.Tensor.pow", lambda x: x.pow(2), NUMERIC, _two(_x)),
    ("torch.Tensor.pow", lambda x, y: x.abs().pow(y), (F32, BF16), _two(_xy)),
    ("torch.Tensor.amax", lambda x: x.amax(-1), NUMERIC, _two(_x)),
    ("torch.Tensor.amin", lambda x: x.amin((0, 1), keepdim=True), NUMERIC, _two(_x)),
    ("torch.Tensor.prod", lambda x: x.prod(1), NUMERIC, _two(_x)),
    ("torch.Tensor.relu", lambda x: x.relu(), NUMERIC, _two(_x)),
    ("torch.relu", lambda x: torch.relu(x), NUMERIC, _two(_x)),
    ("torch.Tensor.log_softmax", lambda x: x.log_softmax(-1), FLOATS, _two(_x)),
    ("torch.Tensor.mm", lambda x: x.mm(x.t()), (F32, BF16, I64), _two(_x)),
    ("torch.Tensor.bmm", lambda x: x.bmm(x.transpose(1, 2)), (F32, BF16, I64),
     lambda m: [(m((2, 3, 4)),), (m((1, 2, 2), nc=True),)]),
    ("torch.Tensor.byte", lambda x: x.byte(), (F32, I64, BOOL), lambda m: [(m((3, 4), 0, 9),)]),
    ("torch.Tensor.char", lambda x: x.char(), (F32, I64, BOOL), lambda m: [(m((3, 4), -9, 9),)]),
    ("torch.Tensor.short", lambda x: x.short(), (F32, I64, BOOL), lambda m: [(m((3, 4), -9, 9),)]),
    ("torch.Tensor.reshape_as", lambda x, y: x.reshape_as(y), (F32, I64),
     lambda m: [(m((3, 4)), m((2, 6))), (m((3, 4), nc=True), m((12,)))]),
    ("torch.Tensor.view_as", lambda x, y: x.view_as(y), (F32, I64),
     lambda m: [(m((3, 4)), m((2, 6))), (m(()), m((1, 1)))]),
    ("torch.swapaxes", lambda x: torch.swapaxes(x, 0, -1), (F32, I64), _two(_x)),
    ("torch.swapdims", lambda x: torch.swapdims(x, 1, 0), (F32, I64), _two(_x)),
    ("torch.Tensor.swapaxes", lambda x: x.swapaxes(0, 1), (F32, I64), _two(_x)),
    ("torch.Tensor.swapdims", lambda x: x.swapdims(-1, -2), (F32, I64), _two(_x)),
    ("torch.concatenate", lambda x, y: torch.concatenate([x, y], 1), (F32, I64), _two(_xy)),
    ("torch._C._special.special_erf", lambda x: torch.special.erf(x), FLOATS, _two(_x)),
    ("torch._C._special.special_expit", lambda x: torch.special.expit(x), FLOATS, _two(_x)),
    ("torch._C._special.special_softmax", lambda x: torch.special.softmax(x, 1), FLOATS,
     _two(_x)),
    ("torch._C._special.special_log_softmax", lambda x: torch.special.log_softmax(x, 0), FLOATS,
     _two(_x)),
    ("torch.dropout", lambda x: torch.dropout(x, 0.3, False), FLOATS, _two(_x)),
    ("torch.layer_norm", lambda x, w, b: torch.layer_norm(x, (4,), w, b, 1e-5), FLOATS,
     lambda m: [(m((3, 4)), m((4,)), m((4,))), (m((2, 3, 4), nc=True), None, None)]),
    ("torch.rms_norm", lambda x, w: torch.rms_norm(x, (4,), w, 1e-6), FLOATS,
     lambda m: [(m((3, 4)), m((4,))), (m((2, 3, 4), nc=True), None)]),
]
for _name, _fn, _dtypes, _make in ALIASES:
    op(_name, _fn, _dtypes, _make)


# --------------------------------------------------------------------------------------------------

def all_names() -> set[str]:
    """Every qualified name the registry exercises (names and aliases)."""
    names = set()
    for info in OP_SAMPLES:
        names.add(info.name)
        names.update(info.aliases)
    return names


def cases():
    """(OpInfo, dtype, index, args) for every sample of every op, in registry order."""
    for info in OP_SAMPLES:
        for dtype in info.dtypes:
            for i, args in enumerate(info.samples(dtype)):
                yield info, dtype, i, args
