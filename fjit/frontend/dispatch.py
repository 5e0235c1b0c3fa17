"""The dispatcher: what happens when the traced function calls a torch op.

Every torch function, Tensor method and operator reached during tracing lands in `dispatch`.  It
  1. rejects data-dependent conversions (FJ106) and tensors that are not inputs (FJ101),
  2. functionalizes in-place ops, `out=` and setitem (FJ102 when they reach an input),
  3. computes the exact output metadata by running the op on meta tensors (so broadcasting and type
     promotion are torch's own), and
  4. records a bound symbol, with the op's decomposition into prims as its subsymbols when
     fjit.ops registered one (a torch fallback, marked as such, when not).
"""
from __future__ import annotations

import sys
import types

import torch

from fjit.core.ir import (BoundSymbol, GeneratorVar, NumberVar, Symbol, Tag, TensorVar, Trace,
                          flatten_values, map_values)
from fjit.errors import UnsupportedOpError, catalog_fix, located
from fjit.frontend.context import (AMP_DEVICES, ProcessPatch, TraceContext, autocast_state, current,
                                   user_location)
from fjit.frontend.meta import meta_tensor, run_meta
from fjit.frontend.proxies import NumberProxy, TensorProxy, _set_data
from fjit.frontend.rng import bind_generators, generator, rng_preserved
from fjit.frontend.stateful_ops import WRITES_INTO_ARGUMENTS

# fjit.ops fills this at import: torch callable -> decomposition into prims over proxies.
DECOMPOSITIONS: dict = {}

RANDOM_OPS = {torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like,
              torch.randint_like, torch.normal, torch.bernoulli, torch.multinomial, torch.randperm,
              torch.poisson, torch.dropout, torch.nn.functional.dropout, torch.nn.functional.dropout1d,
              torch.nn.functional.dropout2d, torch.nn.functional.dropout3d,
              torch.nn.functional.alpha_dropout, torch.nn.functional.feature_alpha_dropout,
              torch.Tensor.uniform_, torch.Tensor.normal_, torch.Tensor.bernoulli_,
              torch.Tensor.random_, torch.Tensor.exponential_, torch.Tensor.geometric_,
              torch.Tensor.log_normal_, torch.Tensor.cauchy_, torch.Tensor.bernoulli}
RANDOM_OPS |= {getattr(torch.nn.init, n) for n in (
    "uniform_", "normal_", "trunc_normal_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_",
    "kaiming_normal_", "orthogonal_", "sparse_")}

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

ALIAS_OPS = {torch.Tensor.detach, torch.detach, torch.Tensor.view}

# Autograd hooks on traced values would be registered on a trace-time stand-in and never run.
AUTOGRAD_HOOKS = {torch.Tensor.register_hook, torch.Tensor.retain_grad,
                  torch.Tensor.register_post_accumulate_grad_hook}

# Questions about memory, not values or metadata: no trace-time answer is eager's.
RUNTIME_IDENTITY = {torch.Tensor.data_ptr, torch.Tensor.storage, torch.Tensor.untyped_storage,
                    torch.Tensor.storage_offset, torch.Tensor._version.__get__,
                    torch.Tensor.__reduce_ex__, torch.Tensor.__setstate__}

# Reading these from a tensor that is not an input binds a constant; it is not an op on its data.
_METADATA_GETTERS = {getattr(torch.Tensor, n).__get__ for n in (
    "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "layout", "is_leaf")}
_METADATA_GETTERS |= {getattr(torch.Tensor, n) for n in (
    "size", "dim", "numel", "stride", "is_contiguous", "is_floating_point", "element_size",
    "__len__", "__repr__", "__format__", "__hash__", "ndimension", "nelement", "get_device")}

_INPLACE_DUNDERS = {getattr(torch.Tensor, f"__i{n}__") for n in (
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and", "or", "xor", "lshift",
    "rshift") if hasattr(torch.Tensor, f"__i{n}__")}
# Pointwise in-place ops whose out-of-place twin has the same signature.
_OUT_OF_PLACE = {getattr(torch.Tensor, n + "_"): getattr(torch.Tensor, n) for n in (
        "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow",
        "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "relu",
        "clamp", "clamp_min", "clamp_max", "masked_fill", "index_put", "scatter", "scatter_add",
        "index_add", "index_fill", "lerp", "addcmul", "addcdiv", "floor", "ceil", "round",
        "trunc", "reciprocal", "square", "erf", "exp2", "log2", "log1p", "expm1",
        "bitwise_and", "bitwise_or", "bitwise_xor", "logical_not", "sign")
    if hasattr(torch.Tensor, n + "_")}
_OUT_OF_PLACE.update({torch.Tensor.__iadd__: torch.Tensor.add, torch.Tensor.__isub__: torch.Tensor.sub,
                      torch.Tensor.__imul__: torch.Tensor.mul, torch.Tensor.__itruediv__: torch.Tensor.div})


# ----------------------------------------------------------------------------------------------
# Runtime helpers that functionalized code calls (printed as fjit_ops.*)
# ----------------------------------------------------------------------------------------------

def _apply_chain(value, chain):
    for func, args, kwargs, pos, index in chain:
        value = func(*args[:pos], value, *args[pos:], **kwargs)
        if index is not None:
            value = value[index]
    return value


def view_scatter(base, value, chain):
    """`base` with `value` written into the view of it that `chain` describes (out-of-place)."""
    out = base.clone()
    _apply_chain(out, chain).copy_(value)
    return out


def setitem(x, index, value):
    """Out-of-place `x[index] = value`."""
    out = x.clone()
    out[index] = value
    return out


def functional_inplace(op, x, *args, **kwargs):
    """Out-of-place version of any in-place op: apply it to a copy."""
    out = x.clone()
    op(out, *args, **kwargs)
    return out


FJIT_OPS = types.SimpleNamespace(view_scatter=view_scatter, setitem=setitem,
                                 functional_inplace=functional_inplace, generator=generator)
_VIEW_SCATTER = Symbol("fjit_ops.view_scatter", view_scatter)
_SETITEM = Symbol("fjit_ops.setitem", setitem)
_FUNCTIONAL_INPLACE = Symbol("fjit_ops.functional_inplace", functional_inplace)
_FUNCTIONAL_INPLACE_RANDOM = Symbol("fjit_ops.functional_inplace", functional_inplace,
                                    frozenset({Tag.RANDOM}))


# ----------------------------------------------------------------------------------------------
# Grad mode and autocast regions
# ----------------------------------------------------------------------------------------------

_MODE_TAGS = frozenset({Tag.IMPURE, Tag.MODE})
_SET_GRAD = Symbol("torch._C._set_grad_enabled", torch._C._set_grad_enabled, _MODE_TAGS)
_SET_AUTOCAST = Symbol("torch.set_autocast_enabled", torch.set_autocast_enabled, _MODE_TAGS)
_SET_AUTOCAST_DTYPE = Symbol("torch.set_autocast_dtype", torch.set_autocast_dtype, _MODE_TAGS)


def record_mode_changes(ctx: TraceContext) -> None:
    """The traced code runs for real, so `with torch.no_grad():` (or autocast, inference_mode,
    set_grad_enabled, a decorator) has changed the global state by the time the next op is
    dispatched: record the change, so that the program runs that op under the same mode."""
    grad = torch.is_grad_enabled()
    if grad != ctx.grad_mode:
        ctx.record(BoundSymbol(_SET_GRAD, (grad,), {}, None))
        ctx.grad_mode = grad
    amp = autocast_state()
    if amp != ctx.autocast:
        for device, (was_on, was_dtype), (on, dtype) in zip(AMP_DEVICES, ctx.autocast, amp):
            if dtype != was_dtype:
                ctx.record(BoundSymbol(_SET_AUTOCAST_DTYPE, (device, dtype), {}, None))
            if on != was_on:
                ctx.record(BoundSymbol(_SET_AUTOCAST, (device, on), {}, None))
        ctx.autocast = amp


class _AutocastProbe(torch.Tensor):
    """A storage-less tensor on the op's real device, so torch's own autocast kernels run on it
    (meta tensors have no autocast); the ops autocast forwards reach __torch_dispatch__, which
    answers with meta kernels.  Only its metadata is ever read."""

    @staticmethod
    def __new__(cls, m: torch.Tensor, device):
        return torch.Tensor._make_wrapper_subclass(cls, m.shape, strides=m.stride(), dtype=m.dtype,
                                                   device=device)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        device = next(x.device for x in flatten_values((args, kwargs))
                      if isinstance(x, _AutocastProbe))
        margs, mkwargs = map_values(lambda x: torch.empty_strided(x.shape, x.stride(), dtype=x.dtype,
                                                                  device="meta")
                                    if isinstance(x, _AutocastProbe) else x, (args, kwargs or {}))
        out = func(*margs, **mkwargs)
        return map_values(lambda m: _AutocastProbe(m, device) if isinstance(m, torch.Tensor) else m,
                          out)


def _autocast_applies(args, kwargs) -> bool:
    """Whether autocast is on for the device of one of the op's tensors (one C call when off)."""
    if not torch._C._is_any_autocast_enabled():
        return False
    devices = {x.ir.device.type for x in flatten_values((args, kwargs)) if isinstance(x, TensorProxy)}
    return any(torch.is_autocast_enabled(d) for d in devices if d in AMP_DEVICES)


def _autocast_outputs(func, args, kwargs, mout):
    """`mout` (the meta result, None where the meta call refused) as autocast makes it: the cast
    inputs' dtypes, or `mout` itself, views included, where autocast leaves the op alone."""
    probes = map_values(lambda x: _AutocastProbe(meta_tensor(x.ir), x.ir.device)
                        if isinstance(x, TensorProxy) else
                        x._fj_value if isinstance(x, NumberProxy) else x, (args, kwargs))
    pout = func(*probes[0], **probes[1])
    if mout is not None and [m.dtype for m in _tensor_leaves(pout)] == \
            [m.dtype for m in _tensor_leaves(mout)]:
        return mout
    return map_values(lambda p: torch.empty_strided(p.shape, p.stride(), dtype=p.dtype,
                                                    device="meta") if isinstance(p, torch.Tensor)
                      else p, pout)


# ----------------------------------------------------------------------------------------------
# Custom autograd.Function (its own backward must run) and vmap: each one opaque op
# ----------------------------------------------------------------------------------------------

_APPLY = torch.autograd.Function.__dict__["apply"]     # the classmethod itself
_APPLY_OPS: dict = {}


def _on_proxies(args, kwargs) -> bool:
    """Whether a call is part of a trace: made while tracing, on at least one tensor proxy."""
    return current() is not None and any(isinstance(x, TensorProxy)
                                         for x in flatten_values((args, kwargs)))


def _traced_apply(cls, *args, **kwargs):
    """Function.apply while tracing: a call on proxies is recorded as one op that calls the real
    apply at run time (tracing its forward into prims would lose the custom backward)."""
    if not _on_proxies(args, kwargs):
        return _APPLY.__func__(cls, *args, **kwargs)
    op = _APPLY_OPS.get(cls)
    if op is None:
        def op(*a, **k):
            return _APPLY.__func__(cls, *a, **k)
        op.__name__ = op.__qualname__ = f"{cls.__qualname__}.apply"
        op = _APPLY_OPS.setdefault(cls, op)
    return dispatch(op, args, kwargs)


_VMAP = torch.vmap


def _traced_vmap(func, *vmap_args, **vmap_kwargs):
    """torch.vmap while tracing: the batched function, called on proxies, is one opaque op (its
    metadata from a run on meta tensors; the real vmap runs it at run time).  functorch's C++
    transforms would otherwise unwrap fjit's proxies below __torch_function__."""
    batched = _VMAP(func, *vmap_args, **vmap_kwargs)

    def call(*args, **kwargs):
        if not _on_proxies(args, kwargs):
            return batched(*args, **kwargs)
        return dispatch(batched, args, kwargs)
    return call


def _install_opaque_calls():
    torch.autograd.Function.apply = classmethod(_traced_apply)
    torch.vmap = torch.func.vmap = _traced_vmap


def _restore_opaque_calls():
    torch.autograd.Function.apply = _APPLY
    torch.vmap = torch.func.vmap = _VMAP


# torch.autograd.Function.apply and torch.vmap are traced as single ops while any thread traces.
opaque_calls_traced = ProcessPatch(_install_opaque_calls, _restore_opaque_calls)


# ----------------------------------------------------------------------------------------------
# Symbols for torch callables
# ----------------------------------------------------------------------------------------------

_SYMBOLS: dict = {}
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
    if getattr(torch.Tensor, name, None) is func:
        return f"torch.Tensor.{name}"
    for prefix, module in _MODULES.items():
        if getattr(module, name, None) is func:
            return f"{prefix}.{name}"
    return f"{getattr(func, '__module__', None) or '?'}.{getattr(func, '__qualname__', name)}"


def torch_symbol(func) -> Symbol:
    sym = _SYMBOLS.get(func)
    if sym is None:
        name = qualified_name(func)
        tags = set()
        if func in RANDOM_OPS:
            tags.add(Tag.RANDOM)
        if func not in DECOMPOSITIONS:
            tags.add(Tag.FALLBACK)
        sym = _SYMBOLS[func] = Symbol(name, func, frozenset(tags))
    return sym


def _op_name(func) -> str:
    name = qualified_name(func)
    return name.replace("torch.Tensor.", "Tensor.").replace(".__get__", "")


# ----------------------------------------------------------------------------------------------
# Dispatch
# ----------------------------------------------------------------------------------------------

def dispatch(func, args: tuple, kwargs: dict):
    # No user code runs below, so the observer's profile hook (frontend/observer.py) is switched
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


def _dispatch(ctx, func, args, kwargs):
    if len(ctx.scopes) == 1:      # a top-level op (not a prim of a decomposition)
        record_mode_changes(ctx)
    if func in DATA_DEPENDENT:
        return _data_dependent(ctx, func, args, kwargs)
    if func in RUNTIME_IDENTITY:
        raise UnsupportedOpError(located(
            "FJ202", f"{_op_name(func)} asks about a tensor's memory, which a traced program "
                     f"cannot know at trace time", *user_location(),
            "compute it outside the compiled function and pass the result in"))
    if func in AUTOGRAD_HOOKS:
        raise UnsupportedOpError(located(
            "FJ202", f"{_op_name(func)} on a value computed inside a compiled function: the hook "
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
                       f"{_op_name(func)}(training=True)")
            return parts[0]
    if _is_mutation(func, kwargs):
        return _functionalize(ctx, func, args, kwargs)
    return trace_call(ctx, torch_symbol(func), func, args, kwargs, DECOMPOSITIONS.get(func))


def _is_mutation(func, kwargs) -> bool:
    if kwargs.get("out") is not None or kwargs.get("inplace") is True:
        return True
    name = getattr(func, "__name__", "")
    return (name.endswith("_") and not name.endswith("__")) or func in _INPLACE_DUNDERS \
        or func is torch.Tensor.__setitem__ or func is _set_data


def trace_call(ctx: TraceContext, sym: Symbol, func, args: tuple, kwargs: dict, decomposition=None):
    """Record `func(*args, **kwargs)` as `sym`; returns proxies shaped like func's result."""
    leaves = flatten_values((args, kwargs))
    if not any(isinstance(x, (TensorProxy, NumberProxy)) for x in leaves):
        real = [x for x in leaves if isinstance(x, torch.Tensor)]
        if real and func in _METADATA_GETTERS:
            return func(*args, **kwargs)      # e.g. .shape of a global tensor: a bound constant
    if any(type(x) is not TensorProxy and isinstance(x, torch.Tensor) for x in leaves):
        args, kwargs = map_values(lambda x: _capture(ctx, x) if type(x) is not TensorProxy and
                                  isinstance(x, torch.Tensor) else x,
                                  (args, kwargs))

    metas: dict[int, TensorProxy] = {}   # id(meta tensor) -> the handle it stands for
    alive = []   # the meta tensors themselves, so no id in `metas` is reused by a later tensor
    out_device = _requested_device(func, args, kwargs)

    def to_meta(x):
        if isinstance(x, TensorProxy):
            m = meta_tensor(x.ir)
            metas[id(m)] = x
            alive.append(m)
            return m
        if isinstance(x, NumberProxy):
            return x._fj_value
        if isinstance(x, (torch._C.Generator, GeneratorVar)):
            return None          # shapes do not depend on it, and a meta op must not draw from it
        if isinstance(x, torch.device) or (isinstance(x, str) and x in ("cpu", "cuda") or
                                           isinstance(x, str) and x.startswith("cuda:")):
            return torch.device("meta")
        return x

    try:
        with torch._C.DisableTorchFunction():   # meta tensors are real tensors, not traced ones
            margs, mkwargs = map_values(to_meta, (args, kwargs))
            if func is torch.Tensor.__getitem__:
                margs = (margs[0], _scalar_indices_as_ints(margs[1]))
            if "device" in mkwargs or sym.has(Tag.RANDOM) and not any(
                    isinstance(m, torch.Tensor) for m in flatten_values(margs)):
                mkwargs["device"] = "meta"     # a factory: torch.randn(4, 5) must not draw here
            if func in (torch.Tensor.cpu, torch.Tensor.cuda):
                # meta tensors cannot be copied to a device: x.cpu() of a CPU x is x itself, a
                # move to another device is a new tensor of the same layout
                same = out_device is not None and out_device.type == args[0].ir.device.type
                mout = margs[0] if same else margs[0].clone()
            else:
                try:
                    mout = run_meta(func, margs, mkwargs)
                except RuntimeError:
                    # Without autocast (meta tensors have none) the op may refuse what autocast
                    # would have cast (a bf16 input with a float bias): the probe below decides.
                    if not _autocast_applies(args, kwargs):
                        raise
                    mout = None
    except (NotImplementedError, RuntimeError) as e:
        # How meta kernels refuse data-dependent output shapes, or values (x[i] with a 0-d index).
        # Any other error is the user's (a shape mismatch, say): re-raised as eager would.
        if not isinstance(e, NotImplementedError) and "meta" not in str(e):
            raise
        raise UnsupportedOpError(located(
            "FJ202", f"{_op_name(func)} cannot be traced: its output shape depends on tensor data "
                     f"or torch has no shape rule for it (torch: {_first_sentence(e)})",
            *user_location(), catalog_fix("FJ202_data_dependent_shape") + "; or call it outside "
                                                                           "the compiled function")) from None

    if _autocast_applies(args, kwargs):
        # Under autocast every op stays one torch call, run under the same autocast state
        # (its prims' torch lowerings would be autocast too, and fused kernels would not).
        mout, decomposition = _autocast_outputs(func, args, kwargs, mout), None
    if not any(isinstance(m, torch.Tensor) for m in flatten_values(mout)):
        return mout   # metadata-only result (a dtype, a size): static for this trace
    meta_inputs = {id(m): m for m in flatten_values((margs, mkwargs)) if isinstance(m, torch.Tensor)}
    default_device = out_device or _first_device(args, kwargs)

    def make_var(m):
        # An opaque op's strides are its meta kernel's guess, which can differ from its real
        # kernel's (CPU conv2d on channels_last); a layout observed on the first call wins.
        name = ctx.new_name()
        return TensorVar(name, m.shape, m.dtype, default_device,
                         ctx.observed_strides.get(name) or m.stride(), m.requires_grad)

    subsymbols = ()
    if decomposition is not None:
        ctx.push_scope()
        try:
            dout = decomposition(*args, **kwargs)
        except NotImplementedError:
            dout = None   # a case the decomposition does not cover: the op stays opaque
        scope = ctx.pop_scope()
        if dout is not None and _same_metadata(dout, mout):
            subsymbols = tuple(scope)
            produced = {id(v) for b in scope for v in b.outputs()}
            if not all(id(p.ir) in produced for p in _tensor_leaves(dout)):
                subsymbols = ()
    if subsymbols:
        for p, m in zip(_tensor_leaves(dout), _tensor_leaves(mout)):
            p.ir.strides = ctx.observed_strides.get(p.ir.name) or tuple(m.stride())
        out_vars = map_values(lambda p: p.ir if isinstance(p, TensorProxy) else p, dout)
    else:
        out_vars = map_values(lambda m: make_var(m) if isinstance(m, torch.Tensor) else m, mout)
        if not sym.has(Tag.FALLBACK) and decomposition is not None:   # it declined this call
            sym = Symbol(sym.qualname, sym.fn, sym.tags | {Tag.FALLBACK})

    # An op that returns one of its inputs unchanged (x.contiguous() of a contiguous x) is no op.
    if isinstance(mout, torch.Tensor) and id(mout) in metas:
        return metas[id(mout)]

    ir_args, ir_kwargs = map_values(_to_ir, (args, kwargs))
    ctx.record(BoundSymbol(sym, ir_args, ir_kwargs, _structure(out_vars), subsymbols))

    positions = [i for i, a in enumerate(args) if isinstance(a, TensorProxy)]

    # detach() and view(dtype) share their input's storage without being views to autograd (nor
    # to meta tensors' _base): writes through them must still reach the input.
    alias_of = margs[0] if func in ALIAS_OPS and margs and isinstance(margs[0], torch.Tensor) else None

    def handle(m, var, index):
        base = m._base if isinstance(m, torch.Tensor) and m._is_view() else alias_of
        parent = metas.get(id(base)) if base is not None else None
        if parent is None or base is not meta_inputs.get(id(base)):
            return TensorProxy(var)
        pos = next((i for i in positions if args[i] is parent), None)
        static = pos is not None and not any(isinstance(x, (TensorProxy, NumberProxy)) for i, x in
                                             enumerate(flatten_values((args, kwargs))) if x is not parent)
        root = parent if parent._fj_root is None else parent._fj_root
        chain = None if (parent._fj_chain is None or not static) else parent._fj_chain + (
            (func, args[:pos] + args[pos + 1:], kwargs, pos, index),)
        return TensorProxy(var, root=root, chain=chain)

    if isinstance(mout, torch.Tensor):
        return handle(mout, out_vars, None)
    proxies = [handle(m, v, i) if isinstance(m, torch.Tensor) else m
               for i, (m, v) in enumerate(zip(mout, out_vars))]
    return type(mout)(proxies) if isinstance(mout, tuple) and type(mout) is not tuple else type(mout)(proxies)


def _first_sentence(e: Exception) -> str:
    text = " ".join(str(e).split())
    end = text.find(". ")
    return text if end < 0 else text[:end]


def _scalar_indices_as_ints(index):
    """x[i] with a 0-d integer tensor i selects like an int (the result is a view of x): its meta
    result is the same for every value of i, so 0 stands in for it."""
    def one(i):
        if isinstance(i, torch.Tensor) and i.ndim == 0 and not i.dtype.is_floating_point \
                and i.dtype is not torch.bool:
            return 0
        return i
    return tuple(one(i) for i in index) if type(index) is tuple else one(index)


def _tensor_leaves(x) -> list:
    return [y for y in flatten_values(x) if isinstance(y, (TensorProxy, torch.Tensor))]


def _same_metadata(dout, mout) -> bool:
    a, b = _tensor_leaves(dout), _tensor_leaves(mout)
    return len(a) == len(b) and all(
        isinstance(p, TensorProxy) and p.ir.shape == tuple(m.shape) and p.ir.dtype == m.dtype
        for p, m in zip(a, b))


def _structure(out):
    if isinstance(out, tuple) and type(out) is not tuple:
        return tuple(out)   # torch.return_types.* print and unpack as plain tuples
    return out


def _to_ir(x):
    if isinstance(x, TensorProxy):
        return x.ir
    if isinstance(x, NumberProxy):
        return x.ir
    return x


def _first_device(args, kwargs):
    for x in flatten_values((args, kwargs)):
        if isinstance(x, TensorProxy):
            return x.ir.device
    return torch.get_default_device()


def _requested_device(func, args, kwargs):
    """The device an op moves or creates its result on, when it says so."""
    if func is torch.Tensor.to:
        for x in args[1:]:
            if isinstance(x, TensorProxy):
                return x.ir.device
        device = torch._C._nn._parse_to(*args[1:], **{k: v for k, v in kwargs.items()
                                                        if k != "copy"})[0]
        return device
    if func is torch.Tensor.cuda:
        return torch.device("cuda", args[1] if len(args) > 1 and isinstance(args[1], int) else None)
    if func is torch.Tensor.cpu:
        return torch.device("cpu")
    device = kwargs.get("device")
    return torch.device(device) if device is not None else None


def _capture(ctx: TraceContext, tensor: torch.Tensor) -> TensorProxy:
    """A tensor that is not an input reached an op: FJ101; permissively, a constant by reference."""
    entry, where = ctx.tensor_origins.get(id(tensor), ("FJ101_external_tensor", None))
    if where is None:
        message = (f"a {tensor.device.type} tensor of shape {tuple(tensor.shape)} that no traced "
                   f"op created (e.g. from torch.from_numpy) is used, and it is not an input of "
                   f"'{ctx.fn_name}'")
    else:
        message = f"{where} is a torch.Tensor that is not an input of '{ctx.fn_name}'"
    ctx.sharp_edge(entry, message, user_location())
    for name, value in ctx.consts.items():
        if value is tensor:
            return TensorProxy(_const_var(name, tensor))
    name = f"g{len(ctx.consts)}"
    ctx.consts[name] = tensor
    return TensorProxy(_const_var(name, tensor))


def _const_var(name, tensor):
    return TensorVar(name, tensor.shape, tensor.dtype, tensor.device, tensor.stride(),
                     tensor.requires_grad)


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
                  stage="replay", namespace=ctx.namespace)
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
    if func is _set_data:         # x.data = value: x now holds value (an input: FJ102)
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
    oop = _OUT_OF_PLACE.get(func)
    if oop is not None:
        _check_inplace_allowed(func, args, kwargs)
        value = _conform(dispatch(oop, args, kwargs), target)
    else:
        sym = _FUNCTIONAL_INPLACE_RANDOM if func in RANDOM_OPS else _FUNCTIONAL_INPLACE
        value = trace_call(ctx, sym, functional_inplace, (func, *args), kwargs)
    _write(ctx, target, value, func, "FJ102_inplace_input", f"{_op_name(func)}")
    return target


def _functionalize_foreach(ctx: TraceContext, func, args, kwargs):
    """torch._foreach_add_(xs, ...): the out-of-place _foreach_add, each result written back."""
    name = getattr(func, "__name__", "")
    oop = getattr(torch, name[:-1], None) if name.startswith("_foreach_") else None
    if oop is None:
        raise UnsupportedOpError(located(
            "FJ202", f"{_op_name(func)} writes into a list of tensors and has no out-of-place twin",
            *user_location(), "write it as a list comprehension of out-of-place ops"))
    values = dispatch(oop, args, kwargs)
    for target, value in zip(args[0], values):
        _write(ctx, target, _conform(value, target), func, "FJ102_inplace_input", name)
    return None


def _check_inplace_allowed(func, args, kwargs):
    """Eager raises for some in-place ops (an int tensor += a float): so does tracing."""
    def to_meta(x):
        if isinstance(x, TensorProxy):
            return meta_tensor(x.ir)
        return x._fj_value if isinstance(x, NumberProxy) else x
    with torch._C.DisableTorchFunction():
        margs, mkwargs = map_values(to_meta, (args, kwargs))
        func(*margs, **mkwargs)


def _conform(value, target: TensorProxy):
    """In-place results keep the target's dtype and shape."""
    if value.ir.dtype != target.ir.dtype:
        value = dispatch(torch.Tensor.to, (value, target.ir.dtype), {})
    if value.ir.shape != target.ir.shape:
        value = dispatch(torch.Tensor.expand, (value, target.ir.shape), {})
    return value


def _write(ctx: TraceContext, target: TensorProxy, value: TensorProxy, func, entry: str, how: str):
    """Point `target` (and whatever it aliases) at `value`."""
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
            "FJ202", f"{_op_name(func)} writes into a view fjit cannot replay", *user_location(),
            "clone() the tensor before writing into it"))
    new_root = trace_call(ctx, _VIEW_SCATTER, view_scatter, (root, value, target._fj_chain), {})
    root._fj_var = new_root.ir
    root._fj_epoch += 1
    target._fj_var = value.ir
    target._fj_seen = root._fj_epoch
