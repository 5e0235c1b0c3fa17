"""Which code is the user's, and the line of it a sharp edge or an error is reported at.

fjit watches and reports the user's code, never its own, torch's or the standard library's: the
observer follows calls made from user files only, and a sharp edge names the innermost line of the
user's (or a third-party library's) code on the stack.
"""
from __future__ import annotations

import os
import sys
import sysconfig

import torch


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
