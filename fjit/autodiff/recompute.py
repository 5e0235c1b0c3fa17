"""What the joint program's backward may run again rather than read back: `recomputable` says of
the op that made a forward value whether running it in the backward is cheap (views, pointwise
prims, factories, copies; never a random draw), and `batch_norm_output` recomputes a training batch
norm's normalized output from what its backward reads anyway.  remat.py's minimum cut chooses,
among the values the backward reads, which it recomputes from these ops and which the forward
saves.
"""
from __future__ import annotations

from fjit.autodiff.aten_backward import batch_norm_args
from fjit.core.ir import BoundSymbol, Tag, TensorVar
from fjit.core.prims import ROWS, Kind, Prim, apply, prim_of
from fjit.core.prims.layout import reshape_copies


def recomputable(b: BoundSymbol | None) -> bool:
    """Cheap to run again in the backward: view prims, and pointwise ones, factories, a reshape
    that copies and the prims whose block says so (a contiguous copy); random ones are draws."""
    p = prim_of(b) if b is not None else None
    if p is None or b.sym.has(Tag.RANDOM):
        return False
    block = ROWS[p]
    return b.sym.has(Tag.SHAPE) or b.sym.has(Tag.ELEMENTWISE) or block.kind is Kind.FACTORY or block.recompute


def is_view(b: BoundSymbol) -> bool:
    """A view prim: a reshape that copies is not one."""
    p = prim_of(b)
    return p is not None and b.sym.has(Tag.SHAPE) and not (p is Prim.RESHAPE and reshape_copies(b.args[0], b.args[1]))


def batch_norm_operands(b: BoundSymbol, var: TensorVar) -> tuple | None:
    """Where `var` is the normalized output of training batch norm `b` (an op eager's kernel runs
    whole), the tensors it is recomputed from: the input, the batch mean and inverse std (which
    the batch norm's backward reads anyway) and the affine weight and bias; else None.  A CNN's
    ReLU(BatchNorm(conv)) entering the next convolution is then recomputed from the convolution's
    output rather than saved beside it."""
    args = batch_norm_args(b)
    if args is None or var.name != b.outputs()[0].name:
        return None
    x, weight, bias, _ = args
    _, mean, invstd = b.outputs()[:3]
    return tuple(v for v in (x, mean, invstd, weight, bias) if isinstance(v, TensorVar))


def batch_norm_output(b: BoundSymbol, value):
    """The normalized output of training batch norm `b` in prims, as ATen's CPU kernel computes it
    (x * scale + shift per channel, scale = invstd * weight, shift = bias - mean * scale), from
    `value`'s proxies of the forward values."""
    x, weight, bias, _ = batch_norm_args(b)
    out, mean, invstd = b.outputs()[:3]
    scale = value(invstd)
    if isinstance(weight, TensorVar):
        scale = apply(Prim.MUL, scale, value(weight))
    shift = apply(Prim.NEG, apply(Prim.MUL, value(mean), scale))
    if isinstance(bias, TensorVar):
        shift = apply(Prim.ADD, shift, value(bias))
    per_channel = (x.shape[1],) + (1,) * (x.ndim - 2)
    y = apply(Prim.ADD, apply(Prim.MUL, value(x), apply(Prim.RESHAPE, scale, per_channel)),
              apply(Prim.RESHAPE, shift, per_channel))
    return apply(Prim.CONVERT, y, out.dtype) if y.dtype != out.dtype else y
