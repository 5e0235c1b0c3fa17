"""Executors turn the final trace into what runs: Triton kernels, C kernels, torch calls.

An executor is registered once (`register`: its `executors=` name, the module that is its
KernelExecutor, imported when first asked for, and whether it could fuse anything in this process,
asked before that import), from its own package; its kernel language registers itself with the
prim blocks' coverage (core/prims/registry.py `register_language`).  A kernel executor (the
KernelExecutor protocol) says on which devices it fuses, claims regions of a trace, says how the
compiled backward should split ops for it, and reports its background builds.  The pipeline
(fjit/pipeline.py) asks the executors in the user's `executors=` order; each sees what the earlier
ones left.  The torch executor is the catch-all: it runs whatever is left as torch calls, so it is
not in the registry and always runs last.

What every kernel executor shares lives here too: where kernels are cached, whether a trace's
inputs can be read by a kernel at all, and the bound symbol that stands for a region.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import tempfile
from typing import Callable, Iterable, Protocol

import torch

from fjit.config import kernel_cache_root
from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar, Var, map_values
from fjit.core.trace import Trace
from fjit.runtime import register_kernel

__all__ = ["TORCH", "KernelExecutor", "register", "parse_executors", "kernel_executor", "fusing_executor",
           "kernel_inputs_usable", "kernel_bsym", "kernel_cache_dir", "kernels_pending", "wait_for_kernels"]

TORCH = "torch"     # the catch-all executor's name: direct torch calls


class KernelExecutor(Protocol):
    name: str

    def fuses_on(self, device: torch.device) -> bool:
        """Whether it generates kernels for tensors on `device` (as configured now)."""

    def claim(self, trace: Trace, leaves: list) -> Trace | None:
        """`trace` with the regions it takes replaced by one kernel call each, or None."""

    def differentiates(self, b: BoundSymbol) -> bool:
        """For the compiled backward: whether to differentiate the op `b` through its prims (else
        torch autograd keeps it, with torch's own backward kernel)."""

    def fused_prims(self, b: BoundSymbol) -> int:
        """For the compiled backward: how many of the op `b`'s prims this executor's kernels take."""

    def pending(self) -> bool:
        """Whether it is still building kernels in the background (no waiting)."""

    def wait(self) -> bool:
        """Block until its background builds are done; False if they did not finish in time."""


@dataclasses.dataclass(frozen=True)
class Registration:
    name: str                      # the `executors=` spelling
    module: str                    # the module that is its KernelExecutor
    may_fuse: Callable[[], bool]   # whether it could claim anything in this process (before importing it)


REGISTERED: dict[str, Registration] = {}
_LOADED: dict = {}


def register(name: str, module: str, may_fuse: Callable[[], bool] = lambda: True) -> None:
    """Register a kernel executor: `fjit.jit(..., executors=(name, ...))` then asks `module` (a
    KernelExecutor, imported when first asked for; an ImportError makes it unavailable, not fjit)."""
    if name == TORCH:
        raise ValueError(f"executor name {name!r} is the torch executor's")
    REGISTERED[name] = Registration(name, module, may_fuse)
    _LOADED.pop(name, None)


def parse_executors(value, option: str) -> tuple[str, ...]:
    """The executor names `value` gives (one name or an iterable of them, an Enum's value counts
    as its name); a ValueError naming the registered ones where one is unknown."""
    names = [value] if isinstance(value, str) or not isinstance(value, Iterable) else list(value)
    out = []
    for v in names:
        v = getattr(v, "value", v)
        if v != TORCH and v not in REGISTERED:
            allowed = ", ".join(repr(n) for n in (*REGISTERED, TORCH))
            raise ValueError(f"{option}={v!r} is not one of {allowed}")
        out.append(v)
    return tuple(out)


def kernel_executor(name: str) -> KernelExecutor | None:
    """The executor registered as `name`, or None (torch, an executor that cannot load, or one
    with nothing to fuse in this process)."""
    if name not in _LOADED:
        registration = REGISTERED.get(name)
        if registration is None or not registration.may_fuse():
            return None
        try:
            _LOADED[name] = importlib.import_module(registration.module)
        except ImportError:
            _LOADED[name] = None
    return _LOADED[name]


def kernels_pending() -> bool:
    """Whether a loaded executor is still building kernels in the background (no waiting)."""
    return any(executor.pending() for executor in list(_LOADED.values()) if executor is not None)


def wait_for_kernels() -> None:
    """Block until the kernels the loaded executors are building in the background are built."""
    for executor in list(_LOADED.values()):
        if executor is not None:
            executor.wait()


def fusing_executor(executors: tuple, device: torch.device) -> KernelExecutor | None:
    """The first kernel executor of `executors` that fuses on `device`, or None."""
    for name in executors:
        executor = kernel_executor(name)
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


# The executors fjit ships, each registered by its own package (their kernel languages with them).
from fjit.executors import triton, c  # noqa: E402, F401  (the default order's)
