"""What fjit reads of the callable it is given, whatever kind it is.

`fjit.jit` accepts anything callable: a Python function, a bound method, a `functools.partial`, an
object with `__call__`, a builtin (`torch.sin`) or a method descriptor (`torch.Tensor.add`).  All
are traced the same way, by calling them on proxies; what differs is where their Python code is
(for the globals and closures the tracer binds, the state the observer watches, the line a sharp
edge is reported at), and which of the names `functools.wraps` copies they have.
"""
from __future__ import annotations

import functools
import inspect
import types


def python_function(fn):
    """The Python function or bound method whose code a call of `fn` runs: through `__wrapped__`
    (a jitted or decorated function), `functools.partial` and an object's `__call__` (bound to the
    object, so that its attributes are reached as a method's are); `fn` itself when that code is
    not Python (a builtin, a method descriptor, a class)."""
    while True:
        fn = inspect.unwrap(fn)
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif isinstance(fn, (types.FunctionType, types.MethodType, type)):
            return fn
        else:
            call = getattr(type(fn), "__call__", None)
            return call.__get__(fn) if isinstance(call, types.FunctionType) else fn


def partial_arguments(fn) -> list[tuple[str, object]]:
    """(parameter name, value) of every argument the `functools.partial` layers of `fn` bind:
    values the function reads that are not inputs of the jitted call, as a closure's are."""
    bound = []
    fn = inspect.unwrap(fn)
    while isinstance(fn, functools.partial):
        try:
            params = list(inspect.signature(fn.func).parameters)
        except (TypeError, ValueError):     # a builtin without a signature
            params = []
        bound += [(params[i] if i < len(params) else f"arg{i}", v) for i, v in enumerate(fn.args)]
        bound += list(fn.keywords.items())
        fn = inspect.unwrap(fn.func)
    return bound


def code_location(fn) -> tuple[str, int] | None:
    """Where `fn`'s Python code starts; None where it has none (a builtin)."""
    code = getattr(python_function(fn), "__code__", None)
    return (code.co_filename, code.co_firstlineno) if code is not None else None


def names(fn) -> tuple[str | None, str, str]:
    """(__module__, __name__, __qualname__) as `functools.wraps` copies them, with a fallback for
    each that `fn` lacks: a method descriptor's module is its class's; a partial is named
    `partial(<its function's name>)`; an object with `__call__`, by its class."""
    module = getattr(fn, "__module__", _MISSING)
    if module is _MISSING:
        module = getattr(getattr(fn, "__objclass__", type(fn)), "__module__", None)
    name, qualname = getattr(fn, "__name__", None), getattr(fn, "__qualname__", None)
    if not (isinstance(name, str) and isinstance(qualname, str)):
        if isinstance(fn, functools.partial):
            _, inner, inner_qualname = names(fn.func)
            name, qualname = f"partial({inner})", f"partial({inner_qualname})"
        else:
            name, qualname = type(fn).__name__, type(fn).__qualname__
    return module, name, qualname


_MISSING = object()
