"""Layouts are the real ones.  Meta kernels mispredict some opaque ops' output strides (CPU
conv2d/conv3d/conv_transpose2d/group_norm on channels_last, SDPA on transposed heads); fjit observes
the real layouts on the first call, retraces with them, so fused kernels read the data right and
returned tensors keep eager's layout."""
import pytest
import torch
import torch.nn.functional as F

import fjit

CL = torch.channels_last
EXECUTORS = [("torch",), ("c", "torch")]


def _cl(*shape):
    return torch.randn(*shape).to(memory_format=CL)


CASES = {
    "conv2d_cl": (lambda x, w: (F.conv2d(x, w) * 2 + 1).relu(), lambda: (_cl(2, 3, 4, 5), torch.randn(6, 3, 3, 3))),
    "conv2d_cl_weight": (lambda x, w: F.conv2d(x, w) * 2 - 1,
                         lambda: (torch.randn(2, 3, 4, 5), torch.randn(6, 3, 3, 3).to(memory_format=CL))),
    "group_norm_cl": (lambda x, w: F.group_norm(x, 3) * w[0, 0] + 1, lambda: (_cl(2, 6, 4, 5), torch.randn(2, 2))),
    "conv_then_group_norm": (lambda x, w: F.group_norm(F.conv2d(x, w), 2).sigmoid() * 3,
                             lambda: (_cl(2, 3, 6, 6), torch.randn(4, 3, 3, 3))),
    "sdpa_transposed_heads": (lambda q, k: F.scaled_dot_product_attention(q, k, k) * 2 + q,
                              lambda: (torch.randn(2, 5, 4, 8).transpose(1, 2), torch.randn(2, 5, 4, 8).transpose(1, 2))),
    "conv3d_cl3d": (lambda x, w: F.conv3d(x, w).exp() - 1,
                    lambda: (torch.randn(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d), torch.randn(4, 3, 1, 1, 1))),
    "conv_transpose": (lambda x, w: F.conv_transpose2d(x, w) * 0.5 + 1, lambda: (_cl(2, 3, 4, 5), torch.randn(3, 2, 3, 3))),
}


@pytest.mark.parametrize("executors", EXECUTORS, ids=lambda e: "-".join(e))
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_layouts_follow_the_real_kernels(name, executors):
    f, make = CASES[name]
    args = make()
    jf = fjit.jit(f, executors=executors)
    expected = f(*args)
    for _ in range(3):        # the compiling call and cached calls alike
        got = jf(*args)
        torch.testing.assert_close(got, expected)
        assert got.stride() == expected.stride()
        assert got.is_contiguous(memory_format=CL) == expected.is_contiguous(memory_format=CL)


def test_layout_questions_in_user_code_get_the_real_answer():
    def f(x, w):
        y = F.conv2d(x, w)
        return y * 2 if y.is_contiguous(memory_format=CL) else y - 100
    x, w = _cl(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    torch.testing.assert_close(fjit.jit(f)(x, w), f(x, w))


def test_check_mode_sees_no_layout_disagreement(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    f, make = CASES["conv_then_group_norm"]
    args = make()
    torch.testing.assert_close(fjit.jit(f)(*args), f(*args))


def test_first_call_observation_draws_random_numbers_once():
    def f(x, w):
        return F.dropout(F.conv2d(x, w), 0.5, training=True) + torch.rand(1)
    x, w = _cl(2, 3, 5, 5), torch.randn(4, 3, 3, 3)
    torch.manual_seed(0)
    expected, after_eager = f(x, w), torch.rand(3)
    torch.manual_seed(0)
    got, after = fjit.jit(f)(x, w), torch.rand(3)
    torch.testing.assert_close(got, expected)
    assert torch.equal(after, after_eager)


def test_programs_without_opaque_ops_are_traced_once(monkeypatch):
    import fjit.pipeline
    traced = []
    real = fjit.pipeline.trace_function
    monkeypatch.setattr(fjit.pipeline, "trace_function", lambda *a, **k: traced.append(1) or real(*a, **k))
    fjit.jit(lambda x: x * 2 + 1)(torch.randn(3))
    assert len(traced) == 1      # no opaque op: no observation run, no retrace
    fjit.jit(lambda x, w: F.conv2d(x, w) + 1)(_cl(2, 3, 5, 5), torch.randn(4, 3, 3, 3))
    assert len(traced) == 3      # conv2d's meta layout was wrong: traced again with the real one


def test_an_observed_layout_applies_only_to_a_value_of_the_shape_it_was_seen_with():
    """A retrace that takes another path (a layout-dependent decomposition: timm's Twins) can give
    an observed value's layout key to another value; its strides are not that value's (a rank-3
    value got rank-4 strides)."""
    from fjit.frontend.record import observed_strides

    key = ("conv2d", 0, 0)

    class Ctx:
        observed_strides = {key: ((2, 3, 4, 5), (60, 1, 15, 3))}
    assert observed_strides(Ctx, key, (2, 3, 4, 5)) == (60, 1, 15, 3)
    assert observed_strides(Ctx, key, (2, 3, 20)) is None
    assert observed_strides(Ctx, ("conv2d", 1, 0), (2, 3, 4, 5)) is None


def test_suggests_channels_last_is_atens_rule_for_a_cpu_convolutions_result():
    """The channels-last form of a program (fjit/program_choice.py) records a CPU convolution's
    layout by ATen's rule, which its meta kernel does not follow: channels-last where the input
    or the weight suggests it, including the ambiguous shapes (one channel, one pixel) and
    permuted layouts that are neither."""
    import itertools
    from fjit.core.ir import TensorVar
    from fjit.core.meta import channels_last_strides, suggests_channels_last

    def var(t):
        return TensorVar("v", t.shape, t.dtype, t.device, t.stride())
    checked = 0
    for n, c, h, w in itertools.product((1, 2), (1, 3), (1, 4), (1, 5)):
        base = torch.randn(n, c, h, w)
        for x in (base, base.to(memory_format=CL), base.transpose(2, 3).contiguous().transpose(2, 3),
                  base.transpose(0, 1).contiguous().transpose(0, 1)):
            for weight in (torch.randn(4, c, 1, 1), torch.randn(4, c, 2, 1).to(memory_format=CL)):
                if weight.shape[2] > h:
                    continue
                y = F.conv2d(x, weight)
                cl = suggests_channels_last(var(x)) or suggests_channels_last(var(weight))
                want = channels_last_strides(y.shape) if cl else torch.empty(y.shape).stride()
                assert y.stride() == tuple(want), (x.shape, x.stride(), weight.stride())
                checked += 1
    assert checked > 80


# -- views in programs autograd does not record ----------------------------------------------------

def _views_then_math(x, w):
    h = (x @ w).reshape(3, 2, 8).permute(0, 2, 1)[:, 1:, 1]     # three views of a matmul
    side = x[:, None, 2:10].expand(3, 4, 8)                      # two views of an input
    return torch.tanh(h).sum() + (side * 2).sum(), x.t()[1:]


def test_a_chain_of_views_is_one_reinterpretation_of_its_start():
    """In the joint forward and backward (run by autograd.Function, which autograd does not
    record into) a chain of views is one `reinterpret` of the value it starts from, at the offset
    the chain adds; values and gradients are eager's, also for an input that starts past its
    storage's start; a returned view is still a view of the input, as eager's."""
    big = torch.randn(60, dtype=torch.float64)
    w = torch.randn(16, 16, dtype=torch.float64, requires_grad=True)
    jf = fjit.jit(_views_then_math)
    for _ in range(2):
        x = big[9:57].view(3, 16).requires_grad_()     # storage offset 9
        got, got_view = jf(x, w)
        got.backward()
        gx, gw = x.grad, w.grad.clone()
        w.grad = None
        x2 = big[9:57].view(3, 16).requires_grad_()
        want, want_view = _views_then_math(x2, w)
        want.backward()
        torch.testing.assert_close((got, got_view, gx, gw), (want, want_view, x2.grad, w.grad))
        w.grad = None
        # a returned view is a view of the input's memory, as eager's
        assert got_view._is_view() and got_view.untyped_storage().data_ptr() == \
            big.untyped_storage().data_ptr()
    forward, backward = fjit.last_traces(jf)[-1], fjit.last_backward_traces(jf)[-1]
    for trace in (forward, backward):
        assert "fjit_ops.reinterpret(" in str(trace)
    # the matmul's reshape, permute and slice are at most one reinterpretation of the matmul's
    # result (none where the C kernel reading them reads the result at their strides)
    mm = next(b for b in forward.bsyms if "matmul" in b.sym.qualname).output
    views = [b for b in forward.bsyms if b.sym.qualname == "fjit_ops.reinterpret"]
    assert [b.args[0].name for b in views].count(mm.name) <= 1
    assert not any(q in str(forward) for q in ("Tensor.permute(", "prims.permute("))


def test_a_view_that_must_copy_stays_the_op_that_copies():
    """A reshape of a transposed value cannot be a view: it stays a reshape (which copies)."""
    def f(x):
        return (x.t().reshape(-1) * 2)[3:].exp()
    jf = fjit.jit(f)
    x = torch.randn(4, 6)
    for _ in range(2):
        torch.testing.assert_close(jf(x), f(x))
    source = str(fjit.last_traces(jf)[-1])
    assert "reshape(" in source


def test_a_program_autograd_records_keeps_real_views():
    """Where torch autograd differentiates the program's own torch calls (nothing fuses in it),
    its views stay views: autograd must see them."""
    def f(x, w):
        return (x @ w).t()[1:].reshape(-1) @ w[:, 0].reshape(-1).repeat(3)
    jf = fjit.jit(f)
    x = torch.randn(3, 4, requires_grad=True)
    w = torch.randn(4, 5, requires_grad=True)
    jf(x, w).backward()
    gx, gw = x.grad, w.grad
    x.grad = w.grad = None
    f(x, w).backward()
    torch.testing.assert_close((gx, gw), (x.grad, w.grad))
    assert "reinterpret" not in str(fjit.last_traces(jf)[-1])


def _dead_ops(trace) -> list:
    """The ops of `trace` whose results nothing reads (random and impure ops excepted)."""
    from fjit.core.ir import Tag, Var, flatten_values
    read = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    for b in trace.bsyms:
        read.update(v.name for v in b.inputs())
    return [b for b in trace.bsyms if b.outputs() and not b.sym.has(Tag.IMPURE) and not b.sym.has(Tag.RANDOM)
            and b.sym.name != "del" and not any(v.name in read for v in b.outputs())]


def test_an_inference_program_of_a_module_reinterprets_its_views_and_runs_no_dead_op():
    """Under no_grad a module's program is not recorded by autograd, though the parameters it
    reads require grad: its chains of views (split's outputs among them) become reinterpretations,
    and the views a kernel reads through are gone from the program, not computed and dropped."""
    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).split(16, dim=-1)
            q, k, v = (t.view(x.shape[0], x.shape[1], 2, 8).transpose(1, 2) for t in (q, k, v))
            a = torch.softmax(q @ k.transpose(-1, -2) * 0.3, -1) @ v
            return a.transpose(1, 2).reshape(x.shape[0], x.shape[1], 16).tanh()

    m = Attention()
    jm = fjit.jit(m)
    for n in (5, 7, 9):      # a static program, then a symbolic one
        x = torch.randn(2, n, 16)
        with torch.no_grad():
            got = jm(x)
        want = m(x)
        torch.testing.assert_close(got, want)
        program = fjit.last_traces(jm)[-1]
        assert _dead_ops(program) == [], n
        code = [line.split("#")[0] for line in str(program).splitlines()]
        assert not any("split(" in line or "transpose(" in line for line in code), n

