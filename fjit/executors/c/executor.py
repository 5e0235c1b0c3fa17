"""The C executor: fusion regions over CPU tensors become C functions called from Python (launch.py).

Why it exists: on a tensor of a few elements a torch call is all dispatch (about 2-4 us each), so a
10-op function costs ten dispatches where one fused loop costs well under one; on a big tensor each
torch call is one pass over memory, where one fused, vectorized, multi-threaded loop makes one pass
for the whole region.  It claims regions of any size, except that a prim calling a scalar C library
function (float64's exp, any tan or pow, ...) is taken only up to MAX_NUMEL_LIBM elements: past
that torch's vectorized kernel is faster than the saved passes.

The system C compiler (`$CC`, else `cc`, else `gcc`) builds each kernel in about 80 ms, more than a
whole cold compile is allowed to take, so by default kernels are built on one background thread
(build_queue.py): until a kernel's binary is loaded its region runs as torch calls of its prims
(the fallback), and from then on the same launcher calls the kernel.  Results of the two differ
only in rounding (the C library's sin or exp against torch's, float sums accumulated in double),
within the dtype tolerance fjit promises.  Binaries are kept in the kernel cache directory by
source hash, so a later process loads them while compiling, with no wait.

FJIT_C_KERNELS selects the mode: "background" (the default), "sync" (build before the compile
returns; tests and benchmarks use it to know what runs) or "0" (off: the executor claims nothing).
Without a C compiler the executor claims nothing.  Autograd needs torch's ops, so a trace whose
inputs require grad under grad mode stays with the torch executor.
"""
from __future__ import annotations

import hashlib
import math

import torch

import fjit.config as config
from fjit.core.ir import BoundSymbol, Tag, TensorVar, Var, map_values
from fjit.core.prims import Prim, prim_of
from fjit.core.symbolic import is_symbolic, known
from fjit.core.trace import Trace
from fjit.executors import kernel_bsym, kernel_inputs_usable, runtime_sizes, symbolic_kernels
from fjit.executors.c import batch_norm, frame_stack, max_pool
from fjit.executors.c.codegen import Kernel, generate
from fjit.executors.c.language import MAX_NUMEL_LIBM, calls_libm, supported
from fjit.executors.c.build import build_key, compiler
# the executor protocol's pending() and wait(), and builds() (benchmarks count them), are the queue's
from fjit.executors.c.build_queue import Binary, binary_for, builds, pending, wait  # noqa: F401
from fjit.executors.c.launch import entry, launcher
from fjit.passes.fusion import FusionPolicy, Partitioner, Region
from fjit.passes.regroup import worth_a_copy_kernel


def mode() -> str:
    """FJIT_C_KERNELS (parsed in fjit.config): "background", "sync" or "off"."""
    return config.c_kernels().name.lower()


def _claimable(b: BoundSymbol) -> bool:
    """Whether a C kernel takes the prim `b`: the generator supports it, and a prim calling a
    scalar libm function touches at most MAX_NUMEL_LIBM elements per tensor."""
    return supported(b) and (not calls_libm(b) or all(
        _within_libm_limit(math.prod(v.shape)) for v in b.inputs() + b.outputs() if isinstance(v, TensorVar)))


def _within_libm_limit(numel) -> bool:
    """numel at most MAX_NUMEL_LIBM.  Symbolic, decided without a guard: a torch call unless it
    holds at every size (a guard would split the program by size class for a crossover)."""
    return known(numel <= MAX_NUMEL_LIBM) if is_symbolic(numel) else numel <= MAX_NUMEL_LIBM


# gelu stays one torch call: eager's vectorized CPU kernel gives nan at +-inf (AVX512 here), where
# its erf/tanh prims computed in C give +-inf, and the contract is eager's answer.
_PARTITIONER = Partitioner(FusionPolicy(
    _claimable, split_partial_ops=False, whole_ops=frozenset({"torch.nn.functional.gelu"}), columns=True,
    read_views=True, cpu_rewrites=True, external_rows=True))


name = "c"


def fuses_on(device: torch.device) -> bool:
    return device.type == "cpu" and mode() != "off" and compiler() is not None


def claim(trace: Trace, leaves: list) -> Trace | None:
    """The trace with each fusion region C takes replaced by one C kernel call, and each batch
    norm and max pool the written kernels take calling them (batch_norm.py, max_pool.py), or None."""
    if not kernel_inputs_usable(trace, fuses_on):
        return None
    # a region of one prim stays a torch call: that costs what a kernel call does; but a copy of
    # a permuted value is twice as fast in a kernel as ATen's strided copy_
    # (a copy of symbolic size is a kernel: regroup.py's copies were made for one)
    worth = lambda r: len(r.bsyms) > 1 or (prim_of(r.bsyms[0]) is Prim.CONTIGUOUS  # noqa: E731
                                           and worth_a_copy_kernel(tuple(r.domain)))
    if trace.sizes is not None:      # a symbolic program: kernels made per call's sizes
        return _PARTITIONER.fuse(trace, "c_fusion", lambda r: _SymbolicRegion(r, trace.sizes).bsym(), worth=worth)
    fused = _PARTITIONER.fuse(trace, "c_fusion", _region_bsym, worth=worth)
    for written in (batch_norm, max_pool):
        if any(b.sym.fn in written.CLAIMED for b in trace.bsyms):
            fused = written.claim(fused or trace.with_stage("c_fusion"), _written_kernels(written)) or fused
    return fused


_WRITTEN: dict = {}   # batch_norm or max_pool -> its Kernels, made when a trace first has its op


def _written_kernels(written):
    if written not in _WRITTEN:
        _WRITTEN[written] = batch_norm.Kernels(*(_written_binary(name, *kernel) for name, kernel in
                                                 batch_norm.KERNELS.items()), requeue=binary_for) \
            if written is batch_norm else max_pool.Kernels(_written_binary)
    return _WRITTEN[written]


def _written_binary(name: str, source: str, arg_types: list) -> Binary:
    """The build state of the threaded kernel `name` that `source` defines, named by a digest."""
    unique = f"{name}_{hashlib.sha1((build_key() + source).encode()).hexdigest()[:16]}"
    return binary_for(Kernel(unique, source.replace(f"void {name}(", f"void {unique}("), [], arg_types, True))


def _pointwise_and_reductions(b: BoundSymbol) -> list:
    """The pointwise and reduction prims of the op `b`."""
    return [s for s in b.subsymbols or (b,) if s.sym.has(Tag.ELEMENTWISE) or s.sym.has(Tag.REDUCTION)]


def differentiates(b: BoundSymbol) -> bool:
    """Whether to differentiate b through its prims: C kernels take all of its pointwise and
    reduction prims, or it has one (a single pointwise prim costs what eager's backward does even
    unfused)."""
    work = _pointwise_and_reductions(b)
    return len(work) <= 1 or all(_claimable(s) for s in work)


def fused_prims(b: BoundSymbol) -> int:
    """How many of b's pointwise and reduction prims go into C kernels: 0 unless C kernels take all
    of its prims; a batch norm the written kernels take counts as the prims they replace
    (batch_norm.worth)."""
    return len(_pointwise_and_reductions(b)) if all(_claimable(s) for s in b.subsymbols or (b,)) else batch_norm.worth(b)


_SIZES_POLICY = runtime_sizes.Policy()


def _kernel(region: Region) -> Kernel:
    """The region's kernel, named by the digest of its source, its sizes literals or parameters
    as FJIT_KERNEL_SIZES says (runtime_sizes.choose: by default the sizes that changed within its
    family are parameters, so a new sequence length or batch size builds nothing)."""
    return runtime_sizes.choose(region, lambda r, sizes: _named(generate(r, "fused", sizes)), _SIZES_POLICY)


def _named(kernel: Kernel) -> Kernel:
    digest = hashlib.sha1((build_key() + kernel.source + entry("fused", kernel.arg_types)).encode()).hexdigest()[:16]
    kernel.name = f"fjit_c_{digest}"
    kernel.source = kernel.source.replace("void fused(", f"void {kernel.name}(")
    return kernel


def _region_bsym(region: Region) -> BoundSymbol:
    kernel = _kernel(region)
    binary = binary_for(kernel)
    fallback = _Fallback(region, binary)
    launch = launcher(region, kernel, binary, fallback)
    comment = f"C kernel {kernel.name}\n{kernel.source[kernel.source.index(f'void {kernel.name}('):]}"
    return kernel_bsym(region, kernel.name, launch, comment)


class _SymbolicRegion(symbolic_kernels.SymbolicLauncher):
    """The C launcher of a symbolic program's region (symbolic_kernels.SymbolicLauncher).

    Its kernels (FJIT_KERNEL_SIZES auto or runtime) are generated from the region with every size
    that is an expression of the symbols a parameter (symbolic_kernels.parametric), at the values of
    the first call that needs one, recording every decision the generator takes on those sizes:
    the source is the same text wherever the decisions come out the same, so a kernel serves every
    set of values that passes its recorded conditions (symbolic_kernels.Variants).  A new length
    checks the variants' conditions and launches; it generates and builds only where a decision
    that changes what the kernel computes comes out otherwise (choices of speed are taken at the
    compiling call's sizes: runtime_sizes.preferred).  With
    FJIT_KERNEL_SIZES=specialized each set of values gets the region instantiated at those sizes
    and a kernel of literal sizes."""

    language = "C"

    def __init__(self, region: Region, sizes):
        super().__init__(region, sizes)
        self.parametric = config.kernel_sizes() is not config.KernelSizes.SPECIALIZED
        self.takes_symbols = self.parametric    # a kernel of literal sizes takes the inputs alone
        self.variants = symbolic_kernels.Variants(self._generate, self._prepare, self.language)
        self.current = (_never, None)     # (condition, launch) of the variant that served last
        self.start()

    def name_of(self, kernel: Kernel) -> str:
        return f"fjit_c_sym_{kernel.name[len('fjit_c_'):]}"

    def comment_of(self, kernel: Kernel) -> str:
        return f"{kernel.name}\n{kernel.source[kernel.source.index(f'void {kernel.name}('):]}"

    def __call__(self, *args):
        """A parametric kernel's launch takes the sizes as arguments, so one launch serves every
        set of values its variant's conditions admit: checked, not looked up per set of values
        (a new length then costs a condition, not a filing)."""
        if not self.parametric:
            return super().__call__(*args)
        holds, launch = self.current
        if not holds(*args[self.arity:]):
            holds, _, launch = self.variants.item(tuple(map(int, args[self.arity:])))
            if not config.check_mode():       # which checks each reuse against a generation
                self.current = (holds, launch)
        return launch(*args)

    def launched(self, values: tuple):
        if not self.parametric:
            concrete = self.instance(values)
            kernel = _kernel(concrete)
            binary = binary_for(kernel)
            return kernel, launcher(concrete, kernel, binary, _Fallback(concrete, binary))
        return self.variants(values)

    def _generate(self, values: tuple):
        region, params = symbolic_kernels.parametric(self.instance, values, self.hints)
        return _named(generate(region, "fused", params)), region

    def _prepare(self, kernel: Kernel, region: Region):
        binary = binary_for(kernel)
        return launcher(region, kernel, binary, _InstanceFallback(self.instance, binary, self.arity),
                        symbols=self.n_symbols)


def _never(*values) -> bool:
    return False


class _InstanceFallback:
    """A parametric kernel's fallback (while its build runs): the region instantiated at the call's
    sizes, run as torch calls (_Fallback); the instances made are kept per set of values."""

    def __init__(self, instance, binary: Binary, arity: int):
        self.instance, self.binary, self.arity = instance, binary, arity
        self.made: dict[tuple, _Fallback] = {}

    def __call__(self, *args):
        values = tuple(args[self.arity:])
        run = self.made.get(values)
        if run is None:
            if len(self.made) >= config.cache_size():
                self.made.clear()
            run = self.made[values] = _Fallback(self.instance(values), self.binary)
        return run(*args[:self.arity])


class _Fallback:
    """The region's prims run one by one as torch calls: what runs while the kernel is not built
    (or could not be).  Interpreted, not compiled to Python, so a cold compile pays nothing for it.
    A build lost to fork is queued again from here."""

    def __init__(self, region: Region, binary: Binary):
        self.params = [v.name for v in region.inputs]
        # an input the kernel reads through its views arrives as the value it views
        self.views = {k: (tuple(v.shape), tuple(v.strides), region.bases[k][1])
                      for k, v in enumerate(region.inputs) if k in region.bases}
        self.bsyms = list(region.bsyms)
        self.outputs = [v.name for v in region.outputs]
        self.layouts = [(tuple(v.shape), tuple(v.strides)) for v in region.outputs]
        self.binary = binary

    def __call__(self, *inputs):
        if not self.binary.queued and self.binary.error is None:
            binary_for(self.binary.kernel)
        inputs = [x.as_strided(self.views[k][0], self.views[k][1], x.storage_offset() + self.views[k][2])
                  if k in self.views else x for k, x in enumerate(inputs)]
        env = dict(zip(self.params, inputs))
        value = lambda a: env[a.name] if isinstance(a, Var) else a  # noqa: E731
        for b in self.bsyms:
            env[b.outputs()[0].name] = b.sym.fn(*map_values(value, b.args),
                                                 **map_values(value, b.kwargs))
        # what the kernel returns: fresh tensors (a contiguous() of a contiguous input is that
        # input, which a later op writing into the result in place would change) in the recorded
        # layouts (what reads them assumes those strides)
        storages = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        outs = tuple(val if val.untyped_storage().data_ptr() not in storages and tuple(val.stride()) == strides
                     else torch.empty_strided(shape, strides, dtype=val.dtype).copy_(val)
                     for val, (shape, strides) in zip((env[name] for name in self.outputs), self.layouts))
        return outs if len(outs) > 1 else outs[0]


# The frame-stack chunk cache (frame_stack.py) serves every program this process runs, and is built
# with this executor's C compiler: the executor starts it when a program first loads it.
frame_stack.install_in_background()
