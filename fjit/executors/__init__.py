"""Executors turn the final trace into what runs: torch calls, Triton kernels, C kernels."""
from __future__ import annotations

import os
import tempfile

_FALLBACK_DIRS: dict[str, str] = {}   # an unwritable cache directory -> this process's temp dir


def kernel_cache_dir() -> str:
    """Where generated kernel sources and binaries are kept across processes (FJIT_CACHE_DIR).
    If that directory cannot be made, a temporary one serves this process (one, not one per call)."""
    path = os.environ.get("FJIT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fjit", "kernels")
    if path in _FALLBACK_DIRS:
        return _FALLBACK_DIRS[path]
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        path = _FALLBACK_DIRS.setdefault(path, tempfile.mkdtemp(prefix="fjit-kernels-"))
    return path
