"""The C kernel of a 2-D max pool (fjit/executors/c/max_pool.py): what the compiled joint program's
forward runs for a max pool of a float32 NCHW CPU tensor (its output and the indices its backward
reads), and a forward run without autograd."""
import copy
import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fjit
from fjit.core.ir import TensorVar
from fjit.executors.c import executor as c_executor, max_pool as c_max_pool
from fjit.runtime import max_pool2d_with_indices

pytestmark = [pytest.mark.ckernels, pytest.mark.usefixtures("sync_build"),
              pytest.mark.skipif(c_executor.compiler() is None, reason="no C compiler on PATH")]


@pytest.fixture
def kernel_calls(counted_calls):
    """The kernels' calls, in order (each the binary it ran)."""
    return counted_calls(c_max_pool)


def _var(x) -> TensorVar:
    return TensorVar("x", tuple(x.shape), x.dtype, x.device, tuple(x.stride()), False)


def _hard_values(shape, seed):
    """Small integers (ties in most windows), NaNs and -infs (a window of -inf alone picks its first
    valid position)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=g).float()
    flat = x.view(-1)
    flat[torch.rand(flat.numel(), generator=g) < 0.05] = float("nan")
    flat[torch.rand(flat.numel(), generator=g) < 0.3] = float("-inf")
    return x


def _same(ours, aten):
    (o, i), (ro, ri) = ours, aten
    assert o.shape == ro.shape and o.stride() == ro.contiguous().stride()
    assert torch.equal(i, ri)
    assert torch.equal(o.isnan(), ro.isnan()) and torch.equal(o.nan_to_num(), ro.nan_to_num())


# ResNet's stem pool (the one-run row pass: W = stride x output width), odd sizes (the row by row
# pass), a window without padding, stride 1, dilation, ceil mode with a last partial window,
# a plane of one row, and enough elements for two threads
CASES = [((8, 64, 32, 32), 3, 2, 1, 1, False), ((2, 5, 33, 31), 3, 2, 1, 1, True),
         ((3, 4, 16, 16), 2, 2, 0, 1, False), ((2, 3, 17, 16), 3, 1, 1, 1, False),
         ((2, 3, 20, 19), (3, 2), (2, 1), (1, 0), (2, 3), True), ((1, 2, 1, 9), (1, 3), 2, (0, 1), 1, False),
         ((4, 16, 24, 24), 5, 3, 2, 1, True), ((2, 2, 5, 5), 5, 1, 2, 1, False)]


@pytest.mark.parametrize("shape, kernel, stride, padding, dilation, ceil_mode", CASES)
def test_the_kernel_gives_atens_values_and_indices(shape, kernel, stride, padding, dilation, ceil_mode,
                                                    kernel_calls):
    """Ties pick the first maximum, NaNs the last NaN, a window of -inf its first valid position:
    ATen's NCHW and channels-last kernels' values and indices, exactly."""
    pair = [list(v) if isinstance(v, tuple) else [v, v] for v in (kernel, stride, padding, dilation)]
    kernels = c_executor._written_kernels(c_max_pool)
    for seed in range(3):
        x = _hard_values(shape, seed) if seed else torch.randn(shape)
        assert c_max_pool.fits(_var(x), *pair, ceil_mode)
        _same(kernels.with_indices(x, *pair, ceil_mode),
              torch.ops.aten.max_pool2d_with_indices(x, *pair, ceil_mode))
    assert len(kernel_calls) == 3


def test_random_pools_against_aten(kernel_calls):
    """Pools of random sizes on random planes: every one the kernel takes gives ATen's results."""
    rng = random.Random(0)
    kernels = c_executor._written_kernels(c_max_pool)
    checked = 0
    for _ in range(60):
        k = [rng.randint(1, 4), rng.randint(1, 4)]
        pool = [k, [rng.randint(1, 3), rng.randint(1, 3)], [rng.randint(0, k[0] // 2), rng.randint(0, k[1] // 2)],
                [rng.randint(1, 2), rng.randint(1, 2)], rng.random() < 0.3]
        x = _hard_values((rng.randint(1, 2), rng.randint(1, 3), rng.randint(3, 14), rng.randint(3, 14)), checked)
        try:
            aten = torch.ops.aten.max_pool2d_with_indices(x, *pool)
        except RuntimeError:       # a window larger than the padded input
            continue
        assert c_max_pool.fits(_var(x), *pool)
        _same(kernels.with_indices(x, *pool), aten)
        checked += 1
    assert checked > 40 and len(kernel_calls) == checked


@pytest.mark.parametrize("case", ["float64", "channels_last", "padding_over_half", "wide_output"])
def test_what_the_kernel_does_not_take(case):
    x = torch.randn(2, 3, 8, 8)
    pool = [[3, 3], [2, 2], [1, 1], [1, 1], False]
    if case == "float64":
        x = x.double()
    elif case == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif case == "padding_over_half":
        pool[2] = [2, 2]
    else:
        x = torch.randn(1, 1, 1, 2 * c_max_pool.MAX_OUTPUT_WIDTH + 4)
        pool = [[1, 1], [1, 1], [0, 0], [1, 1], False]
    assert not c_max_pool.fits(_var(x), *pool)


def test_until_the_kernel_is_built_the_runtime_pool_runs():
    """A kernel still building leaves runtime.max_pool2d_with_indices running (ATen's channels-last
    kernel), with ATen's exact results."""
    class Unbuilt:
        fn = fast = error = None
        queued = True
    kernels = c_executor._written_kernels(c_max_pool)
    pool = ([3, 3], [2, 2], [1, 1], [1, 1], False)
    key = ((3, 3), (2, 2), (1, 1), (1, 1))
    built = kernels.binaries.get(key)
    kernels.binaries[key] = Unbuilt()
    try:
        x = _hard_values((2, 4, 9, 9), 1)
        _same(kernels.with_indices(x, *pool), torch.ops.aten.max_pool2d_with_indices(x, *pool))
        _same(max_pool2d_with_indices(x, *pool), torch.ops.aten.max_pool2d_with_indices(x, *pool))
    finally:
        if built is None:
            del kernels.binaries[key]
        else:
            kernels.binaries[key] = built


class Stem(nn.Module):
    """ResNet's stem: convolution, batch norm, in-place ReLU, max pool."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.pool = nn.MaxPool2d(3, 2, 1)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.pool(F.relu(self.bn(self.conv(x)), inplace=True)).amax((2, 3)))


def test_a_model_trained_through_the_joint_program_runs_the_kernel(kernel_calls, monkeypatch):
    """In the compiled joint program the max pool is one kernel call returning its indices, and its
    backward ATen's max_pool2d_with_indices_backward on them: gradients as eager's, each step."""
    monkeypatch.setenv("FJIT_MEASURE", "0")     # the joint program, not a measured choice
    torch.manual_seed(0)
    model = Stem()
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for step in range(3):
        x = torch.randn(8, 3, 32, 32)
        jm(x).square().sum().backward()
        ref(x).square().sum().backward()
        scale = max(q.grad.abs().max().item() for q in ref.parameters())
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6 * scale, msg=f"{step} {name}")
        model.zero_grad(), ref.zero_grad()
    forward, backward = str(fjit.last_traces(jm)[-1]), str(fjit.last_backward_traces(jm)[-1])
    assert "fjit_c_max_pool2d_with_indices(" in forward
    assert "max_pool2d_with_indices_backward" in backward
    assert len(kernel_calls) == 2       # the first call runs the traced ops one by one


def test_a_forward_without_autograd_runs_the_kernel(kernel_calls):
    """Under no_grad the program with kernels calls the kernel for the output alone, as printed;
    the printed program runs as printed."""
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.MaxPool2d(3, 2, 1)).eval()
    jm = fjit.jit(model)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(jm(x), model(x), rtol=0, atol=0)
    text = str(fjit.last_traces(jm)[-1])
    assert "fjit_c_max_pool2d(" in text and kernel_calls
    namespace: dict = {}
    exec(compile(text, "<printed>", "exec"), namespace)
    with torch.no_grad():
        printed = namespace["computation"](*(t.detach() for t in model.parameters()), x)
    torch.testing.assert_close(printed[0], model(x), rtol=0, atol=0)


def test_a_double_backward_through_the_pool():
    """create_graph=True through the joint program's max pool recomputes the forward under
    autograd: the gradient of a gradient norm is eager's."""
    torch.manual_seed(1)
    model = Stem()
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    x = torch.randn(4, 3, 16, 16)
    for m, call in ((model, jm), (ref, ref)):
        for _ in range(2):
            grads = torch.autograd.grad(call(x).square().sum(), list(m.parameters()), create_graph=True)
            penalty = sum(g.square().sum() for g in grads)
            m.zero_grad()
            penalty.backward()
    scale = max(q.grad.abs().max().item() for q in ref.parameters())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):     # batch norm's rounding
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5 * scale, msg=name)


def test_every_pool_size_compiles_its_own_kernel():
    """The sizes are compile-time constants of the C source: two pools, two binaries."""
    kernels = c_executor._written_kernels(c_max_pool)
    x = torch.randn(1, 2, 12, 12)
    for k, s in itertools.product((2, 3), (1, 2)):
        kernels.with_indices(x, [k, k], [s, s], [1, 1], [1, 1], False)
    assert {((k, k), (s, s), (1, 1), (1, 1)) for k in (2, 3) for s in (1, 2)} <= set(kernels.binaries)
    assert len({c_max_pool.source(pool) for pool in kernels.binaries}) == len(kernels.binaries)
