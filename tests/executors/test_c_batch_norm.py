"""The C kernels of a training batch norm (fjit/executors/c/batch_norm.py): what the compiled joint
program runs for ATen's functional batch norm and its backward on float32 NCHW CPU tensors."""
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fjit
from fjit.executors.c import batch_norm as c_batch_norm, executor as c_executor

pytestmark = [pytest.mark.ckernels, pytest.mark.usefixtures("sync_build"),
              pytest.mark.skipif(c_executor.compiler() is None, reason="no C compiler on PATH")]

ATEN_FORWARD = torch.ops.aten._native_batch_norm_legit_functional.default
ATEN_BACKWARD = torch.ops.aten.native_batch_norm_backward.default


@pytest.fixture
def kernel_calls(counted_calls):
    """The kernels' calls, in order (each the binary it ran)."""
    return counted_calls(c_batch_norm)


def _relative_error(value, reference):
    return ((value.double() - reference).norm() / reference.norm().clamp_min(1e-300)).item()


# runs shorter than 16 (the tail alone), of 16 (one vector), with a tail, longer than a fold
# block (SUM_BLOCK), a 2-D input, a 3-D one, and enough elements for two threads
SHAPES = [(8, 5, 2, 2), (4, 3, 4, 4), (3, 2, 7, 5), (2, 3, 40, 41), (6, 5), (4, 7, 9), (8, 64, 8, 8)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", [True, False])
def test_the_kernels_are_as_accurate_as_atens_against_float64(shape, affine, kernel_calls):
    """Output, batch statistics, running statistics and the three gradients of values far from
    zero mean (where a one-pass variance would lose digits), against ATen's float64 results:
    within float32's tolerance and within a small factor of ATen's own float32 error."""
    kernels = c_executor._written_kernels(c_batch_norm)
    g = torch.Generator().manual_seed(sum(shape))
    c = shape[1]
    x = torch.randn(shape, generator=g) * 3 + 40
    grad = torch.randn(shape, generator=g)
    w, b = (torch.randn(c, generator=g), torch.randn(c, generator=g)) if affine else (None, None)
    rm, rv = torch.randn(c, generator=g), torch.rand(c, generator=g) + 0.5
    args64 = [t.double() if t is not None else None for t in (x, w, b, rm, rv)]
    ref = ATEN_FORWARD(*args64, True, 0.1, 1e-5)
    mask = [True, affine, affine]
    layouts = [x.stride(), (1,) if affine else None, (1,) if affine else None]
    ref_grads = ATEN_BACKWARD(grad.double(), args64[0], args64[1], None, None, ref[1], ref[2], True, 1e-5, mask)
    with torch.no_grad():
        ours = kernels.forward(x, w, b, rm, rv, True, 0.1, 1e-5)
        aten = ATEN_FORWARD(x, w, b, rm, rv, True, 0.1, 1e-5)
        our_grads = kernels.backward(grad, x, w, ours[1], ours[2], 1e-5, mask, layouts)
        aten_grads = ATEN_BACKWARD(grad, x, w, None, None, aten[1], aten[2], True, 1e-5, mask)
    assert kernel_calls == list(kernels.binaries)
    for name, value, theirs, reference in zip(
            ["out", "mean", "invstd", "running_mean", "running_var", "grad_x", "grad_w", "grad_b"],
            (*ours, *our_grads), (*aten, *aten_grads), (*ref, *ref_grads)):
        if reference is None:
            assert value is None, name
            continue
        assert value.dtype == torch.float32 and value.shape == reference.shape and value.is_contiguous(), name
        torch.testing.assert_close(value.double(), reference, rtol=1e-5, atol=1e-5, msg=name)
        assert _relative_error(value, reference) <= 4 * max(_relative_error(theirs, reference), 1e-7), name


def test_the_gradients_not_asked_for_are_none(kernel_calls):
    kernels = c_executor._written_kernels(c_batch_norm)
    x, grad = torch.randn(4, 3, 5, 5), torch.randn(4, 3, 5, 5)
    w, b = torch.randn(3), torch.randn(3)
    with torch.no_grad():
        _, mean, invstd, _, _ = kernels.forward(x, w, b, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5)
        for mask in ([True, False, False], [False, True, True], [False, False, True]):
            layouts = [x.stride() if mask[0] else None, (1,) if mask[1] else None, (1,) if mask[2] else None]
            ours = kernels.backward(grad, x, w, mean, invstd, 1e-5, mask, layouts)
            aten = ATEN_BACKWARD(grad, x, w, None, None, mean, invstd, True, 1e-5, mask)
            for mine, theirs, wanted in zip(ours, aten, mask):
                assert (mine is None) == (not wanted)
                if wanted:
                    torch.testing.assert_close(mine, theirs)
    assert len(kernel_calls) == 4


def _runs_as_eager(layer, ref, x):
    """(fjit.jit(layer), its printed program) after three no-grad training calls that give `ref`'s
    outputs and running statistics."""
    jl = fjit.jit(layer)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(jl(x), ref(x))
    for a, b in zip(layer.buffers(), ref.buffers()):
        torch.testing.assert_close(a, b)
    return jl, str(fjit.last_traces(jl)[-1])


@pytest.mark.parametrize("case", ["float32", "float64", "channels_last", "kernels_off"])
def test_the_executor_claims_the_batch_norms_the_kernels_take(case, monkeypatch):
    """A training batch norm run without autograd: a float32 contiguous one calls the kernel (as
    the printed program says), another dtype or layout, or C kernels off, ATen's op; each gives
    eager's output and running statistics."""
    if case == "kernels_off":
        monkeypatch.setenv("FJIT_C_KERNELS", "0")
    layer = nn.BatchNorm2d(6)
    ref = copy.deepcopy(layer)
    x = torch.randn(4, 6, 5, 5) * 2 + 3
    if case == "float64":
        layer, ref, x = layer.double(), ref.double(), x.double()
    elif case == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    jl, text = _runs_as_eager(layer, ref, x)
    assert ("fjit_c_batch_norm_forward(" in text) == (case == "float32")
    assert ("_native_batch_norm_legit_functional" in text) == (case != "float32")
    # the printed program runs as printed, importing the kernel from fjit.runtime by its name
    namespace: dict = {}
    exec(compile(text, "<printed>", "exec"), namespace)
    inputs = [t.detach().clone() for t in (*layer.parameters(), *layer.buffers(), x)]
    with torch.no_grad():
        printed = namespace["computation"](*inputs)
        torch.testing.assert_close(printed[0], ref(x))


@pytest.mark.parametrize("shape, taken", [((32, 16), False), ((4, 16, 3), False), ((4, 16, 4), True),
                                          ((4, 16, 2, 2), True), ((4, 16, 1, 1), False)])
def test_the_kernels_take_runs_of_min_run_values(shape, taken):
    """A batch norm whose channels hold runs of fewer than MIN_RUN values (BatchNorm1d over rows:
    runs of one) is ATen's: the kernels walk a channel's runs, a strided walk over rows of one
    value (3.7-6.6x ATen's time).  Either way, eager's output and running statistics."""
    layer = nn.BatchNorm1d(16) if len(shape) < 4 else nn.BatchNorm2d(16)
    ref = copy.deepcopy(layer)
    x = torch.randn(shape) * 2 + 3
    assert ("fjit_c_batch_norm_forward(" in _runs_as_eager(layer, ref, x)[1]) == taken


def test_a_model_trained_through_the_joint_program_runs_the_kernels(kernel_calls, monkeypatch):
    """fjit.jit(model) in the compiled joint program: every training batch norm's forward and
    backward is a kernel call, and gradients and running statistics match eager's over steps."""
    monkeypatch.setenv("FJIT_MEASURE", "0")     # the joint program, not a measured choice

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
            self.head = nn.Linear(8, 5)

        def forward(self, x):
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)) + y)
            return self.head(y.mean((2, 3)))
    torch.manual_seed(0)
    model = Net()
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for step in range(3):
        x, target = torch.randn(4, 3, 10, 10), torch.randint(0, 5, (4,))
        F.cross_entropy(jm(x), target).backward()
        F.cross_entropy(ref(x), target).backward()
        assert_same_gradients(model, ref)
        for (name, a), b in zip(model.named_buffers(), ref.buffers()):
            torch.testing.assert_close(a, b, msg=f"{step} {name}")
        model.zero_grad(), ref.zero_grad()
    # the first call runs the traced ops one by one (it records the program)
    forward_kernel, backward_kernel = c_executor._written_kernels(c_batch_norm).binaries
    assert kernel_calls.count(forward_kernel) == 2 * 2 and kernel_calls.count(backward_kernel) == 2 * 2


def assert_same_gradients(model, ref):
    """Each parameter's gradient as eager's, to float32 rounding on the scale of the model's
    gradients: a batch norm's sums, added in another order, move every gradient before it by a
    few units in the last place of the largest (and a convolution bias just before a batch norm
    has a gradient of rounding noise alone, zero in exact arithmetic)."""
    scale = max(q.grad.abs().max().item() for q in ref.parameters())
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6 * scale, msg=name)


@pytest.mark.parametrize("lost_to_fork", [False, True])
def test_until_the_kernels_are_built_atens_ops_run(lost_to_fork):
    """A kernel still building (the background mode's first calls) leaves ATen's ops running, with
    their exact results; one whose build was lost to fork is queued again by the call."""
    class Unbuilt:
        fn = fast = error = None
        queued = not lost_to_fork

        def __init__(self, kernel):
            self.kernel = kernel
    requeued = []
    kernels = c_batch_norm.Kernels(Unbuilt("forward"), Unbuilt("backward"), requeue=requeued.append)
    x, grad = torch.randn(4, 3, 5, 5), torch.randn(4, 3, 5, 5)
    w, b, rm, rv = torch.randn(3), torch.randn(3), torch.zeros(3), torch.ones(3)
    with torch.no_grad():
        ours = kernels.forward(x, w, b, rm, rv, True, 0.1, 1e-5)
        aten = ATEN_FORWARD(x, w, b, rm, rv, True, 0.1, 1e-5)
        grads = kernels.backward(grad, x, w, aten[1], aten[2], 1e-5, [True] * 3, [x.stride(), (1,), (1,)])
        aten_grads = ATEN_BACKWARD(grad, x, w, None, None, aten[1], aten[2], True, 1e-5, [True] * 3)
    for mine, theirs in zip((*ours, *grads), (*aten, *aten_grads)):
        assert torch.equal(mine, theirs)
    assert requeued == (["forward", "backward"] if lost_to_fork else [])


class ConvBatchNorm(nn.Module):
    """A convolution, a batch norm and a max pool: one fusible prim (the ReLU) besides them."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)

    def forward(self, x):
        return F.max_pool2d(F.relu(self.bn(self.conv(x))), 3, 2, 1)


@pytest.mark.parametrize("size", [4, 32])
def test_a_batch_norm_the_kernels_take_counts_toward_a_joint_program(size, monkeypatch):
    """The joint program's worth rule counts a batch norm the kernels take, of PARALLEL_MIN
    elements or more, as the prims it replaces: a CNN block whose only fusible prim is its ReLU
    gets a joint program at [8, 16, 32, 32], and keeps torch autograd at [8, 16, 4, 4]."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    model = ConvBatchNorm()
    jm = fjit.jit(model)
    x = torch.randn(8, 3, size, size)
    for _ in range(2):
        jm(x).sum().backward()
    stage = fjit.last_backward_traces(jm)[-1].stage
    big = 8 * 16 * size * size >= c_batch_norm.PARALLEL_MIN
    assert big == (size == 32)
    assert ("not worth a joint program" in stage) == (not big)
    assert ("fjit_c_batch_norm_backward(" in str(fjit.last_backward_traces(jm)[-1])) == big


class _StandardizedConv(nn.Conv2d):
    """timm's ScaledStdConv2d: each call normalizes the filter bank by a batch norm that keeps no
    running statistics (a weight standardization), scaled by a learned gain."""

    def __init__(self, cin, cout):
        super().__init__(cin, cout, 3, padding=1)
        self.gain = nn.Parameter(torch.full((cout,), 0.8))

    def forward(self, x):
        w = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                         weight=self.gain, training=True, momentum=0.0, eps=1e-6).reshape_as(self.weight)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


class _NoStatistics(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = _StandardizedConv(3, 16), _StandardizedConv(16, 16)
        self.norm = nn.BatchNorm2d(16, track_running_stats=False)

    def forward(self, x):
        y = F.gelu(self.conv1(x))
        return (F.relu(self.norm(self.conv2(y))) + y).mean((2, 3))


def test_a_batch_norm_without_running_statistics_is_atens_functional_one(kernel_calls, monkeypatch):
    """A training batch norm that keeps no running statistics (a weight standardization, a
    BatchNorm of track_running_stats=False) is traced as ATen's functional batch norm over
    statistics nothing reads, not as a torch call autograd records: the joint program is built
    and the kernels run its forward and backward; outputs and gradients are eager's.  A float16
    one stays the torch call."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    torch.manual_seed(0)
    model = _NoStatistics()
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for step in range(3):
        x = torch.randn(4, 3, 12, 12)
        out, expected = jm(x), ref(x)
        torch.testing.assert_close(out, expected, msg=str(step))
        (out * out).sum().backward()
        (expected * expected).sum().backward()
        assert_same_gradients(model, ref)
        model.zero_grad(), ref.zero_grad()
    forward = str(fjit.last_traces(jm)[0])
    assert "_native_batch_norm_legit_functional" in forward and "functional.batch_norm(" not in forward
    backward = fjit.last_backward_traces(jm)[-1]
    assert "torch_autograd" not in backward.stage and "fjit_c_batch_norm_backward(" in str(backward)
    forward_kernel, backward_kernel = c_executor._written_kernels(c_batch_norm).binaries
    assert kernel_calls.count(forward_kernel) == 3 * 2 and kernel_calls.count(backward_kernel) == 3 * 2

    half = fjit.jit(lambda v: F.batch_norm(v, None, None, training=True))
    v = torch.randn(4, 3, 5, dtype=torch.float16)
    torch.testing.assert_close(half(v), F.batch_norm(v, None, None, training=True))
    assert "functional.batch_norm(" in str(fjit.last_traces(half)[0])
