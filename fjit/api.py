"""The public entry points: jit, last_traces, last_backward_traces, cache_info, diagnose, explain,
clear_caches, and the JittedFunction class they take (re-exported from fjit/jitted.py).

`fjit.jit` of a function is a JittedFunction (fjit/jitted.py); of an nn.Module, an FjitModule
(fjit/module.py) whose forward runs one.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, overload

import torch

import fjit.logs as logs
from fjit.cache import CacheInfo
from fjit.config import DEFAULT_EXECUTORS, TraceMode
from fjit.core.ir import Binding
from fjit.core.trace import Trace
from fjit.core.meta import clear_memo
from fjit.errors import SharpEdge, UnsupportedInputError, located
from fjit.frontend.inputs import call_key
from fjit.frontend.light_imports import light_imports
from fjit.frontend.tracer import trace_function
from fjit.jitted import (ALL_JITTED, CacheOption, ExecutorOption, JittedFunction, P, R,
                         SharpEdgesOption)
from fjit.module import FjitModule, diagnosis_call, jitted_of
import fjit.decompositions  # noqa: F401  (registers every decomposition with the dispatcher)
from fjit.runtime import TRACE_NAMESPACE
from fjit.strict.bindings import scan_bindings
from fjit.strict.jitted_callable import names
from fjit.strict.locate import user_location


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
    in order.  cache: "metadata" (default: one program per input metadata), "static" (one program
    per shape, which "metadata" is too until sizes are symbolic) or None (retrace).
    With FJIT_DISABLE=1 the function runs eagerly.  An nn.Module gives an nn.Module whose
    parameters and buffers are inputs of the compiled forward (fjit/module.py)."""
    if fn is None:
        return functools.partial(jit, sharp_edges=sharp_edges, executors=executors, cache=cache)
    if isinstance(fn, (torch.jit.ScriptModule, torch.jit.ScriptFunction)):
        raise UnsupportedInputError(located(
            "FJ201", f"fjit.jit of a TorchScript {type(fn).__qualname__}: it runs in TorchScript's "
                     f"interpreter, whose code fjit cannot trace", *user_location(),
            "compile the original Python module or function with fjit.jit (before torch.jit.script), "
            "or keep the scripted one and run it without fjit"))
    if isinstance(fn, torch.nn.Module):
        return FjitModule(fn, {"sharp_edges": sharp_edges, "executors": executors, "cache": cache})
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
    return list(_traces_of(_jitted(jf, "last_traces"))[0])


def last_backward_traces(jf: JittedFunction) -> list[Trace]:
    """Every stage of the compiled backward of `jf`'s last compilation, first to last; empty when
    that compilation has none (no input required grad under grad mode, or torch autograd runs the
    forward program's ops because nothing in them would be fused)."""
    return list(_traces_of(_jitted(jf, "last_backward_traces"))[1])


def _traces_of(jf: JittedFunction) -> tuple[list, list]:
    """Its own last compilation's stages, or, when it has compiled nothing itself (a module wrapper
    whose programs an equal module's wrapper compiled), those of its cache's last compilation."""
    if jf._last_traces:
        return jf._last_traces, jf._last_backward_traces
    return jf._cache.last_compiled


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
    for jf in list(ALL_JITTED):
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
