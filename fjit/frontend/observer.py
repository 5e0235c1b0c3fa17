"""The sharp-edge observer: watches the traced run for side effects (FJ104) and frozen
nondeterminism (FJ105).

Two mechanisms, both paid at trace time only:
  * a profile hook (sys.setprofile) sees every call made *from user code*: print, open, logging,
    time.time, random.random, numpy.random, uuid, torch.manual_seed, and mutating methods
    (append, update, ...) of objects that existed before the call;
  * a before/after comparison of the state the function can reach: the globals of its module(s),
    its closure cells, and the contents of mutable objects bound to those names.  A change is a
    global/nonlocal assignment or a mutation of an object the function does not own; its line is
    found in the bytecode of the user code that ran.
Only what actually ran is reported.
"""
from __future__ import annotations

import contextlib
import datetime
import dis
import inspect
import io
import random
import sys
import types

import torch

from fjit.frontend.context import TraceContext, is_user_file, user_location

_MUTATORS = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "update",
             "setdefault", "popitem", "add", "discard", "difference_update", "intersection_update",
             "symmetric_difference_update", "__setitem__", "__delitem__"}
_TIME_FUNCS = {"time", "time_ns", "perf_counter", "perf_counter_ns", "monotonic", "monotonic_ns",
               "process_time", "process_time_ns", "thread_time", "localtime", "gmtime", "ctime",
               "asctime", "strftime"}
# Code objects of torch's global-state setters (unwrapped: some sit under decorators whose wrapper
# code is shared, so the setter itself is recognized wherever on the stack it is called from).
_GLOBAL_STATE_FUNCS = {inspect.unwrap(f).__code__ for f in (
    torch.manual_seed, torch.seed, torch.set_rng_state, torch.random.manual_seed,
    torch.set_default_dtype, torch.set_default_device, torch.set_printoptions,
    torch.use_deterministic_algorithms, torch.cuda.manual_seed, torch.cuda.manual_seed_all)
    if hasattr(inspect.unwrap(f), "__code__")}
_GLOBAL_STATE_BUILTINS = {torch.set_num_threads, torch.set_num_interop_threads}
# Methods that reseed or reposition a torch.Generator.  On one created inside the function they
# are traced (frontend/rng.py: TracedGenerator overrides them in Python, so no c_call is seen).
_GENERATOR_SETTERS = {"manual_seed", "seed", "set_state", "set_offset", "graphsafe_set_state"}


def _classify_builtin(fn) -> tuple[str, str] | None:
    """(catalog entry, what) for a builtin called from user code, if it is a sharp edge."""
    name = getattr(fn, "__name__", "")
    owner = getattr(fn, "__self__", None)
    if fn is print:
        return "FJ104_print", "print()"
    if name == "warn" and getattr(fn, "__module__", "") in ("warnings", "_warnings"):
        return "FJ104_logging", "warnings.warn()"
    if fn in (open, input):
        return "FJ104_file_io", f"{name}()"
    if isinstance(owner, types.ModuleType):
        mod = owner.__name__
        if mod == "time" and name in _TIME_FUNCS:
            return "FJ105_time", f"time.{name}()"
        if mod in ("os", "posix") and name == "urandom":
            return "FJ105_uuid_urandom", "os.urandom()"
        if mod in ("os", "posix") and name in ("write", "remove", "unlink", "rename", "mkdir",
                                               "system", "makedirs", "rmdir"):
            return "FJ104_file_io", f"os.{name}()"
        if mod.startswith("numpy.random"):
            return "FJ105_numpy_random", f"numpy.random.{name}()"
        if mod == "torch" and fn in _GLOBAL_STATE_BUILTINS:
            return "FJ104_manual_seed", f"torch.{name}()"
    if isinstance(owner, torch._C.Generator) and name in _GENERATOR_SETTERS:
        return "FJ104_manual_seed", f"torch.Generator.{name}() on a generator that existed before the call"
    if owner in (datetime.datetime, datetime.date) and name in ("now", "utcnow", "today"):
        return "FJ105_time", f"{owner.__name__}.{name}()"
    if isinstance(owner, random.Random) and owner is random._inst:
        return "FJ105_random", f"random.{name}()"
    if owner is not None and type(owner).__module__.startswith("numpy.random"):
        return "FJ105_numpy_random", f"numpy.random.{name}()"
    if isinstance(owner, io.IOBase) or owner in (sys.stdout, sys.stderr):
        if owner in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            return "FJ104_print", f"sys.{'stdout' if owner in (sys.stdout, sys.__stdout__) else 'stderr'}.{name}()"
        return "FJ104_file_io", f"file .{name}()"
    return None


def _classify_python(code, frame) -> tuple[str, str] | None:
    """(catalog entry, what) for a Python function called from user code, if it is a sharp edge."""
    module = frame.f_globals.get("__name__", "")
    if module == "random" and code.co_name == "seed":
        return "FJ104_manual_seed", "random.seed()"
    if module == "random" and frame.f_locals.get("self") is random._inst:
        return "FJ105_random", f"random.{code.co_name}()"
    if module in ("uuid", "secrets"):
        return "FJ105_uuid_urandom", f"{module}.{code.co_name}()"
    if module == "logging" or module.startswith("logging."):
        return "FJ104_logging", f"logging.{code.co_name}()"
    return None


class _State:
    """What the function can reach from outside: globals, closure cells, mutable global objects."""

    def __init__(self, fn):
        self.globals_dicts: dict[int, tuple[dict, dict]] = {}
        self.cells: list[tuple[str, types.CellType, object]] = []
        self.objects: list[tuple[str, object, object]] = []
        self._seen: set = set()
        self._add_function(fn)

    def _add_function(self, fn):
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
        for name in sorted(names):
            if name in g:
                self._add_object(name, g[name])
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:
                value = _EMPTY
            self.cells.append((name, cell, value))
            if value is not _EMPTY:
                self._add_object(name, value)

    def _add_object(self, name, value):
        if isinstance(value, types.FunctionType):
            self._add_function(value)
        elif isinstance(value, (list, dict, set, bytearray)):
            self.objects.append((name, value, _contents(value)))
        elif hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, torch.Tensor)) \
                and not callable(value):
            self.objects.append((name, value, dict(vars(value))))

    def owned_ids(self) -> set[int]:
        return {id(obj) for _, obj, _ in self.objects}

    def changes(self):
        """[(entry, name, what)] for outside state the run changed."""
        found = []
        for g, before in self.globals_dicts.values():
            for name in sorted(set(before) | set(g)):
                if before.get(name, _EMPTY) is not g.get(name, _EMPTY) and not name.startswith("__"):
                    what = "deletion of" if name not in g else "assignment to"
                    found.append(("FJ104_global_assignment", name, f"{what} global '{name}'"))
        for name, cell, before in self.cells:
            try:
                now = cell.cell_contents
            except ValueError:
                now = _EMPTY
            if now is not before:
                what = "deletion of" if now is _EMPTY else "assignment to"
                found.append(("FJ104_nonlocal_assignment", name,
                              f"{what} enclosing-scope variable '{name}' (nonlocal)"))
        for name, obj, before in self.objects:
            now = _contents(obj) if isinstance(obj, (list, dict, set, bytearray)) else dict(vars(obj))
            if not _same(before, now):
                found.append(("FJ104_mutate_global_object", name,
                              f"mutation of '{name}', a {type(obj).__name__} that existed before the call"))
        return found


_EMPTY = object()


def _contents(x):
    return dict(x) if isinstance(x, dict) else set(x) if isinstance(x, set) else list(x)


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] for k in a)
    if isinstance(a, set):
        return a == b
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


_STORES = {"FJ104_global_assignment": ("STORE_GLOBAL", "DELETE_GLOBAL"),
           "FJ104_nonlocal_assignment": ("STORE_DEREF", "DELETE_DEREF")}
_OBJECT_WRITES = ("STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR")


def _line_of(entry: str, name: str, codes: list) -> tuple[str, int] | None:
    """Where, in user code that ran, `name` was assigned (or, for objects, written into)."""
    for code in codes:
        line = None
        if entry == "FJ105_numpy_random":
            for ins in dis.get_instructions(code):
                line = ins.starts_line if ins.starts_line is not None else line
                if ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL") and ins.argval == name:
                    return code.co_filename, line
            continue
        loaded_line = None
        for ins in dis.get_instructions(code):
            if ins.starts_line is not None:
                line = ins.starts_line
            if entry in _STORES and ins.opname in _STORES[entry] and ins.argval == name:
                return code.co_filename, line
            if entry == "FJ104_mutate_global_object":
                if ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME") and ins.argval == name:
                    loaded_line = line
                elif ins.opname in _OBJECT_WRITES and loaded_line == line:
                    return code.co_filename, line
    return None


@contextlib.contextmanager
def observe(ctx: TraceContext, fn):
    state = _State(fn)
    owned = state.owned_ids()
    ran: list = []           # user code objects that ran, in first-run order
    ran_ids: set = set()
    reported: set = set()    # names already reported live, not to report again after the run

    def profiler(frame, event, arg):
        if event == "call":
            code = frame.f_code
            if is_user_file(code.co_filename):
                if id(code) not in ran_ids:
                    ran_ids.add(id(code))
                    ran.append(code)
                return
            if code in _GLOBAL_STATE_FUNCS:
                where = user_location(frame)
                if where[1]:
                    ctx.sharp_edge("FJ104_manual_seed", _message(("FJ104_manual_seed", f"torch.{code.co_name}()"), ctx), where)
                return
            caller = frame.f_back
            if caller is not None and is_user_file(caller.f_code.co_filename):
                found = _classify_python(code, frame)
                if found:
                    ctx.sharp_edge(found[0], _message(found, ctx),
                                   (caller.f_code.co_filename, caller.f_lineno))
        elif event == "return":
            # the traced function's own return (user code returning into fjit): where an output
            # fjit cannot rebuild is reported
            caller = frame.f_back
            if is_user_file(frame.f_code.co_filename) and (
                    caller is None or not is_user_file(caller.f_code.co_filename)):
                ctx.return_location = (frame.f_code.co_filename, frame.f_lineno)
        elif event == "c_call" and is_user_file(frame.f_code.co_filename):
            found = _classify_builtin(arg)
            owner = getattr(arg, "__self__", None)
            if found is None and id(owner) in owned and getattr(arg, "__name__", "") in _MUTATORS:
                name = next(n for n, o, _ in state.objects if o is owner)
                reported.add(name)
                found = ("FJ104_mutate_global_object",
                         f"{getattr(arg, '__name__', '')}() on '{name}', a {type(owner).__name__} "
                         f"that existed before the call")
                ctx.sharp_edge(found[0], f"{found[1]} in '{ctx.fn_name}'; a compiled call would not "
                                         f"repeat it", (frame.f_code.co_filename, frame.f_lineno))
            elif found:
                ctx.sharp_edge(found[0], _message(found, ctx),
                               (frame.f_code.co_filename, frame.f_lineno))

    numpy_state = _numpy_rng_state()
    previous = sys.getprofile()
    sys.setprofile(profiler)
    try:
        yield
    finally:
        try:
            sys.setprofile(previous)
        except TypeError:   # cProfile's C-level profiler is reinstalled by its own enable()
            sys.setprofile(None)
            getattr(previous, "enable", lambda: None)()
    if numpy_state is not None and _numpy_rng_state() != numpy_state:
        # numpy.random's Cython functions raise no profile events: its global RNG moving tells.
        where = _line_of("FJ105_numpy_random", "random", ran) or (
            fn.__code__.co_filename, fn.__code__.co_firstlineno)
        ctx.sharp_edge("FJ105_numpy_random", _message(
            ("FJ105_numpy_random", "numpy.random"), ctx), where)
    for entry, name, what in state.changes():
        if name in reported:
            continue
        where = _line_of(entry, name, ran) or (fn.__code__.co_filename, fn.__code__.co_firstlineno)
        ctx.sharp_edge(entry, f"{what} in '{ctx.fn_name}'; it happens once, while tracing, and "
                              f"never in compiled calls", where)


def _numpy_rng_state():
    np = sys.modules.get("numpy")
    if np is None:
        return None
    # normal() draws Gaussians in pairs and caches the second: that call moves only the cache.
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return hash(keys.tobytes()), pos, has_gauss, cached_gaussian


def _message(found: tuple[str, str], ctx: TraceContext) -> str:
    entry, what = found
    if entry.startswith("FJ104"):
        return f"{what} in '{ctx.fn_name}' runs once, while tracing, and never in compiled calls"
    return f"{what} in '{ctx.fn_name}' would be frozen into the compiled code as one trace-time value"
