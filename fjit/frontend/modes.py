"""Grad mode and autocast while tracing.

The traced code runs for real, so `with torch.no_grad():` or an autocast block changes the global
state between two ops: a grad-mode change is recorded as a MODE bound symbol, so the program runs
each op under the mode eager ran it in.

Autocast is written into the trace, as AOTAutograd's graphs have it: an op autocast can change (one
with a tensor autocast casts) runs, while tracing, on storage-less probes through torch's own
autocast kernels (whose kernels below autocast are meta kernels), which shows the casts autocast
makes of its operands.  The trace records those casts, then the op on the cast operands without
autocast (its prims, so it fuses and the joint backward differentiates it), and the program runs
with autocast off (Trace.autocast_off).  Where the probe's result is not explained by casts of the
operands (a composite op whose inner ops autocast casts, as tensordot's mm), the op stays one
torch call run with autocast switched on around it.
"""
from __future__ import annotations

import torch

from fjit.core.ir import BoundSymbol, Symbol, Tag, flatten_values, map_values
from fjit.frontend.context import AMP_DEVICES, TraceContext, autocast_state
from fjit.core.symbolic import SymbolicUnsupported, active, hint
from fjit.frontend.proxies import NumberProxy, TensorProxy


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
    if amp != ctx.autocast:     # its casts are written per op (autocast_casts): nothing to record
        ctx.autocast = amp
        ctx.autocast_seen = ctx.autocast_seen or any(on for on, _ in amp)


def autocast_region(ctx: TraceContext, on: bool) -> None:
    """Record autocast switched on (with the dtypes the traced code has it at) or off again, around
    an op whose autocast behaviour is not casts of its operands, in a program that runs with it off."""
    for device, (enabled, dtype) in zip(AMP_DEVICES, ctx.autocast):
        if enabled:
            if on:
                ctx.record(BoundSymbol(_SET_AUTOCAST_DTYPE, (device, dtype), {}, None))
            ctx.record(BoundSymbol(_SET_AUTOCAST, (device, on), {}, None))


_CASTS: list = []     # while autocast_casts probes an op: (probe, dtype) of each _to_copy it sees


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
        # Every tensor and device of the call becomes meta, so no kernel needs data: a copy to
        # a device (`_to_copy(device=cpu)`: `.to(device=...)`, `.cpu()`), a factory given a
        # device (`new_ones`, `full`), and real tensors an op made inside (an autograd.Function's
        # forward).  The results are on the device the call asked for, else on its operands'.
        leaves = flatten_values((args, kwargs))
        device = next((x for x in leaves if isinstance(x, torch.device)), None) or \
            next(x.device for x in leaves if isinstance(x, _AutocastProbe))
        if func is torch.ops.aten._to_copy.default and _CASTS and isinstance(args[0], _AutocastProbe):
            _CASTS[-1].append((args[0], (kwargs or {}).get("dtype")))
        margs, mkwargs = map_values(_as_meta, (args, kwargs or {}))
        out = func(*margs, **mkwargs)
        return map_values(lambda m: _AutocastProbe(m, device) if isinstance(m, torch.Tensor) else m,
                          out)


def _as_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return torch.device("meta") if isinstance(x, torch.device) else x


def autocast_applies(args, kwargs) -> bool:
    """Whether autocast can change the op: one of its tensors is of a kind autocast casts
    (floating point other than float64) on a device where autocast is on.  Every autocast policy
    casts only those, so an op on token ids, a boolean mask or float64 values is traced as
    without autocast (one C call when autocast is off)."""
    if not torch._C._is_any_autocast_enabled():
        return False
    devices = {x.ir.device.type for x in flatten_values((args, kwargs))
               if isinstance(x, TensorProxy) and x.ir.dtype.is_floating_point
               and x.ir.dtype != torch.float64}
    return any(torch.is_autocast_enabled(d) for d in devices if d in AMP_DEVICES)


def autocast_casts(func, args, kwargs, meta_of) -> dict | None:
    """{id(operand proxy): dtype} of the casts autocast makes of the op's operands, where the op
    run on the cast operands without autocast gives the dtypes autocast gives (an op autocast
    leaves alone: {}); None where it does not (a composite op whose inner ops autocast casts, a
    custom Function), or the probe or the meta kernel refuses the call.  `meta_of(casts)` is the
    op's meta result on its operands cast so."""
    probes: dict = {}
    pargs, pkwargs = _probed(args, kwargs, probes)
    _CASTS.append([])
    try:
        pout = func(*pargs, **pkwargs)
    except Exception:      # noqa: BLE001 -- the torch-call path probes it again and says why
        return None
    finally:
        seen = _CASTS.pop()
    by_probe = {id(probes[id(x)]): x for x in _proxies(args, kwargs)}
    casts: dict = {}
    for p, dtype in seen:
        if dtype is None or dtype == p.dtype:
            continue        # a copy that casts nothing (a device move): the op's own, not autocast's
        x = by_probe.get(id(p))
        if x is None or casts.get(id(x), dtype) != dtype:
            return None     # a cast of a value the op made (its inner ops'), or two casts of one
        casts[id(x)] = dtype
    try:
        with torch._C._DisableAutocast():
            mout = meta_of(casts)
    except Exception:      # noqa: BLE001
        return None
    got, want = _tensor_leaves(mout), _tensor_leaves(pout)
    if [(m.dtype, m.ndim) for m in got] != [(m.dtype, m.ndim) for m in want]:
        return None
    return casts


def _proxies(args, kwargs) -> list:
    return [x for x in flatten_values((args, kwargs)) if isinstance(x, TensorProxy)]


def autocast_outputs(func, args, kwargs, mout):
    """`mout` (the meta result, None where the meta call refused) as autocast makes it: the cast
    inputs' dtypes, or `mout` itself, views included, where autocast leaves the op alone.
    Autocast casts tensors only, so a result without one (a size, a dtype) needs no probe."""
    if mout is not None and not _tensor_leaves(mout):
        return mout
    pargs, pkwargs = _probed(args, kwargs, {})
    pout = func(*pargs, **pkwargs)
    dtypes = [m.dtype for m in _tensor_leaves(pout)]
    if mout is not None and dtypes == [m.dtype for m in _tensor_leaves(mout)]:
        return mout
    # the probe's results are fresh: whether autograd records them is the op's inputs' affair
    records = torch.is_grad_enabled() and any(
        isinstance(x, TensorProxy) and x.ir.requires_grad for x in flatten_values((args, kwargs)))
    sizes = active()
    if sizes is None:
        return map_values(lambda x: _as_meta(x).requires_grad_(records and _differentiable(x.dtype))
                          if isinstance(x, torch.Tensor) else _as_meta(x), pout)
    # symbolic sizes: the probe ran at the compiling call's sizes; the shapes are the meta result's
    if mout is None or len(_tensor_leaves(mout)) != len(dtypes):
        raise SymbolicUnsupported(f"{getattr(func, '__name__', func)} under autocast has no shape rule of its own")
    retyped = iter(dtypes)
    with sizes.shape_rules():
        return map_values(lambda m: torch.empty_strided(m.shape, m.stride(), dtype=(d := next(retyped)), device="meta",
                                                        requires_grad=records and _differentiable(d))
                          if isinstance(m, torch.Tensor) else m, mout)


def _differentiable(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _probed(args, kwargs, probes: dict) -> tuple:
    """(args, kwargs) as the probe runs the op: each tensor a storage-less probe on its device at
    the compiling call's sizes (filed in `probes` by id of its proxy), each number its value."""
    def probe(x):
        if isinstance(x, TensorProxy):
            made = probes[id(x)] = _AutocastProbe(_hinted_meta(x.ir), x.ir.device)
            return made
        return _hinted(x)
    return map_values(probe, (args, kwargs))


def _hinted(x):
    """A number argument as the probe takes it: a symbolic size at its compiling call's value."""
    x = x._fj_value if isinstance(x, NumberProxy) else x
    return hint(x) if isinstance(x, torch.SymInt) else x


def _hinted_meta(v) -> torch.Tensor:
    """A meta tensor of `v`'s dtype at the compiling call's sizes (a probe of autocast's dtype
    choices, which sizes do not change, runs outside a symbolic program's shape rules)."""
    return torch.empty_strided(tuple(hint(n) for n in v.shape), tuple(hint(n) for n in v.strides),
                               dtype=v.dtype, device="meta")


def _tensor_leaves(x) -> list:
    return [m for m in flatten_values(x) if isinstance(m, torch.Tensor)]
