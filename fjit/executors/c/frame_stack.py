"""A cache of CPython's frame-stack chunks, for CPython 3.11 and 3.12 (installed once a process).

CPython 3.11+ keeps Python frames in chunks (16 KiB and up) of a per-thread stack.  A call whose
frame does not fit in the current chunk maps a new one, and its return unmaps it, so a call made
at a depth where its frame crosses a chunk's end maps and unmaps memory every time (a system call
each way, page faults on the fresh pages, an inter-processor interrupt to flush the other threads'
TLBs: 10-100 us).  A training step makes hundreds of Python calls at the depth its caller happens
to be at (kernel launchers, torch's Python wrappers, autograd.Function.apply), so the same step of
LeViT-128S read 0.92x eager's time at three caller depths and 1.03x at a fourth.  CPython fixed it
in 3.13 and 3.14 by keeping one freed chunk per thread (gh-142183); 3.11 and 3.12 keep none.

Chunks come from the interpreter's arena allocator (PyObject_SetArenaAllocator, a public API),
which also serves pymalloc's 1 MiB arenas.  This installs an allocator in front of it that keeps up
to SLOTS freed blocks of at most MAX_BYTES (the frame-stack chunks; arenas are larger and pass
through), the last ones freed (a full cache gives back the block it kept longest), handing one back
for a request of the same size: a call that crosses a chunk's end then costs a pointer swap.  It holds at most SLOTS * MAX_BYTES of memory, and every block it does not
keep goes to the allocator it replaced.  FJIT_FRAME_CACHE=0 leaves the interpreter as it is.

It is C (built once per machine into the kernel cache directory, like the kernels): the allocator
runs inside the interpreter's own allocation paths, where no Python may run.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import sysconfig
import threading

import fjit.config as config
from fjit.executors import kernel_cache_dir
from fjit.logs import kernels as log

SLOTS = 4
MAX_BYTES = 64 * 1024
SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

static PyObjectArenaAllocator fj_next;
static void *fj_block[%(slots)d];
static size_t fj_size[%(slots)d];
static int fj_victim;
static char fj_busy;   /* the allocator runs under the GIL; the lock is for interpreters with their own */

static void fj_lock(void) { while (__atomic_test_and_set(&fj_busy, __ATOMIC_ACQUIRE)) ; }
static void fj_unlock(void) { __atomic_clear(&fj_busy, __ATOMIC_RELEASE); }

static void *fj_alloc(void *ctx, size_t size) {
    void *p = NULL;
    if (size <= %(max_bytes)d) {
        fj_lock();
        for (int i = 0; i < %(slots)d; i++)
            if (fj_block[i] != NULL && fj_size[i] == size) { p = fj_block[i]; fj_block[i] = NULL; break; }
        fj_unlock();
    }
    return p != NULL ? p : fj_next.alloc(fj_next.ctx, size);
}

/* keeps the block freed last: where every slot is taken, the one kept longest goes back */
static void fj_free(void *ctx, void *p, size_t size) {
    void *old = NULL;
    size_t old_size = 0;
    if (p == NULL || size > %(max_bytes)d) {
        fj_next.free(fj_next.ctx, p, size);
        return;
    }
    fj_lock();
    int slot = -1;
    for (int i = 0; i < %(slots)d && slot < 0; i++)
        if (fj_block[i] == NULL) slot = i;
    if (slot < 0) {
        slot = fj_victim;
        fj_victim = (fj_victim + 1) %% %(slots)d;
        old = fj_block[slot];
        old_size = fj_size[slot];
    }
    fj_block[slot] = p;
    fj_size[slot] = size;
    fj_unlock();
    if (old != NULL) fj_next.free(fj_next.ctx, old, old_size);
}

/* called holding the GIL (ctypes.PyDLL); 1 where it installed the cache, 0 where it was there */
int fjit_install_frame_cache(void) {
    PyObjectArenaAllocator current, mine = {NULL, fj_alloc, fj_free};
    PyObject_GetArenaAllocator(&current);
    if (current.alloc == fj_alloc) return 0;
    fj_next = current;
    PyObject_SetArenaAllocator(&mine);
    return 1;
}

/* whether the cache is the interpreter's arena allocator */
int fjit_frame_cache_installed(void) {
    PyObjectArenaAllocator current;
    PyObject_GetArenaAllocator(&current);
    return current.alloc == fj_alloc;
}
""" % {"slots": SLOTS, "max_bytes": MAX_BYTES}

_LIBRARY: list = []       # [the loaded library]: never unloaded, the interpreter calls into it
_STARTED: list = []
_LOCK = threading.Lock()


def wanted() -> bool:
    """Whether this interpreter gets the cache: CPython 3.11 or 3.12 (3.13 and later keep a chunk
    themselves), with FJIT_FRAME_CACHE not 0."""
    return sys.implementation.name == "cpython" and (3, 11) <= sys.version_info[:2] <= (3, 12) \
        and config.frame_cache()


def install() -> bool:
    """Build (once per machine) and install the cache; whether it is installed.  Without a C
    compiler or Python's headers the interpreter stays as it is."""
    # the C executor is imported by the first CPU compile, not by `import fjit`: nor is its build
    from fjit.executors.c.build import build_library, compiler
    with _LOCK:
        if _LIBRARY:
            return bool(_LIBRARY[0].fjit_frame_cache_installed())
        include = sysconfig.get_paths().get("include") or ""
        if not wanted() or compiler() is None or not os.path.exists(os.path.join(include, "Python.h")):
            return False
        digest = hashlib.sha1((SOURCE + sys.version + include).encode()).hexdigest()[:16]
        path = os.path.join(kernel_cache_dir(), f"fjit_frame_cache_{digest}.so")
        try:
            if not os.path.exists(path):
                build_library(SOURCE, path, ("-O2", "-shared", "-fPIC", f"-I{include}"))
            library = ctypes.PyDLL(path)      # calls hold the GIL
            library.fjit_install_frame_cache()
        except (OSError, AttributeError, subprocess.SubprocessError) as e:
            log.debug("frame-stack chunk cache not installed: %s", e)
            return False
        _LIBRARY.append(library)
        log.debug("frame-stack chunk cache installed (%s)", path)
        return True


def install_in_background() -> None:
    """install() on a daemon thread, once a process (the first compile starts it: building the
    library takes ~0.2 s the first time on a machine)."""
    if _STARTED or not wanted():
        return
    _STARTED.append(True)
    threading.Thread(target=install, name="fjit-frame-cache", daemon=True).start()


def _after_fork_in_child() -> None:
    """A fork while the builder thread held the lock must not leave the child's held forever."""
    global _LOCK
    _LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
