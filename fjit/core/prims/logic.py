"""The prims of truth values and bits: comparisons, logical and bitwise ops, shifts, and `where`.
One block per prim (see registry.py).  None but `where` carries a cotangent: their results are bool
or integer."""
from __future__ import annotations

import torch

from fjit.core.prims.registry import Domain, Kind, Prim, apply, define
from fjit.core.prims.toolkit import is_tensor, operand, zeros_like

B = Kind.BINARY
_SHIFT = ("torch shifts by the bit width or more to 0 (or -1) and by a negative amount to 0, "
          "where {0}'s shift is undefined: it stays a torch call")


def _comparison(name, op, names, reflected):
    define(name, B, names=names, reflected=reflected, bool_result=True, nondiff=True,
           expr=f"({{0}} {op} {{1}})", aten=(f"{name.lower()}.Tensor", f"{name.lower()}.Scalar"))


_comparison("EQ", "==", ("eq", "__eq__"), "eq")
_comparison("NE", "!=", ("ne", "not_equal", "__ne__"), "ne")
_comparison("LT", "<", ("lt", "less", "__lt__"), "gt")
_comparison("LE", "<=", ("le", "less_equal", "__le__"), "ge")
_comparison("GT", ">", ("gt", "greater", "__gt__"), "lt")
_comparison("GE", ">=", ("ge", "greater_equal", "__ge__"), "le")


def _logical(name, c_op, triton_op):
    value = name.lower()
    define(name, B, bool_result=True, nondiff=True, c=f"(({{0}} != 0) {c_op} ({{1}} != 0))",
           triton=f"(({{0}} != 0) {triton_op} ({{1}} != 0))", aten=(f"{value}.default",))


_logical("LOGICAL_AND", "&&", "&")
_logical("LOGICAL_OR", "||", "|")
_logical("LOGICAL_XOR", "!=", "^")


def _bitwise(name, op, dunder):
    value = name.lower()
    define(name, B, Domain.INT, names=(value, f"__{dunder}__"), reflected=f"__r{dunder}__",
           nondiff=True, expr=f"({{0}} {op} {{1}})", aten=(f"{value}.Tensor",))


_bitwise("BITWISE_AND", "&", "and")
_bitwise("BITWISE_OR", "|", "or")
_bitwise("BITWISE_XOR", "^", "xor")


def _shift(name, value, dunder):
    define(name, B, Domain.INT, value=value, names=(value, dunder), nondiff=True, notes={
        "c": _SHIFT.format("C"), "triton": _SHIFT.format("Triton"),
        "aten": f"aten.{value} has no row in dynamo/aten.py: the backend keeps it one torch call"})


_shift("SHIFT_LEFT", "bitwise_left_shift", "__lshift__")
_shift("SHIFT_RIGHT", "bitwise_right_shift", "__rshift__")


def _where(cond, a=None, b=None):
    if a is None or b is None:
        raise NotImplementedError   # where(cond) is nonzero: data-dependent
    return apply(Prim.WHERE, cond, a, b)


def _where_method(x, condition, y):
    return apply(Prim.WHERE, condition, x, y)    # x.where(cond, y): self is the "true" branch


def _masked_fill(x, mask, value):
    """x.masked_fill(mask, value) as where(mask, value, x), where that keeps x's dtype and shape: a
    Python number of x's kind (a float into an integer tensor truncates in torch) or a 0-d tensor
    of x's dtype, and a mask that broadcasts to x."""
    if is_tensor(value):
        if value.ndim or value.dtype != x.dtype:
            raise NotImplementedError
    elif isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not x.dtype.is_floating_point) or x.dtype == torch.bool:
        raise NotImplementedError
    if mask.dtype != torch.bool or torch.broadcast_shapes(mask.shape, x.shape) != x.shape:
        raise NotImplementedError
    return apply(Prim.WHERE, mask, value, x)


def _where_vjp(b, g, value):
    cond, a, c = b.args[:3]
    vcond = operand(cond, value)
    out = []
    if is_tensor(a):
        out.append((a, apply(Prim.WHERE, vcond, g, zeros_like(g))))
    if is_tensor(c):
        out.append((c, apply(Prim.WHERE, vcond, zeros_like(g), g)))
    return out


define("WHERE", Kind.WHERE, decompositions=(((torch.where,), _where),
                                             ((torch.Tensor.where,), _where_method),
                                             ((torch.masked_fill, torch.Tensor.masked_fill), _masked_fill)),
       vjp=_where_vjp, c="({0} ? {1} : {2})", triton="tl.where({0}, {1}, {2})", aten=("where.self",))
