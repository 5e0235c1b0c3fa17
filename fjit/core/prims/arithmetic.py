"""The arithmetic binary prims: + - * /, the integer-valued divisions, remainders, pow, maximum and
minimum, the clamps and atan2.  One block per prim (see registry.py)."""
from __future__ import annotations

import math

import torch

from fjit.core.ir import Var
from fjit.core.prims.registry import Cost, Domain, Form, Kind, Prim, apply, define
from fjit.core.prims.toolkit import is_tensor, operand, operands, square, zeros_like

_F, B = Domain.FLOAT, Kind.BINARY
_NANS = "tl.{0}({{0}}, {{1}}, propagate_nan=tl.PropagateNan.ALL)"   # torch's NaN propagation
_DIVISION = ("torch raises on an integer division by zero and floors a float quotient by its own "
             "rule: no cheap {0} spelling, so it stays a torch call")
_NOT_WRITTEN = "not written: tl has no {0} for the interpreter, libdevice.{0} would serve compiled kernels"


def _add_vjp(b, g, value):
    return [(b.args[0], g), (b.args[1], g)]


def _sub_vjp(b, g, value):
    return [(b.args[0], g), (b.args[1], apply(Prim.NEG, g))] if is_tensor(b.args[1]) else [(b.args[0], g)]


def _mul_vjp(b, g, value):
    a, c = b.args[:2]
    out = []
    if is_tensor(a):
        out.append((a, apply(Prim.MUL, g, operand(c, value))))
    if is_tensor(c):
        out.append((c, apply(Prim.MUL, g, operand(a, value))))
    return out


def _div_vjp(b, g, value):
    a, c = b.args[:2]
    va, vc = operands(b, value)
    out = []
    if is_tensor(a):
        out.append((a, apply(Prim.DIV, g, vc)))
    if is_tensor(c):     # -g * ((a / c) / c), as torch computes it; a / c is the output
        out.append((c, apply(Prim.MUL, apply(Prim.NEG, g), apply(Prim.DIV, value(b.output), vc))))
    return out


define("ADD", B, names=("add", "__add__"), reflected="__radd__", vjp=_add_vjp,
       expr="({0} + {1})", aten=("add.Tensor", "add.Scalar"))
define("SUB", B, names=("sub", "subtract", "__sub__"), reflected="__rsub__", vjp=_sub_vjp,
       expr="({0} - {1})", aten=("sub.Tensor", "sub.Scalar", "rsub.Scalar", "rsub.Tensor"))
define("MUL", B, names=("mul", "multiply", "__mul__"), reflected="__rmul__", vjp=_mul_vjp,
       expr="({0} * {1})", aten=("mul.Tensor", "mul.Scalar"))
define("DIV", B, _F, names=("div", "divide", "true_divide", "__truediv__"), reflected="__rtruediv__",
       lowering=torch.true_divide, vjp=_div_vjp, expr="({0} / {1})",
       triton_f32="tl.div_rn({0}, {1})",    # IEEE-rounded, as torch's CUDA kernel
       aten=("div.Tensor", "div.Scalar", "div.Tensor_mode"))
define("FLOOR_DIVIDE", B, names=("floor_divide", "__floordiv__"), reflected="__rfloordiv__",
       nondiff=True, notes={"c": _DIVISION.format("C"), "triton": _DIVISION.format("Triton"),
                            "aten": "aten.floor_divide has no row in dynamo/aten.py: the backend "
                                    "keeps it one torch call"})
define("TRUNC_DIVIDE", B, names=(), lowering=lambda a, b: torch.div(a, b, rounding_mode="trunc"),
       nondiff=True, notes={
           "decomposition": "no torch callable is exactly it: torch.div(rounding_mode='trunc') "
                            "reaches it (decompositions/math_ops.py)",
           "c": _DIVISION.format("C"), "triton": _DIVISION.format("Triton"),
           "aten": "aten.div.Tensor_mode (DIV's row) reaches it through torch.div"})


def _remainder_vjp(b, g, value):
    """a - c * q with q = floor(a / c) (remainder) or trunc(a / c) (fmod): dq is zero."""
    a, c = b.args[:2]
    out = [(a, g)] if is_tensor(a) else []
    if is_tensor(c):
        va, vc = operands(b, value)
        q = apply(Prim.FLOOR if b.sym.name == "remainder" else Prim.TRUNC, apply(Prim.DIV, va, vc))
        out.append((c, apply(Prim.MUL, apply(Prim.NEG, g), q)))
    return out


define("REMAINDER", B, _F, names=("remainder", "__mod__"), reflected="__rmod__", vjp=_remainder_vjp,
       c=Form("FJ_REMAINDER({0}, {1}, fmod{f}({0}, {1}))", Cost.LIBM), aten=("remainder.Tensor", "remainder.Scalar"),
       notes={"triton": "not written: Triton's float % truncates (C's fmod); Python's remainder "
                        "needs the divisor's sign fix that C's FJ_REMAINDER applies"})
define("FMOD", B, _F, vjp=_remainder_vjp, c=Form("fmod{f}({0}, {1})", Cost.LIBM), aten=("fmod.Tensor", "fmod.Scalar"),
       notes={"triton": _NOT_WRITTEN.format("fmod")})


def _pow_vjp(b, g, value):
    a, c = b.args[:2]
    va, vc = operands(b, value)
    out = []
    if is_tensor(a):   # c * a^(c-1), and 0 where c == 0 (torch's convention, also at a == 0)
        if is_tensor(c):
            d = apply(Prim.MUL, vc, apply(Prim.POW, va, apply(Prim.SUB, vc, 1)))
            d = apply(Prim.WHERE, apply(Prim.EQ, vc, 0), 0.0, d)
        elif isinstance(c, Var):     # a runtime float exponent
            d = apply(Prim.MUL, apply(Prim.POW, va, vc - 1), vc)
        elif vc == 2:      # x**2 (a norm's square): 2x, no pow(x, 1) copy
            d = apply(Prim.MUL, va, 2)
        else:
            d = apply(Prim.MUL, apply(Prim.POW, va, vc - 1), vc) if vc != 0 else zeros_like(g)
        out.append((a, apply(Prim.MUL, g, d)))
    if is_tensor(c):   # out * log(a), and 0 where a == 0 and c >= 0
        if not is_tensor(a) and not isinstance(a, Var):     # 2 ** x: log(2) is a number
            log_a = math.log(va) if va > 0 else -math.inf if va == 0 else math.nan
            d = apply(Prim.MUL, value(b.output), log_a)
            out.append((c, apply(Prim.MUL, g, apply(Prim.WHERE, apply(Prim.GE, vc, 0), 0.0, d)
                                 if va == 0 else d)))
            return out
        if not is_tensor(a):        # a runtime number base: a 0-d tensor of it
            va = apply(Prim.FULL, (), va, dtype=vc.dtype, device=vc.device)
        d = apply(Prim.MUL, value(b.output), apply(Prim.LOG, va))
        zero = apply(Prim.LOGICAL_AND, apply(Prim.EQ, va, 0), apply(Prim.GE, vc, 0))
        out.append((c, apply(Prim.MUL, g, apply(Prim.WHERE, zero, 0.0, d))))
    return out


define("POW", B, _F, names=("pow", "__pow__"), reflected="__rpow__", vjp=_pow_vjp,
       c=Form("pow{f}({0}, {1})", Cost.LIBM), aten=("pow.Tensor_Scalar", "pow.Tensor_Tensor"),
       notes={"triton": _NOT_WRITTEN.format("pow")})


def _max_min_vjp(b, g, value):
    """torch (derivatives.yaml): each operand gets g unless it loses (for maximum: is smaller),
    ties split g in half.  A NaN loses nothing, so both operands get g where either is NaN."""
    a, c = b.args[:2]
    va, vc = operands(b, value)
    loses = Prim.LT if b.sym.name == "maximum" else Prim.GT
    tie = apply(Prim.EQ, va, vc)
    half = apply(Prim.MUL, g, 0.5)
    out = []
    for var, mine, other in ((a, va, vc), (c, vc, va)):
        if is_tensor(var):
            share = apply(Prim.WHERE, apply(loses, mine, other), zeros_like(g), g)
            out.append((var, apply(Prim.WHERE, tie, half, share)))
    return out


define("MAXIMUM", B, vjp=_max_min_vjp, c="FJ_MAX({0}, {1})", triton=_NANS.format("maximum"),
       aten=("maximum.default",))
define("MINIMUM", B, vjp=_max_min_vjp, c="FJ_MIN({0}, {1})", triton=_NANS.format("minimum"),
       aten=("minimum.default",))


def _clamp_vjp(b, g, value):
    """torch (clamp_backward_min_max): x gets g where it is not clamped (x >= min), a tensor
    bound where it clamps (x < min).  Neither gets it where x or the bound is NaN."""
    x, bound = b.args[:2]
    vx, vb = operands(b, value)
    is_min = b.sym.name == "clamp_min"
    keep = apply(Prim.GE if is_min else Prim.LE, vx, vb)
    out = [(x, apply(Prim.WHERE, keep, g, zeros_like(g)))]
    if is_tensor(bound):
        clamps = apply(Prim.LT if is_min else Prim.GT, vx, vb)
        out.append((bound, apply(Prim.WHERE, clamps, g, zeros_like(g))))
    return out


_CLAMP_NOTES = {"decomposition": "torch.clamp and torch.clip reach it (decompositions/math_ops.py); "
                                 "Tensor.clamp_min/clamp_max are not claimed and stay torch calls",
                "aten": "aten.clamp (a composite row in dynamo/aten.py) reaches it through torch.clamp"}
define("CLAMP_MIN", B, names=(), vjp=_clamp_vjp, c="FJ_MAX({0}, {1})",
       triton=_NANS.format("maximum"), notes=_CLAMP_NOTES)
define("CLAMP_MAX", B, names=(), vjp=_clamp_vjp, c="FJ_MIN({0}, {1})",
       triton=_NANS.format("minimum"), notes=_CLAMP_NOTES)


def _atan2_vjp(b, g, value):
    a, c = b.args[:2]
    va, vc = operands(b, value)
    r = apply(Prim.DIV, g, apply(Prim.ADD, square(va), square(vc)))
    out = []
    if is_tensor(a):
        out.append((a, apply(Prim.MUL, r, vc)))
    if is_tensor(c):
        out.append((c, apply(Prim.MUL, apply(Prim.NEG, r), va)))
    return out


define("ATAN2", B, _F, names=("atan2", "arctan2"), vjp=_atan2_vjp, c=Form("atan2{f}({0}, {1})", Cost.LIBM),
       aten=("atan2.default",), notes={"triton": _NOT_WRITTEN.format("atan2")})
