"""Ops that write into some of their arguments as a side output: batch norm's (and instance norm's)
running statistics.

`F.batch_norm(x, running_mean, running_var, training=True)` normalizes `x` with the batch's
statistics *and* updates `running_mean`/`running_var` in place, inside one ATen kernel.  Traced as
one opaque torch call, that write would happen at run time on whatever tensors the program was
given, unseen by the trace: a silent mutation of an input, and a program whose passes believe the
statistics unchanged.  So the op is traced as functionalization writes it: ATen's functional
batch norm (`_native_batch_norm_legit_functional`: eager's kernel, one pass giving the output and
the new statistics as values; where the statistics' dtype differs from the input's, the pure op
and the statistics as ordinary traced ops).  The dispatcher then writes the new statistics into the
argument handles like any in-place op: functionalized on values the function created or was
allowed to update (an `fjit.jit(module)`'s buffers, written back after the call by
fjit/module.py), FJ102 on an input.

The update is eager's:
    running_mean = momentum * mean + (1 - momentum) * running_mean
    running_var  = momentum * var_unbiased + (1 - momentum) * running_var
over every dimension but the channel dimension (1), and it is not part of autograd's graph.
"""
from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from fjit.core.ir import Symbol
from fjit.core.meta import suggests_channels_last
from fjit.frontend.context import current
from fjit.frontend.proxies import NumberProxy, TensorProxy
from fjit.frontend.record import trace_call
from fjit.runtime import batch_norm_channels_last, unversioned

UNVERSIONED = Symbol("fjit_ops.unversioned", unversioned, frozenset())
BATCH_NORM_CHANNELS_LAST = Symbol("fjit_ops.batch_norm_channels_last", batch_norm_channels_last, frozenset())


def _batch_norm_parts(dispatch, x, running_mean, running_var, weight, bias, training, momentum,
                      eps):
    """(pure output, [(statistic handle, its new value)]), or None when nothing is written."""
    stats = [s for s in (running_mean, running_var) if s is not None]
    if training and _channels_last_form(x, stats, momentum):
        # the channels-last form made x so: eager's NCHW accuracy, not ATen's channels-last kernel's
        out, mean, var = trace_call(current(), BATCH_NORM_CHANNELS_LAST, batch_norm_channels_last,
                                    (x, weight, bias, float(eps)), {})
        n = x.shape[0] * x.shape[2] * x.shape[3]
        unbiased = dispatch(torch.mul, (var, n / (n - 1)), {})
        return out, _stat_writes(dispatch, (running_mean, mean), (running_var, unbiased), momentum=momentum)
    if training and not stats:
        return _batch_statistics_only(dispatch, x, weight, bias, eps)
    if not training:
        return None
    if not all(isinstance(t, TensorProxy) for t in (x, *stats)) or \
            isinstance(momentum, (NumberProxy, TensorProxy)) or momentum is None:
        return None   # a captured tensor (FJ101) or a momentum fjit cannot read: the normal path
    if running_mean is not None and running_var is not None and x.dtype.is_floating_point and (
            x.dtype == running_mean.dtype == running_var.dtype or _mixed_types(x, weight, bias, *stats)):
        # ATen's functional batch norm: eager's kernel, which normalizes and computes the new
        # running statistics in one pass (what functionalization turns eager's op into; for a
        # bfloat16/float16 x with float32 parameters and statistics, autocast's convolution output,
        # its mixed-type kernel, which keeps the statistics in float32 as eager's does).  Torch
        # autograd saves the statistics it is given and the buffers are written after the call:
        # it gets them under version counters of their own (fjit_ops.unversioned, no copy).
        running = [trace_call(current(), UNVERSIONED, unversioned, (s,), {})
                  for s in (running_mean, running_var)]
        out, _, _, mean, var = dispatch(torch.ops.aten._native_batch_norm_legit_functional.default,
                                        (x, weight, bias, *running, True, float(momentum),
                                         float(eps)), {})
        return out, [(running_mean, mean), (running_var, var)]
    out = dispatch(F.batch_norm, (x, None, None, weight, bias), {"training": True, "eps": eps})
    detached = dispatch(torch.Tensor.detach, (x,), {})
    if stats and stats[0].dtype.itemsize > x.dtype.itemsize and x.dtype.is_floating_point:
        # a bfloat16/float16 x (autocast's convolution output) with float32 statistics: eager's
        # kernel computes the batch's mean and variance in float32, and rounded to x's dtype
        # first, the running statistics drifted (DenseNet-121 under bf16 autocast: 8x eager's
        # error after 3 steps)
        detached = dispatch(torch.Tensor.to, (detached, stats[0].dtype), {})
    dims = [0, *range(2, len(x.shape))]
    var, mean = dispatch(torch.var_mean, (detached, dims), {"correction": 1})
    return out, _stat_writes(dispatch, (running_mean, mean), (running_var, var), momentum=momentum)


def _mixed_types(x, *params) -> bool:
    """A CPU bfloat16/float16 `x` whose batch norm parameters and statistics (None or not) are all
    float32: ATen's CPU batch norm kernels take that mix (autocast's convolution outputs)."""
    return x.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cpu" and all(
        p is None or isinstance(p, TensorProxy) and p.dtype == torch.float32 for p in params)


def _batch_statistics_only(dispatch, x, weight, bias, eps):
    """A training batch norm that keeps no running statistics (a weight standardization: timm's
    ScaledStdConv2d normalizes its filter bank this way on every call; a BatchNorm of
    track_running_stats=False) as ATen's functional batch norm over running statistics of its own
    that nothing reads (and a bias of zeros for a weight alone, or the reverse): eager's kernel and
    eager's backward (runtime.batch_norm_vjp), which the C kernels take, where the torch call was
    an op torch autograd had to record inside a joint program (NF-ResNet-26: 29 of them kept its
    step on torch autograd).  None (the torch call) for another dtype or a traced eps."""
    if not (isinstance(x, TensorProxy) and x.dtype in (torch.float32, torch.float64) and x.ndim >= 2
            and all(t is None or isinstance(t, TensorProxy) and t.dtype == x.dtype for t in (weight, bias))
            and type(eps) in (float, int)):
        return None
    zeros, ones = (dispatch(fill, ((x.shape[1],),), {"dtype": x.dtype, "device": x.device})
                   for fill in (torch.zeros, torch.ones))
    if (weight is None) != (bias is None):     # ATen's own defaults, so that the kernels take it
        weight, bias = (ones if weight is None else weight), (zeros if bias is None else bias)
    out = dispatch(torch.ops.aten._native_batch_norm_legit_functional.default,
                   (x, weight, bias, zeros, ones, True, 0.0, float(eps)), {})[0]
    return out, []


# The fewest values per channel (N*H*W) a channels-last batch norm must have to run as
# runtime.batch_norm_channels_last: ATen's channels-last kernel adds them one after another, and its
# error against float64 grows with their number (2x its NCHW kernel's at 128, 5x at 2048, 13x at
# 8192), where the accurate form takes about eager's NCHW time, 1.5-1.8x the channels-last kernel's.
CHANNELS_LAST_ROWS = 256


def _channels_last_form(x, stats: list, momentum) -> bool:
    """Whether a training batch norm of `x` is one the channels-last form of a program relaid: a
    4-D CPU float32/float64 value laid out channels-last there, with CHANNELS_LAST_ROWS values per
    channel or more, its statistics (both or none) of its dtype."""
    return current().channels_last_convs and isinstance(x, TensorProxy) and x.ir.ndim == 4 \
        and x.ir.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.shape[1] > 1 \
        and x.shape[0] * x.shape[2] * x.shape[3] >= CHANNELS_LAST_ROWS and suggests_channels_last(x.ir) \
        and len(stats) in (0, 2) \
        and all(isinstance(s, TensorProxy) and s.dtype == x.dtype for s in stats) \
        and not isinstance(momentum, (NumberProxy, TensorProxy)) and (momentum is not None or not stats)


def _instance_norm_parts(dispatch, x, running_mean, running_var, weight, bias, use_input_stats,
                         momentum, eps):
    """F.instance_norm with use_input_stats and running statistics: ATen runs batch norm on one
    copy of the statistics per instance and averages the copies over the batch, so the update
    blends in the batch mean of the per-instance (unbiased) statistics."""
    stats = [s for s in (running_mean, running_var) if s is not None]
    if not use_input_stats or not stats:
        return None
    if not all(isinstance(t, TensorProxy) for t in (x, *stats)) or \
            isinstance(momentum, (NumberProxy, TensorProxy)) or momentum is None:
        return None
    out = dispatch(F.instance_norm, (x, None, None, weight, bias),
                   {"use_input_stats": True, "eps": eps})
    detached = dispatch(torch.Tensor.detach, (x,), {})
    var, mean = dispatch(torch.var_mean, (detached, list(range(2, len(x.shape)))), {"correction": 1})
    var, mean = (dispatch(torch.mean, (v, 0), {}) for v in (var, mean))
    return out, _stat_writes(dispatch, (running_mean, mean), (running_var, var), momentum=momentum)


def _stat_writes(dispatch, *pairs, momentum):
    """(running statistic, its blended new value) for each statistic the layer keeps."""
    return [(running, _blend(dispatch, running, batch, momentum)) for running, batch in pairs
            if running is not None]


def _blend(dispatch, old, new, momentum):
    """momentum * new + (1 - momentum) * old"""
    kept = dispatch(torch.mul, (old, 1.0 - momentum), {})
    return dispatch(torch.add, (dispatch(torch.mul, (new, momentum), {}), kept), {})


def _functional_instance_norm(dispatch, args, kwargs):
    bound = _F_INSTANCE_NORM.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    return _instance_norm_parts(dispatch, values.pop("input"), **values)


def _functional_batch_norm(dispatch, args, kwargs):
    bound = _F_BATCH_NORM.bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    return _batch_norm_parts(dispatch, values.pop("input"), **values)


def _torch_batch_norm(dispatch, args, kwargs):
    names = ("x", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
             "cudnn_enabled")
    values = dict(zip(names, args), **kwargs)
    if set(values) != set(names):
        return None
    values.pop("cudnn_enabled")
    return _batch_norm_parts(dispatch, **values)


_F_BATCH_NORM = inspect.signature(F.batch_norm)
_F_INSTANCE_NORM = inspect.signature(F.instance_norm)

# torch callable -> rewrite(dispatch, args, kwargs) -> (result, [(target handle, new value)]) or
# None (the call writes nothing: trace it as usual).
WRITES_INTO_ARGUMENTS = {
    F.batch_norm: _functional_batch_norm,
    torch.batch_norm: _torch_batch_norm,
    F.instance_norm: _functional_instance_norm,
}
