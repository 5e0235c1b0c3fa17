"""The errors fjit raises on purpose, and the sharp-edge diagnostics they carry.

A sharp edge is recorded as a `SharpEdge` (a small record: where, which rule, what happened, how to
fix it).  `sharp_edges="error"` turns the first one into its `SharpEdgeError` subclass; "warn" turns
each into a `SharpEdgeWarning`; `fjit.diagnose` collects them all.  Messages are formatted only when
shown, like JAX's escaped-tracer error, so detection stays cheap.
"""
from __future__ import annotations

import dataclasses
import os
import types

import fjit.config as config
from fjit.strict.hints import HINTS

# code -> (category name printed in messages, error class name)
CATEGORIES = {
    "FJ101": "unproxied tensor",
    "FJ102": "input mutation",
    "FJ103": "input container mutation",
    "FJ104": "side effect",
    "FJ105": "nondeterminism",
    "FJ106": "data-dependent control flow",
    "FJ201": "unsupported input",
    "FJ202": "unsupported operation",
}

# The catalog lives at the repository's top level and ships in the wheel as the package
# fjit.sharp_edges_catalog (pyproject.toml's package-dir); errors name an entry by its file there.
CATALOG_DIR = "sharp_edges_catalog"


class FjitError(Exception):
    """Base of every error fjit raises on purpose."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """`tb` without fjit's own frames (FJIT_VERBOSE=1: as it is): an error's traceback then reads
    as the user's, from their call down to the line that did it, as Dynamo's errors do unless
    TORCHDYNAMO_VERBOSE is set.  The frames of the traced function and of the libraries it calls
    stay."""
    if config.verbose():
        return tb
    frames = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
            frames.append(tb)
        tb = tb.tb_next
    kept = None
    for t in reversed(frames):
        kept = types.TracebackType(kept, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return kept


@dataclasses.dataclass(frozen=True)
class SharpEdge:
    """One place where the compiled program could silently differ from the Python original."""

    code: str
    category: str
    message: str
    filename: str
    lineno: int
    hint: str
    entry: str

    @classmethod
    def of(cls, entry: str, message: str, filename: str, lineno: int) -> "SharpEdge":
        code = entry.split("_", 1)[0]
        return cls(code, CATEGORIES[code], message, filename, lineno, hint_for(entry), entry)

    def format(self) -> str:
        where = f"{_short_path(self.filename)}:{self.lineno}"
        return (f"{where}: {self.code} {self.category}: {self.message}. Fix: {self.hint} "
                f"({catalog_ref(self.entry)})")


def hint_for(entry: str) -> str:
    try:
        return HINTS[entry]
    except KeyError:  # a detection site naming an entry the catalog lacks is an fjit bug
        raise AssertionError(f"fjit: no sharp-edges catalog entry {entry!r}") from None


def catalog_ref(entry: str) -> str:
    """Where an error sends the reader: the entry's file in the catalog."""
    return f"see {CATALOG_DIR}/{entry}.py"


def catalog_fix(entry: str) -> str:
    """The fix an error prints for a catalog entry, with the entry to read."""
    return f"{hint_for(entry)} ({catalog_ref(entry)})"


def _short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith(".." + os.sep + "..") else rel


class SharpEdgeError(FjitError):
    """A sharp edge in strict mode.  Carries the fields of its `SharpEdge`."""

    def __init__(self, edge: SharpEdge):
        super().__init__(edge)
        self.edge = edge
        self.code = edge.code
        self.category = edge.category
        self.filename = edge.filename
        self.lineno = edge.lineno
        self.hint = edge.hint
        self.entry = edge.entry

    def __str__(self) -> str:
        return self.edge.format()


class UnproxiedTensorError(SharpEdgeError):
    """FJ101: a tensor that is not a signature input reaches an operation."""


class InputMutationError(SharpEdgeError):
    """FJ102 (a tensor input or a view of it is written) and FJ103 (an input list/dict is)."""


class SideEffectError(SharpEdgeError):
    """FJ104: printing, logging, I/O, global/nonlocal assignment, mutating outside objects."""


class NondeterminismError(SharpEdgeError):
    """FJ105: a value that differs between runs would be frozen into the trace."""


class DataDependentError(SharpEdgeError):
    """FJ106: Python control flow or values depend on tensor data."""


ERROR_CLASSES = {
    "FJ101": UnproxiedTensorError,
    "FJ102": InputMutationError,
    "FJ103": InputMutationError,
    "FJ104": SideEffectError,
    "FJ105": NondeterminismError,
    "FJ106": DataDependentError,
}


def error_for(edge: SharpEdge) -> SharpEdgeError:
    return ERROR_CLASSES[edge.code](edge)


class _LocatedError(FjitError):
    """An FJ2xx error: `.code`, and `.filename`/`.lineno` (None when there is no user line) like
    every SharpEdgeError, taken from the `located(...)` message it is built with."""

    code: str

    def __init__(self, message="", *args):
        super().__init__(message, *args)
        self.filename = getattr(message, "filename", None)
        self.lineno = getattr(message, "lineno", None)


class UnsupportedInputError(_LocatedError, TypeError):
    """FJ201: an input whose type cannot be proxied."""

    code = "FJ201"


class UnsupportedOpError(_LocatedError, NotImplementedError):
    """FJ202: an operation fjit cannot trace, e.g. one whose output shape depends on data."""

    code = "FJ202"


class SharpEdgeWarning(UserWarning):
    """What sharp_edges="warn" emits for each sharp edge instead of raising."""

    def __init__(self, edge: SharpEdge):
        super().__init__(edge.format())
        self.edge = edge


class _Located(str):
    """A diagnostic text that remembers where it points (read by _LocatedError)."""

    filename: str | None
    lineno: int | None


def located(code: str, message: str, filename: str | None, lineno: int | None, fix: str) -> str:
    """The compiler-diagnostic text of an FJ2xx error; it carries `filename` and `lineno` so that
    the error built from it exposes them (the raise sites pass only the text)."""
    where = f"{_short_path(filename)}:{lineno}: " if filename else ""
    text = _Located(f"{where}{code} {CATEGORIES[code]}: {message}. Fix: {fix}")
    text.filename, text.lineno = (filename, lineno) if filename and lineno else (None, None)
    return text
