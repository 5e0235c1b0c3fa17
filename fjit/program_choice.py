"""Measured choice between correct forms of a program, kept per compiled program:
- training: the joint program (a compiled forward and a compiled, fused backward), torch autograd
  over the forward's torch calls, and, for a CPU program with 2-D convolutions, torch autograd over
  the same function traced with its convolutions' inputs in channels-last layout (where that form
  is offered, and the margin it must win by, is decided here: offers_channels_last,
  channels_last_margin; fjit/pipeline.py traces it);
- a forward with kernels: the kernels' program or the same program's torch calls alone.

Which one is faster depends on the machine, the model and the sizes: a fused backward saves memory
passes, but runs as a Python program of ATen calls and kernel launches, where autograd's engine
walks its graph in C++, and ATen's own kernels (layer norm's, softmax's, their backwards) are hard
to beat one by one, most of all on tensors that stream from memory.  On this repository's CPU
machines oneDNN's depthwise and grouped convolutions run much faster on channels-last data (an
eager MobileNetV3 step in that layout takes 0.82x the time), where a ResNet's dense ones run slower
(1.04-1.13x).  So, as an autotuner does, a program big enough for the difference to matter
(training: MIN_OPS top-level ops; a forward: MIN_NUMEL input elements; FJIT_MEASURE in
fjit/config.py) runs every form on its second call (or the first after its background kernel
builds are done), on that call's own inputs, ROUNDS times
interleaved after a warm-up (once where a form's first timed run takes over LONG_RUN; CLOSE_ROUNDS
more where the two fastest are within CLOSE), and keeps the fastest
by the minimum time, with margins in favour of eager's kernels (torch autograd's and the
forward's torch calls win ties) and of the layout eager's program has; in training, a form that
saves far fewer bytes for the backward (counted in its warm-up run) is kept where it is nearly as
fast and no slower than eager's way (SAVED_MARGIN, TIME_FOR_MEMORY).  In training each run is a
forward and a backward with cotangents of ones to the inputs that require grad
(torch.autograd.grad: no `.grad` is touched).

Measuring runs the program more than once, so random draws are rewound after each run (the call
itself then draws what eager draws), each run starts from detached copies of the inputs (its
backward never reaches the caller's graph), and it waits for the kernels still building.  It is
skipped where running a backward would be seen: an input with a gradient hook of its own.  The
decision is made once; `fjit.last_traces` and `fjit.last_backward_traces` then show the form that
runs, with every form's timing in its stage line.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import torch
import torch.utils._pytree as pytree

import fjit.config as config
from fjit.config import Measure
from fjit.core.ir import TensorVar
from fjit.core.meta import relaid_channels_last
from fjit.executors import kernels_pending, wait_for_kernels
from fjit.frontend.rng import rng_preserved

MIN_OPS = 32          # top-level ops of the forward trace that make a training program worth it
MIN_NUMEL = 1 << 20   # input elements that make a forward's kernels worth measuring
ROUNDS = 3
CLOSE = 0.05          # forms this close after ROUNDS get CLOSE_ROUNDS more
CLOSE_ROUNDS = 4
LONG_RUN = 0.25       # seconds: forms whose first timed run takes longer get one round
# torch autograd must take less than this fraction of the joint's time: ties go to torch autograd,
# which runs eager's own kernels, so its step is eager's to within the dispatch it saves; a joint
# program must win by more than the second call's three rounds can tell apart (a ResNet-50's joint
# program, 1.04x eager's in a steady run, was kept over torch autograd's at 1.0x)
MARGIN = 1.03
FORWARD_MARGIN = 1.03  # a forward's torch calls, of the kernels' program's: ties go to ATen
# Memory, in training: the form kept by time gives way to the form saving the fewest bytes for the
# backward where that one saves at most 1/SAVED_MARGIN of its bytes and takes at most
# TIME_FOR_MEMORY of its time, and no longer than eager's way (Form.eager_like): memory is not
# bought with a step slower than eager's (torchvision's ConvNeXt kept its joint program at 1.03x
# torch autograd's time for half the bytes, and read 1.05x eager).  Torch autograd over the
# forward's torch calls saves what each call saves (a decomposed attention's scores, each step of
# a layer norm), where the joint program saves its minimum cut (autodiff/remat.py): Twins-SVT's
# torch autograd form saved 1.29x eager's bytes, its joint program 0.82x, and a loaded machine's
# timing had picked the first.
SAVED_MARGIN = 1.5
TIME_FOR_MEMORY = 1.03
# Channels-last convolutions, of the form kept before them: kept only for a large gain.  Every
# other form runs eager's convolutions, so it rounds as eager does where most of a CNN's values
# are made; this one rounds each convolution otherwise, and a value that lands on the other side
# of a ReLU's kink from float64's reroutes a gradient (eager run channels-last, two threads, fails
# the zoo's accuracy rule on SqueezeNet at seed 0, as this form did at 0.87x eager's time).  The
# big wins (depthwise and grouped convolutions: MobileNetV2, EfficientNet, MNASNet, MobileNetV4,
# 0.76-0.81x) stay.
CHANNELS_LAST_MARGIN = 0.85
# ... and for a program with a grouped (or depthwise) convolution, whose gain in that layout is
# oneDNN's kernels' own (its NCHW depthwise kernels are the slow ones), not a rounding's luck:
# EfficientNet-B0's and ConvNeXt's channels-last forms measured 0.92-0.94x the best other, and
# kept 3/3 seeds of the zoo's accuracy rule where SqueezeNet's (dense) failed one.
CHANNELS_LAST_MARGIN_GROUPED = 0.96
# The most convolutions a program with no grouped one may relay for the channels-last form to be
# offered at all: a patch embedding's one (ResMLP 0.79x the best other form, CaiT 0.95x).  A CNN
# of dense convolutions reroutes gradients at ReLU kinks as above, and a speed margin only makes
# that rarer: SqueezeNet's form, forced, fails the accuracy rule at seed 0, and it measured under
# 0.85x in some processes of a zoo sweep and failed there; no other dense CNN of the zoo gained
# 15% from the form (DLA-46 0.96x, DenseNet-121 0.99x, ResNet-50 1.17x, GoogLeNet 1.00x).
CHANNELS_LAST_DENSE_CONVOLUTIONS = 1


def wants_measuring(n_ops: int) -> bool:
    """Whether a training program of `n_ops` top-level ops measures its two forms."""
    mode = config.measure()
    return mode is Measure.ALL or (mode is Measure.AUTO and n_ops >= MIN_OPS)


def wants_measuring_forward(leaves: list) -> bool:
    """Whether a forward program with kernels, called on `leaves`, measures its two forms."""
    mode = config.measure()
    return mode is Measure.ALL or (mode is Measure.AUTO and sum(
        x.numel() for x in leaves if isinstance(x, torch.Tensor)) >= MIN_NUMEL)


def offers_channels_last(bsyms: list) -> bool:
    """Whether a training program of these forward ops is also traced with its 2-D convolutions'
    inputs channels-last, as a form to measure: where it relays a convolution (core/meta.py's
    relaid_channels_last), and no more than CHANNELS_LAST_DENSE_CONVOLUTIONS of them unless one is
    grouped."""
    relaid = sum(_relaid_convolution(b) for b in bsyms)
    return bool(relaid) and (relaid <= CHANNELS_LAST_DENSE_CONVOLUTIONS or _has_grouped_convolution(bsyms))


def channels_last_margin(bsyms: list) -> str:
    """The margin (a module constant's name, as Form.margin) the channels-last form of a program of
    these ops must beat the form kept before it by."""
    return "CHANNELS_LAST_MARGIN_GROUPED" if _has_grouped_convolution(bsyms) else "CHANNELS_LAST_MARGIN"


def _relaid_convolution(b) -> bool:
    """A 2-D convolution whose input the channels-last form would make channels-last."""
    x = b.args[0] if b.args else None
    return b.sym.fn is torch.conv2d and isinstance(x, TensorVar) and relaid_channels_last(x)


def _has_grouped_convolution(bsyms: list) -> bool:
    """Whether a 2-D convolution of more than one group (depthwise included) is among `bsyms`."""
    for b in bsyms:
        if b.sym.fn is torch.conv2d:
            groups = b.kwargs.get("groups", b.args[6] if len(b.args) > 6 else 1)
            if not isinstance(groups, int) or groups > 1:
                return True
    return False


@dataclasses.dataclass
class Form:
    """One correct way to run a program."""
    what: str                  # how a stage line names it ("torch autograd's forward and backward")
    run: Callable              # what a call runs
    timed: Callable            # the same program returning its flat outputs: what measuring runs
    # reason -> (forward stages, backward stages) shown once it is kept, the last of each saying
    # why; None: the compilation's own, as they are
    stages: Callable[[str], tuple[list, list]] | None = None
    margin: str = "MARGIN"     # the module constant it must beat the form kept so far by
    # eager's way (torch autograd over the forward's torch calls: eager's kernels and saves),
    # whose time a form kept for its saved bytes must not exceed
    eager_like: bool = False


class MeasuredChoice:
    """The program a cache keeps: its first form until its second call, which measures every form
    and keeps the fastest from then on.  The forms are tried in order: a later form replaces the
    one kept so far only if it takes less than its margin's fraction of that one's time (a margin
    over 1 lets it win ties)."""

    def __init__(self, forms: list[Form], bsyms: list, forward_traces: list, backward_traces: list,
                 training: bool = True):
        self.forms = forms
        self.run = forms[0].run
        self.training = training
        self.bsyms = bsyms                   # the forward's ops: the generators they draw from
        # the compilation's trace lists, which fjit.last_traces/last_backward_traces show:
        # replaced in place by the kept form's stages
        self.forward_traces, self.backward_traces = forward_traces, backward_traces
        self.calls = 0
        self.decided = False
        self.times: list[float] | None = None
        self.saved: list[int] | None = None       # bytes each form saved for its backward

    def count_call(self) -> None:
        """Count a call toward the second, which measures: each of its own, and the compiling call
        that ran the trace op by op instead (a convolution's program, for its layout check)."""
        self.calls += 1

    def __call__(self, *leaves):
        if not self.decided:
            self.count_call()
            # (not while kernels still build in the background: the second call of a cold cache
            # waited for every one of them, ReXNet's and EfficientNetV2's over a minute on two
            # cores, and a zoo check of three steps ran out of its 300 s; the first form runs
            # meanwhile, its regions as torch calls until their kernels load)
            if self.calls >= 2 and (torch.is_grad_enabled() or not self.training) and not kernels_pending():
                self.decide(leaves)
        return self.run(*leaves)

    def decide(self, leaves) -> None:
        self.decided = True
        wanted = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        if self.training and (not wanted or any(_has_hooks(x) for x in wanted)):
            return
        # The runs start from leaves of their own: their backwards never reach the caller's graph
        # (an input computed under autograd, as a backend piece's are, has history of its own).
        leaves = [x.detach().requires_grad_() if isinstance(x, torch.Tensor) and x.requires_grad
                  else x for x in leaves]
        wanted = [x for x in leaves if isinstance(x, torch.Tensor) and x.requires_grad]
        wait_for_kernels()
        grads = wanted if self.training else []
        sync = _device_sync(leaves)
        with rng_preserved(self.bsyms) as rewind:
            def seconds(program) -> float:
                rewind()
                sync()
                start = time.perf_counter()
                _forward_backward(program, leaves, grads)
                sync()
                return time.perf_counter() - start
            def time_round() -> None:
                for k, form in enumerate(self.forms):
                    best[k] = min(best[k], seconds(form.timed))
            saved = []
            for form in self.forms:            # a warm-up run each, counting what it saves
                with saves_counted(leaves) as count:
                    seconds(form.timed)
                saved.append(count[0])
            best = [float("inf")] * len(self.forms)
            # a big model's step is timed in one round, not made a long second call (judged by
            # the first round, not the warm-up: a program's first run pays one-time costs, and an
            # EfficientNet's 75 ms step, warmed up at 300 ms, was decided on one noisy round);
            # forms within CLOSE of each other get CLOSE_ROUNDS more (RegNet-Y's step read 0.87x
            # and 1.05x eager in two sweeps, by the form each process kept)
            for done in range(1, ROUNDS + 1):
                time_round()
                if max(best) > LONG_RUN:
                    break
            if done == ROUNDS and _close(best):
                for _ in range(CLOSE_ROUNDS):
                    time_round()
        self.times, self.saved = best, saved
        kept = 0
        for k in range(1, len(self.forms)):
            if best[k] < globals()[self.forms[k].margin] * best[kept]:
                kept = k
        why = ""
        least = min(range(len(self.forms)), key=saved.__getitem__)
        if self.training and saved[kept] > SAVED_MARGIN * saved[least] and \
                best[least] <= TIME_FOR_MEMORY * best[kept] and \
                all(best[least] <= t for f, t in zip(self.forms, best) if f.eager_like):
            why = f" (kept for its saved bytes, {saved[least] / 2**20:.3g} MiB against {saved[kept] / 2**20:.3g})"
            kept = least
        forced = config.kept_form()
        if forced is not None and forced < len(self.forms):      # stress testing (zoo.py --stress)
            kept = forced
        form = self.forms[kept]
        self.run = form.run
        if form.stages is not None:
            others = ", ".join(f"{f.what} {t * 1e3:.3g} ms" for f, t in zip(self.forms, best)
                               if f is not form)
            forward, backward = form.stages(
                f"measured on the second call, {form.what} took {best[kept] * 1e3:.3g} ms "
                f"and {others}{why}")
            self.forward_traces[:] = forward
            self.backward_traces[:] = backward


class saves_counted:
    """Counts the bytes a run saves for its backward: the distinct storages packed by
    saved_tensors_hooks (autograd's own saves and an autograd.Function's save_for_backward alike),
    the leaves' own (inputs, parameters) left out.  `with saves_counted(leaves) as count:` then
    count[0].  (benchmarks/zoo.py's memory column counts with it too.)"""

    def __init__(self, leaves):
        self.skip = {x.untyped_storage().data_ptr() for x in leaves if isinstance(x, torch.Tensor)}
        self.sizes: dict[int, int] = {}
        self.count = [0]

    def _pack(self, t):
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):     # a tensor without storage (a subclass)
            return t
        ptr = storage.data_ptr()
        if ptr and ptr not in self.skip:
            self.sizes[ptr] = max(self.sizes.get(ptr, 0), storage.nbytes())
        return t

    def __enter__(self):
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        try:
            self.hooks.__enter__()
        except RuntimeError:      # saved-tensor hooks are disabled here: nothing is counted
            self.hooks = None
        return self.count

    def __exit__(self, *exc):
        if self.hooks is not None:
            self.hooks.__exit__(*exc)
        self.count[0] = sum(self.sizes.values())
        return False


def _close(times: list[float]) -> bool:
    """Whether the two fastest forms' times are within CLOSE of each other."""
    first, second = sorted(times)[:2]
    return second < first * (1 + CLOSE)


def _device_sync(leaves) -> Callable[[], None]:
    """What ends a timed run: a GPU program's launches return before its kernels finish, so
    without a synchronize a run measures the host's launch time alone (a softmax's one ATen launch
    then beat fjit's kernel on an H100 whatever either kernel took)."""
    devices = {x.device for x in leaves if isinstance(x, torch.Tensor) and x.device.type == "cuda"}

    def sync() -> None:
        for device in devices:       # each device the program runs on, not only the current one
            torch.cuda.synchronize(device)
    return sync


def _has_hooks(t: torch.Tensor) -> bool:
    return bool(getattr(t, "_backward_hooks", None) or getattr(t, "_post_accumulate_grad_hooks", None))


def _forward_backward(program: Callable, leaves, wanted: list) -> None:
    out = [t for t in pytree.tree_leaves(program(*leaves))
           if isinstance(t, torch.Tensor) and t.requires_grad]
    if out and wanted:
        torch.autograd.grad(out, wanted, [torch.ones_like(t) for t in out], allow_unused=True)
