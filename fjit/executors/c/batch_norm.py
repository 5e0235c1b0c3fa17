"""A training batch norm of a float32 NCHW CPU tensor as two written C kernels, which the C executor
puts in place of ATen's functional batch norm (`aten._native_batch_norm_legit_functional`) and of
its backward (`runtime.batch_norm_vjp`: ATen's native_batch_norm_backward) where a trace's
metadata says the kernels take the tensors: the compiled joint program's forward and backward,
and a training forward run without autograd.

Why a written kernel rather than a generated one: a batch norm reduces an [N, C, H, W] tensor over
N, H and W, keeping the middle dim C, which is neither of the generator's reductions (rows: inner
dims; columns: outer dims).  ATen's kernels cost more than their memory traffic on the small
activations of a CNN's training step: on 2 threads, [8, 208, 4, 4] takes it 36 us forward and
backward, [8, 256, 16, 16] 420 us, against 23 and 115 us here.  Here a thread takes whole
channels, so a channel's N*H*W values come from cache for every pass after the first: the
forward's mean, centred sum of squares (two passes, as ATen computes the variance, not
E[x^2] - mean^2) and output, the running statistics' update, and the backward's two sums and its
input gradient.

The sums are as accurate as ATen's (tests/executors/test_c_batch_norm.py measures both against
float64): values are added in 32 float lanes, folded into double every SUM_BLOCK values, the tail
of a run in double; the statistics, their update and the gradient's coefficients are computed in
double and rounded once.  Until the kernels are built (or where they could not be), ATen's ops run.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import Symbol, Tag, TensorVar
from fjit.core.symbolic import at_hint
from fjit.core.trace import Trace
from fjit.executors.c.accumulators import SUM_BLOCK
from fjit.executors.c.launch import call, empty_strided
from fjit.executors.render import contiguous_strides
from fjit.runtime import batch_norm_vjp, laid_out, register_kernel

_ATEN_FORWARD = torch.ops.aten._native_batch_norm_legit_functional.default
# Fewer elements than this run on one thread: below it a second thread's share of the work is
# smaller than what starting it costs (measured on [8, C, H, W] activations, 2 threads).
PARALLEL_MIN = 1 << 13
# The fewest values a channel's runs must hold (the product of the dims after C) for the kernels
# to take a batch norm.  A thread walks one channel's runs: runs of one value (BatchNorm1d over
# [M, C] rows, LeViT's 52 a step) are a strided walk, forward and backward 3.7x ATen's time at
# [128, 256] and 6.6x at [1568, 128], where ATen's channels-last kernel walks rows.  From runs of 4
# (a 2x2 image) the kernels measured 0.3-0.6x ATen's.
MIN_RUN = 4

_HELPERS = r"""
#include <math.h>
#include <stdint.h>
#define FJ_BLOCK %(block)d
#define FJ_PARALLEL_MIN %(parallel_min)d

/* 16 float lanes as one value (GCC's and clang's vector extension): the sums below keep two of
   them (32 lanes) in registers, where lanes in an array indexed by a run's tail went through the
   stack element by element */
typedef float fj_v16 __attribute__((vector_size(64)));

static inline fj_v16 fj_load(const float *p) {
    fj_v16 v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}

/* the sum of a's and b's lanes, in double, added pairwise, and of the tail's sum t */
static inline double fj_fold(fj_v16 a, fj_v16 b, double t) {
    double d[8];
    for (int l = 0; l < 8; l++) d[l] = ((double)a[l] + (double)a[l + 8]) + ((double)b[l] + (double)b[l + 8]);
    for (int w = 4; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) d[l] += d[l + w];
    return d[0] + t;
}

/* FJ_CHANNEL_SUMS(name, ADD): a function adding, over one channel's N runs of HW values (x's run
   n at x + n * stride, g's likewise), ADD(a, b, v, d, q) into the accumulators a and b (v: x's
   values, d = v - m, q: g's values; 16 lanes at a time, then the tail one by one), 32 float lanes
   each, folded into the double sums before FJ_BLOCK values have gone into them since the last
   fold, and a double for the tail (all of a run shorter than 16) */
#define FJ_CHANNEL_SUMS(name, ADD)                                                                \
static void name(const float *restrict x, const float *restrict g, float m, int64_t N,           \
                 int64_t stride, int64_t HW, double *restrict s1, double *restrict s2) {          \
    const fj_v16 zero = {0};                                                                      \
    fj_v16 a0 = zero, a1 = zero, b0 = zero, b1 = zero;                                            \
    double ta = 0.0, tb = 0.0;                                                                    \
    int64_t held = 0;                                                                             \
    for (int64_t n = 0; n < N; n++) {                                                             \
        const float *restrict p = x + n * stride, *restrict pg = g ? g + n * stride : x;          \
        for (int64_t start = 0; start < HW; start += FJ_BLOCK) {                                  \
            int64_t end = start + FJ_BLOCK < HW ? start + FJ_BLOCK : HW, i = start;               \
            if (held + (end - start) > FJ_BLOCK) {                                                \
                *s1 += fj_fold(a0, a1, ta); *s2 += fj_fold(b0, b1, tb);                           \
                a0 = a1 = b0 = b1 = zero; ta = tb = 0.0; held = 0;                                \
            }                                                                                     \
            for (; i + 32 <= end; i += 32) {                                                      \
                fj_v16 v = fj_load(p + i), d = v - m, q = fj_load(pg + i); (void)d; (void)q;      \
                ADD(a0, b0, v, d, q);                                                             \
                v = fj_load(p + i + 16); d = v - m; q = fj_load(pg + i + 16);                     \
                ADD(a1, b1, v, d, q);                                                             \
            }                                                                                     \
            if (i + 16 <= end) {                                                                  \
                fj_v16 v = fj_load(p + i), d = v - m, q = fj_load(pg + i); (void)d; (void)q;      \
                ADD(a0, b0, v, d, q);                                                             \
                i += 16;                                                                          \
            }                                                                                     \
            for (; i < end; i++) {                                                                \
                float v = p[i], d = v - m, q = pg[i]; (void)d; (void)q;                           \
                ADD(ta, tb, v, d, q);                                                             \
            }                                                                                     \
            held += end - start;                                                                  \
        }                                                                                         \
    }                                                                                             \
    *s1 += fj_fold(a0, a1, ta); *s2 += fj_fold(b0, b1, tb);                                       \
}

#define FJ_ADD_VALUE(a, b, v, d, q) ((a) += (v))
#define FJ_ADD_SQUARE(a, b, v, d, q) ((b) += (d) * (d))
#define FJ_ADD_GRAD(a, b, v, d, q) ((a) += (q), (b) += (d) * (q))
FJ_CHANNEL_SUMS(fj_sum, FJ_ADD_VALUE)
FJ_CHANNEL_SUMS(fj_centred_squares, FJ_ADD_SQUARE)
FJ_CHANNEL_SUMS(fj_grad_sums, FJ_ADD_GRAD)
"""

_FORWARD = r"""
/* x [N, C, HW] -> y, the batch mean and inverse std, the blended running statistics;
   w and b are read where affine is set */
void fjit_batch_norm_forward(const float *restrict x, const float *restrict w, const float *restrict b,
                             const float *restrict rm, const float *restrict rv, float *restrict y,
                             float *restrict mean_out, float *restrict invstd_out, float *restrict rm_out,
                             float *restrict rv_out, int64_t N, int64_t C, int64_t HW, int64_t affine,
                             double momentum, double eps, int64_t nt) {
    const double count = (double)N * (double)HW;
    #pragma omp parallel for num_threads(nt) schedule(static) if (N * C * HW >= FJ_PARALLEL_MIN)
    for (int64_t c = 0; c < C; c++) {
        double s = 0.0, ss = 0.0, unused = 0.0;
        fj_sum(x + c * HW, 0, 0.0f, N, C * HW, HW, &s, &unused);
        double mean = s / count;
        fj_centred_squares(x + c * HW, 0, (float)mean, N, C * HW, HW, &unused, &ss);
        double var = ss / count, invstd = 1.0 / sqrt(var + eps);
        mean_out[c] = (float)mean;
        invstd_out[c] = (float)invstd;
        rm_out[c] = (float)(momentum * mean + (1.0 - momentum) * rm[c]);
        rv_out[c] = (float)(momentum * (ss / (count - 1.0)) + (1.0 - momentum) * rv[c]);
        float scale = affine ? (float)invstd * w[c] : (float)invstd;
        float shift = (affine ? b[c] : 0.0f) - (float)mean * scale;
        for (int64_t n = 0; n < N; n++) {
            const float *p = x + (n * C + c) * HW;
            float *q = y + (n * C + c) * HW;
            for (int64_t i = 0; i < HW; i++) q[i] = p[i] * scale + shift;
        }
    }
}

"""

_BACKWARD = r"""
/* the gradients of x (want & 1), w (want & 2) and b (want & 4) from g and the forward's batch
   statistics; w is read where affine is set */
void fjit_batch_norm_backward(const float *restrict g, const float *restrict x, const float *restrict w,
                              const float *restrict mean, const float *restrict invstd, float *restrict dx,
                              float *restrict dw, float *restrict db, int64_t N, int64_t C, int64_t HW,
                              int64_t affine, int64_t want, int64_t nt) {
    const double count = (double)N * (double)HW;
    #pragma omp parallel for num_threads(nt) schedule(static) if (N * C * HW >= FJ_PARALLEL_MIN)
    for (int64_t c = 0; c < C; c++) {
        double sg = 0.0, dot = 0.0;
        float m = mean[c], r = invstd[c];
        fj_grad_sums(x + c * HW, g + c * HW, m, N, C * HW, HW, &sg, &dot);
        if (want & 2) dw[c] = (float)(dot * r);
        if (want & 4) db[c] = (float)sg;
        if (want & 1) {
            float grad_mean = (float)(sg / count), proj = (float)(dot / count * r * r);
            float scale = affine ? r * w[c] : r;
            for (int64_t n = 0; n < N; n++) {
                const float *pg = g + (n * C + c) * HW, *px = x + (n * C + c) * HW;
                float *q = dx + (n * C + c) * HW;
                for (int64_t i = 0; i < HW; i++) q[i] = (pg[i] - grad_mean - (px[i] - m) * proj) * scale;
            }
        }
    }
}
"""

_FORWARD_ARGS = ["p"] * 10 + ["q"] * 4 + ["d", "d", "q"]
_BACKWARD_ARGS = ["p"] * 8 + ["q"] * 6
_HELPERS = _HELPERS % {"block": SUM_BLOCK, "parallel_min": PARALLEL_MIN}
# name -> (source, argument types): what the C executor builds, naming each binary by its source
KERNELS = {"fjit_batch_norm_forward": (_HELPERS + _FORWARD, _FORWARD_ARGS),
           "fjit_batch_norm_backward": (_HELPERS + _BACKWARD, _BACKWARD_ARGS)}
_FLOAT32 = torch.float32
CLAIMED = (_ATEN_FORWARD, batch_norm_vjp)    # what claim() looks for


class Kernels:
    """The two built (or building) kernels and what a program calls in place of ATen's ops.
    `requeue(kernel)` queues a build again (one lost to fork)."""

    def __init__(self, forward_binary, backward_binary, requeue):
        self.binaries = (forward_binary, backward_binary)
        self.requeue = requeue
        # printed traces import the launchers from fjit.runtime by these names, registered while
        # the symbols (which hold them) live
        self.forward_symbol = Symbol("fjit_c_batch_norm_forward", self.forward, frozenset({Tag.KERNEL}))
        self.backward_symbol = Symbol("fjit_c_batch_norm_backward", self.backward, frozenset({Tag.KERNEL}))
        for symbol in (self.forward_symbol, self.backward_symbol):
            register_kernel(symbol.qualname, symbol.fn)

    def _ready(self, k: int) -> bool:
        binary = self.binaries[k]
        if binary.fn is None and not binary.queued and binary.error is None:
            self.requeue(binary.kernel)
        return binary.fn is not None

    def forward(self, x, weight, bias, running_mean, running_var, training, momentum, eps):
        """What aten._native_batch_norm_legit_functional returns for a training batch norm:
        (output, batch mean, batch inverse std, new running mean, new running variance)."""
        if not self._ready(0) or not x.is_contiguous():
            return _ATEN_FORWARD(x, weight, bias, running_mean, running_var, training, momentum, eps)
        n, c = x.shape[0], x.shape[1]
        out = empty_strided(tuple(x.shape), x.stride(), _FLOAT32)
        stats = [empty_strided((c,), (1,), _FLOAT32) for _ in range(4)]
        affine = weight is not None
        call(self.binaries[0], x, weight if affine else x, bias if affine else x, running_mean,
              running_var, out, *stats, n, c, math.prod(x.shape[2:]), int(affine), float(momentum),
              float(eps), torch.get_num_threads())
        return (out, *stats)

    def backward(self, g, x, weight, mean, invstd, eps, mask, layouts):
        """runtime.batch_norm_vjp: the gradients of a training batch norm's input, weight and
        bias (None where mask says none is wanted), in `layouts`."""
        if not self._ready(1) or not (x.is_contiguous() and g.is_contiguous()):
            return batch_norm_vjp(g, x, weight, mean, invstd, eps, mask, layouts)
        n, c = x.shape[0], x.shape[1]
        want = [bool(m) for m in mask]
        dx = empty_strided(tuple(x.shape), x.stride(), _FLOAT32) if want[0] else None
        dw, db = (empty_strided((c,), (1,), _FLOAT32) if w else None for w in want[1:])
        affine = weight is not None
        call(self.binaries[1], g, x, weight if affine else x, mean, invstd,
              *(t if t is not None else x for t in (dx, dw, db)), n, c, math.prod(x.shape[2:]),
              int(affine), want[0] | want[1] << 1 | want[2] << 2, torch.get_num_threads())
        return laid_out((dx, dw, db), layouts)


# The pointwise and reduction prims a batch norm's forward and backward would be, which the kernels
# take: what the joint program's worth rule (autodiff/joint.py) counts for one of PARALLEL_MIN
# elements or more (a smaller one gains too little over ATen's to pay for a joint program).
PRIMS = 8


def takes(b) -> bool:
    """Whether claim() gives the training batch norm `b` (a forward) to the kernels."""
    return b.sym.fn is _ATEN_FORWARD and not b.kwargs and _forward_fits(*b.args)


def worth(b) -> int:
    """What the joint program's worth rule counts for op `b`: PRIMS for a batch norm the kernels
    take of PARALLEL_MIN elements or more, else 0."""
    return PRIMS if takes(b) and at_hint(b.args[0].numel() >= PARALLEL_MIN) else 0


def claim(trace: Trace, kernels: Kernels) -> Trace | None:
    """The trace with each batch norm and batch norm backward the kernels take calling them, or
    None where there is none."""
    bsyms, changed = [], False
    for b in trace.bsyms:
        if takes(b):
            b = b.replace(sym=kernels.forward_symbol, comment=_COMMENT)
            changed = True
        elif b.sym.fn is batch_norm_vjp and _backward_fits(*b.args) and not b.kwargs:
            b = b.replace(sym=kernels.backward_symbol, comment=f"{_COMMENT}'s backward")
            changed = True
        bsyms.append(b)
    return trace.with_stage(trace.stage, bsyms) if changed else None


_COMMENT = "a training batch norm by fjit's C kernel (fjit/executors/c/batch_norm.py)"


def _float32(v, shape) -> bool:
    return isinstance(v, TensorVar) and v.dtype == _FLOAT32 and v.device.type == "cpu" \
        and tuple(v.shape) == tuple(shape) and tuple(v.strides) == contiguous_strides(v.shape)


def _input_fits(x, eps) -> bool:
    """A contiguous float32 CPU tensor, 3-D or more, with runs of MIN_RUN values or more; a literal
    eps."""
    return isinstance(x, TensorVar) and len(x.shape) >= 3 and _float32(x, x.shape) \
        and math.prod(x.shape[2:]) >= MIN_RUN and type(eps) in (float, int)


def _forward_fits(x, weight, bias, running_mean, running_var, training, momentum, eps, *rest) -> bool:
    """A training batch norm of an input _input_fits; float32 parameters (both or none) and
    running statistics; a literal momentum."""
    if rest or training is not True or not _input_fits(x, eps) or type(momentum) not in (float, int):
        return False
    channels = (x.shape[1],)
    return all(_float32(t, channels) for t in (running_mean, running_var)) and (
        weight is None and bias is None or _float32(weight, channels) and _float32(bias, channels))


def _backward_fits(g, x, weight, mean, invstd, eps, mask, layouts, *rest) -> bool:
    """runtime.batch_norm_vjp's arguments for the forward above, its cotangent contiguous."""
    if rest or not _input_fits(x, eps) or not _float32(g, x.shape):
        return False
    channels = (x.shape[1],)
    return all(_float32(t, channels) for t in (mean, invstd)) and (weight is None or _float32(weight, channels))
