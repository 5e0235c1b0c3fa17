"""Keeping a compile free of torch's heaviest lazy imports (Dynamo, sympy).

Torch's Python meta kernels import two large subsystems on first use, for answers that are trivial
outside them:

- every function wrapped by `torch._compile._disable_dynamo` (all the `torch._refs` kernels with
  type promotion: relu, softmax, layer_norm, ...) does `import torch._dynamo` (0.7 s, sympy and
  the whole compiler stack) to wrap itself in `torch._dynamo.disable`, which only matters while
  Dynamo is evaluating frames;
- every `torch._check(cond)` does `from torch.fx.experimental.symbolic_shapes import expect_true`
  (0.2 s with sympy), whose answer for a plain bool is the bool itself, and type promotion
  (`torch._prims_common.elementwise_dtypes`) does `import sympy` to ask `isinstance(x,
  sympy.Basic)`, which no object can be while sympy is not loaded.

While fjit compiles on a thread, `builtins.__import__` serves those statements, and only when
they come from those torch modules and the real module is not loaded yet, with stand-ins that
give the same answers: `disable(fn)` gives `fn` (no Dynamo is loaded, so none is evaluating frames),
`expect_true(b)` gives `b` for a bool, and `sympy.Basic` is a class without instances; any other
use of a stand-in takes the real import.  Nothing in torch
is left changed: `_disable_dynamo` caches the wrapper it gets on the function, and the stand-in's
wrapper removes itself when it runs, so the next call outside fjit imports Dynamo as torch would.
Every other import, in any thread, goes straight to the original `__import__`.
"""
from __future__ import annotations

import builtins
import functools
import importlib
import operator
import sys
import threading

import torch

from fjit.frontend.context import ProcessPatch

_REAL_IMPORT = builtins.__import__
_LOCAL = threading.local()
_DISABLE_ATTR = "__dynamo_disable"   # where torch._compile._disable_dynamo caches its wrapper


def _disable(fn, recursive=True, wrapping=True):
    """Stand-in for torch._dynamo.disable, as torch._compile's lazy wrapper calls it."""
    owner = threading.get_ident()

    def call_once(*args, **kwargs):
        if fn.__dict__.get(_DISABLE_ATTR) is call_once:
            del fn.__dict__[_DISABLE_ATTR]       # the next call decides afresh
        if threading.get_ident() != owner or not _active():
            import torch._dynamo                 # another thread got this wrapper: torch's way
            return torch._dynamo.disable(fn, recursive, wrapping=False)(*args, **kwargs)
        return fn(*args, **kwargs)
    return call_once


def _real(module: str, name: str):
    return getattr(importlib.import_module(module), name)


_SHAPES = "torch.fx.experimental.symbolic_shapes"


def _on_bool(name: str):
    """symbolic_shapes' guards (expect_true, guard_or_false, ...) answer a bool with itself."""
    def standin(a, *rest, **kwargs):
        return a if type(a) is bool else _real(_SHAPES, name)(a, *rest, **kwargs)
    standin.__name__ = name
    return standin


def _on_int(name: str, types: tuple):
    """guard_int answers an int with itself, guarding_hint_or_throw an int or a bool."""
    def standin(a):
        return a if type(a) in types else _real(_SHAPES, name)(a)
    standin.__name__ = name
    return standin


def _joining(name: str, join):
    """sym_and / sym_or of bools: operator.and_ / or_ over the arguments, as torch's."""
    def standin(x, *others):
        if type(x) is bool and all(type(y) is bool for y in others):
            for y in others:
                x = join(x, y)
            return x
        return _real(_SHAPES, name)(x, *others)
    standin.__name__ = name
    return standin


def _concrete(x) -> bool:
    t = type(x)
    return t is int or t is bool or t in (tuple, list, torch.Size) and all(_concrete(y) for y in x)


def _sym_eq(x, y):
    if not (_concrete(x) and _concrete(y)):
        return _real(_SHAPES, "sym_eq")(x, y)
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        if len(x) != len(y):
            return False
        return functools.reduce(operator.and_, map(_sym_eq, x, y), True)
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    return _real(_SHAPES, "sym_eq")(x, y)     # torch raises for a list against an int


def _symbolic(x) -> bool:
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def _is_nested_int(s):
    return False if not isinstance(s, torch.SymInt) else _real(_SHAPES, "is_nested_int")(s)


def _has_guarding_hint(a):
    return True if not _symbolic(a) else _real(_SHAPES, "has_guarding_hint")(a)


class _Deferred:
    """A name imported but not used on concrete values (`Max` and `guard_size_oblivious` in
    _prims_common): the real object is imported if it is ever used."""

    def __init__(self, module: str, name: str):
        self._where = (module, name)

    def __call__(self, *args, **kwargs):
        return _real(*self._where)(*args, **kwargs)

    def __instancecheck__(self, obj):
        return isinstance(obj, _real(*self._where))


class _StandIn:
    """What an import statement gets instead of module `real`: the given attributes, and any
    other attribute from the real module (imported then), so an unforeseen use is still torch's."""

    def __init__(self, real: str, **attributes):
        self._real = real
        self.__dict__.update(attributes)

    def __getattr__(self, name):
        return getattr(importlib.import_module(self._real), name)


class _NoInstances:
    """sympy.Basic while sympy is not loaded: no object can be an instance of it."""


def _torch_internal(importer: str) -> bool:
    return importer == "torch" or importer.startswith("torch.")


# module name -> (which importers are served, what their import statement gets instead).
# `import torch._dynamo` binds the name `torch`, so its stand-in is torch with `_dynamo` replaced.
_STANDINS = {
    "torch._dynamo": (
        lambda importer: importer == "torch._compile",
        _StandIn("torch", _dynamo=_StandIn("torch._dynamo", disable=_disable))),
    _SHAPES: (_torch_internal, _StandIn(
        _SHAPES,
        **{n: _on_bool(n) for n in ("expect_true", "guard_or_false", "guard_or_true",
                                    "statically_known_true")},
        guard_int=_on_int("guard_int", (int,)),
        guarding_hint_or_throw=_on_int("guarding_hint_or_throw", (int, bool)),
        sym_and=_joining("sym_and", operator.and_), sym_or=_joining("sym_or", operator.or_),
        sym_eq=_sym_eq, is_nested_int=_is_nested_int, has_guarding_hint=_has_guarding_hint,
        # imported by is_contiguous, never called on concrete values (it warns when called)
        guard_size_oblivious=_Deferred(_SHAPES, "guard_size_oblivious"))),
    # elementwise_dtypes only asks isinstance(x, sympy.Basic) of its arguments
    "sympy": (lambda importer: importer == "torch._prims_common",
              _StandIn("sympy", Basic=_NoInstances)),
    "torch.utils._sympy.functions": (
        lambda importer: importer == "torch._prims_common",
        _StandIn("torch.utils._sympy.functions",
                 Max=_Deferred("torch.utils._sympy.functions", "Max"))),
}


def _active() -> bool:
    return getattr(_LOCAL, "depth", 0) > 0


def _import(name, globals=None, locals=None, fromlist=(), level=0):
    standin = _STANDINS.get(name) if level == 0 else None
    if standin is not None and _active() and name not in sys.modules and globals is not None \
            and standin[0](globals.get("__name__") or ""):
        return standin[1]
    return _REAL_IMPORT(name, globals, locals, fromlist, level)


def _install():
    builtins.__import__ = _import


def _restore():
    if builtins.__import__ is _import:    # someone who replaced it after us keeps theirs
        builtins.__import__ = _REAL_IMPORT


_PATCH = ProcessPatch(_install, _restore)


class light_imports:
    """Context manager: this thread's torch calls get the stand-ins while it is entered."""

    def __enter__(self):
        _PATCH.__enter__()
        _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
        return self

    def __exit__(self, *exc):
        _LOCAL.depth -= 1
        _PATCH.__exit__(*exc)
