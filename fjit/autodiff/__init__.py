"""The compiled backward: per-prim VJP rules (rules.py), the ATen backward calls of the ops eager
differentiates by one ATen function: convolutions, batch norms, pools and flash attention
(aten_backward.py), the joint forward/backward program split into two traces (joint.py), what its
backward recomputes rather than saves (recompute.py), and the autograd.Function that runs them
(function.py).

`compile_with_backward` is what the compile pipeline calls when an input requires grad under grad
mode.  It returns the reason, a string, when torch autograd over the forward program is the better
program (no op would be fused, a grad-mode region inside the function, ...); the caller then
compiles as before and `autograd_stage` is what `fjit.last_backward_traces` shows.

Autodiff imports neither the frontend nor the executors: the pipeline hands it a Lowering, which
says how the kernel executor that fuses here wants ops split, lowers and compiles traces, and
records the backward on the frontend's proxies.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch

from fjit.autodiff.function import Plan, list_callable
from fjit.autodiff.joint import Recorder, build, differentiable
from fjit.autodiff.rules import NONDIFF, VJP, has_rule
from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar, Var, flatten_values
from fjit.core.trace import Trace
from fjit.logs import recompiles
from fjit.passes.verify import TraceVerificationError, verify

__all__ = ["compile_with_backward", "autograd_stage", "Compiled", "Lowering", "Recorder", "VJP",
           "NONDIFF", "has_rule"]


@dataclasses.dataclass
class Compiled:
    program: Callable            # (*leaves) -> the caller's result, joined to autograd
    forward_traces: list
    backward_traces: list
    checkpoint_saved: tuple = ()  # ops of checkpointed regions whose values it saves (Joint's)


@dataclasses.dataclass(frozen=True)
class Lowering:
    """What the backward needs from the pipeline that builds it."""
    # the kernel executor that fuses on the trace's device: its differentiates(op) and
    # fused_prims(op) split the backward (fjit.executors.KernelExecutor); None where none does
    fusion: Any
    # (trace, cleanup) -> its stages, passes and executors, for a program autograd does not record
    lower: Callable[[Trace, bool], list]
    # a final stage -> the function that runs it, once it verifies (else TraceVerificationError)
    compile: Callable[[Trace], Callable]
    recorder: Recorder                      # how the backward is recorded on proxies


def wants_backward(trace: Trace) -> bool:
    return torch.is_grad_enabled() and any(differentiable(v) for v in trace.inputs)


def compile_with_backward(trace: Trace, leaves: list, lowering: Lowering) -> Compiled | str | None:
    """`trace` is the cleaned forward.  None: there is no backward to build (no input requires
    grad under grad mode); a string: why torch autograd runs the backward."""
    if not wants_backward(trace):
        return None
    if lowering.fusion is None:
        return "no kernel executor in this function's executors fuses on its device"
    joint = build(_complex_values_kept_inside(trace), leaves, lowering.fusion, lowering.recorder)
    if isinstance(joint, str):
        return joint
    with torch.no_grad():     # as inside autograd.Function: the kernel executors may claim
        forward = lowering.lower(joint.forward, False)
        backward = lowering.lower(joint.backward, True)
    try:      # neither program runs unless both verify (check mode raised in `lower` already)
        verify(backward[-1])
        plan = Plan(joint, lowering.compile(forward[-1]), list_callable(backward[-1]),
                    trace.output, trace.rebuild, _differentiable(trace, joint.outputs, lowering.compile))
    except TraceVerificationError as e:
        recompiles.warning("%s: the joint program does not run, torch autograd does: %s", trace.name, e)
        return f"the joint program failed verification ({e})"
    plan.name = trace.name
    return Compiled(plan, forward, backward, joint.checkpoint_saved)


def _complex_values_kept_inside(trace: Trace) -> Trace:
    """`trace` with each op whose complex result one op alone reads, making real values of it
    alone (`torch.fft.fftn(x).real`: FNet's token mixing), run as one op with that reader: the
    complex value stays inside it, and torch autograd differentiates the pair (the joint program's
    cotangents are real).  A complex value left on a gradient's path keeps torch autograd for the
    whole function, as FNet's did (0.78x eager, inductor 0.67x).  `trace` itself where nothing
    merges."""
    readers: dict = {}
    for b in trace.bsyms:
        for name in {v.name for v in b.inputs()}:
            readers.setdefault(name, []).append(b)
    returned = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    pairs: dict = {}         # id(reader) -> the pair's op; the complex op itself is dropped
    for b in trace.bsyms:
        z = b.outputs()[0] if len(b.outputs()) == 1 else None
        if not (isinstance(z, TensorVar) and z.dtype.is_complex and z.requires_grad) or z.name in returned \
                or len(readers.get(z.name, ())) != 1:
            continue
        c = readers[z.name][0]
        if c.kwargs or len(c.args) != 1 or c.args[0].name != z.name or \
                any(v.dtype.is_complex for v in c.outputs() if isinstance(v, TensorVar)) or \
                any(s.has(t) for s in (b.sym, c.sym) for t in (Tag.RANDOM, Tag.IMPURE)):
            continue
        first, then = b.sym.fn, c.sym.fn

        def pair(*args, first=first, then=then, **kwargs):
            return then(first(*args, **kwargs))
        sym = Symbol(f"{b.sym.qualname}_then_{c.sym.name}", pair, frozenset({Tag.FALLBACK}))
        pairs[id(c)] = BoundSymbol(sym, b.args, b.kwargs, c.output,
                                   comment=f"{b.sym.qualname} then {c.sym.qualname}: one op, so "
                                           f"its complex value stays inside")
        pairs[id(b)] = None
    if not pairs:
        return trace
    bsyms = [pairs.get(id(b), b) for b in trace.bsyms]
    return trace.with_stage(trace.stage, [b for b in bsyms if b is not None])


def _differentiable(trace: Trace, outputs: list, compile: Callable[[Trace], Callable]) -> Callable:
    """(*leaves) -> the joint's outputs, as torch calls autograd differentiates: what a backward
    under create_graph=True runs (compiled the first time one does)."""
    program: list = []

    def run(*leaves):
        if not program:
            program.append(compile(
                trace.with_stage("differentiable", output=tuple(outputs), rebuild=None)))
        return program[0](*leaves)
    return run


def autograd_stage(forward: Trace, reason: str) -> Trace:
    """What `fjit.last_backward_traces` shows when torch autograd runs the backward: the forward
    program whose torch calls autograd differentiates (each op's own backward, as in eager), with
    the reason in its stage line."""
    return forward.with_stage(f"torch_autograd: torch autograd runs the backward of these torch "
                              f"calls, because {reason}")
