"""Every option fjit has: the options of `fjit.jit` (enums), the internal modes they map to, and
the `FJIT_*` environment variables, each with its doc.  Options are parsed by `parse` and only
there, so a bad value's error lists exactly the values that are accepted.

Environment variables are read when they are used (compile time, never on a cached call), so a
test or a notebook may change them between compilations; FJIT_LOGS is read when fjit is imported.

| variable | values | what it does |
|---|---|---|
| FJIT_DISABLE | 1 | every jitted function calls the Python function eagerly (nothing is traced) |
| FJIT_LOGS | recompiles,traces,kernels (any of them, or all) | turns on fjit's loggers, to stderr |
| FJIT_CHECK | 1 | check mode: every stage runs and is compared with the first; torch fallbacks' real layouts are checked; a symbolic program's kernel reused at new sizes is checked against a fresh generation |
| FJIT_C_KERNELS | background (default), sync, 0 | when C kernels are built: in a background thread, before the compile returns, or never |
| FJIT_KERNEL_SIZES | auto (default), runtime, specialized | a C or Triton kernel's sizes: literals for a kernel's first sizes, then the sizes that changed as parameters (one build then serves every sequence length and batch size); always parameters; always literals (fjit/executors/runtime_sizes.py) |
| FJIT_MEASURE | auto (default), 0, all | whether a program times its forms on its second call (or the first after its C kernels are built) and keeps the fastest (fjit/program_choice.py): for training programs of at least 32 ops the joint backward, torch autograd, and (CPU 2-D convolutions) torch autograd over channels-last convolutions; kernels against torch calls for forwards of at least 2^20 input elements; never; or every program |
| FJIT_VERBOSE | 1 | an fjit error's traceback keeps fjit's own frames (by default it shows the user's and their libraries' frames only) |
| FJIT_KEEP_FORM | 0, 1, 2 | stress testing: every measured choice still times its forms but keeps the form at that position (0: the joint program or the program with kernels; 1: torch autograd or the torch calls; 2: torch autograd over channels-last convolutions), where it has one (else the fastest) |
| FJIT_C_BUILD_DELAY | seconds | stress testing: each background C kernel build waits a random time up to this first, so programs switch from torch calls to kernels at random points between calls |
| FJIT_FRAME_CACHE | 1 (default), 0 | on CPython 3.11 and 3.12, keep a few freed frame-stack chunks for reuse (fjit/executors/c/frame_stack.py: a call crossing a chunk's end otherwise maps and unmaps memory every time, as 3.13+ no longer does) |
| FJIT_GEMM | auto (default), torch, onednn | who computes a float32 CPU linear layer's matmuls of at least 2^20 multiply-adds: the faster of torch's matmul and oneDNN's 1x1 convolution, timed once per shape and process (fjit/passes/gemms.py), and likewise a 2-D convolution's weight gradient over at most 4 output positions an image: oneDNN's or a GEMM over the input's patches; torch's always (the weight gradient as the GEMM wherever it applies); oneDNN's wherever the layouts allow, at any size |
| FJIT_TRITON_CPU | 0 | with TRITON_INTERPRET=1, keep CPU tensors away from the Triton interpreter |
| FJIT_TRITON_DUMP_TARGET | a directory | every Triton kernel built is also written there as generated for a GPU, for `python -m fjit.executors.triton.target DIR` (compiles them for sm_90/sm_80, reports spills) |
| FJIT_TRITON_LAUNCH | compiled (default), jit | on a GPU: call each kernel compiled once through a pre-bound launcher, or through `kernel[grid]` |
| FJIT_CACHE_SIZE | a positive integer (default 64) | how many programs one jitted function keeps; past it, the least recently used goes |
| FJIT_CACHE_DIR | a directory | where generated kernels are kept (default ~/.cache/fjit/kernels) |
| FJIT_SLOW_TESTS | 1 | the test suite only: also run the long sweeps marked `slow` (tests/conftest.py) |
"""
from __future__ import annotations

import enum
import os
from typing import TypeVar

# -- the options of fjit.jit ------------------------------------------------------------------


class SharpEdges(enum.Enum):
    """`sharp_edges=`: what a sharp edge does."""
    ERROR = "error"     # raise it (the default)
    WARN = "warn"       # one SharpEdgeWarning per edge, compile what a permissive tracer would
    ALLOW = "allow"     # compile the same program silently


class CacheMode(enum.Enum):
    """`cache=`: when a compiled program is reused."""
    METADATA = "metadata"   # one program per input metadata, floats runtime values, and a dim whose
    #                         value changes between calls a symbol from the next compile on
    STATIC = "static"       # one program per shape: sizes never symbolic
    SYMBOLIC = "symbolic"   # every dim of size 2 or more symbolic from the first compile
    NONE = None             # retrace on every call


# `executors=`: who runs the program, tried in the given order (fjit/executors/ registers them):
# "triton" fuses CUDA tensors (CPU ones under TRITON_INTERPRET=1), "c" CPU tensors, and "torch"
# runs everything else as direct torch calls.
DEFAULT_EXECUTORS = ("triton", "c", "torch")

# -- internal modes (not options a user passes) -----------------------------------------------


class TraceMode(enum.Enum):
    """How a trace treats sharp edges: the user's SharpEdges, plus fjit.diagnose's own mode."""
    ERROR = "error"
    WARN = "warn"
    ALLOW = "allow"
    DIAGNOSE = "diagnose"   # collect every edge, never raise (fjit.diagnose)

    @classmethod
    def of(cls, option: SharpEdges) -> "TraceMode":
        return cls(option.value)


class CKernels(enum.Enum):
    """FJIT_C_KERNELS: when the C executor builds its kernels."""
    BACKGROUND = "background"   # on one background thread; torch calls run until it is loaded
    SYNC = "sync"               # before the compile returns (tests and benchmarks)
    OFF = "0"                   # never: the C executor claims nothing


class KernelSizes(enum.Enum):
    """FJIT_KERNEL_SIZES: whether a C kernel's sizes are literals or parameters (runtime_sizes.py)."""
    AUTO = "auto"                 # literals for a source's first sizes, parameters from its second
    RUNTIME = "runtime"           # always parameters (tests: every kernel as a later size gets it)
    SPECIALIZED = "specialized"   # always literals: a build per size


class Measure(enum.Enum):
    """FJIT_MEASURE: which programs time their compiled form against torch's (program_choice.py)."""
    AUTO = "auto"       # training programs of MIN_OPS ops, forwards of MIN_NUMEL input elements
    NEVER = "0"         # the compiled form always runs where it is built (deterministic choice)
    ALL = "all"         # every program with a joint backward or kernels (tests)


class Gemm(enum.Enum):
    """FJIT_GEMM: who computes a float32 CPU matmul of a linear layer's form (passes/gemms.py)."""
    AUTO = "auto"       # the faster of torch's matmul and oneDNN's 1x1 convolution, timed per shape
    TORCH = "torch"     # always torch's matmul (a convolution's weight gradient too, where it may)
    ONEDNN = "onednn"   # oneDNN's convolution wherever the operands' layouts allow (tests)


class LogTopic(enum.Enum):
    """FJIT_LOGS: the loggers it turns on (logger fjit.<value>)."""
    RECOMPILES = "recompiles"   # why a call compiled again: the key field that changed
    TRACES = "traces"           # every stage of every compilation, as Python
    KERNELS = "kernels"         # generated kernels: source, build time, cache hits


_E = TypeVar("_E", bound=enum.Enum)

# Spellings accepted besides an enum's values (an environment variable cannot say None).
_ALIASES = {CKernels: {"off": CKernels.OFF}, CacheMode: {"none": CacheMode.NONE},
            Measure: {"off": Measure.NEVER, "never": Measure.NEVER}}
_NOT_YET: dict = {}


def parse(enum_cls: type[_E], value, option: str) -> _E:
    """The member of `enum_cls` that `value` names; a ValueError listing the allowed values
    (and saying where the value came from: `option`, e.g. "fjit.jit: cache") if none does."""
    if isinstance(value, enum_cls):
        return value
    for member in enum_cls:
        if member.value == value:
            return member
    alias = _ALIASES.get(enum_cls, {}).get(value)
    if alias is not None:
        return alias
    allowed = ", ".join(repr(m.value) for m in enum_cls)
    hint = f" ({_NOT_YET[value]})" if isinstance(value, str) and value in _NOT_YET else ""
    raise ValueError(f"{option}={value!r} is not one of {allowed}{hint}")


# -- environment variables ----------------------------------------------------------------------


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def disabled() -> bool:
    """FJIT_DISABLE=1: jitted functions run the Python function eagerly."""
    return _flag("FJIT_DISABLE")


def check_mode() -> bool:
    """FJIT_CHECK=1: check mode (see docs/design.md)."""
    return os.environ.get("FJIT_CHECK") == "1"


def c_kernels() -> CKernels:
    """FJIT_C_KERNELS: background (default), sync or 0."""
    return parse(CKernels, os.environ.get("FJIT_C_KERNELS", "background"),
                 "fjit: FJIT_C_KERNELS")


def kernel_sizes() -> KernelSizes:
    """FJIT_KERNEL_SIZES: auto (default), runtime or specialized."""
    return parse(KernelSizes, os.environ.get("FJIT_KERNEL_SIZES", "auto"), "fjit: FJIT_KERNEL_SIZES")


def measure() -> Measure:
    """FJIT_MEASURE (see the table above)."""
    return parse(Measure, os.environ.get("FJIT_MEASURE", "auto"), "FJIT_MEASURE")


def verbose() -> bool:
    """FJIT_VERBOSE=1: errors keep fjit's own traceback frames (errors.user_traceback)."""
    return _flag("FJIT_VERBOSE")


def kept_form() -> int | None:
    """FJIT_KEEP_FORM (see the table above): the measured choice's forced form, or None."""
    value = os.environ.get("FJIT_KEEP_FORM", "").strip()
    if value not in ("", "0", "1", "2"):
        raise ValueError(f"fjit: FJIT_KEEP_FORM={value!r} is not one of '0', '1', '2'")
    return int(value) if value else None


def c_build_delay() -> float:
    """FJIT_C_BUILD_DELAY (see the table above): the longest wait before a background build."""
    value = os.environ.get("FJIT_C_BUILD_DELAY", "").strip()
    try:
        delay = float(value) if value else 0.0
    except ValueError:
        delay = -1.0
    if not delay >= 0:
        raise ValueError(f"fjit: FJIT_C_BUILD_DELAY={value!r} is not a number of seconds >= 0")
    return delay


def frame_cache() -> bool:
    """FJIT_FRAME_CACHE (see the table above)."""
    return os.environ.get("FJIT_FRAME_CACHE", "1").strip() != "0"


def gemm() -> Gemm:
    """FJIT_GEMM (see the table above)."""
    return parse(Gemm, os.environ.get("FJIT_GEMM", "auto"), "FJIT_GEMM")


def triton_on_cpu() -> bool:
    """Whether CPU tensors go to Triton's interpreter: TRITON_INTERPRET=1, unless FJIT_TRITON_CPU=0."""
    return os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("FJIT_TRITON_CPU") != "0"


def triton_interpret() -> bool:
    """TRITON_INTERPRET=1: Triton interprets every kernel (no libdevice, no compiled launcher)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def triton_compiled_launch() -> bool:
    """FJIT_TRITON_LAUNCH: compiled (the default) or jit (kernel[grid] on every call)."""
    value = os.environ.get("FJIT_TRITON_LAUNCH", "compiled")
    if value not in ("compiled", "jit"):
        raise ValueError(f"fjit: FJIT_TRITON_LAUNCH={value!r} is not one of 'compiled', 'jit'")
    return value == "compiled"


def triton_dump_target() -> str | None:
    """FJIT_TRITON_DUMP_TARGET: where to write every Triton kernel built, as generated for a GPU."""
    return os.environ.get("FJIT_TRITON_DUMP_TARGET") or None


def cache_size() -> int:
    """FJIT_CACHE_SIZE: programs kept per jitted function (the least recently used evicted)."""
    raw = os.environ.get("FJIT_CACHE_SIZE", "").strip()
    if not raw:
        return 64
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"fjit: FJIT_CACHE_SIZE={raw!r} is not a positive integer (programs kept per "
                         f"jitted function)")
    return size


def kernel_cache_root() -> str:
    """FJIT_CACHE_DIR, or ~/.cache/fjit/kernels."""
    return os.environ.get("FJIT_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "fjit", "kernels")


def log_topics() -> list[LogTopic]:
    """FJIT_LOGS: a comma-separated list of LogTopic values, or 'all'."""
    value = os.environ.get("FJIT_LOGS", "").strip()
    if not value:
        return []
    if value == "all":
        return list(LogTopic)
    return [parse(LogTopic, part.strip(), "fjit: FJIT_LOGS") for part in value.split(",")
            if part.strip()]
