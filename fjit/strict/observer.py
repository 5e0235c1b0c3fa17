"""The sharp-edge observer: watches the traced run for side effects (FJ104) and frozen
nondeterminism (FJ105).

Two mechanisms, both paid at trace time only:
  * a profile hook (sys.setprofile) sees every call made *from user code*: print, open, logging,
    time.time, random.random, numpy.random, uuid, torch.manual_seed, and mutating methods
    (append, update, ...) of objects that existed before the call;
  * a before/after comparison of the state the function can reach (strict/reach.py): the globals
    of its module(s), its closure cells, and the contents of mutable objects bound to those names.
    A change is a global/nonlocal assignment or a mutation of an object the function does not own;
    its line is found in the bytecode of the user code that ran (strict/bytecode_lines.py).
Only what actually ran is reported.
"""
from __future__ import annotations

import contextlib
import datetime
import dis
import inspect
import io
import os
import random
import sys
import types

import torch

from fjit.strict.bytecode_lines import code_lines, line_of
from fjit.strict.jitted_callable import code_location
from fjit.strict.locate import is_user_file, user_location
from fjit.strict.reach import Reach

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
# are traced (fjit/frontend/rng.py: TracedGenerator overrides them in Python, so no c_call is seen).
_GENERATOR_SETTERS = {"manual_seed", "seed", "set_state", "set_offset", "graphsafe_set_state"}


_FILE_BUILTINS = {"write", "remove", "unlink", "rename", "replace", "mkdir", "makedirs", "rmdir",
                  "system", "chmod", "chown", "link", "symlink", "truncate", "utime", "open",
                  "chdir", "kill", "removexattr", "setxattr", "mkfifo"}


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
        if mod in ("os", "posix", "nt"):
            if name == "urandom":
                return "FJ105_uuid_urandom", "os.urandom()"
            if name in ("putenv", "unsetenv"):
                return "FJ104_environment", f"os.{name}()"
            if name in _FILE_BUILTINS:
                return "FJ104_file_io", f"os.{name}()"
        if mod == "_pickle" and name in ("dump", "load"):
            return "FJ104_file_io", f"pickle.{name}()"
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


# Python functions of these modules that do I/O when user code calls them (FJ104_file_io).
_IO_FUNCS = {
    "torch.serialization": {"save", "load"},
    "shutil": {"copyfileobj", "copyfile", "copymode", "copystat", "copy", "copy2", "copytree",
               "rmtree", "move", "make_archive", "unpack_archive", "chown"},
    "pathlib": {"write_text", "write_bytes", "read_text", "read_bytes", "open", "touch", "mkdir",
                "unlink", "rmdir", "rename", "replace", "symlink_to", "hardlink_to", "chmod",
                "lchmod"},
    "os": {"makedirs", "removedirs", "renames"},
    "tempfile": {"mkstemp", "mkdtemp", "NamedTemporaryFile", "TemporaryFile",
                 "SpooledTemporaryFile", "__init__"},
    "subprocess": {"run", "call", "check_call", "check_output", "getoutput", "getstatusoutput",
                   "__init__"},
    "socket": {"create_connection", "__init__"},
    "urllib.request": {"urlopen", "urlretrieve"},
    "numpy.lib._npyio_impl": {"save", "savez", "savez_compressed", "savetxt", "load", "loadtxt",
                              "genfromtxt", "fromregex"},
    "numpy.lib.npyio": {"save", "savez", "savez_compressed", "savetxt", "load", "loadtxt",
                        "genfromtxt", "fromregex"},
}
# logging functions that only read the configuration: asking is not a side effect.
_LOGGING_QUERIES = {"getLogger", "getChild", "isEnabledFor", "getEffectiveLevel", "hasHandlers",
                    "getLevelName", "getLevelNamesMapping", "getLoggerClass", "getLogRecordFactory",
                    "getHandlerByName", "getHandlerNames", "_checkLevel", "_fixupParents"}
_ENVIRON_WRITERS = {"__setitem__", "__delitem__", "__ior__", "update", "pop", "popitem", "clear",
                    "setdefault"}
# numpy's generator constructors: seeded from OS entropy through random.SystemRandom when given no
# seed (numpy's Cython code raises no profile events of its own).
_NUMPY_SEEDING = {"default_rng", "SeedSequence", "PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64",
                  "Generator", "RandomState"}


def _classify_python(code, frame, rng_ids) -> tuple[str, str] | None:
    """(catalog entry, what) for a Python function called from user code, if it is a sharp edge.
    Called for every such call while tracing: one dict lookup decides for most modules."""
    module = frame.f_globals.get("__name__", "")
    name = code.co_name
    io_funcs = _IO_FUNCS.get(module)
    if io_funcs is not None and name in io_funcs:
        return "FJ104_file_io", f"{module}.{name}()"
    if module == "random":
        this = frame.f_locals.get("self")
        if name == "seed":
            return "FJ104_manual_seed", "random.seed()"
        if this is random._inst:
            return "FJ105_random", f"random.{name}()"
        if isinstance(this, random.SystemRandom):
            called = _called_name(frame.f_back)
            if called in _NUMPY_SEEDING:
                return "FJ105_numpy_random", f"numpy.random.{called}() without a seed"
            return "FJ105_random", f"random.SystemRandom().{name}()"
        if id(this) in rng_ids:
            return "FJ105_global_generator", f"{name}() on a random.Random that existed before the call"
        if name == "__init__" and isinstance(this, random.Random) and frame.f_locals.get("x") is None:
            return "FJ105_random", "random.Random() without a seed"
        return None
    if module in ("uuid", "secrets"):
        return "FJ105_uuid_urandom", f"{module}.{name}()"
    if module == "logging" or module.startswith("logging."):
        if name in _LOGGING_QUERIES:
            return None
        return "FJ104_logging", f"logging.{name}()"
    if name in _ENVIRON_WRITERS and module in ("os", "_collections_abc", "collections.abc") \
            and any(frame.f_locals.get("self") is e for e in _ENVIRONS):
        return "FJ104_environment", f"os.environ.{name}()" if name[0] != "_" else \
            f"os.environ {'assignment' if name != '__delitem__' else 'deletion'}"
    return None


_ENVIRONS = tuple(e for e in (os.environ, getattr(os, "environb", None)) if e is not None)


def _called_name(frame) -> str | None:
    """The last name loaded before the call `frame` is making (`default_rng` in
    `np.random.default_rng()`): names the call a library reached us through."""
    if frame is None:
        return None
    last = None
    for ins in dis.get_instructions(frame.f_code):
        if ins.offset > frame.f_lasti:
            break
        if ins.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME") \
                and ins.argval in _NUMPY_SEEDING:
            last = ins.argval
    return last


def call_as_user_code(fn, args: tuple, kwargs: dict):
    """Call the jitted callable as the user's code would: a builtin or library function jitted
    directly (fjit.jit(random.random), fjit.jit(print)) is classified as if the user's code had
    called it, and reported at the line that called the jitted function."""
    return fn(*args, **kwargs)


def _calls_as_user(code) -> bool:
    return code is _CALL_AS_USER or is_user_file(code.co_filename)


_CALL_AS_USER = call_as_user_code.__code__


@contextlib.contextmanager
def observe(ctx, fn, *, input_containers: tuple[type, ...], undo_leaks):
    """Watch the traced run of `fn` and report its sharp edges to `ctx`, the trace's context (its
    `sharp_edge`, `fn_name` and `return_location`).  The tracing side says what it owns:
    `input_containers` are its read-only input list and dict types (an unbound `list.append(xs, v)`
    on one bypasses their own report), and `undo_leaks(reach)` puts back the proxies the run left
    in the state it reached, before anything is reported."""
    reach = Reach(fn)
    owner_of, rng_ids = reach.owner_of, reach.rng_ids
    ran: list = []           # user code objects that ran, in first-run order
    ran_ids: set = set()
    ran_lines: set = set()   # (id(code), line) seen running: picks the branch that ran
    reported: set = set()    # (entry, root name) reported live, not to report again after the run

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
            if caller is not None and _calls_as_user(caller.f_code):
                ran_lines.add((id(caller.f_code), caller.f_lineno))
                found = _classify_python(code, frame, rng_ids)
                if found:
                    ctx.sharp_edge(found[0], _message(found, ctx), user_location(caller))
        elif event == "return":
            # the traced function's own return (user code returning into fjit): where an output
            # fjit cannot rebuild is reported
            caller = frame.f_back
            if is_user_file(frame.f_code.co_filename) and (
                    caller is None or not is_user_file(caller.f_code.co_filename)):
                ctx.return_location = (frame.f_code.co_filename, frame.f_lineno)
        elif event == "c_call" and _calls_as_user(frame.f_code):
            ran_lines.add((id(frame.f_code), frame.f_lineno))
            found = _classify_builtin(arg)
            owner = getattr(arg, "__self__", None)
            if found is None and id(owner) in owner_of and getattr(arg, "__name__", "") in _MUTATORS:
                root, path, entry = owner_of[id(owner)]
                reported.add((entry, root))
                what = (f"default argument '{root}'" if entry == "FJ104_mutable_default"
                        else f"'{path}'")
                ctx.sharp_edge(entry, f"{arg.__name__}() on {what}, a {type(owner).__name__} that "
                                      f"{'persists between calls' if entry == 'FJ104_mutable_default' else 'existed before the call'}"
                                      f" in '{ctx.fn_name}'; a compiled call would not repeat it",
                               user_location(frame))
            elif found is None and isinstance(owner, input_containers) and \
                    getattr(arg, "__name__", "") in _MUTATORS:
                # list.append(xs, v) called unbound on an input list: its own methods are bypassed
                kind = "list" if isinstance(owner, list) else "dict"
                ctx.sharp_edge("FJ103_list_append" if kind == "list" else "FJ103_dict_setitem",
                               f"{arg.__name__}() on an input {kind} of '{ctx.fn_name}'; compiled "
                               f"code would not see the change on later calls",
                               (frame.f_code.co_filename, frame.f_lineno))
            elif found is None and id(owner) in rng_ids:
                name = next(n for n, r, _ in reach.rngs if r is owner)
                reported.add(("FJ105_global_generator", name))
                ctx.sharp_edge("FJ105_global_generator", _message(
                    ("FJ105_global_generator", f"{arg.__name__}() on '{name}', a "
                                               f"{type(owner).__name__} that existed before the call"), ctx),
                    user_location(frame))
            elif found:
                ctx.sharp_edge(found[0], _message(found, ctx),
                               user_location(frame))
        elif event == "return" and is_user_file(frame.f_code.co_filename):
            ran_lines.add((id(frame.f_code), frame.f_lineno))

    numpy_state = _numpy_rng_state()
    modules_before = len(sys.modules)
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
        changes = reach.changes()
        undo_leaks(reach)       # reported below; a proxy never outlives its trace
    default = code_location(fn) or user_location()
    if numpy_state is not None and _numpy_rng_state() != numpy_state:
        # numpy.random's Cython functions raise no profile events: its global RNG moving tells.
        where = _numpy_line(ran, ran_lines) or default
        ctx.sharp_edge("FJ105_numpy_random", _message(
            ("FJ105_numpy_random", "numpy.random"), ctx), where)
    for name, rng in reach.drawn_rngs():
        if ("FJ105_global_generator", name) in reported:
            continue
        where = line_of("draw", name, ran, ran_lines) or default
        ctx.sharp_edge("FJ105_global_generator", _message(
            ("FJ105_global_generator", f"drawing from '{name}', a {type(rng).__name__} that existed "
                                       f"before the call,"), ctx), where)
    # A module imported during the run (torch's checkpoint imports torch.distributed.tensor on
    # first use, which registers pytree nodes) changes state the function reaches: what no line
    # of the function or its libraries did is that import's registration, done once for the
    # process as eager does it, not the function's side effect.
    imported = len(sys.modules) > modules_before
    for entry, name, what, attr, value in changes:
        if (entry, name) in reported:
            continue
        where = line_of(entry, name, ran, ran_lines, attr, value)
        if where is None and imported:
            continue
        where = where or default
        ctx.sharp_edge(entry, f"{what} in '{ctx.fn_name}'; it happens once, while tracing, and "
                              f"never in compiled calls", where)


def _numpy_line(codes, ran_lines):
    """The line that used numpy.random's global generator: `.random` loaded, preferring a line
    seen running."""
    best = None
    for code in codes:
        for line, instructions in code_lines(code):
            if any(i.opname in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL") and i.argval == "random"
                   for i in instructions):
                if (id(code), line) in ran_lines:
                    return code.co_filename, line
                best = best or (code.co_filename, line)
    return best


def _numpy_rng_state():
    np = sys.modules.get("numpy")
    if np is None:
        return None
    # normal() draws Gaussians in pairs and caches the second: that call moves only the cache.
    _, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return hash(keys.tobytes()), pos, has_gauss, cached_gaussian


def _message(found: tuple[str, str], ctx) -> str:
    entry, what = found
    if entry.startswith("FJ104"):
        return f"{what} in '{ctx.fn_name}' runs once, while tracing, and never in compiled calls"
    return f"{what} in '{ctx.fn_name}' would be frozen into the compiled code as one trace-time value"
