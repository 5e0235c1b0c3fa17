"""Attention ops recorded as the torch calls eager's composites make: nn.MultiheadAttention's
projections (linear layers the compiled backward differentiates and fuses), and
F.scaled_dot_product_attention where eager runs its math form (a mask that needs a gradient: an
attention bias), so that its mask addition and softmax, forward and backward, are kernels rather
than five ATen passes inside a nested torch-autograd island.  An attention eager runs as ATen's
flash kernel stays that one op (Prim.SDPA; autodiff calls the kernel's own backward)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fjit.core.meta import ATTENTION_PARAMS, attention_backend
from fjit.core.prims import Prim, apply
from fjit.frontend.context import current
from fjit.frontend.proxies import TensorProxy
from fjit.decompositions.math_ops import call, register, replace


@replace(F.multi_head_attention_forward)
def _multi_head_attention(query, key, value, embed_dim_to_check, num_heads, in_proj_weight,
                          in_proj_bias, bias_k, bias_v, add_zero_attn, dropout_p, out_proj_weight,
                          out_proj_bias, training=True, key_padding_mask=None, need_weights=True,
                          attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
                          k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                          average_attn_weights=True, is_causal=False):
    """nn.MultiheadAttention without weights or masks (torchvision's ViT, a TransformerEncoderLayer
    without dropout), recorded as eager's own torch calls: its projections are linear layers the
    compiled backward differentiates and fuses, where the whole op was one torch call that torch
    autograd kept, graph and all.  Anything else (masks, returned weights, dropout) stays that
    one call."""
    tensors = (query, key, value, in_proj_weight)
    if need_weights or bias_k is not None or bias_v is not None or add_zero_attn \
            or key_padding_mask is not None or attn_mask is not None or is_causal \
            or use_separate_proj_weight or static_k is not None or static_v is not None \
            or (training and dropout_p) or type(num_heads) is not int \
            or not all(isinstance(t, TensorProxy) for t in tensors) \
            or not all(t.ndim == 3 for t in (query, key, value)) or key.shape != value.shape:
        raise NotImplementedError
    tgt_len, bsz, embed_dim = query.shape
    if embed_dim != embed_dim_to_check or embed_dim % num_heads:
        raise NotImplementedError         # eager's own error
    head_dim = embed_dim // num_heads
    if key is value:                      # torch.nn.functional._in_projection_packed
        w, b = in_proj_weight, in_proj_bias
        parts = 3 if query is key else 2
        if parts == 2:
            w_q, w = call(torch.Tensor.split, in_proj_weight, [embed_dim, 2 * embed_dim])
            b_q, b = (None, None) if in_proj_bias is None else \
                call(torch.Tensor.split, in_proj_bias, [embed_dim, 2 * embed_dim])
            q = call(F.linear, query, w_q, b_q)
        proj = call(F.linear, key, w, b)
        proj = call(torch.Tensor.unflatten, proj, -1, (parts, embed_dim))
        proj = call(torch.Tensor.contiguous, call(torch.Tensor.squeeze, call(
            torch.Tensor.transpose, call(torch.Tensor.unsqueeze, proj, 0), 0, -2), -2))
        packed = [call(torch.Tensor.__getitem__, proj, i) for i in range(parts)]
        q, k, v = packed if parts == 3 else (q, *packed)
    else:
        w_q, w_k, w_v = call(torch.Tensor.chunk, in_proj_weight, 3)
        b_q, b_k, b_v = (None,) * 3 if in_proj_bias is None else call(torch.Tensor.chunk, in_proj_bias, 3)
        q, k, v = (call(F.linear, x, w_, b_) for x, w_, b_ in ((query, w_q, b_q), (key, w_k, b_k),
                                                             (value, w_v, b_v)))
    src_len = key.shape[0]
    q, k, v = (call(torch.Tensor.view, call(torch.Tensor.transpose, call(
        torch.Tensor.view, x, n, bsz * num_heads, head_dim), 0, 1), bsz, num_heads, n, head_dim)
        for x, n in ((q, tgt_len), (k, src_len), (v, src_len)))
    out = call(F.scaled_dot_product_attention, q, k, v, None, 0.0, False)
    out = call(torch.Tensor.view, call(torch.Tensor.contiguous, call(torch.Tensor.permute, out, 2, 0, 1, 3)),
               bsz * tgt_len, embed_dim)
    out = call(F.linear, out, out_proj_weight, out_proj_bias)
    return call(torch.Tensor.view, out, tgt_len, bsz, embed_dim), None


@replace(F.scaled_dot_product_attention)
def _math_attention(*args, **kwargs):
    """What ATen's `_scaled_dot_product_attention_math` computes, for float32/float64 CPU operands
    (a GPU's choices and kernels are not measured here) where eager's backend choice is that
    form, without dropout, a causal mask, GQA or a negative scale: q and k^T each scaled by sqrt(scale), their product plus the mask (a boolean one as
    -inf where False), a softmax whose rows that are -inf throughout are 0 (`_safe_softmax`;
    their gradient 0 too: the softmax reads 0 there instead of -inf), times v."""
    given = dict(zip(ATTENTION_PARAMS, args))
    given.update(kwargs)
    q, k, v, mask = (given.get(n) for n in ATTENTION_PARAMS[:4])
    scale = given.get("scale")
    if not all(isinstance(t, TensorProxy) and t.dtype in (torch.float32, torch.float64) and t.ndim >= 2
               and t.ir.device.type == "cpu" for t in (q, k, v)) or len({t.dtype for t in (q, k, v)}) > 1 or \
            not (mask is None or isinstance(mask, TensorProxy) and mask.dtype in (torch.bool, q.dtype)
                 and _broadcasts_into(mask.shape, q, k)) or given.get("dropout_p", 0.0) != 0.0 \
            or given.get("is_causal", False) is not False or given.get("enable_gqa", False) is not False \
            or not (scale is None or type(scale) is float and scale >= 0) or not _eager_runs_math(q, k, v, mask, scale):
        raise NotImplementedError
    factor = math.sqrt(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    attn = call(torch.matmul, call(torch.mul, q, factor),
                 call(torch.mul, call(torch.Tensor.transpose, k, -2, -1), factor))
    if mask is not None:
        attn = call(torch.Tensor.masked_fill, attn, call(torch.logical_not, mask), float("-inf")) \
            if mask.dtype is torch.bool else call(torch.add, attn, mask)
    dead = call(torch.eq, call(torch.amax, attn, -1, True), float("-inf"))    # boolean: no gradient
    weights = call(torch.softmax, call(torch.where, dead, 0.0, attn), -1)
    return call(torch.matmul, call(torch.where, dead, 0.0, weights), v)


def _broadcasts_into(mask_shape, q, k) -> bool:
    """Whether the mask broadcasts to the attention's [..., L, S] scores (eager adds it in place:
    a mask that would grow them is eager's error, which the op's own shape rule raises)."""
    try:
        scores = torch.broadcast_shapes(tuple(q.shape[:-2]), tuple(k.shape[:-2])) + (q.shape[-2], k.shape[-2])
        return torch.broadcast_shapes(tuple(mask_shape), scores) == scores
    except RuntimeError:
        return False


def _eager_runs_math(q, k, v, mask, scale) -> bool:
    """Whether torch's backend choice for these operands (layouts, gradients, the traced grad
    mode) is its math form."""
    with torch.set_grad_enabled(current().grad_mode):
        choice = attention_backend(q.ir, k.ir, v.ir, None if mask is None else mask.ir, scale=scale)
    return choice == torch.nn.attention.SDPBackend.MATH.value


@register(F.scaled_dot_product_attention)
def _sdpa(q, k, v, *args, **kwargs):
    return apply(Prim.SDPA, q, k, v, *args, **kwargs)
