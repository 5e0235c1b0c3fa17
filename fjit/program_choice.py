"""Measured choice between a training program's two correct forms: the joint program (a compiled
forward and a compiled, fused backward) and torch autograd over the forward's torch calls.

Which one trains faster depends on the machine and the model: a fused backward saves memory
passes, but it runs as a Python program of ATen calls and kernel launches, where autograd's engine
walks its graph in C++, and ATen's own backward kernels (layer norm's, GELU's) are hard to beat
one by one.  So, as an autotuner does, a program big enough for the difference to matter
(MIN_OPS top-level ops; FJIT_MEASURE in fjit/config.py) runs both on its second call, on that
call's own inputs: each form does a forward and a backward with cotangents of ones to the inputs
that require grad (torch.autograd.grad: no `.grad` is touched), ROUNDS times interleaved, and the
faster by the minimum time is kept, with a margin in the joint program's favour.

Measuring runs the program more than once, so random draws are rewound after each run (the call
itself then draws what eager draws) and it waits for the kernels still building.  It is skipped
where running a backward would be seen: an input with a gradient hook of its own.  The decision
is made once; `fjit.last_traces` and `fjit.last_backward_traces` then show the form that runs,
with the two timings in the stage line of torch autograd's.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.utils._pytree as pytree

import fjit.config as config
from fjit.config import Measure
from fjit.executors import wait_for_kernels
from fjit.frontend.rng import rng_preserved

MIN_OPS = 32          # top-level ops of the forward trace that make a program worth measuring
ROUNDS = 3
MARGIN = 0.97         # torch autograd must take less than this fraction of the joint's time


def wants_measuring(n_ops: int) -> bool:
    mode = config.measure()
    return mode is Measure.ALL or (mode is Measure.AUTO and n_ops >= MIN_OPS)


class MeasuredChoice:
    """The program a cache keeps for a training call: the joint program until its second call,
    which measures both forms and keeps the faster from then on."""

    def __init__(self, joint: Callable, autograd: Callable, timed: tuple[Callable, Callable],
                 bsyms: list, forward_traces: list, backward_traces: list,
                 autograd_traces: Callable[[str], tuple[list, list]]):
        self.run = joint
        self.joint, self.autograd = joint, autograd
        self.timed = timed                   # (joint, autograd) returning flat outputs
        self.bsyms = bsyms                   # the forward's ops: the generators they draw from
        # the compilation's trace lists, which fjit.last_traces/last_backward_traces show:
        # replaced in place by torch autograd's when that form is kept
        self.forward_traces, self.backward_traces = forward_traces, backward_traces
        self.autograd_traces = autograd_traces   # reason -> (forward stages, backward stages)
        self.calls = 0
        self.decided = False
        self.times: tuple[float, float] | None = None

    def __call__(self, *leaves):
        if not self.decided:
            self.calls += 1
            if self.calls >= 2 and torch.is_grad_enabled():
                self.decide(leaves)
        return self.run(*leaves)

    def decide(self, leaves) -> None:
        self.decided = True
        wanted = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        if not wanted or any(_has_hooks(x) for x in wanted):
            return
        wait_for_kernels()
        best = [float("inf"), float("inf")]
        with rng_preserved(self.bsyms) as rewind:
            for r in range(ROUNDS + 1):            # round 0 warms both up
                for k, program in enumerate(self.timed):
                    rewind()
                    start = time.perf_counter()
                    _forward_backward(program, leaves, wanted)
                    if r:
                        best[k] = min(best[k], time.perf_counter() - start)
        self.times = (best[0], best[1])
        if best[1] < MARGIN * best[0]:
            self.run = self.autograd
            forward, backward = self.autograd_traces(
                f"measured on the second call, torch autograd's forward and backward took "
                f"{best[1] * 1e3:.3g} ms and the compiled joint program's {best[0] * 1e3:.3g} ms")
            self.forward_traces[:] = forward
            self.backward_traces[:] = backward


def _has_hooks(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_backward_hooks", None) or getattr(t, "_post_accumulate_grad_hooks", None))


def _forward_backward(program: Callable, leaves, wanted: list) -> None:
    out = [t for t in pytree.tree_leaves(program(*leaves))
           if isinstance(t, torch.Tensor) and t.requires_grad]
    if out:
        torch.autograd.grad(out, wanted, [torch.ones_like(t) for t in out], allow_unused=True)
