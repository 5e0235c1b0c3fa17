"""Shared machinery of the fjit benchmark suites: timers, interleaved measurement, candidate
preparation (eager / fjit / torch.compile of one function, each checked against eager before it is
timed), pass/miss targets, tables and JSON results.

Every figure the suites report is a ratio of medians measured in the same process and in the same
rounds: each round times every candidate once, in an order rotated from round to round, so slow
drift of the machine (frequency, other load) affects all candidates alike.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import operator
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

import fjit

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

Thunk = Callable[[], Any]


# --------------------------------------------------------------------------------------------
# timers


class CpuTimer:
    """Wall-clock time per call (perf_counter_ns) over ``iters`` back-to-back calls.

    With ``cuda_sync`` the sample ends with a device synchronize, so it measures the sustained
    throughput of calls (host overhead and device time, whichever is larger)."""

    name = "perf_counter_ns"

    def __init__(self, cuda_sync: bool = False):
        self.cuda_sync = cuda_sync

    def sync(self) -> None:
        if self.cuda_sync:
            torch.cuda.synchronize()

    def sample(self, fn: Thunk, iters: int) -> float:
        self.sync()
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            fn()
        self.sync()
        return (time.perf_counter_ns() - t0) / iters


class CudaEventTimer:
    """Device time per call, measured as triton.testing.do_bench does: a CUDA event pair around
    each call, the L2 cache flushed before each call (outside the events) by writing a buffer
    larger than L2, the sample being the median over ``iters`` calls. The flush also gives the
    host a head start, so host overhead of the call does not show as device idle time."""

    name = "cuda_events"

    def __init__(self, flush_bytes: int = 256 * 2**20):
        self.flush_buffer = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda")

    def sync(self) -> None:
        torch.cuda.synchronize()

    def sample(self, fn: Thunk, iters: int) -> float:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        for start, end in zip(starts, ends):
            self.flush_buffer.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) * 1e6 for s, e in zip(starts, ends))


# --------------------------------------------------------------------------------------------
# measurement


@dataclasses.dataclass(frozen=True)
class Stats:
    median_ns: float
    p10_ns: float
    p90_ns: float
    samples: int
    iters: int
    values_ns: tuple[float, ...] = ()    # the samples, in round order

    @property
    def median_us(self) -> float:
        return self.median_ns / 1e3

    @classmethod
    def of(cls, samples: Sequence[float], iters: int) -> "Stats":
        s = sorted(samples)
        pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
        return cls(statistics.median(s), pick(0.1), pick(0.9), len(s), iters, tuple(samples))

    def to_json(self) -> dict:
        return {"median_us": self.median_us, "p10_us": self.p10_ns / 1e3,
                "p90_us": self.p90_ns / 1e3, "samples": self.samples, "iters": self.iters,
                "samples_us": [round(v / 1e3, 4) for v in self.values_ns]}


def paired_ratio(stats: Mapping[str, Stats], a: str, b: str) -> float | None:
    """Median over rounds of a's sample divided by b's sample of the same round: the two samples
    of a round are taken back to back, so this cancels drift of the machine better than a ratio
    of medians. None if either candidate was not measured."""
    if a not in stats or b not in stats:
        return None
    return statistics.median(x / y for x, y in zip(stats[a].values_ns, stats[b].values_ns))


def measure(candidates: Mapping[str, Thunk], timer, *, rounds: int, iters: int,
            warmup: int = 3) -> dict[str, Stats]:
    """Median time per call of each candidate, measured in interleaved rounds."""
    names = list(candidates)
    for name in names:
        for _ in range(warmup):
            candidates[name]()
    timer.sync()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            samples[name].append(timer.sample(candidates[name], iters))
    return {n: Stats.of(samples[n], iters) for n in names}


def calibrate_iters(fn: Thunk, timer, target_ns: float, max_iters: int = 100_000) -> int:
    """Calls per sample so that one sample lasts about ``target_ns``."""
    fn()
    per_call = timer.sample(fn, 1)
    if per_call * 3 < target_ns:
        per_call = timer.sample(fn, max(1, int(target_ns / 10 / max(per_call, 1.0))))
    return int(min(max_iters, max(1, round(target_ns / max(per_call, 1.0)))))


def time_once_ns(fn: Thunk, sync: Callable[[], None] = lambda: None) -> int:
    sync()
    t0 = time.perf_counter_ns()
    fn()
    sync()
    return time.perf_counter_ns() - t0


def fresh_function(source: str, name: str, namespace: Mapping[str, Any]) -> Callable:
    """A new function object with its own code object, compiled from ``source`` (which defines
    ``name``), so no compiler can find it in a cache keyed by function or code object."""
    scope = dict(namespace)
    exec(compile(source, f"<benchmark {name}>", "exec"), scope)
    return scope[name]


def isolate_compiler_caches() -> str:
    """Point fjit's, Inductor's and Triton's disk caches at a fresh temporary directory (removed
    at exit), so compile times are cold for fjit and torch.compile, whatever earlier runs left."""
    root = tempfile.mkdtemp(prefix="fjit-bench-cache-")
    os.environ.update(fresh_cache_env(root))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


def fresh_cache_env(root: str) -> dict[str, str]:
    return {"FJIT_CACHE_DIR": os.path.join(root, "fjit"),
            "TORCHINDUCTOR_CACHE_DIR": os.path.join(root, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(root, "triton")}


def run_in_fresh_process(source: str, timeout_s: float = 600) -> dict:
    """Run ``source`` in a new interpreter (repository root on its path, fresh compiler caches)
    and return the JSON object it prints on its last line of output."""
    root = tempfile.mkdtemp(prefix="fjit-bench-proc-")
    env = dict(os.environ, **fresh_cache_env(root), PYTHONPATH=os.pathsep.join(filter(None, [
        str(REPO_ROOT), os.environ.get("PYTHONPATH")])))
    try:
        proc = subprocess.run([sys.executable, "-c", source], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit status {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------------------------
# candidates: eager, fjit and torch.compile of one function, each checked before it is timed


def describe_error(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}{where}"


def check_close(actual: Any, expected: Any, rtol: float | None = None,
                atol: float | None = None) -> str | None:
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)
    except (AssertionError, TypeError, ValueError) as exc:
        return " ".join(str(exc).split())[:300]
    return None


@dataclasses.dataclass
class Prepared:
    """The timeable candidates of one function; a candidate that raised or computed a wrong result
    is not timed and its error is kept instead."""

    candidates: dict[str, Thunk]
    errors: dict[str, str]
    jitted: Any = None

    def fjit_misses(self) -> int | None:
        if self.jitted is None:
            return None
        try:
            return fjit.cache_info(self.jitted).misses
        except Exception:  # noqa: BLE001 - a broken cache_info is reported, not fatal
            return None


def prepare(fn: Callable, args: Sequence[Any], *, fjit_options: Mapping[str, Any],
            use_compile: bool = True, compile_options: Mapping[str, Any] | None = None,
            rtol: float | None = None, atol: float | None = None,
            sync: Callable[[], None] = lambda: None) -> Prepared:
    expected = fn(*args)
    candidates: dict[str, Thunk] = {"eager": lambda: fn(*args)}
    errors: dict[str, str] = {}
    jitted = fjit.jit(fn, **fjit_options)
    compiled = torch.compile(fn, **(compile_options or {})) if use_compile else None
    for name, impl in (("fjit", jitted), ("compile", compiled)):
        if impl is None:
            continue
        try:
            impl(*args)              # first call: trace and compile
            actual = impl(*args)     # second call: the cached path that is timed
            sync()
        except Exception as exc:  # noqa: BLE001 - a failing candidate is a result, not a crash
            errors[name] = describe_error(exc)
            continue
        mismatch = check_close(actual, expected, rtol, atol)
        if mismatch:
            errors[name] = f"wrong result: {mismatch}"
        else:
            candidates[name] = (lambda impl: lambda: impl(*args))(impl)
    return Prepared(candidates, errors, jitted)


# --------------------------------------------------------------------------------------------
# targets, tables, results


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    op: str          # one of COMPARE
    threshold: float

    COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "N/A"
        return "PASS" if self.COMPARE[self.op](self.value, self.threshold) else "MISS"

    def line(self) -> str:
        value = "n/a" if self.value is None else f"{self.value:.4g}"
        return f"  [{self.verdict:4}] {self.name}: {value} (target {self.op} {self.threshold:g})"

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "op": self.op,
                "threshold": self.threshold, "verdict": self.verdict}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    line = lambda cells: "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _git_revision() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "no commit"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Blocks up to 1 GiB come from the heap (older glibc refuses more than 32 MiB, the most its dynamic
# threshold reaches: then that)
_MMAP_THRESHOLDS = (1 << 30, 32 << 20)
_allocator = "default"


def pin_allocator() -> str:
    """Keep freed heap memory mapped, for every candidate of the process alike.

    By default glibc hands the top of its heap back to the system whenever more than a (dynamic)
    threshold of it is free, and maps it afresh on the next allocation: a page fault per 4 KiB.
    Whether a training step's frees leave that much free at the top depends on the order of every
    allocation in the process so far, so the same model and code take 0 or 20,000 faults a step from
    one process to the next (MLP-Mixer: 50-100 MB of weight gradients refaulted, 0.75x to 1.8x eager
    between processes, eager itself split alike).  Blocks over the mmap threshold are mapped and
    unmapped on every allocation, so a step that allocates them faults them in every time (AlexNet's
    150 MB classifier gradient: 56,000 faults a step, about its whole step time, for eager and fjit
    alike).  Pinning the trim threshold and raising the mmap threshold to 1 GiB takes both out of
    the comparison; benchmark setups usually do the same with jemalloc's decay settings.
    Returns what the process runs with, for the results' environment: "glibc-pinned" or "default"
    (not glibc, or mallopt refused).
    """
    global _allocator
    if _allocator != "default" or not sys.platform.startswith("linux"):
        return _allocator
    import ctypes
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return _allocator
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if any(mallopt(_M_MMAP_THRESHOLD, t) == 1 for t in _MMAP_THRESHOLDS) and \
            mallopt(_M_TRIM_THRESHOLD, 2**31 - 1) == 1:
        _allocator = "glibc-pinned"
    return _allocator


def environment() -> dict:
    env = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "fjit_revision": _git_revision(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
        "allocator": _allocator,
    }
    try:
        import triton
        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        env["cuda_device"] = torch.cuda.get_device_name()
        env["cuda"] = torch.version.cuda
    return env


def write_json(filename: str, payload: dict) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / filename
    path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return path


def print_targets(targets: Sequence[Target]) -> None:
    print("targets:")
    for t in targets:
        print(t.line())
    counts = {v: sum(t.verdict == v for t in targets) for v in ("PASS", "MISS", "N/A")}
    print("  " + ", ".join(f"{n} {v}" for v, n in counts.items()))
