"""What generated programs call besides torch: the runtime side of a trace, apart from the tracing
frontend.

A printed stage is a Python module a person can run: it imports `torch`, `operator` and, from here,
`prims` (each prim's torch lowering), `fjit_ops` (fjit's own runtime functions: functionalization's
out-of-place writes, generators, hooks, layout fixes, the channels-last and GEMM forms of pools,
batch norm and matmuls, and the ATen backward calls they and convolutions are differentiated by),
its kernels by name, and `trace_constants` (the objects it refers to that have no
literal: a dataclass to rebuild, a user object bound as a constant).  Kernels and constants are
registered here while something that runs them lives, and are resolved by name when the printed
source is executed in a fresh namespace.  The compiled program itself binds them directly (no
lookup on the hot path).
"""
from __future__ import annotations

import types
import weakref

import torch
import torch.nn.functional as F

from fjit.core.trace import trace_constants  # noqa: F401  (imported by printed traces)
from fjit.core.prims import NAMESPACE as prims
from fjit.core.meta import same_layout


def _apply_chain(value, chain):
    for func, args, kwargs, pos, index in chain:
        value = func(*args[:pos], value, *args[pos:], **kwargs)
        if index is not None:
            value = value[index]
    return value


def view_scatter(base, value, chain):
    """`base` with `value` written into the view of it that `chain` describes (out-of-place)."""
    out = base.clone()
    _apply_chain(out, chain).copy_(value)
    return out


def setitem(x, index, value):
    """Out-of-place `x[index] = value`."""
    out = x.clone()
    out[index] = value
    return out


def unversioned(t):
    """t's data under a version counter of its own (`Tensor.data`): what torch autograd saves of it
    is not invalidated by a later in-place write to t.  Batch norm's running statistics go to
    ATen's functional batch norm this way: its backward saves them (and never reads them in
    training), and the module's buffers are written after the call."""
    return t.data


def functional_inplace(op, x, *args, **kwargs):
    """Out-of-place version of any in-place op: apply it to a copy."""
    out = x.clone()
    op(out, *args, **kwargs)
    return out


_REAL_GENERATOR = torch._C.Generator


def generator(device, seed=None, state=None):
    """What a program runs for a generator its function creates: a fresh one, seeded as it was."""
    g = _REAL_GENERATOR(device=device)
    if state is not None:
        g.set_state(state)
    else:
        g.manual_seed(seed)
    return g


def register_hook(t, hook):
    """A gradient hook the function registers on a value it computes: registered on that value
    on every call, as eager registers it, to run in the backward with eager's gradient."""
    t.register_hook(hook)


def retain_grad(t):
    t.retain_grad()


class _MaxPool2dViaChannelsLast(torch.autograd.Function):
    """F.max_pool2d of a contiguous NCHW CPU tensor, computed on a channels-last copy: ATen's
    channels-last CPU kernel is vectorized over channels and its NCHW one is not (ResNet's stem pool,
    [8, 64, 32, 32]: 2.06 ms, against 0.94 ms with both copies).  Same values and indices (ties and
    NaNs included: both kernels scan a window in the same order), and eager's NCHW backward, itself
    differentiable (a double backward works)."""

    @staticmethod
    def forward(ctx, x, kernel_size, stride, padding, dilation, ceil_mode):
        out, indices = max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)
        ctx.save_for_backward(x, indices)
        ctx.pool = (kernel_size, stride, padding, dilation, ceil_mode)
        return out

    @staticmethod
    def backward(ctx, g):
        x, indices = ctx.saved_tensors
        grad = torch.ops.aten.max_pool2d_with_indices_backward(g.contiguous(), x, *ctx.pool, indices)
        return grad, None, None, None, None, None


def max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode):
    """F.max_pool2d's output and the NCHW indices of its maxima (what its backward reads) for a
    contiguous NCHW x, both contiguous, computed on a channels-last copy.  The compiled joint
    program's forward runs this in place of max_pool2d; the C executor runs its own kernel in its
    place where that takes the tensors (executors/c/max_pool.py)."""
    out, indices = torch.ops.aten.max_pool2d_with_indices(
        x.contiguous(memory_format=torch.channels_last), kernel_size, stride, padding, dilation,
        ceil_mode)
    return out.contiguous(), indices.contiguous()


def avg_pool2d_vjp(g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
                   mask, layouts):
    """The cotangent of an average pool's input, by ATen's avg_pool2d_backward (what eager's node
    calls)."""
    return laid_out((torch.ops.aten.avg_pool2d_backward(
        g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override),), layouts)


def max_pool2d_vjp(g, x, indices, kernel_size, stride, padding, dilation, ceil_mode, mask, layouts):
    """The cotangent of a max pool's input, by ATen's max_pool2d_with_indices_backward on the
    indices the forward returned (what eager's node calls)."""
    return laid_out((torch.ops.aten.max_pool2d_with_indices_backward(
        g, x, kernel_size, stride, padding, dilation, ceil_mode, indices),), layouts)


class _BatchNormChannelsLast(torch.autograd.Function):
    """A training batch norm of a channels-last CPU tensor (the channels-last form of a program,
    program_choice.py), with its sums added as eager's NCHW kernel adds them.  ATen's channels-last
    kernels add the N*H*W values of each channel one after another, where its NCHW kernels and
    torch.sum add them in blocks: on [8, 32, 64, 64] values of mean 5 the output erred 1.8e-6 (RMS,
    relative to float64) against 7.5e-8, and MobileNetV3-Large's and Res2Net's gradients failed
    the zoo's accuracy rule (eager's own, single-threaded, pass it).  Here every sum is torch.sum's
    in float64,
    the output ATen's inference kernel on those statistics, the gradients batch norm's formula on
    them (ATen's backward on them still added its own sums in sequence: a convolution bias before a
    batch norm erred 27x; torch.var_mean is accurate too, but 10x slower on this layout; fjit's own
    kernels were faster than ATen's, but compiled about eight per shape).
    The sums accumulate in float64: on one thread torch.sum over this layout adds in sequence too,
    and a MobileNetV3-Small trained one-threaded in this form got its first blocks' gradients
    2000x eager's error from float64 at step 3 (a ReLU after a batch norm flips where the
    statistics round differently), 1.5x with these sums.
    A backward differentiated again (create_graph) is batch norm's own, on the NCHW layout."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        dims, n = (0, 2, 3), x.numel() // x.shape[1]
        mean = (x.sum(dims, dtype=torch.float64) / n).to(x.dtype)
        var = ((x - mean[:, None, None]).square_().sum(dims, dtype=torch.float64) / n).to(x.dtype)
        invstd = torch.rsqrt(var + eps)
        out = torch.ops.aten._native_batch_norm_legit_no_training(x, weight, bias, mean, var, 0.0, eps)[0]
        ctx.save_for_backward(x, weight, bias, mean, invstd)
        ctx.eps = eps
        ctx.mark_non_differentiable(mean, var)
        return out, mean, var

    @staticmethod
    def backward(ctx, g, _mean, _var):
        x, weight, bias, mean, invstd = ctx.saved_tensors
        if torch.is_grad_enabled():
            # a backward to be differentiated again: batch norm's own, on the saved inputs
            # themselves, so its result is a function of them (through the statistics too)
            inputs = (x, weight, bias)
            out = F.batch_norm(x.contiguous(), None, None, weight, bias, True, 0.0, ctx.eps)
            wanted = [t for t, need in zip(inputs, ctx.needs_input_grad) if need]
            grads = iter(torch.autograd.grad(out, wanted, g, create_graph=True))
            return (*(next(grads) if need else None for need in ctx.needs_input_grad[:3]), None)
        # sum(g) and sum(g (x - mean)) by torch.sum, and the input's gradient from them:
        # (g - mean(g) - (x - mean) invstd^2 mean(g (x - mean))) invstd w
        dims, n, need = (0, 2, 3), x.numel() // x.shape[1], ctx.needs_input_grad
        g = g.contiguous(memory_format=torch.channels_last)
        centred = x - mean[:, None, None]
        gb = g.sum(dims, dtype=torch.float64).to(g.dtype)
        dot = (centred * g).sum(dims, dtype=torch.float64).to(g.dtype)
        gx = None
        if need[0]:
            scale = invstd if weight is None else invstd * weight
            gx = torch.addcmul(g - (gb / n)[:, None, None], centred, (-dot * invstd * invstd / n)[:, None, None])
            gx = gx.mul_(scale[:, None, None])
        return gx, dot * invstd if need[1] else None, gb if need[2] else None, None


def laid_out(grads, layouts):
    """Each cotangent in the layout the backward trace records for it (its operand's, where that
    is dense: a channels-last activation's, attention's transposed q), copied where ATen's
    backward gave another; None where none is wanted (the flash backward returns all three)."""
    return tuple(None if r is None or strides is None else r if same_layout(tuple(r.shape), r.stride(), strides) else
                 torch.empty_strided(r.shape, strides, dtype=r.dtype).copy_(r)
                 for r, strides in zip(grads, layouts))


def batch_norm_vjp(g, x, weight, mean, invstd, eps, mask, layouts):
    """The cotangents of a training batch norm's input, weight and bias, by ATen's
    native_batch_norm_backward on the batch statistics the forward returned (what eager's node
    calls; the running statistics are not read in training).  The C executor runs its own kernel
    in its place where that takes the tensors (executors/c/batch_norm.py)."""
    return laid_out(torch.ops.aten.native_batch_norm_backward.default(
        g, x, weight, None, None, mean, invstd, True, eps, mask), layouts)


def batch_norm_channels_last(x, weight, bias, eps):
    """(output, batch mean, biased batch variance) of a training batch norm of a channels-last x
    ([N, C, H, W]), by _BatchNormChannelsLast; the running statistics are the caller's to blend."""
    if x.device.type == "meta":          # the recorder's shape run
        return torch.empty_like(x), x.new_empty(x.shape[1]), x.new_empty(x.shape[1])
    return _BatchNormChannelsLast.apply(x, weight, bias, eps)


def restride(x, strides):
    """x copied into `strides`: a prim run as a torch call whose recorded layout is its op's, not
    the one torch's own rule gives it (passes/layouts.py conform_prim_layouts)."""
    return torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device).copy_(x)


# reinterpret(x, shape, strides, offset): the view of x's memory with `shape` and `strides`,
# `offset` elements past x's start.  What a program autograd does not record runs for a view, or a
# chain of views, of x (passes/layouts.py reinterpret_views): torch's own (inductor's) as_strided
# without the dispatcher, 0.6 us where a slice costs 2.3 and an expand 3.1.  The result is not a
# view to autograd and does not share x's version counter.
try:
    from torch._C._dynamo.guards import _reinterpret_tensor as reinterpret
except ImportError:      # pragma: no cover -- a torch without it
    def reinterpret(x, shape, strides, offset):
        return x.as_strided(shape, strides, x.storage_offset() + offset)


def max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    """What a program runs for F.max_pool2d where decompositions/nn_ops.py chose the channels-last
    route."""
    return _MaxPool2dViaChannelsLast.apply(x, kernel_size, stride, padding, dilation, ceil_mode)


# A product of rows by a weight as oneDNN's 1x1 convolution (passes/gemms.py choose_gemms, which
# times it against torch's matmul for each shape): `rows` [M, K] contiguous is an image of M pixels
# of K channels in channels-last order, and the weight [N, K] a 1x1 filter bank; the output,
# channels-last again, is the [M, N] product in row-major order.  Where torch's CPU GEMM is MKL's
# and the CPU is not Intel's, oneDNN's kernels measured 0.45-0.7x its time at the sizes of real
# layers.  Same products, another summation order: results agree to rounding.

def linear_as_conv(x, weight, bias=None):
    """F.linear(x, weight, bias) for a [..., K] x whose rows are contiguous; differentiable (torch
    autograd's convolution backward is oneDNN's too)."""
    k, n = x.shape[-1], weight.shape[0]
    y = torch.conv2d(x.reshape(1, -1, 1, k).permute(0, 3, 1, 2), weight.reshape(n, k, 1, 1), bias)
    return y.permute(0, 2, 3, 1).reshape(*x.shape[:-1], n)


def matmul_as_conv(a, b):
    """a @ b for a [..., K] with contiguous rows and a 2-D b (a weight used transposed is a view of
    the filter bank; a row-major b is copied into one, its size against the product's)."""
    return linear_as_conv(a, b.t())


def matmul_as_input_grad(a, b):
    """a @ b for a [..., K] with contiguous rows and a row-major b [K, N]: a linear layer's input
    gradient `g @ w`, as oneDNN's data gradient of the 1x1 convolution whose filter bank is b
    (K out of N channels), with no copy of b (matmul_as_conv's form transposes it into one: 0.5x
    MKL's time where that copy made it a tie).  Not differentiable: what the joint backward runs."""
    k, n = b.shape
    g = a.reshape(-1, k)
    m = g.shape[0]
    # only the input's shape and layout are read: channels-last, so the gradient comes back in
    # the product's row-major order
    like = torch.empty_strided((1, n, m, 1), (m * n, 1, n, n), dtype=b.dtype, device=b.device)
    grads = torch.ops.aten.convolution_backward(
        g.reshape(1, m, 1, k).permute(0, 3, 1, 2), like, b.reshape(k, n, 1, 1), None, [1, 1], [0, 0],
        [1, 1], False, [0, 0], 1, [True, False, False])
    return grads[0].permute(0, 2, 3, 1).reshape(*a.shape[:-1], n)


def matmul_as_weight_grad(a, b):
    """a @ b for a = g.t() (g [M, N] contiguous) and b [M, K] contiguous: a linear layer's weight
    gradient, as oneDNN's weight gradient of the 1x1 convolution (the sum over the M rows is the
    sum over its pixels).  Not differentiable: what the joint backward runs."""
    g = a.t()
    m, n, k = g.shape[0], g.shape[1], b.shape[1]
    grads = torch.ops.aten.convolution_backward(
        g.reshape(1, m, 1, n).permute(0, 3, 1, 2), b.reshape(1, m, 1, k).permute(0, 3, 1, 2),
        b.new_empty((n, k, 1, 1)), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1, [False, True, False])
    return grads[1].reshape(n, k)


def convolution_vjp(g, x, w, bias_sizes, stride, padding, dilation, groups, mask, layouts):
    """The cotangents of a convolution's input, weight and bias, by ATen's convolution_backward
    (what eager's autograd node calls)."""
    return laid_out(torch.ops.aten.convolution_backward.default(
        g, x, w, bias_sizes, stride, padding, dilation, False, [0] * len(stride), groups, mask),
        layouts)


def convolution_vjp_by_gemm(g, x, w, bias_sizes, stride, padding, dilation, groups, mask, layouts):
    """convolution_vjp of a 2-D convolution (one group) with the weight's cotangent as one GEMM:
    the output cotangent's rows [O, N*OH*OW] by the input's patches [N*OH*OW, C*kh*kw] (F.unfold;
    for a 1x1 filter without padding, the strided positions themselves), and for such a 1x1 filter
    the input's cotangent too (the rows by the filter bank, placed at the strided positions).  The
    input's cotangent of a larger filter is ATen's.  passes/gemms.py choose_gemms times this
    against convolution_vjp per shape: oneDNN's weight gradient over a 2x2 output (a CNN's last
    stage on small images) measured 4x these GEMMs' time.  Same products, summed in another order:
    results agree to rounding."""
    n, c = x.shape[:2]
    o, _, kh, kw = w.shape
    rows = g.transpose(0, 1).reshape(o, -1)                      # [O, N*OH*OW]
    pointwise = (kh, kw) == (1, 1) and list(padding) == [0, 0]
    if pointwise:
        picked = x[:, :, ::stride[0], ::stride[1]]
        patches = picked.permute(0, 2, 3, 1).reshape(-1, c)
        dx = None
        if mask[0]:
            dx = x.new_zeros(x.shape)
            d = torch.mm(g.permute(0, 2, 3, 1).reshape(-1, o), w.reshape(o, c))
            dx[:, :, ::stride[0], ::stride[1]] = d.view(n, *picked.shape[2:], c).permute(0, 3, 1, 2)
        db = g.sum((0, 2, 3)) if mask[2] else None
    else:
        patches = F.unfold(x, (kh, kw), dilation, padding, stride).transpose(1, 2).reshape(-1, c * kh * kw)
        dx, _, db = convolution_vjp(g, x, w, bias_sizes, stride, padding, dilation, groups,
                                    [mask[0], False, mask[2]], layouts) if mask[0] or mask[2] else (None,) * 3
    dw = torch.mm(rows, patches).view(w.shape) if mask[1] else None
    return laid_out((dx, dw, db), layouts)


fjit_ops = types.SimpleNamespace(view_scatter=view_scatter, setitem=setitem, unversioned=unversioned,
                                 functional_inplace=functional_inplace, generator=generator,
                                 register_hook=register_hook, retain_grad=retain_grad,
                                 max_pool2d=max_pool2d, max_pool2d_with_indices=max_pool2d_with_indices,
                                 restride=restride,
                                 batch_norm_channels_last=batch_norm_channels_last,
                                 reinterpret=reinterpret, linear_as_conv=linear_as_conv,
                                 matmul_as_conv=matmul_as_conv, matmul_as_input_grad=matmul_as_input_grad,
                                 matmul_as_weight_grad=matmul_as_weight_grad,
                                 convolution_vjp_by_gemm=convolution_vjp_by_gemm)

# The names printed traces refer to besides torch and operator (a trace's namespace when traced).
TRACE_NAMESPACE = {"prims": prims, "fjit_ops": fjit_ops}


# -- kernels and constants, by name --------------------------------------------------------------

_KERNELS: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()


def register_kernel(name: str, launch) -> None:
    """Make kernel `name` importable from here while `launch` (what runs it) lives."""
    _KERNELS[name] = launch


def __getattr__(name: str):
    """`from fjit.runtime import fjit_c_<hash>`: a kernel some live program runs."""
    launch = _KERNELS.get(name)
    if launch is not None:
        return launch
    raise AttributeError(f"module 'fjit.runtime' has no attribute {name!r}")
