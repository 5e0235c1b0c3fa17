"""Every kind of op a model calls under autocast traces with eager's dtypes and values.

An op autocast can change (one with a floating tensor other than float64) is probed: torch's own
autocast kernels run on storage-less tensors whose kernels below autocast are meta kernels, so the
probe must never need data, whatever the op asks of its device (a copy to a device, a factory
given one, a tensor made inside a custom autograd.Function's forward).  An op autocast leaves
alone (token ids, masks, float64, a size) is traced as without autocast, with no probe.
"""
import copy
import warnings

import pytest
import torch

import fjit
import fjit.frontend.modes as modes
from fjit.core.ir import Tag

BF16_ULPS = 4 * torch.finfo(torch.bfloat16).eps


class _MoveAndScale(torch.autograd.Function):
    """A forward that makes tensors on its input's device and moves its autocast result there, as
    library kernels written as autograd.Functions do."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        h = x @ w
        scale = torch.full(h.shape, 2.0, device=x.device) * h.new_ones(h.shape)
        return h.to(device=x.device, dtype=x.dtype) * scale

    @staticmethod
    def backward(ctx, g):
        (w,) = ctx.saved_tensors
        return (g * 2) @ w.T, None


def _inplace(x, w, ids):
    h = x @ w
    h.add_(1)
    h.mul_(x[:, :1])
    h[0] = x[0, 0]
    return h


# x: f32 [3, 4] requiring grad, w: f32 [4, 5], ids: int64 [3, 5]; `x @ w` is bf16 under autocast
OPS = {
    # device and dtype moves
    "to_device_and_dtype": lambda x, w, ids: (x @ w).to(device=x.device, dtype=torch.float32),
    "to_device_and_bool": lambda x, w, ids: (x @ w).to(device=x.device, dtype=torch.bool),
    "to_other": lambda x, w, ids: (x @ w).to(x),
    "to_copy": lambda x, w, ids: (x @ w).to("cpu", copy=True),
    "cpu": lambda x, w, ids: (x @ w).cpu() + x.cpu()[:, :1],
    "type": lambda x, w, ids: (x @ w).type(torch.float32) * x.type(torch.bfloat16)[:, :1],
    "float_and_bfloat16": lambda x, w, ids: (x @ w).float() + x.bfloat16().float()[:, :1],
    # factories
    "ones": lambda x, w, ids: torch.ones(3, 5, device=x.device) + x @ w,
    "new_ones": lambda x, w, ids: (x @ w).new_ones(3, 5) * x.new_ones((3, 1), device=x.device) + x @ w,
    "full": lambda x, w, ids: torch.full((3, 5), 2.0, device=x.device) * (x @ w),
    "arange": lambda x, w, ids: torch.arange(5, device=x.device) * (x @ w),
    "zeros_like": lambda x, w, ids: torch.zeros_like(x @ w, device=x.device) + x @ w,
    # in-place ops on intermediates, views
    "in_place": _inplace,
    "views": lambda x, w, ids: (x @ w).view(-1)[2:].unsqueeze(0).transpose(0, 1)[..., 0],
    # a custom autograd.Function
    "autograd_function": lambda x, w, ids: _MoveAndScale.apply(x, w) + x[:, :1],
    # ops with non-tensor outputs, and several outputs
    "sizes": lambda x, w, ids: (x @ w) * (x @ w).size(-1) * (x @ w).element_size() * (x @ w).dim(),
    "tuple_outputs": lambda x, w, ids: torch.max(x @ w, 1).values[:, None] + torch.split(x @ w, 2, 1)[0].sum(),
    # masks and ids next to autocast values
    "mask": lambda x, w, ids: (x @ w).masked_fill(ids.to(device=x.device, dtype=torch.bool), -1e4),
}


def _run(f, x, w, ids):
    """f's output and x's gradient, all under bf16 autocast as a user's training step."""
    x = x.detach().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(x, w, ids)
        grad = torch.autograd.grad(out.float().sum(), x)[0] if out.requires_grad else None
    return out, grad


@pytest.mark.parametrize("name", OPS)
def test_op_under_autocast_matches_eager(name):
    x, w, ids = torch.randn(3, 4), torch.randn(4, 5), torch.randint(0, 2, (3, 5))
    want, want_grad = _run(OPS[name], x, w, ids)
    got, got_grad = _run(fjit.jit(OPS[name]), x, w, ids)
    assert got.dtype == want.dtype and got.device == want.device
    torch.testing.assert_close(got, want)
    assert (got_grad is None) == (want_grad is None)
    if want_grad is not None:     # bf16 values, summed in another order by the compiled backward
        torch.testing.assert_close(got_grad, want_grad, rtol=1.6e-2, atol=1.6e-2)


def test_autocast_block_inside_the_function_moves_devices():
    def f(x, w, mask):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = x @ w
            keep = mask.to(device=h.device, dtype=torch.bool)
            return h.to(device=x.device, dtype=torch.float32).masked_fill(keep, 0.0)
    x, w, mask = torch.randn(3, 4), torch.randn(4, 5), torch.randint(0, 2, (3, 5))
    got, want = fjit.jit(f)(x, w, mask), f(x, w, mask)
    assert got.dtype == want.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_ops_autocast_leaves_alone_are_not_probed(monkeypatch):
    """Token ids, boolean masks, float64 values and sizes: autocast casts none of them."""
    def f(ids, mask, d, x):
        keep = mask.to(device=ids.device, dtype=torch.bool)
        pos = torch.arange(ids.shape[-1], device=ids.device).expand_as(ids)
        scale = x.size(-1) * x.element_size() * x.dim()
        return (ids + pos).masked_fill(keep, 0) * scale, (d @ d.T).to(device=d.device), keep.new_ones(2)

    def no_probe(*args):
        raise AssertionError("an op autocast leaves alone was probed")
    monkeypatch.setattr(modes._AutocastProbe, "__new__", no_probe)
    ids, mask = torch.randint(0, 9, (2, 5)), torch.randint(0, 2, (2, 5))
    d, x = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, want = fjit.jit(f)(ids, mask, d, x), f(ids, mask, d, x)
    for g, e in zip(got, want):
        assert g.dtype == e.dtype
        torch.testing.assert_close(g, e)


def test_a_data_dependent_shape_under_autocast_is_the_located_fj202_it_is_without():
    """The probe's kernels below autocast are meta kernels, which refuse a boolean-mask index
    (ELECTRA's loss) as the plain meta call does: fjit's located FJ202, not torch's error."""
    def f(x, w, mask):
        return (x @ w)[mask.bool()]
    x, w, mask = torch.randn(3, 4), torch.randn(4, 5), torch.randint(0, 2, (3, 5))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(fjit.UnsupportedOpError) as info:
        fjit.jit(f)(x, w, mask)
    assert info.value.code == "FJ202" and info.value.lineno == f.__code__.co_firstlineno + 1


def test_batch_norm_running_statistics_of_a_half_precision_input_are_computed_in_float32():
    """A bfloat16 input (autocast's convolution output) with float32 running statistics: eager's
    kernel computes the batch statistics in float32; fjit's split rounded them to bfloat16 first,
    and DenseNet-121's running means drifted past the zoo's rule under bf16 autocast."""
    torch.manual_seed(0)
    x = (torch.randn(4, 8, 6, 6) * 3 + 1).bfloat16()
    eager, compiled, exact = (torch.nn.BatchNorm2d(8) for _ in range(3))
    exact.double()
    jm = fjit.jit(compiled)
    for _ in range(3):
        eager(x)
        jm(x)
        exact(x.double())
    for name in ("running_mean", "running_var"):
        want = getattr(exact, name)
        eager_error = (getattr(eager, name).double() - want).abs().max().item()
        fjit_error = (getattr(compiled, name).double() - want).abs().max().item()
        assert fjit_error <= 2 * eager_error + 1e-7, (name, fjit_error, eager_error)


def test_batch_norm_under_autocast_is_one_mixed_type_aten_pass_as_eagers():
    """Under autocast a convolution's bfloat16 output meets a BatchNorm's float32 parameters and
    running statistics: ATen's mixed-type functional batch norm (eager's kernel) normalizes and
    computes the statistics in float32 in one pass, so the statistics are eager's bit for bit and
    no float32 copy of the activation is made for a separate var_mean."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3), torch.nn.BatchNorm2d(6), torch.nn.ReLU())
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for step in range(3):
        x = torch.randn(4, 3, 9, 9)
        for m, call in ((ref, ref), (model, jm)):
            m.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = call(x)
            out.float().square().sum().backward()
        for (name, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
            assert torch.equal(a, b), (step, name)
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=BF16_ULPS, atol=BF16_ULPS * q.grad.abs().max().item(),
                                       msg=name)
    text = str(fjit.last_traces(jm)[-1])
    assert "_native_batch_norm_legit_functional" in text and "var_mean" not in text


def test_values_autocast_casts_carry_whether_autograd_records_them():
    """An op autocast changes is traced from a probe of fresh tensors: its results require grad
    where the op's inputs do under grad mode, as eager's, and not under no_grad; the program's
    passes decide from them whether autograd records it."""
    def f(x, w):
        return torch.max(x @ w, 1).values[:, None] + torch.split(x @ w, 2, 1)[0].sum()
    x, w = torch.randn(3, 4, requires_grad=True), torch.randn(4, 5)
    for grad in (True, False):
        jf = fjit.jit(f)
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = jf(x, w), f(x, w)
        assert got.requires_grad == want.requires_grad == grad
        traced = fjit.last_traces(jf)[0]
        matmuls = [b.output for b in traced.bsyms if b.sym.name == "matmul"]
        assert matmuls and all(v.requires_grad == grad and v.dtype == torch.bfloat16 for v in matmuls)


def test_autocast_is_traced_as_casts_that_fuse_and_differentiate():
    """Under autocast a module's training step is traced as the casts autocast makes (operands of
    the linear layers to bf16), then each op without autocast: the elementwise ops and the casts
    fuse into kernels, the joint backward is compiled, and the program runs with autocast off
    (the caller's state is back after it).  Values and gradients are eager-under-autocast's."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                            torch.nn.Linear(32, 4))
    jm = fjit.jit(m)
    x = torch.randn(8, 16)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got, want = jm(x), m(x)
            assert torch.is_autocast_enabled("cpu")
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)
        got.float().square().sum().backward()
        got_grads = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        want.float().square().sum().backward()
        for g, p in zip(got_grads, m.parameters()):
            torch.testing.assert_close(g, p.grad, rtol=BF16_ULPS, atol=BF16_ULPS * p.grad.abs().max().item())
        m.zero_grad()
    forward, backward = fjit.last_traces(jm)[-1], fjit.last_backward_traces(jm)[-1]
    assert forward.autocast_off and backward.autocast_off
    source = str(forward)
    assert "prims.convert_element_type(" in source and "torch.set_autocast_enabled" not in source
    assert any(b.sym.has(Tag.KERNEL) for b in forward.bsyms)
    assert backward.stage.startswith("torch_executor")


def test_an_op_autocast_changes_inside_stays_a_torch_call_under_autocast():
    """tensordot is not on autocast's lists, but the mm it calls is: its result is not casts of
    its operands, so it stays one torch call with autocast switched on around it, and the rest of
    the program still runs with autocast off; the caller's autocast is on again after every call,
    the compiling one included.  (einsum is fjit's own ops, each cast as autocast casts it.)"""
    def f(x, w):
        return torch.tensordot(x.exp(), w, dims=1) * 2 + torch.einsum("ij,jk->ik", x, w)
    jf = fjit.jit(f)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = jf(x, w)
            assert torch.is_autocast_enabled("cpu") and (x @ w).dtype == torch.bfloat16
            want = f(x, w)
        assert got.dtype == want.dtype == torch.bfloat16
        torch.testing.assert_close(got, want)
    source = str(fjit.last_traces(jf)[-1])
    assert source.count("torch.set_autocast_enabled('cpu', True)") == 1 and "tensordot" in source
    assert not any("einsum(" in line.split("#")[0] for line in source.splitlines())


@pytest.mark.parametrize("equation, shapes", [("ij,jk->ki", ((1, 1), (1, 1))), ("ij,jk->ik", ((2, 1), (1, 3))),
                                               ("i,j->ij", ((3,), (4,))), ("ij,jk->ik", ((2, 3), (3, 4)))])
def test_an_einsum_with_nothing_to_contract_keeps_eagers_dtype_under_autocast(equation, shapes):
    """torch's einsum multiplies where nothing is contracted (an outer product, summed letters of
    size 1) and calls bmm otherwise, and autocast casts only the bmm: float32 operands give a
    float32 result in the first case, bfloat16 in the second, compiled as eager (found by the
    random programs of test_properties.py: fjit's einsum was a matmul, bfloat16, in both)."""
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return torch.einsum(equation, a, b) * 0.5
    a, b = (torch.randn(*shape) for shape in shapes)
    got, want = fjit.jit(f)(a, b), f(a, b)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


def test_activation_checkpointing_under_autocast_is_honoured_with_eagers_gradients():
    """Autocast and torch.utils.checkpoint as a user's training step combines them: checkpointed
    blocks of linear layers under bf16 autocast train through the joint program (no warning that
    checkpointing is dropped), with eager-under-autocast's loss and gradients."""
    from torch.utils.checkpoint import checkpoint

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.norm = torch.nn.Linear(16, 64), torch.nn.Linear(64, 16), torch.nn.LayerNorm(16)

        def forward(self, x):
            return x + self.b(torch.nn.functional.gelu(self.a(self.norm(x))))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block() for _ in range(3)])

        def forward(self, x):
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return x.float().square().mean()

    torch.manual_seed(0)
    model = Model()
    ref = copy.deepcopy(model)
    jm = fjit.jit(model)
    for _ in range(3):
        x = torch.randn(8, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                got, want = jm(x), ref(x)
            got.backward()
        want.backward()
        torch.testing.assert_close(got, want)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=BF16_ULPS * q.grad.abs().max().item())
        model.zero_grad()
        ref.zero_grad()
    assert fjit.last_backward_traces(jm) and fjit.last_traces(jm)[-1].autocast_off
