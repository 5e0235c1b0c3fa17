"""torch entry points fjit traces in its own terms (frontend/library_calls.py): associative_scan is
recorded as the sequential scan it defines, each step's combine fused with its neighbours, where
torch's CPU form is a vmap per level that fjit could only run opaque; it agrees with torch's own
scan in values and gradients, on pytrees, any dim, reversed, and with a combine that is not
elementwise; torch's argument errors stay torch's; a scan longer than SEQUENTIAL_SCAN_MAX keeps
torch's form; and nothing of this is left installed once the trace ends.  An autograd.Function's
forward is traced into prims and its own backward recorded in the joint program, unless its
forward does not trace strictly (then it stays opaque) or its backward does not (then the function
keeps torch autograd)."""
from __future__ import annotations

import sys

import pytest
import torch
from torch._higher_order_ops.associative_scan import associative_scan as torch_scan

from custom_functions import TanhGelu

import fjit

from fjit.frontend import library_calls, transforms

_MODULE = sys.modules["torch._higher_order_ops.associative_scan"]


def _scan(*args, **kwargs):
    # Looked up at call time, as transformers' Mamba does: the name fjit replaces while tracing.
    return _MODULE.associative_scan(*args, **kwargs)


def linear_recurrence(left, right):
    """(a, b) pairs of h -> a * h + b, composed: Mamba's combine."""
    a_left, b_left = left
    a_right, b_right = right
    return a_left * a_right, a_right * b_left + b_right


def _leaves(n=7, dim=2, requires_grad=False):
    g = torch.Generator().manual_seed(0)
    shape = [2, 3, 4, 5]
    shape[dim] = n
    a = torch.rand(shape, generator=g) * 0.9
    b = torch.randn(shape, generator=g)
    return a.requires_grad_(requires_grad), b.requires_grad_(requires_grad)


@pytest.mark.parametrize("dim", [2, 0, -1])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_linear_recurrence_scan_matches_torch_in_values_and_gradients(dim, reverse):
    def f(a, b):
        _, h = _scan(linear_recurrence, (a, b), dim=dim, reverse=reverse, combine_mode="generic")
        return (h * h).sum()

    a, b = _leaves(dim=dim, requires_grad=True)
    a2, b2 = (t.detach().clone().requires_grad_() for t in (a, b))
    expected = f(a, b)
    expected.backward()
    jf = fjit.jit(f)
    got = jf(a2, b2)
    got.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(a2.grad, a.grad)
    torch.testing.assert_close(b2.grad, b.grad)
    trace = str(fjit.last_traces(jf)[0])
    # torch's own form moves the scanned dim first and calls a vmap, opaque to fjit, at each level
    assert "movedim" not in trace and "torch fallback" not in trace, trace


def test_the_scan_steps_fuse_into_kernels_instead_of_opaque_calls():
    def f(a, b):
        return _scan(linear_recurrence, (a, b), dim=2, combine_mode="generic")[1]

    a, b = _leaves()
    jf = fjit.jit(f)
    torch.testing.assert_close(jf(a, b), f(a, b))
    final = str(fjit.last_traces(jf)[-1])
    assert "fjit_c_" in final and "torch fallback" not in final, final


def test_a_pytree_of_leaves_and_a_cumulative_sum():
    def f(x):
        return _scan(lambda left, right: {"s": left["s"] + right["s"], "m": torch.maximum(left["m"], right["m"])},
                     {"s": x, "m": x.flip(0)}, dim=1, combine_mode="generic")

    x = torch.randn(3, 9, 2)
    got = fjit.jit(f)(x)
    torch.testing.assert_close(got["s"], x.cumsum(1))
    torch.testing.assert_close(got["m"], x.flip(0).cummax(1).values)


def test_a_combine_that_is_not_elementwise_gets_one_step_slices():
    """A product of 2x2 matrices: the combine sees [batch, 2, 2] slices, as under torch's vmap."""
    def f(m):
        return _scan(lambda left, right: right @ left, m, dim=1, combine_mode="generic")

    m = torch.randn(3, 6, 2, 2, dtype=torch.float64)
    torch.testing.assert_close(fjit.jit(f)(m), torch_scan(lambda left, right: right @ left, m, dim=1, combine_mode="generic"))


def test_torchs_argument_errors_stay_torchs():
    def pointwise_on_cpu(x):
        return _scan(torch.add, x, dim=0)       # combine_mode="pointwise" wants CUDA tensors

    with pytest.raises(ValueError, match="CUDA or XPU"):
        fjit.jit(pointwise_on_cpu)(torch.ones(4))
    with pytest.raises(ValueError, match="CUDA or XPU"):
        pointwise_on_cpu(torch.ones(4))


def test_a_scan_longer_than_the_sequential_limit_keeps_torchs_form(monkeypatch):
    monkeypatch.setattr(library_calls, "SEQUENTIAL_SCAN_MAX", 4)

    def f(a, b):
        return _scan(linear_recurrence, (a, b), dim=2, combine_mode="generic")[1]

    a, b = _leaves(n=6)
    jf = fjit.jit(f)
    torch.testing.assert_close(jf(a, b), f(a, b))
    assert "movedim" in str(fjit.last_traces(jf)[0])


def test_nothing_stays_replaced_after_the_trace():
    def f(a, b):
        return _scan(linear_recurrence, (a, b), dim=2, combine_mode="generic")[1]

    fjit.jit(f)(*_leaves())
    assert _MODULE.associative_scan is torch_scan
    assert torch._higher_order_ops.associative_scan is torch_scan
    assert torch.autograd.Function.__dict__["apply"] is library_calls._APPLY
    for (home, attr), original in transforms._ORIGINALS.items():     # torch.func's entries
        assert getattr(home, attr) is original


# -- autograd.Function: its forward traced into prims, its own backward in the joint program ------

class _RoundThrough(torch.autograd.Function):
    """A straight-through round: the backward is not the forward's derivative (which is 0)."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.scale = scale
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, g):
        return g * 1.0, None


class _ScaledPair(torch.autograd.Function):
    """Two outputs, a tensor kept as a ctx attribute, needs_input_grad, a None gradient."""

    @staticmethod
    def forward(ctx, x, y, k):
        ctx.y, ctx.k = y, k
        return x * y * k, x.exp()

    @staticmethod
    def backward(ctx, g, h):
        gy = (g * 2).sum(0) if ctx.needs_input_grad[1] else None
        return g * ctx.y * ctx.k + h * 3, gy, None


class _Printing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        print("forward ran")
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


class _BackwardInNumpy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.from_numpy(x.detach().numpy() * 2)


def _grads(fn, *args):
    jf = fjit.jit(fn)
    for _ in range(2):
        got = jf(*args)
        got_grads = torch.autograd.grad(got, args)
    want = fn(*args)      # (kernels' tanh and exp round otherwise than ATen's: relative 1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_grads, torch.autograd.grad(want, args), rtol=1e-4, atol=1e-5)
    return jf


def test_a_functions_own_backward_is_the_joint_programs(monkeypatch):
    """A straight-through round (gradient 1, where differentiating round gives 0), BLOOM's GeLU
    and a Function of two outputs with ctx attributes: eager's values and gradients, the forward's
    prims fused into kernels and the backward's own ops in the compiled backward, where the
    Function was an opaque op torch autograd recorded (a nested autograd call per step)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 16, generator=g, requires_grad=True)
    y = torch.randn(16, generator=g, requires_grad=True)

    def f(x, y):
        a = TanhGelu.apply(x * 3)       # (round's input an input: no rounding of a kernel flips it)
        b, c = _ScaledPair.apply(_RoundThrough.apply(x, 4.0) + a, y, 0.5)
        return (b.sin() + c.cos()).sum()
    jf = _grads(f, x, y)
    forward, backward = str(fjit.last_traces(jf)[-1]), fjit.last_backward_traces(jf)[-1]
    assert "runs under torch autograd" not in str(fjit.last_traces(jf)[0])
    assert "torch_autograd" not in backward.stage and "torch autograd's backward" not in str(backward)
    assert "C kernel" in forward and "C kernel" in str(backward)


def test_a_function_whose_forward_does_not_trace_strictly_stays_opaque(monkeypatch, capsys):
    """A forward with a side effect (print) runs for real on every call, as eager's: the op stays
    the opaque call torch autograd records, with no sharp edge raised for it."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(4, 5, requires_grad=True)
    jf = _grads(lambda x: (_Printing.apply(x) * x).sum(), x)
    traced = str(fjit.last_traces(jf)[0])
    assert "torch fallback" in traced and "prims.mul(x, 2)" not in traced    # no prims under it
    capsys.readouterr()
    jf(x)
    assert capsys.readouterr().out == "forward ran\n"


def test_a_function_whose_backward_does_not_trace_keeps_torch_autograd(monkeypatch):
    """A backward that leaves torch (numpy) cannot be recorded on proxies: the function runs
    under torch autograd, which calls the real backward, with eager's gradients."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(4, 5, requires_grad=True)
    jf = _grads(lambda x: (_BackwardInNumpy.apply(x * 2) + x).tanh().sum(), x)
    assert "torch_autograd" in fjit.last_backward_traces(jf)[-1].stage


class _ZerosForY(torch.autograd.Function):
    """A backward that makes a gradient with a factory (no traced operand)."""

    @staticmethod
    def forward(ctx, x, y):
        return x * y

    @staticmethod
    def backward(ctx, g):
        return g * 2, torch.zeros(4, 5)


def test_a_backward_returning_an_untraced_tensor_keeps_torch_autograd(monkeypatch):
    """torch.zeros(...) in a backward is made outside the trace (no proxy operand): it cannot be a
    value of the compiled backward, so the function keeps torch autograd rather than dropping it."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(4, 5, generator=g, requires_grad=True) for _ in range(2))
    jf = _grads(lambda x, y: (_ZerosForY.apply(x * 2, y) + y).tanh().sum(), x, y)
    assert "torch_autograd" in fjit.last_backward_traces(jf)[-1].stage


def test_a_function_called_under_no_grad_runs_in_that_mode(monkeypatch):
    """A grad-mode change made just before the Function is recorded before its op (as dispatch
    records it before any op): under no_grad the result needs no gradient, as in eager."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(4, 5, requires_grad=True)

    def f(x):
        with torch.no_grad():
            frozen = TanhGelu.apply(x)
        return frozen.requires_grad, (TanhGelu.apply(x) * frozen).sum()
    flag, total = fjit.jit(f)(x)
    assert flag is False
    torch.testing.assert_close(torch.autograd.grad(total, x), torch.autograd.grad(f(x)[1], x),
                               rtol=1e-4, atol=1e-5)


class _SoftclipSeparate(torch.autograd.Function):
    """The setup_context style: forward takes no ctx; setup_context saves an input and the output."""

    @staticmethod
    def forward(x, limit):
        return limit * torch.tanh(x / limit)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, limit = inputs
        ctx.save_for_backward(output)
        ctx.limit = limit

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - (y / ctx.limit) ** 2), None


def test_a_setup_context_function_is_traced_with_its_own_backward(monkeypatch):
    """forward(x, limit) without ctx and setup_context(ctx, inputs, output) filling it: the
    forward's prims and the backward's ops are compiled, as for an old-style Function, where the
    op stayed the opaque call torch autograd records."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    jf = _grads(lambda x: (_SoftclipSeparate.apply(x * 3, 2.0) * x).sum(), x)
    assert "torch fallback" not in str(fjit.last_traces(jf)[0])
    backward = fjit.last_backward_traces(jf)[-1]
    assert "torch_autograd" not in backward.stage and "C kernel" in str(backward)


class _NoneWhenUnused(torch.autograd.Function):
    """ctx.set_materialize_grads(False): the backward gets None for an output nothing used."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        return x * 2, x * 3

    @staticmethod
    def backward(ctx, g, h):
        assert h is None, "h was materialized"
        return g * 2 + (0 if h is None else h * 3)


def test_a_function_that_does_not_materialize_grads_gets_none_for_an_unused_output(monkeypatch):
    """set_materialize_grads(False): an output no gradient reaches is None in the backward, as in
    eager (zeros were handed before: a backward testing `h is None` took the other branch)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(4, 5, requires_grad=True)
    jf = _grads(lambda x: (_NoneWhenUnused.apply(x * 2)[0] * x).sum(), x)
    assert "torch_autograd" not in fjit.last_backward_traces(jf)[-1].stage


class _MaskedCumulation(torch.autograd.Function):
    """YOSO's attention (transformers' YosoCumulation): saves the mask it was given, an argument,
    beside values its forward made."""

    @staticmethod
    def forward(ctx, mask, q, v):
        weights = torch.sigmoid(q @ q.transpose(-1, -2)) * mask[:, :, None]
        ctx.save_for_backward(mask, weights, v)
        return weights @ v

    @staticmethod
    def backward(ctx, g):
        mask, weights, v = ctx.saved_tensors
        gw = (g @ v.transpose(-1, -2)) * mask[:, :, None]
        return None, None, weights.transpose(-1, -2) @ g + 0 * gw.sum()


def _two_layers(x, attention_mask):
    for _ in range(2):
        # each layer converts the mask again: CSE makes the second layer's mask the first's
        mask = attention_mask.int()
        x = torch.tanh(_MaskedCumulation.apply(mask, x, x * 2) + x)
    return x.sum()


def test_a_functions_saved_argument_renamed_by_the_passes_is_read_under_its_new_name(monkeypatch):
    """The second layer's mask, saved by its Function, is merged into the first's by CSE; the
    backward read it under its traced name, so the joint forward returned a name no line defines
    (YOSO: NameError on its second call, where the measured choice runs the joint program)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 4, generator=g, requires_grad=True)
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, -2:] = 0
    jf = fjit.jit(_two_layers)
    for _ in range(2):
        got, = torch.autograd.grad(jf(x, mask), x)
    want, = torch.autograd.grad(_two_layers(x, mask), x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert "torch_autograd" not in fjit.last_backward_traces(jf)[-1].stage


class _ForwardWithoutGrad(torch.autograd.Function):
    """A forward that turns gradients off inside, as Dynamo's autograd_function_apply graphs do."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        with torch.no_grad():
            return x * x * 3

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * 6 * x


def test_a_function_whose_forward_turns_gradients_off_keeps_its_gradient(monkeypatch):
    """apply makes the outputs differentiable whatever the forward's grad mode: traced into prims,
    the outputs needed no gradient and the joint program would drop every gradient before them.
    The Function stays one opaque op, and the gradients are eager's on every call."""
    monkeypatch.setenv("FJIT_MEASURE", "0")

    def f(x, w):
        return (_ForwardWithoutGrad.apply(x @ w) + 1).tanh().sum()
    jf = fjit.jit(f)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 6, generator=g), torch.randn(6, 6, generator=g, requires_grad=True)
    for _ in range(3):
        torch.testing.assert_close(torch.autograd.grad(jf(x, w), w), torch.autograd.grad(f(x, w), w))
    apply, = [b for b in fjit.last_traces(jf)[0].bsyms if "_ForwardWithoutGrad" in b.sym.qualname]
    assert not apply.subsymbols       # opaque: its forward's prims are not the op's
