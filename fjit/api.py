"""The public entry points: jit, last_traces, cache_info, diagnose.

A jitted function looks its program up in its ProgramCache (fjit/cache.py) and compiles on a miss,
under a lock; lookups do not take it.
"""
from __future__ import annotations

import enum
import functools
import os
import threading

import torch

from fjit import autodiff
from fjit.cache import CacheInfo, ProgramCache
from fjit.core.ir import Binding, Tag, Trace
from fjit.errors import SharpEdge
from fjit.executors import Executor, kernel_executor, torch_executor
from fjit.frontend.context import AMP_DEVICES, Mode, autocast_state, current
from fjit.frontend.inputs import MISS, call_key
from fjit.frontend.rng import rng_preserved, rng_snapshot
from fjit.frontend.tracer import scan_bindings, trace_function
from fjit.ops import TRACE_NAMESPACE
from fjit.passes.basic import constant_fold, cse, dce

DEFAULT_EXECUTORS = ("triton", "c", "torch")


class CacheMode(enum.Enum):
    METADATA = "metadata"   # one compiled program per input metadata (floats are runtime values)
    NONE = None             # retrace on every call


def _parse(enum_cls, value, option: str):
    """Options are parsed here and only here; a bad value's error lists the allowed ones."""
    if isinstance(value, enum_cls):
        return value
    for member in enum_cls:
        if member.value == value:
            return member
    allowed = ", ".join(repr(m.value) for m in enum_cls)
    hint = " ('symbolic' is not implemented yet)" if value == "symbolic" else ""
    raise ValueError(f"fjit.jit: {option}={value!r} is not one of {allowed}{hint}")


class JittedFunction:
    def __init__(self, fn, *, sharp_edges="error", executors=DEFAULT_EXECUTORS, cache="metadata"):
        if not callable(fn):
            raise TypeError(f"fjit.jit expects a function, got {type(fn).__qualname__}")
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._mode = _parse(Mode, sharp_edges, "sharp_edges")
        if self._mode is Mode.DIAGNOSE:
            raise ValueError("fjit.jit: sharp_edges='diagnose' is fjit.diagnose's; use 'error', "
                             "'warn' or 'allow'")
        if isinstance(executors, str):
            executors = (executors,)
        self._executors = tuple(_parse(Executor, e, "executors") for e in executors)
        self._cache = ProgramCache(keep=_parse(CacheMode, cache, "cache") is CacheMode.METADATA)
        self._lock = threading.Lock()
        self._last_traces: list[Trace] = []
        self._last_backward_traces: list[Trace] = []

    def __call__(self, *args, **kwargs):
        if not kwargs:
            cache = self._cache
            out = cache.fast_call(*args)
            if out is not MISS:
                cache.hits += 1
                return out
        return self._call(args, kwargs)

    def _call(self, args, kwargs):
        if current() is not None:          # called while tracing another function: inline it
            return self._fn(*args, **kwargs)
        cache = self._cache
        key, leaves = cache.key_and_leaves(args, kwargs)
        program = cache.get(key)
        first = _NOT_RUN
        if program is None:
            program, first = self._compile(key, args, kwargs, leaves)
        else:
            cache.hits += 1
        if not kwargs:
            cache.remember_fast(args, program)
        return program(*leaves) if first is _NOT_RUN else first

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def _compile(self, key, args, kwargs, leaves):
        cache = self._cache
        with self._lock:
            program = cache.get(key)
            if program is not None:
                cache.hits += 1
                return program, _NOT_RUN
            cache.misses += 1
            result, traces, first, executors = self._trace_with_real_layouts(args, kwargs, leaves)
            # An input requiring grad under grad mode: a compiled forward and backward, when
            # something in them fuses (else torch autograd runs the forward program's torch calls).
            joint = autodiff.compile_with_backward(
                traces[len(CLEANUP)], leaves, executors,
                lambda t, cleanup: optimize(t, executors, leaves, cleanup))
            if joint is not None:
                traces, program = joint.forward_traces, joint.program
            else:
                program = torch_executor.compile_trace(traces[-1])
            self._last_backward_traces = joint.backward_traces if joint is not None else []
            if any(b.sym.has(Tag.MODE) for b in traces[-1].bsyms):
                program = _restoring_modes_on_error(program)
            if os.environ.get("FJIT_CHECK") == "1":
                check_traces(traces, leaves)
            self._last_traces = traces
            cache.store(args, kwargs, key, program, result.specialized)
            return program, first

    def _trace_with_real_layouts(self, args, kwargs, leaves):
        """(trace result, stages, the first call's result or _NOT_RUN).  A program with opaque ops
        runs once op by op with torch; where an opaque op's real layout differs from its meta
        kernel's, the function is traced again with the real one (downstream layouts follow), and
        that run's result is this call's.  If layouts still disagree, only torch calls run."""
        observed: dict = {}
        for attempt in range(3):
            result = trace_function(self._fn, args, kwargs, leaves, self._mode, TRACE_NAMESPACE,
                                    observed)
            traces = optimize(result.trace, self._executors, leaves)
            # The traced stage, dead ops included: check mode checks every stage's layouts.
            traced = traces[0]
            if not torch_executor.has_opaque_ops(traced):
                return result, traces, _NOT_RUN, self._executors
            rewind = rng_snapshot(traced.bsyms)
            first, wrong = _restoring_modes_on_error(torch_executor.run_observing_layouts)(
                traced, leaves)
            if not wrong or attempt == 2:
                break
            rewind()      # the next run must draw what this one drew
            observed.update(wrong)
        if wrong:                # torch calls read any layout
            traces = optimize(result.trace, (Executor.TORCH,), leaves)
        return result, traces, first, (Executor.TORCH,) if wrong else self._executors

    def __repr__(self):
        return f"<fjit.jit of {self._fn!r}>"


def _restoring_modes_on_error(program):
    """A program that enters grad-mode or autocast regions leaves them as eager's `with` blocks do
    when an op raises (when it returns, the trace has already restored or kept them as eager)."""
    def run(*leaves):
        grad, amp = torch.is_grad_enabled(), autocast_state()
        try:
            return program(*leaves)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            for device, (on, dtype) in zip(AMP_DEVICES, amp):
                torch.set_autocast_enabled(device, on)
                torch.set_autocast_dtype(device, dtype)
            raise
    return run


_NOT_RUN = object()


CLEANUP = (dce, cse, constant_fold, dce)


def optimize(trace: Trace, executors: tuple, leaves: list, cleanup: bool = True) -> list[Trace]:
    """Every stage from the traced program to the one the generated function runs: the cleanup
    passes, then each kernel executor of `executors` in the user's order (a stage each that claims
    something; each sees what the earlier ones left), then the torch executor for the rest."""
    traces = [trace]
    for stage in CLEANUP if cleanup else ():
        traces.append(stage(traces[-1]))
    for option in executors:
        executor = kernel_executor(option)
        claimed = executor.claim(traces[-1], leaves) if executor is not None else None
        if claimed is not None:
            traces.append(claimed)
    traces.append(torch_executor.finalize(traces[-1]))
    return traces


def check_traces(traces: list[Trace], leaves: list) -> None:
    """Check mode (FJIT_CHECK=1): every stage's printed source runs and agrees with the first, and
    in every stage each torch fallback's real output has the shape, dtype and strides the trace
    recorded from meta tensors (an AssertionError names the op and both).  Stages are compared on
    their flat outputs (a rebuilt dataclass is not something assert_close compares); the
    rebuilding is the same function in every stage.  Every stage draws the same random numbers,
    and the generators are left as they were."""
    flat = [torch_executor.with_metadata_checks(t.with_stage(t.stage, rebuild=None)) for t in traces]
    with rng_preserved(traces[0].bsyms) as rewind:
        expected = flat[0].python_callable()(*leaves)
        for t in flat[1:]:
            rewind()
            got = t.python_callable()(*leaves)
            torch.testing.assert_close(got, expected, equal_nan=True,
                                       msg=lambda m: f"fjit check: stage {t.stage} differs: {m}")


def jit(fn=None, *, sharp_edges="error", executors=DEFAULT_EXECUTORS, cache="metadata"):
    """Compile `fn`; usable as `@jit` or `@jit(sharp_edges="warn", ...)`."""
    if fn is None:
        return functools.partial(jit, sharp_edges=sharp_edges, executors=executors, cache=cache)
    return JittedFunction(fn, sharp_edges=sharp_edges, executors=executors, cache=cache)


def last_traces(jf: JittedFunction) -> list[Trace]:
    """Every stage of `jf`'s last compilation, first to last."""
    if not isinstance(jf, JittedFunction):
        raise TypeError("fjit.last_traces expects a function made by fjit.jit")
    return list(jf._last_traces)


def last_backward_traces(jf: JittedFunction) -> list[Trace]:
    """Every stage of the compiled backward of `jf`'s last compilation, first to last; empty when
    that compilation has none (no input required grad under grad mode, or torch autograd runs the
    forward program's ops because nothing in them would be fused)."""
    if not isinstance(jf, JittedFunction):
        raise TypeError("fjit.last_backward_traces expects a function made by fjit.jit")
    return list(jf._last_backward_traces)


def cache_info(jf: JittedFunction) -> CacheInfo:
    if not isinstance(jf, JittedFunction):
        raise TypeError("fjit.cache_info expects a function made by fjit.jit")
    return jf._cache.info()


class Report:
    """What fjit.diagnose found: every sharp edge, in source order, and every bound constant."""

    def __init__(self, fn_name: str, edges: list[SharpEdge], bindings: list[Binding]):
        self.fn_name = fn_name
        self.edges = sorted(edges, key=lambda e: (e.filename, e.lineno))
        self.bindings = bindings

    @property
    def ok(self) -> bool:
        return not self.edges

    def __str__(self) -> str:
        lines = [f"fjit diagnosis of '{self.fn_name}': "
                 f"{len(self.edges) or 'no'} sharp edge{'s' if len(self.edges) != 1 else ''}"]
        lines += [f"  {e.format()}" for e in self.edges]
        if self.bindings:
            lines.append("bound as compile-time constants (later changes are not seen):")
            lines += [f"  {b}" for b in self.bindings]
        return "\n".join(lines)

    __repr__ = __str__


def diagnose(fn, *args, **kwargs) -> Report:
    """Trace `fn` once, permissively, and report every sharp edge instead of stopping at the first."""
    fn = fn._fn if isinstance(fn, JittedFunction) else fn
    _, leaves = call_key(args, kwargs, frozenset())
    result = trace_function(fn, args, kwargs, leaves, Mode.DIAGNOSE, TRACE_NAMESPACE)
    return Report(getattr(fn, "__name__", "fn"), result.edges, scan_bindings(fn)[1])
