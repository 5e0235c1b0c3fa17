"""The compiled backward: per-prim VJP rules (rules.py), the joint forward/backward program split
into two traces (joint.py), and the autograd.Function that runs them (function.py).

`compile_with_backward` is what fjit.jit calls when an input requires grad under grad mode.  It
returns the reason, a string, when torch autograd over the forward program is the better program
(no op would be fused, a grad-mode region inside the function, ...); the caller then compiles as
before and `autograd_stage` is what `fjit.last_backward_traces` shows.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from fjit.autodiff.function import Plan, list_callable
from fjit.autodiff.joint import build, differentiable
from fjit.autodiff.rules import NONDIFF, VJP, has_rule
from fjit.core.ir import BoundSymbol, Tag, TensorVar, Trace
from fjit.executors import Executor, kernel_executor, torch_executor
from fjit.executors.c.codegen import calls_libm, supported

__all__ = ["compile_with_backward", "autograd_stage", "Compiled", "VJP", "NONDIFF", "has_rule"]


@dataclasses.dataclass
class Compiled:
    program: Callable            # (*leaves) -> the caller's result, joined to autograd
    forward_traces: list
    backward_traces: list


def wants_backward(trace: Trace) -> bool:
    return torch.is_grad_enabled() and any(differentiable(v) for v in trace.inputs)


def compile_with_backward(trace: Trace, leaves: list, executors: tuple,
                          lower: Callable[[Trace, bool], list]) -> Compiled | str | None:
    """`trace` is the cleaned forward; `lower(trace, cleanup)` runs the passes (when cleanup) and
    the executors on a trace and returns its stages.  None: there is no backward to build (no
    input requires grad under grad mode); a string: why torch autograd runs the backward."""
    if not wants_backward(trace):
        return None
    policy = _fusion_policy(trace, executors)
    if policy is None:
        return "no kernel executor in this function's executors fuses on its device"
    joint = build(trace, leaves, policy)
    if isinstance(joint, str):
        return joint
    with torch.no_grad():     # as inside autograd.Function: the kernel executors may claim
        forward = lower(joint.forward, False)
        backward = lower(joint.backward, True)
    plan = Plan(joint, torch_executor.compile_trace(forward[-1]), list_callable(backward[-1]),
                trace.output, trace.rebuild, _differentiable(trace, joint.outputs))
    plan.name = trace.name
    return Compiled(plan, forward, backward)


def _differentiable(trace: Trace, outputs: list) -> Callable:
    """(*leaves) -> the joint's outputs, as torch calls autograd differentiates: what a backward
    under create_graph=True runs (compiled the first time one does)."""
    program: list = []

    def run(*leaves):
        if not program:
            program.append(torch_executor.compile_trace(
                trace.with_stage("differentiable", output=tuple(outputs), rebuild=None)))
        return program[0](*leaves)
    return run


def autograd_stage(forward: Trace, reason: str) -> Trace:
    """What `fjit.last_backward_traces` shows when torch autograd runs the backward: the forward
    program whose torch calls autograd differentiates (each op's own backward, as in eager), with
    the reason in its stage line."""
    return forward.with_stage(f"torch_autograd: torch autograd runs the backward of these torch "
                              f"calls, because {reason}")


# -- which ops are differentiated through their prims -------------------------------------------

def _fusion_policy(trace: Trace, executors: tuple) -> Callable[[BoundSymbol], bool] | None:
    """decompose(op, fused=False): whether an op is differentiated through its prims (with
    fused=True: whether they go into kernels here).  An op
    with several fusible prims that would not be fused (big CPU tensors) keeps torch autograd:
    torch's own backward kernel (gelu_backward, softmax_backward) beats its prims one call each.
    None: no executor fuses anything on this device."""
    devices = {v.device for v in trace.inputs if isinstance(v, TensorVar)}
    if len(devices) != 1:
        return None
    device = devices.pop()
    for option in executors:
        module = kernel_executor(option)
        if module is None:
            continue
        if option is Executor.TRITON and (device.type == "cuda" or
                                          device.type == "cpu" and module.interpreting()):
            return lambda b, fused=False: len(b.subsymbols or (b,)) if fused else True
        if option is Executor.C and device.type == "cpu" and module.mode() != "off" \
                and module.compiler() is not None:
            return _c_policy(module)
    return None


def _c_policy(module):
    def small(s: BoundSymbol) -> bool:
        limit = module.MAX_NUMEL_LIBM if calls_libm(s) else module.MAX_NUMEL
        return supported(s) and all(math.prod(v.shape) <= limit
                                    for v in s.inputs() + s.outputs() if isinstance(v, TensorVar))

    def decompose(b: BoundSymbol, fused: bool = False):
        """fused=False: whether to differentiate b through its prims (a single pointwise prim
        costs what eager's backward does even unfused).  fused=True: how many of its pointwise
        and reduction prims go into C kernels (0 unless the executor splits the op: all of its
        prims are small and supported)."""
        prims = b.subsymbols or (b,)
        work = [s for s in prims if s.sym.has(Tag.ELEMENTWISE) or s.sym.has(Tag.REDUCTION)]
        if fused:
            return len(work) if all(small(s) for s in prims) else 0
        return len(work) <= 1 or all(small(s) for s in work)
    return decompose
