"""The compile pipeline: every stage from a traced function to the program that runs.

    trace (frontend) -> cleanup passes -> each kernel executor's claim, in the user's order
    -> finalize (buffer reuse, frees) -> the torch executor's generated function

An input requiring grad under grad mode adds the joint forward/backward program (fjit.autodiff),
whose two traces go through the same stages.  A program with opaque ops runs once op by op before
it is compiled, so that a meta kernel's wrong guess at a layout is traced again with the real one.
Check mode (FJIT_CHECK=1) verifies every stage's structure and runs every stage against the first.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable

import torch
from torch._prims_common import make_contiguous_strides_for
import torch.utils._pytree as pytree

import fjit.autodiff as autodiff
import fjit.config as config
import fjit.program_choice as program_choice
from fjit.config import TraceMode
from fjit.core.ir import Tag, TensorVar
from fjit.core.meta import same_layout
from fjit.core.symbolic import SymbolicSizes, SymbolicUnsupported, symbolic
from fjit.core.trace import Trace
from fjit.executors import TORCH, fusing_executor, kernel_executor, torch_executor
from fjit.frontend.context import AMP_DEVICES, Mode, TraceContext, autocast_state
from fjit.frontend.dispatch import dispatch
from fjit.frontend.light_imports import light_imports
from fjit.frontend.proxies import NumberProxy, TensorProxy
from fjit.frontend.rng import rng_preserved, rng_snapshot
from fjit.frontend.tracer import trace_function
import fjit.decompositions  # noqa: F401  (registers every decomposition with the dispatcher)
from fjit.runtime import TRACE_NAMESPACE
from fjit.passes.basic import (autograd_may_record, constant_fold, cse, dce, free_dead_values,
                               reuse_buffers, simplify_views)
from fjit.passes.gemms import choose_gemms
from fjit.logs import recompiles
from fjit.passes import layouts
from fjit.passes.verify import TraceVerificationError, verify

CLEANUP = (dce, cse, constant_fold, simplify_views, dce)
_NOT_RUN = object()      # the first call's result was not computed while compiling


@dataclasses.dataclass
class Compilation:
    """One compiled program and how it was made."""
    program: Callable                # (*leaves) -> the function's result
    traces: list[Trace]              # every stage of the forward, first to last
    backward_traces: list[Trace]     # every stage of the compiled backward (or torch autograd's)
    specialized: frozenset           # float input positions the trace depends on the values of
    first: object = _NOT_RUN         # the compiling call's result, where the layout check ran it
    guards: object = None            # a symbolic program's guards (core/symbolic.py Guards)

    def result(self, leaves: list):
        """The compiling call's result: the layout check's run, else the program's."""
        return self.program(*leaves) if self.first is _NOT_RUN else self.first


def compile_call(fn: Callable, args: tuple, kwargs: dict, leaves: list, mode: TraceMode,
                 executors: tuple) -> Compilation:
    """Trace `fn` on this call and compile it for `executors` (a tuple of executor names)."""
    with light_imports():
        result, traces, first, executors = _trace_with_real_layouts(fn, args, kwargs, leaves, mode,
                                                                    executors)
        traces, forward = _verified_program(result.trace, traces, leaves)
        # An input requiring grad under grad mode: a compiled forward and backward, when
        # something in them fuses (else torch autograd runs the forward program's torch calls).
        cleaned = traces[len(CLEANUP)]
        lowering = _lowering(cleaned, leaves, executors)
        joint = autodiff.compile_with_backward(cleaned, leaves, lowering)
        autograd_traces = traces       # the plain forward's stages: what torch autograd runs
        if isinstance(joint, autodiff.Compiled):
            traces, program, backward = joint.forward_traces, joint.program, joint.backward_traces
        else:
            program = forward
            backward = [] if joint is None else [autodiff.autograd_stage(traces[-1], joint)]
        # Activation checkpointing (torch.utils.checkpoint) is the joint program's to honour: it
        # is kept unmeasured, and where there is none the user hears that memory is not saved.
        checkpointing = bool(cleaned.checkpointed) and joint is not None
        if checkpointing and not isinstance(joint, autodiff.Compiled):
            warnings.warn(f"fjit: activation checkpointing in '{cleaned.name}' is not honoured: torch "
                          f"autograd runs the backward, saving what the forward computed, because {joint}",
                          RuntimeWarning, stacklevel=2)
        elif checkpointing and joint.checkpoint_saved:
            warnings.warn(f"fjit: activation checkpointing in '{cleaned.name}' is honoured in part: the "
                          f"outputs of {', '.join(joint.checkpoint_saved)} inside checkpointed regions are "
                          f"saved for the backward, not recomputed", RuntimeWarning, stacklevel=2)
        if joint is not None and not checkpointing and program_choice.wants_measuring(len(cleaned.bsyms)):
            channels_last = _channels_last_traces(fn, args, kwargs, leaves, mode, result.trace)
            program = _measured_choice(joint, autograd_traces, forward, backward, channels_last)
        elif joint is None and any(b.sym.has(Tag.KERNEL) for b in traces[-1].bsyms) and \
                program_choice.wants_measuring_forward(leaves):
            program = _measured_forward(program, result.trace, traces, leaves)
        if first is not _NOT_RUN and isinstance(program, program_choice.MeasuredChoice):
            program.count_call()      # the compiling call ran op by op: the next one is its second
        if any(b.sym.has(Tag.MODE) for b in traces[-1].bsyms):
            program = _restoring_modes_on_error(program)
        if config.check_mode():
            check_traces(traces, leaves)
        return Compilation(program, traces, backward, result.specialized, first)


def compile_symbolic(fn: Callable, args: tuple, kwargs: dict, leaves: list, mode: TraceMode,
                     executors: tuple, dynamic: dict[int, frozenset],
                     ones: dict[int, frozenset] | None = None, budget: float | None = None) -> Compilation:
    """Trace `fn` with the input dims `dynamic` ({flat input position: dims}) symbolic and compile
    it to a program valid wherever its guards hold (core/symbolic.py): its stages as a
    specialized compile's, kernels and the joint program included, without the measured choice
    between forms (its timings are per size).  The dims `ones` (of `dynamic`) may be 1: the guards
    admit a call with one at 1 where the program's layouts, replayed at its sizes, hold
    (_layouts_at_one).  SymbolicUnsupported (or any error of fjit's own
    machinery on symbols) where something cannot compute with a symbol: the caller compiles with
    specialized sizes, which raises the user's own errors as ever.  SymbolicTooSlow where the
    compile runs past `budget` seconds (None: no limit)."""
    sizes = SymbolicSizes(dynamic, ones, budget)
    try:
        return _compile_symbolic(fn, args, kwargs, leaves, mode, executors, sizes)
    finally:
        sizes.deadline = None         # the program's layout check at a size of 1 asks again


def _compile_symbolic(fn: Callable, args: tuple, kwargs: dict, leaves: list, mode: TraceMode,
                      executors: tuple, sizes: SymbolicSizes) -> Compilation:
    # (no light_imports: the shape environment has loaded sympy and Dynamo, which import lazily
    # on every call, and the import hook would see each of those statements)
    with symbolic(sizes), sizes.oblivious():
        result, traces, first, _ = _trace_with_real_layouts(fn, args, kwargs, leaves, mode, executors, sizes)
        traced = traces[0]
        program = torch_executor.compile_trace(traces[-1])
        joint = autodiff.compile_with_backward(traces[len(CLEANUP)], leaves,
                                               _lowering(traces[len(CLEANUP)], leaves, executors))
        if isinstance(joint, autodiff.Compiled):
            traces, program, backward = joint.forward_traces, joint.program, joint.backward_traces
        else:
            backward = [] if joint is None else [autodiff.autograd_stage(traces[-1], joint)]
        if any(b.sym.has(Tag.MODE) for b in traces[-1].bsyms):
            program = _restoring_modes_on_error(program)
        if config.check_mode():
            check_traces(traces, leaves)
        guards = sizes.guards()
        if guards.ones:
            guards.at_one = _layouts_at_one(sizes, traced, backward[0] if isinstance(joint, autodiff.Compiled) else None)
    traces[-1] = traces[-1].with_stage(f"{traces[-1].stage}: symbolic sizes {sizes.described()}; "
                                       f"valid where {' and '.join(guards.shown) or 'always'}")
    return Compilation(program, traces, backward, result.specialized, first, guards)


def _layouts_at_one(sizes: SymbolicSizes, forward: Trace, backward: Trace | None) -> Callable:
    """The check a symbolic program's guards run on a call with a symbol at 1 (core/symbolic.py
    Guards.at_one): the traced forward, and the compiled backward's first stage, replayed on meta
    tensors at the call's sizes (layouts.layout_differing_at), giving what differs or None."""
    def differs(leaves: list) -> str | None:
        size = sizes.concrete(leaves)
        numbers = {str(sizes.names[s]): int(leaves[src.position].shape[src.dim])
                   for s, src in sizes.sources.items()}
        with symbolic(None):
            why = layouts.layout_differing_at(forward, leaves, size, numbers)
            if why is None and backward is not None:
                why = layouts.layout_differing_at(backward, None, size, numbers)
                why = None if why is None else f"in the backward, {why}"
        return why
    return differs


def _symbolic_layouts(trace: Trace, wrong: dict) -> dict:
    """`wrong` (name -> (real shape, real strides), run_observing_layouts') with each layout as
    the symbolic strides of the value's symbolic shape: a dense layout is its order of dims, which
    holds at every size.  SymbolicUnsupported for a layout that is not dense."""
    recorded = {v.name: v for b in trace.bsyms for v in b.outputs() if isinstance(v, TensorVar)}
    out = {}
    for name, (shape, strides) in wrong.items():
        v = recorded[name]
        order = sorted(range(len(shape)), key=lambda d: (-strides[d], -shape[d]))   # outermost first
        step, dense = 1, {}
        for d in reversed(order):
            if strides[d] != step and shape[d] != 1:
                raise SymbolicUnsupported(f"the real layout of {name}, {tuple(strides)}, is not dense")
            dense[d] = step
            step *= shape[d]
        symbolic_step, symbolic_strides = 1, {}
        for d in reversed(order):
            symbolic_strides[d] = symbolic_step
            symbolic_step = symbolic_step * v.shape[d]
        out[name] = (tuple(v.shape), tuple(symbolic_strides[d] for d in range(len(shape))))
    return out


def lower(trace: Trace, executors: tuple, leaves: list, cleanup: bool = True,
          untracked: bool = False) -> list[Trace]:
    """Every stage from `trace` to the one the generated function runs: the cleanup passes, then
    each kernel executor of `executors` in the user's order (a stage each that claims something;
    each sees what the earlier ones left), then finalize for the torch executor."""
    traces = [trace]
    for stage in CLEANUP if cleanup else ():
        traces.append(stage(traces[-1]))
    for name in executors:
        executor = kernel_executor(name)
        claimed = executor.claim(traces[-1], leaves) if executor is not None else None
        if claimed is not None:
            traces.append(claimed)
    traces.append(finalize(traces[-1], untracked))
    if config.check_mode():
        for t in traces:
            verify(t)
    return traces


def _verified_program(trace: Trace, traces: list[Trace], leaves: list) -> tuple[list[Trace], Callable]:
    """(the stages that run, the function running the last): `traces`, `trace`'s stages, where
    their last verifies (passes/verify.py); else, as the program is never run broken, the stages
    of `trace` with torch calls alone, the reason in the last one's stage line and on the
    fjit.recompiles log (where those fail too, the error is raised: fjit has no form to run).
    Check mode raises, having verified every stage in `lower`, naming the stage that broke a rule."""
    program, error = _verified(trace.name, "the program with kernels", traces[-1])
    if program is not None:
        return traces, program
    plain = lower(trace, (TORCH,), leaves)
    plain[-1] = plain[-1].with_stage(f"torch_executor: the program with kernels failed verification ({error})")
    return plain, torch_executor.compile_trace(plain[-1])


def finalize(trace: Trace, untracked: bool = False) -> Trace:
    """The last stage, what the torch executor compiles: in a program autograd does not record
    (`untracked`: the joint forward and backward, or one where no value requires grad) chains of
    views become one reinterpretation of their start, elementwise ops write into operands nothing
    reads later, and each intermediate is deleted after its last use."""
    tracked = not untracked and autograd_may_record(trace)
    # the GEMM forms are timed per shape: a symbolic program keeps torch's own
    trace = layouts.conform_prim_layouts(trace if trace.sizes is not None else choose_gemms(trace, tracked))
    # the executors' claims leave views nothing reads (a kernel reads its input through them)
    trace = dce(trace if tracked else layouts.reinterpret_views(trace))
    return free_dead_values(reuse_buffers(trace)).with_stage("torch_executor")


def _trace_with_real_layouts(fn, args, kwargs, leaves, mode, executors, sizes: SymbolicSizes | None = None):
    """(trace result, stages, the first call's result or _NOT_RUN, the executors used).  A program
    with opaque ops runs once op by op with torch; where an opaque op's real layout differs from
    its meta kernel's, the function is traced again with the real one (downstream layouts
    follow), and that run's result is this call's.  If layouts still disagree, only torch calls
    run.  With symbolic `sizes` (compile_symbolic), the layouts seen are taken as symbolic strides
    (_symbolic_layouts), and a function that checkpoints, or whose layouts still disagree, is
    SymbolicUnsupported."""
    observed: dict = {}
    for attempt in range(3):
        result = trace_function(fn, args, kwargs, leaves, mode, TRACE_NAMESPACE, observed)
        if sizes is not None and result.trace.checkpointed:
            raise SymbolicUnsupported("activation checkpointing is honoured by the specialized joint program")
        traces = lower(result.trace, executors, leaves)
        # The traced stage, dead ops included: check mode checks every stage's layouts.
        traced = traces[0]
        if not layouts.has_opaque_ops(traced):
            return result, traces, _NOT_RUN, executors
        rewind = rng_snapshot(traced.bsyms)
        first, wrong = _restoring_modes_on_error(layouts.run_observing_layouts)(traced, leaves)
        if not wrong or attempt == 2 and sizes is None:
            break
        rewind()      # the next run must draw what this one drew
        if sizes is not None:
            if attempt == 2:
                raise SymbolicUnsupported(f"the real layout of {', '.join(sorted(wrong))} is not its shape rule's")
            wrong = _symbolic_layouts(traced, wrong)
        observed.update(result.observed(wrong))
    if wrong:                # torch calls read any layout
        return result, lower(result.trace, (TORCH,), leaves), first, (TORCH,)
    return result, traces, first, executors


def _restoring_modes_on_error(program):
    """A program that enters grad-mode or autocast regions leaves them as eager's `with` blocks do
    when an op raises (when it returns, the trace has already restored or kept them as eager)."""
    def run(*leaves):
        grad, amp = torch.is_grad_enabled(), autocast_state()
        try:
            return program(*leaves)
        except BaseException:
            torch._C._set_grad_enabled(grad)
            for device, (on, dtype) in zip(AMP_DEVICES, amp):
                torch.set_autocast_enabled(device, on)
                torch.set_autocast_dtype(device, dtype)
            raise
    return run


# -- the backward's joint program ---------------------------------------------------------------

def _measured_forward(program, trace: Trace, traces: list[Trace], leaves: list):
    """The program with kernels, or its torch calls alone if they measure faster on the second
    call (fjit/program_choice.py)."""
    plain = lower(trace, (TORCH,), leaves)
    torch_calls, _ = _verified(trace.name, "its torch calls", plain[-1])
    if torch_calls is None:
        return program

    def plain_traces(reason: str) -> tuple[list, list]:
        return plain[:-1] + [plain[-1].with_stage(f"torch_executor: {reason}")], []
    forms = [program_choice.Form("the program with kernels", program, program, _kept_as_compiled(traces, [])),
             program_choice.Form("its torch calls", torch_calls, torch_calls, plain_traces,
                                 "FORWARD_MARGIN")]
    return program_choice.MeasuredChoice(forms, plain[-1].bsyms, traces, [], training=False)


def _kept_as_compiled(forward: list[Trace], backward: list[Trace]):
    """Form.stages of a form that runs the compilation's own stages: the same stages, the last
    of each with the measurement in its stage line (what the zoo runner reads a kept form from)."""
    def stages(reason: str) -> tuple[list, list]:
        return tuple([*ts[:-1], ts[-1].with_stage(f"{ts[-1].stage}: {reason}")] if ts else []
                     for ts in (list(forward), list(backward)))
    return stages


def _verified(name: str, what: str, final: Trace) -> tuple[Callable | None, TraceVerificationError | None]:
    """(the function running `final`, None) where it verifies; else (None, the error), which is
    logged on fjit.recompiles, so that the caller keeps another form (check mode raises)."""
    try:
        return torch_executor.compile_trace(final), None
    except TraceVerificationError as e:
        if config.check_mode():
            raise
        recompiles.warning("%s: %s does not run: %s", name, what, e)
        return None, e


def _measured_choice(joint, traces: list[Trace], forward: Callable, backward: list[Trace],
                     channels_last: list[Trace] | None):
    """The program that measures its training forms on the second call and keeps the fastest
    (fjit/program_choice.py): the joint program where there is one (`joint` is autodiff.Compiled;
    else the reason there is none), torch autograd over `traces` (the plain forward's stages,
    `forward` the function running them, whose backward stage list is `backward` where there is no
    joint program), and torch autograd over the channels-last stages where there are some and
    they verify.  With one form, that form's program."""
    forms = []
    if isinstance(joint, autodiff.Compiled):
        shown = (joint.forward_traces, joint.backward_traces)
        forms.append(program_choice.Form("the compiled joint program", joint.program,
                                         joint.program.flat(), _kept_as_compiled(*shown)))
    else:
        shown = (traces, backward)
    for stages, what, margin in ((traces, "torch autograd's forward and backward", "MARGIN"),
                                 (channels_last, "torch autograd over channels-last convolutions",
                                  program_choice.channels_last_margin(traces[-1].bsyms))):
        if stages is None:
            continue
        final = stages[-1]
        run = forward if stages is traces else _verified(final.name, what, final)[0]
        if run is None:
            continue

        def shows(reason: str, stages=stages, final=final) -> tuple[list, list]:
            return list(stages), [autodiff.autograd_stage(final, reason)]
        forms.append(program_choice.Form(
            what, run, torch_executor.compile_trace(final.with_stage(final.stage, rebuild=None)), shows, margin,
            eager_like=stages is traces))
    if len(forms) == 1:
        return forms[0].run
    return program_choice.MeasuredChoice(forms, traces[-1].bsyms, *shown)


def _channels_last_traces(fn, args, kwargs, leaves, mode, first: Trace) -> list[Trace] | None:
    """The stages of `fn` traced again with its 2-D CPU convolutions' inputs made channels-last,
    for torch calls alone (what torch autograd runs), its outputs laid out as `first`'s (this
    call's trace); None where program_choice does not offer the form (offers_channels_last), or
    where tracing it so fails or its real layouts are not the recorded ones (it is a faster form
    at best: `first`'s program runs either way)."""
    if mode is not TraceMode.ERROR or not program_choice.offers_channels_last(first.bsyms):
        return None
    observed: dict = {}
    for _ in range(3):    # as _trace_with_real_layouts: a layout a meta kernel got wrong, retraced
        try:
            result = trace_function(fn, args, kwargs, leaves, mode, TRACE_NAMESPACE, observed,
                                    channels_last_of=first)
        except Exception:       # noqa: BLE001 -- a layout the function cannot take: no such form
            return None
        traces = lower(result.trace, (TORCH,), leaves)
        if any(b.sym.has(Tag.RANDOM) and any(_relaid(v) for v in b.inputs()) for b in traces[0].bsyms):
            # a draw shaped like a channels-last value (dropout after a convolution) fills it in
            # memory order: other numbers at each position than eager's
            return None
        with torch.no_grad(), rng_preserved(traces[0].bsyms):
            _, wrong = layouts.run_observing_layouts(traces[0], leaves)
        if not wrong:
            return traces
        observed.update(result.observed(wrong))
    # What is still wrong is only strides of dims of size 1, which address nothing, or the form
    # is dropped (check mode compares those strides too).
    recorded = {v.name: v for b in traces[0].bsyms for v in b.outputs()}
    if config.check_mode() or not all(same_layout(shape, strides, recorded[name].strides)
                                      for name, (shape, strides) in wrong.items()):
        return None
    return traces


def _relaid(v) -> bool:
    """A 4-D value laid out otherwise than contiguous (the channels-last form's activations)."""
    return isinstance(v, TensorVar) and v.ndim == 4 and not same_layout(
        tuple(v.shape), tuple(v.strides), tuple(make_contiguous_strides_for(tuple(v.shape))))


def _backward_context(trace: Trace, counter: int) -> TraceContext:
    """A trace context recording the backward of `trace`, naming values from t<counter> on."""
    ctx = TraceContext(lambda: None, Mode.ERROR, dispatch, trace.namespace)
    ctx.fn_name = trace.name
    ctx.counter = counter
    # the forward's autocast is in its casts, and the backward's values have the dtypes they need:
    # a backward built under a call's autocast is traced as without it (its program runs so)
    ctx.autocast_explicit = 1
    return ctx


_RECORDER = autodiff.Recorder(context=_backward_context, tensor=TensorProxy,
                              number=lambda value, var: NumberProxy(value, var, frozenset()))


def _lowering(trace: Trace, leaves: list, executors: tuple) -> autodiff.Lowering:
    """What autodiff needs to build and compile `trace`'s backward for `executors`: the fusion
    policy of the executor that fuses on the trace's one device (None: none does, or its tensors
    are on several devices), these stages, and the frontend's recording."""
    devices = {v.device for v in trace.inputs if isinstance(v, TensorVar)}
    executor = fusing_executor(executors, devices.pop()) if len(devices) == 1 else None
    return autodiff.Lowering(fusion=executor,
                             lower=lambda t, cleanup: lower(t, executors, leaves, cleanup, untracked=True),
                             compile=torch_executor.compile_trace, recorder=_RECORDER)


# -- check mode ---------------------------------------------------------------------------------

def check_traces(traces: list[Trace], leaves: list) -> None:
    """Check mode (FJIT_CHECK=1): every stage's printed source runs and agrees with the first, and
    in every stage each torch fallback's real output has the shape, dtype and strides the trace
    recorded from meta tensors (an AssertionError names the op and both).  Stages are compared on
    their flat outputs (a rebuilt dataclass is not something assert_close compares); the
    rebuilding is the same function in every stage.  Every stage draws the same random numbers,
    and the generators are left as they were."""
    flat = [torch_executor.with_metadata_checks(t.with_stage(t.stage, rebuild=None)) for t in traces]
    with rng_preserved(traces[0].bsyms) as rewind:
        expected = flat[0].python_callable()(*leaves)
        for t in flat[1:]:
            rewind()
            got = t.python_callable()(*leaves)
            _assert_same_result(got, expected, t.stage)


def _assert_same_result(got, expected, stage: str) -> None:
    """Tensors agree up to dtype tolerance; every other leaf (a string, a dtype, a size) is equal."""
    got_leaves, got_spec = pytree.tree_flatten(got)
    want_leaves, want_spec = pytree.tree_flatten(expected)
    if got_spec != want_spec:
        raise AssertionError(f"fjit check: stage {stage} returns {got_spec}, the first {want_spec}")
    for a, b in zip(got_leaves, want_leaves):
        if isinstance(b, torch.Tensor):
            torch.testing.assert_close(a, b, equal_nan=True,
                                       msg=lambda m: f"fjit check: stage {stage} differs: {m}")
        elif not (a == b or a != a and b != b):      # NaN floats equal themselves here
            raise AssertionError(f"fjit check: stage {stage} returns {a!r}, the first {b!r}")
