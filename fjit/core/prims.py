"""The prims: the small closed set of operations every executor must implement, one row each.

A row holds everything about one prim: its kind, the dtypes its math is defined on, whether its
result is bool, the torch callables that are exactly this prim (from which its decompositions and
its in-place twins are derived), the reflected method that runs it with a Python number first, its
alias behaviour, and its torch lowering (which is also its meta rule: the lowering run on meta
tensors).  Every category set and name table below is derived from the rows; adding a prim is one
row (plus its kernel expression in executors/render.py, and its tests).

Elementwise prims have torch's broadcasting and type promotion, so a torch-level elementwise op is
exactly one prim.  This module is the IR's vocabulary: it imports nothing from the tracing frontend.
"""
from __future__ import annotations

import dataclasses
import enum
import types
from typing import Callable

import torch

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, Tag, TensorVar


class Prim(enum.Enum):
    # elementwise, unary
    ABS = "abs"; NEG = "neg"; EXP = "exp"; EXP2 = "exp2"; EXPM1 = "expm1"; LOG = "log"  # noqa: E702
    LOG2 = "log2"; LOG10 = "log10"; LOG1P = "log1p"; SQRT = "sqrt"; RSQRT = "rsqrt"  # noqa: E702
    SIN = "sin"; COS = "cos"; TAN = "tan"; ASIN = "asin"; ACOS = "acos"; ATAN = "atan"  # noqa: E702
    SINH = "sinh"; COSH = "cosh"; TANH = "tanh"; SIGMOID = "sigmoid"; ERF = "erf"  # noqa: E702
    ERFC = "erfc"; RELU = "relu"  # noqa: E702
    FLOOR = "floor"; CEIL = "ceil"; ROUND = "round"; TRUNC = "trunc"; SIGN = "sign"  # noqa: E702
    RECIPROCAL = "reciprocal"; LOGICAL_NOT = "logical_not"; BITWISE_NOT = "bitwise_not"  # noqa: E702
    ISNAN = "isnan"; ISINF = "isinf"; ISFINITE = "isfinite"; CLONE = "clone"  # noqa: E702
    # elementwise, binary
    ADD = "add"; SUB = "sub"; MUL = "mul"; DIV = "div"; FLOOR_DIVIDE = "floor_divide"  # noqa: E702
    TRUNC_DIVIDE = "trunc_divide"; REMAINDER = "remainder"; FMOD = "fmod"; POW = "pow"  # noqa: E702
    MAXIMUM = "maximum"; MINIMUM = "minimum"; CLAMP_MIN = "clamp_min"; CLAMP_MAX = "clamp_max"  # noqa: E702
    ATAN2 = "atan2"; EQ = "eq"; NE = "ne"; LT = "lt"; LE = "le"; GT = "gt"; GE = "ge"  # noqa: E702
    LOGICAL_AND = "logical_and"; LOGICAL_OR = "logical_or"; LOGICAL_XOR = "logical_xor"  # noqa: E702
    BITWISE_AND = "bitwise_and"; BITWISE_OR = "bitwise_or"; BITWISE_XOR = "bitwise_xor"  # noqa: E702
    SHIFT_LEFT = "bitwise_left_shift"; SHIFT_RIGHT = "bitwise_right_shift"  # noqa: E702
    # elementwise, other
    WHERE = "where"; CONVERT = "convert_element_type"  # noqa: E702
    # reductions
    SUM = "sum"; PROD = "prod"; AMAX = "amax"; AMIN = "amin"; ARGMAX = "argmax"; ARGMIN = "argmin"  # noqa: E702
    # shape and data movement
    RESHAPE = "reshape"; PERMUTE = "permute"; EXPAND = "expand"; SLICE = "slice"  # noqa: E702
    SQUEEZE = "squeeze"; UNSQUEEZE = "unsqueeze"; CAT = "cat"; CONTIGUOUS = "contiguous"  # noqa: E702
    INDEX_SELECT = "index_select"; GATHER = "gather"  # noqa: E702
    # factories
    FULL = "full"; IOTA = "iota"; UNIFORM = "uniform"; NORMAL = "normal"  # noqa: E702
    # the rest, which only torch runs
    MATMUL = "matmul"; SDPA = "scaled_dot_product_attention"  # noqa: E702


class Kind(enum.Enum):
    UNARY = "unary"            # elementwise, one operand
    BINARY = "binary"          # elementwise, two operands (a tensor and a tensor or a number)
    WHERE = "where"            # elementwise select
    CAST = "cast"              # elementwise dtype conversion
    REDUCTION = "reduction"    # over dims, keepdim or not
    SHAPE = "shape"            # a view: moves no data
    DATA = "data"              # moves data into a new tensor (cat, gather, ...)
    FACTORY = "factory"        # makes a tensor from numbers
    RANDOM = "random"          # a factory that draws from a generator
    OPAQUE = "opaque"          # computed by torch only (matmul, attention)


class Domain(enum.Enum):
    """The computation dtypes the prim's math is defined on (the kernel expression's domain)."""
    ANY = "any"
    FLOAT = "float"       # transcendental and rounding math
    INT = "int"           # bitwise math (bool included)


@dataclasses.dataclass(frozen=True)
class PrimRow:
    prim: Prim
    kind: Kind
    domain: Domain = Domain.ANY
    bool_result: bool = False      # bool whatever the operands (computed in their promotion)
    torch_names: tuple = ()        # torch.<n> / Tensor.<n> that are exactly this prim
    reflected: str | None = None   # the Tensor method that runs it with a Python number first
    aliases: bool = False          # its result may share memory with its first operand
    lowering: Callable | None = None   # how torch runs it (None: torch.<prim value>)

    @property
    def tags(self) -> frozenset:
        tags = {Tag.PRIM}
        if self.kind in (Kind.UNARY, Kind.BINARY, Kind.WHERE, Kind.CAST):
            tags.add(Tag.ELEMENTWISE)
        if self.kind is Kind.REDUCTION:
            tags.add(Tag.REDUCTION)
        if self.kind is Kind.SHAPE:
            tags.add(Tag.SHAPE)
        if self.kind is Kind.RANDOM:
            tags.add(Tag.RANDOM)
        if self.aliases:
            tags.add(Tag.VIEW)
        return frozenset(tags)


def _orderable(x):
    """argmax/argmin refuse bool tensors (torch.max(b, dim) does not): the same order as uint8."""
    return x.to(torch.uint8) if x.dtype == torch.bool else x


def _prod(x, dims, keepdim):
    if not dims:
        return torch.prod(x) if not keepdim else torch.prod(x).reshape((1,) * x.ndim)
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


def _slice(x, index):
    """Basic indexing by a tuple of slices/ints/None: a view."""
    return x[index]


def _unary(p, domain=Domain.ANY, *, names=None, bool_result=False):
    return PrimRow(p, Kind.UNARY, domain, bool_result, (p.value,) if names is None else names)


def _binary(p, domain=Domain.ANY, *, names=None, reflected=None, bool_result=False):
    return PrimRow(p, Kind.BINARY, domain, bool_result, (p.value,) if names is None else names,
                   reflected)


def _reduce(p, lowering):
    return PrimRow(p, Kind.REDUCTION, lowering=lowering)


_F, _I = Domain.FLOAT, Domain.INT
ROWS: dict[Prim, PrimRow] = {r.prim: r for r in (
    _unary(Prim.ABS, names=("abs", "absolute", "__abs__")), _unary(Prim.NEG, names=("neg", "negative", "__neg__")),
    _unary(Prim.EXP, _F), _unary(Prim.EXP2, _F), _unary(Prim.EXPM1, _F), _unary(Prim.LOG, _F),
    _unary(Prim.LOG2, _F), _unary(Prim.LOG10, _F), _unary(Prim.LOG1P, _F), _unary(Prim.SQRT, _F),
    _unary(Prim.RSQRT, _F), _unary(Prim.SIN, _F), _unary(Prim.COS, _F), _unary(Prim.TAN, _F),
    _unary(Prim.ASIN, _F, names=("asin", "arcsin")), _unary(Prim.ACOS, _F, names=("acos", "arccos")),
    _unary(Prim.ATAN, _F, names=("atan", "arctan")), _unary(Prim.SINH, _F), _unary(Prim.COSH, _F),
    _unary(Prim.TANH, _F), _unary(Prim.SIGMOID, _F), _unary(Prim.ERF, _F), _unary(Prim.ERFC, _F),
    _unary(Prim.RELU, names=()),   # registered with F.relu's inplace= in ops/math_ops.py
    _unary(Prim.FLOOR, _F), _unary(Prim.CEIL, _F), _unary(Prim.ROUND, _F, names=()),
    _unary(Prim.TRUNC, _F, names=("trunc", "fix")), _unary(Prim.SIGN),
    _unary(Prim.RECIPROCAL, _F), _unary(Prim.LOGICAL_NOT, bool_result=True),
    _unary(Prim.BITWISE_NOT, _I, names=("bitwise_not", "__invert__")),
    _unary(Prim.ISNAN, _F, bool_result=True), _unary(Prim.ISINF, _F, bool_result=True),
    _unary(Prim.ISFINITE, _F, bool_result=True), _unary(Prim.CLONE, names=()),
    _binary(Prim.ADD, names=("add", "__add__"), reflected="__radd__"),
    _binary(Prim.SUB, names=("sub", "subtract", "__sub__"), reflected="__rsub__"),
    _binary(Prim.MUL, names=("mul", "multiply", "__mul__"), reflected="__rmul__"),
    _binary(Prim.DIV, _F, names=("div", "divide", "true_divide", "__truediv__"), reflected="__rtruediv__"),
    _binary(Prim.FLOOR_DIVIDE, names=("floor_divide", "__floordiv__"), reflected="__rfloordiv__"),
    _binary(Prim.TRUNC_DIVIDE, names=()),
    _binary(Prim.REMAINDER, _F, names=("remainder", "__mod__"), reflected="__rmod__"),
    _binary(Prim.FMOD, _F), _binary(Prim.POW, _F, names=("pow", "__pow__"), reflected="__rpow__"),
    _binary(Prim.MAXIMUM), _binary(Prim.MINIMUM), _binary(Prim.CLAMP_MIN, names=()),
    _binary(Prim.CLAMP_MAX, names=()), _binary(Prim.ATAN2, _F, names=("atan2", "arctan2")),
    _binary(Prim.EQ, names=("eq", "__eq__"), reflected="eq", bool_result=True),
    _binary(Prim.NE, names=("ne", "not_equal", "__ne__"), reflected="ne", bool_result=True),
    _binary(Prim.LT, names=("lt", "less", "__lt__"), reflected="gt", bool_result=True),
    _binary(Prim.LE, names=("le", "less_equal", "__le__"), reflected="ge", bool_result=True),
    _binary(Prim.GT, names=("gt", "greater", "__gt__"), reflected="lt", bool_result=True),
    _binary(Prim.GE, names=("ge", "greater_equal", "__ge__"), reflected="le", bool_result=True),
    _binary(Prim.LOGICAL_AND, bool_result=True), _binary(Prim.LOGICAL_OR, bool_result=True),
    _binary(Prim.LOGICAL_XOR, bool_result=True),
    _binary(Prim.BITWISE_AND, _I, names=("bitwise_and", "__and__"), reflected="__rand__"),
    _binary(Prim.BITWISE_OR, _I, names=("bitwise_or", "__or__"), reflected="__ror__"),
    _binary(Prim.BITWISE_XOR, _I, names=("bitwise_xor", "__xor__"), reflected="__rxor__"),
    _binary(Prim.SHIFT_LEFT, _I, names=("bitwise_left_shift", "__lshift__")),
    _binary(Prim.SHIFT_RIGHT, _I, names=("bitwise_right_shift", "__rshift__")),
    PrimRow(Prim.WHERE, Kind.WHERE),
    PrimRow(Prim.CONVERT, Kind.CAST, aliases=True, lowering=lambda x, dtype: x.to(dtype)),
    _reduce(Prim.SUM, lambda x, dims, keepdim: torch.sum(x, dims, keepdim=keepdim)),
    _reduce(Prim.PROD, _prod),
    _reduce(Prim.AMAX, lambda x, dims, keepdim: torch.amax(x, dims, keepdim=keepdim)),
    _reduce(Prim.AMIN, lambda x, dims, keepdim: torch.amin(x, dims, keepdim=keepdim)),
    _reduce(Prim.ARGMAX, lambda x, dim, keepdim: torch.argmax(_orderable(x), dim, keepdim=keepdim)),
    _reduce(Prim.ARGMIN, lambda x, dim, keepdim: torch.argmin(_orderable(x), dim, keepdim=keepdim)),
    PrimRow(Prim.RESHAPE, Kind.SHAPE, aliases=True),
    PrimRow(Prim.PERMUTE, Kind.SHAPE, aliases=True),
    PrimRow(Prim.EXPAND, Kind.SHAPE, aliases=True, lowering=lambda x, shape: x.expand(shape)),
    PrimRow(Prim.SLICE, Kind.SHAPE, aliases=True, lowering=_slice),
    PrimRow(Prim.SQUEEZE, Kind.SHAPE, aliases=True, lowering=lambda x, dims: torch.squeeze(x, dims)),
    PrimRow(Prim.UNSQUEEZE, Kind.SHAPE, aliases=True),
    PrimRow(Prim.CAT, Kind.DATA),
    PrimRow(Prim.CONTIGUOUS, Kind.DATA, aliases=True, lowering=lambda x: x.contiguous()),
    PrimRow(Prim.INDEX_SELECT, Kind.DATA), PrimRow(Prim.GATHER, Kind.DATA),
    PrimRow(Prim.FULL, Kind.FACTORY), PrimRow(Prim.IOTA, Kind.FACTORY, lowering=torch.arange),
    PrimRow(Prim.UNIFORM, Kind.RANDOM, lowering=torch.rand),
    PrimRow(Prim.NORMAL, Kind.RANDOM, lowering=torch.randn),
    PrimRow(Prim.MATMUL, Kind.OPAQUE),
    PrimRow(Prim.SDPA, Kind.OPAQUE, lowering=torch.nn.functional.scaled_dot_product_attention),
)}
assert set(ROWS) == set(Prim), set(Prim) - set(ROWS)


def _binary_lowering(row: PrimRow):
    fn = {Prim.TRUNC_DIVIDE: lambda a, b: torch.div(a, b, rounding_mode="trunc"),
          Prim.DIV: torch.true_divide}.get(row.prim) or getattr(torch, row.prim.value)
    reflected = getattr(torch.Tensor, row.reflected) if row.reflected else None

    def lower(a, b):
        if isinstance(a, torch.Tensor) or reflected is None:
            return fn(a, b)
        return reflected(b, a)
    lower.__name__ = row.prim.value
    return lower


def _lowering(row: PrimRow) -> Callable:
    if row.kind is Kind.BINARY:
        return _binary_lowering(row)
    return row.lowering or getattr(torch, row.prim.value)


# -- derived tables ----------------------------------------------------------------------------------

def of_kind(*kinds: Kind) -> frozenset:
    return frozenset(p for p, r in ROWS.items() if r.kind in kinds)


UNARY = of_kind(Kind.UNARY)
BINARY = of_kind(Kind.BINARY)
REDUCTIONS = of_kind(Kind.REDUCTION)
BOOL_RESULT = frozenset(p for p, r in ROWS.items() if r.bool_result)

PRIMS: dict[Prim, Symbol] = {p: Symbol(f"prims.{p.value}", _lowering(r), r.tags) for p, r in ROWS.items()}
PRIM_OF_QUALNAME: dict[str, Prim] = {s.qualname: p for p, s in PRIMS.items()}

# What printed traces call `prims.<name>` with.
NAMESPACE = types.SimpleNamespace(**{p.value: s.fn for p, s in PRIMS.items()})


def torch_callables(name: str) -> list:
    """torch.<name> and Tensor.<name>, where they exist (dunders only as methods)."""
    in_torch = None if name.startswith("__") else getattr(torch, name, None)
    return [f for f in (in_torch, getattr(torch.Tensor, name, None)) if callable(f)]


def _inplace_name(name: str) -> str | None:
    """The in-place method of torch-level op `name` (x.exp_ for exp, x += for __add__), if any."""
    candidate = f"__i{name[2:]}" if name.startswith("__") else f"{name}_"
    return candidate if hasattr(torch.Tensor, candidate) else None


# Pointwise torch-level ops that are not one prim but have an in-place twin of the same signature.
_COMPOSITE_POINTWISE = ("round", "relu", "clamp", "clip", "clamp_min", "clamp_max", "square", "frac",
                        "masked_fill", "index_put", "scatter", "scatter_add", "index_add",
                        "index_fill", "lerp", "addcmul", "addcdiv")
_POINTWISE_NAMES = [n for r in ROWS.values() if r.kind in (Kind.UNARY, Kind.BINARY)
                    for n in r.torch_names] + list(_COMPOSITE_POINTWISE)
_INPLACE_NAMES = {n: i for n in _POINTWISE_NAMES if (i := _inplace_name(n)) is not None}

# The in-place method of each pointwise torch callable (torch.add and Tensor.add -> Tensor.add_),
# and the out-of-place method of each in-place one (Tensor.add_ and Tensor.__iadd__ -> the op).
INPLACE_TWIN: dict = {f: getattr(torch.Tensor, i) for n, i in _INPLACE_NAMES.items()
                      for f in torch_callables(n)}
OUT_OF_PLACE: dict = {getattr(torch.Tensor, i): getattr(torch.Tensor, n)
                      for n, i in _INPLACE_NAMES.items() if hasattr(torch.Tensor, n)}

# Pointwise torch callables whose operands commute exactly (IEEE + and * do).
COMMUTATIVE: frozenset = frozenset(f for p in (Prim.ADD, Prim.MUL) for n in ROWS[p].torch_names
                                   for f in torch_callables(n))

# Torch-level ops whose result may share memory with their first operand in eager torch: their
# symbols carry Tag.VIEW, as the prims that alias do.
_VIEW_NAMES = ("reshape", "view", "view_as", "reshape_as", "permute", "transpose", "swapaxes",
               "swapdims", "t", "expand", "expand_as", "squeeze", "unsqueeze", "__getitem__",
               "narrow", "select", "split", "chunk", "unbind", "flatten", "unflatten", "detach",
               "alias", "as_strided", "diagonal", "contiguous", "movedim", "to", "type_as", "float",
               "half", "bfloat16", "double", "int", "long", "bool", "view_as_real", "real", "imag",
               "broadcast_to", "unfold", "dropout")
VIEW_OPS: frozenset = frozenset(f for n in _VIEW_NAMES for f in torch_callables(n)) | frozenset(
    {torch.nn.functional.dropout, torch.Tensor.T.__get__, torch.Tensor.mT.__get__,
     torch.Tensor.H.__get__, torch.Tensor.mH.__get__, torch.Tensor.real.__get__,
     torch.Tensor.imag.__get__})


def prim_of(b: BoundSymbol) -> Prim | None:
    """The prim `b` applies, or None for a torch-level op."""
    return PRIM_OF_QUALNAME.get(b.sym.qualname)


def computation_dtype(b: BoundSymbol) -> torch.dtype:
    """The dtype torch computes the elementwise prim `b` in, before the result is rounded to its
    output dtype: a comparison's operands' promotion, isnan's or logical_not's operand's dtype, or
    else the output's.  (Kernel generators then compute half types in float32.)"""
    if prim_of(b) in BOOL_RESULT:
        if len(b.args) == 1:
            return b.args[0].dtype
        return torch.result_type(*(torch.empty((), dtype=a.dtype) if isinstance(a, TensorVar) else
                                   1.0 if isinstance(a, NumberVar) else a for a in b.args))
    return b.outputs()[0].dtype
