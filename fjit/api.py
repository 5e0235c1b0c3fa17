"""The public entry points: jit, last_traces, cache_info, diagnose, explain, clear_caches.

A jitted function looks its program up in its ProgramCache (fjit/cache.py) and compiles on a miss,
under a lock; lookups do not take it.  It behaves as a Python function does where the ecosystem
expects one: `functools.wraps` metadata, pickling by reference, deep-copying to itself, and
`cache_info()` / `cache_clear()` as `functools.lru_cache` has them.
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
import weakref
from typing import Any, Callable, Generic, Iterable, Literal, ParamSpec, TypeVar, Union, overload

import torch
import torch.utils._pytree as pytree

import fjit.autodiff as autodiff
import fjit.config as config
import fjit.logs as logs
from fjit.cache import CacheInfo, ProgramCache
from fjit.config import DEFAULT_EXECUTORS, CacheMode, Executor, SharpEdges, TraceMode
from fjit.core.ir import Binding, Tag, Trace
from fjit.errors import SharpEdge
from fjit.executors import kernel_executor, torch_executor
from fjit.frontend.context import AMP_DEVICES, autocast_state, current
from fjit.frontend.inputs import MISS, call_key, key_labels
from fjit.frontend.light_imports import light_imports
from fjit.frontend.meta import clear_memo
from fjit.frontend.rng import rng_preserved, rng_snapshot
from fjit.frontend.tracer import trace_function
from fjit.module import FjitModule, diagnosis_call, jitted_of
from fjit.ops import TRACE_NAMESPACE
from fjit.passes.basic import constant_fold, cse, dce
from fjit.passes.verify import verify
from fjit.strict.bindings import scan_bindings
from fjit.strict.callables import names

P = ParamSpec("P")
R = TypeVar("R")
SharpEdgesOption = Union[SharpEdges, Literal["error", "warn", "allow"]]
ExecutorOption = Union[Executor, Literal["triton", "c", "torch"]]
CacheOption = Union[CacheMode, Literal["metadata"], None]

_ALL: weakref.WeakSet = weakref.WeakSet()     # every jitted function, for clear_caches()


class JittedFunction(Generic[P, R]):
    def __init__(self, fn: Callable[P, R], *, sharp_edges: SharpEdgesOption = "error",
                 executors: ExecutorOption | Iterable[ExecutorOption] = DEFAULT_EXECUTORS,
                 cache: CacheOption = "metadata"):
        if not callable(fn):
            raise TypeError(f"fjit.jit expects a function, got {type(fn).__qualname__}")
        # functools.wraps' metadata, with the names a callable lacks made up (a partial, an object
        # with __call__); an object's own attributes are its state, not a function's metadata.
        functools.update_wrapper(self, fn, updated=functools.WRAPPER_UPDATES
                                 if isinstance(fn, types.FunctionType) else ())
        self.__module__, self.__name__, self.__qualname__ = names(fn)
        self._fn = fn
        self._options = {"sharp_edges": sharp_edges, "executors": executors, "cache": cache}
        self._mode = TraceMode.of(config.parse(SharpEdges, sharp_edges, "fjit.jit: sharp_edges"))
        if isinstance(executors, (str, Executor)):
            executors = (executors,)
        self._executors = tuple(config.parse(Executor, e, "fjit.jit: executors") for e in executors)
        self._cache = ProgramCache(
            keep=config.parse(CacheMode, cache, "fjit.jit: cache") is CacheMode.METADATA)
        self._lock = threading.Lock()
        self._last_traces: list[Trace] = []
        self._history = logs.History()
        _ALL.add(self)
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
        if config.disabled():              # FJIT_DISABLE=1: nothing is cached, so no fast path
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
        with self._lock, light_imports():
            program = cache.get(key)
            if program is not None:
                cache.hits += 1
                return program, _NOT_RUN
            cache.misses += 1
            self._history.add(self.__qualname__, cache.explain_miss(
                key, key_labels(args, kwargs, _parameter_names(self._fn)),
                cache.hits + cache.misses))
            result, traces, first, executors = self._trace_with_real_layouts(args, kwargs, leaves)
            # An input requiring grad under grad mode: a compiled forward and backward, when
            # something in them fuses (else torch autograd runs the forward program's torch calls).
            joint = autodiff.compile_with_backward(
                traces[len(CLEANUP)], leaves, executors,
                lambda t, cleanup: optimize(t, executors, leaves, cleanup))
            if isinstance(joint, autodiff.Compiled):
                traces, program = joint.forward_traces, joint.program
                self._last_backward_traces = joint.backward_traces
            else:
                program = torch_executor.compile_trace(traces[-1])
                self._last_backward_traces = [] if joint is None else \
                    [autodiff.autograd_stage(traces[-1], joint)]
            if any(b.sym.has(Tag.MODE) for b in traces[-1].bsyms):
                program = _restoring_modes_on_error(program)
            if config.check_mode():
                check_traces(traces, leaves)
            self._last_traces = traces
            logs.log_traces(self.__qualname__, traces)
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

    # -- what functools.lru_cache has ------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        """(hits, misses, entries) of this function's program cache."""
        return self._cache.info()

    def cache_clear(self) -> None:
        """Forget every compiled program and reset the statistics; the next call compiles."""
        with self._lock:
            self._cache.clear(statistics=True)
            self._last_traces = []

    # -- what the ecosystem expects of a function ------------------------------------------------
    def __reduce__(self):
        """Pickled by reference, as functions are: by the name the jitted function has in its
        module (the decorated case), else as fjit.jit of the wrapped function (itself pickled by
        reference) with the same options, compiled afresh where it is unpickled."""
        if _lookup(self.__module__, self.__qualname__) is self:
            return self.__qualname__
        return _jit_again, (self._fn, self._options)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


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
    if config.check_mode():
        for t in traces:
            verify(t)
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
            _assert_same_result(got, expected, t.stage)


def _assert_same_result(got, expected, stage: str) -> None:
    """Tensors agree up to dtype tolerance; every other leaf (a string, a dtype, a size) is equal."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(expected)
    if got_spec != want_spec:
        raise AssertionError(f"fjit check: stage {stage} returns {got_spec}, the first {want_spec}")
    for a, b in zip(got_leaves, want_leaves):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True,
                                       msg=lambda m: f"fjit check: stage {stage} differs: {m}")
        elif not (a == b or a != a and b != b):      # NaN floats equal themselves here
            raise AssertionError(f"fjit check: stage {stage} returns {a!r}, the first {b!r}")


def _lookup(module: str, qualname: str):
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _jit_again(fn, options):
    return JittedFunction(fn, **options)


def _parameter_names(fn) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


@overload
def jit(fn: Callable[P, R], *, sharp_edges: SharpEdgesOption = "error",
        executors: ExecutorOption | Iterable[ExecutorOption] = DEFAULT_EXECUTORS,
        cache: CacheOption = "metadata") -> JittedFunction[P, R]: ...


@overload
def jit(fn: None = None, *, sharp_edges: SharpEdgesOption = "error",
        executors: ExecutorOption | Iterable[ExecutorOption] = DEFAULT_EXECUTORS,
        cache: CacheOption = "metadata") -> Callable[[Callable[P, R]], JittedFunction[P, R]]: ...


def jit(fn: Callable[P, R] | None = None, *, sharp_edges: SharpEdgesOption = "error",
        executors: ExecutorOption | Iterable[ExecutorOption] = DEFAULT_EXECUTORS,
        cache: CacheOption = "metadata") -> Any:
    """Compile `fn`; usable as `@jit` or `@jit(sharp_edges="warn", ...)`.

    sharp_edges: "error" (default), "warn" or "allow".  executors: "triton", "c", "torch", tried
    in order.  cache: "metadata" (default: one program per input metadata) or None (retrace).
    With FJIT_DISABLE=1 the function runs eagerly.  An nn.Module gives an nn.Module whose
    parameters and buffers are inputs of the compiled forward (fjit/module.py)."""
    if fn is None:
        return functools.partial(jit, sharp_edges=sharp_edges, executors=executors, cache=cache)
    if isinstance(fn, torch.nn.Module):
        return FjitModule(fn, JittedFunction,
                          {"sharp_edges": sharp_edges, "executors": executors, "cache": cache})
    return JittedFunction(fn, sharp_edges=sharp_edges, executors=executors, cache=cache)


def _jitted(jf, name: str) -> JittedFunction:
    """The JittedFunction behind what fjit.jit returned: itself, or a module wrapper's forward."""
    jf = jitted_of(jf) if isinstance(jf, FjitModule) else jf
    if not isinstance(jf, JittedFunction):
        raise TypeError(f"fjit.{name} expects a function or module made by fjit.jit, "
                        f"got {type(jf).__qualname__}")
    return jf


def last_traces(jf: JittedFunction) -> list[Trace]:
    """Every stage of `jf`'s last compilation, first to last."""
    return list(_jitted(jf, "last_traces")._last_traces)


def last_backward_traces(jf: JittedFunction) -> list[Trace]:
    """Every stage of the compiled backward of `jf`'s last compilation, first to last; empty when
    that compilation has none (no input required grad under grad mode, or torch autograd runs the
    forward program's ops because nothing in them would be fused)."""
    return list(_jitted(jf, "last_backward_traces")._last_backward_traces)


def cache_info(jf: JittedFunction) -> CacheInfo:
    """The same as jf.cache_info()."""
    return _jitted(jf, "cache_info").cache_info()


def explain(jf: JittedFunction) -> logs.Explanation:
    """Why `jf` compiled each time it did (its last logs.HISTORY_SIZE compilations): the first
    call, or each key field that changed from the nearest cached entry, with the old and new
    values.  Prints as text: `print(fjit.explain(jf))`."""
    jf = _jitted(jf, "explain")
    return logs.Explanation(jf.__qualname__, list(jf._history.compilations), jf.cache_info())


def clear_caches() -> None:
    """Forget every compiled program of every jitted function (as jf.cache_clear() does) and
    every remembered meta-kernel result: the next calls compile from scratch."""
    for jf in list(_ALL):
        jf.cache_clear()
    clear_memo()


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
    """Trace `fn` once, permissively, and report every sharp edge instead of stopping at the first.
    For a module (or fjit.jit of one), the bindings are its configuration (fjit/module.py)."""
    bindings = None
    if isinstance(fn, torch.nn.Module):
        fn, args, bindings = diagnosis_call(fn, args)
    fn = fn._fn if isinstance(fn, JittedFunction) else fn
    _, leaves = call_key(args, kwargs, frozenset())
    with light_imports():
        result = trace_function(fn, args, kwargs, leaves, TraceMode.DIAGNOSE, TRACE_NAMESPACE)
    if bindings is None:
        bindings = scan_bindings(fn)[1]
    return Report(names(fn)[1], result.edges, bindings)
