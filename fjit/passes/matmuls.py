"""Rewrites of matmuls and copies.  The C executor's, before fusion partitions a trace (what
`split_ops` hands the partitioner): matmuls BLAS runs slowly because one of their dims is a
handful (`unroll_thin_matmuls`), and copies ATen makes slowly through strides
(`copies_in_kernels`), become prims a C kernel computes.  The last stage's (`choose_gemms`): a
float32 CPU linear layer's matmuls, and a convolution's weight gradient over few positions, run
by whichever GEMM library is faster for their shape.
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
from fjit.core.prims.layout import reshape_copies
from fjit.core.symbolic import hint, is_symbolic, same, shape_rules_for
from fjit.core.trace import Trace
from fjit.runtime import (convolution_vjp, convolution_vjp_by_gemm, linear_as_conv, matmul_as_conv,
                          matmul_as_input_grad, matmul_as_weight_grad)

# The longest inner dim a matmul is unrolled over (unroll_thin_matmuls), and the fewest elements of
# its result (below it a BLAS call costs a few microseconds either way: the trace stays readable).
THIN_MATMUL_K = 8
THIN_MATMUL_MIN_NUMEL = 4096
# The most bytes of w's K rows (K x N) an unrolled kernel reads again for every output row: past
# an L1's share, its K loads an output element run from L2 and MKL's register-blocked kernel is
# faster (float32, 2-core Xeon: K=8 N=512 0.80-0.92x MKL's time, K=8 N=2048 1.47x, K=4 N=4096
# 1.17-1.38x; AlexNet's classifier weight gradients, [4096, 8] @ [8, 9216], made its step 1.08x
# eager's).
THIN_MATMUL_PANEL_BYTES = 16384
# The fewest elements a copy has to be made a kernel's (copies_in_kernels).
COPY_MIN_NUMEL = 1024


def split_ops(bsyms: list, supported: Callable[[BoundSymbol], bool], whole_ops: frozenset,
              split_partial_ops: bool, cpu_rewrites: bool) -> list:
    """The ops a partitioner sees: each torch-level op as its prims where they are all supported
    (or with `split_partial_ops` always, but never the `whole_ops`), with thin matmuls unrolled or
    swapped (unroll_thin_matmuls) and copies made kernels' (copies_in_kernels) where
    `cpu_rewrites`."""
    flat = []
    dense: dict = {}       # copies_in_kernels' copies so far: a value two ops read is copied once
    for b in bsyms:
        if cpu_rewrites and b.sym.qualname not in whole_ops:
            prims = b.subsymbols or [b]
            rewritten = copies_in_kernels(unroll_thin_matmuls(prims, supported), supported, dense)
            if rewritten is not prims:
                flat.extend(rewritten)
                continue
        split = b.subsymbols and b.sym.qualname not in whole_ops and (
            split_partial_ops or all(map(supported, b.subsymbols)))
        flat.extend(b.subsymbols if split else (b,))
    return flat


def unroll_thin_matmuls(flat: list, supported: Callable[[BoundSymbol], bool]) -> list:
    """A float matmul `a @ w` of a 2-D `w` (or one with a's batch dims) over an inner dim of at most
    THIN_MATMUL_K (MLP-Mixer's token MLP over 4 tokens, its backward's cotangent times that weight,
    attention over windows of 4) as the sum of its K broadcast products,
    `a[..., k:k+1] * w[..., k:k+1, :]` added in order of k: elementwise prims a kernel
    computes per output element, reading a and w where they lie, and fuses with the bias add and
    activation around it.  A BLAS call on such a product runs at a fraction of memory speed (MKL:
    0.18 ms for [4096, 4] @ [4, 256], 0.07 ms as one kernel), while w's K rows stay in L1
    (THIN_MATMUL_PANEL_BYTES).  Rounding: each product is rounded
    and the sum runs in k order, where BLAS may fuse multiply-adds; results agree to rounding.
    Returns `flat` itself where it unrolls nothing."""
    out, changed = [], False
    for b in flat:
        unrolled = _unrolled(b) if prim_of(b) is Prim.MATMUL else None
        if unrolled is not None and all(map(supported, unrolled[1])):
            out += unrolled[0] + unrolled[1]
        elif (swapped := _swapped(b) if prim_of(b) is Prim.MATMUL else None) is not None:
            out += swapped
        else:
            out.append(b)
            continue
        changed = True
    return out if changed else flat


def _swapped(m: BoundSymbol) -> list | None:
    """`a @ b` of a transposed 2-D `a` [M, K] and at most THIN_MATMUL_K columns (a weight's
    gradient `g.T @ x` where x has a few features: MLP-Mixer's token MLP) as `(b.T @ a.T).T`,
    copied to the result's layout: MKL takes 5x as long on the first form ([256, 4096] @ [4096, 4]:
    1.0 ms against 0.18 ms)."""
    a, b = m.args[:2] if len(m.args) >= 2 and not m.kwargs else (None, None)
    z = m.outputs()[0]
    if any(isinstance(v, TensorVar) and is_symbolic(v.shape) for v in (a, b, z)):
        return None      # a choice per size, not made for a symbolic program
    if not (isinstance(a, TensorVar) and isinstance(b, TensorVar) and a.ndim == b.ndim == 2
            and b.shape[1] <= THIN_MATMUL_K and a.shape[0] > 4 * b.shape[1] and a.strides[0] == 1
            and a.strides[1] >= a.shape[0] and a.dtype == b.dtype == z.dtype and len(m.outputs()) == 1
            and tuple(z.strides) == tuple(contiguous_strides(tuple(z.shape)))):
        return None
    permute = Prim.PERMUTE.block.symbol

    def var(suffix, shape, strides, grad):
        return TensorVar(f"{z.name}_{suffix}", tuple(shape), z.dtype, z.device, tuple(strides), grad)
    bt = var("bt", b.shape[::-1], b.strides[::-1], b.requires_grad)
    at = var("at", a.shape[::-1], a.strides[::-1], a.requires_grad)
    y = var("t", z.shape[::-1], contiguous_strides(tuple(z.shape[::-1])), z.requires_grad)
    yt = var("tt", z.shape, y.strides[::-1], z.requires_grad)
    return [BoundSymbol(permute, (b, (1, 0)), {}, bt), BoundSymbol(permute, (a, (1, 0)), {}, at),
            BoundSymbol(m.sym, (bt, at), {}, y), BoundSymbol(permute, (y, (1, 0)), {}, yt),
            BoundSymbol(Prim.CONTIGUOUS.block.symbol, (yt,), {}, z)]


def _unrolled(m: BoundSymbol) -> tuple | None:
    """(reads: w made dense and the slices of a and w; products and sums) computing matmul `m` as
    unroll_thin_matmuls says, or None."""
    a, w = m.args[:2] if len(m.args) >= 2 and not m.kwargs else (None, None)
    z = m.outputs()[0]
    # In a symbolic program K must be a static size (the unrolled form has K products); the
    # other sizes decide only whether the form is faster, so they are read at the compiling
    # call's values without a guard (`hint`), and shapes compare as expressions (`same`): the
    # unrolled form is right at every size.
    if not (isinstance(a, TensorVar) and isinstance(w, TensorVar) and a.ndim >= 2
            and (w.ndim == 2 or w.ndim == a.ndim and same(tuple(w.shape[:-2]), tuple(a.shape[:-2])))
            and not is_symbolic(w.shape[-2]) and 0 < w.shape[-2] <= THIN_MATMUL_K
            and same(a.shape[-1], w.shape[-2]) and z.ndim == a.ndim
            and math.prod(map(hint, z.shape)) >= THIN_MATMUL_MIN_NUMEL
            and w.shape[-2] * hint(w.shape[-1]) * w.dtype.itemsize <= THIN_MATMUL_PANEL_BYTES
            and a.dtype == w.dtype == z.dtype and a.dtype in (torch.float32, torch.float64)
            and a.device == w.device == z.device and len(m.outputs()) == 1
            and same(tuple(z.strides), tuple(contiguous_strides(tuple(z.shape))))):
        return None
    with shape_rules_for(a, w, z):
        return _unrolled_products(a, w, z)


def _unrolled_products(a: TensorVar, w: TensorVar, z: TensorVar) -> tuple:
    """_unrolled's (reads, products and sums) of `z = a @ w`, once the form is chosen."""
    reads, sums, total = [], [], None
    if not same(w.strides[-1], 1):     # a transposed weight: rows of w read along the output's rows
        dense = TensorVar(f"{z.name}_w", tuple(w.shape), w.dtype, w.device,
                          tuple(contiguous_strides(tuple(w.shape))), w.requires_grad)
        reads.append(BoundSymbol(Prim.CONTIGUOUS.block.symbol, (w,), {}, dense))
        w = dense
    for k in range(w.shape[-2]):
        pair = []
        for x, index in ((a, (Ellipsis, slice(k, k + 1))), (w, (Ellipsis, slice(k, k + 1), slice(None)))):
            view = torch.empty_strided(x.shape, x.strides, dtype=x.dtype, device="meta")[index]
            v = TensorVar(f"{z.name}_{'aw'[x is w]}{k}", tuple(view.shape), x.dtype, x.device,
                          tuple(view.stride()), x.requires_grad)
            reads.append(BoundSymbol(Prim.SLICE.block.symbol, (x, index), {}, v))
            pair.append(v)
        last = k == w.shape[-2] - 1
        product = z if last and total is None else TensorVar(
            f"{z.name}_p{k}", tuple(z.shape), z.dtype, z.device, tuple(z.strides), z.requires_grad)
        sums.append(BoundSymbol(Prim.MUL.block.symbol, tuple(pair), {}, product))
        if total is not None:
            added = z if last else TensorVar(f"{z.name}_s{k}", tuple(z.shape), z.dtype, z.device,
                                             tuple(z.strides), z.requires_grad)
            sums.append(BoundSymbol(Prim.ADD.block.symbol, (total, product), {}, added))
            product = added
        total = product
    return reads, sums


def copies_in_kernels(flat: list, supported: Callable[[BoundSymbol], bool], dense: dict | None = None) -> list:
    """A reshape that copies (a permuted value read in another shape: attention's heads merged
    back, a window partition, the qkv cotangent's concatenation regrouped) is a contiguous() a
    kernel writes, then a view of it; and a batched matmul operand torch.matmul would copy in its
    own reshape (batch dims that do not merge) is copied so first.  ATen's strided copy of a
    permuted 5-D value took 20-30 us where the kernel takes 10, and the copy joins the kernel
    that computes its input.  `dense` (name -> its copy) holds the copies made by earlier calls
    over the same program: a value two matmuls read (attention's output cotangent, by the
    gradients of its probabilities and of V) is copied once.  Returns `flat` itself where
    nothing copies."""
    out, changed = [], False
    dense = {} if dense is None else dense
    for b in flat:
        p = prim_of(b)
        new = _reshape_copy(b, supported, dense) if p is Prim.RESHAPE else \
            _matmul_copies(b, supported, dense) if p is Prim.MATMUL else None
        if new is None:
            out.append(b)
            # an op's own copy (torch.matmul's recorded with the operand it copies) goes apart
            changed |= p is Prim.CONTIGUOUS and len(flat) > 1 and supported(b) and \
                worth_a_copy_kernel(b.outputs()[0].shape)
        else:
            out += new
            changed = True
    return out if changed else flat


def worth_a_copy_kernel(shape: tuple) -> bool:
    """Whether a copy of this shape is worth a kernel of its own: COPY_MIN_NUMEL elements or more.
    Of a symbolic size, yes, without a guard: either way is right, the kernel copy is the faster
    at all but the smallest sizes, and a guard would split the program by size class."""
    numel = math.prod(shape)
    return True if is_symbolic(numel) else numel >= COPY_MIN_NUMEL


def _dense(x: TensorVar, name: str, supported, dense: dict) -> tuple:
    """(x copied row-major: the contiguous() a kernel takes, or None; the copies to record) where
    `dense` holds no copy of x yet, else (that copy, [])."""
    if x.name in dense:
        return dense[x.name], []
    c = BoundSymbol(Prim.CONTIGUOUS.block.symbol, (x,), {}, TensorVar(
        name, tuple(x.shape), x.dtype, x.device, tuple(contiguous_strides(tuple(x.shape))), x.requires_grad))
    if not supported(c):
        return None, []
    dense[x.name] = c.output
    return c.output, [c]


def _reshape_copy(r: BoundSymbol, supported, dense: dict) -> list | None:
    x, z = r.args[0], r.outputs()[0]
    if not isinstance(x, TensorVar) or not worth_a_copy_kernel(x.shape) or len(r.outputs()) != 1 \
            or tuple(z.strides) != tuple(contiguous_strides(tuple(z.shape))) or not reshape_copies(x, tuple(z.shape)):
        return None
    c, copies = _dense(x, f"{z.name}_dense", supported, dense)
    return None if c is None else [*copies, r.replace(args=(c, *r.args[1:]))]


def _matmul_copies(m: BoundSymbol, supported, dense: dict) -> list | None:
    a, b = m.args[:2] if len(m.args) >= 2 and not m.kwargs else (None, None)
    if not (isinstance(a, TensorVar) and isinstance(b, TensorVar) and a.ndim >= 3
            and (b.ndim == 2 or b.ndim == a.ndim and tuple(a.shape[:-2]) == tuple(b.shape[:-2]))):
        return None
    copies, args = [], []
    for k, x in enumerate((a, b)):
        c, made = _dense(x, f"{m.outputs()[0].name}_in{k}", supported, dense) if x.ndim >= 3 and \
            worth_a_copy_kernel(x.shape) and reshape_copies(x, (-1, *x.shape[-2:])) else (None, [])
        copies += made
        args.append(c if c is not None else x)
    return copies + [m.replace(args=(*args, *m.args[2:]))] if args[0] is not a or args[1] is not b else None


# -- choose_gemms ----------------------------------------------------------------------------------

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
