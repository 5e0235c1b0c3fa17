"""torch.nn.functional ops and matmul as decompositions into prims.

Half-precision inputs are computed in float32 and rounded once at the end, as torch's own kernels do.
"""
from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for

from fjit.core.ir import Symbol, Tag
from fjit.core.prims import Prim, apply, prim_of, torch_callables
from fjit.core.prims.layout import reshape_copies
from fjit.core.symbolic import at_hint
from fjit.frontend.context import current
from fjit.frontend.dispatch import dispatch
from fjit.frontend.record import trace_call
from fjit.core.prims.toolkit import reduced_dims
from fjit.frontend.proxies import NumberProxy, TensorProxy
from fjit.decompositions.math_ops import call, downcast, no_empty_reduction, register, replace, upcast
from fjit.runtime import fjit_ops


def _softmax_parts(x, dim, dtype):
    if dim is None:
        raise NotImplementedError   # the deprecated implicit dim
    y = upcast(apply(Prim.CONVERT, x, dtype) if dtype is not None else x)
    d = reduced_dims(x, dim)
    no_empty_reduction(x, d)
    if not x.ndim:
        return y, d, apply(Prim.SUB, y, y), dtype or x.dtype
    with torch.no_grad():
        peak = apply(Prim.AMAX, y, d, True)
    return y, d, apply(Prim.SUB, y, peak), dtype or x.dtype


@register(F.softmax, torch.softmax, torch.Tensor.softmax, torch.special.softmax)
def _softmax(x, dim=None, _stacklevel=3, dtype=None):
    _, d, shifted, out_dtype = _softmax_parts(x, dim, dtype)
    e = apply(Prim.EXP, shifted)
    # times the sum's reciprocal, as ATen's CPU kernel computes it: one division a row, not one an
    # element (a vector division costs several multiplications' time)
    return downcast(apply(Prim.MUL, e, apply(Prim.RECIPROCAL, apply(Prim.SUM, e, d, True))), out_dtype)


@register(F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax, torch.special.log_softmax)
def _log_softmax(x, dim=None, _stacklevel=3, dtype=None):
    _, d, shifted, out_dtype = _softmax_parts(x, dim, dtype)
    lse = apply(Prim.LOG, apply(Prim.SUM, apply(Prim.EXP, shifted), d, True))
    return downcast(apply(Prim.SUB, shifted, lse), out_dtype)


def _standardized(y, dims: tuple, n: int, eps):
    """(y - mean) / sqrt(var + eps) over `dims` (`n` values), as layer and group norm compute it."""
    diff = apply(Prim.SUB, y, apply(Prim.DIV, apply(Prim.SUM, y, dims, True), n))
    var = apply(Prim.DIV, apply(Prim.SUM, apply(Prim.MUL, diff, diff), dims, True), n)
    return apply(Prim.MUL, diff, apply(Prim.RSQRT, apply(Prim.ADD, var, eps)))


@register(F.layer_norm, torch.layer_norm)
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    out = _standardized(upcast(x), dims, math.prod(normalized_shape), eps)
    if weight is not None:
        out = apply(Prim.MUL, out, weight)
    if bias is not None:
        out = apply(Prim.ADD, out, bias)
    return downcast(out, x.dtype)


@register(F.group_norm, torch.group_norm)
def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5, cudnn_enabled=True):
    """Layer norm's prims over each group of channels (a row [N, G, C/G * spatial]), then the
    per-channel affine: PoolFormer's and diffusion U-Nets' norm fuses with its neighbours, where
    one torch call kept the function on torch autograd."""
    if type(num_groups) is not int or x.ndim < 2 or num_groups <= 0 or x.shape[1] % num_groups \
            or isinstance(eps, NumberProxy) or not isinstance(x, TensorProxy) \
            or tuple(x.ir.strides) != make_contiguous_strides_for(x.shape):
        # eager's own error; or a channels-last input, on which ATen's CPU kernel returns another
        # layout than its meta kernel says: a torch call whose layout the first call observes
        raise NotImplementedError
    n, c = x.shape[:2]
    rows = apply(Prim.RESHAPE, upcast(x), (n, num_groups, -1))
    no_empty_reduction(rows, (2,))
    out = apply(Prim.RESHAPE, _standardized(rows, (2,), rows.shape[2], eps), tuple(x.shape))
    channel = (c,) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = apply(Prim.MUL, out, apply(Prim.RESHAPE, weight, channel))
    if bias is not None:
        out = apply(Prim.ADD, out, apply(Prim.RESHAPE, bias, channel))
    return downcast(out, x.dtype)


@register(F.rms_norm, torch.rms_norm)
def _rms_norm(x, normalized_shape, weight=None, eps=None):
    y = upcast(x)
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    n = math.prod(normalized_shape)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    ms = apply(Prim.DIV, apply(Prim.SUM, apply(Prim.MUL, y, y), dims, True), n)
    out = apply(Prim.MUL, y, apply(Prim.RSQRT, apply(Prim.ADD, ms, eps)))
    if weight is not None:
        out = apply(Prim.MUL, out, upcast(weight))
    return downcast(out, x.dtype)


# F.dropout has no decomposition: eager draws its mask with bernoulli_ on the CPU and with a fused
# Philox kernel on CUDA, and no uniform-based mask reproduces either stream.  As one torch call it
# draws eager's numbers from eager's generator, which is what "random ops follow eager" promises.


MAX_POOL = Symbol("fjit_ops.max_pool2d", fjit_ops.max_pool2d, frozenset({Tag.FALLBACK}))


def _pair(v, name: str) -> list:
    if isinstance(v, int) and not isinstance(v, bool):
        return [v, v]
    if isinstance(v, (tuple, list)) and len(v) in (1, 2) and all(type(i) is int for i in v):
        return [v[0], v[-1]]
    raise NotImplementedError(name)    # a traced number or another form: the torch call


@replace(F.max_pool2d, torch.max_pool2d)
def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
    """Through a channels-last copy (runtime.max_pool2d) where ATen's NCHW CPU kernel is the slow
    one: a contiguous 4-D float CPU input of 16+ channels and 2^16+ elements, measured on the zoo's
    pooling shapes (a smaller or thinner one is as fast or faster in NCHW).  Else the torch call."""
    if return_indices or not isinstance(x, TensorProxy) or x.ndim != 4 or x.device.type != "cpu" \
            or x.dtype not in (torch.float32, torch.float64) or x.shape[1] < 16 \
            or math.prod(x.shape) < 2 ** 16 or tuple(x.ir.strides) != make_contiguous_strides_for(x.shape) \
            or not isinstance(ceil_mode, bool):
        raise NotImplementedError
    kernel = _pair(kernel_size, "kernel_size")
    pool = (kernel, _pair(stride, "stride") if stride not in (None, (), []) else kernel,
            _pair(padding, "padding"), _pair(dilation, "dilation"), ceil_mode)
    return trace_call(current(), MAX_POOL, fjit_ops.max_pool2d, (x, *pool), {})


# A patch embedding (kernel == stride) whose patches hold at least PATCH_MATMUL_MIN elements, or
# at least PATCH_MATMUL_MIN_FEW over at most PATCH_MATMUL_FEW_ROWS patches, is a matmul of the
# patches as rows.  In training steps through fjit: 32x32 patches of 3 channels 0.34x oneDNN's
# time, 16x16 0.9-1.0x; 8x8 and 4x4 patches of small images (torchvision's and HF's ViT stems,
# 128-512 patches) 0.85x and 0.95x; but 4x4 patches of a 224x224 image (25088 patches) 1.3x, and
# a 2x2 downsampling of 96 channels at 56x56 1.4x: there oneDNN stays.
PATCH_MATMUL_MIN = 256
PATCH_MATMUL_MIN_FEW = 48
PATCH_MATMUL_FEW_ROWS = 2048
# A 1x1 convolution (stride 1) is a matmul of its positions' channel rows over at most 4 positions
# an image, POINTWISE_MATMUL_ROWS rows in all, or POINTWISE_MATMUL_WORK multiply-adds.  oneDNN's
# forward and backward of it against the matmuls' with the permuted copies around them, batch 8:
# 4x4 positions 0.47-0.91x oneDNN's time at 16-2048 channels; 8x8 0.59-0.64x at 16-96 channels
# but 1.2-2.2x at 64-2048; 16x16 1.04-2.0x.  (Taken as a patch embedding of 1x1 patches, every
# 1x1 convolution of at least 256 channels was a matmul at any size: a Wide ResNet-50 step's joint
# program ran 1.5x eager's, InceptionNeXt's 1.45x.)
POINTWISE_MATMUL_ROWS = 256
POINTWISE_MATMUL_WORK = 2_000_000


@register(torch.conv2d)
def _conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """Two convolutions as matmuls (their sums run in another order than oneDNN's: results agree
    to rounding, not bit for bit):
    - a 1x1 convolution over few positions (the late stages of a CNN on small images) or of little
      work (POINTWISE_MATMUL_ROWS and _WORK) as one matmul of its positions' channel rows: oneDNN's
      backward of it measured 1.4x (2x2) to 5x (1x1, 2048 -> 512 channels, batch 8) the matmuls'
      time; over more positions oneDNN wins;
    - a patch embedding (non-overlapping k x k patches, k > 1, PATCH_MATMUL_MIN and _FEW) as one matmul
      of its patches' rows, each patch laid out (channel, row, column) as the weight is."""
    if not (isinstance(x, TensorProxy) and isinstance(weight, TensorProxy) and x.ndim == 4
            and weight.ndim == 4 and weight.shape[1] == x.shape[1] and groups == 1
            and x.dtype in (torch.float32, torch.float64) and weight.dtype == x.dtype
            and (bias is None or isinstance(bias, TensorProxy) and bias.dtype == x.dtype)
            and _pair(dilation, "dilation") == [1, 1]
            and (padding == "valid" or padding != "same" and _pair(padding, "padding") == [0, 0])
            and x.ir.numel() > 0
            and tuple(x.ir.strides) == make_contiguous_strides_for(x.shape)):
        raise NotImplementedError
    n, c, h, w = x.shape
    kh, kw = weight.shape[2:]
    pointwise = (kh, kw) == (1, 1) and _pair(stride, "stride") == [1, 1]
    # (the crossovers are speed alone: in a symbolic program they are taken at the compiling
    # call's sizes, with no guard that would compile again each batch size crossing them; each
    # comparison its own at_hint, since `or` would take the first one's truth by a guard)
    if pointwise and (at_hint(h * w <= 4) or at_hint(n * h * w <= POINTWISE_MATMUL_ROWS)
                      or at_hint(n * h * w * c * weight.shape[0] <= POINTWISE_MATMUL_WORK)):
        rows = apply(Prim.RESHAPE, apply(Prim.PERMUTE, x, (0, 2, 3, 1)), (n * h * w, c))
    elif _pair(stride, "stride") == [kh, kw] and kh * kw > 1 and h % kh == 0 and w % kw == 0 and (
            c * kh * kw >= PATCH_MATMUL_MIN or c * kh * kw >= PATCH_MATMUL_MIN_FEW
            and at_hint(n * (h // kh) * (w // kw) <= PATCH_MATMUL_FEW_ROWS)):
        h, w = h // kh, w // kw
        patches = apply(Prim.PERMUTE, apply(Prim.RESHAPE, x, (n, c, h, kh, w, kw)), (0, 2, 4, 1, 3, 5))
        rows = apply(Prim.RESHAPE, apply(Prim.CONTIGUOUS, patches), (n * h * w, c * kh * kw))
        c = c * kh * kw
    else:
        raise NotImplementedError
    out = apply(Prim.MATMUL, rows, apply(Prim.PERMUTE, apply(Prim.RESHAPE, weight, (-1, c)), (1, 0)))
    if bias is not None:
        out = apply(Prim.ADD, out, bias)
    out = apply(Prim.PERMUTE, apply(Prim.RESHAPE, out, (n, h, w, -1)), (0, 3, 1, 2))
    return apply(Prim.CONTIGUOUS, out)


@register(F.adaptive_avg_pool2d)
def _adaptive_avg_pool2d(x, output_size):
    """A global average pool (output 1x1: a CNN's head, a squeeze-excite gate) is the mean over
    the last two dims, as ATen computes it; a torch call instead, torch autograd recorded it inside
    the joint program (EfficientNet-B0's 17 squeeze-excite gates: a nested autograd call each)."""
    size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
    if size != (1, 1) or x.ndim not in (3, 4) or not x.dtype.is_floating_point or \
            any(d == 0 for d in x.shape[-2:]):
        raise NotImplementedError
    y = upcast(x)
    total = apply(Prim.SUM, y, (x.ndim - 2, x.ndim - 1), True)
    return downcast(apply(Prim.DIV, total, x.shape[-2] * x.shape[-1]), x.dtype)


@register(F.linear)
def _linear(x, weight, bias=None):
    wt = apply(Prim.PERMUTE, weight, tuple(reversed(range(weight.ndim))))
    out = apply(Prim.MATMUL, x, wt)
    return apply(Prim.ADD, out, bias) if bias is not None else out


@register(*torch_callables("matmul"), *torch_callables("mm"), *torch_callables("bmm"), torch.Tensor.__matmul__)
def _matmul(a, b):
    # A batched operand whose batch dims do not merge into one (attention's q, k and v as views of
    # a fused projection) is copied by torch.matmul's reshape; copied here instead, explicitly, the
    # copy is what the backward's matmuls read too (eager's saves its copies), not the view again.
    if isinstance(a, TensorProxy) and isinstance(b, TensorProxy) and a.ndim >= 3 and b.ndim >= 3 \
            and tuple(a.shape[:-2]) == tuple(b.shape[:-2]):
        a, b = (apply(Prim.CONTIGUOUS, x) if reshape_copies(x.ir, (-1, *x.shape[-2:])) else x for x in (a, b))
    return apply(Prim.MATMUL, a, b)


def _made(var):
    """The prim that made `var` in the trace being recorded (a top-level op of one prim counts as
    it), or None."""
    for scope in reversed(current().scopes):
        for b in reversed(scope):
            if any(v.name == var.name for v in b.outputs()):
                return b if prim_of(b) is not None or len(b.subsymbols) != 1 else b.subsymbols[0]
    return None


def _repeated(t):
    """(kv, groups) where t ([B, Hkv * groups, L, D]) is kv ([B, Hkv, 1, L, D]) repeated per group
    head by an expand and a copying reshape (transformers' repeat_kv for grouped-query attention)."""
    r = _made(t) if t.ndim == 4 else None
    if r is None or prim_of(r) is not Prim.RESHAPE or r.args[0].ndim != 5:
        return None
    e = _made(r.args[0])
    if e is None or prim_of(e) is not Prim.EXPAND:
        return None
    kv, (b, hkv, groups, length, d) = e.args[0], tuple(r.args[0].shape)
    if tuple(kv.shape) != (b, hkv, 1, length, d) or tuple(t.shape) != (b, hkv * groups, length, d) or groups < 2:
        return None
    return kv, groups


@replace(torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__)
def _grouped_matmul(a, b):
    """q @ repeat_kv(k).mT and p @ repeat_kv(v) recorded as matmuls of each key/value head with its
    group of query heads stacked as rows: the same sums, without copying k and v once per group
    (the copies are then dead), and gradients without a sum over each group."""
    if not (isinstance(a, TensorProxy) and isinstance(b, TensorProxy) and a.ndim == 4 and b.ndim == 4):
        raise NotImplementedError
    made, t = _made(b.ir), b.ir
    transposed = made is not None and prim_of(made) is Prim.PERMUTE and tuple(made.args[1]) == (0, 1, 3, 2)
    found = _repeated(made.args[0] if transposed else t)
    n, h, m, k = a.shape
    if found is None:
        raise NotImplementedError
    kv, groups = found
    if reshape_copies(a.ir, (n, h // groups, groups * m, k)):
        # a query laid out [B, L, H, D] (a rotary embedding keeps the projection's layout): one
        # copy of it, which the kernel computing it writes, instead of one of each k or v per group
        a = dispatch(torch.Tensor.contiguous, (a,), {})
    heads = dispatch(torch.Tensor.reshape, (TensorProxy(kv), (kv.shape[0], kv.shape[1], kv.shape[3], kv.shape[4])), {})
    if transposed:
        heads = dispatch(torch.Tensor.transpose, (heads, 2, 3), {})
    rows = dispatch(torch.Tensor.reshape, (a, (n, h // groups, groups * m, k)), {})
    out = dispatch(torch.matmul, (rows, heads), {})
    return dispatch(torch.Tensor.reshape, (out, (n, h, m, out.shape[-1])), {})


# operand names and ranks of each "input + product" op: a matmul and an add the kernels fuse,
# whose backward is prims' (a recorded op costs a nested autograd call per backward).
# transformers' Conv1D (GPT-2) is addmm(bias, x, w); BLOOM's attention scores are
# alibi.baddbmm(batch1=q, batch2=k, beta=1, alpha=...), by keyword: the rule takes torch's names.
_ADDED_PRODUCTS = {"addmm": (("mat1", "mat2"), (2, 2)), "baddbmm": (("batch1", "batch2"), (3, 3)),
                   "addmv": (("mat", "vec"), (2, 1))}


def _added_product(names, ranks):
    P = inspect.Parameter
    signature = inspect.Signature([P("input", P.POSITIONAL_OR_KEYWORD)] +
                                  [P(n, P.POSITIONAL_OR_KEYWORD) for n in names] +
                                  [P("beta", P.KEYWORD_ONLY, default=1), P("alpha", P.KEYWORD_ONLY, default=1)])

    def rule(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bias, a, b, beta, alpha = bound.arguments.values()
        if not all(isinstance(t, TensorProxy) for t in (bias, a, b)) or (a.ndim, b.ndim) != ranks \
                or isinstance(beta, (NumberProxy, TensorProxy)) or isinstance(alpha, (NumberProxy, TensorProxy)) \
                or beta == 0 or not bias.dtype == a.dtype == b.dtype \
                or not (a.dtype.is_floating_point or a.dtype.is_complex) and \
                any(isinstance(k, float) for k in (alpha, beta)):
            # beta=0 ignores NaN in the input, mixed dtypes raise, and a float scale of integer
            # operands is ATen's own integer arithmetic: one torch call each, eager's answer
            raise NotImplementedError
        out = apply(Prim.MATMUL, a, b)
        if alpha != 1:
            out = apply(Prim.MUL, out, alpha)
        return apply(Prim.ADD, out, bias if beta == 1 else apply(Prim.MUL, bias, beta))
    rule.__signature__ = signature      # what `accepts` binds a call against
    return rule


for _name, (_names, _ranks) in _ADDED_PRODUCTS.items():
    register(*torch_callables(_name))(_added_product(_names, _ranks))


@register(torch.Tensor.__rmatmul__)
def _rmatmul(a, b):
    return apply(Prim.MATMUL, b, a)


@register(F.cross_entropy)
def _cross_entropy(logits, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if weight is not None or size_average is not None or reduce is not None or label_smoothing \
            or logits.ndim != 2 or target.dtype not in (torch.int64, torch.int32):
        raise NotImplementedError   # probabilities, class weights, smoothing: one torch call
    logp = _log_softmax(logits, 1, dtype=torch.float32 if logits.dtype != torch.float64 else None)
    valid = apply(Prim.NE, target, ignore_index)
    safe = apply(Prim.WHERE, valid, target, 0)
    picked = apply(Prim.SQUEEZE, apply(Prim.GATHER, logp, 1, apply(Prim.UNSQUEEZE, safe, 1)), (1,))
    loss = apply(Prim.WHERE, valid, apply(Prim.NEG, picked), 0.0)
    if reduction == "none":
        return downcast(loss, logits.dtype)
    total = apply(Prim.SUM, loss, (0,), False)
    if reduction == "sum":
        return downcast(total, logits.dtype)
    count = apply(Prim.SUM, apply(Prim.CONVERT, valid, torch.float32), (0,), False)
    return downcast(apply(Prim.DIV, total, count), logits.dtype)


@register(F.embedding)
def _embedding(indices, weight, padding_idx=None, max_norm=None, norm_type=2.0,
               scale_grad_by_freq=False, sparse=False):
    if max_norm is not None or scale_grad_by_freq or sparse:
        raise NotImplementedError   # renormalizes the weight in place; gradients only torch's kernel makes
    flat = apply(Prim.RESHAPE, indices, (-1,))
    rows = apply(Prim.INDEX_SELECT, weight, 0, flat)
    if padding_idx is not None:
        # The padding row gets no gradient from this lookup (it may still get one from another use of
        # a tied weight): its rows are taken from a detached copy, the same values.
        if isinstance(padding_idx, (NumberProxy, TensorProxy)):
            raise NotImplementedError
        row = padding_idx + weight.shape[0] if padding_idx < 0 else padding_idx
        padded = apply(Prim.RESHAPE, apply(Prim.EQ, flat, row), (flat.shape[0], 1))
        rows = apply(Prim.WHERE, padded, call(torch.Tensor.detach, rows), rows)
    return apply(Prim.RESHAPE, rows, tuple(indices.shape) + (weight.shape[-1],))
