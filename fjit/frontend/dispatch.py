"""The dispatcher: what happens when the traced function calls a torch op.

Every torch function, Tensor method and operator reached during tracing lands in `dispatch`.  It records
a grad-mode or autocast change made since the last op (frontend/modes.py), rejects data-dependent
conversions (FJ106), runtime-identity questions and autograd hooks (FJ202), functionalizes in-place
ops, `out=` and setitem (FJ102 when they reach an input), and hands every other call to
frontend/record.py, which records it.  frontend/library_calls.py says what becomes of torch's
autograd.Function.apply, associative_scan and reentrant checkpoints while fjit traces, and
frontend/transforms.py of the torch.func transforms (vmap, grad, jvp, vjp).
"""
from __future__ import annotations

import sys
import types

import torch

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, Tag, TensorVar, flatten_values, map_values
from fjit.core.trace import Trace
from fjit.core.prims import OUT_OF_PLACE
from fjit.errors import UnsupportedOpError, located
from fjit.core.meta import channels_last_strides, meta_tensor, relaid_channels_last, suggests_channels_last
from fjit.frontend.context import TraceContext, current
from fjit.frontend.proxies import NumberProxy, TensorProxy, set_data
from fjit.frontend.rng import bind_generators, rng_preserved
from fjit.runtime import functional_inplace, register_hook, retain_grad, setitem, view_scatter
from fjit.frontend.modes import record_mode_changes
from fjit.frontend.stateful_ops import WRITES_INTO_ARGUMENTS
from fjit.frontend.torch_calls import accepts, op_name, torch_names
from fjit.frontend.record import DECOMPOSITIONS, RANDOM_OPS, REPLACEMENTS, torch_symbol, trace_call
from fjit.strict.locate import user_location

# Questions whose answer is a tensor's data in Python: catalog entry and how to say it.  In the
# permissive modes the question is put to this call's concrete values (the trace then specializes
# on the answer without a guard, as docs/design.md says).
DATA_DEPENDENT = {
    torch.Tensor.__bool__: ("FJ106_if_tensor", "bool() of"),
    torch.Tensor.is_nonzero: ("FJ106_if_tensor", "is_nonzero() of"),
    torch.Tensor.__contains__: ("FJ106_if_tensor", "`in` on"),
    torch.allclose: ("FJ106_if_tensor", "torch.allclose() of"),
    torch.Tensor.allclose: ("FJ106_if_tensor", "allclose() of"),
    torch.equal: ("FJ106_if_tensor", "torch.equal() of"),
    torch.Tensor.equal: ("FJ106_if_tensor", "equal() of"),
    torch.Tensor.item: ("FJ106_item", ".item() of"),
    torch.Tensor.tolist: ("FJ106_tolist", ".tolist() of"),
    torch.Tensor.numpy: ("FJ106_tolist", ".numpy() of"),
    torch.Tensor.__array__: ("FJ106_tolist", "numpy conversion (np.asarray) of"),
    torch.Tensor.__int__: ("FJ106_int_of_tensor", "int() of"),
    torch.Tensor.__index__: ("FJ106_int_of_tensor", "use as an index of"),
    torch.Tensor.__float__: ("FJ106_int_of_tensor", "float() of"),
    torch.Tensor.__complex__: ("FJ106_int_of_tensor", "complex() of"),
    torch.Tensor.__repr__: ("FJ106_tolist", "formatting (str/repr/print) of"),
    torch.Tensor.__format__: ("FJ106_tolist", "formatting (f-string/format) of"),
}

# Autograd hooks on traced values would be registered on a trace-time stand-in and never run.
AUTOGRAD_HOOKS = {torch.Tensor.register_hook, torch.Tensor.retain_grad,
                  torch.Tensor.register_post_accumulate_grad_hook}

# Questions about memory, not values or metadata: no trace-time answer is eager's.
RUNTIME_IDENTITY = {torch.Tensor.data_ptr, torch.Tensor.storage, torch.Tensor.untyped_storage,
                    torch.Tensor.storage_offset, torch.Tensor._version.__get__,
                    torch.Tensor.__reduce_ex__, torch.Tensor.__setstate__}

_INPLACE_DUNDERS = {getattr(torch.Tensor, f"__i{n}__") for n in ("add", "sub", "mul", "truediv", "floordiv", "mod",
                    "pow", "and", "or", "xor", "lshift", "rshift") if hasattr(torch.Tensor, f"__i{n}__")}


# Gradient hooks on traced values are ops of the program (runtime.register_hook): kept by every
# pass, and run by torch autograd, which the compiled backward gives way to (autodiff/joint.py).
_HOOK_TAGS = frozenset({Tag.IMPURE, Tag.HOOK})
HOOK_OPS = {torch.Tensor.register_hook: Symbol("fjit_ops.register_hook", register_hook, _HOOK_TAGS),
            torch.Tensor.retain_grad: Symbol("fjit_ops.retain_grad", retain_grad, _HOOK_TAGS)}
GRADIENT_HOOKS = set(HOOK_OPS)
_VIEW_SCATTER = Symbol("fjit_ops.view_scatter", view_scatter)
_SETITEM = Symbol("fjit_ops.setitem", setitem)
_FUNCTIONAL_INPLACE = Symbol("fjit_ops.functional_inplace", functional_inplace)
_FUNCTIONAL_INPLACE_RANDOM = Symbol("fjit_ops.functional_inplace", functional_inplace,
                                    frozenset({Tag.RANDOM}))


# ----------------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------------

def dispatch(func, args: tuple, kwargs: dict):
    # No user code runs below, so the observer's profile hook (strict/observer.py) is switched
    # off: torch's meta kernels make thousands of Python calls it would otherwise see.
    # (A C-level profiler such as cProfile cannot be reinstalled from Python: it stays on.)
    hook = sys.getprofile()
    pause = type(hook) is types.FunctionType
    if pause:
        sys.setprofile(None)
    try:
        # Everything below works on meta tensors, which must not be traced themselves.
        with torch._C.DisableTorchFunction():
            return _dispatch(current(), func, args, kwargs)
    finally:
        if pause:
            sys.setprofile(hook)


# Mode switches with a torch-function override (`with torch.autocast(...)`, as Dynamo records it) run
# for real while tracing; later ops are recorded under their mode (record_mode_changes).
RUN_FOR_REAL = {torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast}


def _dispatch(ctx, func, args, kwargs):
    if func in RUN_FOR_REAL:
        return func(*args, **kwargs)
    kwargs = torch_names(func, kwargs)
    if len(ctx.scopes) == 1:      # a top-level op (not a prim of a decomposition)
        record_mode_changes(ctx)
    if func in DATA_DEPENDENT:
        return _data_dependent(ctx, func, args, kwargs)
    if func in RUNTIME_IDENTITY:
        raise UnsupportedOpError(located(
            "FJ202", f"{op_name(func)} asks about a tensor's memory, which a traced program "
                     f"cannot know at trace time", *user_location(),
            "compute it outside the compiled function and pass the result in"))
    if func in GRADIENT_HOOKS and isinstance(args[0], TensorProxy):
        return _gradient_hook(ctx, func, args, kwargs)
    if func in AUTOGRAD_HOOKS:
        raise UnsupportedOpError(located(
            "FJ202", f"{op_name(func)} on a value computed inside a compiled function: the hook "
                     f"would be attached to a trace-time stand-in and never run", *user_location(),
            "register the hook on the compiled function's output, or call this part outside"))
    if func is torch.Tensor.__deepcopy__:     # copy.deepcopy(t): a new tensor with t's values
        return dispatch(torch.Tensor.clone, (args[0],), {})
    if func in RANDOM_OPS or "generator" in kwargs:
        args, kwargs = bind_generators(ctx, args, kwargs)   # see frontend/rng.py
    if func in WRITES_INTO_ARGUMENTS:     # batch norm's running statistics: frontend/stateful_ops.py
        parts = WRITES_INTO_ARGUMENTS[func](dispatch, args, kwargs)
        if parts is not None:
            for target, value in parts[1]:
                _write(ctx, target, _conform(value, target), func, "FJ102_inplace_input",
                       f"{op_name(func)}(training=True)")
            return parts[0]
    if func is torch.Tensor.requires_grad_ and isinstance(args[0], TensorProxy) and \
            args[0].ir.requires_grad is bool(args[1] if len(args) > 1 else kwargs.get("requires_grad", True)):
        # nothing changes (transformers' gradient checkpointing hook marks the embeddings' output,
        # which requires grad already): no op, where an opaque op kept two copies of the value
        return args[0]
    if _is_mutation(func, kwargs):
        return _functionalize(ctx, func, args, kwargs)
    if func is torch.conv2d and ctx.channels_last_convs and _cpu_4d_operands(args):
        return _channels_last_convolution(ctx, func, args, kwargs)
    if func in REPLACEMENTS and accepts(REPLACEMENTS[func], args, kwargs):
        try:
            return REPLACEMENTS[func](*args, **kwargs)
        except NotImplementedError:
            pass
    return trace_call(ctx, torch_symbol(func), func, args, kwargs, DECOMPOSITIONS.get(func))


def _cpu_4d_operands(args: tuple) -> bool:
    """Whether a convolution's input and weight are traced 4-D CPU values."""
    return len(args) >= 2 and all(isinstance(t, TensorProxy) and t.ir.ndim == 4 and
                                  t.ir.device.type == "cpu" for t in args[:2])


def _channels_last_convolution(ctx: TraceContext, func, args: tuple, kwargs: dict):
    """A 2-D CPU convolution in the channels-last form of a program (program_choice.py): its input
    made channels-last where core/meta.py's relaid_channels_last says (oneDNN converts the weight,
    as in eager); later ops follow their inputs' layout.  ATen's CPU convolutions give a
    channels-last result where input or weight suggests it, which the meta kernel does not know."""
    x, w = args[0], args[1]
    if relaid_channels_last(x.ir):
        x = dispatch(torch.Tensor.contiguous, (x,), {"memory_format": torch.channels_last})
    real = channels_last_strides if suggests_channels_last(x.ir) or suggests_channels_last(w.ir) \
        else None
    return trace_call(ctx, torch_symbol(func), func, (x, *args[1:]), kwargs, real_strides=real)


class _TracedHookHandle:
    """What `register_hook` returns while tracing: the hook is registered by the program on every
    call, so there is no one registration to remove."""

    def remove(self):
        raise UnsupportedOpError(located(
            "FJ202", "removing a gradient hook registered inside a compiled function: the program "
                     "registers it on every call's value", *user_location(),
            "register the hook on the compiled function's output and remove it there"))


def _gradient_hook(ctx, func, args, kwargs):
    t = args[0]
    if not t.ir.requires_grad:       # eager's own refusal, at the line
        raise RuntimeError("cannot register a hook on a tensor that doesn't require gradient")
    ctx.record(BoundSymbol(HOOK_OPS[func], (t.ir, *args[1:]), dict(kwargs), None))
    return _TracedHookHandle() if func is torch.Tensor.register_hook else None


def _is_mutation(func, kwargs) -> bool:
    if kwargs.get("out") is not None or kwargs.get("inplace") is True:
        return True
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or func in _INPLACE_DUNDERS \
        or func is torch.Tensor.__setitem__ or func is set_data


def _data_dependent(ctx: TraceContext, func, args, kwargs):
    entry, what = DATA_DEPENDENT[func]
    proxy = next(x for x in flatten_values(args) if isinstance(x, TensorProxy))
    ctx.sharp_edge(entry, f"{what} {_describe(ctx, proxy)} needs its data in Python while "
                          f"tracing '{ctx.fn_name}'; the compiled code would freeze one call's "
                          f"value", user_location())
    args, kwargs = map_values(lambda x: concrete_value(ctx, x) if isinstance(x, TensorProxy) else
                              x._fj_value if isinstance(x, NumberProxy) else x, (args, kwargs))
    return func(*args, **kwargs)


def _describe(ctx: TraceContext, proxy: TensorProxy) -> str:
    """A tensor as the user knows it: an input by name, else what it was computed from."""
    v = proxy.ir
    what = f"a {v.type_string()} tensor"
    if id(proxy) in ctx.input_labels:
        return f"input {ctx.input_labels[id(proxy)]} ({what})"
    inputs = {id(i): i.name for i in ctx.inputs}
    producers = {id(o): b for b in ctx.scopes[0] for o in b.outputs()}
    found, stack, seen = [], [v], set()
    while stack:
        u = stack.pop()
        if id(u) in seen:
            continue
        seen.add(id(u))
        if id(u) in inputs:
            found.append(inputs[id(u)])
        elif id(u) in producers:
            stack += [a for a in flatten_values((producers[id(u)].args, producers[id(u)].kwargs))
                      if isinstance(a, (TensorVar, NumberVar))]
    if not found:
        return f"{what} created inside the function"
    return f"{what} computed from input{'s' if len(found) > 1 else ''} " + \
        ", ".join(f"'{n}'" for n in sorted(found))


def concrete_value(ctx: TraceContext, proxy: TensorProxy) -> torch.Tensor:
    """Permissive modes: run the trace so far on this call's inputs to get a value."""
    trace = Trace(ctx.fn_name, ctx.inputs, list(ctx.scopes[0]), proxy.ir, dict(ctx.consts),
                  stage="replay", namespace=ctx.namespace, autocast_off=ctx.autocast_seen)
    with torch._C.DisableTorchFunction(), rng_preserved(trace.bsyms):   # draw nothing
        return trace.python_callable()(*ctx.real_inputs)


# ----------------------------------------------------------------------------------------------
# Functionalization
# ----------------------------------------------------------------------------------------------

def _functionalize(ctx: TraceContext, func, args, kwargs):
    if kwargs.get("out") is not None:
        out = kwargs["out"]
        value = dispatch(func, args, {k: v for k, v in kwargs.items() if k != "out"})
        targets, values = (out, value) if isinstance(out, (tuple, list)) else ((out,), (value,))
        for t, v in zip(targets, values):
            _write(ctx, t, _conform(v, t), func, "FJ102_out_argument", "out=")
        return out
    if kwargs.get("inplace") is True:
        value = dispatch(func, args, {**kwargs, "inplace": False})
        _write(ctx, args[0], value, func, "FJ102_inplace_input", "inplace=True")
        return args[0]
    if not args:     # torch.nn.init.constant_(tensor=t, val=v): how nn.init hands itself over
        name = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        args, kwargs = (kwargs[name],), {k: v for k, v in kwargs.items() if k != name}
    target = args[0]
    if func is set_data:         # x.data = value: x now holds value (an input: FJ102)
        _write(ctx, target, _conform(args[1], target) if target._fj_root is not None else args[1],
               func, "FJ102_inplace_input", ".data assignment")
        return None
    if isinstance(target, (list, tuple)) and target and all(isinstance(t, TensorProxy) for t in target):
        return _functionalize_foreach(ctx, func, args, kwargs)
    if not isinstance(target, TensorProxy):
        return trace_call(ctx, torch_symbol(func), func, args, kwargs)   # captured tensor: FJ101
    if func is torch.Tensor.__setitem__:
        value = trace_call(ctx, _SETITEM, setitem, args, kwargs)
        _write(ctx, target, value, func, "FJ102_setitem_input", "item assignment")
        return None
    oop = OUT_OF_PLACE.get(func)
    if oop is not None:
        _check_inplace_allowed(func, args, kwargs)
        value = _conform(dispatch(oop, args, kwargs), target)
    else:
        sym = _FUNCTIONAL_INPLACE_RANDOM if func in RANDOM_OPS else _FUNCTIONAL_INPLACE
        value = trace_call(ctx, sym, functional_inplace, (func, *args), kwargs)
    _write(ctx, target, value, func, "FJ102_inplace_input", f"{op_name(func)}")
    return target


def _functionalize_foreach(ctx: TraceContext, func, args, kwargs):
    """torch._foreach_add_(xs, ...): the out-of-place _foreach_add, each result written back."""
    name = getattr(func, "__name__", "")
    oop = getattr(torch, name[:-1], None) if name.startswith("_foreach_") else None
    if oop is None:
        raise UnsupportedOpError(located(
            "FJ202", f"{op_name(func)} writes into a list of tensors and has no out-of-place twin",
            *user_location(), "write it as a list comprehension of out-of-place ops"))
    for target, value in zip(args[0], dispatch(oop, args, kwargs)):
        _write(ctx, target, _conform(value, target), func, "FJ102_inplace_input", name)
    return None


def _check_inplace_allowed(func, args, kwargs):
    """Eager raises for some in-place ops (an int tensor += a float): so does tracing.  The
    stand-ins do not require grad: a meta tensor is a leaf, and eager's leaf check ("a leaf
    Variable that requires grad is being used in an in-place operation") is about inputs, which
    `_write` reports as FJ102; on a value the function computed, eager's in-place op is legal."""
    def to_meta(x):
        if isinstance(x, TensorProxy):
            return meta_tensor(x.ir).detach()
        return x._fj_value if isinstance(x, NumberProxy) else x
    with torch._C.DisableTorchFunction():
        func(*map_values(to_meta, args), **map_values(to_meta, kwargs))


def _conform(value, target: TensorProxy):
    """In-place results keep the target's dtype and shape."""
    if value.ir.dtype != target.ir.dtype:
        value = dispatch(torch.Tensor.to, (value, target.ir.dtype), {})
    if value.ir.shape != target.ir.shape:
        value = dispatch(torch.Tensor.expand, (value, target.ir.shape), {})
    return value


def _write(ctx: TraceContext, target: TensorProxy, value: TensorProxy, func, entry: str, how: str):
    """Point `target` (and whatever it aliases) at `value`."""
    if func is torch.Tensor.requires_grad_ and target._fj_root is not None:   # x.detach().requires_grad_()
        target._fj_var = value.ir       # a flag of the alias alone: no data written, x keeps its own flag
        return
    base = target._fj_base_input()
    if base is not None:
        if target._fj_root is not None and entry == "FJ102_inplace_input":
            entry = "FJ102_view_of_input"
        label = ctx.input_labels.get(id(base), "an input")
        through = " through a view of it" if target._fj_root is not None else ""
        ctx.sharp_edge(entry, f"{how} writes to input {label} of '{ctx.fn_name}'{through}; "
                              f"the compiled function does not mutate its inputs", user_location())
    root = target._fj_root
    if root is None:
        target._fj_var = value.ir
        target._fj_epoch += 1
        return
    if target._fj_chain is None:
        raise UnsupportedOpError(located(
            "FJ202", f"{op_name(func)} writes into a view fjit cannot replay", *user_location(),
            "clone() the tensor before writing into it"))
    bits = (target.ir.conj_bit, target.ir.neg_bit)
    new_root = trace_call(ctx, _VIEW_SCATTER, view_scatter, (root, value, target._fj_chain), {})
    root._fj_var = new_root.ir
    root._fj_epoch += 1
    if (value.ir.conj_bit, value.ir.neg_bit) == bits:
        target._fj_var = value.ir
        target._fj_seen = root._fj_epoch
    # else a conjugated or negated view (`w.conj().add_(1)`) stays one: it is taken again from
    # the written root when next read, as eager's still is after the write
