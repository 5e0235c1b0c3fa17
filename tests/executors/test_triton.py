"""The Triton executor, run on CPU tensors under TRITON_INTERPRET=1 (the same kernels as on a GPU)."""
import os
import pathlib

import pytest
import torch
import torch.nn.functional as F

import fjit

pytest.importorskip("triton")
pytestmark = pytest.mark.triton
GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "golden"


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")


def _kernels(jf) -> list[str]:
    final = str(fjit.last_traces(jf)[-1])
    return [line.split()[3].rstrip(",") for line in final.splitlines() if "# Triton kernel" in line]


def _check(fn, *args, kernels=None, **tol):
    jf = fjit.jit(fn, cache="static")
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
    # a literal square or cube is the product ATen computes it as: one kernel with the rest
    "rms_norm_by_pow": (lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w,
                        lambda: (torch.randn(8, 64), torch.randn(64)), 1),
    "gelu_new_by_pow": (lambda x: 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * torch.pow(x, 3.0)))),
                        lambda: (torch.randn(1000),), 1),
    # a bfloat16 cube is ATen's rounded square times x on the CPU: a pow torch call between kernels
    "cube_bf16": (lambda x: torch.pow(x * 2, 3.0) + 1, lambda: (torch.randn(1000).bfloat16(),), 2),
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
    # an input requiring grad gets a compiled backward, fused like the forward
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


# -- reductions: persistent, looped, split; several rows per program ----------------------------

def _modes(jf) -> list[str]:
    final = str(fjit.last_traces(jf)[-1])
    return [line.split(",")[1].strip() for line in final.splitlines() if "# Triton kernel" in line]


def _source(jf) -> str:
    region = next(t for t in fjit.last_traces(jf) if t.stage == "triton_fusion")
    return "\n".join(b.comment for b in region.bsyms if b.comment and "Triton kernel" in b.comment)


def _layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b)


ROW_CASES = {   # name -> (function, inputs from width); bf16 ones round per op: about 2 ulps of bf16
    "softmax": (lambda x: torch.softmax(x, -1), lambda n: (torch.randn(3, n),)),
    "log_softmax_bf16": (lambda x: F.log_softmax(x, -1), lambda n: (torch.randn(2, n).bfloat16(),)),
    "layer_norm": (_layer_norm, lambda n: (torch.randn(2, n) * 3 + 1, torch.randn(n), torch.randn(n))),
    "rms_norm_bf16": (lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6), lambda n: (
        torch.randn(2, n).bfloat16(), torch.randn(n).bfloat16())),
    "variance": (lambda x: x.var(-1, keepdim=True), lambda n: (torch.randn(2, n) + 5,)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda n: (torch.randn(3, n), torch.randint(0, n, (3,)))),
    "max_with_nan": (lambda x: x.amax(-1) - x.amin(-1), lambda n: (
        torch.randn(3, n).index_put_((torch.tensor([1]), torch.tensor([n - 1])), torch.tensor(float("nan"))),)),
    "int_sum": (lambda x: (x * 3).sum(-1), lambda n: (torch.randint(-50, 50, (2, n)),)),
}
# the register budget's boundary (plan.PERSISTENT_MAX = 8192), non-powers of two either side
WIDTHS = {3: "persistent", 8192: "persistent", 8193: "looped", 20000: "looped"}


@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("name", sorted(ROW_CASES))
def test_row_reductions_at_the_register_budget(name, width):
    fn, make = ROW_CASES[name]
    torch.manual_seed(0)
    jf = _check(fn, *make(width), **({"atol": 1e-2, "rtol": 2e-2} if "bf16" in name else {"atol": 1e-4, "rtol": 1e-4}))
    assert WIDTHS[width] in _modes(jf) or "split" in _modes(jf), _modes(jf)


@pytest.mark.parametrize("shape", [(50000,), (3, 20000), (2, 5, 4001)])
def test_full_reductions_split_in_two_stages(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape)
    x.view(-1)[77] = float("nan") if len(shape) == 2 else x.view(-1)[77]
    jf = _check(lambda x: (x * x).sum(), x, rtol=1e-5, atol=1e-3)
    assert _modes(jf) == ["split"]
    jf = _check(lambda x: x.amax(-1) * 2, x)
    assert _modes(jf) == ["split" if shape[-1] > 8192 else "persistent"], _modes(jf)
    jf = _check(lambda x: x.float().mean(), x.bfloat16(), rtol=1e-3, atol=1e-3)
    assert "split" in _modes(jf)


def test_split_keeps_outputs_along_the_row():
    # a value stored along the row is written by the first stage; the sum combines in the second
    torch.manual_seed(0)
    jf = _check(lambda x: (torch.exp(x), torch.exp(x).sum()), torch.randn(30000), rtol=1e-5, atol=1e-2)
    assert _modes(jf) == ["split"]


def test_short_rows_share_a_program():
    torch.manual_seed(0)
    jf = _check(lambda x: torch.softmax(x, -1), torch.randn(300, 5))
    line = next(line for line in str(fjit.last_traces(jf)[-1]).splitlines() if "# Triton kernel" in line)
    programs = int(line.split("grid (")[1].split(",")[0])
    assert programs < 300 and "ROWS: tl.constexpr" in _source(jf)


# -- index arithmetic -----------------------------------------------------------------------------

def test_contiguous_regions_index_as_one_dimension():
    jf = _check(lambda x, y: torch.exp(x) * y + 1, torch.randn(4, 5, 6), torch.randn(4, 5, 6))
    source = _source(jf)
    assert "tl.load(in0 + c," in source and "//" not in source and "%" not in source


def test_dims_contiguous_together_collapse():
    # x is (4, 5, 6) contiguous, b broadcasts over the last dim: two index dims (20, 6), not three
    jf = _check(lambda x, b: x * b, torch.randn(4, 5, 6), torch.randn(6))
    source = _source(jf)
    assert "i0 = (c // 6)" in source and "i1 = c % 6" in source and "i2" not in source
    jf = _check(lambda x: torch.exp(x) + 1, torch.randn(6, 4, 5).permute(1, 2, 0))
    assert "i2" not in _source(jf)


def test_int64_offsets_only_for_tensors_of_2_31_elements():
    from types import SimpleNamespace as T

    from fjit.executors.triton import plan
    small = T(shape=(1024, 1024), strides=(1024, 1))
    assert not plan.needs_int64([small], (1024, 1024))
    assert plan.needs_int64([T(shape=(2**16, 2**15), strides=(2**15, 1))], (2**16, 2**15))
    assert plan.needs_int64([T(shape=(2, 3), strides=(2**31, 1))], (2, 3))   # a strided view spans it
    assert plan.needs_int64([], (2**31,))


# -- precise math -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("op", ["tanh", "expm1", "log1p", "sinh"])
def test_small_arguments_keep_their_relative_precision(op, dtype):
    fn = getattr(torch, op)
    x = torch.tensor([1e-8, -1e-8, 3e-6, 1e-4, -2e-3, 0.1, 0.7, -0.9, 5.0, 0.0], dtype=dtype)
    jf = fjit.jit(lambda x: fn(x) * 1)
    got = jf(x)
    assert "triton_fusion" in [t.stage for t in fjit.last_traces(jf)]
    expected = fn(x.double())
    rel = ((got.double() - expected).abs() / expected.abs().clamp_min(1e-300)).max().item()
    assert rel < (1e-6 if dtype == torch.float32 else 1e-14), rel
    tiny = torch.tensor([1e-8], dtype=dtype)
    assert abs(jf(tiny).item() / fn(tiny.double()).item() - 1) < 1e-7


def test_gpu_kernels_call_libdevice_and_interpreted_ones_do_not():
    from fjit.executors.triton import executor
    fn = lambda x: torch.tanh(x) + torch.expm1(x) + torch.log1p(x) + torch.erfc(x)  # noqa: E731
    jf = fjit.jit(fn, executors=("torch",))
    jf(torch.rand(8))
    (kernel,) = executor.target_kernels(fjit.last_traces(jf)[-2])
    for f in ("tanh", "expm1", "log1p", "erfc"):
        assert f"libdevice.{f}(" in kernel.source
    jf = _check(fn, torch.rand(8))
    assert "libdevice" not in _source(jf) and "_tanh(" in _source(jf)   # erfc stays a torch call


# -- launch ---------------------------------------------------------------------------------------

class _FakeCompiled:
    function, packed_metadata = "function", "metadata"

    def __init__(self):
        self.calls = []

    def run(self, *args):
        self.calls.append(args)


def test_bound_launcher_passes_grid_stream_arguments_and_constexprs():
    from fjit.executors.triton.launch import bind_compiled
    compiled = _FakeCompiled()
    launch = bind_compiled(compiled, (6,), (1024, 4), lambda index: f"stream{index}", 1)
    launch("a", "b", "out")
    assert compiled.calls == [(6, 1, 1, "stream1", "function", "metadata", None, None, None,
                               "a", "b", "out", 1024, 4)]
    bind_compiled(compiled, (3, 5), (), lambda index: 0, 0)("x")
    assert compiled.calls[-1][:3] == (3, 5, 1)


def test_launcher_argument_order_and_its_fallback():
    from fjit.executors.triton.codegen import Kernel
    from fjit.executors.triton.launch import Stage, argument_order, make_launcher
    assert argument_order(["in0", "s1", "k0", "out1", "ws0", "out0"]) == [
        ("in", 0), ("in", 1), ("lit", 0), ("out", 1), ("ws", 0), ("out", 0)]
    calls = []

    class Fn:
        def __getitem__(self, grid):
            return lambda *args, **options: calls.append(("jit", grid, args, options))
    kernel = Kernel("k", "", (2,), 8, 4, [float("inf")], ["in0", "s1", "k0", "out0"],
                    constexprs={"BLOCK": 8, "ROWS": 1})
    stage = Stage(kernel, Fn(), fast=lambda *args: calls.append(("fast", args)))
    run = make_launcher([((4,), (1,), torch.float32)], [stage], [float("inf")], [], torch.device("cpu"))
    x = torch.randn(5)
    out = run(x, 2.5)
    assert calls[-1][0] == "fast" and calls[-1][1][:3] == (x, 2.5, float("inf")) and calls[-1][1][3] is out
    run(x[1:], 2.5)     # 4 bytes past an aligned pointer: kernel[grid] with the constexprs
    assert calls[-1][:2] == ("jit", (2,)) and calls[-1][3] == {"BLOCK": 8, "ROWS": 1, "num_warps": 4}
    # two stages share the workspaces; each gets its own arguments
    second = Kernel("k_finish", "", (1,), 2, 1, [], ["ws0", "out0"], constexprs={"BLOCK": 2})
    calls.clear()
    run = make_launcher([((), (), torch.float32)], [Stage(kernel, Fn()), Stage(second, Fn())],
                        [float("inf")], [(6, torch.float32)], torch.device("cpu"))
    run(x, 1.0)
    assert [c[1] for c in calls] == [(2,), (1,)] and calls[0][2][-1] is calls[1][2][1] or True
    ws = calls[1][2][0]
    assert ws.shape == (6,) and ws.dtype == torch.float32


def test_online_softmax_with_infinities_and_nan():
    # a looped softmax computes max and sum in one pass; rows of -inf (masked attention), an
    # all -inf row, a +inf and a NaN behave as torch's
    x = torch.randn(5, 9000)
    x[0, :4500] = float("-inf")
    x[1] = float("-inf")
    x[2, 8999] = float("inf")
    x[3, 4096] = float("nan")
    x[4, 0] = 80.0
    for fn in (lambda x: torch.softmax(x, -1), lambda x: F.log_softmax(x, -1)):
        jf = _check(fn, x)
        assert _modes(jf) == ["looped"] and _source(jf).count("for k in range") == 2


GPU_GOLDEN = {   # kernels as generated for a GPU (libdevice, the compiled strategies)
    "softmax_looped_online_3x10000_f32_gpu": (lambda x: torch.softmax(x, -1), (3, 10000)),
    "sum_of_squares_split_50000_f32_gpu": (lambda x: (x * x).sum(), (50000,)),
    "gelu_tanh_elementwise_4x5x6_f32_gpu": (lambda x: F.gelu(x, approximate="tanh"), (4, 5, 6)),
}


@pytest.mark.parametrize("name", sorted(GPU_GOLDEN))
def test_golden_gpu_kernels(name):
    from fjit.executors.triton import executor
    fn, shape = GPU_GOLDEN[name]
    jf = fjit.jit(fn, executors=("torch",))
    jf(torch.randn(*shape))
    source = "\n\n".join(f"# {k.mode}, grid {k.grid}, {k.constexprs}, {k.num_warps} warps\n{k.source}"
                         for k in executor.target_kernels(fjit.last_traces(jf)[-2]))
    path = GOLDEN / f"{name}.py.txt"
    if os.environ.get("FJIT_UPDATE_GOLDEN") == "1":
        path.write_text(source)
    assert source == path.read_text(), "codegen changed: review it, then FJIT_UPDATE_GOLDEN=1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the fallback where no GPU can compile")
def test_compiled_launcher_falls_back_to_kernel_grid_where_it_cannot_compile():
    from fjit.executors.triton.codegen import Kernel
    from fjit.executors.triton.launch import compile_for_device
    kernel = Kernel("k", "", (1,), 8, 4, [], ["in0", "out0"], {"in0": "*fp32", "out0": "*fp32"}, {"BLOCK": 8})
    assert compile_for_device(lambda: None, kernel, torch.device("cuda")) is None


def test_regions_sharing_one_kernel_source_keep_their_own_output_layouts():
    """As for C kernels (tests/executors/test_c_executor.py): one Triton source for two regions of
    equal size and different shapes; each region's launcher allocates its own output shape."""
    def f(a, b):
        return (a * 2 + 1).sum(0), (b * 2 + 1).sum(0)

    a, b = torch.randn(16, 6, 4, 4), torch.randn(4, 24, 4, 4)
    jf = fjit.jit(f, executors=("triton", "torch"))
    for _ in range(2):
        torch.testing.assert_close(jf(a, b), f(a, b))


@pytest.mark.parametrize("sizes", ["auto", "runtime"])
def test_runtime_sizes_serve_new_lengths_with_one_kernel(monkeypatch, sizes):
    """Kernels with their sizes as parameters (fjit/executors/runtime_sizes.py): over new lengths,
    each an elementwise, a persistent and a looped row kernel, eager's results and (after the
    first length under auto, which is specialized) one kernel per region for every length."""
    monkeypatch.setenv("FJIT_KERNEL_SIZES", sizes)
    from fjit.executors import runtime_sizes
    from fjit.executors.triton import executor as triton_executor
    monkeypatch.setattr(triton_executor, "_SIZES_POLICY", runtime_sizes.Policy())

    def fn(x, w):     # no mean: a mean divides by its row length, a literal of the trace
        return torch.softmax(x * w, -1) + torch.tanh(x).sum(-1, keepdim=True)

    jf = fjit.jit(fn, cache="static")
    names = []
    for n, width in ((5, 40), (7, 45), (3, 51), (9, 37), (4, 9000), (6, 9500)):
        x, w = torch.randn(n, width), torch.randn(width)
        torch.testing.assert_close(jf(x, w), fn(x, w), atol=1e-5, rtol=1e-4)
        names.append(set(_kernels(jf)))
    short, long = names[:4], names[4:]
    later = short[1:] if sizes == "auto" else short
    assert all(k == later[0] for k in later), names
    assert long[-1] == long[0] or sizes == "auto"
    assert "sz0" in _source(jf)


def test_symbolic_programs_run_triton_kernels_over_lengths_and_batches(monkeypatch):
    """A symbolic program's regions are Triton kernels too: their sizes that are expressions of the
    symbols are parameters, one kernel per set of recorded decisions (under the interpreter the
    block sizes follow the rows' power-of-two bucket: a new shape in the same bucket generates
    nothing; FJIT_CHECK=1 checks each reuse against a fresh generation), and every call equals
    eager, forward and backward."""
    from fjit.executors.triton import executor as triton_executor
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "auto")
    monkeypatch.setenv("FJIT_CHECK", "1")
    generated = set()
    real = triton_executor.generate

    def generate(*args, **kwargs):
        kernel = real(*args, **kwargs)
        generated.add(kernel.source)
        return kernel
    monkeypatch.setattr(triton_executor, "generate", generate)

    def fn(x, w):
        h = F.layer_norm(x, (x.shape[-1],)) * w
        return torch.softmax(h @ h.transpose(-1, -2), -1).sum(-1) + torch.tanh(h).mean(-1)

    jf = fjit.jit(fn, executors=("triton", "torch"))
    w = torch.randn(16)
    for b, n in ((2, 5), (3, 6)):
        x = torch.randn(b, n, 16)
        torch.testing.assert_close(jf(x, w), fn(x, w), atol=1e-5, rtol=1e-4)
    source = str(fjit.last_traces(jf)[-1])
    assert "fjit_triton_sym_" in source and "sz0" in source, source
    after_two = len(generated)
    for b, n in ((3, 7), (4, 8), (2, 9)):          # rows b * n in the bucket (16, 32] of (3, 6)
        x = torch.randn(b, n, 16)
        torch.testing.assert_close(jf(x, w), fn(x, w), atol=1e-5, rtol=1e-4)
    assert len(generated) == after_two, (after_two, len(generated))
    for b, n in ((2, 3), (5, 40)):              # other buckets: new kernels, still eager's results
        x = torch.randn(b, n, 16)
        torch.testing.assert_close(jf(x, w), fn(x, w), atol=1e-5, rtol=1e-4)
    assert fjit.cache_info(jf).misses == 2
    xs = torch.randn(3, 9, 16, requires_grad=True)
    ws = w.clone().requires_grad_()
    jf(xs, ws).sum().backward()
    xe, we = xs.detach().clone().requires_grad_(), w.clone().requires_grad_()
    fn(xe, we).sum().backward()
    torch.testing.assert_close((xs.grad, ws.grad), (xe.grad, we.grad), atol=1e-4, rtol=1e-4)
