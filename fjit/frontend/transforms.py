"""torch.func transforms called inside a trace: each call is one opaque op.

functorch's transforms wrap tensors in C++ (BatchedTensor, GradTrackingTensor), below
__torch_function__, so a transform cannot be traced through fjit's proxies: the function it
transforms would meet a proxy it closed over (an input read inside `vmap(lambda r: r * x[0])`) as
a tensor no traced op made, FJ101.  So a transform applied while tracing, to proxies or to a
function that reaches them, is recorded as one op whose inputs are every proxy it reaches: the
call's arguments and what its function closes over (through nested functions, partials and
containers).  At run time the op calls the transform itself on the real tensors, with its function
rebuilt around them; the op's metadata comes from that call on meta tensors, as for any opaque op.
A module among them whose parameters are proxies (a jitted module's submodule, `vmap(self.head)`)
is called through `functional_call` with those tensors as the op's inputs.

The patches sit on the functions each public transform calls at call time, not on the public
names, so `from torch.func import grad` done before the trace is covered too:
- `apis.vmap_impl`: vmap, and the vmaps inside jacrev, jacfwd and hessian;
- `eager_transforms.grad_impl`, `grad_and_value_impl`: grad, grad_and_value;
- `eager_transforms._jvp_with_argnums`: jvp, and jacfwd's pushforward;
- `eager_transforms._vjp_with_argnums`: vjp and jacrev.  Its output is an op; its pullback is a
  function, which, called on proxies (or vmapped by jacrev), records an op that runs the real vjp
  again and applies its pullback: the forward is recomputed there, at the cost of one more
  forward, since a trace cannot hold a live autograd graph between two ops.
A transform of plain tensors and functions that reach no proxy runs as torch's own.
"""
from __future__ import annotations

import functools
import types
from typing import Any, NamedTuple

import torch
import torch.utils._pytree as pytree
from torch._functorch import apis, eager_transforms

from fjit.frontend.context import ProcessPatch, current
from fjit.frontend.dispatch import dispatch
from fjit.frontend.proxies import TensorProxy


class _Slot(NamedTuple):
    """Where the op's i-th input goes when the call is rebuilt."""
    index: int


class _Function(NamedTuple):
    fn: types.FunctionType
    cells: tuple        # each cell's content as a template, or _EMPTY
    defaults: Any


class _Partial(NamedTuple):
    func: Any
    args: Any
    keywords: Any


class _ModuleCall(NamedTuple):
    """A module whose parameters or buffers are proxies while the trace runs (a jitted module's
    own submodule, `vmap(self.head)`): rebuilt as a call of it through functional_call with the
    op's inputs, so its tensors are inputs of the op (and get their gradients through it)."""
    module: Any
    names: tuple
    tensors: tuple      # the templates of the named tensors


class _Container(NamedTuple):
    kind: type
    items: Any          # a tuple of templates, or of (key, template) for a dict


_EMPTY = object()       # a closure cell not yet assigned


def _lift(obj, found: list, seen: dict):
    """`obj` as a template with every TensorProxy it reaches replaced by a _Slot (the proxy
    appended to `found`); `obj` itself where it reaches none."""
    if isinstance(obj, TensorProxy):
        found.append(obj)
        return _Slot(len(found) - 1)
    if id(obj) in seen:
        return seen[id(obj)]
    if isinstance(obj, types.FunctionType) and (obj.__closure__ or obj.__defaults__):
        seen[id(obj)] = obj          # a function reaching itself keeps that reference
        cells = tuple(_lift(_cell_content(c), found, seen) for c in obj.__closure__ or ())
        defaults = _lift(obj.__defaults__, found, seen)
        same = defaults is obj.__defaults__ and all(
            t is _cell_content(c) for t, c in zip(cells, obj.__closure__ or ()))
        out = obj if same else _Function(obj, cells, defaults)
    elif isinstance(obj, torch.nn.Module):
        named = [(n, t) for n, t in (*obj.named_parameters(remove_duplicate=False),
                                     *obj.named_buffers(remove_duplicate=False)) if isinstance(t, TensorProxy)]
        if not named:
            return obj
        out = _ModuleCall(obj, tuple(n for n, _ in named), tuple(_lift(t, found, seen) for _, t in named))
    elif isinstance(obj, functools.partial):
        parts = (_lift(obj.func, found, seen), _lift(obj.args, found, seen), _lift(obj.keywords, found, seen))
        out = obj if all(a is b for a, b in zip(parts, (obj.func, obj.args, obj.keywords))) else _Partial(*parts)
    elif isinstance(obj, dict):
        items = tuple((k, _lift(v, found, seen)) for k, v in obj.items())
        out = _Container(dict, items) if any(t is not v for (_, t), v in zip(items, obj.values())) else obj
    elif isinstance(obj, (list, tuple)):
        items = tuple(_lift(v, found, seen) for v in obj)
        kind = list if isinstance(obj, list) else type(obj)
        out = _Container(kind, items) if any(t is not v for t, v in zip(items, obj)) else obj
    else:
        return obj
    seen[id(obj)] = out
    return out


def _cell_content(cell):
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY


def _build(template, values: list):
    """The object `template` stands for, with `values` in its slots (real tensors at run time,
    meta tensors in the metadata run)."""
    if isinstance(template, _Slot):
        return values[template.index]
    if isinstance(template, _Function):
        fn = template.fn
        cells = tuple(types.CellType() if c is _EMPTY else types.CellType(_build(c, values))
                      for c in template.cells)
        rebuilt = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__,
                                     _build(template.defaults, values), cells or None)
        rebuilt.__kwdefaults__, rebuilt.__qualname__ = fn.__kwdefaults__, fn.__qualname__
        rebuilt.__dict__.update(fn.__dict__)
        return rebuilt
    if isinstance(template, _ModuleCall):
        tensors = {n: _build(t, values) for n, t in zip(template.names, template.tensors)}
        return functools.partial(_call_module, template.module, tensors)
    if isinstance(template, _Partial):
        return functools.partial(_build(template.func, values), *_build(template.args, values),
                                 **_build(template.keywords, values))
    if isinstance(template, _Container):
        if template.kind is dict:
            return {k: _build(v, values) for k, v in template.items}
        items = [_build(v, values) for v in template.items]
        if template.kind is list or template.kind is tuple:
            return template.kind(items)
        return template.kind(*items)      # a namedtuple
    return template


def _call_module(module, tensors: dict, *args, **kwargs):
    return torch.func.functional_call(module, tensors, args, kwargs)


def _recorded(name: str, run, call):
    """`run(*call)` where it reaches no proxy (or no trace is running); else one op, recorded,
    whose inputs are the proxies `call` reaches and which runs `run` on the rebuilt call."""
    if current() is None:
        return run(*call)
    found: list = []
    template = _lift(tuple(call), found, {})
    if not found:
        return run(*call)

    structure: list = []        # the result's pytree spec, known from the metadata run

    def op(values):
        leaves, spec = pytree.tree_flatten(run(*_build(template, list(values))))
        structure[:] = [spec]
        return tuple(leaves)        # a trace's op returns a tensor or a flat tuple
    op.__name__ = op.__qualname__ = name
    flat = dispatch(op, (found,), {})
    return pytree.tree_unflatten(list(flat), structure[0])


def _opaque(name: str, impl):
    def traced(*args, **kwargs):
        return _recorded(name, lambda a, k: impl(*a, **k), (args, kwargs))
    traced.__name__ = traced.__qualname__ = impl.__name__
    return traced


def _traced_vjp(func, *primals, argnums=None, has_aux=False):
    """eager_transforms._vjp_with_argnums: (output, pullback[, aux]) (see the module docstring)."""
    impl = _ORIGINALS[eager_transforms, "_vjp_with_argnums"]
    if current() is None:
        return impl(func, *primals, argnums=argnums, has_aux=has_aux)

    def forward(f, p):
        out = impl(f, *p, argnums=argnums, has_aux=has_aux)
        return (out[0], out[2]) if has_aux else out[0]

    def pullback(cotangents, *, retain_graph=True, create_graph=None):
        def run(f, p, ct):
            return impl(f, *p, argnums=argnums, has_aux=has_aux)[1](
                ct, retain_graph=retain_graph, create_graph=create_graph)
        return _recorded("torch.func.vjp.pullback", run, (func, primals, cotangents))
    result = _recorded("torch.func.vjp", forward, (func, primals))
    return (result[0], pullback, result[1]) if has_aux else (result, pullback)


_PATCHES = [
    (apis, "vmap_impl", "torch.func.vmap"),
    (eager_transforms, "grad_impl", "torch.func.grad"),
    (eager_transforms, "grad_and_value_impl", "torch.func.grad_and_value"),
    (eager_transforms, "_jvp_with_argnums", "torch.func.jvp"),
]
_ORIGINALS = {(home, attr): getattr(home, attr) for home, attr, _ in _PATCHES}
_ORIGINALS[eager_transforms, "_vjp_with_argnums"] = eager_transforms._vjp_with_argnums
_TRACED = {(home, attr): _opaque(name, _ORIGINALS[home, attr]) for home, attr, name in _PATCHES}
_TRACED[eager_transforms, "_vjp_with_argnums"] = _traced_vjp


def _install():
    for (home, attr), traced in _TRACED.items():
        setattr(home, attr, traced)


def _restore():
    for (home, attr), original in _ORIGINALS.items():
        setattr(home, attr, original)


transforms_traced = ProcessPatch(_install, _restore)
