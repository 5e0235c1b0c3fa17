"""A jitted function: what `fjit.jit(fn)` returns for a function, and what runs the compiled
forward of `fjit.jit(module)` (fjit/module.py builds one per module layout).

A jitted function looks its program up in its ProgramCache (fjit/cache.py) and compiles on a miss
(fjit/pipeline.py), under a lock; lookups do not take it.  It behaves as a Python function does
where the ecosystem expects one: `functools.wraps` metadata, pickling by reference, deep-copying to
itself, and `cache_info()` / `cache_clear()` as `functools.lru_cache` has them.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import threading
import time
import types
import weakref
from typing import Callable, Generic, Iterable, Literal, NamedTuple, ParamSpec, TypeVar, Union

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.utils._pytree as pytree
from torch._functorch.pyfunctorch import temporarily_clear_interpreter_stack

import fjit.config as config
import fjit.logs as logs
import fjit.pipeline as pipeline
from fjit.cache import SYMBOLIC_TRIES, CacheInfo, ProgramCache
from fjit.capture import captured
from fjit.config import DEFAULT_EXECUTORS, CacheMode, SharpEdges, TraceMode
from fjit.core.symbolic import SymbolicTooSlow
from fjit.core.trace import Trace
from fjit.errors import FjitError, user_traceback
from fjit.executors import parse_executors
from fjit.frontend.context import current
from fjit.frontend.inputs import MISS, key_labels, transform_tensor, transformed
from fjit.strict.jitted_callable import names

_grad = torch._C.is_grad_enabled
P = ParamSpec("P")
R = TypeVar("R")
SharpEdgesOption = Union[SharpEdges, Literal["error", "warn", "allow"]]
ExecutorOption = Union[Literal["triton", "c", "torch"], str]   # a registered executor's name
CacheOption = Union[CacheMode, Literal["metadata", "static", "symbolic"], None]
# cache= -> when the program cache makes sizes symbolic (cache.ProgramCache.dims_to_make_symbolic)
_SIZES = {CacheMode.METADATA: "auto", CacheMode.STATIC: "static", CacheMode.SYMBOLIC: "symbolic",
          CacheMode.NONE: "static"}

ALL_JITTED: weakref.WeakSet = weakref.WeakSet()     # every jitted function, for fjit.clear_caches()


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
        self._executors = parse_executors(executors, "fjit.jit: executors")
        mode = config.parse(CacheMode, cache, "fjit.jit: cache")
        self._cache = ProgramCache(keep=mode is not CacheMode.NONE, sizes=_SIZES[mode])
        self._lock = threading.Lock()
        self._last_traces: list[Trace] = []
        self._last_backward_traces: list[Trace] = []
        self._history = logs.History()
        ALL_JITTED.add(self)

    def __call__(self, *args, **kwargs):
        if captured():       # torch.compile, torch.export or torch.jit.trace records the ops
            return self._fn(*args, **kwargs)
        cache = self._cache
        last = cache.last[0]
        # (the guards tell a torch.func transform's tensors from plain ones, not forward-mode AD's)
        if last is not None and not kwargs and len(args) == last[0] and last[1] is _grad() and \
                last[2].check(*args) and _forward_ad._current_level < 0:
            cache.hits += 1
            return last[3](*args)
        if not kwargs:
            # after a call a symbolic program served, the next is likely another length: try it
            # before the fast path builds a key it would not find
            served = cache.served_symbolic
            if served:
                out = cache.symbolic_call(args)
                if out is not MISS:
                    return out
            out = cache.fast_call(*args)
            if out is not MISS:
                cache.hits += 1
                return out
            if not served:
                out = cache.symbolic_call(args)
                if out is not MISS:
                    return out
        try:
            return self._call(args, kwargs)
        except FjitError as e:       # its traceback as the user's (FJIT_VERBOSE=1 keeps fjit's)
            raise e.with_traceback(user_traceback(e.__traceback__))

    def _call(self, args, kwargs):
        if current() is not None:          # called while tracing another function: inline it
            return self._fn(*args, **kwargs)
        if config.disabled():              # FJIT_DISABLE=1: nothing is cached, so no fast path
            return self._fn(*args, **kwargs)
        if transformed():
            return self._call_transformed(args, kwargs)
        cache = self._cache
        key, leaves = cache.key_and_leaves(args, kwargs)
        program = cache.get(key)
        if program is None:
            program = cache.symbolic_program(key, leaves)
        compiled = None
        if program is None:
            program, compiled = self._compile(key, args, kwargs, leaves)
        else:
            cache.hits += 1
        if not kwargs:
            cache.remember_fast(args, program)
        return program(*leaves) if compiled is None else compiled.result(leaves)

    def _call_transformed(self, args, kwargs):
        """A call under a torch.func transform (vmap, grad, jvp, jacrev, ...) or a forward-mode AD
        dual level.  The transform's tensors (wrappers whose metadata is one example's) and dual
        tensors are not a program's inputs: a kernel cannot read a wrapper, and a program would
        compute one example or drop the tangent.  So the function is traced, as strictly as any
        call, on plain stand-ins with the same metadata, and its program's torch form (torch calls
        only, no kernels, no compiled backward) runs on the real arguments, through which the
        transform batches and differentiates as it does eager code."""
        originals: list = []

        def metadata(x):
            if isinstance(x, torch.Tensor) and transform_tensor(x):
                originals.append(x)
                return _StandIn(tuple(x.shape), x.dtype, x.device)
            return x
        described = pytree.tree_map(metadata, (args, kwargs))
        torch_form = self.__dict__.get("_torch_form")
        if torch_form is None:
            torch_form = self.__dict__["_torch_form"] = JittedFunction(
                self._fn, sharp_edges=self._options["sharp_edges"], executors="torch",
                cache=self._options["cache"])
        cache = torch_form._cache
        # made and traced outside the transform: a tensor made under grad or vmap is its wrapper
        with temporarily_clear_interpreter_stack():
            made: list = []

            def make(x):
                if isinstance(x, _StandIn):
                    t = torch.empty(x.shape, dtype=x.dtype, device=x.device)
                    # requiring grad, the program is lowered as one autograd records: no views
                    # reinterpreted from storage, no in-place reuse of a value a transform saves
                    # (a wrapper has no storage to reinterpret)
                    made.append(t.requires_grad_(t.is_floating_point() or t.is_complex()))
                    return t
                return x
            plain_args, plain_kwargs = pytree.tree_map(make, described, is_leaf=lambda x: isinstance(x, _StandIn))
            real = {id(t): x for x, t in zip(originals, made)}
            key, leaves = cache.key_and_leaves(plain_args, plain_kwargs)
            program = cache.get(key)
            if program is None:
                program, _ = torch_form._compile(key, plain_args, plain_kwargs, leaves)
            else:
                cache.hits += 1
        return program(*[real.get(id(x), x) for x in leaves])

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def _compile(self, key, args, kwargs, leaves) -> tuple[Callable, pipeline.Compilation | None]:
        """(the program for `key`, its Compilation, or None where another thread compiled it)."""
        cache = self._cache
        with self._lock:
            program = cache.get(key) or cache.symbolic_program(key, leaves)
            if program is not None:
                cache.hits += 1
                return program, None
            cache.misses += 1
            miss = cache.explain_miss(key, key_labels(args, kwargs, _parameter_names(self._fn)),
                                      cache.hits + cache.misses)
            failed = cache.failed_guard(key, leaves)
            if failed is not None:      # the key fields that changed, and the guard that failed
                miss = dataclasses.replace(miss, reason=f"the symbolic program's guard {failed} fails")
            compiled, outcome = self._compile_symbolic(key, args, kwargs, leaves)
            if compiled is None:
                start = time.perf_counter()
                compiled = pipeline.compile_call(self._fn, args, kwargs, leaves, self._mode,
                                                 self._executors)
                cache.slowest_compile = max(cache.slowest_compile, time.perf_counter() - start)
            self._history.add(self.__qualname__, dataclasses.replace(miss, outcome=outcome))
            self._last_traces = compiled.traces
            self._last_backward_traces = compiled.backward_traces
            cache.last_compiled = (compiled.traces, compiled.backward_traces)
            logs.log_traces(self.__qualname__, compiled.traces)
            if compiled.guards is None:
                cache.store(args, kwargs, key, compiled.program, compiled.specialized)
            return compiled.program, compiled

    def _compile_symbolic(self, key, args, kwargs, leaves) -> tuple[pipeline.Compilation | None, str]:
        """(the call compiled with symbolic sizes, or None; what happened, for fjit.explain): the
        dims the cache asks for are symbols (ProgramCache.dims_to_make_symbolic).  Where that
        fails, this and every later compile of the function specialize, and why is said."""
        cache = self._cache
        dynamic = cache.dims_to_make_symbolic(key, leaves)
        narrowed = ""
        while dynamic:
            try:
                ones = cache.dims_seen_at_one(key, leaves, dynamic)
                compiled = pipeline.compile_symbolic(self._fn, args, kwargs, leaves, self._mode,
                                                     self._executors, dynamic, ones, cache.symbolic_budget())
            except SymbolicTooSlow as e:
                # the whole input's sizes symbolic was too much for the shape environment: once
                # more, at once, with only the dims that changed (an image's batch, not its
                # height and width); never the whole input again
                cache.narrow = True
                fewer = cache.dims_to_make_symbolic(key, leaves)
                if fewer and fewer != dynamic and not narrowed:
                    logs.recompiles.info("%s: %s; again with the dims that changed symbolic only",
                                         self.__qualname__, e)
                    dynamic, narrowed = fewer, f" with the changed dims only ({e})"
                    continue
                return self._declined(e)
            except Exception as e:      # noqa: BLE001 -- the specialized compile says the user's errors
                return self._declined(e)
            cache.store_symbolic(key, dynamic, compiled.guards, compiled.program, ones,
                                 None if kwargs else args)
            return compiled, f"symbolic program{narrowed}: {compiled.traces[-1].stage.split(': ', 1)[-1]}"
        return None, ""

    def _declined(self, e: Exception) -> tuple[None, str]:
        """A symbolic compile that failed: counted (after SYMBOLIC_TRIES, the function's compiles
        specialize), logged, and said in fjit.explain."""
        cache = self._cache
        reason = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        cache.symbolic_declines += 1
        logs.recompiles.info("%s: symbolic sizes declined (%d of %d tries): %s", self.__qualname__,
                             cache.symbolic_declines, SYMBOLIC_TRIES, reason)
        return None, f"specialized sizes (symbolic sizes declined: {reason})"

    def __repr__(self):
        return f"<fjit.jit of {self._fn!r}>"

    def __prepare_scriptable__(self):
        """torch.jit.script(jf) scripts the function fjit compiles (TorchScript compiles Python
        source, which the jitted function's program is not)."""
        return self._fn

    def share_programs(self, registry: dict, key) -> None:
        """Use the program cache filed under `key` in `registry` (filing this one's there first),
        so equal modules wrapped apart compile once.  A cache that keeps nothing is not shared."""
        if self._cache.keep:
            self._cache = registry.setdefault(key, self._cache)

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


class _StandIn(NamedTuple):
    """A transform's tensor as its metadata, until the stand-in is made outside the transform."""
    shape: tuple
    dtype: torch.dtype
    device: torch.device


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
