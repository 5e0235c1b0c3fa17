"""Traces: the Trace program of bound symbols, printed as runnable Python, and the autocast switch
that a program holding autocast's casts runs under.

A trace is a straight-line SSA program of bound symbols (core/ir.py).  Every stage of compilation
is a `Trace`, and every trace prints as a Python function that runs: `trace.python_callable()`
executes its own printed source (made a function by core/generated.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import linecache
import math
import operator
import weakref
from typing import Any, Callable

import torch

from fjit.core.generated import compile_function
from fjit.core.ir import BoundSymbol, Tag, Var, is_structseq
from fjit.core.symbolic import SymbolicUnsupported, size_text, sizes_of


@dataclasses.dataclass
class Trace:
    name: str                 # the user function's name
    inputs: list              # flat runtime inputs (TensorVar / NumberVar), the function's params
    bsyms: list
    output: Any               # nested structure of Vars and constants
    consts: dict = dataclasses.field(default_factory=dict)   # name -> value for non-literal constants
    stage: str = "traced"
    bindings: list = dataclasses.field(default_factory=list)
    namespace: dict = dataclasses.field(default_factory=dict)  # extra names the source refers to
    # None: `output` is the caller's structure and prints as it.  Otherwise `output` is a flat
    # tuple of values and the caller gets rebuild(*output) (dataclasses, OrderedDict, torch.Size...:
    # see frontend/outputs.py); its __doc__ names the types it builds, for the printed trace.
    rebuild: Callable | None = None
    # Values a torch.utils.checkpoint region made: name -> the region's number.  The joint
    # program recomputes those its region alone reads in the backward instead of saving them, as
    # eager's checkpoint does (autodiff/joint.py).
    checkpointed: dict = dataclasses.field(default_factory=dict)
    # The symbolic sizes the trace's shapes and arguments are expressions of (core/symbolic.py),
    # bound from its inputs' dims at the top of the printed program; None: every size is a number.
    sizes: Any = None
    # The trace holds autocast's casts as ops (frontend/modes.py): its program runs with autocast
    # off, which a call under autocast has on.
    autocast_off: bool = False

    def with_stage(self, stage: str, bsyms=None, **changes) -> "Trace":
        return dataclasses.replace(self, stage=stage, bsyms=list(self.bsyms if bsyms is None else bsyms),
                                   **changes)

    def __str__(self) -> str:
        """The stage as a runnable module: `exec(str(trace), ns)` defines ns["computation"]."""
        return TracePrinter(self).source(imports=True)

    def python_callable(self, extra_namespace: dict | None = None, inputs_in_a_list: bool = False) -> Callable:
        """Compile the printed source into a function (what executors and check mode run).  The
        names the printed imports would resolve are bound directly: no lookups per call.

        `inputs_in_a_list`: the function takes ONE list holding its inputs, which it empties before
        running, so the program's own `del`s free each input after its last use (a call with *args
        holds every argument until it returns; the compiled backward's saved tensors must not)."""
        printer = TracePrinter(self)
        src = printer.source()
        if inputs_in_a_list:
            params = ", ".join(v.name for v in self.inputs)
            unpack = f"  ({params},) = _inputs\n  _inputs.clear()\n" if params else "  _inputs.clear()\n"
            head, body = src.split(f"def computation({params}):\n", 1)
            src = f"{head}def computation(_inputs):\n{unpack}{body}"
        ns = {"torch": torch, "operator": operator, "inf": math.inf, "nan": math.nan}
        ns.update(self.namespace)
        ns.update(printer.consts)
        ns.update(printer.kernels)
        if extra_namespace:
            ns.update(extra_namespace)
        filename = f"<fjit {self.name} {self.stage} {id(self):x}>"
        fn, src = compile_function(src, "computation", ns, filename)
        ns.pop("computation")   # not in its own globals: no cycle, freed as soon as unused
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
        # Tracebacks show the generated source while the function lives; an evicted program (or a
        # check-mode stage) takes its source with it, so linecache does not grow with recompiles.
        weakref.finalize(fn, _forget_source, filename, linecache.cache[filename]).atexit = False
        return _without_autocast(fn) if self.autocast_off else fn


AMP_DEVICES = ("cpu", "cuda")      # the device types autocast has a state for


def _without_autocast(fn: Callable) -> Callable:
    """`fn` run with autocast off (autocast_off, without a context manager's cost: this runs on
    every cached call)."""
    any_on = torch._C._is_any_autocast_enabled

    def run(*args):
        if not any_on():
            return fn(*args)
        on = _switch_off()
        try:
            return fn(*args)
        finally:
            _switch_on(on)
    return run


@contextlib.contextmanager
def autocast_off():
    """Autocast off on every device where it is on, and on again after: where a program that holds
    autocast's casts as ops runs (its own regions switch it on around an op and off again)."""
    on = _switch_off()
    try:
        yield
    finally:
        _switch_on(on)


def _switch_off() -> list[str]:
    """Switch autocast off where it is on; the device types it was on for."""
    on = [d for d in AMP_DEVICES if torch.is_autocast_enabled(d)]
    for d in on:
        torch.set_autocast_enabled(d, False)
    return on


def _switch_on(devices: list[str]) -> None:
    for d in devices:
        torch.set_autocast_enabled(d, True)


class TracePrinter:
    """Prints a trace as Python source.  Values that have no safe literal become named constants,
    so user strings and objects are never spliced into the source unescaped."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.consts: dict[str, Any] = dict(trace.consts)
        self._const_names: dict[int, str] = {id(v): k for k, v in trace.consts.items()}
        self.kernels: dict[str, Callable] = {}

    def const(self, value) -> str:
        name = self._const_names.get(id(value))
        if name is None:
            name = f"_c{len(self.consts)}"
            while name in self.consts:
                name += "_"
            self.consts[name] = value
            self._const_names[id(value)] = name
        return name

    def value(self, x) -> str:
        if isinstance(x, Var):
            return x.name
        t = type(x)
        if x is None or t is bool or t is int:
            return repr(x)
        if t is float:
            return repr(x) if math.isfinite(x) else ("-inf" if x < 0 else "inf") if math.isinf(x) else "nan"
        if t is str:
            return repr(x)   # repr of a str is always a safe literal
        if x is Ellipsis:
            return "..."
        if isinstance(x, torch.dtype):
            return str(x)    # "torch.float32"
        if isinstance(x, torch.memory_format):
            return str(x)    # "torch.channels_last"
        if isinstance(x, torch.device):
            return f"torch.device({x.type!r}{'' if x.index is None else ', ' + str(x.index)})"
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            if self.trace.sizes is None or sizes_of(x) is not self.trace.sizes:
                raise SymbolicUnsupported(f"a symbolic value {x} of another trace")
            return self.trace.sizes.text(x)
        if t is slice:
            return f"slice({self.value(x.start)}, {self.value(x.stop)}, {self.value(x.step)})"
        if t is tuple or t is torch.Size:
            inner = ", ".join(self.value(y) for y in x)
            return f"({inner},)" if len(x) == 1 else f"({inner})"
        if t is list:
            return "[" + ", ".join(self.value(y) for y in x) + "]"
        if t is dict and all(type(k) in (str, int, bool) or k is None for k in x):
            return "{" + ", ".join(f"{self.value(k)}: {self.value(v)}" for k, v in x.items()) + "}"
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return f"{self.const(type(x))}({', '.join(self.value(y) for y in x)})"
        if is_structseq(x):
            return f"{self.const(type(x))}({self.value(tuple(x))})"
        return self.const(x)

    def call(self, b: BoundSymbol) -> str:
        parts = [self.value(a) for a in b.args]
        parts += [f"{k}={self.value(v)}" for k, v in b.kwargs.items()]
        fn = b.sym.qualname
        if b.sym.has(Tag.KERNEL):
            self.kernels[fn] = b.sym.fn
        elif fn.startswith("_c") or not _resolvable(fn):
            fn = self.const(b.sym.fn)
        return f"{fn}({', '.join(parts)})"

    def target(self, out) -> str:
        if out is None:
            return "_"
        if isinstance(out, Var):
            return out.name
        inner = ", ".join(self.target(o) for o in out)
        return f"({inner},)" if len(out) == 1 else f"({inner})"

    def bsym_lines(self, b: BoundSymbol, indent: str) -> list[str]:
        lines = []
        if b.comment:
            lines += [f"{indent}# {line}".rstrip() for line in b.comment.splitlines()]
        if b.sym.qualname == "del":
            return lines + [f"{indent}del {', '.join(v.name for v in b.args)}"]
        types = "  ".join(f"{v.name}: \"{v.type_string(size_text)}\"" for v in b.outputs())
        note = "  # torch fallback" if b.sym.has(Tag.FALLBACK) else ""
        lines.append(f"{indent}{self.target(b.output)} = {self.call(b)}" +
                     (f"  # {types}" if types else "") + note)
        for s in b.subsymbols:
            lines += [f"{indent}  # {line.strip()}" for line in self.bsym_lines(s, "")]
        return lines

    def source(self, imports: bool = False) -> str:
        body = self._body()
        if not imports:
            return body
        head = ["import operator", "from math import inf, nan", "import torch",
                "from fjit.runtime import fjit_ops, prims"]
        if self.kernels:
            head.append(f"from fjit.runtime import {', '.join(sorted(self.kernels))}")
        if self.consts:
            key = f"{id(self.trace):x}"
            register_constants(self.trace, key, tuple(self.consts.values()))
            names = ", ".join(self.consts)
            head.append("from fjit.runtime import trace_constants")
            head.append(f"{names}{',' if len(self.consts) == 1 else ''} = trace_constants({key!r})"
                        "  # objects with no literal, held while the trace lives")
        title, rest = body.split("\n", 1)
        return "\n".join([title] + head) + "\n" + rest

    def _body(self) -> str:
        t = self.trace
        params = ", ".join(v.name for v in t.inputs)
        lines = [f"# fjit trace of {t.name!r}, stage: {t.stage}", f"def computation({params}):"]
        if t.inputs:
            lines.append("  # " + "  ".join(f"{v.name}: \"{v.type_string(size_text)}\"" for v in t.inputs))
        if t.sizes is not None:
            lines += [f"  {line}" for line in t.sizes.bindings(t.inputs, (t.bsyms, t.output))]
        for b in t.bsyms:
            lines += self.bsym_lines(b, "  ")
        if t.rebuild is None:
            lines.append(f"  return {self.value(t.output)}")
        else:
            args = ", ".join(self.value(v) for v in t.output)
            lines.append(f"  return {self.const(t.rebuild)}({args})  # rebuilds {t.rebuild.__doc__}")
        return "\n".join(lines) + "\n"


_CONSTANTS: dict[str, tuple] = {}


def register_constants(owner, key: str, values: tuple) -> None:
    """Make `trace_constants(key)` return `values` while `owner` (the trace) lives."""
    if key not in _CONSTANTS:
        weakref.finalize(owner, _CONSTANTS.pop, key, None).atexit = False
    _CONSTANTS[key] = values


def trace_constants(key: str) -> tuple:
    """The constants a printed trace refers to (fjit.runtime re-exports this for printed sources)."""
    try:
        return _CONSTANTS[key]
    except KeyError:
        raise LookupError(f"fjit: the constants of trace {key} went with its trace; print the trace "
                          f"again from fjit.last_traces") from None


def _forget_source(filename: str, entry) -> None:
    if linecache.cache.get(filename) is entry:    # not an entry a later trace re-registered
        del linecache.cache[filename]


_RESOLVABLE: dict[str, bool] = {}


def _resolvable(qualname: str) -> bool:
    """Whether `qualname` names what the printed source can reach from its namespace roots."""
    ok = _RESOLVABLE.get(qualname)
    if ok is None:
        root, _, rest = qualname.partition(".")
        ok = root in ("torch", "operator", "prims", "fjit_ops") and bool(rest)
        if ok and root in ("torch", "operator"):
            obj = torch if root == "torch" else operator
            for part in rest.split("."):
                obj = getattr(obj, part, None)
                if obj is None:
                    ok = False
                    break
        _RESOLVABLE[qualname] = ok
    return ok
