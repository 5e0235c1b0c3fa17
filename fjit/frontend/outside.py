"""What a traced function can reach from outside, and where in its bytecode it was changed.

The observer (frontend/observer.py) snapshots this state before the traced run and compares it
after: a difference is a global/nonlocal assignment, a mutation of an object the function does not
own (FJ104), or a random generator that existed before the call and was drawn from (FJ105).  The
comparison says *what* changed; `line_of` finds *where*, in the bytecode of the user code that ran.

Reached: the globals the function's code names, its closure cells, its mutable default arguments,
and, through them, plain containers, objects and classes defined in user code (recursively, to a
bounded depth), functions (their own globals, closures and defaults), and random generators.
Objects of library classes are snapshotted one level deep only: their private caches (a logger's
level cache, ...) change on reads, which is not the function's doing.
"""
from __future__ import annotations

import dis
import random
import sys
import types

import torch

from fjit.frontend.callables import names, partial_arguments, python_function
from fjit.frontend.context import is_user_file
from fjit.frontend.proxies import NumberProxy, TensorProxy

_CONTAINERS = (list, dict, set, bytearray)
_MAX_DEPTH = 4          # how far into nested user objects/containers a snapshot goes
_MAX_OBJECTS = 5000     # bounds the trace-time cost on huge global structures
EMPTY = object()


def _user_class(cls) -> bool:
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
            value = _cell_value(cell)
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
            if _user_class(value):
                self._seen.add(id(value))
                snap = {k: v for k, v in vars(value).items() if not k.startswith("__")}
                self.objects.append((root, path, value, snap, entry))
                for k, v in snap.items():
                    if _worth(v):
                        self._add(root, f"{path}.{k}", v, depth + 1, entry)
            return
        d = getattr(value, "__dict__", None)
        if not isinstance(d, dict) or (callable(value) and not _user_class(type(value))):
            return
        self._seen.add(id(value))
        snap = dict(d)
        self.objects.append((root, path, value, snap, entry))
        if _user_class(type(value)):
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
            now = _cell_value(cell)
            if now is not before:
                what = "deletion of" if now is EMPTY else "assignment to"
                found.append(("FJ104_nonlocal_assignment", name,
                              f"{what} enclosing-scope variable '{name}' (nonlocal)", None, now))
        for root, path, obj, before, entry in self.objects:
            now = _snapshot_again(obj)
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

    def undo_proxy_writes(self) -> None:
        """Put back every piece of reached state that the run left holding a tracing proxy: a
        proxy must never outlive its trace (the reports of these writes are `changes()`'s)."""
        for g, before in self.globals_dicts.values():
            undo_proxy_writes(g, before)
        for _, cell, before in self.cells:
            if holds_proxy(_cell_value(cell)):
                if before is EMPTY:
                    del cell.cell_contents
                else:
                    cell.cell_contents = before
        for _, _, obj, before, _ in self.objects:
            undo_proxy_writes(obj, before)


def snapshot(obj):
    """What `undo_proxy_writes(obj, snapshot)` restores: a container's items, an object's
    attributes (one level: nested objects have snapshots of their own)."""
    return _snapshot_again(obj)


def undo_proxy_writes(obj, before) -> bool:
    """Restore the entries of `obj` (a container, a class, an object's attributes, a globals
    dict) that now hold a tracing proxy to their values in `before`; whether anything was."""
    now = _snapshot_again(obj)
    if isinstance(before, dict):
        bad = [k for k in now if now[k] is not before.get(k, EMPTY) and holds_proxy(now[k])]
        target = obj if isinstance(obj, dict) else None
        for k in bad:
            old = before.get(k, EMPTY)
            if target is not None:
                if old is EMPTY:
                    del target[k]
                else:
                    target[k] = old
            elif old is EMPTY:
                delattr(obj, k) if isinstance(obj, type) else vars(obj).pop(k, None)
            elif isinstance(obj, type):
                setattr(obj, k, old)
            else:
                vars(obj)[k] = old
        return bool(bad)
    if any(holds_proxy(x) for x in now):
        if isinstance(obj, (set, bytearray)):
            obj.clear()
            obj.update(before) if isinstance(obj, set) else obj.extend(before)
        else:
            obj[:] = before
        return True
    return False


def holds_proxy(value) -> bool:
    """Whether a tracing proxy is reachable from `value` through containers and the attributes
    of plain objects (bounded: a trace-time check)."""
    return bool(proxies_in(value, first_only=True))


def proxies_in(value, first_only: bool = False, budget: int = 4096) -> list:
    """The tracing proxies reachable from `value` (see holds_proxy)."""
    found, stack, seen = [], [value], set()
    while stack and budget > 0:
        v = stack.pop()
        budget -= 1
        if isinstance(v, (TensorProxy, NumberProxy)):
            found.append(v)
            if first_only:
                break
            continue
        if id(v) in seen or isinstance(v, (str, bytes, int, float, type(None), torch.Tensor, type,
                                           types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(v))
        if isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        else:
            d = getattr(v, "__dict__", None)
            if isinstance(d, dict):
                stack.extend(d.values())
    return found


_SCALARS = (torch.Tensor, str, bytes, int, float, complex, type(None), torch.dtype, torch.device)


def _worth(v) -> bool:
    """Whether a nested value can hold mutable state (checked before its path is formatted)."""
    return not isinstance(v, _SCALARS)


def _contents(x):
    return dict(x) if isinstance(x, dict) else set(x) if isinstance(x, set) else list(x)


def _snapshot_again(obj):
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


# ----------------------------------------------------------------------------------------------
# Where: line attribution in the bytecode that ran
# ----------------------------------------------------------------------------------------------

_STORES = {"FJ104_global_assignment": ("STORE_GLOBAL", "DELETE_GLOBAL"),
           "FJ104_nonlocal_assignment": ("STORE_DEREF", "DELETE_DEREF")}
_OBJECT_WRITES = ("STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR", "STORE_GLOBAL",
                  "STORE_DEREF")
_NAME_LOADS = ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_FAST", "LOAD_CLOSURE")


def line_starting(ins: dis.Instruction) -> int | None:
    """The source line `ins` is the first instruction of, or None.  Python 3.13 made
    `Instruction.starts_line` a bool and put the number in `line_number`."""
    if _STARTS_LINE_IS_BOOL:
        return ins.line_number if ins.starts_line else None
    return ins.starts_line


_STARTS_LINE_IS_BOOL = sys.version_info >= (3, 13)


def code_lines(code):
    """[(line, [instructions])] of a code object, one group per source line, in bytecode order."""
    groups, line = [], None
    for ins in dis.get_instructions(code):
        start = line_starting(ins)
        if start is not None and start != line:
            line = start
            groups.append((line, []))
        if groups:
            groups[-1][1].append(ins)
    return groups


def _aliases(code, name) -> set[str]:
    """Local names bound straight from `name` (`o = OBJ`, `rng = RNG`), plus `name` itself."""
    names = {name}
    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("STORE_FAST", "STORE_DEREF") and previous is not None \
                and previous.opname in _NAME_LOADS and previous.argval in names:
            names.add(ins.argval)
        previous = ins
    return names


def line_of(entry: str, name: str, codes: list, ran_lines: set, attr=None, value=EMPTY):
    """Where, in user code that ran, `name` was assigned, written into, or drawn from.

    The bytecode is read one statement at a time (the instructions since the last store, pop or
    jump), so a write spread over several lines is found and reported at the line that names the
    object.  Each candidate is scored: a write through the name (or a local alias of it) beats a
    write of the same attribute through `self` in a method, which beats any write of that
    attribute; a statement storing a constant other than the value found after the run is the
    branch that did not run (`if c: G = 1 else: G = 2`); between equals, a line the profile hook
    saw running wins."""
    best, best_score = None, 0
    for code in codes:
        aliases = _aliases(code, name)
        statement: list = []          # (instruction, line) since the last statement boundary
        line = None
        for ins in dis.get_instructions(code):
            if line_starting(ins) is not None:
                line = line_starting(ins)
            statement.append((ins, line))
            hit, where = 0, line
            if entry in _STORES:
                hit = 3 if ins.opname in _STORES[entry] and ins.argval == name else 0
            elif entry == "draw":    # a method of a generator reached through `name`
                hit = 3 if ins.opname in _NAME_LOADS and ins.argval in aliases else 0
            elif ins.opname in _OBJECT_WRITES:
                roots = [(i.argval, ln) for i, ln in statement if i.opname in _NAME_LOADS]
                named = [ln for n, ln in roots if n in aliases]
                same_attr = attr is not None and ins.argval == attr
                if named and (ins.opname.endswith("SUBSCR") or attr is None or same_attr
                              or ins.argval in aliases):
                    hit, where = 3, named[0]
                elif same_attr and any(n == "self" for n, _ in roots):
                    hit = 2
                else:
                    hit = 1 if same_attr else 0
            if hit:
                if _stores_other_constant([i for i, _ in statement], value):
                    hit = 1
                score = hit * 2 + ((id(code), where) in ran_lines)
                if score > best_score:
                    best, best_score = (code.co_filename, where), score
            if ins.opname.startswith(_BOUNDARIES):
                statement = []
    return best


_BOUNDARIES = ("STORE_", "DELETE_", "POP_TOP", "RETURN_", "POP_JUMP", "JUMP", "RESUME")


def _stores_other_constant(instructions, value) -> bool:
    """Whether the line's statement stores a literal constant that is not `value` (a simple
    `G = 2`, `obj.a = 2` or `d[k] = 2`: CPython evaluates the stored value first)."""
    if value is EMPTY:
        return False
    first = next((i for i in instructions if i.opname not in ("NOP", "RESUME")), None)
    if first is None or first.opname != "LOAD_CONST":
        return False
    const = first.argval
    try:
        return type(const) is not type(value) or bool(const != value)
    except Exception:  # noqa: BLE001  (a value whose comparison raises tells nothing)
        return False


def _cell_value(cell):
    """A closure cell's contents, EMPTY while the variable is unassigned."""
    try:
        return cell.cell_contents
    except ValueError:
        return EMPTY
