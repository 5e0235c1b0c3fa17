"""The transcendental unary prims: exponentials, logarithms, roots, trigonometric and hyperbolic
functions, sigmoid and the error functions.  One block per prim (see registry.py).

By default a block's C form is the C library's function (`exp{f}`: `expf` in float, `exp` in
double: a scalar call, Cost.LIBM), its ATen overload `<name>.default`, and its derivative
d(x, out, value) the VJP.  The float32 vector forms (`c_vector`) are executors/c/vecmath.py's
inline functions, each with its error against torch measured by
tests/executors/test_c_executor.py::test_vector_math_ulp_error_against_torch (`ulp`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fjit.core.prims.registry import Cost, Domain, Form, Kind, Prim, apply, define
from fjit.core.prims.toolkit import derivative, square

_LIBDEVICE_ONLY = ("tl has no {0}: the interpreter would need a precise tl.* form, "
                   "and libdevice.{0} for compiled kernels was not written")


def _float(name, d, *, names=None, c=None, aten=None, **parts):
    """A unary prim on floats: its derivative `d`, its C library call by default."""
    value = parts.pop("value", name.lower())
    return define(name, Kind.UNARY, Domain.FLOAT, value=value, names=names, vjp=derivative(d),
                  c=c or Form(f"{value}{{f}}({{0}})", Cost.LIBM), aten=aten or (f"{value}.default",),
                  **parts)


def _libdevice(p):
    return f"libdevice.{p}({{0}})"


def _vector(expr, ulp, guard=None):
    """A C float32 vector form of vecmath.py, `ulp` its measured error bound against torch."""
    return Form(expr, Cost.VECTOR, ulp=ulp, guard=guard)


# sin and cos reduce their argument accurately only up to vecmath's FJ_TRIG_LIMIT
_TRIG_GUARD = "fabsf({0}) > FJ_TRIG_LIMIT"


_float("EXP", lambda x, o, v: v(o), c_vector=_vector("fj_expf({0})", 1), triton="tl.exp({0})")
_float("EXP2", lambda x, o, v: apply(Prim.MUL, v(o), math.log(2.0)), triton="tl.exp2({0})")
_float("EXPM1", lambda x, o, v: apply(Prim.ADD, v(o), 1),
       triton_interpreted="_expm1({0})", triton_compiled=_libdevice("expm1"))
_float("LOG", lambda x, o, v: apply(Prim.RECIPROCAL, v(x)), c_vector=_vector("fj_logf({0})", 1),
       triton="tl.log({0})")
_float("LOG2", lambda x, o, v: apply(Prim.RECIPROCAL, apply(Prim.MUL, v(x), math.log(2.0))),
       triton="tl.log2({0})")
_float("LOG10", lambda x, o, v: apply(Prim.RECIPROCAL, apply(Prim.MUL, v(x), math.log(10.0))),
       triton="(tl.log2({0}) * 0.30102999566398120)", triton_compiled=_libdevice("log10"))
_float("LOG1P", lambda x, o, v: apply(Prim.RECIPROCAL, apply(Prim.ADD, v(x), 1)),
       c_vector=_vector("fj_log1pf({0})", 2), triton_interpreted="_log1p({0})", triton_compiled=_libdevice("log1p"))
_float("SQRT", lambda x, o, v: apply(Prim.DIV, 0.5, v(o)), c=Form("sqrt{f}({0})", Cost.ARITHMETIC),
       triton="tl.sqrt({0})", triton_f32="tl.sqrt_rn({0})")   # IEEE-rounded, as torch's CUDA
_float("RSQRT", lambda x, o, v: apply(Prim.MUL, apply(Prim.MUL, square(v(o)), v(o)), -0.5),
       c=Form("(1 / sqrt{f}({0}))", Cost.ARITHMETIC), triton="(1 / tl.sqrt({0}))", triton_compiled=_libdevice("rsqrt"))
_float("SIN", lambda x, o, v: apply(Prim.COS, v(x)), c_vector=_vector("fj_sinf({0})", 2, _TRIG_GUARD), triton="tl.sin({0})")
_float("COS", lambda x, o, v: apply(Prim.NEG, apply(Prim.SIN, v(x))), c_vector=_vector("fj_cosf({0})", 2, _TRIG_GUARD),
       triton="tl.cos({0})")
_float("TAN", lambda x, o, v: apply(Prim.ADD, square(v(o)), 1),
       triton="(tl.sin({0}) / tl.cos({0}))", triton_compiled=_libdevice("tan"))
_float("ASIN", lambda x, o, v: apply(Prim.RSQRT, apply(Prim.SUB, 1, square(v(x)))),
       names=("asin", "arcsin"), notes={"triton": _LIBDEVICE_ONLY.format("asin")})
_float("ACOS", lambda x, o, v: apply(Prim.NEG, apply(Prim.RSQRT, apply(Prim.SUB, 1, square(v(x))))),
       names=("acos", "arccos"), notes={"triton": _LIBDEVICE_ONLY.format("acos")})
_float("ATAN", lambda x, o, v: apply(Prim.RECIPROCAL, apply(Prim.ADD, square(v(x)), 1)),
       names=("atan", "arctan"), notes={"triton": _LIBDEVICE_ONLY.format("atan")})
_float("ASINH", lambda x, o, v: apply(Prim.RSQRT, apply(Prim.ADD, square(v(x)), 1)),
       names=("asinh", "arcsinh"), triton_compiled=_libdevice("asinh"), notes={
           "triton": "interpreted: tl has no asinh, and log(x + sqrt(x*x + 1)) loses small "
                     "arguments' relative precision and overflows large ones, so it stays a torch "
                     "call under TRITON_INTERPRET=1"})
_float("SINH", lambda x, o, v: apply(Prim.COSH, v(x)),
       triton_interpreted="_sinh({0})", triton_compiled=_libdevice("sinh"))
_float("COSH", lambda x, o, v: apply(Prim.SINH, v(x)),
       triton="((tl.exp({0}) + tl.exp(-{0})) * 0.5)", triton_compiled=_libdevice("cosh"))
_float("TANH", lambda x, o, v: apply(Prim.SUB, 1, square(v(o))), also=(F.tanh,),
       c_vector=_vector("fj_tanhf({0})", 2), triton_interpreted="_tanh({0})", triton_compiled=_libdevice("tanh"))
_float("SIGMOID", lambda x, o, v: apply(Prim.MUL, v(o), apply(Prim.SUB, 1, v(o))),
       also=(F.sigmoid, torch.special.expit), c=Form("(1 / (1 + exp{f}(-{0})))", Cost.LIBM),
       c_vector=_vector("fj_sigmoidf({0})", 3), triton="(1 / (1 + tl.exp(-{0})))")
_float("ERF", lambda x, o, v: apply(Prim.MUL, apply(Prim.EXP, apply(Prim.NEG, square(v(x)))),
                                    2.0 / math.sqrt(math.pi)),
       also=(torch.special.erf,), c_vector=_vector("fj_erff({0})", 2), triton="tl.erf({0})",
       triton_compiled=_libdevice("erf"))
define("ERFC", Kind.UNARY, Domain.FLOAT, c=Form("erfc{f}({0})", Cost.LIBM), triton_compiled=_libdevice("erfc"), notes={
    "vjp": "no rule written: autodiff records the torch-level op and torch autograd differentiates it",
    "triton": "interpreted: tl has no erfc and 1 - tl.erf(x) loses its tail to rounding, so it "
              "stays a torch call under TRITON_INTERPRET=1",
    "aten": "aten.erfc has no row in dynamo/aten.py: the backend keeps it one torch call"})
