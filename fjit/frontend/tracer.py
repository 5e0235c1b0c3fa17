"""Tracing: run the user's function on proxies and return the trace it recorded.

Torch functions are intercepted by a TorchFunctionMode (it sees factories, which have no proxy
argument, as well as ops on proxies); Tensor methods and operators reach the dispatcher through the
proxy itself.  Globals and closure variables are read once, here, and recorded as bindings.
"""
from __future__ import annotations

import contextlib
import dataclasses
import dis
import inspect
import itertools
import types
import typing

import torch
from torch.overrides import TorchFunctionMode

from fjit.core.ir import Binding, Trace
from fjit.errors import error_for
from fjit.frontend.callables import code_location, names, partial_arguments, python_function
from fjit.frontend.context import Mode, TraceContext, is_located_file, user_location
from fjit.frontend.dispatch import dispatch, opaque_calls_traced
from fjit.frontend.modes import record_mode_changes
from fjit.frontend.inputs import make_proxies
from fjit.frontend.observer import call_as_user_code, observe
from fjit.frontend.outputs import output_structure
from fjit.frontend.rng import generators_traced


class _Intercept(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {})


@dataclasses.dataclass
class TraceResult:
    trace: Trace
    specialized: frozenset     # float input positions the trace depends on the value of
    edges: list                # sharp edges found (permissive modes)


def trace_function(fn, args: tuple, kwargs: dict, leaves: list, mode: Mode,
                   namespace: dict, observed_strides: dict | None = None) -> TraceResult:
    """Trace `fn` on proxies of `args`.  `observed_strides` (var name -> (shape, strides)) corrects the
    layouts that opaque ops' meta kernels predicted wrongly on an earlier trace of this call."""
    ctx = TraceContext(fn, mode, dispatch, namespace)
    ctx.observed_strides = observed_strides or {}
    scan = scan_bindings(fn)
    ctx.tensor_origins, bindings = scan.origins, scan.bindings
    names = _positional_names(fn, len(args))
    with ctx:
        # `type(s) is float` cannot be True of a proxy: code that asks type() gets real floats,
        # and the trace specializes on their values (make_proxies puts them in ctx.specialized).
        proxied = make_proxies(ctx, [(n, a) for n, a in zip(names, args)] +
                               [(k, v) for k, v in kwargs.items()], leaves,
                               concrete_floats=scan.asks_type)
        pargs, pkwargs = proxied[:len(args)], dict(zip(kwargs, proxied[len(args):]))
        with observe(ctx, fn), _Intercept(), generators_traced, opaque_calls_traced, \
                compiling_answered_true():
            try:
                result = call_as_user_code(fn, pargs, pkwargs)
            except Exception as e:
                _note_call_chain(e, ctx.fn_name)
                raise
            if ctx.raised is not None:   # a try/except in the user's code caught a sharp edge
                raise error_for(ctx.raised)
            record_mode_changes(ctx)     # a mode the function set and left set stays set
            where = ctx.return_location or code_location(fn) or user_location()
            output, rebuild = output_structure(ctx, result, where)
        trace = Trace(ctx.fn_name, list(ctx.inputs), list(ctx.scopes[0]), output, dict(ctx.consts),
                      stage="traced", bindings=bindings, namespace=namespace, rebuild=rebuild)
    return TraceResult(trace, frozenset(ctx.specialized), list(ctx.edges))


_CHAIN_HEAD, _CHAIN_TAIL = 2, 5     # frames shown from the traced function's end and the error's


def _note_call_chain(error: BaseException, fn_name: str) -> None:
    """Add to an error raised while tracing the chain of calls, in user and library code, from the
    traced function down to the line that raised (fjit and torch frames left out): an error deep
    in a model's library code names that line, and how the traced function reached it."""
    frames = []
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_located_file(code.co_filename):
            frames.append(f"  {code.co_filename}:{tb.tb_lineno} in {code.co_qualname}")
        tb = tb.tb_next
    if len(frames) < 2 or any("fjit: raised while tracing" in n for n in getattr(error, "__notes__", ())):
        return
    if len(frames) > _CHAIN_HEAD + _CHAIN_TAIL:
        skipped = len(frames) - _CHAIN_HEAD - _CHAIN_TAIL
        frames = frames[:_CHAIN_HEAD] + [f"  ... {skipped} more calls ..."] + frames[-_CHAIN_TAIL:]
    error.add_note(f"fjit: raised while tracing '{fn_name}', in this chain of calls "
                   f"(innermost last):\n" + "\n".join(frames))


@contextlib.contextmanager
def compiling_answered_true():
    """`torch.compiler.is_compiling()` (and what is built on it: `torch._dynamo.is_compiling()`,
    transformers' `is_torchdynamo_compiling()`) answers True while fjit traces, as it does while
    Dynamo traces.  Libraries ask it to leave out what a tracing compiler cannot follow (reading a
    mask's values to skip it, data-dependent asserts, eager-only fast paths); answering False sends
    them down the data-dependent route, FJ106.  `is_dynamo_compiling()` and `is_exporting()` stay
    False: fjit is neither Dynamo nor export, and code behind those uses their APIs.  The flag is
    torch's process-wide one, restored when the trace ends (raised or not)."""
    old = torch.compiler._is_compiling_flag
    torch.compiler._is_compiling_flag = True
    try:
        yield
    finally:
        torch.compiler._is_compiling_flag = old


def _positional_names(fn, n: int) -> list[str]:
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for i in range(n):
        if i < len(params) and params[i].kind in (params[i].POSITIONAL_ONLY,
                                                  params[i].POSITIONAL_OR_KEYWORD):
            names.append(params[i].name)
        else:
            star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), "arg")
            names.append(f"{star}_{i}")
    return names


# ----------------------------------------------------------------------------------------------
# Globals, closures and defaults: bound as constants at trace time
# ----------------------------------------------------------------------------------------------

def _code_objects(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _code_objects(c)


def _loads_global(code, name: str) -> bool:
    """Whether `code` (or code nested in it) reads the global/builtin `name` (not an attribute)."""
    return any(ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval == name
               for c in _code_objects(code) for ins in dis.get_instructions(c))


_SCAN_DEPTH, _SCAN_WIDTH = 3, 256   # how far scan_bindings looks into bound objects (trace-time cost)


class Scan(typing.NamedTuple):
    origins: dict      # id(tensor) -> (catalog entry, where it came from)
    bindings: list     # [Binding]: the globals and closure variables fn reads
    asks_type: bool    # whether fn (or a function of its module it calls) calls the builtin type()


def module_tensor_origins(module: torch.nn.Module, describe: str) -> dict:
    """id(tensor) -> (catalog entry, description) for every tensor of `module`: its parameters and
    buffers (`global 'model', parameter 'fc1.weight'`) and plain tensor attributes of its
    submodules, which are neither and so are not passed in by fjit.jit(module) either."""
    origins = {}
    for kind, named in (("parameter", module.named_parameters()), ("buffer", module.named_buffers())):
        for n, t in named:
            origins.setdefault(id(t), ("FJ101_module_parameter", f"{describe}, {kind} '{n}'"))
    for prefix, m in module.named_modules():
        for n, t in vars(m).items():
            if isinstance(t, torch.Tensor):
                origins.setdefault(id(t), ("FJ101_module_tensor_attribute",
                                           f"{describe}, tensor attribute "
                                           f"'{prefix + '.' if prefix else ''}{n}' (neither a "
                                           f"parameter nor a buffer)"))
    return origins


def scan_bindings(fn) -> Scan:
    """What `fn` can read from outside: the tensors (for FJ101), the bindings, and whether it asks
    type() of something."""
    origins: dict = {}
    bindings: list = []
    seen_fns: set = set()
    asks_type = False

    def note_tensors(obj, describe, entry, depth=0):
        """Tensors reachable from a bound value (attributes and items, a few levels deep) and the
        path that names each one, for FJ101's message."""
        if isinstance(obj, torch.Tensor):
            origins.setdefault(id(obj), (entry, describe))
            return
        if isinstance(obj, torch.nn.Module):
            origins.update((k, v) for k, v in module_tensor_origins(obj, describe).items()
                           if k not in origins)
            return
        if depth >= _SCAN_DEPTH or isinstance(obj, (types.ModuleType, type, str, bytes)) or callable(obj):
            return
        if isinstance(obj, (list, tuple, dict)):
            children = ((f"item {k!r} of {describe}", v) for k, v in
                        (obj.items() if isinstance(obj, dict) else enumerate(obj)))
        elif hasattr(obj, "__dict__"):
            children = ((f"attribute '{n}' of {describe}", v) for n, v in vars(obj).items())
        else:
            return
        for child, value in itertools.islice(children, _SCAN_WIDTH):
            note_tensors(value, child, "FJ101_attribute_tensor", depth + 1)

    def visit(f, top: bool):
        nonlocal asks_type
        f = inspect.unwrap(f) if callable(f) else f
        code = getattr(f, "__code__", None)
        if code is None or id(f) in seen_fns:
            return
        seen_fns.add(id(f))
        names = set()
        for c in _code_objects(code):
            names.update(c.co_names)
        g = getattr(f, "__globals__", {})
        if "type" in names and "type" not in g and _loads_global(code, "type"):
            asks_type = True
        for name in sorted(names):
            if name not in g:
                continue
            value = g[name]
            if top:
                bindings.append(Binding(name, "global", type(value).__qualname__))
            note_tensors(value, f"global '{name}'", "FJ101_global_tensor")
            if isinstance(value, types.ModuleType):
                for attr in names:
                    t = getattr(value, attr, None) if attr in vars(value) else None
                    if isinstance(t, torch.Tensor):
                        origins.setdefault(id(t), ("FJ101_attribute_tensor",
                                                   f"attribute '{attr}' of module '{name}'"))
            elif isinstance(value, types.FunctionType) and value.__module__ == f.__module__:
                visit(value, False)
        for name, cell in zip(code.co_freevars, f.__closure__ or ()):
            try:
                value = cell.cell_contents
            except ValueError:   # an empty cell: a name assigned later in the enclosing scope
                continue
            if top:
                bindings.append(Binding(name, "closure", type(value).__qualname__))
            note_tensors(value, f"closure variable '{name}'", "FJ101_closure_tensor")
            if isinstance(value, types.FunctionType):
                visit(value, False)
        try:
            params = inspect.signature(f).parameters.values()
        except (TypeError, ValueError):
            params = ()
        for p in params:
            if isinstance(p.default, torch.Tensor):
                origins.setdefault(id(p.default), ("FJ101_default_arg_tensor", f"default argument '{p.name}'"))

    # A bound method (an object's __call__ is one): the tensors it reaches through `self`, the
    # module's of fjit.jit(model.forward), the tensor's of fjit.jit(x.add).
    method = python_function(fn)
    owner = getattr(method, "__self__", None)
    describe = f"'self' of '{names(method)[2]}'"
    if isinstance(owner, torch.nn.Module):
        origins.update(module_tensor_origins(owner, describe))
    elif isinstance(owner, torch.Tensor):
        note_tensors(owner, describe, "FJ101_closure_tensor")
    elif not isinstance(owner, (types.ModuleType, type, type(None))):
        for name, value in itertools.islice(getattr(owner, "__dict__", {}).items(), _SCAN_WIDTH):
            note_tensors(value, f"attribute '{name}' of {describe}", "FJ101_attribute_tensor", 1)
    for name, value in partial_arguments(fn):
        note_tensors(value, f"argument '{name}' bound by functools.partial", "FJ101_closure_tensor")
    visit(method, True)
    return Scan(origins, bindings, asks_type)

