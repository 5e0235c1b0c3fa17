"""Training through fjit.jit(model) against eager, from the same initial state and data: several
optimizer steps (SGD and AdamW) of an MLP, a pre-norm transformer block, a conv net with BatchNorm
(train, then eval), and an RMSNorm + log_softmax + nll_loss head.  Every loss, every gradient, and
the final parameters and buffers must agree within float32 tolerance.  Then models users bring and
did not write: layers that probe types and attributes, structured outputs, grad-mode and autocast
switches inside forward, and torch's own nn.TransformerEncoderLayer, MultiheadAttention and LSTM.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fjit

STEPS = 3


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 32), nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class PreNormBlock(nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        y = (attn @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))
        return x + self.drop(self.mlp(self.ln2(x)))


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
                                  nn.Conv2d(6, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.body(x).mean((2, 3)))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class RMSHead(nn.Module):
    def __init__(self, d=16, vocab=11):
        super().__init__()
        self.norm, self.out = RMSNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, x, target):
        return F.nll_loss(F.log_softmax(self.out(self.norm(x)), dim=-1), target)


def _mse(out, y):
    return F.mse_loss(out, y)


CASES = {   # name -> (model factory, batch factory(step) -> (args, target or None), loss)
    "mlp": (MLP, lambda g: ((torch.randn(8, 12, generator=g),), torch.randn(8, 5, generator=g)), _mse),
    "transformer": (PreNormBlock, lambda g: ((torch.randn(2, 6, 16, generator=g),),
                                             torch.randn(2, 6, 16, generator=g)), _mse),
    "conv_bn": (ConvBN, lambda g: ((torch.randn(4, 3, 8, 8, generator=g),),
                                   torch.randn(4, 3, generator=g)), _mse),
    "rms_head": (RMSHead, lambda g: ((torch.randn(10, 16, generator=g),
                                      torch.randint(0, 11, (10,), generator=g)), None), None),
}
# AdamW's eps is raised from 1e-8: its step is m / (sqrt(v) + eps), which for a gradient that is
# zero in exact arithmetic (attention's key bias: softmax ignores a constant added to every key)
# turns rounding noise of 1e-9 into a full lr-sized step whose sign is the noise's.  Gradients are
# compared directly above; the final parameters only compare where the optimizer does not amplify
# rounding into the result.
OPTIMIZERS = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
              "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, eps=1e-4)}


def _train(model, call, batches, loss_fn, optimizer):
    """Losses and gradients of each step; the model is left as training leaves it."""
    opt = optimizer(model.parameters())
    losses, grads = [], []
    for args, target in batches:
        opt.zero_grad()
        out = call(*args)
        loss = out if loss_fn is None else loss_fn(out, target)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
    return losses, grads


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_training_matches_eager(case, optimizer):
    factory, batch, loss_fn = CASES[case]
    torch.manual_seed(0)
    model = factory()
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    batches = [batch(g) for _ in range(STEPS)]
    jm = fjit.jit(model)
    if case == "transformer":        # dropout in eval, the rest in train mode
        for m in (model, ref):
            m.drop.eval()
    got = _train(model, jm, batches, loss_fn, OPTIMIZERS[optimizer])
    want = _train(ref, ref, batches, loss_fn, OPTIMIZERS[optimizer])
    for step, (a, b) in enumerate(zip(got[0], want[0])):
        torch.testing.assert_close(a, b, msg=lambda m: f"loss of step {step}: {m}")
    for step, (a, b) in enumerate(zip(got[1], want[1])):
        for name in b:
            torch.testing.assert_close(a[name], b[name], msg=lambda m: f"grad {name}, step {step}: {m}")
    for (name, p), q in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(p, q, msg=lambda m: f"final {name}: {m}")
    assert fjit.cache_info(jm).misses == 1          # weights changed every step: no recompile
    if case == "conv_bn":           # then evaluation: running statistics read, not written
        jm.eval()
        ref.eval()
        with torch.no_grad():
            x = batches[0][0][0]
            torch.testing.assert_close(jm(x), ref(x))
        for (name, p), q in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(p, q, msg=name)


# ----------------------------------------------------------------------------- models users bring

@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    hidden: torch.Tensor


Pair = collections.namedtuple("Pair", ["mean", "spread"])


class Probing(nn.Module):
    """Asks questions of its inputs and submodules as library code does."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x, mask=None):
        if not isinstance(x, torch.Tensor) or not hasattr(self.fc, "weight"):
            raise TypeError("expected a tensor")
        h = self.fc(x)
        if isinstance(self.norm, nn.LayerNorm) and getattr(self.fc, "bias", None) is not None:
            h = self.norm(h)
        if mask is not None:
            h = h.masked_fill(mask, 0.0)
        with torch.no_grad():
            scale = h.abs().amax(-1, keepdim=True) + 1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = self.fc(x)
        return {"out": Output(h / scale, low.float()), "stats": Pair(h.mean(), h.std())}


def _plain(x):
    """Dataclasses as dicts, so assert_close can compare the structures."""
    if dataclasses.is_dataclass(x):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _assert_same_calls(model, *args, calls=2):
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for seed in range(calls):
        torch.manual_seed(seed)
        got = jm(*args)
        torch.manual_seed(seed)
        want = ref(*args)
        assert type(got) is type(want)
        torch.testing.assert_close(_plain(got), _plain(want))
    for (name, b), r in zip(model.named_buffers(), ref.buffers()):
        torch.testing.assert_close(b, r, msg=name)
    return got, want


def test_layers_that_probe_types_and_return_structures():
    torch.manual_seed(0)
    x = torch.randn(3, 6)
    got, want = _assert_same_calls(Probing(), x, x > 1)
    assert type(got["out"]) is Output and type(got["stats"]) is Pair
    assert got["out"].hidden.dtype is torch.float32
    got["out"].logits.sum().backward()          # gradients flow through the no_grad region's rest


@pytest.mark.parametrize("train", [False, True])
def test_torch_transformer_encoder_layer(train):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True, norm_first=True).train(train)
    _assert_same_calls(layer, torch.randn(2, 5, 16))


def test_torch_multihead_attention_and_lstm():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    got, _ = _assert_same_calls(nn.MultiheadAttention(16, 4, batch_first=True), x, x, x)
    assert isinstance(got, tuple) and got[1].shape == (2, 5, 5)
    lstm = nn.LSTM(16, 8, batch_first=True)
    got, _ = _assert_same_calls(lstm, x)
    got[0].sum().backward()
    assert lstm.weight_ih_l0.grad is not None


class _Attention(nn.Module):
    """nn.MultiheadAttention as torchvision's ViT calls it (need_weights=False), on one input
    (packed projection), a shared key/value or three separate ones."""

    def __init__(self, sources: str, batch_first: bool, bias: bool):
        super().__init__()
        self.sources = sources
        self.attention = nn.MultiheadAttention(16, 4, bias=bias, batch_first=batch_first)

    def forward(self, x, y, z):
        key, value = {"self": (x, x), "shared": (y, y), "separate": (y, z)}[self.sources]
        return self.attention(x, key, value, need_weights=False)[0]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sources", ["self", "shared", "separate"])
def test_multihead_attention_without_weights_is_eagers_torch_calls(sources, batch_first, bias,
                                                                    monkeypatch):
    """Its projections are linear layers the compiled backward differentiates (no op kept whole
    by torch autograd but the attention itself), with eager's outputs bit for bit and its
    gradients; a mask keeps the whole op (one torch call)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    torch.manual_seed(0)
    model = _Attention(sources, batch_first, bias)
    ref = copy.deepcopy(model)
    shape = lambda n: (3, n, 16) if batch_first else (n, 3, 16)      # noqa: E731
    x = torch.randn(shape(5), requires_grad=True)
    y, z = torch.randn(shape(7)), torch.randn(shape(7))
    jm = fjit.jit(model)
    for _ in range(2):
        got, want = jm(x, y, z), ref(x, y, z)
        assert torch.equal(got, want)
        grads = torch.autograd.grad(got.square().sum(), [x, *model.parameters()])
        wanted = torch.autograd.grad(want.square().sum(), [x, *ref.parameters()])
        torch.testing.assert_close(grads, wanted)
    assert "multi_head_attention_forward" not in str(fjit.last_traces(jm)[-1])
    assert "torch.nn.functional.linear" in str(fjit.last_traces(jm)[-1])


class _MaskedAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention = nn.MultiheadAttention(16, 4)

    def forward(self, x, mask):
        return self.attention(x, x, x, need_weights=False, attn_mask=mask)[0]


def test_multihead_attention_with_a_mask_stays_one_torch_call():
    torch.manual_seed(0)
    x, mask = torch.randn(5, 3, 16), torch.ones(5, 5, dtype=torch.bool).triu(1)
    model = _MaskedAttention()
    jm = fjit.jit(model)
    torch.testing.assert_close(jm(x, mask), model(x, mask))
    assert "multi_head_attention_forward" in str(fjit.last_traces(jm)[-1])


def test_batch_norm_with_cumulative_average_is_a_clear_error():
    # momentum=None averages with 1 / num_batches_tracked, a Python float read from a buffer
    with pytest.raises(fjit.DataDependentError, match="buffer 'num_batches_tracked'"):
        fjit.jit(nn.BatchNorm1d(4, momentum=None))(torch.randn(3, 4))


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_batch_norm_running_statistics_are_eagers_bit_for_bit(dims):
    """The running statistics come from ATen's own update (what eager's batch norm runs in place),
    so after several training steps they equal eager's exactly, not within a tolerance."""
    norm = {1: torch.nn.BatchNorm1d, 2: torch.nn.BatchNorm2d, 3: torch.nn.BatchNorm3d}[dims]
    eager = torch.nn.Sequential(torch.nn.Linear(6, 6), norm(5, momentum=0.3))
    compiled = copy.deepcopy(eager)
    jm = fjit.jit(compiled)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4):
        x = torch.randn(4, 5, *(3,) * (dims - 1), 6, generator=gen) * 3 + 1
        eager(x).square().sum().backward()
        jm(x).square().sum().backward()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(eager[1], name), getattr(compiled[1], name)), name


# -- the measured choice between the joint program and torch autograd (fjit/program_choice.py) --

class DropoutMLP(nn.Module):
    # each test its own width: wrappers of equal modules share programs, and a shared program
    # has made its choice already
    def __init__(self, width: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, width), nn.Linear(width, 5)

    def forward(self, x):
        return self.fc2(F.dropout(F.gelu(self.fc1(x)), 0.3, training=True)).tanh()


@pytest.mark.parametrize("long_run", [False, True])     # True: one timed round (a big model's)
@pytest.mark.parametrize("autograd_wins", [False, True])
def test_measured_choice_keeps_eager_results_and_random_draws(monkeypatch, autograd_wins, long_run):
    """Whichever form the second call's measurement keeps, every step's loss and gradients are
    eager's, dropout draws what eager draws (the measuring runs are rewound), and the traces show
    the form that runs."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    monkeypatch.setattr(program_choice, "MARGIN", 1e9 if autograd_wins else 0.0)
    monkeypatch.setattr(program_choice, "SAVED_MARGIN", float("inf"))     # time alone decides
    monkeypatch.setattr(program_choice, "LONG_RUN", 0.0 if long_run else 1e9)
    torch.manual_seed(0)
    model = DropoutMLP(33 + 4 * long_run if autograd_wins else 34 + 4 * long_run)
    eager = copy.deepcopy(model)
    jitted = fjit.jit(model)
    x = torch.randn(6, 12)
    for step in range(4):
        for m, call in ((eager, eager), (model, jitted)):
            torch.manual_seed(step)
            m.zero_grad()
            loss = call(x).square().sum()
            loss.backward()
            if m is eager:
                want, want_grads = loss, [p.grad.clone() for p in eager.parameters()]
        torch.testing.assert_close(loss, want)
        for p, g in zip(model.parameters(), want_grads):
            torch.testing.assert_close(p.grad, g)
    stage = fjit.last_backward_traces(jitted)[-1].stage
    if autograd_wins:
        assert stage.startswith("torch_autograd") and "measured on the second call" in stage
        assert not any("C kernel" in str(t) for t in fjit.last_traces(jitted))
    else:
        assert not stage.startswith("torch_autograd")


@pytest.mark.parametrize("autograd_time, kept", [(0.9, "torch autograd"), (1.02, "torch autograd"),
                                                  (1.05, "joint")])
def test_measured_choice_gives_ties_to_torch_autograd(monkeypatch, autograd_time, kept):
    """torch autograd runs eager's own kernels, so it is kept unless the joint program's measured
    time is under 1/MARGIN of its (a clock the forms advance by fixed amounts: no real timing)."""
    import fjit.program_choice as program_choice
    clock = [0.0]
    monkeypatch.setattr(program_choice.time, "perf_counter", lambda: clock[0])

    def form(what, cost):
        def timed(x):
            clock[0] += cost
            return x * 2.0
        return program_choice.Form(what, timed, timed, lambda reason: ([reason], [reason]))
    forward, backward = ["compiled"], ["compiled"]
    choice = program_choice.MeasuredChoice([form("joint", 1.0), form("torch autograd", autograd_time)],
                                           [], forward, backward)
    x = torch.randn(3, requires_grad=True)
    choice(x)
    choice(x)
    assert choice.times == pytest.approx([1.0, autograd_time])
    assert (choice.run is choice.forms[1].run) == (kept == "torch autograd")
    # the kept form's stages replace the compilation's, whichever it is, naming every form's time
    other = "torch autograd" if kept == "joint" else "joint"
    assert backward == forward and len(backward) == 1
    assert backward[0].startswith(f"measured on the second call, {kept} took") and f"and {other} " in backward[0]


@pytest.mark.parametrize("autograd_time, kept", [(0.98, "joint"), (0.95, "torch autograd")])
def test_measured_choice_keeps_the_form_saving_far_fewer_bytes_when_nearly_as_fast(monkeypatch, autograd_time,
                                                                                  kept):
    """A form saving at most 1/SAVED_MARGIN of the bytes of the fastest one (counted in its warm-up
    run, by saved_tensors_hooks) is kept where it takes at most TIME_FOR_MEMORY of its time: the
    joint program here saves one value where torch autograd's form saves four (a fake clock)."""
    import fjit.program_choice as program_choice
    clock = [0.0]
    monkeypatch.setattr(program_choice.time, "perf_counter", lambda: clock[0])

    def form(what, cost, saves):
        def timed(x):
            clock[0] += cost
            y = x
            for _ in range(saves):
                y = y.sin()           # saves its input
            return y
        return program_choice.Form(what, timed, timed, lambda reason: ([reason], [reason]))
    forward, backward = ["compiled"], ["compiled"]
    choice = program_choice.MeasuredChoice([form("joint", 1.0, 1), form("torch autograd", autograd_time, 4)],
                                           [], forward, backward)
    x = torch.randn(1000, requires_grad=True)
    choice(x)
    choice(x)
    assert choice.saved == [0, 3 * 4000]       # sin's inputs, x itself (an input) left out
    assert (choice.run is choice.forms[1].run) == (kept == "torch autograd")
    assert ("kept for its saved bytes" in backward[0]) == (kept == "joint")


@pytest.mark.parametrize("eager_time, kept_for_bytes", [(0.99, False), (1.01, True)])
def test_measured_choice_buys_no_memory_with_a_step_slower_than_eagers_way(monkeypatch, eager_time,
                                                                          kept_for_bytes):
    """The form saving the fewest bytes, within TIME_FOR_MEMORY of the fastest, is kept only where
    it is no slower than eager's way (torch autograd over the forward's torch calls): a joint
    program at 1.0 against channels-last at 0.98 is kept for its bytes beside eager's way at 1.01,
    not beside it at 0.99 (a fake clock)."""
    import fjit.program_choice as program_choice
    clock = [0.0]
    monkeypatch.setattr(program_choice.time, "perf_counter", lambda: clock[0])

    def form(what, cost, saves, eager_like=False):
        def timed(x):
            clock[0] += cost
            y = x
            for _ in range(saves):
                y = y.sin()
            return y
        return program_choice.Form(what, timed, timed, lambda reason: ([reason], [reason]), eager_like=eager_like)
    forward, backward = ["compiled"], ["compiled"]
    choice = program_choice.MeasuredChoice(
        [form("joint", 1.0, 1), form("torch autograd", eager_time, 4, eager_like=True),
         form("channels-last", 0.98, 4)], [], forward, backward)
    x = torch.randn(1000, requires_grad=True)
    choice(x)
    choice(x)
    assert (choice.run is choice.forms[0].run) == kept_for_bytes
    assert ("kept for its saved bytes" in backward[0]) == kept_for_bytes
    if not kept_for_bytes:
        assert choice.run is choice.forms[2].run


def test_measured_choice_waits_for_no_kernel_build(monkeypatch):
    """While kernels still build in the background the second call runs the first form without
    measuring (it waited for every build: a cold cache's ReXNet and EfficientNetV2 checks ran out
    of the zoo's 300 s on two cores); the first call after the builds measures."""
    import fjit.program_choice as program_choice
    pending = [True]
    monkeypatch.setattr(program_choice, "kernels_pending", lambda: pending[0])
    waited = []
    monkeypatch.setattr(program_choice, "wait_for_kernels", lambda: waited.append(True))

    def form(what):
        def timed(x):
            return x * 2.0
        return program_choice.Form(what, timed, timed, lambda reason: ([reason], [reason]))
    choice = program_choice.MeasuredChoice([form("joint"), form("torch autograd")], [], [], [])
    x = torch.randn(3, requires_grad=True)
    for _ in range(3):
        choice(x)
    assert not choice.decided and choice.times is None and not waited
    pending[0] = False
    choice(x)
    assert choice.decided and choice.times is not None


@pytest.mark.parametrize("autograd_time, runs", [(1.5, 1 + 3), (1.04, 1 + 3 + 4)])
def test_measured_choice_times_close_forms_longer(monkeypatch, autograd_time, runs):
    """Forms within CLOSE of each other after ROUNDS rounds are timed CLOSE_ROUNDS more: one noisy
    round must not decide between forms a few percent apart."""
    import fjit.program_choice as program_choice
    clock, calls = [0.0], []
    monkeypatch.setattr(program_choice.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(program_choice, "LONG_RUN", 1e9)

    def form(what, cost):
        def timed(x):
            clock[0] += cost
            calls.append(what)
            return x * 2.0
        return program_choice.Form(what, timed, timed, lambda reason: ([reason], [reason]))
    choice = program_choice.MeasuredChoice([form("joint", 1.0), form("torch autograd", autograd_time)],
                                           [], ["compiled"], ["compiled"])
    x = torch.randn(3, requires_grad=True)
    choice(x)
    choice(x)
    # a warm-up and the rounds each; the joint form also ran both calls themselves
    assert calls.count("joint") - 2 == calls.count("torch autograd") == runs


def test_a_slow_warm_up_does_not_cut_the_measured_choice_to_one_round(monkeypatch):
    """A program's first run pays one-time costs (kernels loaded, buffers first touched): a form
    whose warm-up exceeds LONG_RUN but whose runs after it do not gets every round."""
    import fjit.program_choice as program_choice
    clock, calls = [0.0], []
    monkeypatch.setattr(program_choice.time, "perf_counter", lambda: clock[0])

    def form(what, cost):
        def timed(x):
            clock[0] += 10 * cost if what not in calls else cost     # the first run is slow
            calls.append(what)
            return x * 2.0
        return program_choice.Form(what, timed, timed, lambda reason: ([reason], [reason]))
    choice = program_choice.MeasuredChoice([form("joint", 0.1), form("torch autograd", 0.2)],
                                           [], ["compiled"], ["compiled"])
    x = torch.randn(3, requires_grad=True)
    choice(x)
    calls.clear()
    choice(x)
    assert calls.count("torch autograd") == 1 + program_choice.ROUNDS


def test_measured_choice_is_skipped_for_an_input_with_a_gradient_hook(monkeypatch):
    """Measuring runs backwards that a hook on an input would see: such a program keeps the joint
    form, and the hook runs once per real backward."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    monkeypatch.setattr(program_choice, "MARGIN", 1e9)
    monkeypatch.setattr(program_choice, "SAVED_MARGIN", float("inf"))     # time alone decides
    model = DropoutMLP(35)
    seen = []
    model.fc1.weight.register_hook(lambda g: seen.append(1))
    jitted = fjit.jit(model)
    x = torch.randn(4, 12)
    for _ in range(3):
        jitted(x).sum().backward()
    assert len(seen) == 3
    assert not fjit.last_backward_traces(jitted)[-1].stage.startswith("torch_autograd")


def test_fjit_measure_0_never_measures(monkeypatch):
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "0")
    monkeypatch.setattr(program_choice, "MARGIN", 1e9)
    monkeypatch.setattr(program_choice, "SAVED_MARGIN", float("inf"))     # time alone decides
    jitted = fjit.jit(DropoutMLP(36))
    x = torch.randn(4, 12)
    for _ in range(3):
        jitted(x).sum().backward()
    assert not fjit.last_backward_traces(jitted)[-1].stage.startswith("torch_autograd")


class DepthwiseNet(nn.Module):
    """MobileNet-like: a stem, depthwise and pointwise convolutions with batch norm, a squeeze-
    excite gate on a 1x1 map (convolutions whose input is both layouts), max pooling, and a
    feature map returned beside the logits (eager gives it contiguous)."""

    def __init__(self, width: int, blocks: int = 4):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1), nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.blocks = nn.ModuleList(nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, groups=width), nn.BatchNorm2d(width), nn.Hardswish(),
            nn.Conv2d(width, width, 1), nn.BatchNorm2d(width)) for _ in range(blocks))
        self.gate = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(width, 4, 1), nn.ReLU(),
                                  nn.Conv2d(4, width, 1), nn.Hardsigmoid())
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        x = F.max_pool2d(self.stem(x), 3, 2, 1)
        for block in self.blocks:
            x = x + block(x)
        features = x * self.gate(x)
        return self.head(features.mean((2, 3))), features


def _set_channels_last_margin(monkeypatch, value: float) -> None:
    """Both channels-last margins (DepthwiseNet's programs have grouped convolutions), and the
    form offered to a program of several dense convolutions too (these tests' networks)."""
    import fjit.program_choice as program_choice
    for name in ("CHANNELS_LAST_MARGIN", "CHANNELS_LAST_MARGIN_GROUPED"):
        monkeypatch.setattr(program_choice, name, value)
    monkeypatch.setattr(program_choice, "CHANNELS_LAST_DENSE_CONVOLUTIONS", 1 << 30)
    monkeypatch.setattr(program_choice, "SAVED_MARGIN", float("inf"))     # time alone decides


@pytest.mark.parametrize("channels_last_wins", [False, True])
def test_channels_last_form_keeps_eagers_results_and_layouts(monkeypatch, channels_last_wins):
    """A CPU training program with 2-D convolutions measures, beside its other forms, torch
    autograd over the function traced with channels-last convolution inputs.  Whichever is kept,
    every step's outputs, gradients and batch-norm statistics are eager's (up to the convolution
    algorithm's rounding), the outputs have eager's layouts (a caller may `.view` them), and the
    traces show the form that runs."""
    monkeypatch.setenv("FJIT_MEASURE", "all")
    _set_channels_last_margin(monkeypatch, 1e9 if channels_last_wins else 0.0)
    torch.manual_seed(0)
    model = DepthwiseNet(12 + channels_last_wins)
    eager = copy.deepcopy(model)
    jitted = fjit.jit(model)
    for step in range(4):
        x = torch.randn(4, 3, 24, 24)
        results = []
        for m, call in ((eager, eager), (model, jitted)):
            m.zero_grad()
            logits, features = call(x)
            (logits.square().sum() + features.sum()).backward()
            results.append((logits, features))
        (want, want_features), (got, got_features) = results
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got_features, want_features, rtol=1e-4, atol=1e-4)
        assert got_features.stride() == want_features.stride()
        got_features.view(4, -1)
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            scale = q.grad.abs().max().item() + 1.0
            torch.testing.assert_close(p.grad / scale, q.grad / scale, rtol=1e-4, atol=1e-4, msg=lambda m: name + m)
        for (name, a), b in zip(model.state_dict().items(), eager.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)
    forward = str(fjit.last_traces(jitted)[-1])
    stage = fjit.last_backward_traces(jitted)[-1].stage
    assert ("memory_format=torch.channels_last" in forward) is channels_last_wins
    assert ("channels-last convolutions took" in stage) is channels_last_wins


@pytest.mark.parametrize("groups", [1, 4])
def test_the_channels_last_margin_of_a_program_with_grouped_convolutions(monkeypatch, groups):
    """A program with a grouped or depthwise convolution keeps the channels-last form under
    CHANNELS_LAST_MARGIN_GROUPED (oneDNN's NCHW depthwise kernels are the slow ones); one with
    several dense convolutions only is not offered the form (CHANNELS_LAST_DENSE_CONVOLUTIONS)."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    # torch autograd's form always beats the joint program (its stage line then lists every form
    # measured): on a fast CPU the joint program won by more than MARGIN and the line was its own
    monkeypatch.setattr(program_choice, "MARGIN", 1e9)
    monkeypatch.setattr(program_choice, "SAVED_MARGIN", float("inf"))     # time alone decides
    monkeypatch.setattr(program_choice, "CHANNELS_LAST_MARGIN", 0.0)
    monkeypatch.setattr(program_choice, "CHANNELS_LAST_MARGIN_GROUPED", 1e9)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1, groups=groups), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 3))
    jitted = fjit.jit(model)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        jitted(x).sum().backward()
    stage = fjit.last_backward_traces(jitted)[-1].stage
    assert "joint program" in stage
    assert ("channels-last convolutions" in stage) is (groups > 1)    # measured beside the others
    kept_channels_last = "memory_format=torch.channels_last" in str(fjit.last_traces(jitted)[-1])
    assert kept_channels_last is (groups > 1)


@pytest.mark.parametrize("margin", [0.0, 1e9])
def test_a_dense_program_with_one_convolution_is_offered_the_channels_last_form(monkeypatch, margin):
    """A patch embedding's one dense convolution (ResMLP, CaiT): the form is measured and kept
    under CHANNELS_LAST_MARGIN."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    # torch autograd's form always beats the joint program, so the stage line lists every form
    # measured (the joint program, once its kernels got faster, won by more than MARGIN)
    monkeypatch.setattr(program_choice, "MARGIN", 1e9)
    monkeypatch.setattr(program_choice, "SAVED_MARGIN", float("inf"))     # time alone decides
    monkeypatch.setattr(program_choice, "CHANNELS_LAST_MARGIN", margin)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.SiLU(), nn.Tanh(),
                          nn.Hardswish(), nn.Flatten(), nn.LayerNorm(8 * 64), nn.Linear(8 * 64, 3))
    jitted = fjit.jit(model)
    # a batch of its own per margin: the same shapes would share the program the first decided
    x = torch.randn(2 if margin > 1 else 3, 3, 8, 8)
    for _ in range(2):
        jitted(x).sum().backward()
    stage = fjit.last_backward_traces(jitted)[-1].stage
    assert "channels-last convolutions" in stage and "joint program" in stage
    kept_channels_last = "memory_format=torch.channels_last" in str(fjit.last_traces(jitted)[-1])
    assert kept_channels_last is (margin > 1)


def test_a_program_whose_first_call_ran_op_by_op_measures_on_its_second(monkeypatch):
    """A convolution's program runs its compiling call op by op (the layout check); the call after
    it is its second, and measures (it was counted as the first: the zoo's third step changed
    form, after two steps of another)."""
    monkeypatch.setenv("FJIT_MEASURE", "all")
    _set_channels_last_margin(monkeypatch, 1e9)
    torch.manual_seed(0)
    jitted = fjit.jit(DepthwiseNet(11))
    x = torch.randn(2, 3, 24, 24)
    for call in range(2):
        jitted(x)[0].sum().backward()
        measured = "channels-last convolutions took" in fjit.last_backward_traces(jitted)[-1].stage
        assert measured is (call == 1), call


def test_channels_last_form_batch_norm_has_eagers_accuracy(monkeypatch):
    """In the channels-last form a batch norm of 256+ values per channel runs as fjit's kernels
    (runtime.batch_norm_channels_last), not ATen's channels-last kernel, whose sequential sums
    erred 5-13x more than eager's NCHW kernel against float64.  Every output, gradient and running
    statistic stays within a few times eager's float32 error (the convolutions' channels-last
    kernels add rounding of their own); with ATen's kernel, 4 of them erred 10-17x as much."""
    monkeypatch.setenv("FJIT_MEASURE", "all")
    _set_channels_last_margin(monkeypatch, 1e9)
    torch.manual_seed(0)
    model = DepthwiseNet(16)
    reference = copy.deepcopy(model).double()
    eager = copy.deepcopy(model)
    jitted = fjit.jit(model)
    x = torch.randn(4, 3, 64, 64) * 3 + 5         # 1024 values per channel after the stem's pool
    results = {}
    for name, m, call, inp in (("fjit", model, jitted, x), ("eager", eager, eager, x),
                               ("float64", reference, reference, x.double())):
        for _ in range(3):      # the second call measures the forms; the third runs the kept one
            m.zero_grad()
            logits, features = call(inp)
            (logits.square().sum() + features.sum()).backward()
        results[name] = [logits, features, *(p.grad for p in m.parameters()), *m.buffers()]
    assert "batch_norm_channels_last" in str(fjit.last_traces(jitted)[-1])
    assert "channels-last convolutions took" in fjit.last_backward_traces(jitted)[-1].stage
    for got, want, ref in zip(results["fjit"], results["eager"], results["float64"]):
        if ref.dtype.is_floating_point:
            err = (got.double() - ref).pow(2).mean().sqrt()
            eager_err = (want.double() - ref).pow(2).mean().sqrt()
            assert err <= 8 * eager_err + 1e-9 * ref.abs().max(), (err, eager_err)


def test_channels_last_batch_norm_double_backward_is_eagers():
    """runtime.batch_norm_channels_last's backward, differentiated again, is batch norm's own."""
    from fjit.runtime import batch_norm_channels_last
    torch.manual_seed(0)
    x = torch.randn(4, 6, 16, 16, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    w, b = torch.rand(6, dtype=torch.float64) + 0.5, torch.randn(6, dtype=torch.float64)
    grads = []
    for f in (lambda t, w, b: batch_norm_channels_last(t, w, b, 1e-5)[0],
              lambda t, w, b: F.batch_norm(t, None, None, w, b, True)):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
        out = f(*leaves)
        first = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
        grads.append(first + torch.autograd.grad(sum(g.square().sum() for g in first), leaves))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want)


def test_channels_last_form_is_not_offered_where_a_random_draw_reads_a_relaid_value(monkeypatch):
    """Dropout after a convolution (SqueezeNet's classifier) draws its mask in its input's memory
    order: on the channels-last form's activations each position would get another number than
    eager's.  Such a program does not offer that form, however fast it would be, and every
    step's outputs and gradients are eager's under the same seed."""
    monkeypatch.setenv("FJIT_MEASURE", "all")
    _set_channels_last_margin(monkeypatch, 1e9)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Dropout(0.5), nn.Conv2d(8, 5, 1),
                          nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten())
    eager = copy.deepcopy(model)
    jitted = fjit.jit(model)
    for step in range(4):
        x = torch.randn(2, 3, 10, 10)
        results = []
        for m, call in ((eager, eager), (model, jitted)):
            m.zero_grad()
            torch.manual_seed(step)
            out = call(x)
            out.square().sum().backward()
            results.append((out, [p.grad for p in m.parameters()]))
        torch.testing.assert_close(results[1][0], results[0][0])
        for got, want in zip(results[1][1], results[0][1]):
            torch.testing.assert_close(got, want)
    assert "channels-last" not in fjit.last_backward_traces(jitted)[-1].stage


def test_channels_last_form_is_not_offered_where_an_output_layout_cannot_be_eagers(monkeypatch):
    """An output that eager gives neither contiguous nor as the channels-last trace does (a
    permuted feature map) drops the channels-last form: the program keeps eager's layouts."""
    monkeypatch.setenv("FJIT_MEASURE", "all")
    _set_channels_last_margin(monkeypatch, 1e9)
    torch.manual_seed(0)
    class Permuted(nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = nn.Sequential(*[nn.Conv2d(6, 6, 3, padding=1, groups=3) for _ in range(12)])

        def forward(self, x):
            return self.convs(x).transpose(1, 2)[:, :, ::2]

    model = Permuted()
    eager = copy.deepcopy(model)
    jitted = fjit.jit(model)
    for _ in range(3):
        x = torch.randn(2, 6, 8, 8)
        got, want = jitted(x), eager(x)
        assert got.stride() == want.stride()
        torch.testing.assert_close(got, want)
        got.sum().backward()
    assert "memory_format=torch.channels_last" not in str(fjit.last_traces(jitted)[-1])


def test_batch_norm_training_is_one_aten_pass_with_eagers_statistics():
    """Batch norm in training mode is ATen's functional batch norm: one pass gives the output and
    the new running statistics, bit for bit eager's, with no copy of the statistics (autograd gets
    them under version counters of their own, so writing the buffers after the call is no error),
    with and without grad."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(inplace=True),
                          nn.Conv2d(6, 4, 3), nn.BatchNorm2d(4, momentum=0.3))
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for step in range(3):
        x = torch.randn(4, 3, 9, 9)
        for m, call in ((ref, ref), (model, jm)):
            m.zero_grad()
            call(x).square().sum().backward()
        for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a, b), (step, name)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=name)
    text = str(fjit.last_traces(jm)[-1])
    assert text.count("torch.ops.aten._native_batch_norm_legit_functional.default(") == 2
    assert "torch.clone" not in text and "var_mean" not in text
    with torch.no_grad():
        x = torch.randn(4, 3, 9, 9)
        torch.testing.assert_close(jm(x), ref(x))
    for a, b in zip(model.buffers(), ref.buffers()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("channels_last", [False, True])
def test_batch_norm_in_the_joint_program_is_atens_backward_on_the_batch_statistics(monkeypatch,
                                                                                   channels_last):
    """In the compiled joint program a training batch norm's backward is ATen's
    native_batch_norm_backward on the batch mean and inverse std its forward returned (what eager's
    node calls; the C kernel computing it on contiguous float32 tensors,
    tests/executors/test_c_batch_norm.py), not a nested autograd call: gradients and running
    statistics as eager's, with a ReLU's and a residual add's backward fused around it, affine or
    not, and on channels-last activations (whose gradients keep that layout)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")     # the joint program, not a measured choice

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4, momentum=0.2)
            self.conv2, self.bn2 = nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4, affine=False)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            return (self.bn2(self.conv2(y)) + x).sin()
    torch.manual_seed(0)
    model = Block()
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for step in range(3):
        x = torch.randn(3, 4, 6, 6).contiguous(memory_format=fmt).requires_grad_()
        x_ref = x.detach().clone().requires_grad_()
        jm(x).square().sum().backward()
        ref(x_ref).square().sum().backward()
        torch.testing.assert_close(x.grad, x_ref.grad)
        # to rounding on the scale of the gradients (the C kernel adds its sums in another order)
        scale = max(q.grad.abs().max().item() for q in ref.parameters())
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6 * scale, msg=name)
        for (name, a), b in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(a, b, msg=f"{step} {name}")
    backward = str(fjit.last_backward_traces(jm)[-1])
    # ATen's on channels-last activations, the C executor's kernel computing it on contiguous ones
    claimed = "a training batch norm by fjit's C kernel (fjit/executors/c/batch_norm.py)'s backward"
    assert backward.count("ATen's native_batch_norm_backward") == (2 if channels_last else 0)
    assert backward.count(claimed) == (0 if channels_last else 2)
    assert "torch autograd's backward" not in backward and "# C kernel" in backward


def test_the_kept_first_form_says_what_every_form_measured(monkeypatch):
    """The joint program kept over torch autograd's form (no form beats it by MARGIN) still
    names the measurement in its stage lines, as a replaced form's do: the zoo runner reads which
    form a model kept from there."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    monkeypatch.setattr(program_choice, "MARGIN", 0.0)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))
    jitted = fjit.jit(model)
    x = torch.randn(4, 8)
    for _ in range(3):
        jitted(x).sum().backward()
    forward, backward = fjit.last_traces(jitted)[-1], fjit.last_backward_traces(jitted)[-1]
    for trace in (forward, backward):
        assert "measured on the second call, the compiled joint program took" in trace.stage, trace.stage
        assert "torch autograd's forward and backward" in trace.stage
    assert not backward.stage.startswith("torch_autograd")
    assert str(backward).splitlines()[0].endswith(backward.stage)
