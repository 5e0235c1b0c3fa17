"""The unary prims that are not transcendental: sign and magnitude, rounding, logic, tests of
values, and copies.  One block per prim (see registry.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fjit.core.prims.registry import Cost, Domain, Form, Kind, Prim, apply, define, torch_callables
from fjit.core.prims.toolkit import derivative, identity, no_kwargs, zeros_like

_F, _I, U = Domain.FLOAT, Domain.INT, Kind.UNARY


def _relu_vjp(b, g, value):
    """torch's threshold_backward: g where not relu(x) <= 0 (so a NaN passes it, 0 does not).  It
    reads the output, as eager's node does: relu(x) <= 0 exactly where x <= 0, and the output is
    what a CNN saves anyway (the next convolution's input), where reading x kept the batch norm's
    output alive beside it, one more activation a layer (ResNet-50's joint program 5% slower)."""
    (x,) = b.args[:1]
    blocked = apply(Prim.LE, value(b.output), 0)
    return [(x, apply(Prim.WHERE, blocked, zeros_like(g), g))]


def _relu(x, inplace=False):
    # its own prim, not clamp_min(x, 0): the values agree, the gradients do not (relu's passes
    # a NaN's and blocks 0's; clamp's blocks a NaN's and passes 0's)
    return apply(Prim.RELU, x)


def _round(x, decimals=0, **kwargs):
    no_kwargs(kwargs)
    if decimals:
        raise NotImplementedError
    return apply(Prim.ROUND, x)


def _clone(x, *, memory_format=torch.preserve_format):
    return apply(Prim.CLONE, x)


def _rounding(name, **parts):
    """A float rounding prim: no cotangent flows through a step function."""
    return define(name, U, _F, nondiff=True, aten=(f"{name.lower()}.default",), **parts)


define("ABS", U, names=("abs", "absolute", "__abs__"),
       vjp=derivative(lambda x, o, v: apply(Prim.SIGN, v(x))),
       c="({0} < 0 ? -{0} : {0})", triton="tl.abs({0})", aten=("abs.default",),
       c_float=Form("fabs{f}({0})", Cost.ARITHMETIC))     # the ternary would keep -0.0 negative
define("NEG", U, names=("neg", "negative", "__neg__"),
       vjp=lambda b, g, value: [(b.args[0], apply(Prim.NEG, g))],
       expr="(-{0})", aten=("neg.default",))
define("RELU", U, names=(), decompositions=(((torch.relu, torch.Tensor.relu, F.relu), _relu),),
       vjp=_relu_vjp,
       c="({0} < 0 ? 0 : {0})", triton="tl.where({0} < 0, 0, {0})",   # -0.0 and NaN stay, as torch.relu
       aten=("relu.default",))
_rounding("FLOOR", c=Form("floor{f}({0})", Cost.ARITHMETIC), triton="tl.floor({0})")
_rounding("CEIL", c=Form("ceil{f}({0})", Cost.ARITHMETIC), triton="tl.ceil({0})")
_rounding("ROUND", names=(), decompositions=((tuple(torch_callables("round")), _round),),
          c=Form("nearbyint{f}({0})", Cost.ARITHMETIC),   # the default rounding mode: half to even, as torch.round
          triton="_round_half_even({0})")
_rounding("TRUNC", names=("trunc", "fix"), c=Form("trunc{f}({0})", Cost.ARITHMETIC),
          triton="tl.where({0} >= 0, tl.floor({0}), tl.ceil({0}))")
define("SIGN", U, nondiff=True, c="(({0} > 0) - ({0} < 0))",
       triton="(({0} > 0).to({t}) - ({0} < 0).to({t}))", aten=("sign.default",))
define("RECIPROCAL", U, _F, vjp=derivative(lambda x, o, v: apply(Prim.NEG, apply(Prim.MUL, v(o), v(o)))),
       expr="(1 / {0})", aten=("reciprocal.default",))
define("LOGICAL_NOT", U, bool_result=True, nondiff=True, expr="({0} == 0)",
       aten=("logical_not.default",))
define("BITWISE_NOT", U, _I, names=("bitwise_not", "__invert__"), nondiff=True, expr="(~{0})",
       c_bool="(!{0})",    # C's ~ of a bool promotes it to int: ~1 is -2, true again
       aten=("bitwise_not.default",))
define("ISNAN", U, _F, bool_result=True, nondiff=True, expr="({0} != {0})", aten=("isnan.default",))
define("ISINF", U, _F, bool_result=True, nondiff=True, c="isinf({0})",
       triton="(tl.abs({0}) == float('inf'))", aten=("isinf.default",))
define("ISFINITE", U, _F, bool_result=True, nondiff=True, c="isfinite({0})",
       triton="(tl.abs({0}) < float('inf'))", aten=("isfinite.default",))
define("CLONE", U, names=(), decompositions=((tuple(torch_callables("clone")), _clone),),
       vjp=identity, expr="{0}", aten=("clone.default",))
