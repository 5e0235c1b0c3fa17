"""The state of one tracing run: names, the scope being recorded into, and the sharp edges found.

A `TraceContext` is installed thread-locally for the duration of a trace; proxies reach the dispatcher
through it, which keeps proxies free of an import of the dispatcher.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import threading
import warnings

import torch

from fjit.config import TraceMode
from fjit.core.ir import BoundSymbol
from fjit.errors import SharpEdge, SharpEdgeWarning, error_for
from fjit.frontend.callables import names


# What to do with a sharp edge: the internal mode (the `sharp_edges=` option plus diagnose's own),
# defined with every other option in fjit.config.
Mode = TraceMode


_LOCAL = threading.local()


def current() -> "TraceContext | None":
    return getattr(_LOCAL, "ctx", None)


def _library_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(os.path.dirname(__file__)), os.path.dirname(torch.__file__)}
    for key in ("stdlib", "platstdlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(path)
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


_LIBRARY_DIRS: tuple[str, ...] | None = None
# Where a wheel installs the sharp-edges catalog (fjit.sharp_edges_catalog); in a checkout, and
# an editable install, it is the top-level sharp_edges_catalog/, outside fjit/ and so user code.
_CATALOG_DIR = os.path.join(os.path.realpath(os.path.dirname(os.path.dirname(__file__))),
                            "sharp_edges_catalog") + os.sep
_USER_FILE: dict[str, bool] = {}


def is_user_file(filename: str) -> bool:
    """Whether code in `filename` is the user's (not fjit, torch or the standard library)."""
    ok = _USER_FILE.get(filename)
    if ok is None:
        global _LIBRARY_DIRS
        if _LIBRARY_DIRS is None:
            _LIBRARY_DIRS = _library_dirs()
        if filename.startswith("<") and not filename.startswith(("<string>", "<stdin>", "<ipython")):
            ok = False  # frozen modules, fjit's generated code
        else:
            path = os.path.realpath(filename)
            # the installed catalog is inside fjit but is user code: example programs
            ok = not path.startswith(_LIBRARY_DIRS) or path.startswith(_CATALOG_DIR)
        _USER_FILE[filename] = ok
    return ok


_PACKAGE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_LOCATED_FILE: dict[str, bool] = {}


def is_located_file(filename: str) -> bool:
    """Whether an error raised in `filename`'s code is reported at its line: the user's code, and
    the third-party libraries it calls (a model's library code: transformers, timm), but not
    fjit, torch or the standard library, whose lines say nothing about the user's program.
    (`is_user_file` is narrower: the observer watches only the user's own code.)"""
    ok = _LOCATED_FILE.get(filename)
    if ok is None:
        ok = is_user_file(filename)
        if not ok and not filename.startswith("<"):
            path = os.path.realpath(filename)
            ok = any(d in path for d in _PACKAGE_DIRS) and not path.startswith(
                (os.path.realpath(os.path.dirname(torch.__file__)) + os.sep,
                 os.path.realpath(os.path.dirname(os.path.dirname(__file__))) + os.sep))
        _LOCATED_FILE[filename] = ok
    return ok


def user_location(frame=None) -> tuple[str, int]:
    """File and line of the innermost frame of the user's or a library's code on the stack (where
    a sharp edge is reported): an error deep in a model's library code names that line, not the
    line that called the model."""
    f = frame or sys._getframe(1)
    while f is not None:
        if is_located_file(f.f_code.co_filename):
            return f.f_code.co_filename, f.f_lineno
        f = f.f_back
    return "<unknown>", 0


class ProcessPatch:
    """Process-wide names replaced while any thread traces (torch.Generator, Function.apply,
    torch.vmap): installed by the first trace to start, restored by the last to end.  Other
    threads see the replacements too, so each must fall through to the original outside a trace."""

    def __init__(self, install, restore):
        self._install, self._restore = install, restore
        self._lock = threading.Lock()
        self._depth = 0

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._restore()


AMP_DEVICES = ("cpu", "cuda")


def autocast_state() -> tuple:
    """(enabled, dtype) of autocast per device type."""
    return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AMP_DEVICES)


def autocast_key():
    """Autocast's part of the cache key: False when it is off everywhere (one C call)."""
    return torch._C._is_any_autocast_enabled() and autocast_state()


class TraceContext:
    def __init__(self, fn, mode: Mode, dispatch, namespace: dict):
        self.fn = fn
        self.fn_name = names(fn)[1]
        self.mode = mode
        self.dispatch = dispatch          # dispatch(func, args, kwargs) -> proxies
        self.namespace = namespace        # names traces refer to (prims, fjit_ops)
        self.scopes: list[list[BoundSymbol]] = [[]]
        self.counter = 0
        self.edges: list[SharpEdge] = []
        self.consts: dict = {}            # name -> captured value (permissive FJ101)
        self.inputs: list = []            # flat runtime input Vars
        self.real_inputs: list = []       # the call's flat runtime values, for permissive replays
        self.specialized: set[int] = set()  # float input positions whose value the trace depends on
        self.tensor_origins: dict[int, tuple[str, str]] = {}  # id(tensor) -> (entry, description)
        self.input_labels: dict[int, str] = {}  # id(input handle) -> how the user names it
        self.raised: SharpEdge | None = None
        self.observed_strides: dict[str, tuple] = {}   # var name -> (shape, real strides) of an opaque op
        # The grad mode and autocast state the ops recorded so far run under (the caller's at
        # first); the dispatcher records a mode change when the traced code enters a region.
        self.grad_mode = torch.is_grad_enabled()
        self.autocast = autocast_state()
        self.return_location: tuple[str, int] | None = None   # the user's outermost `return` seen

    # -- names and recording -------------------------------------------------------------------
    def new_name(self, prefix: str = "t") -> str:
        name = f"{prefix}{self.counter}"
        self.counter += 1
        return name

    def record(self, bsym: BoundSymbol) -> None:
        self.scopes[-1].append(bsym)

    def push_scope(self) -> None:
        self.scopes.append([])

    def pop_scope(self) -> list[BoundSymbol]:
        return self.scopes.pop()

    # -- sharp edges ---------------------------------------------------------------------------
    def sharp_edge(self, entry: str, message: str, location: tuple[str, int] | None = None) -> None:
        """Report a sharp edge: raise it in error mode; otherwise note it and let tracing go on
        with the permissive behaviour the caller implements right after this returns."""
        filename, lineno = location or user_location(sys._getframe(1))
        edge = SharpEdge.of(entry, message, filename, lineno)
        if self.mode is Mode.ERROR:
            self.raised = edge   # re-raised after the run if the user's own `except` swallows it
            raise error_for(edge)
        if any(e.entry == edge.entry and e.lineno == lineno and e.filename == filename
               for e in self.edges):
            return  # one report per place, however often a loop runs it
        self.edges.append(edge)
        if self.mode is Mode.WARN:
            warnings.warn_explicit(SharpEdgeWarning(edge), SharpEdgeWarning, filename, lineno)

    def __enter__(self):
        if current() is not None:
            raise RuntimeError("fjit: a jitted function was called while tracing another one")
        _LOCAL.ctx = self
        return self

    def __exit__(self, *exc):
        _LOCAL.ctx = None
        self.real_inputs = []   # never keep the caller's tensors alive
