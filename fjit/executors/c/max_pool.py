"""A 2-D max pool of a float32 NCHW CPU tensor as a written C kernel, which the C executor puts in
place of runtime.max_pool2d_with_indices (the compiled joint program's forward of a max pool: its
output and the indices its backward reads) and of runtime.max_pool2d (a forward run without
autograd) where a trace's metadata says the kernel takes the tensors.

Why: ATen's NCHW CPU max pool is scalar (ResNet's stem pool, [8, 64, 32, 32] on 2 threads: 1.6 ms),
and its channels-last one, which fjit used through a copy, pays for the copy (0.7 ms in all).
This kernel takes 0.15 ms: a thread takes whole planes, and a plane is pooled in two passes that
the compiler vectorizes, each window's rows first (the maxima of each input row over each output
column's taps) and then the rows' results down each output column.

Same values and indices as ATen's kernels, ties and NaNs included.  ATen scans a window row by row
and column by column, and a value replaces the kept one if it is greater or NaN, starting from
-inf at the window's first valid position.  That picks the last NaN where there is one, else the
first maximum; pooling each row's taps by the same rule and then the rows' picks picks the same.
Until the kernel for a pool's sizes is built (or where it could not be), the runtime's function runs.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import Symbol, Tag, TensorVar
from fjit.core.trace import Trace
from fjit.executors.c.batch_norm import PARALLEL_MIN    # (fewer elements: one thread, for the same reason)
from fjit.executors.c.launch import call, empty_strided
from fjit.executors.render import contiguous_strides
from fjit.runtime import max_pool2d, max_pool2d_with_indices, register_kernel

# The largest plane of row maxima the kernel takes (input rows x output columns, 8 bytes each, on
# each thread's stack: 256 KB; a 512x512 image's stem pool has 32768) and the widest output row.
MAX_ROW_MAXIMA = 1 << 15
MAX_OUTPUT_WIDTH = 2048

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#define KH %(kh)d
#define KW %(kw)d
#define SH %(sh)d
#define SW %(sw)d
#define PH %(ph)d
#define PW %(pw)d
#define DH %(dh)d
#define DW %(dw)d
#define FJ_TAKE(v, m) ((v) > (m) || (v) != (v))

/* the maximum of the KW taps of one row from flat position `at`, and its index (ATen's rule) */
static inline void fj_taps(const float *restrict x, int64_t at, float *restrict m, int32_t *restrict i) {
    float best = -INFINITY; int32_t where = (int32_t)at;
    for (int kw = 0; kw < KW; kw++) {
        float v = x[at + kw * DW];
        int t = FJ_TAKE(v, best);
        best = t ? v : best; where = t ? (int32_t)(at + kw * DW) : where;
    }
    *m = best; *i = where;
}

/* the maxima of rows [0, H) of plane x over the taps of output columns [lo, hi), whose taps are
   all in bounds: rm/ri[ih * OW + ow] */
static void fj_rows(const float *restrict x, int64_t H, int64_t W, int64_t OW, int64_t lo, int64_t hi,
                    float *restrict rm, int32_t *restrict ri) {
    if (W == SW * OW && lo < hi) {
        /* column ow of row ih starts at flat position (ih * OW + ow) * SW - PW: one run over the
           plane from the first row's first interior column to the last row's last, whose taps
           are all in the plane (the edge columns between, read across rows, are redone after) */
        for (int64_t j = lo; j < (H - 1) * OW + hi; j++)
            fj_taps(x, j * SW - PW, rm + j, ri + j);
        return;
    }
    for (int64_t ih = 0; ih < H; ih++)
        for (int64_t ow = lo; ow < hi; ow++)
            fj_taps(x, ih * W + ow * SW - PW, rm + ih * OW + ow, ri + ih * OW + ow);
}

void fjit_max_pool(const float *restrict in, float *restrict out, int64_t *restrict indices,
                   int64_t planes, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t nt) {
    int64_t lo = 0, hi = OW;         /* the output columns whose taps are all in bounds */
    while (lo < OW && lo * SW - PW < 0) lo++;
    while (hi > lo && (hi - 1) * SW - PW + (KW - 1) * DW >= W) hi--;
#pragma omp parallel num_threads(nt) if(nt > 1)
    {
    float rm[H * OW];                /* a plane's row maxima: on the stack (fits() bounds them) */
    int32_t ri[H * OW];
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; p++) {
        const float *x = in + p * H * W;
        fj_rows(x, H, W, OW, lo, hi, rm, ri);
        for (int64_t ih = 0; ih < H; ih++)       /* the edge columns, taps checked */
            for (int64_t ow = 0; ow < OW; ow++) {
                if (ow == lo && hi > lo) { ow = hi - 1; continue; }
                int64_t iw0 = ow * SW - PW, iw1 = iw0 + (KW - 1) * DW + 1;
                if (iw1 > W) iw1 = W;
                while (iw0 < 0) iw0 += DW;
                float m = -INFINITY; int32_t i = (int32_t)(ih * W + iw0);
                for (int64_t iw = iw0; iw < iw1; iw += DW) {
                    float v = x[ih * W + iw];
                    if (FJ_TAKE(v, m)) { m = v; i = (int32_t)(ih * W + iw); }
                }
                rm[ih * OW + ow] = m; ri[ih * OW + ow] = i;
            }
        for (int64_t oh = 0; oh < OH; oh++) {    /* down each output column, rows in order */
            int64_t ih0 = oh * SH - PH, ih1 = ih0 + (KH - 1) * DH + 1;
            if (ih1 > H) ih1 = H;
            while (ih0 < 0) ih0 += DH;
            float m[OW]; int32_t mi[OW];
            for (int64_t ow = 0; ow < OW; ow++) {
                int64_t iw0 = ow * SW - PW;
                while (iw0 < 0) iw0 += DW;
                m[ow] = -INFINITY; mi[ow] = (int32_t)(ih0 * W + iw0);
            }
            for (int64_t ih = ih0; ih < ih1; ih += DH) {
                const float *r = rm + ih * OW;
                const int32_t *q = ri + ih * OW;
                for (int64_t ow = 0; ow < OW; ow++) {
                    float v = r[ow];
                    int t = FJ_TAKE(v, m[ow]);
                    m[ow] = t ? v : m[ow]; mi[ow] = t ? q[ow] : mi[ow];
                }
            }
            float *o = out + (p * OH + oh) * OW;
            int64_t *oi = indices + (p * OH + oh) * OW;
            for (int64_t ow = 0; ow < OW; ow++) { o[ow] = m[ow]; oi[ow] = mi[ow]; }
        }
    }
    }
}
"""
ARG_TYPES = ["p"] * 3 + ["q"] * 6
_FLOAT32 = torch.float32
CLAIMED = (max_pool2d, max_pool2d_with_indices)     # what claim() looks for


def source(pool: tuple) -> str:
    """The kernel's C source for one pool's sizes ((kernel, stride, padding, dilation) pairs)."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pool
    return _SOURCE % dict(kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw, dh=dh, dw=dw)


class Kernels:
    """The kernels built (or building) per pool's sizes, and what a program calls in place of the
    runtime's functions.  `binary(name, source, arg_types)` gets the build state of the kernel
    `name` that `source` defines (building it as the C executor's mode says, under a name of its
    own); a build lost to fork is queued again the same way."""

    def __init__(self, binary):
        self.binary = binary
        self.binaries: dict = {}
        self.with_indices_symbol = Symbol("fjit_c_max_pool2d_with_indices", self.with_indices,
                                          frozenset({Tag.KERNEL}))
        self.output_symbol = Symbol("fjit_c_max_pool2d", self.output, frozenset({Tag.KERNEL}))
        for symbol in (self.with_indices_symbol, self.output_symbol):
            register_kernel(symbol.qualname, symbol.fn)

    def _get(self, pool: tuple):
        binary = self.binaries.get(pool)
        if binary is None or binary.fn is None and not binary.queued and binary.error is None:
            binary = self.binaries[pool] = self.binary("fjit_max_pool", source(pool), ARG_TYPES)
        return binary

    def prepare(self, pool: tuple) -> None:
        """Start building the kernel for `pool` (a claim does, so the build runs while tracing goes on)."""
        self._get(pool)

    def with_indices(self, x, kernel_size, stride, padding, dilation, ceil_mode):
        """runtime.max_pool2d_with_indices: the output and the NCHW indices of its maxima."""
        pool = (tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation))
        binary = self._get(pool)
        if binary.fn is None or not x.is_contiguous():
            return max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)
        n, c, h, w = x.shape
        oh, ow = (_output_size(size, k, s, p, d, ceil_mode) for size, k, s, p, d in
                  zip((h, w), kernel_size, stride, padding, dilation))
        out = empty_strided((n, c, oh, ow), (c * oh * ow, oh * ow, ow, 1), _FLOAT32)
        indices = empty_strided((n, c, oh, ow), (c * oh * ow, oh * ow, ow, 1), torch.int64)
        threads = torch.get_num_threads() if x.numel() >= PARALLEL_MIN else 1
        call(binary, x, out, indices, n * c, h, w, oh, ow, threads)
        return out, indices

    def output(self, x, kernel_size, stride, padding, dilation, ceil_mode):
        """runtime.max_pool2d's value, run without autograd."""
        return self.with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


def _output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """ATen's pooling_output_shape: with ceil_mode, a last window must start inside the input or
    its left padding."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def fits(x, kernel_size, stride, padding, dilation, ceil_mode, *rest) -> bool:
    """A contiguous float32 NCHW CPU tensor, pooled with literal sizes (windows at most 16 taps a
    side, padding at most half a window, as ATen requires) into rows at most MAX_OUTPUT_WIDTH wide,
    input rows x output columns at most MAX_ROW_MAXIMA."""
    if rest or not (isinstance(x, TensorVar) and len(x.shape) == 4 and x.dtype == _FLOAT32
                    and x.device.type == "cpu" and tuple(x.strides) == contiguous_strides(x.shape)):
        return False
    sizes = (kernel_size, stride, padding, dilation)
    if not all(isinstance(v, (tuple, list)) and len(v) == 2 and all(type(i) is int for i in v) for v in sizes) \
            or type(ceil_mode) is not bool:
        return False
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = sizes
    h, w = x.shape[2:]
    if not (0 < kh <= 16 and 0 < kw <= 16 and sh > 0 and sw > 0 and dh > 0 and dw > 0
            and 0 <= ph <= kh // 2 and 0 <= pw <= kw // 2 and h * w < 2 ** 31 and math.prod(x.shape) > 0):
        return False
    oh, ow = (_output_size(size, k, s, p, d, ceil_mode) for size, k, s, p, d in
              zip((h, w), (kh, kw), (sh, sw), (ph, pw), (dh, dw)))
    return 0 < oh and 0 < ow <= MAX_OUTPUT_WIDTH and h * ow <= MAX_ROW_MAXIMA


def claim(trace: Trace, kernels: Kernels) -> Trace | None:
    """The trace with each max pool the kernels take calling them (their builds started), or None
    where there is none."""
    bsyms, changed = [], False
    for b in trace.bsyms:
        if b.sym.fn in CLAIMED and not b.kwargs and fits(*b.args):
            kernels.prepare(tuple(tuple(v) for v in b.args[1:5]))
            symbol = kernels.with_indices_symbol if b.sym.fn is max_pool2d_with_indices else kernels.output_symbol
            b = b.replace(sym=symbol, comment="a max pool by fjit's C kernel (fjit/executors/c/max_pool.py)")
            changed = True
        bsyms.append(b)
    return trace.with_stage(trace.stage, bsyms) if changed else None
