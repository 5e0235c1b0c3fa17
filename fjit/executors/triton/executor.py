"""The Triton executor: claims fusion regions, compiles their kernels once, and launches them.

It runs where Triton can: CUDA tensors, or CPU tensors under TRITON_INTERPRET=1 (how the tests run
the generated kernels).  Autograd needs torch's ops, so a trace whose inputs require grad under grad
mode stays with the torch executor.

The launch path is thin: a region becomes one call of a closure holding the kernel, the grid and
the output layouts; per call it allocates outputs and launches, nothing else.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import os
import threading
import time

import torch

# A missing triton makes this executor unavailable.  Triton itself (0.1 s to import) is imported
# by the first kernel built, so CPU programs without the interpreter never pay for it.
if importlib.util.find_spec("triton") is None:
    raise ImportError("fjit's Triton executor needs the triton package")

import fjit.config as config
from fjit.core.ir import BoundSymbol
from fjit.core.symbolic import hint
from fjit.core.trace import Trace
from fjit.executors import kernel_bsym, kernel_cache_dir, kernel_inputs_usable, runtime_sizes, symbolic_kernels
from fjit.executors.triton import target
from fjit.executors.triton.codegen import Kernel, generate, supported
from fjit.executors.triton.launch import Stage, bind_stage, compile_for_device, compile_stage, make_launcher
from fjit.logs import kernels as log
from fjit.passes.fusion import FusionPolicy, Partitioner, Region

_KERNELS: dict[str, object] = {}      # kernel name (its source's hash) -> its loaded module
_LOCK = threading.Lock()
_PARTITIONER = Partitioner(FusionPolicy(supported, max_row=None))   # looped kernels take rows of any width
_GPU_PARTITIONER = Partitioner(FusionPolicy(functools.partial(supported, interpret=False), max_row=None))


def interpreting() -> bool:
    """Whether CPU tensors go to Triton's interpreter (TRITON_INTERPRET=1, unless FJIT_TRITON_CPU=0)."""
    return config.triton_on_cpu()


name = "triton"


def fuses_on(device: torch.device) -> bool:
    return device.type == "cuda" or device.type == "cpu" and interpreting()


def claim(trace: Trace, leaves: list) -> Trace | None:
    """The trace with each fusion region replaced by one kernel launch, or None if not applicable."""
    if not kernel_inputs_usable(trace, fuses_on):
        return None
    if trace.sizes is not None:
        return _PARTITIONER.fuse(trace, "triton_fusion", lambda r: _SymbolicRegion(r, trace.sizes).bsym())
    return _PARTITIONER.fuse(trace, "triton_fusion", _region_bsym)


def differentiates(b: BoundSymbol) -> bool:
    """Every op is differentiated through its prims (Triton's kernels fuse them at any size)."""
    return True


def fused_prims(b: BoundSymbol) -> int:
    """Triton's kernels take all of an op's prims."""
    return len(b.subsymbols or (b,))


def pending() -> bool:
    """Triton kernels are built when first launched, never in the background."""
    return False


def wait() -> bool:
    return True


_SIZES_POLICY = runtime_sizes.Policy()


def kernel_for(region: Region, interpret: bool) -> Kernel:
    """The region's kernel, named by a hash of its source (identical regions share one), its sizes
    literals or parameters as FJIT_KERNEL_SIZES says (runtime_sizes.choose)."""
    return runtime_sizes.choose(region, lambda r, sizes: _named(r, interpret, sizes), _SIZES_POLICY,
                                div="//")


def _named(region: Region, interpret: bool, sizes: list[int]) -> Kernel:
    kernel = generate(region, "fused", interpret, sizes)
    digest = hashlib.sha1(kernel.source.encode()).hexdigest()[:12]
    name = f"fjit_kernel_{digest}"
    source = kernel.source.replace("def fused", f"def {name}")
    for stage in kernel.stages():
        stage.source = source
        stage.name = stage.name.replace("fused", name, 1)
    return kernel


def target_kernels(trace: Trace) -> list[Kernel]:
    """The kernels this executor would generate for `trace` on a GPU (not for the interpreter),
    whatever its tensors' device: what the target-compile tests compile for sm_90.  A symbolic
    trace's regions give their kernels with symbolic sizes as parameters, at the hints."""
    regions = [item for item in _GPU_PARTITIONER.partition(trace) if isinstance(item, Region) and item.outputs]
    if trace.sizes is None:
        return [kernel_for(region, interpret=False) for region in regions]
    kernels = []
    for region in regions:
        symbols = trace.sizes.symbols_of(region)
        hints = tuple(hint(s) for s in symbols)
        at, params = symbolic_kernels.parametric(trace.sizes.instantiator(region, symbols), hints, hints, div="//")
        kernels.append(_named(at, False, params))
    return kernels


def _region_bsym(region: Region) -> BoundSymbol:
    interpret = config.triton_interpret()
    kernel = kernel_for(region, interpret)
    dump = config.triton_dump_target()
    if dump:
        target.dump(kernel if not interpret else kernel_for(region, interpret=False), dump)
    launch = _launcher(region, kernel, _compiled(kernel), interpret)
    comment = (f"Triton kernel {kernel.name}, {kernel.mode}, grid {kernel.grid}, BLOCK={kernel.block}, "
               f"{kernel.num_warps} warps\n{kernel.source}")
    return kernel_bsym(region, kernel.name, launch, comment)


class _SymbolicRegion(symbolic_kernels.SymbolicLauncher):
    """The Triton launcher of a symbolic program's region (see the C executor's, whose scheme this
    is): its kernels are generated from the region with the sizes that are expressions of the
    symbols as int64 parameters, one per set of recorded decisions (symbolic_kernels.Variants: a block
    size or a strategy chosen by size is a decision; a constexpr is compiled in, so its value is one
    too), and each is compiled once; per set of symbol values the launcher computes the grid, the
    output layouts, the size arguments and the workspaces from the symbols."""

    takes_symbols = False
    language = "Triton"

    def __init__(self, region: Region, sizes):
        super().__init__(region, sizes)
        self.interpret = config.triton_interpret()
        self.device = region.outputs[0].device
        self.fast = self.device.type == "cuda" and not self.interpret and config.triton_compiled_launch()
        self.variants = symbolic_kernels.Variants(self._generate, self._prepare, self.language)
        self.start()

    def name_of(self, kernel: Kernel) -> str:
        return f"fjit_triton_sym_{kernel.name[len('fjit_kernel_'):]}"

    def comment_of(self, kernel: Kernel) -> str:
        return f"{kernel.name}, {kernel.mode}, BLOCK={kernel.block}, {kernel.num_warps} warps\n{kernel.source}"

    def _generate(self, values: tuple):
        region, params = symbolic_kernels.parametric(self.instance, values, self.hints, div="//")
        kernel = _named(region, self.interpret, params)
        for stage in kernel.stages():
            for value in stage.constexprs.values():
                if isinstance(value, runtime_sizes.Size):
                    int(value)        # read: a condition that it is the same
        return kernel, region

    def _prepare(self, kernel: Kernel, region: Region):
        fns = _compiled(kernel)
        compiled = [compile_stage(fn, stage, self.device) if self.fast else None
                    for stage, fn in zip(kernel.stages(), fns)]
        per_size = ([(tuple(v.shape), tuple(v.strides)) for v in region.outputs],
                    [tuple(stage.grid) for stage in kernel.stages()],
                    list(kernel.scalar_args) + list(kernel.sizes), [n for n, _ in kernel.workspaces])
        return fns, compiled, symbolic_kernels.evaluator(per_size, self.n_symbols), [v.dtype for v in region.outputs]

    def launched(self, values: tuple):
        kernel, (fns, compiled, evaluate, dtypes) = self.variants(values)
        layouts, grids, literals, numels = evaluate(values)
        stages = []
        for stage, fn, grid, binary in zip(kernel.stages(), fns, grids, compiled):
            at = dataclasses.replace(stage, grid=grid, second=None)
            stages.append(Stage(at, fn, bind_stage(binary, at, self.device) if binary is not None else None))
        outputs = [(shape, strides, dtype) for (shape, strides), dtype in zip(layouts, dtypes)]
        workspaces = [(numel, dtype) for numel, (_, dtype) in zip(numels, kernel.workspaces)]
        return kernel, make_launcher(outputs, stages, literals, workspaces, self.device)


def _compiled(kernel: Kernel) -> list:
    """The triton.jit function of each stage.  triton.jit needs its source in a file; identical
    sources share one module and one binary."""
    with _LOCK:
        module = _KERNELS.get(kernel.name)
        if module is not None:
            log.debug("Triton kernel %s: cache hit (loaded in this process)", kernel.name)
        else:
            start = time.perf_counter()
            path = os.path.join(kernel_cache_dir(), f"{kernel.name}.py")
            if not os.path.exists(path):
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(kernel.source)
                os.replace(tmp, path)
            spec = importlib.util.spec_from_file_location(kernel.name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _KERNELS[kernel.name] = module
            log.debug("Triton kernel %s loaded in %.0f ms (%s), %s, grid %s, BLOCK=%s:\n%s",
                      kernel.name, 1e3 * (time.perf_counter() - start), path, kernel.mode,
                      kernel.grid, kernel.block, kernel.source)
    return [getattr(module, stage.name) for stage in kernel.stages()]


def _launcher(region: Region, kernel: Kernel, fns: list, interpret: bool):
    """The per-call work, with everything that can be decided at compile time decided here."""
    device = region.outputs[0].device
    fast = device.type == "cuda" and not interpret and config.triton_compiled_launch()
    stages = [Stage(k, fn, compile_for_device(fn, k, device) if fast else None)
              for k, fn in zip(kernel.stages(), fns)]
    outputs = [(tuple(v.shape), tuple(v.strides), v.dtype) for v in region.outputs]
    return make_launcher(outputs, stages, list(kernel.scalar_args) + kernel.sizes, kernel.workspaces,
                         device)
