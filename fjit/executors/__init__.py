"""Executors turn the final trace into what runs: torch calls, Triton kernels, C kernels."""
from __future__ import annotations

import os
import tempfile


def kernel_cache_dir() -> str:
    """Where generated kernel sources and binaries are kept across processes (FJIT_CACHE_DIR)."""
    path = os.environ.get("FJIT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fjit", "kernels")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        path = tempfile.mkdtemp(prefix="fjit-kernels-")
    return path
