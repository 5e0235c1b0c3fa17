"""The GEMM library per shape, a pass over the last stage (`choose_gemms`): a float32 CPU linear
layer's matmuls, and a convolution's weight gradient over few positions, run by whichever GEMM
library (torch's matmul, MKL's sgemm, or oneDNN's convolution) timed faster for their shapes in
this process.
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch._prims_common import make_contiguous_strides_for as contiguous_strides

import fjit.config as config
from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar
from fjit.core.prims import Prim, prim_of
from fjit.core.trace import Trace
from fjit.runtime import (convolution_vjp, convolution_vjp_by_gemm, linear_as_conv, matmul_as_conv,
                          matmul_as_input_grad, matmul_as_weight_grad)

# The fewest multiply-adds a product must have to be timed (below it either library takes a few
# microseconds), and how much faster oneDNN's form must time to be chosen (timing noise).
GEMM_MIN_MACS = 1 << 20
GEMM_MARGIN = 0.9
# The fewest rows (positions) a product must have to be timed: over fewer it reads its weight more
# than it computes, and oneDNN reorders the weight on every call (8 rows by VGG's 25088 x 4096
# classifier weight, forward and backward: 563 ms against MKL's 187 ms; timing both cost seconds).
# From 32 rows oneDNN's forward and data gradient can win (a 1x1 convolution over 2x2 positions of
# 8 images, 768 to 2304 channels: 0.7x and 0.5x MKL's time); its weight gradient over 32 rows took
# 3-10x MKL's, so that form needs 64.
GEMM_MIN_ROWS = 32
GEMM_MIN_ROWS_WEIGHT_GRAD = 64
# A candidate whose warm-up run takes longer than this is timed once more, not best of 5.
GEMM_LONG_RUN = 0.05
# A 2-D convolution's backward whose output has at most CONV_GEMM_POSITIONS positions an image is
# timed against its weight gradient as one GEMM over the input's patches
# (runtime.convolution_vjp_by_gemm).  oneDNN's weight gradient over a 2x2 output took 4x the GEMM's
# time (ResNet-50's last stage on 64x64 images: 3x3 512 -> 512, 6.6 ms against 1.5; its 1x1
# stride-2 downsampling 3.1 against 0.8); over 4x4 it took half the GEMM's, over 8x8 a quarter.
CONV_GEMM_POSITIONS = 4
_TAGS = frozenset({Tag.FALLBACK})
LINEAR_AS_CONV = Symbol("fjit_ops.linear_as_conv", linear_as_conv, _TAGS)
MATMUL_AS_CONV = Symbol("fjit_ops.matmul_as_conv", matmul_as_conv, _TAGS)
MATMUL_AS_INPUT_GRAD = Symbol("fjit_ops.matmul_as_input_grad", matmul_as_input_grad, _TAGS)
MATMUL_AS_WEIGHT_GRAD = Symbol("fjit_ops.matmul_as_weight_grad", matmul_as_weight_grad, _TAGS)
CONVOLUTION_VJP_BY_GEMM = Symbol("fjit_ops.convolution_vjp_by_gemm", convolution_vjp_by_gemm, _TAGS)
_timed: dict = {}      # (form, shapes, strides, grad, threads) -> whether oneDNN's form was faster


def choose_gemms(trace: Trace, tracked: bool) -> Trace:
    """Each float32 CPU product of rows by a weight (F.linear, a matmul prim whose first operand
    has contiguous rows, and in a program autograd does not record (`tracked` False) a weight's
    gradient `g.T @ x`) runs as oneDNN's 1x1 convolution (runtime.linear_as_conv and friends)
    where that timed faster than torch's matmul for its shapes and layouts in this process.

    Why: torch's CPU matmul is MKL's sgemm, which runs well below oneDNN's kernels on CPUs that
    are not Intel's (this project's AMD EPYC: a ViT layer's forward and backward 0.5x MKL's time);
    on an Intel CPU the two are close and MKL keeps most shapes.  Timing each shape once (a few
    milliseconds, at the compile) finds the crossover on any machine; products of fewer than
    GEMM_MIN_ROWS rows or GEMM_MIN_MACS multiply-adds stay torch's untimed.

    The other way round for a 2-D convolution's backward over at most CONV_GEMM_POSITIONS output
    positions an image (runtime.convolution_vjp_by_gemm): its weight gradient runs as torch's
    matmul over the input's patches where that timed faster than oneDNN's.  FJIT_GEMM=torch or
    onednn fixes both choices."""
    mode = config.gemm()
    out, changed = [], False
    for b in trace.bsyms:
        if _gemm_vjp(b) and mode is not config.Gemm.ONEDNN and (
                mode is config.Gemm.TORCH or _faster(CONVOLUTION_VJP_BY_GEMM, convolution_vjp, b.args, False)):
            out.append(b.replace(sym=CONVOLUTION_VJP_BY_GEMM, comment=(
                "ATen's convolution_backward with the weight's gradient as a GEMM over the input's "
                "patches" + ("" if mode is config.Gemm.TORCH else ": timed faster than oneDNN's"))))
            changed = True
            continue
        form = _conv_form(b, tracked) if mode is not config.Gemm.TORCH else None
        if form is None or not (mode is config.Gemm.ONEDNN or _onednn_faster(*form)):
            out.append(b)
            continue
        sym, args = form[0], form[1]
        out.append(BoundSymbol(sym, args, {}, b.output, comment=(
            f"{b.sym.qualname} as oneDNN's 1x1 convolution" + ("" if mode is config.Gemm.ONEDNN else
                                                               ": timed faster than torch's matmul"))))
        changed = True
    return trace.with_stage(trace.stage, out) if changed else trace


def _rows(x) -> bool:
    """A nonempty float32 CPU tensor of at least 2 dims whose rows are contiguous and merge into one
    matrix."""
    return isinstance(x, TensorVar) and x.ndim >= 2 and x.dtype == torch.float32 and \
        x.device.type == "cpu" and math.prod(x.shape) > 0 and \
        tuple(x.strides) == tuple(contiguous_strides(tuple(x.shape)))


def _conv_form(b: BoundSymbol, tracked: bool) -> tuple | None:
    """(symbol, args, torch's callable, grad, rows, multiply-adds) for a product choose_gemms may
    run as a convolution; rows are the product's M (the weight gradient's: the rows it sums over)."""
    z = b.output
    if not isinstance(z, TensorVar) or not _rows(z) or b.kwargs:
        return None
    if b.sym.fn is F.linear and len(b.args) in (2, 3):
        x, w = b.args[:2]
        bias = b.args[2] if len(b.args) == 3 else None
        if _rows(x) and _rows(w) and w.ndim == 2 and (bias is None or isinstance(bias, TensorVar) and
                                                      bias.ndim == 1 and bias.dtype == torch.float32):
            grad = tracked and any(v.requires_grad for v in (x, w, bias) if v is not None)
            rows = math.prod(x.shape[:-1])
            return LINEAR_AS_CONV, tuple(b.args), F.linear, grad, rows, rows * x.shape[-1] * w.shape[0]
        return None
    if prim_of(b) is not Prim.MATMUL or b.subsymbols or len(b.args) != 2:
        return None
    a, w = b.args
    if not (isinstance(w, TensorVar) and w.ndim == 2 and w.dtype == torch.float32 and w.device.type == "cpu"
            and math.prod(w.shape) > 0):
        return None
    macs = math.prod(a.shape) * w.shape[1]
    if _rows(a):
        grad = tracked and (a.requires_grad or w.requires_grad)
        if not grad and _rows(w):     # g @ w: the data gradient reads w where it lies
            return MATMUL_AS_INPUT_GRAD, (a, w), torch.matmul, False, math.prod(a.shape[:-1]), macs
        return MATMUL_AS_CONV, (a, w), torch.matmul, grad, math.prod(a.shape[:-1]), macs
    if not tracked and a.ndim == 2 and a.strides == (1, a.shape[0]) and _rows(w):
        return MATMUL_AS_WEIGHT_GRAD, (a, w), torch.matmul, False, a.shape[1], macs
    return None


def _gemm_vjp(b: BoundSymbol) -> bool:
    """Whether `b` is a convolution's backward convolution_vjp_by_gemm may run: a 2-D convolution of
    one group and contiguous float32 CPU operands whose weight's gradient is wanted, with at most
    CONV_GEMM_POSITIONS output positions an image and GEMM_MIN_MACS multiply-adds."""
    if b.sym.fn is not convolution_vjp or b.kwargs or len(b.args) != 10:
        return False
    g, x, w, _, stride, padding, dilation, groups, mask, _ = b.args
    return all(_rows(v) and v.ndim == 4 for v in (g, x, w)) and groups == 1 and mask[1] \
        and g.shape[2] * g.shape[3] <= CONV_GEMM_POSITIONS \
        and math.prod(g.shape) * math.prod(w.shape[1:]) >= GEMM_MIN_MACS


def _example(v, grad: bool):
    if not isinstance(v, TensorVar):
        return v
    x = torch.empty_strided(v.shape, v.strides, dtype=v.dtype).normal_()
    return x.requires_grad_(grad and v.requires_grad)


def _onednn_faster(sym: Symbol, args: tuple, torch_fn: Callable, grad: bool, rows: int, macs: int) -> bool:
    """_faster(sym, torch_fn, ...), for a product of at least GEMM_MIN_ROWS rows (a weight
    gradient's: GEMM_MIN_ROWS_WEIGHT_GRAD) and GEMM_MIN_MACS multiply-adds; False below."""
    if rows < (GEMM_MIN_ROWS_WEIGHT_GRAD if sym is MATMUL_AS_WEIGHT_GRAD else GEMM_MIN_ROWS) \
            or macs < GEMM_MIN_MACS:
        return False
    return _faster(sym, torch_fn, args, grad)


def _faster(sym: Symbol, baseline: Callable, args: tuple, grad: bool) -> bool:
    """Whether `sym` on operands like `args` timed under GEMM_MARGIN of `baseline`'s time (forward
    and backward where `grad`), measured once per shape in this process."""
    key = (sym.qualname, *((v.shape, v.strides, v.requires_grad) if isinstance(v, TensorVar) else repr(v)
                           for v in args), grad, torch.get_num_threads())
    if key not in _timed:
        # timed as the program runs, whatever modes the compiling call was made under
        with torch.inference_mode(False), torch.autocast("cpu", enabled=False), \
                torch.enable_grad() if grad else torch.no_grad():
            inputs = [_example(v, grad) for v in args]
            _timed[key] = _seconds(sym.fn, inputs, grad) < GEMM_MARGIN * _seconds(baseline, inputs, grad)
    return _timed[key]


def _seconds(fn: Callable, inputs: list, grad: bool, samples: int = 5) -> float:
    """The best of `samples` timings of fn (and its backward where `grad`), after one warm-up (one
    timing where the warm-up took over GEMM_LONG_RUN)."""
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]

    def run():
        out = fn(*inputs)
        if leaves:
            torch.autograd.grad(out, leaves, torch.ones_like(out))
    start = time.perf_counter()
    run()
    if time.perf_counter() - start > GEMM_LONG_RUN:
        samples = 1
    best = math.inf
    for _ in range(samples):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
