"""What a traced function can reach from outside, snapshotted before its run and compared after.

The observer (strict/observer.py) takes this snapshot before the traced run and compares it
after: a difference is a global/nonlocal assignment, a mutation of an object the function does not
own (FJ104), or a random generator that existed before the call and was drawn from (FJ105).  The
comparison says *what* changed; strict/bytecode_lines.py finds *where*.

Reached: the globals the function's code names, its closure cells, its mutable default arguments,
and, through them, plain containers, objects and classes defined in user code (recursively, to a
bounded depth), functions (their own globals, closures and defaults), and random generators.
Objects of library classes are snapshotted one level deep only: their private caches (a logger's
level cache, ...) change on reads, which is not the function's doing.
"""
from __future__ import annotations

import random
import sys
import types

import torch

from fjit.strict.jitted_callable import names, partial_arguments, python_function
from fjit.strict.locate import is_user_file

_CONTAINERS = (list, dict, set, bytearray)
_MAX_DEPTH = 4          # how far into nested user objects/containers a snapshot goes
_MAX_OBJECTS = 5000     # bounds the trace-time cost on huge global structures
EMPTY = object()


def user_class(cls) -> bool:
    """Whether `cls` is defined in the user's code (its objects' state is watched in depth)."""
    module = sys.modules.get(getattr(cls, "__module__", None) or "")
    filename = getattr(module, "__file__", None)
    return filename is not None and is_user_file(filename)


def _numpy_rng_types():
    np = sys.modules.get("numpy")
    if np is None:
        return ()
    return (np.random.Generator, np.random.RandomState, np.random.BitGenerator)


def rng_state(rng):
    """A comparable snapshot of a random generator's state."""
    if isinstance(rng, random.Random):
        return rng.getstate()
    np = sys.modules["numpy"]
    if isinstance(rng, np.random.RandomState):
        _, keys, pos, has_gauss, gauss = rng.get_state()
        return hash(keys.tobytes()), pos, has_gauss, gauss
    bits = rng if isinstance(rng, np.random.BitGenerator) else rng.bit_generator
    return repr(bits.state)


class Reach:
    """A snapshot of the outside state one traced function can reach."""

    def __init__(self, fn):
        self.globals_dicts: dict[int, tuple[dict, dict]] = {}
        self.cells: list[tuple[str, types.CellType, object]] = []
        # (root name, path for messages, object, snapshot, entry): mutable objects reached
        self.objects: list[tuple[str, str, object, object, str]] = []
        self.rngs: list[tuple[str, object, object]] = []     # (name, generator, state)
        self._seen: set[int] = set()
        self._rng_types = (random.Random,) + _numpy_rng_types()
        target = python_function(fn)
        self._add_function(target, names(fn)[1], top=True)
        # A functools.partial's bound values are the function's as a closure's are: mutating one
        # is FJ104, reported under the parameter's name.
        for name, value in partial_arguments(fn):
            self._add(name, name, value, 0, "FJ104_mutate_global_object")
        # A bound method's object (fjit.jit(obj.step), an object's __call__) existed before the
        # call: a method that changes it (self.steps += 1) does so once, while tracing.
        owner = getattr(target, "__self__", None) if isinstance(target, types.MethodType) else None
        if owner is not None and not isinstance(owner, (type, types.ModuleType)):
            self._add("self", "self", owner, 0, "FJ104_mutate_global_object")
        self.owner_of = {id(obj): (root, path, entry) for root, path, obj, _, entry in self.objects}
        self.rng_ids = {id(r) for _, r, _ in self.rngs}

    # -- building the snapshot ------------------------------------------------------------------
    def _add_function(self, fn, name, top=False):
        fn = getattr(fn, "__wrapped__", fn)
        code = getattr(fn, "__code__", None)
        if code is None or id(fn) in self._seen:
            return
        self._seen.add(id(fn))
        g = fn.__globals__
        if id(g) not in self.globals_dicts:
            self.globals_dicts[id(g)] = (g, dict(g))
        names = set()
        stack = [code]
        while stack:
            c = stack.pop()
            names.update(c.co_names)
            stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
        for n in sorted(names):
            if n in g:
                self._add(n, n, g[n], 0, "FJ104_mutate_global_object")
        for n, cell in zip(code.co_freevars, fn.__closure__ or ()):
            value = cell_value(cell)
            self.cells.append((n, cell, value))
            if value is not EMPTY:
                self._add(n, n, value, 0, "FJ104_mutate_global_object")
        # A mutable default outlives every call: mutating it is a side effect (FJ104), not an
        # input mutation (FJ103), since the caller did not pass it.
        params = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        defaults = dict(zip(params[code.co_argcount - len(fn.__defaults__ or ()):code.co_argcount],
                            fn.__defaults__ or ()))
        defaults.update(fn.__kwdefaults__ or {})
        for n, value in defaults.items():
            self._add(n, f"default argument '{n}' of '{fn.__name__}'", value, 0, "FJ104_mutable_default")

    def _add(self, root, path, value, depth, entry):
        if id(value) in self._seen or len(self._seen) > _MAX_OBJECTS or depth > _MAX_DEPTH:
            return
        if isinstance(value, (torch.Tensor, types.ModuleType, str, bytes, int, float, type(None))):
            return
        if isinstance(value, types.FunctionType):
            self._add_function(value, root)
            return
        if isinstance(value, self._rng_types):
            self._seen.add(id(value))
            self.rngs.append((root, value, rng_state(value)))
            return
        if isinstance(value, _CONTAINERS):
            self._seen.add(id(value))
            snap = _contents(value)
            self.objects.append((root, path, value, snap, entry))
            items = snap.items() if isinstance(snap, dict) else enumerate(snap) \
                if not isinstance(value, (set, bytearray)) else ()
            for k, v in items:
                if _worth(v):
                    self._add(root, f"{path}[{k!r}]", v, depth + 1, entry)
            return
        if isinstance(value, type):
            # Classes of the user's modules: a class-level counter or registry is global state.
            if user_class(value):
                self._seen.add(id(value))
                snap = {k: v for k, v in vars(value).items() if not k.startswith("__")}
                self.objects.append((root, path, value, snap, entry))
                for k, v in snap.items():
                    if _worth(v):
                        self._add(root, f"{path}.{k}", v, depth + 1, entry)
            return
        d = getattr(value, "__dict__", None)
        if not isinstance(d, dict) or (callable(value) and not user_class(type(value))):
            return
        self._seen.add(id(value))
        snap = dict(d)
        self.objects.append((root, path, value, snap, entry))
        if user_class(type(value)):
            self._add(root, path, type(value), depth + 1, entry)   # its methods' globals, too
            for k, v in snap.items():
                if _worth(v):
                    self._add(root, f"{path}.{k}", v, depth + 1, entry)

    # -- comparing ----------------------------------------------------------------------------
    def changes(self):
        """[(entry, root name, what, attribute or None, new value or EMPTY)] for outside state the
        run changed (the new value lets `line_of` rule out a store of another constant)."""
        found = []
        for g, before in self.globals_dicts.values():
            for name in sorted(set(before) | set(g)):
                if before.get(name, EMPTY) is not g.get(name, EMPTY) and not name.startswith("__"):
                    what = "deletion of" if name not in g else "assignment to"
                    found.append(("FJ104_global_assignment", name, f"{what} global '{name}'", None,
                                  g.get(name, EMPTY)))
        for name, cell, before in self.cells:
            now = cell_value(cell)
            if now is not before:
                what = "deletion of" if now is EMPTY else "assignment to"
                found.append(("FJ104_nonlocal_assignment", name,
                              f"{what} enclosing-scope variable '{name}' (nonlocal)", None, now))
        for root, path, obj, before, entry in self.objects:
            now = snapshot(obj)
            attr = _changed_key(before, now)
            if attr is not EMPTY:
                kind = "a class" if isinstance(obj, type) else f"a {type(obj).__name__}"
                what = (f"mutation of {path}, {kind} that persists between calls"
                        if entry == "FJ104_mutable_default" else
                        f"mutation of '{path}', {kind} that existed before the call")
                value = now.get(attr, EMPTY) if isinstance(now, dict) else EMPTY
                found.append((entry, root, what, attr if isinstance(attr, str) else None, value))
        return found

    def drawn_rngs(self):
        """[(name, generator)] for the generators reached that were drawn from."""
        return [(name, rng) for name, rng, before in self.rngs if rng_state(rng) != before]


_SCALARS = (torch.Tensor, str, bytes, int, float, complex, type(None), torch.dtype, torch.device)


def _worth(v) -> bool:
    """Whether a nested value can hold mutable state (checked before its path is formatted)."""
    return not isinstance(v, _SCALARS)


def _contents(x):
    return dict(x) if isinstance(x, dict) else set(x) if isinstance(x, set) else list(x)


def snapshot(obj):
    """A comparable copy of what `obj` holds: a container's items, a class's or an object's
    attributes (one level: nested objects have snapshots of their own)."""
    if isinstance(obj, _CONTAINERS):
        return _contents(obj)
    if isinstance(obj, type):
        return {k: v for k, v in vars(obj).items() if not k.startswith("__")}
    return dict(vars(obj))


def _changed_key(a, b):
    """EMPTY if the snapshots are the same; else the first key that differs (None if unknown)."""
    if isinstance(a, dict):
        for k in list(a) + [k for k in b if k not in a]:
            if a.get(k, EMPTY) is not b.get(k, EMPTY):
                return k
        return EMPTY
    if isinstance(a, set):
        return EMPTY if a == b else None
    same = len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return EMPTY if same else None


def cell_value(cell):
    """A closure cell's contents, EMPTY while the variable is unassigned."""
    try:
        return cell.cell_contents
    except ValueError:
        return EMPTY
