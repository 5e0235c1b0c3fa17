"""Executors turn the final trace into what runs: Triton kernels, C kernels, torch calls.

A kernel executor (the KernelExecutor protocol) says on which devices it fuses, claims regions of
a trace, and says how the compiled backward should split ops for it: which ops are differentiated
through their prims, and how many of those prims its kernels would take.  The pipeline
(fjit/pipeline.py) asks the executors in the user's `executors=` order; each sees what the earlier
ones left.  The torch executor is the catch-all: it runs whatever is left as torch calls, so it is
not in the registry and always runs last.

What every kernel executor shares lives here too: where kernels are cached, whether a trace's
inputs can be read by a kernel at all, and the bound symbol that stands for a region.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
from typing import Callable, Protocol

import torch

from fjit.config import Executor, kernel_cache_root, triton_on_cpu
from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar, Var, map_values
from fjit.core.trace import Trace
from fjit.runtime import register_kernel

__all__ = ["Executor", "KernelExecutor", "kernel_executor", "fusing_executor", "kernel_inputs_usable",
           "kernel_bsym", "kernel_cache_dir", "kernels_pending", "wait_for_kernels"]   # Executor (the `executors=` option) lives in fjit.config


class KernelExecutor(Protocol):
    name: str

    def fuses_on(self, device: torch.device) -> bool:
        """Whether it generates kernels for tensors on `device` (as configured now)."""

    def claim(self, trace: Trace, leaves: list) -> Trace | None:
        """`trace` with the regions it takes replaced by one kernel call each, or None."""

    def decompose(self, b: BoundSymbol, fused: bool = False) -> bool | int:
        """For the compiled backward: fused=False, whether to differentiate the op `b` through its
        prims (else torch autograd keeps it, with torch's own backward kernel); fused=True, how
        many of its prims this executor's kernels would take."""


# Kernel executors by option, imported when first asked for: Triton is optional (a missing triton
# makes its executor unavailable, not fjit).
_MODULES = {Executor.TRITON: "fjit.executors.triton.executor", Executor.C: "fjit.executors.c.executor"}
_LOADED: dict = {}


def _may_fuse(option: Executor) -> bool:
    """Whether the executor could claim anything in this process: Triton's only with a CUDA device
    or its interpreter on the CPU (a CPU-only program imports none of fjit's Triton modules)."""
    return option is not Executor.TRITON or triton_on_cpu() or torch.cuda.is_available()


def kernel_executor(option: Executor) -> KernelExecutor | None:
    """The executor registered for `option`, or None (torch, an executor that cannot load, or one
    with nothing to fuse in this process)."""
    if option not in _LOADED:
        if not _may_fuse(option):
            return None
        try:
            _LOADED[option] = importlib.import_module(_MODULES[option]) if option in _MODULES else None
        except ImportError:
            _LOADED[option] = None
    return _LOADED[option]


def kernels_pending() -> bool:
    """Whether a loaded executor is still building kernels in the background (no waiting)."""
    return any(getattr(executor, "builds_pending", lambda: False)() for executor in list(_LOADED.values()))


def wait_for_kernels() -> None:
    """Block until the kernels the loaded executors are building in the background are built."""
    for executor in list(_LOADED.values()):
        wait = getattr(executor, "wait_for_builds", None)
        if wait is not None:
            wait()


def fusing_executor(executors: tuple, device: torch.device) -> KernelExecutor | None:
    """The first kernel executor of `executors` that fuses on `device`, or None."""
    for option in executors:
        executor = kernel_executor(option)
        if executor is not None and executor.fuses_on(device):
            return executor
    return None


def kernel_inputs_usable(trace: Trace, device_ok: Callable[[torch.device], bool]) -> bool:
    """Whether a kernel executor may take regions of `trace` at all: its tensor inputs all live on
    one device it runs on, kernels reading raw data read their values (no value with a negative
    or conjugate bit, an input's or a view's as `torch._neg_view(x)`; no complex values), and
    autograd does not need the ops (inputs requiring grad under grad mode)."""
    tensors = [v for v in trace.inputs if isinstance(v, TensorVar)]
    if not tensors or any(v.device != tensors[0].device for v in tensors):
        return False
    if not device_ok(tensors[0].device):
        return False
    if any(isinstance(v, TensorVar) and (v.dtype.is_complex or v.neg_bit or v.conj_bit)
           for v in tensors + [v for b in trace.bsyms for v in b.inputs() + b.outputs()]):
        return False
    return not (torch.is_grad_enabled() and any(v.requires_grad for v in tensors))


def kernel_bsym(region, name: str, launch: Callable, comment: str) -> BoundSymbol:
    """The bound symbol that runs `region` as one kernel call, `name_<layout>(inputs) -> outputs`
    (one value, or a tuple of several); printed traces import the launcher by that name from
    fjit.runtime.

    One kernel binary (`name`, keyed by its source) serves every region that generates the same
    source, but a launcher is the region's own: it allocates the region's output shapes and
    strides and falls back to the region's prims.  Two regions with one source can differ there
    (an elementwise kernel over 57624 values is one loop for [16, 6, 49, 49] and [4, 24, 49, 49]),
    so the launcher's name carries a digest of the region's layouts, views and prims: a program
    never binds another region's launcher, which would hand it tensors of another shape or read
    another slice of a value."""
    name = f"{name}_{_region_digest(region)}"
    register_kernel(name, launch)
    outs = tuple(region.outputs)
    args = tuple(region.bases[k][0] if k in region.bases else v for k, v in enumerate(region.inputs))
    return BoundSymbol(Symbol(name, launch, frozenset({Tag.KERNEL})), args, {},
                       outs if len(outs) > 1 else outs[0], comment=comment)


def _region_digest(region) -> str:
    """A digest of what a region's launcher depends on besides its kernel's source: the layouts
    of its inputs and outputs and its prims with their arguments (variables by position)."""
    numbering: dict[str, int] = {}

    def term(x):
        if isinstance(x, Var):
            number = numbering.setdefault(x.name, len(numbering))
            return (number, getattr(x, "shape", None), getattr(x, "strides", None),
                    str(getattr(x, "dtype", type(x).__name__)))
        return repr(x)

    parts = [tuple(term(v) for v in region.inputs)]
    parts += [(b.sym.name, repr(map_values(term, (b.args, b.kwargs))), term(b.outputs()[0]))
              for b in region.bsyms]
    parts.append(tuple(term(v) for v in region.outputs))
    # inputs read through the value they view, at an offset: a kernel taking its sizes at run time
    # takes the offset as an argument, so two slices of one value share a source and layouts
    parts.append(tuple((k, term(base), str(offset)) for k, (base, offset) in sorted(region.bases.items())))
    return hashlib.sha1(repr(parts).encode()).hexdigest()[:8]


_FALLBACK_DIRS: dict[str, str] = {}   # an unwritable cache directory -> this process's temp dir


def kernel_cache_dir() -> str:
    """Where generated kernel sources and binaries are kept across processes (FJIT_CACHE_DIR).
    If that directory cannot be made, a temporary one serves this process (one, not one per call)."""
    path = kernel_cache_root()
    if path in _FALLBACK_DIRS:
        return _FALLBACK_DIRS[path]
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        path = _FALLBACK_DIRS.setdefault(path, tempfile.mkdtemp(prefix="fjit-kernels-"))
    return path
