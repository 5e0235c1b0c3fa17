"""ATen overloads as the torch-level calls fjit decomposes.

AOTAutograd hands over graphs of `torch.ops.aten.*` overloads.  fjit's dispatcher sees those calls
(an OpOverload call on a proxy reaches `__torch_function__`), but it has decompositions for torch's
Python-level API (`torch.add`, `torch.Tensor.view`, `F.gelu`, ...), not for aten overloads, so an
aten call would stay one opaque torch fallback and nothing would fuse.  Before an AOT graph is
traced, `to_torch_level` replaces each overload that has a row here by the torch-level function of
the same semantics; overloads without a row stay opaque calls of the overload itself (correct, just
not fused).  A prim's overloads are named in its block (fjit/core/prims/); a composite op's
overload is a row here.
"""
from __future__ import annotations

import torch
import torch.fx
import torch.nn.functional as F
from torch._decomp import get_decompositions

from fjit.core.prims import aten_overloads

aten = torch.ops.aten


def _rsub(x, other, alpha=1):                 # other - alpha * x
    return torch.Tensor.__rsub__(x if alpha == 1 else torch.mul(x, alpha), other)


def _sum(x, dim=None, keepdim=False, dtype=None):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        out = torch.sum(x, dtype=dtype)       # aten sums every dim for dim=[] or None
        return out.reshape([1] * x.dim()) if keepdim else out
    return torch.sum(x, dim, keepdim, dtype=dtype)


def _mean(x, dim=None, keepdim=False, dtype=None):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        out = torch.mean(x, dtype=dtype)
        return out.reshape([1] * x.dim()) if keepdim else out
    return torch.mean(x, dim, keepdim, dtype=dtype)


def _amax(x, dim=(), keepdim=False):
    return torch.amax(x, dim, keepdim) if len(dim) else torch.amax(x, tuple(range(x.dim())), keepdim)


def _amin(x, dim=(), keepdim=False):
    return torch.amin(x, dim, keepdim) if len(dim) else torch.amin(x, tuple(range(x.dim())), keepdim)


def _var(x, dim=None, *, correction=None, keepdim=False):
    return torch.var(x, dim, correction=1 if correction is None else correction, keepdim=keepdim)


def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    return _var(x, dim, correction=correction, keepdim=keepdim), torch.mean(
        x, dim if dim is not None else tuple(range(x.dim())), keepdim)


def _view(x, size):
    return torch.Tensor.view(x, size)


def _reshape(x, size):
    return torch.Tensor.reshape(x, size)


def _expand(x, size, *, implicit=False):
    return torch.Tensor.expand(x, size)


def _clone(x, *, memory_format=None):
    return torch.clone(x) if memory_format in (None, torch.preserve_format) else \
        torch.clone(x, memory_format=memory_format)


def _squeeze(x, dim=None):
    if dim is None:
        return torch.squeeze(x)
    if isinstance(dim, (list, tuple)):
        for d in sorted((d % max(x.dim(), 1) for d in dim), reverse=True):
            x = torch.squeeze(x, d)
        return x
    return torch.squeeze(x, dim)


def _slice(x, dim=0, start=None, end=None, step=1):
    dim = dim % max(x.dim(), 1)
    return x[(slice(None),) * dim + (slice(start, end, step),)]


def _split(x, split_size, dim=0):
    return torch.split(x, split_size, dim)


def _softmax(x, dim, half_to_float):
    return torch.softmax(x, dim, dtype=torch.float32) if half_to_float else torch.softmax(x, dim)


def _log_softmax(x, dim, half_to_float):
    return torch.log_softmax(x, dim, dtype=torch.float32) if half_to_float else \
        torch.log_softmax(x, dim)


def _gelu(x, *, approximate="none"):
    return F.gelu(x, approximate=approximate)


def _factory(fn):
    def make(size, *args, dtype=None, layout=None, device=None, pin_memory=None, **kwargs):
        return fn(size, *args, dtype=dtype, device=device, **kwargs)
    make.__name__ = f"aten_{fn.__name__}"
    return make


def _scalar_tensor(value, *, dtype=None, layout=None, device=None, pin_memory=None):
    return torch.full((), value, dtype=dtype if dtype is not None else torch.get_default_dtype(),
                      device=device)


def _masked_fill(x, mask, value):
    if isinstance(value, (int, float, bool)) and not isinstance(value, torch.Tensor) and (
            x.dtype.is_floating_point or not isinstance(value, float)):
        return torch.where(mask, torch.full((), value, dtype=x.dtype, device=x.device), x)
    return aten.masked_fill.Scalar(x, mask, value) if not isinstance(value, torch.Tensor) else \
        aten.masked_fill.Tensor(x, mask, value)


def _to_copy(x, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
             memory_format=None):
    if layout is None and memory_format is None and not pin_memory and \
            (device is None or torch.device(device) == x.device):
        return torch.Tensor.to(x, dtype if dtype is not None else x.dtype, copy=True)
    return aten._to_copy.default(x, dtype=dtype, layout=layout, device=device,
                                 pin_memory=pin_memory, non_blocking=non_blocking,
                                 memory_format=memory_format)


def _addmm(bias, a, b, *, beta=1, alpha=1):
    if beta == 1 and alpha == 1:
        return torch.add(torch.mm(a, b), bias)
    return torch.addmm(bias, a, b, beta=beta, alpha=alpha)


def _embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    return F.embedding(indices, weight)


def _detach(x):
    return torch.Tensor.detach(x)


def _where(cond, x, y):
    return torch.where(cond, x, y)


# Overloads of the prims, from the prim blocks (fjit/core/prims/): "<op>.<overload>" is
# torch.<op>, or the adapter here where the signatures differ.
_PRIM_ADAPTERS = {
    "rsub.Scalar": _rsub, "rsub.Tensor": _rsub, "sum.dim_IntList": _sum, "sum.default": _sum,
    "amax.default": _amax, "amin.default": _amin, "view.default": _view,
    "_unsafe_view.default": _reshape, "reshape.default": _reshape, "expand.default": _expand,
    "clone.default": _clone, "squeeze.default": _squeeze, "squeeze.dim": _squeeze,
    "squeeze.dims": _squeeze, "slice.Tensor": _slice, "full.default": _factory(torch.full),
    "_to_copy.default": _to_copy, "where.self": _where,
}


def _overload(name: str):
    op, overload = name.split(".")
    return getattr(getattr(aten, op), overload)


ATEN_TO_TORCH: dict = {_overload(n): _PRIM_ADAPTERS.get(n) or getattr(torch, n.split(".")[0])
                       for n in aten_overloads()}
ATEN_TO_TORCH.update({   # overloads of composite ops: torch functions of the same signature
    aten.clamp.default: torch.clamp, aten.clamp.Tensor: torch.clamp,
    aten.stack.default: torch.stack, aten.t.default: torch.t,
    aten.transpose.int: torch.transpose, aten.select.int: torch.select,
    aten.narrow.default: torch.narrow, aten.split_with_sizes.default: torch.split,
    aten.unbind.int: torch.unbind, aten.any.dim: torch.any, aten.all.dim: torch.all,
    aten.silu.default: F.silu, aten.tril.default: torch.tril, aten.triu.default: torch.triu,
    aten.lift_fresh_copy.default: torch.clone, aten.alias.default: _detach,
})
ATEN_TO_TORCH.update({   # and those with an adapter
    aten.mean.dim: _mean, aten.mean.default: _mean,
    aten.var.correction: _var, aten.var_mean.correction: _var_mean,
    aten.split.Tensor: _split,
    aten._softmax.default: _softmax, aten._log_softmax.default: _log_softmax,
    aten.gelu.default: _gelu,
    aten.ones.default: _factory(torch.ones),
    aten.zeros.default: _factory(torch.zeros), aten.scalar_tensor.default: _scalar_tensor,
    aten.masked_fill.Scalar: _masked_fill, aten.masked_fill.Tensor: _masked_fill,
    aten.addmm.default: _addmm, aten.embedding.default: _embedding, aten.detach.default: _detach,
})


def decompositions() -> dict:
    """The decompositions AOTAutograd applies for fjit: backward formulas and norms become the
    pointwise and reduction aten ops the table above maps, so they fuse; matmul and convolution
    stay whole.  addmm is not decomposed (torch's decomposition multiplies by alpha and beta even
    when they are 1): its row above makes it mm + add."""
    return get_decompositions([
        aten.gelu_backward, aten.tanh_backward, aten.sigmoid_backward, aten.threshold_backward,
        aten.silu_backward, aten._softmax_backward_data, aten._log_softmax_backward_data,
        aten.native_layer_norm, aten.native_layer_norm_backward,
        aten._native_batch_norm_legit_functional, aten.native_batch_norm_backward])


def to_torch_level(gm: torch.fx.GraphModule) -> int:
    """Replace, in place, the aten overloads of `gm` that have a row in ATEN_TO_TORCH; returns how
    many nodes changed (the caller recompiles when any did)."""
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in ATEN_TO_TORCH:
            node.target = ATEN_TO_TORCH[node.target]
            changed += 1
    return changed
