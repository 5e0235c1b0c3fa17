"""Recording one torch call into the trace: its symbol, its exact output metadata from a run on meta
tensors (torch's own broadcasting, type promotion and strides), its decomposition into prims as
subsymbols when fjit.decompositions registered one (checked against the meta result; a torch
fallback, marked as such, when not), and proxies for its outputs that know which input they view.
"""
from __future__ import annotations

import itertools

import torch

from fjit.core.ir import (BoundSymbol, GeneratorVar, Symbol, Tag, TensorVar, flatten_values,
                          map_values)
from fjit.core.prims import PRIM_OF_QUALNAME, VIEW_OPS, Prim, apply, set_recorder
from fjit.errors import UnsupportedOpError, catalog_fix, located
from fjit.core.meta import meta_tensor, run_meta
from fjit.core.prims.layout import copies_at_some_size
from fjit.core.symbolic import active as symbolic_active, same
from fjit.frontend.torch_calls import accepts, op_name, qualified_name
from fjit.frontend.context import TraceContext, current
from fjit.frontend.proxies import NumberProxy, TensorProxy
from fjit.frontend.modes import autocast_applies, autocast_casts, autocast_outputs, autocast_region
from fjit.strict.locate import user_location

# fjit.decompositions fills these at import: torch callable -> decomposition into prims over
# proxies; and torch callable -> a replacement that records another op in its place (a runtime function faster
# than the torch call), or raises NotImplementedError to record the torch call.
DECOMPOSITIONS: dict = {}
REPLACEMENTS: dict = {}

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

ALIAS_OPS = {torch.Tensor.detach, torch.detach, torch.Tensor.view}

# Reading these from a tensor that is not an input binds a constant; it is not an op on its data.
_METADATA_GETTERS = {getattr(torch.Tensor, n).__get__ for n in (
    "shape", "dtype", "device", "ndim", "requires_grad", "is_cuda", "layout", "is_leaf")}
_METADATA_GETTERS |= {getattr(torch.Tensor, n) for n in (
    "size", "dim", "numel", "stride", "is_contiguous", "is_floating_point", "element_size",
    "__len__", "__repr__", "__format__", "__hash__", "ndimension", "nelement", "get_device")}

# ----------------------------------------------------------------------------------------------
# Symbols for torch callables
# ----------------------------------------------------------------------------------------------

_SYMBOLS: dict = {}
def torch_symbol(func) -> Symbol:
    sym = _SYMBOLS.get(func)
    if sym is None:
        name = qualified_name(func)
        tags = set()
        if func in RANDOM_OPS:
            tags.add(Tag.RANDOM)
        if func not in DECOMPOSITIONS:
            tags.add(Tag.FALLBACK)
        if func in VIEW_OPS:
            tags.add(Tag.VIEW)
        sym = _SYMBOLS[func] = Symbol(name, func, frozenset(tags))
    return sym


def observed_strides(ctx: TraceContext, key: tuple, shape) -> tuple | None:
    """The real strides an earlier run of this call observed for the value with layout key `key`
    (TraceContext.layout_keys), if that value had this shape: a retrace that takes another path
    can give the key to another value, whose layout the observation says nothing about."""
    seen = ctx.observed_strides.get(key)
    return seen[1] if seen is not None and same(seen[0], tuple(shape)) else None


def _meta_arguments(func, sym: Symbol, args, kwargs, to_meta) -> tuple[tuple, dict]:
    margs, mkwargs = map_values(to_meta, (args, kwargs))
    if func is torch.Tensor.__getitem__:
        margs = (margs[0], _scalar_indices_as_ints(margs[1]))
    if "device" in mkwargs or sym.has(Tag.RANDOM) and not any(
            isinstance(m, torch.Tensor) for m in flatten_values(margs)):
        mkwargs["device"] = "meta"     # a factory: torch.randn(4, 5) must not draw here
    return margs, mkwargs


def _metadata(m) -> tuple:
    return tuple((tuple(t.shape), t.stride(), t.dtype) if isinstance(t, torch.Tensor) else t
                 for t in flatten_values(m))


def _guard_numbers_reaching_metadata(func, sym, args, kwargs, to_meta, numbers, mout) -> None:
    """A float input is a runtime value, but where it decides an output's shape (interpolate's
    `scale_factor`, `arange(0, s)`, `linspace`'s bounds reaching a size through a decomposition)
    the trace depends on its value: that value must join the cache key, so a new one recompiles.
    The op's metadata is computed again with other values for the numbers; if it changes (or the
    op refuses them), the numbers are specialized.  Elementwise prims never ask: their output
    shape comes from their tensor operands."""
    for probe in (lambda v: v * 2.0 + 1.25, lambda v: v * 0.5 - 0.75):
        def probe_meta(x):
            return probe(x._fj_value) if isinstance(x, NumberProxy) else to_meta(x)
        try:
            with torch._C.DisableTorchFunction():
                other = run_meta(func, *_meta_arguments(func, sym, args, kwargs, probe_meta))
        except Exception:   # noqa: BLE001 - a value the op refuses: its result depends on values
            other = None
        if other is None or _metadata(other) != _metadata(mout):
            for n in numbers:
                n.concrete()
            return


def trace_call(ctx: TraceContext, sym: Symbol, func, args: tuple, kwargs: dict, decomposition=None,
               real_strides=None):
    """Record `func(*args, **kwargs)` as `sym`; returns proxies shaped like func's result.
    `real_strides(shape)`: the real kernel's output layout, where it is known and the meta
    kernel's is not it (a CPU convolution on channels-last data)."""
    leaves = flatten_values((args, kwargs))
    if func is torch.device:     # a value, not an op (reached through the tracer's function mode)
        return func(*args, **kwargs)
    if not any(isinstance(x, (TensorProxy, NumberProxy)) for x in leaves):
        real = [x for x in leaves if isinstance(x, torch.Tensor)]
        if real and func in _METADATA_GETTERS:
            return func(*args, **kwargs)      # e.g. .shape of a global tensor: a bound constant
    if any(type(x) is not TensorProxy and isinstance(x, torch.Tensor) for x in leaves):
        args, kwargs = map_values(lambda x: capture_outside_tensor(ctx, x) if type(x) is not TensorProxy and
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

    # (a prim is below autocast: decompositions and VJP rules apply them to values already cast)
    amp = not ctx.autocast_explicit and sym.qualname not in PRIM_OF_QUALNAME and autocast_applies(args, kwargs)
    if amp:
        def meta_of(casts):
            def cast(x):      # a cast keeps a dense layout's strides (preserve_format)
                return meta_tensor(x.ir.replaced(dtype=casts[id(x)])) if id(x) in casts else to_meta(x)
            return run_meta(func, *_meta_arguments(func, sym, args, kwargs, cast))
        with torch._C.DisableTorchFunction():
            casts = autocast_casts(func, args, kwargs, meta_of)
        if casts is not None:
            return _traced_with_casts(ctx, sym, func, args, kwargs, casts, decomposition, real_strides)
    try:
        with torch._C.DisableTorchFunction():   # meta tensors are real tensors, not traced ones
            margs, mkwargs = _meta_arguments(func, sym, args, kwargs, to_meta)
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
                    if not amp:
                        raise
                    mout = None
            # The probe's kernels below autocast are meta kernels too: what they refuse is
            # refused as the plain meta call's refusals are.
            amp_out = autocast_outputs(func, args, kwargs, mout) if amp else None
    except (NotImplementedError, RuntimeError) as e:
        # How meta kernels refuse data-dependent output shapes, or values (x[i] with a 0-d index).
        # Any other error is the user's (a shape mismatch, say): re-raised as eager would.
        if not isinstance(e, NotImplementedError) and "meta" not in str(e):
            raise
        raise UnsupportedOpError(located(
            "FJ202", f"{op_name(func)} cannot be traced: its output shape depends on tensor data "
                     f"or torch has no shape rule for it (torch: {_first_sentence(e)})",
            *user_location(), catalog_fix("FJ202_data_dependent_shape") +
            '; or call it outside the compiled function, or run the model with '
            'torch.compile(model, backend="fjit")')) from None

    numbers = [x for x in leaves if isinstance(x, NumberProxy)]
    if numbers and mout is not None and not sym.has(Tag.ELEMENTWISE):
        _guard_numbers_reaching_metadata(func, sym, args, kwargs, to_meta, numbers, mout)
    if amp:
        # An op whose autocast result is not casts of its operands stays one torch call, run with
        # autocast switched on around it as the traced code had it (the program runs with it off).
        mout, decomposition = amp_out, None
    if not any(isinstance(m, torch.Tensor) for m in flatten_values(mout)):
        return mout   # metadata-only result (a dtype, a size): static for this trace
    meta_inputs = {id(m): m for m in flatten_values((margs, mkwargs)) if isinstance(m, torch.Tensor)}
    default_device = out_device or _first_device(args, kwargs)

    occurrence = ctx.op_counts.get(sym.qualname, 0)
    ctx.op_counts[sym.qualname] = occurrence + 1
    positions_made = itertools.count()

    def make_var(m):
        # An opaque op's strides are its meta kernel's guess, which can differ from its real
        # kernel's (CPU conv2d on channels_last); a layout observed on the first call wins.
        name = ctx.new_name()
        key = ctx.layout_keys[name] = (sym.qualname, occurrence, next(positions_made))
        known = observed_strides(ctx, key, m.shape) or (real_strides and real_strides(m.shape))
        return TensorVar(name, m.shape, m.dtype, default_device, known or m.stride(), m.requires_grad,
                         m.is_conj(), m.is_neg())

    subsymbols = ()
    if decomposition is not None and not accepts(decomposition, args, kwargs):
        decomposition = None     # an argument torch takes that the decomposition does not know
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
        # The op's outputs have its own layout (eager's, or the one observed), which its prims'
        # layouts need not match: the prims that make them write that layout.
        final = {}
        for position, (p, m) in enumerate(zip(_tensor_leaves(dout), _tensor_leaves(mout))):
            v = p.ir
            key = ctx.layout_keys[v.name] = (sym.qualname, occurrence, position)
            strides = observed_strides(ctx, key, m.shape) or tuple(m.stride())
            if strides != v.strides:
                final[v.name] = v.replaced(strides=strides)
        if final:
            swap = lambda x: final.get(x.name, x) if isinstance(x, TensorVar) else x  # noqa: E731
            subsymbols = tuple(b.replace(args=map_values(swap, b.args), kwargs=map_values(swap, b.kwargs),
                                         output=map_values(swap, b.output)) for b in subsymbols)
        out_vars = map_values(lambda p: final.get(p.ir.name, p.ir) if isinstance(p, TensorProxy) else p,
                              dout)
    else:
        out_vars = map_values(lambda m: make_var(m) if isinstance(m, torch.Tensor) else m, mout)
        if not sym.has(Tag.FALLBACK) and decomposition is not None:   # it declined this call
            sym = Symbol(sym.qualname, sym.fn, sym.tags | {Tag.FALLBACK})

    # An op that returns one of its inputs unchanged (x.contiguous() of a contiguous x) is no op.
    if isinstance(mout, torch.Tensor) and id(mout) in metas:
        return metas[id(mout)]

    if subsymbols and ctx.pinned_copies and any(v.name in ctx.pinned_copies for s in subsymbols for v in s.outputs()):
        for s in subsymbols:      # its prims, which lay out alike at every size (ctx.pinned_copies)
            ctx.record(s)
        return dout
    ir_args, ir_kwargs = map_values(_to_ir, (args, kwargs))
    if amp:
        autocast_region(ctx, True)
    ctx.record(BoundSymbol(sym, ir_args, ir_kwargs, _structure(out_vars), subsymbols))
    if amp:
        autocast_region(ctx, False)

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


def _traced_with_casts(ctx: TraceContext, sym: Symbol, func, args: tuple, kwargs: dict, casts: dict,
                       decomposition, real_strides):
    """The op as autocast runs it: its operands cast as `casts` says (autocast_casts), then the op
    on them traced as without autocast, its inner ops included (autocast casts an op's operands
    once, at the top: what the op calls inside runs below it)."""
    ctx.autocast_explicit += 1
    try:
        args, kwargs = map_values(lambda x: apply(Prim.CONVERT, x, casts[id(x)])
                                  if isinstance(x, TensorProxy) and id(x) in casts else x, (args, kwargs))
        return trace_call(ctx, sym, func, args, kwargs, decomposition, real_strides)
    finally:
        ctx.autocast_explicit -= 1


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
        and (p.ir.conj_bit, p.ir.neg_bit) == (m.is_conj(), m.is_neg()) for p, m in zip(a, b))


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


def capture_outside_tensor(ctx: TraceContext, tensor: torch.Tensor) -> TensorProxy:
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
                     tensor.requires_grad, tensor.is_conj(), tensor.is_neg())


def _record_prim(sym: Symbol, args: tuple, kwargs: dict):
    """How core's `apply` records a prim (decompositions and VJP rules): in the active trace.  A
    reshape in a program whose sizes may be 1 copies explicitly where it copies at some size
    (layout.copies_at_some_size)."""
    if sym is _RESHAPE and _may_be_one() and isinstance(args[0], TensorProxy) and \
            copies_at_some_size(args[0].ir, args[1]):
        copied = apply(Prim.CONTIGUOUS, args[0])
        current().pinned_copies.add(copied.ir.name)
        args = (copied, *args[1:])
    return trace_call(current(), sym, sym.fn, args, kwargs)


def _may_be_one() -> bool:
    """Whether this thread traces a symbolic program with a symbol that may be 1."""
    sizes = symbolic_active()
    return sizes is not None and bool(sizes.ones)


_RESHAPE = Prim.RESHAPE.block.symbol
set_recorder(_record_prim)
