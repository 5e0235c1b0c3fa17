"""The C kernels' build queue: each kernel's build state (`binary_for`), built on one background
thread (or before the compile returns, FJIT_C_KERNELS=sync), kept in the kernel cache directory by
name so a later process loads it with no wait, and requeued in a forked child, where the thread
does not survive.  `pending` and `wait` are the executor protocol's (executor.py re-exports them).

A kernel's library is closed once no launcher holds its Binary (no compiled program can call it).
"""
from __future__ import annotations

import ctypes
import os
import queue
import random
import subprocess
import threading
import time
import warnings
import weakref

import _ctypes

import fjit.config as config
from fjit.executors import kernel_cache_dir
from fjit.executors.c.build import build_library, kernel_flags
from fjit.executors.c.codegen import Kernel
from fjit.executors.c.launch import HEADER, entry, python_entry
from fjit.logs import kernels as log

_ARG_TYPES = {"p": ctypes.c_void_p, "d": ctypes.c_double, "q": ctypes.c_int64}


def _sync() -> bool:
    """FJIT_C_KERNELS=sync: a kernel is built before the compile that asks for it returns."""
    return config.c_kernels() is config.CKernels.SYNC


class Binary:
    """One kernel's build state; `fn` is the loaded ctypes function once built."""

    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.fn = None
        self.fast = None     # the entry point taking tensors (launch.py), where built with one
        self.error: str | None = None
        self.queued = False
        self.done = threading.Event()


# Kernels by name, held by the launchers that call them: once no compiled program refers to a
# kernel (its cache entries evicted, its function gone), its library is closed.
_BINARIES: "weakref.WeakValueDictionary[str, Binary]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_QUEUE: queue.SimpleQueue = queue.SimpleQueue()
_WORKER: list = []          # [Thread] while one runs
_WARNED: list = []
_BUILT = [0]                # kernels compiled from source in this process (benchmarks count them)


def builds() -> int:
    """How many kernels this process has compiled from source (not loaded from the cache)."""
    return _BUILT[0]


def binary_for(kernel: Kernel) -> Binary:
    """The kernel's build state, with its build done, started or queued as the mode says."""
    with _LOCK:
        binary = _BINARIES.get(kernel.name)
        if binary is None:
            binary = _BINARIES[kernel.name] = Binary(kernel)
        if binary.fn is not None or binary.error is not None:
            log.debug("C kernel %s: cache hit (loaded in this process)", kernel.name)
            return binary
        # (a stress test's delayed builds load from disk in the background too)
        if not (config.c_build_delay() and not _sync()) and _load_from_disk(binary):
            log.debug("C kernel %s: cache hit (binary on disk)", kernel.name)
            return binary
        if not _sync():
            if not binary.queued:
                binary.queued = True
                _QUEUE.put(binary)
                if not _WORKER or not _WORKER[0].is_alive():
                    _WORKER[:] = [threading.Thread(target=_work, name="fjit-c-kernels", daemon=True)]
                    _WORKER[0].start()
            return binary
    if binary.queued:
        binary.done.wait()
    else:
        _build(binary)
    return binary


def _work() -> None:
    delay = config.c_build_delay()      # stress testing: builds land at random points
    while True:
        try:
            binary = _QUEUE.get(timeout=5.0)
        except queue.Empty:
            with _LOCK:
                if _QUEUE.empty():
                    _WORKER.clear()
                    return
            continue
        if delay:
            time.sleep(random.uniform(0, delay))
        _build(binary)


def pending() -> bool:
    """Whether a queued kernel is not built yet."""
    with _LOCK:
        return any(b.queued and not b.done.is_set() for b in list(_BINARIES.values()))


def wait(timeout: float = 60.0) -> bool:
    """Block until every queued kernel is built or failed (tests and benchmarks); False on timeout."""
    with _LOCK:
        pending = [b for b in list(_BINARIES.values()) if b.queued and not b.done.is_set()]
    return all(b.done.wait(timeout) for b in pending)


def _so_path(name: str) -> str:
    return os.path.join(kernel_cache_dir(), f"{name}.so")


def _load_from_disk(binary: Binary) -> bool:
    """Load the kernel's binary if an earlier build left one; a broken one is built again."""
    path = _so_path(binary.kernel.name)
    if not os.path.exists(path):
        return False
    try:
        _load(binary, path)
    except (OSError, AttributeError):
        return False
    return True


def _build(binary: Binary) -> None:
    kernel = binary.kernel
    path = _so_path(kernel.name)
    try:
        if not _load_from_disk(binary):
            start = time.perf_counter()
            build_library(HEADER + kernel.source + entry(kernel.name, kernel.arg_types), path, kernel_flags())
            _BUILT[0] += 1
            _load(binary, path)
            log.debug("C kernel %s built in %.0f ms (%s):\n%s", kernel.name,
                      1e3 * (time.perf_counter() - start), path, kernel.source)
    except (OSError, AttributeError, TypeError, ctypes.ArgumentError, subprocess.SubprocessError) as e:
        binary.error = str(e)
        if not _WARNED:
            _WARNED.append(True)
            warnings.warn(f"fjit: building a C kernel failed, so its region runs as torch calls "
                          f"(set FJIT_C_KERNELS=0 to stop trying): {e}", RuntimeWarning)
    finally:
        binary.done.set()


def _load(binary: Binary, path: str) -> None:
    library = ctypes.CDLL(path)
    fn = getattr(library, binary.kernel.name)
    fn.argtypes = [_ARG_TYPES[t] for t in binary.kernel.arg_types]
    fn.restype = None
    binary.fast = python_entry(library, binary.kernel.name)
    binary.fn = fn
    binary.done.set()
    if hasattr(_ctypes, "dlclose"):     # ctypes never unloads a library by itself
        # A launcher running the kernel keeps `binary` alive through its globals, so this runs
        # only when nothing can call the kernel; not at exit, where nothing is gained.
        weakref.finalize(binary, _ctypes.dlclose, library._handle).atexit = False


def _after_fork_in_child() -> None:
    """The worker thread does not survive fork: requeue what it had not built."""
    global _LOCK, _QUEUE
    _LOCK, _QUEUE = threading.Lock(), queue.SimpleQueue()
    _WORKER.clear()
    for binary in list(_BINARIES.values()):
        if binary.fn is None and binary.error is None:
            binary.queued = False
            binary.done = threading.Event()


os.register_at_fork(after_in_child=_after_fork_in_child)
