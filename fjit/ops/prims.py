"""The prims: the small closed set of operations every executor must implement.

One enum names every prim; its row in `PRIMS` says how it prints, how torch runs it (which is also
its meta rule: the row's lowering run on meta tensors) and what it is (tags).  Elementwise prims have
torch's broadcasting and type promotion, so a torch-level elementwise op is exactly one prim.
"""
from __future__ import annotations

import enum
import types

import torch

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, Tag, TensorVar
from fjit.frontend.context import current
from fjit.frontend.dispatch import trace_call


class Prim(enum.Enum):
    # elementwise, unary
    ABS = "abs"; NEG = "neg"; EXP = "exp"; EXP2 = "exp2"; EXPM1 = "expm1"; LOG = "log"  # noqa: E702
    LOG2 = "log2"; LOG10 = "log10"; LOG1P = "log1p"; SQRT = "sqrt"; RSQRT = "rsqrt"  # noqa: E702
    SIN = "sin"; COS = "cos"; TAN = "tan"; ASIN = "asin"; ACOS = "acos"; ATAN = "atan"  # noqa: E702
    SINH = "sinh"; COSH = "cosh"; TANH = "tanh"; SIGMOID = "sigmoid"; ERF = "erf"  # noqa: E702
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


UNARY = {Prim.ABS, Prim.NEG, Prim.EXP, Prim.EXP2, Prim.EXPM1, Prim.LOG, Prim.LOG2, Prim.LOG10,
         Prim.LOG1P, Prim.SQRT, Prim.RSQRT, Prim.SIN, Prim.COS, Prim.TAN, Prim.ASIN, Prim.ACOS,
         Prim.ATAN, Prim.SINH, Prim.COSH, Prim.TANH, Prim.SIGMOID, Prim.ERF, Prim.FLOOR, Prim.CEIL,
         Prim.ROUND, Prim.TRUNC, Prim.SIGN, Prim.RECIPROCAL, Prim.LOGICAL_NOT, Prim.BITWISE_NOT,
         Prim.ISNAN, Prim.ISINF, Prim.ISFINITE, Prim.CLONE}
BINARY = {Prim.ADD, Prim.SUB, Prim.MUL, Prim.DIV, Prim.FLOOR_DIVIDE, Prim.TRUNC_DIVIDE,
          Prim.REMAINDER, Prim.FMOD, Prim.POW, Prim.MAXIMUM, Prim.MINIMUM, Prim.CLAMP_MIN,
          Prim.CLAMP_MAX, Prim.ATAN2, Prim.EQ, Prim.NE, Prim.LT, Prim.LE, Prim.GT, Prim.GE,
          Prim.LOGICAL_AND, Prim.LOGICAL_OR, Prim.LOGICAL_XOR, Prim.BITWISE_AND, Prim.BITWISE_OR,
          Prim.BITWISE_XOR, Prim.SHIFT_LEFT, Prim.SHIFT_RIGHT}
# Prims whose result is bool whatever their operands' dtype (computed in the operands' promotion).
BOOL_RESULT = {Prim.EQ, Prim.NE, Prim.LT, Prim.LE, Prim.GT, Prim.GE, Prim.LOGICAL_AND,
               Prim.LOGICAL_OR, Prim.LOGICAL_XOR, Prim.LOGICAL_NOT, Prim.ISNAN, Prim.ISINF,
               Prim.ISFINITE}
REDUCTIONS = {Prim.SUM, Prim.PROD, Prim.AMAX, Prim.AMIN, Prim.ARGMAX, Prim.ARGMIN}
SHAPE_OPS = {Prim.RESHAPE, Prim.PERMUTE, Prim.EXPAND, Prim.SLICE, Prim.SQUEEZE, Prim.UNSQUEEZE}

# Binary prims whose first operand may be a Python number: run as the tensor's reflected method.
_REFLECTED = {Prim.ADD: "__radd__", Prim.SUB: "__rsub__", Prim.MUL: "__rmul__",
              Prim.DIV: "__rtruediv__", Prim.FLOOR_DIVIDE: "__rfloordiv__",
              Prim.REMAINDER: "__rmod__", Prim.POW: "__rpow__", Prim.BITWISE_AND: "__rand__",
              Prim.BITWISE_OR: "__ror__", Prim.BITWISE_XOR: "__rxor__", Prim.EQ: "eq", Prim.NE: "ne",
              Prim.LT: "gt", Prim.LE: "ge", Prim.GT: "lt", Prim.GE: "le"}


def _binary_lowering(prim: Prim):
    fn = {Prim.TRUNC_DIVIDE: lambda a, b: torch.div(a, b, rounding_mode="trunc"),
          Prim.DIV: torch.true_divide}.get(prim) or getattr(torch, prim.value)
    reflected = getattr(torch.Tensor, _REFLECTED[prim]) if prim in _REFLECTED else None

    def lower(a, b):
        if isinstance(a, torch.Tensor) or reflected is None:
            return fn(a, b)
        return reflected(b, a)
    lower.__name__ = prim.value
    return lower


def _slice(x, index):
    """Basic indexing by a tuple of slices/ints/None: a view."""
    return x[index]


def _lowering(prim: Prim):
    if prim in BINARY:
        return _binary_lowering(prim)
    special = {
        Prim.CONVERT: lambda x, dtype: x.to(dtype),
        Prim.SUM: lambda x, dims, keepdim: torch.sum(x, dims, keepdim=keepdim),
        Prim.PROD: _prod,
        Prim.AMAX: lambda x, dims, keepdim: torch.amax(x, dims, keepdim=keepdim),
        Prim.AMIN: lambda x, dims, keepdim: torch.amin(x, dims, keepdim=keepdim),
        Prim.ARGMAX: lambda x, dim, keepdim: torch.argmax(_orderable(x), dim, keepdim=keepdim),
        Prim.ARGMIN: lambda x, dim, keepdim: torch.argmin(_orderable(x), dim, keepdim=keepdim),
        Prim.SLICE: _slice,
        Prim.SQUEEZE: lambda x, dims: torch.squeeze(x, dims),
        Prim.EXPAND: lambda x, shape: x.expand(shape),
        Prim.CONTIGUOUS: lambda x: x.contiguous(),
        Prim.INDEX_SELECT: torch.index_select,
        Prim.FULL: torch.full,
        Prim.IOTA: torch.arange,
        Prim.UNIFORM: torch.rand,
        Prim.NORMAL: torch.randn,
        Prim.SDPA: torch.nn.functional.scaled_dot_product_attention,
    }
    fn = special.get(prim) or getattr(torch, prim.value)
    return fn


def _orderable(x):
    """argmax/argmin refuse bool tensors (torch.max(b, dim) does not): the same order as uint8."""
    return x.to(torch.uint8) if x.dtype == torch.bool else x


def _prod(x, dims, keepdim):
    if not dims:
        return torch.prod(x) if not keepdim else torch.prod(x).reshape((1,) * x.ndim)
    for d in sorted(dims, reverse=True):
        x = torch.prod(x, d, keepdim=keepdim)
    return x


def _tags(prim: Prim) -> frozenset:
    tags = {Tag.PRIM}
    if prim in UNARY or prim in BINARY or prim in (Prim.WHERE, Prim.CONVERT):
        tags.add(Tag.ELEMENTWISE)
    if prim in REDUCTIONS:
        tags.add(Tag.REDUCTION)
    if prim in SHAPE_OPS:
        tags.add(Tag.SHAPE)
    if prim in (Prim.UNIFORM, Prim.NORMAL):
        tags.add(Tag.RANDOM)
    return frozenset(tags)


PRIMS: dict[Prim, Symbol] = {p: Symbol(f"prims.{p.value}", _lowering(p), _tags(p)) for p in Prim}
PRIM_OF_QUALNAME: dict[str, Prim] = {s.qualname: p for p, s in PRIMS.items()}


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

# What printed traces call `prims.<name>` with.
NAMESPACE = types.SimpleNamespace(**{p.value: s.fn for p, s in PRIMS.items()})


def prim(p: Prim, *args, **kwargs):
    """Record prim `p` applied to proxies (used by decompositions)."""
    sym = PRIMS[p]
    return trace_call(current(), sym, sym.fn, args, kwargs)
