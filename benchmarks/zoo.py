"""The model zoo runner: real architectures (benchmarks/zoo_models.py) trained for a few steps through
fjit's two entry points, judged for accuracy as PyTorch's compiler dashboard judges torch.compile,
and optionally timed against eager and Inductor.

    python benchmarks/zoo.py                                  # every model, both entry points
    python benchmarks/zoo.py --models hf_llama_gqa timm_resnet10t --entry jit
    python benchmarks/zoo.py --timing --rounds 10             # also time the training step
    python benchmarks/zoo.py --memory --first-call            # bytes saved for the backward, first call
    python benchmarks/zoo.py --markdown docs/zoo.md --json benchmarks/results/zoo.json
    python benchmarks/zoo.py --sync-kernels                   # FJIT_C_KERNELS=sync before fjit is imported
    python benchmarks/zoo.py --device cuda --timing           # on a GPU: fjit's Triton kernels

Entry points (``--entry``): ``jit`` is ``fjit.jit(model)``, ``backend`` is
``torch.compile(model, backend="fjit")``; ``inductor`` (``torch.compile(model)``), ``eager`` (the
model itself: a check of the checker, which must pass) and ``eager1t`` (the eager model run with
``torch.set_num_threads(1)``: another summation order and nothing else, so it measures how often the
rule below fails a model whose arithmetic is as good as eager's) can be asked for too.  ``torch._dynamo.reset()`` runs before
every model and entry.

Accuracy (`check_accuracy`).  Three copies of the same initial weights: the eager model in float32
(the reference), the eager model in float64 (the "fp64 golden") and the compiled float32 one.  Each
runs ``--steps`` training steps (train mode: forward, loss, backward, then an optimizer step with
the same hyper-parameters: ``--optimizer``, SGD by default, see below) on the same inputs (cast to float64 for the golden; integer token ids, masks
and labels unchanged), the RNG seeded alike before each copy's step; then one eval-mode forward under
no_grad.  Compared at every step: the loss, every floating output tensor and every parameter's
gradient (a gradient that is None in one copy and not in the other fails); after the steps every
parameter and buffer; then the eval outputs.  A compiled tensor ``x`` passes, as in
``torch._dynamo.utils.same(ref, res, fp64_ref, use_larger_multiplier_for_smaller_tensor=True)``
with its default ``tol=1e-4``, if

  - it has the reference's shape and dtype (non-floating tensors must be equal), and
  - ``torch.allclose(x, ref32, rtol=1e-4, atol=1e-4)``, or else
  - ``err(x) <= m * err(ref32) + 1e-5``, where ``err(y) = RMS(y - golden)`` (root mean square of the
    difference from the float64 value) and the multiplier ``m`` is 2 for tensors of 1000+ elements,
    3 below 1000, 8 at 500 or fewer and 10 at 10 or fewer (small tensors have noisier errors).

That is: the compiled model may differ from eager float32, but not be more than about twice as far
from the float64 truth as eager float32 itself is.  The first failing tensor (in the order compared)
is reported with both errors, with the number of tensors that failed at that stage and the worst one
(largest ``err(x) / threshold``).  Comparison stops at the first stage with a failure.

Why SGD (lr 0.01, momentum 0.9) and not AdamW (``--optimizer adamw``: lr 1e-3, weight decay 0.01):
Adam divides each gradient element by its own magnitude, so its first updates are about
``lr * sign(grad)``, and a gradient element that is zero up to rounding (the channel mean of the
gradient behind a BatchNorm, for one) gets a full ``lr`` step whose sign is the rounding's.  Which
elements flip differs between any two float32 computations, so after a step or two the compiled
model can be several times further from the golden than eager float32 with arithmetic that is just
as good: eager float32 on one thread instead of two (another summation order) fails the rule on
several CNNs with AdamW, none with SGD.  SGD keeps each step linear in the gradient.  For the same
reason the CNNs of the registry run 8 images of 64x64: BatchNorm over a handful of values amplifies
rounding as much.

Autocast (``--autocast bf16``, or ``fp16``): every copy's forward and loss run under
``torch.autocast(device, dtype=...)``, as users write a mixed-precision step (the backward and the
optimizer step outside it), the eval forward too.  The golden runs under it as well, which leaves
float64 alone, so it stays the float64 truth; the reference is eager under autocast, so the
yardstick above becomes eager's own error under autocast: the compiled model may be about twice as
far from float64 as eager autocast is.

Statuses: ``pass``; ``unstable`` (it failed the rule, and so did a rounding control in the same
setting: eager's own math rounded otherwise, ``eager_cl`` or ``eager_xt``, see CONTROLS);
``fail_accuracy``; ``error`` (any exception of the compiled model: its type and
the first line of its message; an fjit error, a subclass of ``fjit.FjitError``, names its code, e.g.
FJ106; an error raised through Dynamo is reported by its inner exception); ``timeout`` (``--timeout``
seconds per model and entry, by SIGALRM); ``eager_error`` (the eager reference itself failed: a
registry bug).  No failure stops the run; ``--isolate`` also runs each model in its own process, so
that a crash (a segfault in a generated kernel) costs one model.

Timing (``--timing``): one training step without the optimizer (forward, loss, backward, grads set
to None first) of eager, fjit.jit, backend="fjit" and torch.compile (Inductor, default mode; ``--timed`` picks fewer),
each on its own copy of the model, measured as the other suites measure (benchmarks/harness.py): after a
compile call and 3 warm-up calls (and fjit's background C kernel builds), in ``--rounds``
interleaved rounds, each candidate sampled once per round in a rotated order (a sample is as many
steps as take ``SAMPLE_NS``, 100 ms, of eager); the ratios are paired
(median over rounds of candidate / eager of the same round; below 1 is faster than eager).  A
candidate that raises is not timed.  The geometric mean of each entry's ratios is taken over the
models it ran, and says over how many.

Memory (``--memory``, with or without ``--timing``): the bytes each of eager and the ``--timed``
candidates saves for the backward in one such training step, run after the warm-up calls and the
kernel builds (so the form a program keeps): the distinct storages packed by
``torch.autograd.graph.saved_tensors_hooks`` (`saved_bytes`), each counted once at its storage's
``nbytes`` (a view holds its whole storage), the model's parameters and views of them left out
(they are not activations); the inputs a step saves count, alike for every candidate.  The hooks
see eager autograd's saved tensors and an autograd.Function's ``ctx.save_for_backward``, through
which fjit's joint program and Inductor's compiled graphs save theirs.  Reported per model as a
ratio to eager's bytes (below 1 saves less), eager's own in MB, and each entry's geometric mean.
Peak RSS is not reported: one process runs eager, every candidate and the accuracy copies, and its
peak is the largest of them all, never lowered; a per-entry number would need a process per model
and entry with nothing else in it.

First call (``--first-call``): the wall time of fjit.jit's and Inductor's first training step (as
timed above; those of the two in ``--timed``), each in a fresh interpreter with empty fjit,
Inductor and Triton kernel caches (harness.run_in_fresh_process), so nothing of an earlier compile
in memory or on disk helps it: trace, compile and every kernel build, including the C kernels fjit
builds in the background after the step returns (the wait for them is added; with
``--sync-kernels`` they are built inside the step).  Before the clock, both compilers' modules are
imported and one eager step runs, so the time is the model's and not the process's start.  The
JSON row's ``first_call.probes`` splits it (step, background builds) and adds the second step
(where fjit's measured choice times its other forms).  Reported in seconds per model, and in the
summary as the geometric mean over models of fjit.jit / Inductor.  Each probe costs a process
start and both compiles, which is why it is a flag.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch.utils._pytree as pytree  # noqa: E402

from benchmarks.zoo_models import MODELS, Batch, ZooModel, ragged_batches  # noqa: E402

ENTRIES = ("jit", "backend", "inductor", "eager", "eager1t", "eager_cl", "eager_xt")
DEVICE = "cpu"              # --device: where models, inputs and every copy run
ENTRY_LABELS = {"jit": "fjit.jit", "backend": "backend=fjit", "inductor": "inductor", "eager": "eager",
                "eager1t": "eager 1 thread", "eager_cl": "eager channels-last",
                "eager_xt": "eager other threads"}
# The rounding controls of --stress: eager's own math rounded otherwise (its weights and
# convolutions in channels-last layout; another thread count than the process's).  Where one of
# them fails the accuracy rule too, the model's trajectory is unstable under the rule in that case
# (a value rounds across a ReLU's kink, and float64 does not), and a failure there says nothing of
# the compiled entry's arithmetic.
CONTROLS = ("eager_cl", "eager_xt")
TOL = 1e-4                  # torch._dynamo.utils.same's default tol
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}     # --autocast
OPTIMIZERS: dict[str, Callable[[Any], torch.optim.Optimizer]] = {
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01),
    "sgd": lambda params: torch.optim.SGD(params, lr=1e-2, momentum=0.9),
}


def compile_entry(entry: str, model: torch.nn.Module) -> torch.nn.Module:
    if entry == "jit":
        import fjit
        return fjit.jit(model)
    if entry == "backend":
        return torch.compile(model, backend="fjit")     # the torch_dynamo_backends entry point
    if entry == "inductor":
        return torch.compile(model)
    if entry == "eager_cl":
        return model.to(memory_format=torch.channels_last)
    if entry in ("eager", "eager1t", "eager_xt"):
        return model
    raise ValueError(f"unknown entry {entry!r}: one of {', '.join(ENTRIES)}")


def autocast_region(dtype: torch.dtype | None):
    """Where a step's forward and loss run: under autocast to `dtype` on the zoo's device, as a
    user's mixed-precision step runs them, or as they are (None)."""
    return contextlib.nullcontext() if dtype is None else torch.autocast(DEVICE, dtype=dtype)


# -------------------------------------------------------------------------------------------------
# comparison


def multiplier(numel: int) -> float:
    """torch._dynamo.utils.same's multiplier with use_larger_multiplier_for_smaller_tensor."""
    if numel <= 10:
        return 10.0
    if numel <= 500:
        return 8.0
    if numel < 1000:
        return 3.0
    return 2.0


def rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.sqrt(torch.mean(torch.square(a.double() - b.double()))).item()


@dataclasses.dataclass
class Mismatch:
    tensor: str
    err: float | None = None          # RMS(compiled - golden)
    err_eager: float | None = None    # RMS(eager32 - golden)
    threshold: float | None = None
    why: str = ""                     # for a structural mismatch (shape, dtype, None gradient)

    @property
    def badness(self) -> float:
        if self.err is None or self.threshold is None:
            return math.inf
        if math.isnan(self.err):
            return math.inf
        return self.err / self.threshold if self.threshold > 0 else math.inf

    def describe(self) -> str:
        if self.why:
            return f"{self.tensor}: {self.why}"
        return f"{self.tensor}: err {self.err:.3g} > {self.threshold:.3g} (eager32 err {self.err_eager:.3g})"


def compare_tensor(name: str, res: Any, ref: Any, golden: Any) -> Mismatch | None:
    if res is None or ref is None:
        if res is None and ref is None:
            return None
        return Mismatch(name, why=f"{'compiled' if res is None else 'eager'} is None, the other is not")
    if not isinstance(res, torch.Tensor) or not isinstance(ref, torch.Tensor):
        return None if res == ref else Mismatch(name, why=f"{res!r} != {ref!r}")
    if res.shape != ref.shape:
        return Mismatch(name, why=f"shape {tuple(res.shape)} != eager's {tuple(ref.shape)}")
    if res.dtype != ref.dtype:
        return Mismatch(name, why=f"dtype {res.dtype} != eager's {ref.dtype}")
    res, ref = res.detach(), ref.detach()
    if not ref.is_floating_point() and not ref.is_complex():
        return None if torch.equal(res, ref) else Mismatch(name, why="integer values differ")
    if torch.allclose(res, ref, rtol=TOL, atol=TOL, equal_nan=True):
        return None
    golden = golden.detach().double()
    err, err_eager = rms(res, golden), rms(ref, golden)
    threshold = multiplier(golden.numel()) * err_eager + TOL / 10
    if err <= threshold:          # False for a NaN on either side
        return None
    return Mismatch(name, err, err_eager, threshold)


def named_tensors(out: Any, prefix: str) -> dict[str, Any]:
    leaves, _ = pytree.tree_flatten_with_path(out)
    return {prefix + pytree.keystr(path): leaf for path, leaf in leaves
            if isinstance(leaf, torch.Tensor) and leaf.is_floating_point()}


class AccuracyFailure(Exception):
    def __init__(self, stage: str, mismatches: list[Mismatch]):
        self.stage = stage
        self.mismatches = mismatches
        super().__init__(f"{stage}: {mismatches[0].describe()}")


def compare_stage(stage: str, res: dict, ref: dict, golden: dict) -> None:
    if set(res) != set(ref):
        diff = sorted(set(res) ^ set(ref))
        raise AccuracyFailure(stage, [Mismatch(diff[0], why=f"present in only one of compiled/eager ({len(diff)} such)")])
    mismatches = [m for k in ref if (m := compare_tensor(k, res[k], ref[k], golden[k])) is not None]
    if mismatches:
        raise AccuracyFailure(stage, mismatches)


# -------------------------------------------------------------------------------------------------
# the accuracy check


class ReferenceError_(Exception):
    """The eager reference (float32 or float64) raised: the registry's fault, not the compiler's."""


class ZooTimeout(BaseException):
    """Raised by SIGALRM: a BaseException, so no `except Exception` in compiled code swallows it."""


@dataclasses.dataclass
class Result:
    model: str
    entry: str
    status: str                       # pass | fail_accuracy | error | timeout | eager_error
    reason: str = ""                  # one line: the failing tensor and errors, or the exception
    stage: str = ""                   # where: "step 1", "params after 3 steps", "eval"...
    tensor: str = ""                  # the first failing tensor
    err: float | None = None
    err_eager: float | None = None
    worst: str = ""                   # the worst failing tensor of that stage
    n_failing: int = 0
    error_type: str = ""
    fjit_code: str = ""
    where: str = ""                   # the innermost fjit frame of an exception
    seconds: float = 0.0

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@contextlib.contextmanager
def _threads(n: int | None):
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class _Copy:
    """One of the three copies: its module (the one called, maybe compiled), the module holding
    its parameters, its optimizer, its dtype and the autocast dtype its forward runs under."""

    def __init__(self, module: torch.nn.Module, call: torch.nn.Module | None, dtype: torch.dtype,
                 optimizer: str, threads: int | None = None, autocast: torch.dtype | None = None):
        self.module, self.call, self.dtype = module, call if call is not None else module, dtype
        self.opt = OPTIMIZERS[optimizer](module.parameters())
        self.threads, self.autocast = threads, autocast

    def train_step(self, zm: ZooModel, batch: Batch, seed: int) -> dict[str, Any]:
        with _threads(self.threads):
            return self._train_step(zm, batch, seed)

    def _train_step(self, zm: ZooModel, batch: Batch, seed: int) -> dict[str, Any]:
        b = batch.to(self.dtype)
        torch.manual_seed(seed)
        with autocast_region(self.autocast):
            out = self.call(*b.args, **b.kwargs)
            loss = zm.loss(out, b)
        loss.backward()
        tensors = {"loss": loss.detach(), **named_tensors(out, "out")}
        tensors.update({f"grad:{n}": (p.grad.detach().clone() if p.grad is not None else None)
                        for n, p in self.module.named_parameters()})
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return tensors

    def state(self) -> dict[str, Any]:
        return {**{f"param:{n}": p.detach() for n, p in self.module.named_parameters()},
                **{f"buffer:{n}": b for n, b in self.module.named_buffers()}}

    def eval_forward(self, batch: Batch, seed: int) -> dict[str, Any]:
        with _threads(self.threads):
            return self._eval_forward(batch, seed)

    def _eval_forward(self, batch: Batch, seed: int) -> dict[str, Any]:
        b = batch.to(self.dtype)
        self.call.eval()
        torch.manual_seed(seed)
        with torch.no_grad(), autocast_region(self.autocast):
            out = self.call(*b.args, **b.kwargs)
        return named_tensors(out, "eval out")


def _reference(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except ZooTimeout:
        raise
    except Exception as exc:
        raise ReferenceError_(describe_exception(exc)[0]) from exc


def check_accuracy(zm: ZooModel, entry: str, steps: int = 3, seed: int = 0, optimizer: str = "sgd",
                   autocast: torch.dtype | None = None) -> Result:
    """Train ``zm`` for ``steps`` steps eager float32, eager float64 and compiled by ``entry``, each
    under autocast to ``autocast`` if given, and compare (see the module docstring).  Raises
    nothing but ZooTimeout: every failure is a Result."""
    t0 = time.perf_counter()
    result = Result(zm.name, entry, "pass")
    torch._dynamo.reset()
    stage = "setup"
    try:
        base = zm.make(seed).to(DEVICE)
        batch = zm.example(seed).to(device=DEVICE)
        # one batch per step: the example's, or under the "shapes" stress case a shape per step
        batches = [batch] * steps
        if os.environ.get("FJIT_ZOO_SHAPES") == "ragged":
            batches = ragged_batches(batch)
            steps, batch = len(batches), batches[1]      # eval on a batch of another shape
        ref = _Copy(copy.deepcopy(base), None, torch.float32, optimizer, autocast=autocast)
        gold = _Copy(_reference(lambda: copy.deepcopy(base).double()), None, torch.float64, optimizer,
                     autocast=autocast)
        cand_module = copy.deepcopy(base)
        cand = _Copy(cand_module, compile_entry(entry, cand_module), torch.float32, optimizer,
                     threads=1 if entry == "eager1t" else
                     (2 if torch.get_num_threads() == 1 else 1) if entry == "eager_xt" else None,
                     autocast=autocast)
        for step in range(steps):
            stage = f"step {step + 1}"
            r = _reference(lambda: ref.train_step(zm, batches[step], seed + step))
            g = _reference(lambda: gold.train_step(zm, batches[step], seed + step))
            c = cand.train_step(zm, batches[step], seed + step)
            compare_stage(stage, c, r, g)
        stage = f"params and buffers after {steps} steps"
        compare_stage(stage, cand.state(), ref.state(), gold.state())
        stage = "eval"
        r = _reference(lambda: ref.eval_forward(batch, seed + steps))
        g = _reference(lambda: gold.eval_forward(batch, seed + steps))
        compare_stage(stage, cand.eval_forward(batch, seed + steps), r, g)
    except AccuracyFailure as fail:
        first = fail.mismatches[0]
        worst = max(fail.mismatches, key=lambda m: m.badness)
        result.status = "fail_accuracy"
        result.stage, result.tensor, result.err, result.err_eager = fail.stage, first.tensor, first.err, first.err_eager
        result.n_failing = len(fail.mismatches)
        result.worst = worst.describe()
        more = f" (+{len(fail.mismatches) - 1} more; worst {worst.describe()})" if len(fail.mismatches) > 1 else ""
        result.reason = f"{fail.stage}: {first.describe()}{more}"
    except ReferenceError_ as exc:
        result.status, result.reason, result.stage = "eager_error", f"{stage}: eager reference: {exc}", stage
    except ZooTimeout:
        raise
    except Exception as exc:  # noqa: BLE001 - a failing model is a result, not a crash
        reason, error_type, code, where = describe_exception(exc)
        result.status, result.reason, result.error_type, result.fjit_code, result.where = (
            "error", f"{stage}: {reason}", error_type, code, where)
        result.stage = stage
    finally:
        result.seconds = time.perf_counter() - t0
    return result


# -------------------------------------------------------------------------------------------------
# errors


def _innermost(exc: BaseException) -> BaseException:
    """The exception that says what went wrong: Dynamo wraps a backend's error
    (BackendCompilerFailed.inner_exception) and chains others (__cause__)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "inner_exception", None)
        if isinstance(inner, BaseException):
            exc = inner
            continue
        if type(exc).__module__.startswith("torch._dynamo") and exc.__cause__ is not None:
            exc = exc.__cause__
            continue
        break
    return exc


def _first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return ""


def describe_exception(exc: BaseException) -> tuple[str, str, str, str]:
    """(one-line reason, exception type, fjit error code or "", innermost fjit frame or "")."""
    inner = _innermost(exc)
    names = [type(exc).__name__] + ([type(inner).__name__] if inner is not exc else [])
    error_type = " > ".join(names)
    line = _first_line(inner)
    codes = re.findall(r"\bFJ\d{3}\b", str(inner)) or re.findall(r"\bFJ\d{3}\b", str(exc))
    code = getattr(inner, "code", None)
    code = code if isinstance(code, str) and re.fullmatch(r"FJ\d{3}", code) else (codes[0] if codes else "")
    where = ""
    fjit_dir = str(ROOT / "fjit") + os.sep
    for frame in traceback.extract_tb(inner.__traceback__):
        if frame.filename.startswith(fjit_dir):
            where = f"{os.path.relpath(frame.filename, ROOT)}:{frame.lineno}"
    reason = f"{error_type}: {line}"[:300]
    if code and code not in reason:
        reason += f" [{code}]"
    return reason, error_type, code, where


# -------------------------------------------------------------------------------------------------
# timing


def _train_thunk(module: torch.nn.Module, call: torch.nn.Module, zm: ZooModel, batch: Batch,
                 autocast: torch.dtype | None):
    def step():
        module.zero_grad(set_to_none=True)
        with autocast_region(autocast):
            loss = zm.loss(call(*batch.args, **batch.kwargs), batch)
        loss.backward()
    return step


def saved_bytes(step: Callable[[], Any], exclude: Any = ()) -> int:
    """Bytes saved for the backward while ``step`` runs (a forward and its backward): the distinct
    storages packed by ``torch.autograd.graph.saved_tensors_hooks``, each counted once (by its
    ``untyped_storage().data_ptr()``, at its ``nbytes``), less those of the tensors in ``exclude``
    (the model's parameters, and views of them such as a transposed weight, are not activations).
    Every saved tensor goes through the hooks: eager autograd's, an autograd.Function's
    ``ctx.save_for_backward`` (fjit's joint program, Inductor's compiled graphs).  A saved tensor is
    held until the backward, so no two storages packed in one forward share an address."""
    from fjit.program_choice import saves_counted
    with saves_counted(list(exclude)) as count:
        step()
    return count[0]


TIMED = ("jit", "backend", "inductor")
# How long one sample of a candidate lasts (in eager's time; 1000 steps at most).  At 20 ms, most
# models' samples were one step each, and a model's paired ratio moved by several percent between
# runs of the same code; several steps per sample average that step-to-step noise out.
SAMPLE_NS = 100e6


def time_model(zm: ZooModel, rounds: int, seed: int = 0, timed: tuple = TIMED,
               autocast: torch.dtype | None = None, timing: bool = True, memory: bool = False) -> dict:
    """Paired ratios candidate/eager of the training step (no optimizer), see the docstring; with
    ``memory``, each candidate's saved bytes (`saved_bytes`) and their ratios to eager's; with
    ``timing`` False, the candidates are compiled and measured but not timed."""
    from benchmarks import harness as H
    torch._dynamo.reset()
    base = zm.make(seed).to(DEVICE)
    batch = zm.example(seed).to(device=DEVICE)
    candidates, errors, compiled, modules = {}, {}, {}, {}
    for entry in ("eager", *timed):
        module = copy.deepcopy(base)
        try:
            compiled[entry] = compile_entry(entry, module)
            thunk = _train_thunk(module, compiled[entry], zm, batch, autocast)
            thunk()           # compile (forward and backward)
            thunk()
        except ZooTimeout:
            raise
        except Exception as exc:  # noqa: BLE001 - a failing candidate is not timed
            errors[entry] = describe_exception(exc)[0]
            continue
        candidates[entry], modules[entry] = thunk, module
    try:
        from fjit.executors.c import executor as c_executor
        c_executor.wait()
    except (ImportError, AttributeError):
        pass
    if "eager" not in candidates:
        return {"errors": errors}
    out: dict = {"errors": errors}
    if memory:
        # After the warm-up calls and the kernel builds: the form each candidate keeps.  fjit
        # measures its forms on the first call after its builds are done, which would be the
        # counted call where the builds outlast the warm-up calls (a loaded machine): one more
        # call each, so that the count sees the kept form, not every form run in turn.
        for thunk in candidates.values():
            thunk()
        out["saved_bytes"] = {}
        for entry, thunk in list(candidates.items()):
            try:
                out["saved_bytes"][entry] = saved_bytes(thunk, modules[entry].parameters())
            except ZooTimeout:
                raise
            except Exception as exc:  # noqa: BLE001
                errors[entry] = describe_exception(exc)[0]
                del candidates[entry]
        eager_saved = out["saved_bytes"].get("eager")
        out["saved_ratios"] = {e: (b / eager_saved if eager_saved else None)
                               for e, b in out["saved_bytes"].items() if e != "eager"}
    if not timing or "eager" not in candidates:
        return out
    timer = H.CpuTimer(cuda_sync=DEVICE == "cuda")
    iters = H.calibrate_iters(candidates["eager"], timer, target_ns=SAMPLE_NS, max_iters=1000)
    stats = H.measure(candidates, timer, rounds=rounds, iters=iters, warmup=3)
    out.update({"iters": iters, "eager_ms": stats["eager"].median_ns / 1e6,
                "ratios": {e: H.paired_ratio(stats, e, "eager") for e in candidates if e != "eager"},
                "stats": {e: s.to_json() for e, s in stats.items()},
                "kept": kept_form(compiled["jit"]) if "jit" in candidates else None})
    return out


# The first call of a compiled model, each in a fresh interpreter (first_call): what the first
# training step costs a user, with nothing in memory or on disk from an earlier compile.
FIRST_CALLED = ("jit", "inductor")


def first_call_probe(name: str, entry: str, autocast: str | None = None, seed: int = 0,
                     pin: bool = True) -> dict:
    """In this (fresh) process: the wall time of ``entry``'s first training step of model ``name``
    (trace, compile, the kernels it builds before it returns), then how long the C kernels it left
    building in the background take to land (fjit's default FJIT_C_KERNELS=background; 0 with
    --sync-kernels and for Inductor, which builds its kernels inside the step), then its second
    step.  Before the clock: the compilers' modules imported and one eager step run (ATen's own
    first-call costs), so the time is the model's compile and nothing of the process's."""
    import fjit  # noqa: F401
    import torch._inductor.compile_fx  # torch.compile imports it on its first call; not timed
    from benchmarks import harness as H
    if pin:
        H.pin_allocator()
    if os.environ.get("FJIT_ZOO_THREADS"):       # a stress case's process, as main sets it
        torch.set_num_threads(int(os.environ["FJIT_ZOO_THREADS"]))
    zm = MODELS[name]
    dtype = AUTOCAST_DTYPES.get(autocast) if autocast else None
    sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
    base = zm.make(seed).to(DEVICE)
    batch = zm.example(seed).to(device=DEVICE)
    warm = copy.deepcopy(base)
    _train_thunk(warm, warm, zm, batch, dtype)()
    del warm
    module = copy.deepcopy(base)
    thunk = _train_thunk(module, compile_entry(entry, module), zm, batch, dtype)
    first = H.time_once_ns(thunk, sync) / 1e9
    t0 = time.perf_counter()
    if entry in ("jit", "backend"):
        try:
            from fjit.executors.c import executor as c_executor
            c_executor.wait()
        except (ImportError, AttributeError):
            pass
    builds = time.perf_counter() - t0
    second = H.time_once_ns(thunk, sync) / 1e9
    return {"first_s": first + builds, "step_s": first, "builds_s": builds, "second_s": second}


def first_call(name: str, entries: tuple = FIRST_CALLED, autocast: str | None = None,
               timeout: int = 600, pin: bool = True) -> dict:
    """first_call_probe of each entry, each in a fresh interpreter with fresh kernel caches
    (harness.run_in_fresh_process): {"seconds": {entry: first_s}, "probes": {entry: probe},
    "errors": {entry: why}}."""
    from benchmarks import harness as H
    out: dict = {"seconds": {}, "probes": {}, "errors": {}}
    for entry in entries:
        source = ("import json, sys\nfrom benchmarks import zoo\n"
                  f"zoo.DEVICE = {DEVICE!r}\n"
                  f"print(json.dumps(zoo.first_call_probe({name!r}, {entry!r}, {autocast!r}, pin={pin!r})))")
        try:
            probe = H.run_in_fresh_process(source, timeout_s=timeout or 600)
        except subprocess.TimeoutExpired:
            probe = {"error": f"over {timeout or 600} s"}
        if "error" in probe:
            out["errors"][entry] = probe["error"]
            continue
        out["probes"][entry], out["seconds"][entry] = probe, probe["first_s"]
    return out


def kept_form(compiled) -> str | None:
    """The stage line of the form a `fjit.jit` model's training program runs (its measured
    choice's: the joint program, torch autograd's or the channels-last form, with every form's
    time on its second call): a model whose ratio moves between runs may have kept another form."""
    import fjit
    traces = fjit.last_backward_traces(compiled)
    return traces[-1].stage if traces else None


# -------------------------------------------------------------------------------------------------
# the run


def _with_timeout(seconds: int, fn: Callable[[], Any]) -> Any:
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        return fn()

    def on_alarm(signum, frame):
        raise ZooTimeout()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        return fn()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_model(name: str, entries: list[str], steps: int, timeout: int, timing: bool, rounds: int,
              optimizer: str = "sgd", timed: tuple = TIMED, autocast: torch.dtype | None = None,
              memory: bool = False, first_calls: bool = False, pin: bool = True) -> dict:
    zm = MODELS[name]
    row: dict = {"model": name, "source": zm.source, "note": zm.note, "results": {}}
    for entry in entries:
        t0 = time.perf_counter()
        try:
            res = _with_timeout(timeout, lambda: check_accuracy(
                zm, entry, steps, optimizer=optimizer, autocast=autocast))
        except ZooTimeout:
            res = Result(name, entry, "timeout", reason=f"over {timeout} s", seconds=time.perf_counter() - t0)
        row["results"][entry] = res.to_json()
        gc.collect()
    if any(r["status"] == "fail_accuracy" for e, r in row["results"].items() if e not in CONTROLS):
        _judge_by_controls(zm, row["results"], steps, timeout, optimizer, autocast)
    if timing or memory:
        try:
            row["timing"] = _with_timeout(timeout * 2, lambda: time_model(
                zm, rounds, timed=timed, autocast=autocast, timing=timing, memory=memory))
        except ZooTimeout:
            row["timing"] = {"errors": {"all": f"timing over {timeout * 2} s"}}
        except Exception as exc:  # noqa: BLE001
            row["timing"] = {"errors": {"all": describe_exception(exc)[0]}}
    if first_calls:
        autocast_name = next((k for k, v in AUTOCAST_DTYPES.items() if v == autocast), None)
        row["first_call"] = first_call(name, tuple(e for e in FIRST_CALLED if e in timed),
                                       autocast_name, timeout, pin)
    torch._dynamo.reset()
    gc.collect()
    return row


# --stress: the moments that otherwise depend on timing, each forced in a process of its own (the
# environment it adds).  C kernels built before the compile returns; built late, each background
# build (or load from the kernel cache) waiting a random time first, so that a program switches
# from torch calls to kernels at random points, forward and backward apart; every measured choice
# timing its forms and keeping each one in turn; and torch (with fjit's kernels) on one thread.
# And the shapes a data loader feeds (zoo_models.ragged_batches): each step a batch of another
# length or batch size, as many steps as shapes, so that a model compiles specialized, then with
# symbolic sizes, and serves the rest (a batch of one included) from them.
STRESS_CASES: dict[str, dict[str, str]] = {
    "sync": {"FJIT_C_KERNELS": "sync", "FJIT_MEASURE": "all"},
    "late": {"FJIT_C_KERNELS": "background", "FJIT_C_BUILD_DELAY": "0.1", "FJIT_MEASURE": "all"},
    "form0": {"FJIT_C_KERNELS": "sync", "FJIT_MEASURE": "all", "FJIT_KEEP_FORM": "0"},
    "form1": {"FJIT_C_KERNELS": "sync", "FJIT_MEASURE": "all", "FJIT_KEEP_FORM": "1"},
    "form2": {"FJIT_C_KERNELS": "sync", "FJIT_MEASURE": "all", "FJIT_KEEP_FORM": "2"},
    "1thread": {"FJIT_C_KERNELS": "background", "FJIT_ZOO_THREADS": "1"},
    "shapes": {"FJIT_ZOO_SHAPES": "ragged"},
}


def _judge_by_controls(zm: ZooModel, results: dict, steps: int, timeout: int, optimizer: str,
                       autocast: torch.dtype | None) -> None:
    """An entry of `results` that failed the accuracy rule becomes "unstable", the control's reason
    added to its own, where a rounding control (CONTROLS) fails the rule too in the same setting:
    eager's own math rounded otherwise is as far from float64 there, so the rule cannot tell the
    entry's rounding from an error."""
    failed = []
    for control in CONTROLS:
        try:
            res = _with_timeout(timeout, lambda: check_accuracy(zm, control, steps, optimizer=optimizer,
                                                                autocast=autocast))
        except ZooTimeout:
            continue
        if res.status == "fail_accuracy":
            failed.append(f"{ENTRY_LABELS[control]} fails too ({res.reason})")
            break
    for r in results.values():
        if r["status"] == "fail_accuracy" and failed:
            r["status"], r["reason"] = "unstable", f"{r['reason']}; {failed[0]}"


def run_stressed(name: str, args, cases: list[str]) -> dict:
    """The model's row in each stress case (run_isolated with the case's environment, whose
    run_model judges a failure by the rounding controls):
    {"model", "source", "note", "cases": {case: {entry: result}}}."""
    zm = MODELS[name]
    row: dict = {"model": name, "source": zm.source, "note": zm.note, "cases": {}}
    for case in cases:
        row["cases"][case] = run_isolated(name, args, STRESS_CASES[case])["results"]
    return row


def run_isolated(name: str, args, environment: dict | None = None) -> dict:
    """run_model in a fresh interpreter (with `environment` added to its own); a crash or a hang
    is that model's error."""
    entries = list(args.entry)
    with tempfile.TemporaryDirectory(prefix="fjit-zoo-") as tmp:
        out = Path(tmp) / "row.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--models", name, "--entry", *entries,
               "--steps", str(args.steps), "--timeout", str(args.timeout), "--rounds", str(args.rounds),
               "--optimizer", args.optimizer, "--device", args.device,
               "--json", str(out), "--quiet", "--timed", *args.timed] + (["--timing"] if args.timing else []) \
            + (["--memory"] if args.memory else []) + (["--first-call"] if args.first_call else []) \
            + (["--default-allocator"] if args.default_allocator else []) \
            + (["--autocast", args.autocast] if args.autocast else [])
        limit = (args.timeout or 600) * (len(entries) + (2 if args.timing or args.memory else 0)
                                         + (2 if args.first_call else 0)) + 120
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit,
                                  env={**os.environ, **(environment or {})})
        except subprocess.TimeoutExpired:
            proc = None
        if proc is not None and out.exists():
            return json.loads(out.read_text())["models"][0]
        why = "process timed out" if proc is None else (
            f"process exited with status {proc.returncode}: "
            + ((proc.stderr.strip().splitlines() or ["no output"])[-1])[:200])
        zm = MODELS[name]
        return {"model": name, "source": zm.source, "note": zm.note,
                "results": {e: Result(name, e, "error", reason=why, error_type="crash").to_json()
                            for e in entries}}


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def summarize(rows: list[dict], entries: list[str]) -> dict:
    summary: dict = {"pass_rate": {}, "geomean": {}}
    for e in entries:
        statuses = [r["results"][e]["status"] for r in rows if e in r["results"]]
        summary["pass_rate"][e] = {"passed": statuses.count("pass"), "total": len(statuses),
                                   "by_status": {s: statuses.count(s) for s in sorted(set(statuses))}}
    for e in ("jit", "backend", "inductor"):
        ratios = [r["timing"]["ratios"][e] for r in rows
                  if "ratios" in r.get("timing", {}) and r["timing"]["ratios"].get(e) is not None]
        if ratios:
            summary["geomean"][e] = {"ratio": geomean(ratios), "models": len(ratios)}
        saved = [r["timing"]["saved_ratios"][e] for r in rows
                 if r.get("timing", {}).get("saved_ratios", {}).get(e) is not None]
        if saved:
            summary.setdefault("saved_geomean", {})[e] = {"ratio": geomean(saved), "models": len(saved)}
    pairs = [(r["first_call"]["seconds"]["jit"], r["first_call"]["seconds"]["inductor"]) for r in rows
             if {"jit", "inductor"} <= set(r.get("first_call", {}).get("seconds", {}))]
    if pairs:
        summary["first_call"] = {"jit_over_inductor": geomean([j / i for j, i in pairs if i > 0]),
                                 "jit_s": geomean([j for j, _ in pairs]),
                                 "inductor_s": geomean([i for _, i in pairs]), "models": len(pairs)}
    return summary


def headline(summary: dict) -> str:
    parts = []
    for e, p in summary["pass_rate"].items():
        pct = 100 * p["passed"] / p["total"] if p["total"] else 0
        unstable = p["by_status"].get("unstable", 0)
        parts.append(f"{ENTRY_LABELS[e]} {p['passed']}/{p['total']} ({pct:.0f}%)"
                     + (f", {unstable} unstable" if unstable else ""))
    line = "pass rate: " + ", ".join(parts)
    if summary["geomean"]:
        line += "\ntraining step time / eager, geomean: " + ", ".join(
            f"{ENTRY_LABELS[e]} {g['ratio']:.2f}x over {g['models']} models" for e, g in summary["geomean"].items())
    if summary.get("saved_geomean"):
        line += "\nbytes saved for the backward / eager, geomean: " + ", ".join(
            f"{ENTRY_LABELS[e]} {g['ratio']:.2f}x over {g['models']} models"
            for e, g in summary["saved_geomean"].items())
    if summary.get("first_call"):
        f = summary["first_call"]
        line += (f"\nfirst call fjit.jit / inductor, geomean: {f['jit_over_inductor']:.2f}x over "
                 f"{f['models']} models ({f['jit_s']:.1f} s and {f['inductor_s']:.1f} s)")
    return line


_STATUS_CELL = {"pass": "pass", "fail_accuracy": "FAIL acc", "error": "ERROR", "timeout": "TIMEOUT",
                "eager_error": "eager err", "unstable": "unstable"}


def _cause_key(res: dict) -> str:
    """Failures grouped by cause: the reason with numbers, shapes and quoted names blurred."""
    if res["status"] == "fail_accuracy":
        kind = res["tensor"].split(":")[0].split("[")[0].split(".")[0]
        return f"fail_accuracy: first at {kind} ({res['stage'].split(' after')[0].rstrip('0123456789 ')})"
    reason = res["reason"]
    if res.get("stage") and reason.startswith(res["stage"] + ": "):
        reason = reason[len(res["stage"]) + 2:]
    reason = re.sub(r"\S+\.py:\d+: ", "", reason)           # fjit's "file:line: " prefix
    reason = re.sub(r"'[^']*'", "'…'", reason)
    reason = re.sub(r"\d+(\.\d+)?", "#", reason)
    return f"{res['status']}: {reason[:100]}"


def tables(rows: list[dict], entries: list[str], timing: bool, memory: bool = False,
           first_calls: bool = False, timed: tuple = TIMED) -> tuple[list[str], list[list[str]]]:
    headers = ["model", "source"] + [ENTRY_LABELS[e] for e in entries]
    if timing:
        headers += [f"{ENTRY_LABELS[e]}/eager" for e in ("jit", "backend", "inductor")]
    if memory:
        headers += [f"{ENTRY_LABELS[e]} saved/eager" for e in timed] + ["eager saved MB"]
    called = [e for e in FIRST_CALLED if e in timed]
    if first_calls:
        headers += [f"{ENTRY_LABELS[e]} 1st s" for e in called]
    body = []
    for r in rows:
        cells = [r["model"], r["source"]] + [_STATUS_CELL.get(r["results"][e]["status"], r["results"][e]["status"])
                                             for e in entries]
        if timing:
            ratios = r.get("timing", {}).get("ratios", {})
            cells += ["-" if ratios.get(e) is None else f"{ratios[e]:.2f}" for e in ("jit", "backend", "inductor")]
        if memory:
            saved = r.get("timing", {}).get("saved_ratios", {})
            cells += ["-" if saved.get(e) is None else f"{saved[e]:.2f}" for e in timed]
            eager_saved = r.get("timing", {}).get("saved_bytes", {}).get("eager")
            cells.append("-" if eager_saved is None else f"{eager_saved / 1e6:.1f}")
        if first_calls:
            seconds = r.get("first_call", {}).get("seconds", {})
            cells += ["-" if seconds.get(e) is None else f"{seconds[e]:.1f}" for e in called]
        body.append(cells)
    return headers, body


def failures_by_cause(rows: list[dict], entries: list[str]) -> dict[str, list[tuple[str, str, dict]]]:
    groups: dict[str, list] = {}
    for r in rows:
        for e in entries:
            res = r["results"][e]
            if res["status"] != "pass":
                groups.setdefault(_cause_key(res), []).append((r["model"], e, res))
    return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


def markdown(rows: list[dict], entries: list[str], summary: dict, args, env: dict, total_s: float) -> str:
    headers, body = tables(rows, entries, args.timing, args.memory, args.first_call, tuple(args.timed))
    mode = f"forward and loss under autocast {args.autocast}, " if args.autocast else ""
    md = ["# fjit model zoo", "",
          f"Generated by `python benchmarks/zoo.py` ({len(rows)} models, {args.steps} training steps of "
          f"{args.optimizer}, {mode}"
          f"torch {env.get('torch')}, fjit {env.get('fjit_revision')}, {env.get('date')}, "
          f"FJIT_C_KERNELS={os.environ.get('FJIT_C_KERNELS', '(unset)')}, {total_s / 60:.1f} min). "
          "The accuracy rule and the timing method are in benchmarks/README.md.", "",
          "**" + headline(summary).replace("\n", "**  \n**") + "**", "",
          "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    md += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in body]
    groups = failures_by_cause(rows, entries)
    if groups:
        md += ["", "## Failures, grouped by cause", ""]
        for cause, items in groups.items():
            md.append(f"- **{cause}** ({len(items)})")
            for model, e, res in items:
                where = f" (at {res['where']})" if res.get("where") else ""
                md.append(f"  - `{model}` ({ENTRY_LABELS[e]}): {res['reason']}{where}".replace("|", "\\|"))
    errors = [(r["model"], e, msg) for r in rows for e, msg in r.get("timing", {}).get("errors", {}).items()]
    if errors:
        md += ["", "## Timing candidates that did not run", ""]
        md += [f"- `{m}` ({ENTRY_LABELS.get(e, e)}): {msg}" for m, e, msg in errors]
    errors = [(r["model"], e, msg) for r in rows for e, msg in r.get("first_call", {}).get("errors", {}).items()]
    if errors:
        md += ["", "## First calls that did not run", ""]
        md += [f"- `{m}` ({ENTRY_LABELS.get(e, e)}): {msg}" for m, e, msg in errors]
    return "\n".join(md) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="names from benchmarks/zoo_models.py (default: all); "
                        "a name ending in * is a prefix (e.g. 'hf_*')")
    parser.add_argument("--entry", nargs="+", default=["jit", "backend"], choices=ENTRIES)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd",
                        help="the training steps' optimizer (see the docstring for why SGD)")
    parser.add_argument("--autocast", choices=sorted(AUTOCAST_DTYPES),
                        help="run every copy's forward and loss under torch.autocast to this dtype, "
                             "judged against eager's own error under it")
    parser.add_argument("--timing", action="store_true", help="also time the training step")
    parser.add_argument("--memory", action="store_true",
                        help="also count the bytes each candidate saves for the backward (against eager)")
    parser.add_argument("--first-call", action="store_true",
                        help="also time fjit.jit's and inductor's first training step, each in a fresh "
                             "process with empty kernel caches")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved timing rounds")
    parser.add_argument("--timed", nargs="+", default=list(TIMED), choices=TIMED,
                        help="the candidates --timing times against eager (a quick sweep: --timed jit)")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per model and entry (0: none)")
    parser.add_argument("--isolate", action="store_true", help="each model in its own process")
    parser.add_argument("--sync-kernels", action="store_true",
                        help="FJIT_C_KERNELS=sync (build C kernels before a compile returns)")
    parser.add_argument("--markdown", metavar="PATH", help="write the report as Markdown")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models run (cuda: fjit's Triton kernels)")
    parser.add_argument("--stress", nargs="*", metavar="CASE", choices=list(STRESS_CASES),
                        help="run each model in every stress case (or those named), each in its own "
                        f"process: {', '.join(STRESS_CASES)} (see STRESS_CASES)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--quiet", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc's malloc trimming its heap (see harness.pin_allocator)")
    args = parser.parse_args(argv)
    if args.sync_kernels:
        os.environ["FJIT_C_KERNELS"] = "sync"
    if args.list:
        for zm in MODELS.values():
            print(f"{zm.name:40} {zm.source:13} {zm.note}")
        return 0
    names = []
    for pattern in args.models or list(MODELS):
        matched = [n for n in MODELS if n == pattern or (pattern.endswith("*") and n.startswith(pattern[:-1]))]
        if not matched:
            parser.error(f"no model {pattern!r} (--list lists them)")
        names += [n for n in matched if n not in names]

    global DEVICE
    DEVICE = args.device
    if os.environ.get("FJIT_ZOO_THREADS"):       # a stress case's process (run_stressed)
        torch.set_num_threads(int(os.environ["FJIT_ZOO_THREADS"]))
    if args.stress is not None:
        return stress(names, args, args.stress or list(STRESS_CASES))
    import fjit  # noqa: F401 - after FJIT_C_KERNELS is set
    from benchmarks import harness as H
    if not args.default_allocator:
        H.pin_allocator()
    env = H.environment()
    env["fjit_c_kernels"] = os.environ.get("FJIT_C_KERNELS", "")
    env["zoo_device"] = DEVICE
    t_start = time.perf_counter()
    rows = []
    for i, name in enumerate(names):
        row = run_isolated(name, args) if args.isolate else run_model(
            name, args.entry, args.steps, args.timeout, args.timing, args.rounds, args.optimizer,
            tuple(args.timed), AUTOCAST_DTYPES.get(args.autocast), args.memory, args.first_call,
            not args.default_allocator)
        rows.append(row)
        if not args.quiet:
            cells = "  ".join(f"{ENTRY_LABELS[e]}: {row['results'][e]['status']} "
                              f"({row['results'][e]['seconds']:.1f}s)" for e in args.entry)
            print(f"[{i + 1}/{len(names)}] {name}  {cells}", flush=True)
            for e in args.entry:
                if row["results"][e]["status"] != "pass":
                    print(f"    {ENTRY_LABELS[e]}: {row['results'][e]['reason']}", flush=True)
            if "timing" in row and "ratios" in row["timing"]:
                print("    time/eager: " + ", ".join(f"{ENTRY_LABELS[e]} {v:.2f}"
                                                     for e, v in row["timing"]["ratios"].items()), flush=True)
                if row["timing"].get("kept"):
                    print(f"    kept: {row['timing']['kept']}", flush=True)
            if row.get("timing", {}).get("saved_ratios") is not None:
                t = row["timing"]
                print("    saved for backward/eager: " + ", ".join(
                    f"{ENTRY_LABELS[e]} {'-' if v is None else f'{v:.2f}'}" for e, v in t["saved_ratios"].items())
                    + f" (eager {t['saved_bytes'].get('eager', 0) / 1e6:.1f} MB)", flush=True)
            if "timing" in row and row["timing"].get("errors"):
                print("    not timed: " + "; ".join(f"{ENTRY_LABELS.get(e, e)}: {m}"
                                                    for e, m in row["timing"]["errors"].items()), flush=True)
            if "first_call" in row:
                fc = row["first_call"]
                print("    first call: " + ", ".join(
                    f"{ENTRY_LABELS[e]} {p['first_s']:.1f} s"
                    + (f" ({p['step_s']:.1f} s step + {p['builds_s']:.1f} s builds)" if p["builds_s"] >= 0.05 else "")
                    + f", second {p['second_s']:.2f} s" for e, p in fc["probes"].items())
                    + "".join(f"; {ENTRY_LABELS[e]}: {m}" for e, m in fc["errors"].items()), flush=True)
    total_s = time.perf_counter() - t_start
    summary = summarize(rows, args.entry)
    summary["total_seconds"] = total_s
    if not args.quiet:
        headers, body = tables(rows, args.entry, args.timing, args.memory, args.first_call, tuple(args.timed))
        print()
        print(H.format_table(headers, body))
        groups = failures_by_cause(rows, args.entry)
        if groups:
            print("\nfailures, grouped by cause:")
            for cause, items in groups.items():
                print(f"  {cause} ({len(items)}): " + ", ".join(f"{m} ({ENTRY_LABELS[e]})" for m, e, _ in items))
        print()
        print(headline(summary))
        print(f"total {total_s:.0f} s")
    if args.markdown:
        path = Path(args.markdown)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown(rows, args.entry, summary, args, env, total_s))
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"environment": env, "args": vars(args), "summary": summary, "models": rows}
        path.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    return 0


def stress(names: list[str], args, cases: list[str]) -> int:
    """--stress: every model in every case; a table of model x case (each cell the entries'
    statuses), the failures with their reasons, and the JSON (--json).  Exit status 1 where any
    model failed any case."""
    from benchmarks import harness as H
    t_start = time.perf_counter()
    rows = []
    for i, name in enumerate(names):
        row = run_stressed(name, args, cases)
        rows.append(row)
        cells = "  ".join(f"{case}: " + "/".join(r["status"] for r in row["cases"][case].values())
                          for case in cases)
        print(f"[{i + 1}/{len(names)}] {name}  {cells}", flush=True)
        for case in cases:
            for e, r in row["cases"][case].items():
                if r["status"] != "pass":
                    print(f"    {case} {ENTRY_LABELS[e]}: {r['reason']}", flush=True)
    total_s = time.perf_counter() - t_start
    failed = [(row["model"], case, e) for row in rows for case in cases
              for e, r in row["cases"][case].items() if r["status"] not in ("pass", "unstable")]
    unstable = sum(r["status"] == "unstable" for row in rows for case in cases for r in row["cases"][case].values())
    headers = ["model"] + [f"{case} ({'/'.join(ENTRY_LABELS[e] for e in args.entry)})" for case in cases]
    body = [[row["model"]] + ["/".join(r["status"] for r in row["cases"][case].values()) for case in cases]
            for row in rows]
    print()
    print(H.format_table(headers, body))
    runs = len(rows) * len(cases) * len(args.entry)
    print(f"\nstress: {runs - len(failed) - unstable}/{runs} model-case-entry runs pass, {unstable} unstable "
          f"(a rounding control fails the rule too), {len(failed)} fail; "
          f"{len(names)} models, cases {', '.join(cases)}; total {total_s / 60:.1f} min")
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"args": vars(args), "cases": {c: STRESS_CASES[c] for c in cases},
                                    "total_seconds": total_s, "models": rows}, indent=2, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
