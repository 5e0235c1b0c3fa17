"""What a traced function reads from outside its arguments: the globals, closure variables and
defaults it names, recorded as the trace's bindings, and the tensors reachable from them (FJ101).

The tracer scans the function once, before its run: a tensor found here that reaches an op is
reported with the name that reaches it (`global 'w'`, `closure variable 'mask'`, a module's
parameter), and the bindings are what a cached trace is checked against on later calls.
"""
from __future__ import annotations

import dis
import inspect
import itertools
import types
import typing

import torch

from fjit.core.ir import Binding
from fjit.strict.jitted_callable import names, partial_arguments, python_function


def _code_objects(code):
    """`code` and the code objects nested in it (its functions, lambdas, comprehensions)."""
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

