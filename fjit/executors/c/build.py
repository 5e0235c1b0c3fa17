"""How C source becomes a loaded library: the compiler, the flags kernels are built with, what names a
binary besides its source (`build_key`), and `build_library`, which compiles a source into a
shared library in the kernel cache directory.  The C executor's kernels (executor.py) and the
frame-stack chunk cache (frame_stack.py) are both built here.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import threading

from fjit.executors.c.launch import PYTHON_FLAGS
from fjit.logs import kernels as log

_COMPILER: list = []   # [path or None], found once


def compiler() -> str | None:
    """$CC, else cc, else gcc, where it is on PATH; None without one."""
    if not _COMPILER:
        cc = os.environ.get("CC")
        _COMPILER.append(shutil.which(cc) if cc else shutil.which("cc") or shutil.which("gcc"))
    return _COMPILER[0]


# Never -ffast-math (a library built with it can switch on flush-to-zero for the whole process, and
# it drops NaN/inf/signed-zero semantics).  -fno-math-errno / -fno-trapping-math change no result.
# -fopenmp: the kernels share torch's libgomp (same soname, already loaded); a compiler without
# OpenMP builds the same source without it (the pragmas are then ignored: one thread).
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")
CFLAGS = ("-O3", "-march=native", *(("-mprefer-vector-width=512",) if _X86 else ()), "-shared",
          "-fPIC", "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
          "-fopenmp")
_NO_OPENMP: list = []     # [True] once the compiler refused -fopenmp
# Inside an OpenMP region gcc no longer knows the kernel's restrict pointers apart, so it vectorizes
# a loop only behind runtime alias checks, 10 at most by default: a layer norm backward with its
# weight and bias gradients (a dozen pointers and three column sums) stayed scalar, 3x eager's
# time.  The cap is raised for gcc (clang has no such parameter).
GCC_PARAMS = ("--param", "vect-max-version-for-alias-checks=128")
_GCC: list = []           # [whether compiler() is gcc], found once


def kernel_flags() -> tuple:
    """The flags a kernel is built with (CFLAGS, Python's, and gcc's parameters for gcc; without
    -fopenmp once the compiler refused it); asked by the build, not by the compile that only names
    the binary."""
    if not _GCC:
        try:
            version = subprocess.run([compiler(), "--version"], capture_output=True, text=True,
                                     timeout=30).stdout
        except (OSError, subprocess.SubprocessError, TypeError):
            version = ""
        _GCC.append("Free Software Foundation" in version and "clang" not in version.lower())
    flags = CFLAGS + PYTHON_FLAGS + (GCC_PARAMS if _GCC[0] else ())
    return tuple(f for f in flags if not (_NO_OPENMP and f == "-fopenmp"))


_ISA: list = []           # [the machine and its CPU flags], found once


def _isa() -> str:
    """What -march=native compiles for: the machine and its CPU feature flags (part of the key)."""
    if not _ISA:
        flags = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith(("flags", "Features", "isa")):
                        flags = line.split(":", 1)[1].strip()
                        break
        except OSError:
            flags = platform.processor()
        _ISA.append(f"{platform.machine()} {flags}")
    return _ISA[0]


def build_key() -> str:
    """What a kernel's binary is besides its source: the flags and the CPU they target, so that a
    change of either never loads an old one (gcc's parameters are in it whatever the compiler:
    finding out which one it is runs a subprocess, which only a build, in the background, should
    pay)."""
    return " ".join(CFLAGS + PYTHON_FLAGS + GCC_PARAMS) + "\n" + _isa() + "\n"


def build_library(source: str, path: str, flags: tuple) -> None:
    """Compile `source` with `flags` into the shared library `path`: written under a name of this
    process and thread, then renamed into place, so that no process ever loads a half-written
    binary and concurrent builds of one source do not collide.  A compiler that refuses -fopenmp
    builds the source without it (the pragmas are then ignored: one thread), and so do later
    builds.  OSError (with the compiler's message) where it fails."""
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}"
    with open(f"{tmp}.c", "w") as f:
        f.write(source)
    try:
        result = _compile(tmp, flags)
        if result.returncode != 0 and "-fopenmp" in flags:
            retry = _compile(tmp, tuple(f for f in flags if f != "-fopenmp"))
            if retry.returncode == 0:
                _NO_OPENMP.append(True)
                log.debug("C kernels: %s refused -fopenmp, building single-threaded", compiler())
                result = retry
    finally:
        os.remove(f"{tmp}.c")
    if result.returncode != 0:
        raise OSError(f"{compiler()} exited with {result.returncode}: "
                      f"{(result.stderr or result.stdout).strip()[-500:]}")
    os.replace(tmp, path)


def _compile(tmp: str, flags: tuple) -> subprocess.CompletedProcess:
    return subprocess.run([compiler(), *flags, "-o", tmp, f"{tmp}.c", "-lm"], capture_output=True,
                          text=True, timeout=300)
