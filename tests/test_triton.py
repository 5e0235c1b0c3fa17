"""The Triton executor, run on CPU tensors under TRITON_INTERPRET=1 (the same kernels as on a GPU)."""
import os
import pathlib

import pytest
import torch
import torch.nn.functional as F

import fjit

pytest.importorskip("triton")
pytestmark = pytest.mark.triton
GOLDEN = pathlib.Path(__file__).parent / "golden"


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")


def _kernels(jf) -> list[str]:
    final = str(fjit.last_traces(jf)[-1])
    return [line.split()[3].rstrip(",") for line in final.splitlines() if "# Triton kernel" in line]


def _check(fn, *args, kernels=None, **tol):
    jf = fjit.jit(fn)
    torch.testing.assert_close(jf(*args), fn(*args), equal_nan=True, **tol)
    if kernels is not None:
        assert len(_kernels(jf)) == kernels, str(fjit.last_traces(jf)[-1])
    return jf


def _rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(16, 100),), 1),
    "log_softmax_bf16": (lambda x: F.log_softmax(x, -1), lambda: (torch.randn(8, 64).bfloat16(),), 1),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (48,), w, b), lambda: (
        torch.randn(6, 48), torch.randn(48), torch.randn(48)), 1),
    "residual_rms_norm_bf16": (lambda x, r, w: _rms(x + r, w), lambda: (
        torch.randn(8, 64).bfloat16(), torch.randn(8, 64).bfloat16(), torch.randn(64).bfloat16()), None),
    "gelu_tanh_chain_bf16": (lambda x: F.gelu(x * 1.5 + 0.25, approximate="tanh"),
                             lambda: (torch.randn(1000).bfloat16(),), 1),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda: (
        torch.randn(12, 40), torch.randint(0, 40, (12,))), None),
    "swiglu": (lambda a, b: F.silu(a) * b, lambda: (torch.randn(4, 96), torch.randn(4, 96)), 1),
    "sum_of_squares": (lambda x: (x * x).sum(), lambda: (torch.randn(37, 19),), 1),
    "transposed_input": (lambda x, y: torch.exp(x) * y, lambda: (
        torch.randn(24, 16).t(), torch.randn(16, 1)), 1),
    "variance": (lambda x: x.var(-1, keepdim=True), lambda: (torch.randn(10, 33),), 1),
    "broadcast_where_int": (lambda x, i: torch.where(i > 2, x, -x) + i, lambda: (
        torch.randn(5, 7), torch.randint(0, 5, (7,))), 2),   # i > 2 has a smaller domain: its own kernel
    "matmul_bias_gelu": (lambda x, w, b: F.gelu(x @ w + b), lambda: (
        torch.randn(8, 16), torch.randn(16, 32), torch.randn(32)), 1),
    "sort_between_regions": (lambda x: torch.sort(torch.sin(x) * 2, -1).values.exp() + 1, lambda: (
        torch.randn(6, 20),), 2),
    "nan_propagating_max": (lambda x: torch.amax(x, -1) + x.amin(-1), lambda: (
        torch.tensor([[1.0, float("nan"), 3.0], [0.5, -2.0, 1.0]]),), 1),
    "half_rounding_per_op": (lambda x, y: (x * y + y) * x, lambda: (
        torch.randn(300).half(), torch.randn(300).half()), 1),
    "zero_dim_and_scalar": (lambda x, s: torch.tanh(x) * s, lambda: (torch.tensor(0.3), 1.5), 1),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_program_matches_eager(name):
    fn, make, kernels = CASES[name]
    torch.manual_seed(0)
    _check(fn, *make(), kernels=kernels)


def test_identical_regions_share_one_kernel():
    a = _check(lambda x: torch.sigmoid(x) * 3, torch.randn(64))
    b = _check(lambda y: torch.sigmoid(y) * 3, torch.randn(64))
    assert _kernels(a) == _kernels(b) and len(_kernels(a)) == 1


def test_inputs_requiring_grad_run_kernels_forward_and_backward():
    # issue 9: an input requiring grad gets a compiled backward, fused like the forward
    x = torch.randn(8, requires_grad=True)
    jf = fjit.jit(lambda x: torch.sin(x) * 2)
    y = jf(x)
    assert _kernels(jf)
    assert "# Triton kernel" in str(fjit.last_backward_traces(jf)[-1])
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(x.detach()) * 2)


def test_not_claimed_on_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("FJIT_TRITON_CPU", "0")
    jf = _check(lambda x: torch.sin(x) * 2, torch.randn(8))
    assert not _kernels(jf)


def test_golden_softmax_kernel():
    jf = _check(lambda x: torch.softmax(x, -1), torch.randn(4, 8))
    region = next(t for t in fjit.last_traces(jf) if t.stage == "triton_fusion")
    source = next(b.comment for b in region.bsyms if b.comment and "Triton kernel" in b.comment)
    path = GOLDEN / "softmax_4x8_f32.py.txt"
    if os.environ.get("FJIT_UPDATE_GOLDEN") == "1":
        path.write_text(source)
    assert source == path.read_text(), "codegen changed: review it, then FJIT_UPDATE_GOLDEN=1"
