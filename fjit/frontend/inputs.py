"""Signature inputs: validation (FJ201), the cache key, and the proxies a trace runs on.

One walk over the call's arguments yields both the cache key (the metadata that a compiled program
depends on) and the flat list of runtime values (tensors and floats) that the program takes.
"""
from __future__ import annotations

import keyword
import re

import torch

from fjit.core.ir import NumberVar, TensorVar
from fjit.errors import UnsupportedInputError, catalog_fix, located
from fjit.frontend.context import autocast_key, user_location
from fjit.frontend.proxies import InputDict, InputList, NumberProxy, TensorProxy

ACCEPTED = ("torch.Tensor, int, float, bool, str, None, torch.dtype, torch.device, slice, Ellipsis, "
            "torch.Size, and tuple/list/dict/namedtuple of these")

_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_CONSTANT_TYPES = (int, bool, str, type(None), torch.dtype, torch.device, torch.Size,
                   type(Ellipsis))


# What a compiled program depends on in a tensor, as attribute expressions: the general path's key
# function and the generated fast path are both made from this one list.  The negative bit
# (x.conj().imag of a complex x) is there because kernels read raw data, which does not hold it.
_TENSOR_KEY = ("shape", "stride()", "dtype", "device", "requires_grad", "is_neg()")
_tensor_key = eval("lambda x: (" + ", ".join(f"x.{f}" for f in _TENSOR_KEY) + ")")  # noqa: S307


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def call_key(args: tuple, kwargs: dict, specialized: frozenset) -> tuple[tuple, list]:
    """(cache key, flat runtime values).  Floats are runtime values unless a trace specialized on
    the one at that position, in which case its value is part of the key."""
    parts: list = [torch.is_grad_enabled(), autocast_key()]
    leaves: list = []
    for a in args:
        t = type(a)
        if t is torch.Tensor and a.layout is torch.strided:
            parts.append(_tensor_key(a))
            leaves.append(a)
        else:
            _walk(a, parts, leaves, specialized, "argument")
    if kwargs:
        for k, v in kwargs.items():
            parts.append(k)
            _walk(v, parts, leaves, specialized, f"argument {k!r}")
    return tuple(parts), leaves


# The fast path: for calls whose arguments are all positional tensors, floats and scalar constants
# (the common case), a function generated for that signature checks the argument types, builds the
# key as one flat tuple and calls the program; any other call takes call_key and the general cache.
MISS = object()
_FAST_CONSTANTS = (int, bool, str, type(None))


def fast_path(args: tuple, specialized: frozenset):
    """(call, key, cache) generated for calls typed like `args`, or None if they do not qualify.
    `call(*args)` looks the program up in `cache` (a dict of its own, so one generation's keys
    never meet another's programs) and returns its result, or MISS (other arity, other types, or
    no program yet); `key(*args)` is the key to store a program under, or None for arguments
    typed differently."""
    checks, key, leaves = [], ["_grad()", "_autocast()"], []
    for i, a in enumerate(args):
        t = type(a)
        name = f"a{i}"
        if t is torch.Tensor:
            checks.append(f"type({name}) is not _Tensor or {name}.layout is not _strided")
            key += [f"{name}.{f}" for f in _TENSOR_KEY]
            leaves.append(name)
        elif t is float:
            checks.append(f"type({name}) is not float")
            if len(leaves) in specialized:
                key.append(name)
            leaves.append(name)
        elif t in _FAST_CONSTANTS:
            checks.append(f"type({name}) is not _c{i}")
            key.append(name)
        else:
            return None
    params = ", ".join(f"a{i}" for i in range(len(args)))
    guard = " or ".join(checks) or "False"
    source = (f"def call(*args):\n"
              f"    if len(args) != {len(args)}:\n"
              f"        return MISS\n"
              f"    {params}{',' if len(args) == 1 else ''} = args\n" if args else
              f"def call(*args):\n"
              f"    if args:\n"
              f"        return MISS\n")
    source += (f"    if {guard}:\n"
              f"        return MISS\n"
              f"    program = cache.get(({', '.join(key)},))\n"
              f"    if program is None:\n"
              f"        return MISS\n"
              f"    return program({', '.join(leaves)})\n"
              f"def key({params}):\n"
              f"    if {guard}:\n"
              f"        return None\n"
              f"    return ({', '.join(key)},)\n")
    cache: dict = {}
    namespace = {"_Tensor": torch.Tensor, "_strided": torch.strided, "_grad": torch.is_grad_enabled,
                 "_autocast": autocast_key, "MISS": MISS, "cache": cache}
    namespace.update({f"_c{i}": type(a) for i, a in enumerate(args) if type(a) in _FAST_CONSTANTS})
    exec(compile(source, "<fjit fast path>", "exec"), namespace)
    return namespace["call"], namespace["key"], cache


def _walk(x, parts, leaves, specialized, where):
    t = type(x)
    if t in _TENSOR_TYPES:
        if x.layout is not torch.strided:
            raise _unsupported(x, where, f"a {x.layout} tensor")
        parts.append(_tensor_key(x))
        leaves.append(x)
    elif t is float:
        parts.append(("f", x) if len(leaves) in specialized else float)
        leaves.append(x)
    elif t in _CONSTANT_TYPES:
        parts.append((t, x))
    elif t is slice:
        parts.append((slice, x.start, x.stop, x.step))
    elif t is tuple or t is list or _is_namedtuple(x):
        parts.append((t, len(x)))
        for y in x:
            _walk(y, parts, leaves, specialized, where)
    elif t is dict:
        for k in x:
            if type(k) not in (int, bool, str, type(None)):
                raise _unsupported(k, f"a key of a dict {where}")
        parts.append((dict, tuple(x)))
        for y in x.values():
            _walk(y, parts, leaves, specialized, where)
    else:
        raise _unsupported(x, where)


def _unsupported(x, where: str, what: str | None = None) -> UnsupportedInputError:
    t = type(x)
    name = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
    if isinstance(x, torch.nn.Module):
        fix = ("compile the module itself, fjit.jit(module), or pass dict(module.named_parameters()) "
               "and call torch.func.functional_call inside (see sharp_edges_catalog/FJ201_object_input.py)")
    elif what is not None:      # a tensor of another layout than strided
        fix = "pass a dense tensor (x.to_dense()), and convert back after the call if you need to"
    else:
        fix = catalog_fix("FJ201_tensor_subclass" if isinstance(x, torch.Tensor) else "FJ201_object_input")
    described = f"{where}, {what}," if what else f"{where} of type {name}"
    return UnsupportedInputError(located("FJ201", f"{described} cannot be proxied; fjit accepts "
                                                  f"{ACCEPTED} (tensors of strided layout)",
                                         *user_location(), fix))


# ----------------------------------------------------------------------------------------------
# Proxies for a trace
# ----------------------------------------------------------------------------------------------

_RESERVED = {"torch", "operator", "prims", "fjit_ops", "inf", "nan", "computation"}
_GENERATED = re.compile(r"^([tng]\d+|_c\d+_*)$")


def _var_name(label: str, used: set) -> str:
    name = re.sub(r"\W", "_", label)
    if not name.isidentifier() or keyword.iskeyword(name) or name in _RESERVED or \
            _GENERATED.match(name):
        name = f"in_{name}" if name.isidentifier() else "in_"
    while name in used:
        name += "_"
    used.add(name)
    return name


def make_proxies(ctx, params: list[tuple[str, object]], leaves: list, concrete_floats=False):
    """Proxied values for the named parameters; fills ctx.inputs, ctx.real_inputs, input labels.
    With `concrete_floats`, float inputs stay real floats (still program inputs, but the trace
    specializes on their values)."""
    used: set = set()
    counter = iter(range(len(leaves)))

    def build(x, label):
        t = type(x)
        if t in _TENSOR_TYPES:
            i = next(counter)
            var = TensorVar(_var_name(label, used), x.shape, x.dtype, x.device, x.stride(),
                            x.requires_grad)
            ctx.inputs.append(var)
            p = TensorProxy(var, is_input=True)
            ctx.input_labels[id(p)] = f"'{label}'"
            return p
        if t is float:
            i = next(counter)
            var = NumberVar(_var_name(label, used))
            ctx.inputs.append(var)
            if concrete_floats:
                ctx.specialized.add(i)
                return x
            return NumberProxy(x, var, frozenset({i}))
        if t is list:
            return InputList(build(y, f"{label}_{j}") for j, y in enumerate(x))
        if t is dict:
            return InputDict((k, build(v, f"{label}_{j}")) for j, (k, v) in enumerate(x.items()))
        if t is tuple:
            return tuple(build(y, f"{label}_{j}") for j, y in enumerate(x))
        if _is_namedtuple(x):
            return t(*(build(y, f"{label}_{f}") for f, y in zip(x._fields, x)))
        return x

    ctx.real_inputs = list(leaves)
    return [build(v, name) for name, v in params]
