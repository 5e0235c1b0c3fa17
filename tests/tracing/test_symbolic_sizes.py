"""Symbolic sizes (fjit/core/symbolic.py, fjit/cache.py): a dim whose value changes between calls
becomes a symbol on the next compile, one program then serves every value its guards admit, a
failed guard compiles again (and fjit.explain says which guard), and every call equals eager --
sizes 0 and 1, broadcasting against 1 and empty tensors included."""
from __future__ import annotations

import copy
import os

import hypothesis.strategies as st
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

import fjit


def attention_block(x, w):
    h = F.gelu(x @ w, approximate="tanh")
    a = (h @ h.transpose(-1, -2) / h.shape[-1] ** 0.5).softmax(-1)
    return F.layer_norm(a @ h, (h.shape[-1],))


def test_a_length_that_changes_becomes_a_symbol_and_later_lengths_compile_nothing():
    jf = fjit.jit(attention_block)
    w = torch.randn(16, 16)
    for n in (5, 7, 9, 12, 33, 7):
        x = torch.randn(2, n, 16)
        torch.testing.assert_close(jf(x, w), attention_block(x, w))
    info = fjit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 4), info
    text = str(fjit.explain(jf))
    # every dim of the input whose size varied is a symbol; the width, which the weight fixes, is
    # pinned by a guard
    assert "symbolic program: symbolic sizes s0 = x.shape[0], s1 = x.shape[1]" in text, text
    assert "s2 == 16" in text, text
    source = str(fjit.last_traces(jf)[-1])
    assert "s1 = x.shape[1]" in source and 'f32[s0, s1, 16]' in source, source


def test_a_new_length_reuses_the_symbolic_programs_kernels_without_generating(monkeypatch):
    """Under the default kernel sizes, a symbolic region's kernel takes the symbolic sizes as
    parameters and serves every length at which the generator's recorded decisions come out the
    same: a new length generates no C source (FJIT_CHECK=1 checks each reuse against a fresh
    generation), and the recorded conditions hold the choices that differ by size."""
    from fjit.executors.c import executor as c_executor
    from fjit.executors import runtime_sizes, symbolic_kernels
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "auto")
    monkeypatch.setenv("FJIT_CHECK", "1")
    generated = set()           # the sources generated (the check regenerates ones already made)

    def generate(*args, **kwargs):
        kernel = real(*args, **kwargs)
        generated.add(kernel.source)
        return kernel
    real = c_executor.generate
    monkeypatch.setattr(c_executor, "generate", generate)
    jf = fjit.jit(attention_block)
    w = torch.randn(16, 16)
    for n in (5, 7):
        x = torch.randn(2, n, 16)
        torch.testing.assert_close(jf(x, w), attention_block(x, w))
    after_two = len(generated)
    assert after_two > 0
    # (lengths past the sizes where the generator's choices of speed change -- a row reduction's
    # accumulator width from 128, a tiled transpose from 4096 elements -- included: a symbolic
    # program takes those at its compiling call's sizes)
    for n in (9, 10, 11, 6, 8, 150, 300):
        x = torch.randn(3, n, 16)
        torch.testing.assert_close(jf(x, w), attention_block(x, w))
    assert len(generated) == after_two, (after_two, len(generated))
    assert fjit.cache_info(jf).misses == 2
    # what the decisions record: a condition on the symbols, its outcome where it was generated
    size = runtime_sizes.Size(12, "sz0", "/", "v0")
    with runtime_sizes.recording() as decisions:
        wide = size >= 16
        rows = (size * 4) // 8
    assert decisions == {"(v0 >= 16)": False, "(v0 >= 0)": True, "(8 > 0)": True} or \
        decisions == {"(v0 >= 16)": False, "((v0 * 4) >= 0)": True}, decisions
    assert not wide and rows.sym == "((v0 * 4) // 8)" and str(rows) == "((sz0 * 4) / 8)"
    holds = symbolic_kernels.condition(decisions, 1)
    assert holds(12) and holds(15) and not holds(16)


def test_the_printed_symbolic_program_runs_at_other_sizes():
    jf = fjit.jit(attention_block, cache="symbolic")
    w = torch.randn(16, 16)
    jf(torch.randn(3, 6, 16), w)
    ns: dict = {}
    exec(str(fjit.last_traces(jf)[-1]), ns)
    x = torch.randn(4, 11, 16)
    torch.testing.assert_close(ns["computation"](x, w), attention_block(x, w))


def test_cache_symbolic_compiles_once_and_static_once_per_shape():
    def f(x, y):
        return (x * y.sum(0)).relu().mean(-1)
    shapes = [(3, 4), (5, 4), (6, 9), (2, 2), (3, 4)]
    symbolic, static = fjit.jit(f, cache="symbolic"), fjit.jit(f, cache="static")
    for m, n in shapes:
        x, y = torch.randn(m, n), torch.randn(7, n)
        torch.testing.assert_close(symbolic(x, y), f(x, y))
        torch.testing.assert_close(static(x, y), f(x, y))
    assert fjit.cache_info(symbolic).misses == 1
    assert fjit.cache_info(static).misses == 4


def test_cache_symbolic_leaves_a_modules_parameters_static():
    """cache="symbolic" makes the inputs' sizes symbols, not the parameters' (a symbol per weight
    dim cost Llama 600 guard conditions, checked on every call of a new shape)."""
    layer = torch.nn.Linear(8, 4)
    jm = fjit.jit(layer, cache="symbolic")
    for n in (3, 5):
        x = torch.randn(n, 8)
        torch.testing.assert_close(jm(x), layer(x))
    stage = fjit.last_traces(jm)[-1].stage
    assert "input.shape[0]" in stage and "weight.shape" not in stage and "bias.shape" not in stage, stage
    assert fjit.cache_info(jm).misses == 1


def test_a_failed_guard_compiles_again_and_explain_names_it():
    def branchy(x):
        if x.shape[0] > 8:          # Python control flow on a size: a guard either way
            return x * 2
        return x - 1
    jf = fjit.jit(branchy)
    for n in (3, 4, 6):
        torch.testing.assert_close(jf(torch.ones(n, 2)), branchy(torch.ones(n, 2)))
    assert fjit.cache_info(jf).misses == 2
    torch.testing.assert_close(jf(torch.ones(12, 2)), torch.full((12, 2), 2.0))
    assert fjit.cache_info(jf).misses == 3
    last = str(fjit.explain(jf)).split("call ")[-1]
    assert "the symbolic program's guard s0 <= 8 fails" in last, last
    torch.testing.assert_close(jf(torch.ones(20, 2)), torch.full((20, 2), 2.0))
    torch.testing.assert_close(jf(torch.ones(5, 2)), torch.zeros(5, 2))
    assert fjit.cache_info(jf).misses == 3


def test_sizes_zero_and_one_and_broadcasting_against_one_equal_eager():
    def f(x, y):
        return (x + y).exp().sum(-1, keepdim=True) * x.shape[0]
    jf = fjit.jit(f, cache="symbolic")
    for (a, b), (c, d) in [((4, 5), (1, 5)), ((4, 5), (4, 1)), ((1, 5), (4, 5)), ((4, 5), (4, 5)),
                           ((0, 5), (1, 5)), ((3, 1), (1, 6)), ((6, 6), (6, 6)), ((2, 0), (2, 1))]:
        x, y = torch.randn(a, b), torch.randn(c, d)
        torch.testing.assert_close(jf(x, y), f(x, y))


def _transposed_rows(x, w):
    h = torch.tanh(x @ w)
    return h.transpose(1, 2).reshape(-1, h.shape[1]).softmax(-1)     # a reshape that copies at 2


def test_a_batch_of_one_then_of_two_share_one_symbolic_program():
    """A dim seen at 1, then at 2, becomes a symbol that may be 1: batches of one are served by
    the symbolic program (its reshape copies explicitly, so it lays out alike at 1), forward and
    backward as eager."""
    jf = fjit.jit(_transposed_rows)
    w = torch.randn(6, 5)
    for batch, n in [(1, 8), (2, 8), (3, 8), (1, 16), (2, 24), (1, 24), (3, 5)]:
        x = torch.randn(batch, n, 6)
        ws, we = w.clone().requires_grad_(), w.clone().requires_grad_()
        out, expected = jf(x, ws), _transposed_rows(x, we)
        torch.testing.assert_close(out, expected)
        cotangent = torch.randn_like(expected)
        out.backward(cotangent)
        expected.backward(cotangent)
        torch.testing.assert_close(ws.grad, we.grad)
    assert fjit.cache_info(jf).misses == 2, fjit.explain(jf)


def test_code_that_branches_on_a_batch_of_one_gets_a_program_of_its_own():
    """Python control flow on whether a size is 1 (transformers' masks expand position ids only
    when the batch is not 1) is a guard of the symbolic program, as any comparison is."""
    def f(x):
        ids = torch.arange(x.shape[1], dtype=x.dtype)[None]
        if x.shape[0] != ids.shape[0]:
            ids = ids.expand(x.shape[0], -1)
        return x * ids
    jf = fjit.jit(f)
    for batch, n in ((1, 4), (2, 4), (3, 5), (1, 6), (5, 6)):
        x = torch.randn(batch, n)
        torch.testing.assert_close(jf(x), f(x))
    assert fjit.cache_info(jf).misses == 3
    assert "guard s0 != 1 fails" in str(fjit.explain(jf))


def test_a_layout_torch_gives_otherwise_at_size_one_is_found():
    """The check a call with a symbol at 1 runs (layouts.layout_differing_at): a program traced
    at 2 whose torch reshape copies is, at 1, a view laid out otherwise."""
    from fjit.passes.layouts import layout_differing_at
    jf = fjit.jit(lambda x: x.transpose(1, 2).reshape(-1, x.shape[1]) * 2, cache="symbolic")
    jf(torch.randn(2, 8, 4))
    traced = fjit.last_traces(jf)[0]
    for batch, differs in ((1, True), (3, False)):
        x = torch.randn(batch, 9, 4)
        sizes = traced.sizes
        numbers = {str(sizes.names[s]): x.shape[src.dim] for s, src in sizes.sources.items()}
        why = layout_differing_at(traced, [x], sizes.concrete([x]), numbers)
        assert (why is not None) == differs, why
        if differs:
            assert "reshape" in why and "not as recorded" in why


def test_a_reshape_to_a_size_not_dividing_raises_as_eager():
    def f(x):
        return x.reshape(-1, 4).sum(1)
    jf = fjit.jit(f)
    for n in (8, 12, 16):
        torch.testing.assert_close(jf(torch.arange(float(n))), f(torch.arange(float(n))))
    with pytest.raises(RuntimeError, match="invalid for input of size 10"):
        jf(torch.arange(10.0))


def test_a_symbolic_program_trains_as_eager():
    def loss(x, w):
        return (x @ w).tanh().pow(2).mean()
    jf = fjit.jit(loss)
    for n in (3, 5, 8):
        x = torch.randn(n, 6)
        w1, w2 = torch.randn(6, 4, requires_grad=True), None
        w2 = w1.detach().clone().requires_grad_()
        jf(x, w1).backward()
        loss(x, w2).backward()
        torch.testing.assert_close(w1.grad, w2.grad)
    assert fjit.cache_info(jf).misses == 2


def test_a_size_read_as_a_plain_int_specializes_and_says_why():
    def f(x):
        n = int(x.shape[0])            # the value itself: a program per value
        return x * n
    jf = fjit.jit(f)
    for n in (3, 4, 5):
        torch.testing.assert_close(jf(torch.ones(n)), torch.full((n,), float(n)))
    assert fjit.cache_info(jf).misses == 3
    assert "symbolic sizes declined" in str(fjit.explain(jf))


def test_a_module_over_sequence_lengths_compiles_twice():
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    jm = fjit.jit(layer)
    with torch.no_grad():
        for n in (4, 6, 9, 13):
            x = torch.randn(2, n, 16)
            torch.testing.assert_close(jm(x), layer(x), rtol=1e-4, atol=1e-5)
    assert fjit.cache_info(jm).misses == 2


def test_a_new_length_is_served_without_building_a_key(monkeypatch):
    """Once a module's symbolic program is compiled, the first call of a new length is served by
    its check (cache.symbolic_call), never by building the cache key: the key's walk over the
    parameters cost more than the call.  The results stay eager's."""
    import fjit.cache
    keys = []
    real = fjit.cache.call_key
    monkeypatch.setattr(fjit.cache, "call_key", lambda *a: keys.append(1) or real(*a))
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    jm = fjit.jit(layer)
    with torch.no_grad():
        for n in (4, 6):
            jm(torch.randn(2, n, 16))
        keys.clear()
        for n in (9, 13, 5, 9, 31):
            x = torch.randn(3, n, 16)
            torch.testing.assert_close(jm(x), layer(x), rtol=1e-4, atol=1e-5)
    assert keys == [] and fjit.cache_info(jm).misses == 2


def test_the_symbolic_check_serves_only_calls_the_key_would_match():
    """The symbolic program's check (inputs.symbolic_hit) compares what the key with the dynamic
    dims masked compares: a call differing in a constant, a dtype, requires_grad, a static size,
    a layout, grad mode or autocast gets its own program or the general path, and every call
    computes eager's result."""
    def f(x, w, n, scale):
        y = torch.tanh(x @ w) * scale
        return y.sum(-1) if n == 1 else y * n

    jf = fjit.jit(f)
    w = torch.randn(8, 8)
    calls = [(torch.randn(2, 5, 8), w, 2, 0.5), (torch.randn(3, 7, 8), w, 2, 0.5),    # symbolic
             (torch.randn(4, 9, 8), w, 2, 1.5),             # a float: a runtime value
             (torch.randn(4, 9, 8), w, 1, 1.5),             # another constant
             (torch.randn(4, 9, 8).double(), w.double(), 2, 1.5),   # another dtype
             (torch.randn(4, 9, 8, requires_grad=True), w, 2, 1.5),
             (torch.randn(4, 9, 8), torch.randn(8, 8).t(), 2, 1.5),  # a static input's strides
             (torch.randn(4, 8, 9).transpose(1, 2), w, 2, 1.5),     # not contiguous
             (torch.randn(3, 6, 8), w, 2, 0.25)]
    for _ in range(2):
        for x, w_, n, scale in calls:
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    out, want = jf(x, w_, n, scale), f(x, w_, n, scale)
                assert out.dtype == want.dtype and out.requires_grad == want.requires_grad
                torch.testing.assert_close(out.detach(), want.detach())
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out, want = jf(x, w_, n, scale), f(x, w_, n, scale)
            assert out.dtype == want.dtype
            torch.testing.assert_close(out.detach(), want.detach(), rtol=2e-2, atol=2e-2)


class _SlicesStaticTensors(torch.nn.Module):
    """Static tensors cut to the input's length, as text models cut their buffers: a causal mask
    (GPT-Neo's `bias`), position embeddings, rotary tables, a weight read at [:n, :n]."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bias", torch.ones(1, 1, 64, 64, dtype=torch.bool).tril())
        self.pos = torch.nn.Parameter(torch.randn(64, 8) / 4)
        self.register_buffer("cos", torch.randn(64, 8).cos())
        self.register_buffer("mix", torch.randn(64, 64) / 8)

    def forward(self, x):
        n = x.shape[1]
        h = x + self.pos[:n] * self.cos[:n].unsqueeze(0)
        scores = torch.where(self.bias[:, :, :n, :n][0], h @ h.transpose(-1, -2), -1e4)
        return self.mix[:n, :n] @ (torch.softmax(scores, -1) @ h)


def test_a_static_tensor_cut_to_a_symbolic_length_keeps_the_length_a_symbol():
    # A view of a static tensor at a symbolic length, replayed on meta tensors to read it through
    # (regroup.read_through_views, layouts.reinterpret_views), had pinned the length with a guard:
    # every new length compiled a "symbolic" program of that one length (GPT-Neo, its mask buffer).
    model = _SlicesStaticTensors()
    jm = fjit.jit(model)
    for n in (16, 12, 20, 9, 30, 12):
        x = torch.randn(2, n, 8, requires_grad=True)
        xe = x.detach().clone().requires_grad_()
        out, expected = jm(x), model(xe)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        grads = torch.autograd.grad(out.square().sum(), [x, model.pos])
        expected_grads = torch.autograd.grad(expected.square().sum(), [xe, model.pos])
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert fjit.cache_info(jm).misses == 2, fjit.explain(jm)
    assert "s1 <= 12" not in str(fjit.explain(jm)), fjit.explain(jm)


def test_a_batch_crossing_a_speed_crossover_shares_the_symbolic_program():
    # A 1x1 convolution over few positions is a matmul, a batch norm of many elements C's kernel:
    # choices of speed alone, once taken by guards on the batch size, so each batch crossing a
    # line (8 -> 3 rows of 8x8 positions: 512 -> 192 against 256) compiled again.
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))
    reference = copy.deepcopy(model)
    jm = fjit.jit(model)
    for n in (8, 6, 3, 8, 5, 2):
        x = torch.randn(n, 3, 16, 16)
        out, expected = jm(x), reference(x)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        out.square().sum().backward()
        expected.square().sum().backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4)
            p.grad = q.grad = None
    torch.testing.assert_close(model[1].running_mean, reference[1].running_mean)
    assert fjit.cache_info(jm).misses == 2, fjit.explain(jm)

# -- random shape-polymorphic programs at random shapes -----------------------------------------

_UNARY = ["torch.tanh({})", "({}).relu()", "({}).exp().clamp(max=50.0)", "torch.sigmoid({})", "({}) * 0.5 + 1"]
_BINARY = ["({}) + ({})", "({}) * ({})", "torch.maximum({}, {})", "({}) - ({})"]
_SHAPE = ["({0}).sum(-1, keepdim=True)", "({0}).softmax(-1)", "({0}).mean(0, keepdim=True)",
          "({0}).transpose(0, 1).contiguous().transpose(0, 1)", "({0})[:, : ({0}).shape[1] // 2 + 1]",
          "torch.cat([{0}, {0}], 0)[: ({0}).shape[0]]", "({0}).flip(0)", "({0}).reshape(({0}).shape[0], -1)",
          "(({0}) @ ({0}).transpose(0, 1)).sum(0, keepdim=True).transpose(0, 1).expand(-1, ({0}).shape[1])"]


@st.composite
def shape_polymorphic_programs(draw):
    """Source of `def program(x, y)` over x [m, n] and y [m or 1, n or 1]: every intermediate
    stays [m, n] or broadcasts to it, whatever m and n are."""
    lines, vals = [], ["x", "(y + x * 0)"]
    for i in range(draw(st.integers(2, 6))):
        kind = draw(st.sampled_from(["unary", "binary", "shape"]))
        a = draw(st.sampled_from(vals))
        if kind == "unary":
            expr = draw(st.sampled_from(_UNARY)).format(a)
        elif kind == "binary":
            expr = draw(st.sampled_from(_BINARY)).format(a, draw(st.sampled_from(vals + ["y"])))
        else:
            expr = draw(st.sampled_from(_SHAPE)).format(a)
            expr = f"(({expr}) + x * 0)"     # back to [m, n] by broadcasting
        lines.append(f"    v{i} = {expr}")
        vals.append(f"v{i}")
    return "def program(x, y):\n" + "\n".join(lines) + f"\n    return {vals[-1]}\n"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=shape_polymorphic_programs(),
       shapes=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 7), st.booleans(), st.booleans()),
                       min_size=2, max_size=5),
       mode=st.sampled_from(["metadata", "symbolic"]),
       kernel_sizes=st.sampled_from(["specialized", "auto"]))
def test_random_programs_at_random_shapes_equal_eager_forward_and_backward(source, shapes, mode, kernel_sizes):
    """(kernel_sizes: the suite pins "specialized"; "auto" is the default, under which a symbolic
    region's kernels take its symbolic sizes as parameters and serve every size where the
    generator's recorded decisions come out the same: FJIT_CHECK=1 checks each such reuse against
    a fresh generation)"""
    previous = os.environ.get("FJIT_KERNEL_SIZES"), os.environ.get("FJIT_CHECK")
    os.environ["FJIT_KERNEL_SIZES"] = kernel_sizes
    os.environ["FJIT_CHECK"] = "1"
    try:
        _check_at_shapes(source, shapes, mode)
    finally:
        os.environ["FJIT_KERNEL_SIZES"] = previous[0] if previous[0] is not None else "specialized"
        if previous[1] is None:
            del os.environ["FJIT_CHECK"]
        else:
            os.environ["FJIT_CHECK"] = previous[1]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=shape_polymorphic_programs(), n=st.integers(2, 6), rows=st.integers(2, 6),
       shapes=st.lists(st.tuples(st.sampled_from([1, 1, 2, 3, 5]), st.integers(1, 7)), min_size=1, max_size=4),
       y_rows=st.booleans(), y_cols=st.booleans())
def test_random_programs_after_a_size_of_one_equal_eager_forward_and_backward(source, n, rows, shapes,
                                                                             y_rows, y_cols):
    """Random programs called first with one row, then with more (so the rows are a symbol that
    may be 1), then at random shapes with one row often: every call equals eager, forward and
    backward, FJIT_CHECK=1 checking each kernel reuse."""
    previous = os.environ.get("FJIT_CHECK")
    os.environ["FJIT_CHECK"] = "1"
    try:
        _check_at_shapes(source, [(m, k, y_rows, y_cols) for m, k in [(1, n), (rows, n), *shapes]], "metadata")
    finally:
        if previous is None:
            del os.environ["FJIT_CHECK"]
        else:
            os.environ["FJIT_CHECK"] = previous


@pytest.mark.triton
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=shape_polymorphic_programs(),
       shapes=st.lists(st.tuples(st.integers(0, 7), st.integers(1, 7), st.booleans(), st.booleans()),
                       min_size=2, max_size=4),
       mode=st.sampled_from(["metadata", "symbolic"]))
def test_random_programs_at_random_shapes_through_triton_kernels(source, shapes, mode):
    """The same property with the symbolic regions as Triton kernels (run by Triton's interpreter
    on the CPU, which the suite switches on), each reuse checked against a fresh generation."""
    pytest.importorskip("triton")
    names = ("FJIT_KERNEL_SIZES", "FJIT_CHECK", "FJIT_TRITON_CPU")
    previous = {name: os.environ.get(name) for name in names}
    os.environ.update(FJIT_KERNEL_SIZES="auto", FJIT_CHECK="1", FJIT_TRITON_CPU="1")
    try:
        _check_at_shapes(source, shapes, mode, executors=("triton", "torch"))
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _check_at_shapes(source, shapes, mode, executors=None):
    ns: dict = {"torch": torch}
    exec(source, ns)
    fn = ns["program"]
    jf = fjit.jit(fn, cache=mode) if executors is None else fjit.jit(fn, cache=mode, executors=executors)
    for m, n, y_rows, y_cols in shapes:
        x = torch.randn(m, n, dtype=torch.float64)
        y = torch.randn(m if y_rows else 1, n if y_cols else 1, dtype=torch.float64)
        xs, ys = x.clone().requires_grad_(), y.clone().requires_grad_()
        expected_x, expected_y = x.clone().requires_grad_(), y.clone().requires_grad_()
        try:
            expected = fn(expected_x, expected_y)
        except RuntimeError:                 # e.g. reshape(0, -1): fjit raises as eager does
            with pytest.raises(RuntimeError):
                jf(xs, ys)
            continue
        out = jf(xs, ys)
        torch.testing.assert_close(out, expected, msg=lambda msg: f"{source}\nat {m}x{n}: {msg}")
        if expected.requires_grad and expected.numel():
            cotangent = torch.randn_like(expected)
            grads = torch.autograd.grad(out, (xs, ys), cotangent, allow_unused=True)
            wanted = torch.autograd.grad(expected, (expected_x, expected_y), cotangent, allow_unused=True)
            for g, e in zip(grads, wanted):
                if e is None:
                    continue
                torch.testing.assert_close(g, e, msg=lambda msg: f"{source}\ngrad at {m}x{n}: {msg}")


def test_a_thin_static_inner_dim_matmul_is_unrolled_in_a_symbolic_program():
    """A matmul over a static inner dim of at most 8 (a token MLP over 4 tokens) is the sum of its
    broadcast products in a kernel, in a symbolic program as in a specialized one: the form is
    right at every size, so only its speed is decided by the compiling call's sizes."""
    def mixer(x, w, b):
        return torch.nn.functional.gelu(x @ w + b)

    jf = fjit.jit(mixer)       # the weight's sizes never vary: they stay static
    w, b = torch.randn(4, 96), torch.randn(96)
    for batch, n in ((3, 40), (2, 57), (5, 33), (4, 70)):
        x = torch.randn(batch, n, 4)
        torch.testing.assert_close(jf(x, w, b), mixer(x, w, b), rtol=1e-5, atol=1e-5)
    source = str(fjit.last_traces(jf)[-1])
    assert "s0 = x.shape[0]" in source and "matmul" not in source, source
    assert fjit.cache_info(jf).misses == 2


# ------------------------------------------------------------------------------------------------
# Sizes returned by a symbolic program

def _returns_sizes(x):
    return {"y": torch.tanh(x) * 2, "length": x.shape[1], "rows": x.size(0) * x.shape[1],
            "shape": x.shape, "half": x.shape[1] / 2, "long": x.shape[1] > 6, "last": x.shape[-1] // 2}


@pytest.mark.parametrize("cache", ["metadata", "symbolic"])
def test_sizes_a_symbolic_program_returns_are_the_calls_own(cache):
    """A size the function returns (an int, a product, a Size, a float of one, a comparison) is the
    call's: the program computes it from its symbols.  It had been the trace's symbol object,
    returned to every later call in place of its size (transformers' YOSO under
    torch.compile(backend="fjit") then passed it to an ATen op, which raised)."""
    jf = fjit.jit(_returns_sizes, cache=cache)
    for n in (3, 4, 5, 9, 12):
        x = torch.randn(2, n)
        got, want = jf(x), _returns_sizes(x)
        torch.testing.assert_close(got.pop("y"), want.pop("y"))
        assert got == want and {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}
    assert fjit.cache_info(jf).misses <= 2


class _LossAndSizes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = torch.tanh(self.lin(x)) * 2 + 1
        return h.pow(2).mean(), x.shape[1], x.shape[0] * x.shape[1]


def test_sizes_returned_beside_a_loss_come_from_the_joint_program():
    """The same through a module's joint forward and backward: its number outputs reach the
    caller from the program, and the gradients are eager's."""
    model = _LossAndSizes()
    jm = fjit.jit(copy.deepcopy(model))
    for b, n in ((2, 3), (2, 4), (3, 5), (2, 7)):
        x = torch.randn(b, n, 8)
        (loss, length, rows), (want, wlength, wrows) = jm(x), model(x)
        loss.backward()
        want.backward()
        assert (length, rows) == (wlength, wrows) and type(length) is int and type(rows) is int
        torch.testing.assert_close(loss, want)
    for p, q in zip(jm.parameters(), model.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


def test_a_size_crossing_a_graph_break_of_the_fjit_backend_is_an_int():
    """Under torch.compile(backend="fjit") a graph that returns a size hands it to the code after
    a graph break: it must be the call's int."""
    import torch._dynamo
    torch._dynamo.reset()

    def f(x):
        n = x.shape[1]
        y = torch.tanh(x).reshape(-1)
        torch._dynamo.graph_break()
        return y.reshape(x.shape[0], n) * 2, n
    compiled = torch.compile(f, backend="fjit", dynamic=True)
    for n in (3, 5, 8):
        x = torch.randn(2, n)
        got, want = compiled(x), f(x)
        torch.testing.assert_close(got[0], want[0])
        assert got[1] == n and type(got[1]) is int
    torch._dynamo.reset()


def test_a_symbolic_compile_past_its_budget_makes_only_the_changed_dims_symbolic(monkeypatch):
    """A symbolic compile that runs past its time budget (the shape environment lost in a window
    attention's padding arithmetic over a symbolic image height) is tried once more with only the
    dims that changed symbolic, and the function never makes the whole input symbolic again; each
    step is said in fjit.explain, and every call computes eager's result."""
    import fjit.cache
    budgets = iter([0.0])      # the first symbolic compile runs out at once; the rest have 120 s
    monkeypatch.setattr(fjit.cache.ProgramCache, "symbolic_budget", lambda self: next(budgets, 120.0))

    def f(x):
        h = x.reshape(x.shape[0], -1, 4)
        return torch.softmax(h, -1).sum(1) * x.shape[1]

    jf = fjit.jit(f)
    for shape in [(2, 8), (3, 8), (5, 8), (6, 8)]:
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), f(x))
    assert fjit.cache_info(jf).misses == 2
    explained = str(fjit.explain(jf))
    assert "budget" in explained and "s0 = x.shape[0];" in explained.replace("\n", " ") + ";"
    assert "x.shape[1]" not in explained.split("call 2")[1].split("valid where")[0]
    for shape in [(5, 12), (7, 16)]:      # the length changes too: both dims symbolic, once
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), f(x))
    assert fjit.cache_info(jf).misses == 3


def test_a_symbolic_compile_past_its_budget_twice_specializes(monkeypatch):
    import fjit.cache
    monkeypatch.setattr(fjit.cache.ProgramCache, "symbolic_budget", lambda self: 0.0)
    jf = fjit.jit(lambda x: torch.softmax(x.reshape(x.shape[0], -1, 4), -1) * 2)
    for shape in [(2, 8), (3, 12), (4, 16)]:
        x = torch.randn(shape)
        torch.testing.assert_close(jf(x), torch.softmax(x.reshape(x.shape[0], -1, 4), -1) * 2)
    assert fjit.cache_info(jf).misses == 3
    assert "SymbolicTooSlow" in str(fjit.explain(jf))
