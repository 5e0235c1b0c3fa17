"""The prims only torch computes: matmul and scaled dot-product attention.  One block per prim (see
registry.py).  Kernels never take them: torch's own GEMM and attention kernels run them."""
from __future__ import annotations

import torch

from fjit.core.ir import TensorVar
from fjit.core.prims.registry import Kind, Prim, apply, define


def _column_major(v: TensorVar) -> bool:
    return v.ndim >= 2 and v.strides[-2] == 1 and v.strides[-1] != 1


def _transposed(v):
    perm = tuple(range(v.ndim - 2)) + (v.ndim - 1, v.ndim - 2)
    return apply(Prim.PERMUTE, v, perm)


def _squeeze_to(g, var: TensorVar):
    """A cotangent of a 1-d operand that was made 2-d: back to 1-d after summing batch dims."""
    if var.ndim != 1:
        return g
    g = apply(Prim.SUM, g, tuple(range(g.ndim - 2)), False) if g.ndim > 2 else g
    return apply(Prim.RESHAPE, g, tuple(var.shape))


def _matmul_vjp(b, g, value):
    """Two matmuls; 1-d operands are made 2-d first, broadcast batch dims are summed by the caller."""
    a, c = b.args[:2]
    va, vc = value(a), value(c)
    if a.ndim == 1:
        va, g = apply(Prim.UNSQUEEZE, va, 0), apply(Prim.UNSQUEEZE, g, -2 if c.ndim > 1 else 0)
    if c.ndim == 1:
        vc, g = apply(Prim.UNSQUEEZE, vc, -1), apply(Prim.UNSQUEEZE, g, -1)
    # A linear layer on N-d activations (a 2-d weight): both of its gradients are matmuls of the
    # flattened operands, as eager's
    linear_on_nd = c.ndim == 2 and a.ndim > 2
    # A cotangent gets its operand's layout: F.linear's weight is used transposed, and a
    # transposed gradient would make AccumulateGrad's += read it with strides (3x slower).  Not a
    # linear layer's N-d input (one after a transpose: ResMLP's channel MLP reads its token
    # mixer's transposed output): there `vc @ g.T` is a batched matmul of a few columns per batch
    # (8 of [384, 1536] @ [1536, 16], 1.45 ms a layer), where `g @ vc.T` is one matmul.
    if _column_major(a) and not linear_on_nd:
        ga = _transposed(apply(Prim.MATMUL, vc, _transposed(g)))
    else:
        ga = apply(Prim.MATMUL, g, _transposed(vc))
    if linear_on_nd:
        # the weight's gradient: not a batched matmul and a sum over the batch (4x slower on
        # MLP-Mixer's training step)
        va = apply(Prim.RESHAPE, va, (-1, va.shape[-1]))
        g = apply(Prim.RESHAPE, g, (-1, g.shape[-1]))
    if _column_major(c):
        gc = _transposed(apply(Prim.MATMUL, _transposed(g), va))
    else:
        gc = apply(Prim.MATMUL, _transposed(va), g)
    return [(a, _squeeze_to(ga, a)), (c, _squeeze_to(gc, c))]


define("MATMUL", Kind.OPAQUE, vjp=_matmul_vjp, aten=("mm.default", "bmm.default", "matmul.default"),
       notes={"decomposition": "torch.matmul, mm, bmm, F.linear reach it (decompositions/nn_ops.py)"})
define("SDPA", Kind.OPAQUE, value="scaled_dot_product_attention",
       lowering=torch.nn.functional.scaled_dot_product_attention, notes={
           "decomposition": "F.scaled_dot_product_attention reaches it (decompositions/attention.py)",
           "vjp": "no rule written: an attention eager runs as ATen's flash CPU kernel gets that "
                  "kernel's backward (autodiff/aten_backward.py); any other is recorded as the "
                  "torch-level op and torch autograd differentiates it",
           "aten": "AOT graphs hold aten's attention overloads: no row in dynamo/aten.py, they "
                   "stay torch calls"})
