"""Tracing: run the user's function on proxies and return the trace it recorded.

Torch functions are intercepted by a TorchFunctionMode (it sees factories, which have no proxy
argument, as well as ops on proxies); Tensor methods and operators reach the dispatcher through the
proxy itself.  What the function reads from outside is scanned once, before the run, and recorded
as the trace's bindings (strict/bindings.py); the observer (strict/observer.py) watches the run for
the sharp edges that no proxy sees.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect

import torch
from torch._prims_common import make_contiguous_strides_for
from torch.overrides import TorchFunctionMode

from fjit.core.ir import TensorVar, flatten_values, map_values
from fjit.core.meta import same_layout
from fjit.core.symbolic import active
from fjit.core.trace import Trace
from fjit.errors import error_for
from fjit.frontend.context import Mode, TraceContext
from fjit.frontend.dispatch import dispatch
from fjit.frontend.library_calls import library_calls_traced
from fjit.frontend.transforms import transforms_traced
from fjit.frontend.inputs import make_proxies
from fjit.frontend.leaks import undo_reach_leaks
from fjit.frontend.modes import record_mode_changes
from fjit.frontend.outputs import output_structure
from fjit.frontend.proxies import InputDict, InputList, TensorProxy
from fjit.frontend.rng import generators_traced
from fjit.strict.bindings import scan_bindings
from fjit.strict.jitted_callable import code_location
from fjit.strict.locate import is_located_file, user_location
from fjit.strict.observer import call_as_user_code, observe


class _Intercept(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {})


@dataclasses.dataclass
class TraceResult:
    trace: Trace
    specialized: frozenset     # float input positions the trace depends on the value of
    edges: list                # sharp edges found (permissive modes)
    layout_keys: dict          # var name -> its layout key (TraceContext.layout_keys)

    def observed(self, wrong: dict) -> dict:
        """`wrong` (var name -> (shape, real strides), from running this trace) by layout key:
        what `observed_strides` takes on a retrace of the same call."""
        return {self.layout_keys[name]: seen for name, seen in wrong.items() if name in self.layout_keys}


class LayoutMismatch(Exception):
    """A channels-last trace whose outputs cannot be laid out as the first trace's."""


def trace_function(fn, args: tuple, kwargs: dict, leaves: list, mode: Mode,
                   namespace: dict, observed_strides: dict | None = None,
                   channels_last_of: Trace | None = None) -> TraceResult:
    """Trace `fn` on proxies of `args`.  `observed_strides` (layout key -> (shape, strides): TraceResult.observed)
    corrects the layouts that opaque ops' meta kernels predicted wrongly on an earlier trace of this call.

    `channels_last_of`: a trace of this call, traced again with its 2-D convolutions' inputs made
    channels-last (frontend/dispatch.py) and its outputs laid out as that trace's are where those
    are contiguous (LayoutMismatch where they cannot be)."""
    ctx = TraceContext(fn, mode, dispatch, namespace)
    ctx.observed_strides = observed_strides or {}
    ctx.channels_last_convs = channels_last_of is not None
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
        with observe(ctx, fn, input_containers=(InputList, InputDict), undo_leaks=undo_reach_leaks), \
                _Intercept(), generators_traced, library_calls_traced, transforms_traced, \
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
            if channels_last_of is not None:
                output = _laid_out_as(output, channels_last_of.output)
        trace = Trace(ctx.fn_name, list(ctx.inputs), list(ctx.scopes[0]), output, dict(ctx.consts),
                      stage="traced", bindings=bindings, namespace=namespace, rebuild=rebuild,
                      checkpointed=dict(ctx.checkpointed), sizes=active(), autocast_off=ctx.autocast_seen)
    return TraceResult(trace, frozenset(ctx.specialized), list(ctx.edges), dict(ctx.layout_keys))


def _laid_out_as(output, expected):
    """`output` with each tensor made contiguous where the same output of `expected` (the first
    trace's) is contiguous and this one is not: a caller's `.view` works on eager's layout."""
    got, want = flatten_values(output), flatten_values(expected)
    if len(got) != len(want):
        raise LayoutMismatch("the outputs differ")
    fixed: dict = {}
    for v, w in zip(got, want):
        if not isinstance(v, TensorVar) or v.name in fixed:
            continue
        if not isinstance(w, TensorVar) or v.shape != w.shape:
            raise LayoutMismatch("the outputs differ")
        if not same_layout(v.shape, v.strides, w.strides):
            if not same_layout(w.shape, w.strides, make_contiguous_strides_for(w.shape)):
                raise LayoutMismatch(f"output {w.name} is neither contiguous nor laid out the same")
            fixed[v.name] = dispatch(torch.Tensor.contiguous, (TensorProxy(v),), {}).ir
    return map_values(lambda x: fixed.get(x.name, x) if isinstance(x, TensorVar) else x, output)


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
