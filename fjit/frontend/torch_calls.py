"""Torch callables as fjit reads them: the name a printed trace gives one (`torch.add`,
`torch.Tensor.add`, `torch.ops.aten.add.Tensor`), and a call's arguments as torch's own parser
reads them (numpy's names for native functions), which decide whether a decomposition's signature
takes the call.
"""
from __future__ import annotations

import functools
import inspect
import types

import torch

_MODULES = {"torch": torch, "torch.nn.functional": torch.nn.functional, "torch.special": torch.special,
            "torch.linalg": torch.linalg, "torch.fft": torch.fft}


def qualified_name(func) -> str:
    """How a printed trace names a torch callable (torch.add, torch.Tensor.add, ...).  Cheaper than
    torch.overrides.resolve_name, whose first call indexes all of torch (seconds)."""
    name = getattr(func, "__name__", None)
    owner = getattr(func, "__self__", None)
    if name == "__get__" and owner is not None and hasattr(owner, "__name__"):   # a property
        return f"torch.Tensor.{owner.__name__}.__get__"
    if name is None:
        return repr(func)
    if isinstance(func, torch._ops.OpOverload):     # torch.ops.aten.add.Tensor
        return f"torch.ops.{func.namespace}.{func._opname}.{func._overloadname}"
    if getattr(torch.Tensor, name, None) is func:
        return f"torch.Tensor.{name}"
    for prefix, module in _MODULES.items():
        if getattr(module, name, None) is func:
            return f"{prefix}.{name}"
    return f"{getattr(func, '__module__', None) or '?'}.{getattr(func, '__qualname__', name)}"


def op_name(func) -> str:
    name = qualified_name(func)
    return name.replace("torch.Tensor.", "Tensor.").replace(".__get__", "")


# numpy's argument names, which torch's argument parser takes for those of every native function
# (python_arg_parser.cpp): `torch.cat(xs, axis=1)` (transformers' Funnel), `x.sum(axis=0, keepdims=True)`
_NUMPY_NAMES = {"axis": "dim", "keepdims": "keepdim"}


def torch_names(func, kwargs: dict) -> dict:
    """`kwargs` of a call of `func` with numpy's names as torch's own, where func is a native
    function (a Python function such as F.softmax takes only its own names, in eager too)."""
    if not kwargs or isinstance(func, types.FunctionType) or not any(k in kwargs for k in _NUMPY_NAMES):
        return kwargs
    return {(_NUMPY_NAMES[k] if k in _NUMPY_NAMES and _NUMPY_NAMES[k] not in kwargs else k): v
            for k, v in kwargs.items()}


@functools.lru_cache(maxsize=None)
def _signature(fn) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def accepts(fn, args: tuple, kwargs: dict) -> bool:
    """Whether fn's signature binds (args, kwargs): a decomposition that does not know an argument
    of the call leaves the op one torch call, rather than failing inside fjit."""
    sig = _signature(fn)
    if sig is None:
        return True
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return False
    return True
