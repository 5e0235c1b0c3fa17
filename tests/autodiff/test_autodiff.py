"""The compiled backward: VJP rules against gradcheck, jitted training-style functions against
eager's gradients, fused kernels in the backward, and the cases autograd makes awkward
(non-differentiable, integer, multiple, aliasing and unused outputs, broadcasting, half types,
double backward)."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fjit
from fjit.autodiff import VJP
from fjit.core.prims import Kind, Prim, prim_of

pytestmark = pytest.mark.ckernels


def _rand(*shape, low=-1.0, high=1.0, seed=0):
    g = torch.Generator().manual_seed(seed + len(shape))
    x = torch.rand(*shape, generator=g, dtype=torch.float64) * (high - low) + low
    return x.requires_grad_()


def _distinct(*shape, shift=0.0):
    """Values far apart from each other (max/min/clamp without ties or kinks near them)."""
    n = 1
    for s in shape:
        n *= s
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(n)).to(torch.float64)
    return (perm.reshape(shape) * 0.37 - n * 0.15 + shift).requires_grad_()


def _unary(op, low=-1.0, high=1.0):
    return lambda: (lambda x: op(x), (_rand(3, 4, low=low, high=high),))


def _binary(op, low=-1.0, high=1.0):
    # broadcasting: a [3, 4] against a [4]
    return lambda: (lambda a, b: op(a, b), (_rand(3, 4, low=low, high=high),
                                            _rand(4, low=low, high=high, seed=1)))


def _ties_apart(op):
    return lambda: (lambda a, b: op(a, b), (_distinct(3, 4), _distinct(4, shift=0.1)))


# One sample per differentiable prim: a function whose trace applies the prim (the test checks
# that it does), and float64 inputs inside the prim's domain.
SAMPLES = {
    Prim.ABS: lambda: (lambda x: x.abs(), (_distinct(3, 4, shift=0.1),)),
    Prim.NEG: _unary(torch.neg), Prim.EXP: _unary(torch.exp), Prim.EXP2: _unary(torch.exp2),
    Prim.EXPM1: _unary(torch.expm1), Prim.LOG: _unary(torch.log, 0.5, 2.0),
    Prim.LOG2: _unary(torch.log2, 0.5, 2.0), Prim.LOG10: _unary(torch.log10, 0.5, 2.0),
    Prim.LOG1P: _unary(torch.log1p, 0.0, 2.0), Prim.SQRT: _unary(torch.sqrt, 0.5, 2.0),
    Prim.RSQRT: _unary(torch.rsqrt, 0.5, 2.0), Prim.SIN: _unary(torch.sin),
    Prim.COS: _unary(torch.cos), Prim.TAN: _unary(torch.tan),
    Prim.ASIN: _unary(torch.asin, -0.9, 0.9), Prim.ACOS: _unary(torch.acos, -0.9, 0.9),
    Prim.ATAN: _unary(torch.atan), Prim.SINH: _unary(torch.sinh), Prim.COSH: _unary(torch.cosh),
    Prim.TANH: _unary(torch.tanh), Prim.SIGMOID: _unary(torch.sigmoid), Prim.ERF: _unary(torch.erf),
    Prim.RECIPROCAL: _unary(torch.reciprocal, 0.5, 2.0), Prim.CLONE: _unary(torch.clone),
    Prim.CONTIGUOUS: _unary(lambda x: x.t().contiguous()),
    Prim.CONVERT: _unary(lambda x: x.float().double() * x),
    Prim.ADD: _binary(torch.add), Prim.SUB: _binary(torch.sub), Prim.MUL: _binary(torch.mul),
    Prim.DIV: _binary(torch.div, 0.5, 2.0), Prim.POW: _binary(torch.pow, 0.5, 2.0),
    Prim.ATAN2: _binary(torch.atan2, 0.5, 2.0),
    Prim.MAXIMUM: _ties_apart(torch.maximum), Prim.MINIMUM: _ties_apart(torch.minimum),
    Prim.CLAMP_MIN: _ties_apart(lambda a, b: torch.clamp(a, min=b)),
    Prim.RELU: lambda: (torch.relu, (_distinct(3, 4, shift=0.1),)),
    Prim.CLAMP_MAX: _ties_apart(lambda a, b: torch.clamp(a, max=b)),
    Prim.REMAINDER: lambda: (lambda a, b: torch.remainder(a, b),
                             (_rand(3, 4, low=0.1, high=0.9), _rand(4, low=1.5, high=2.0))),
    Prim.FMOD: lambda: (lambda a, b: torch.fmod(a, b),
                        (_rand(3, 4, low=2.1, high=2.9), _rand(4, low=1.0, high=1.5))),
    Prim.WHERE: _binary(lambda a, b: torch.where(a.detach() > 0, a, b)),
    Prim.SUM: _unary(lambda x: x.sum(1) + x.sum(0, keepdim=True).sum()),
    Prim.AMAX: lambda: (lambda x: x.amax(1), (_distinct(3, 4),)),
    Prim.AMIN: lambda: (lambda x: x.amin(0, keepdim=True), (_distinct(3, 4),)),
    Prim.PERMUTE: lambda: (lambda x: x.permute(2, 0, 1), (_rand(2, 3, 4),)),
    Prim.RESHAPE: _unary(lambda x: x.reshape(4, 3)),
    Prim.SQUEEZE: lambda: (lambda x: x.squeeze(1), (_rand(3, 1, 4),)),
    Prim.UNSQUEEZE: _unary(lambda x: x.unsqueeze(1)),
    Prim.EXPAND: lambda: (lambda x: x.expand(2, 3, 4), (_rand(3, 1),)),
    Prim.SLICE: lambda: (lambda x: x[1::2, 2], (_rand(5, 4),)),
    Prim.CAT: lambda: (lambda a, b: torch.cat([a, b], 1), (_rand(3, 2), _rand(3, 4))),
    Prim.INDEX_SELECT: _unary(lambda x: x[torch.tensor([2, 0, 2])]),
    Prim.GATHER: _unary(lambda x: F.cross_entropy(x, torch.tensor([3, 1, 0]), reduction="none")),
    Prim.MATMUL: lambda: (lambda a, b, v: (a @ b).sum(0) + v @ b[0],
                          (_rand(2, 3, 4), _rand(1, 4, 5), _rand(4, seed=2))),
}


# A float32 round trip: finite differences need a step float32 can see.


def _shared_unary_samples():
    """The differentiable unary prims without a sample above get one from the shared op table
    (tests/op_samples.py), in its sample range clipped to [-1, 1]: a prim added with its samples
    there is gradchecked here."""
    from op_samples import UNARY
    out = {}
    for p in VJP:
        if p not in SAMPLES and p.block.kind is Kind.UNARY and p.value in UNARY:
            kw = UNARY[p.value][1]
            low, high = max(kw.get("low", -1.0), -1.0), min(kw.get("high", 1.0), 1.0)
            out[p] = _unary(getattr(torch, p.value), low, high)
    return out


SAMPLES.update(_shared_unary_samples())
TOLERANCES = {Prim.CONVERT: dict(eps=1e-2, atol=1e-3)}


def _applies(trace, p) -> bool:
    return any(prim_of(s) is p for b in trace.bsyms for s in (b.subsymbols or (b,)))


def test_every_rule_has_a_gradcheck_sample():
    assert set(VJP) <= set(SAMPLES), f"add a sample for {set(VJP) - set(SAMPLES)}"


@pytest.mark.parametrize("p", sorted(VJP, key=lambda p: p.value), ids=lambda p: p.value)
def test_vjp_rule_gradcheck(p):
    sample, inputs = SAMPLES[p]()
    # the trailing work is fused, without which fjit leaves the backward to torch autograd
    fn = lambda *args: (sample(*args) * 1.5).sin()  # noqa: E731
    jf = fjit.jit(fn, executors=("c", "torch"))
    jf(*inputs)
    assert _applies(fjit.last_traces(jf)[0], p), "the sample does not exercise the rule"
    assert fjit.last_backward_traces(jf), "the compiled backward was not built"
    assert torch.autograd.gradcheck(jf, inputs, **TOLERANCES.get(p, dict(eps=1e-6, atol=1e-5)))


# -- whole functions against eager ------------------------------------------------------------------

def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2).square().mean()


def softmax(x, w):
    return (torch.softmax(x * w, -1) * torch.arange(8.0)).sum()


def layer_norm(x, w, b):
    return F.layer_norm(x, (8,), w, b).tanh().sum()


def rms_norm(x, w):
    return (F.rms_norm(x, (8,), w, eps=1e-6) * x).sum()


def nll_head(x, w, target):
    return F.nll_loss(F.log_softmax(F.rms_norm(x, (8,), w) @ w.new_ones(8, 5), -1), target)


def _f32(*shape, seed=0, grad=True):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed))
    return x.requires_grad_(grad)


CASES = {
    "mlp": (mlp, lambda: (_f32(4, 8, grad=False), _f32(16, 8, seed=1), _f32(16, seed=2),
                          _f32(4, 16, seed=3), _f32(4, seed=4))),
    "softmax": (softmax, lambda: (_f32(4, 8), _f32(8, seed=1))),
    "layer_norm": (layer_norm, lambda: (_f32(4, 8), _f32(8, seed=1), _f32(8, seed=2))),
    "rms_norm": (rms_norm, lambda: (_f32(4, 8), _f32(8, seed=1))),
    "log_softmax_nll": (nll_head, lambda: (_f32(4, 8), _f32(8, seed=1), torch.tensor([0, 4, 2, 1]))),
}


def _grads_match(fn, inputs, jf=None, **tol):
    jf = jf or fjit.jit(fn)
    leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
    for _ in range(2):      # the compiling call, then the cached program
        got = jf(*inputs)
        got_grads = torch.autograd.grad(got, leaves, allow_unused=True, materialize_grads=True)
    want = fn(*inputs)
    want_grads = torch.autograd.grad(want, leaves, allow_unused=True, materialize_grads=True)
    torch.testing.assert_close(got, want, **tol)
    for g, w in zip(got_grads, want_grads):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, **tol)
    return jf


def _code(trace) -> str:
    return "\n".join(line for line in str(trace).splitlines() if not line.lstrip().startswith("#"))


def _c_kernels(trace) -> list:
    return re.findall(r"# C kernel (fjit_c_\w+)", str(trace))


@pytest.mark.parametrize("name", CASES)
def test_gradients_equal_eager_with_fused_backward(name):
    fn, make = CASES[name]
    jf = _grads_match(fn, make())
    backward = fjit.last_backward_traces(jf)
    assert backward and backward[0].stage == "autodiff_backward"
    assert _c_kernels(backward[-1]), f"no C kernel in the backward of {name}:\n{backward[-1]}"
    # printable and runnable, as fjit.last_traces
    assert "def computation(" in str(backward[-1]) and callable(backward[0].python_callable())


def test_backward_of_training_loop_matches_eager_over_steps():
    """SGD steps on the same data: parameters updated in place between calls, no recompile."""
    params = [_f32(16, 8, seed=1), _f32(16, seed=2), _f32(4, 16, seed=3), _f32(4, seed=4)]
    ref = [p.detach().clone().requires_grad_() for p in params]
    x = _f32(4, 8, grad=False)
    jf = fjit.jit(mlp)
    for _ in range(3):
        for fn, ps in ((jf, params), (mlp, ref)):
            loss = fn(x, *ps)
            loss.backward()
            with torch.no_grad():
                for p in ps:
                    p -= 0.1 * p.grad
                    p.grad = None
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r)
    assert fjit.cache_info(jf).misses == 1


# -- outputs and inputs autograd treats specially -----------------------------------------------------

def test_outputs_nondifferentiable_integer_multiple_aliasing_and_unused():
    def f(x, y):
        s = (x * y).sin()
        return s, s.argmax(-1), (x + 1).detach(), x, x.t(), y.exp()
    x, y = _f32(3, 4), _f32(4, seed=1)
    jf = fjit.jit(f)
    for _ in range(2):
        s, idx, det, same, view, unused = jf(x, y)
        assert not idx.requires_grad and idx.dtype == torch.int64
        assert not det.requires_grad and same.requires_grad and view.requires_grad
        gx, gy = torch.autograd.grad(s.sum() + (same * 2).sum() + view[0].sum(), (x, y))
    assert fjit.last_backward_traces(jf)
    es, _, _, esame, eview, _ = f(x, y)
    ex, ey = torch.autograd.grad(es.sum() + (esame * 2).sum() + eview[0].sum(), (x, y))
    torch.testing.assert_close(gx, ex)
    torch.testing.assert_close(gy, ey)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_and_promotion_give_grads_in_the_inputs_dtype(dtype):
    def f(x, y, s):
        return ((x * y + s).tanh() * x.float()).sum(-1, keepdim=False)   # f16 * f32 -> f32
    x, y = _f32(3, 8).to(dtype).detach().requires_grad_(), _f32(8, seed=1)
    _grads_match(lambda x, y: f(x, y, 0.5).sum(), (x, y), atol=1e-2, rtol=1e-2)


def test_broadcast_reductions_keepdim_false_and_runtime_float():
    def f(a, b, c, scale):
        return ((a - b.mean(0)) * c / scale).amax(1).sum() + (a * c).sum((0, 2))[1]
    jf = fjit.jit(f)
    args = (_f32(2, 3, 4), _f32(5, 3, 4, seed=1), _f32(3, 1, seed=2))
    for scale in (2.0, 3.0):
        _grads_match(lambda a, b, c: f(a, b, c, scale), args, jf=lambda *t: jf(*t, scale))
    assert fjit.cache_info(jf).misses == 1


def test_op_without_a_rule_keeps_torch_autograd_between_fused_parts():
    def f(x, w):
        y = torch.cumsum((x * w).sin(), -1)      # a torch fallback: recorded, torch's backward
        return (y.cos() * 3 + 1).sum()
    jf = _grads_match(f, (_f32(4, 8), _f32(8, seed=1)))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "torch autograd's backward of torch.cumsum" in backward
    assert _c_kernels(backward)


@pytest.mark.parametrize("conv, shape, kwargs", [
    (F.conv2d, (2, 3, 9, 9), {"stride": 2, "padding": (1, 0), "groups": 1}),
    (F.conv2d, (2, 4, 8, 8), {"padding": 3, "groups": 4, "dilation": 1}),      # depthwise
    (F.conv1d, (2, 4, 10), {"padding": 1, "dilation": 2}),
    (F.conv3d, (1, 2, 4, 5, 5), {"stride": (1, 2, 1)}),
])
@pytest.mark.parametrize("input_grad", [True, False])
def test_convolution_backward_is_atens_without_a_nested_autograd_call(conv, shape, kwargs, input_grad):
    n = len(shape) - 2
    groups = kwargs.get("groups", 1)
    x = _f32(*shape, grad=input_grad)
    w = _f32(6 if groups == 1 else shape[1], shape[1] // groups, *(3,) * n, seed=1)
    b = _f32(w.shape[0], seed=2)

    def f(x, w, b):
        y = conv(x, w, b, **kwargs)
        return ((y * 2 + 1).sin() * 0.5).sum()
    jf = _grads_match(f, (x, w, b))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "ATen's convolution_backward" in backward and "torch autograd's backward" not in backward
    assert _c_kernels(backward)


@pytest.mark.parametrize("pool, shape", [
    (lambda x: F.avg_pool2d(x, 2), (2, 3, 8, 8)),
    (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 9, 7)),
    (lambda x: F.avg_pool2d(x, (3, 2), stride=(1, 2), padding=(1, 0), divisor_override=5), (3, 7, 6)),
    (lambda x: F.max_pool2d(x, 3, 2, 1), (2, 16, 64, 64)),         # the channels-last route
    (lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), (2, 16, 65, 65)),
])
def test_pool_backward_is_atens_without_a_nested_autograd_call(pool, shape):
    """A 2-D average pool's backward is ATen's avg_pool2d_backward, and a max pool's (the frontend's
    channels-last route) max_pool2d_with_indices_backward on the indices the joint forward
    returns: no nested autograd call, and eager's gradients."""
    x = _f32(*shape, grad=True)

    def f(x):
        return ((pool(x.sin() * 2) + 1).exp() * 0.5).sum()
    jf = _grads_match(f, (x,))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert re.search(r"ATen's (avg|max)_pool2d(_with_indices)?_backward", backward)
    assert "torch autograd's backward" not in backward and _c_kernels(backward)


@pytest.mark.parametrize("mask_kind", ["none", "float", "bool", "causal", "float_grad"])
def test_attention_backward_is_the_flash_kernels_without_a_nested_autograd_call(mask_kind):
    """An attention eager runs as ATen's flash CPU kernel is run by the joint forward as that kernel
    returning its log-sum-exp too, and differentiated by the kernel's backward (what eager's node
    calls): no torch autograd call nested in the program.  A mask that needs a gradient (an
    attention bias) is eager's math path, recorded as its torch calls
    (fjit/decompositions/attention.py): the compiled backward differentiates them, its softmax
    backward a kernel."""
    x = _f32(2, 10, 32, grad=True)
    w = _f32(32, 96, seed=1, grad=True)
    mask = {"none": None, "float": _f32(10, 10, seed=2, grad=False), "causal": None,
            "bool": torch.rand(2, 1, 10, 10, generator=torch.Generator().manual_seed(3)) > 0.3,
            "float_grad": _f32(10, 10, seed=2, grad=True)}[mask_kind]

    def f(x, w, mask):
        q, k, v = (x @ w).view(2, 10, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q * 0.5, k, v, attn_mask=mask,
                                           is_causal=mask_kind == "causal", scale=0.3)
        return (o.transpose(1, 2).reshape(2, 10, 32).sin() * 2).sum()
    # the kernel's sums run in another order where g's layout differs from eager's (errors
    # against float64 are the same size: ~1e-5 of the gradient's scale)
    jf = _grads_match(f, (x, w, mask), rtol=1e-4, atol=1e-3)
    backward = str(fjit.last_backward_traces(jf)[-1])
    flash = "ATen's _scaled_dot_product_flash_attention_for_cpu_backward" in backward
    nested = "torch autograd's backward" in backward
    assert (flash, nested) == ((False, False) if mask_kind == "float_grad" else (True, False)), backward
    if mask_kind == "float_grad":
        assert "prims.exp" in backward.replace("# t", "") or _c_kernels(backward), backward


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask_kind", ["bias", "bias_dead_rows", "bool_dead_rows"])
def test_attention_with_a_bias_is_recorded_as_eagers_math_form(mask_kind, dtype):
    """A float mask that needs a gradient (timm's TinyViT, Swin, LeViT: an attention bias indexed
    from a parameter) is eager's math path: recorded as its torch calls, the mask addition and
    softmax become kernels forward and backward, with no nested torch-autograd island.  Rows that
    are -inf throughout give 0 and a gradient of 0, as `_safe_softmax` does."""
    q, k, v = (_f32(2, 3, 9, 8, seed=s).to(dtype).detach().requires_grad_() for s in range(3))
    bias = _f32(3, 9, 9, seed=4).to(dtype).detach()
    if mask_kind == "bias_dead_rows":
        bias[1, 4] = float("-inf")
    mask = bias.requires_grad_() if mask_kind != "bool_dead_rows" else (bias > -0.5).index_fill_(1, torch.tensor([2]), False)

    def f(q, k, v, mask):
        return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask).cos() * 2).sum()
    jf = _grads_match(f, (q, k, v, mask), rtol=1e-4, atol=1e-5)
    backward = str(fjit.last_backward_traces(jf)[-1])
    if dtype == torch.float32:      # (float64's softmax stays ATen's, under torch autograd)
        assert "torch autograd's backward" not in backward and _c_kernels(backward), backward
    if mask_kind != "bool_dead_rows":   # (a 3-d boolean mask: eager's choice is its math form too)
        assert "scaled_dot_product" not in _code(fjit.last_traces(jf)[-1])


@pytest.mark.parametrize("mask", ["float64", "grows_the_scores"])
def test_attention_with_a_mask_eager_refuses_is_refused_too(mask):
    """The math form is recorded only for a mask eager adds in place: one of the query's dtype
    (or boolean) that broadcasts into the scores.  Others get eager's own error, not a result."""
    q, k, v = (_f32(3, 7, 8, seed=s) for s in range(3))      # 3-d: eager's math form
    m = {"float64": _f32(3, 7, 7, seed=4).double(), "grows_the_scores": _f32(2, 3, 7, 7, seed=4)}[mask]

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)
    with pytest.raises(RuntimeError):
        f(q, k, v, m)
    with pytest.raises(RuntimeError):
        fjit.jit(f)(q, k, v, m)


@pytest.mark.parametrize("shape", [(2, 5, 3, 8), (1, 2, 2, 1), (1, 1, 1, 1)])
def test_attention_on_transposed_operands_with_a_query_needing_no_gradient(shape):
    """The flash backward returns all three cotangents: the query's, which nothing wants here, is
    dropped, not laid out; transposed (non-contiguous) operands get the backend torch chooses for
    their layout, so the output has eager's layout and values (property runs found both)."""
    q, k, v = _f32(*shape, grad=False), _f32(*shape, seed=1), _f32(*shape, seed=2)

    def f(q, k, v):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    jf = _grads_match(lambda q, k, v: f(q, k, v).sin().sum(), (q, k, v), rtol=1e-4, atol=1e-5)
    got, want = fjit.jit(f)(q, k, v), f(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert got.is_contiguous() == want.is_contiguous() and jf is not None


@pytest.mark.parametrize("transposed_query", [False, True])
def test_grouped_query_attention_matmuls_read_each_key_value_head_once(transposed_query):
    """transformers' repeat_kv (an expand and a copying reshape per key/value tensor) feeding
    q @ k.mT and p @ v is recorded as matmuls of each key/value head with its group of query heads
    stacked as rows: no copy of k or v per group in the program, and eager's values and
    gradients.  A query whose heads cannot be regrouped without a copy (laid out [B, L, H, D]) is
    copied once instead, and its backward has no sum over each group either."""
    def repeat_kv(h, n):
        b, kvh, length, d = h.shape
        return h[:, :, None, :, :].expand(b, kvh, n, length, d).reshape(b, kvh * n, length, d)

    def f(q, k, v):
        q = q.transpose(1, 2) if transposed_query else q
        p = torch.softmax(torch.matmul(q, repeat_kv(k, 3).transpose(2, 3)) * 0.25, -1)
        return torch.matmul(p, repeat_kv(v, 3)).sin().sum()
    q = _f32(*((2, 5, 6, 8) if transposed_query else (2, 6, 5, 8)))
    k, v = _f32(2, 2, 5, 8, seed=1), _f32(2, 2, 5, 8, seed=2)
    jf = _grads_match(f, (q, k, v), rtol=1e-5, atol=1e-5)
    forward = str(fjit.last_traces(jf)[-1])
    assert "torch.Tensor.expand(" not in forward, forward
    backward = _code(fjit.last_backward_traces(jf)[-1])
    assert "prims.sum(" not in backward, backward


@pytest.mark.parametrize("executors", [("c", "torch"), ("triton", "torch"), ("torch",)])
def test_clamp_between_two_tensors_differentiates_as_eager_where_the_bounds_meet_or_cross(executors, monkeypatch):
    """Eager's clamp(x, lo, hi) sends the gradient to hi alone where lo > hi, and to nobody where
    x < lo == hi: not what max-then-min's rules give at their ties."""
    cases = [(0., 1., 2.), (3., 1., 2.), (1.5, 1., 2.), (0., 2., 1.), (1.5, 2., 1.), (3., 2., 1.),
             (0., 1., 1.), (1., 1., 1.), (2., 1., 1.), (1., 1., 2.), (2., 1., 2.)]
    x, lo, hi = (torch.tensor(column, requires_grad=True) for column in zip(*cases))

    def f(x, lo, hi):
        return (torch.clamp(x, lo, hi) * 2.5).sin()
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")
    jf = fjit.jit(f, executors=executors)
    _grads_match(lambda *t: f(*t).sum(), (x, lo, hi), jf=lambda *t: jf(*t).sum())


def test_convolution_with_string_padding_keeps_torch_autograd():
    def f(x, w):
        return ((F.conv2d(x, w, padding="same") * 2 + 1).sin() * 0.5 + 1).cos().sum()
    jf = _grads_match(f, (_f32(2, 3, 8, 8), _f32(4, 3, 3, 3, seed=1)))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "ATen's convolution_backward" not in backward


def test_nothing_to_fuse_leaves_the_backward_to_torch_autograd():
    x = _f32(4, 8)
    jf = fjit.jit(lambda x: x.t().reshape(32), executors=("c", "torch"))   # views only
    jf(x).sum().backward()
    (stage,) = fjit.last_backward_traces(jf)     # what ran, and why: never empty after a backward
    assert stage.stage.startswith("torch_autograd: ") and "because" in stage.stage
    assert "torch_autograd" in str(stage).splitlines()[0]
    torch.testing.assert_close(x.grad, torch.ones(4, 8))


def test_no_grad_call_and_grad_call_get_separate_programs():
    x = _f32(4, 8)
    jf = fjit.jit(lambda x: (x * 2).sin().sum())
    with torch.no_grad():
        jf(x)
    assert fjit.last_backward_traces(jf) == []
    jf(x).backward()
    assert fjit.last_backward_traces(jf)
    torch.testing.assert_close(x.grad, 2 * torch.cos(2 * x.detach()))


@pytest.mark.parametrize("executors", [("c", "torch"), ("torch",)])
def test_double_backward_gives_eagers_second_derivatives_on_every_call(executors, caplog):
    """create_graph=True through a compiled backward (gradient penalties, MAML, Hessian-vector
    products): that call recomputes the forward with torch autograd and differentiates it."""
    def f(x, w):
        return ((x @ w).sin() * 2 + x.sum()).tanh()
    jf = fjit.jit(f, executors=executors)
    x, w = _f32(4, 3), _f32(3, 5, seed=1)
    with caplog.at_level("DEBUG", logger="fjit.recompiles"):
        for _ in range(3):
            got, want = [], []
            for fn, out in ((jf, got), (f, want)):
                (g,) = torch.autograd.grad(fn(x, w).sum(), x, create_graph=True)
                out += [g.detach(), *torch.autograd.grad(g.pow(2).sum(), (x, w))]
            torch.testing.assert_close(got, want)
    if executors == ("c", "torch"):
        assert fjit.last_backward_traces(jf)[0].stage == "autodiff_backward"
        assert "differentiable recompute" in caplog.text
    v = torch.randn(4, 3)
    hvp = torch.autograd.functional.hvp
    torch.testing.assert_close(hvp(lambda x: jf(x, w).sum(), x.detach(), v)[1],
                               hvp(lambda x: f(x, w).sum(), x.detach(), v)[1])



def test_retain_graph_allows_a_second_backward():
    x = _f32(4, 8)
    def f(x):       # fused parts and a recorded op
        return (torch.cumsum(x.sin() * 2 + 1, -1).cos() * x + 1).sum()
    jf = fjit.jit(f)
    out = jf(x)
    first = torch.autograd.grad(out, x, retain_graph=True)[0]
    second = torch.autograd.grad(out, x)[0]
    assert fjit.last_backward_traces(jf)
    torch.testing.assert_close(first, second)
    torch.testing.assert_close(first, torch.autograd.grad(f(x), x)[0])


def test_last_backward_traces_needs_a_jitted_function():
    with pytest.raises(TypeError, match="fjit.jit"):
        fjit.last_backward_traces(lambda x: x)


# -- random programs -------------------------------------------------------------------------------

_UNARY = [torch.sin, torch.tanh, torch.sigmoid, torch.exp, lambda t: t * t, torch.neg,
          lambda t: F.relu(t), lambda t: t.abs() + 1, lambda t: torch.softmax(t, -1)]
_BINARY = [torch.add, torch.sub, torch.mul, lambda a, b: a / (b.abs() + 1), torch.maximum,
           lambda a, b: torch.where(a > b, a, b * 2)]


@st.composite
def _programs(draw):
    shapes = [(3, 4), (4,), (3, 1), (1, 4)]
    inputs = [draw(st.sampled_from(shapes)) for _ in range(draw(st.integers(1, 3)))]
    steps = []
    for _ in range(draw(st.integers(1, 6))):
        if draw(st.booleans()):
            steps.append(("u", draw(st.integers(0, len(_UNARY) - 1)), draw(st.integers(0, 99))))
        else:
            steps.append(("b", draw(st.integers(0, len(_BINARY) - 1)), draw(st.integers(0, 99)),
                          draw(st.integers(0, 99))))
    reduce_dim = draw(st.sampled_from([None, 0, -1]))
    return inputs, steps, reduce_dim


def _run(steps, reduce_dim, *xs):
    values = list(xs)
    for step in steps:
        if step[0] == "u":
            values.append(_UNARY[step[1]](values[step[2] % len(values)]))
        else:
            values.append(_BINARY[step[1]](values[step[2] % len(values)],
                                           values[step[3] % len(values)]))
    out = values[-1]
    return out.sum() if reduce_dim is None else out.sum(reduce_dim).square().sum()


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(_programs())
def test_random_programs_gradients_match_eager(program):
    """Compiled gradients agree with eager's, judged against float64: a compiled program's sums
    run in another order (a broadcast input's gradient summed in one kernel, in double lanes), so
    where eager's float32 result is itself off by more than the default tolerance, the compiled
    one must be no farther from the exact value than eager's (plus a few float32 roundings)."""
    shapes, steps, reduce_dim = program
    xs = [_f32(*s, seed=i) for i, s in enumerate(shapes)]
    fn = lambda *t: _run(steps, reduce_dim, *t)  # noqa: E731
    jf = fjit.jit(fn)
    for _ in range(2):      # the compiling call, then the cached program
        got = jf(*xs)
        got_grads = torch.autograd.grad(got, xs, allow_unused=True, materialize_grads=True)
    want = fn(*xs)
    want_grads = torch.autograd.grad(want, xs, allow_unused=True, materialize_grads=True)
    exact = [x.detach().double().requires_grad_() for x in xs]
    exact_grads = torch.autograd.grad(fn(*exact), exact, allow_unused=True, materialize_grads=True)
    for g, w, e in zip((got, *got_grads), (want, *want_grads), (fn(*exact), *exact_grads)):
        assert g.dtype == w.dtype and g.shape == w.shape
        ours, eagers = (g.double() - e).abs().max(), (w.double() - e).abs().max()
        scale = e.abs().max() + 1
        assert ours <= 2 * eagers + 8 * torch.finfo(torch.float32).eps * scale, (ours, eagers, scale)


@pytest.mark.parametrize("op", [
    lambda a, b: a.clamp(b, None), lambda a, b: a.clamp(None, b), torch.maximum, torch.minimum,
    lambda a, b: a.clamp(a, None)], ids=["clamp_min", "clamp_max", "maximum", "minimum", "clamp_self"])
def test_selection_grads_at_ties_and_nans_are_eagers(op):
    """gradcheck's smooth samples never tie or hold a NaN; torch's formulas decide there (a NaN
    loses nothing in maximum, clamps nothing in clamp).  Found by the property test with specials."""
    nan, inf = float("nan"), float("inf")
    a = torch.tensor([nan, 1.0, 2.0, -inf, 3.0, inf])
    b = torch.tensor([1.0, nan, 2.0, 0.0, 1.0, inf])

    def f(x, y):
        return op(x, y) * 2.5
    got, want = [], []
    for fn, out in ((fjit.jit(f, executors=("c", "torch")), got), (f, want)):
        x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
        fn(x, y).sum().backward()
        out += [x.grad, y.grad]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True, atol=0, rtol=0)


def test_an_input_linked_only_through_zero_derivatives_gets_zeros_not_none():
    """eager's autograd graph reaches x through floor/sign (derivative 0): x.grad is zeros, and an
    optimizer steps it (weight decay); a detached input stays None.  Found by the property hunt."""
    def f(x, y):
        return torch.floor(x * 2) + torch.sign(x) + y.detach()
    grads = []
    for fn in (fjit.jit(f, executors=("c", "torch")), f):
        x, y = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
        fn(x, y).sum().backward()
        grads.append((x.grad, y.grad))
    (gx, gy), (ex, ey) = grads
    assert ex is not None and ey is None
    assert gy is None
    torch.testing.assert_close(gx, ex)


def test_an_input_giving_only_its_shape_gets_none_as_in_eager():
    """view_as/reshape_as/expand_as read their second operand's shape only: eager's graph does
    not reach it, so its .grad stays None (an optimizer then skips it rather than decaying it)."""
    def f(x, like):
        return (x.view_as(like) * 2).sin() + x.reshape_as(like) + x[:1].expand_as(like)
    for fn in (fjit.jit(f, executors=("c", "torch")), f):
        x, like = _f32(4, 3, seed=1), _f32(4, 3, seed=2)
        for _ in range(2):                       # first and cached call
            x.grad = None
            fn(x, like).sum().backward()
            assert like.grad is None and x.grad is not None


def test_embedding_padding_row_gets_no_gradient_from_the_lookup_on_every_call():
    """F.embedding(padding_idx=p): eager's backward skips the positions that read row p, which a
    tied weight (Pegasus's and BART's shared embedding and LM head) still gets gradient to from its
    other use.  The lookup's rows were differentiated as a plain index_select: wrong on the cached
    call."""
    def f(ids, w, h):
        e = F.embedding(ids, w, padding_idx=0) * 2.0
        return ((e.sin() + h) @ w.t()).logsumexp(-1).sum()
    ids = torch.tensor([[0, 2, 0, 1], [3, 0, 2, 2]])
    jf = fjit.jit(f, executors=("c", "torch"))
    for seed in range(3):
        w, h = _f32(4, 5, seed=seed).double(), _f32(2, 4, 5, seed=seed + 10, grad=False).double()
        got, want = (torch.autograd.grad(fn(ids, x, h), x)[0]
                     for fn, x in ((jf, w.detach().requires_grad_()), (f, w.detach().requires_grad_())))
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("executors", [("c", "torch"), ("torch",)])
def test_relu_gradient_passes_nan_and_blocks_zero_on_every_call(executors):
    """relu's gradient is threshold_backward's (blocked where x <= 0, so a NaN passes it), not
    clamp_min's (which blocks a NaN and passes 0).  The compiling call ran torch ops, so only
    cached calls showed the difference; found by the property hunt."""
    def f(x, w, s):
        return torch.relu(torch.einsum("ij,jk->ik", x, w) * 2 + 1) * s
    jf = fjit.jit(f, executors=executors)
    for s in (0.1, 2.0, -1.5):          # the compiling call, then cached calls
        grads = []
        for fn in (jf, f):
            x = torch.tensor([[float("nan")], [-0.5], [0.0], [-0.25]], dtype=torch.float64,
                             requires_grad=True)
            fn(x, torch.tensor([[2.0]], dtype=torch.float64), s).sum().backward()
            grads.append(x.grad)
        torch.testing.assert_close(grads[0], grads[1], atol=0, rtol=0, equal_nan=True)


def test_in_place_ops_on_intermediates_under_grad_as_resnets_and_mobilenets_write_them():
    """`out += identity`, nn.ReLU(inplace=True), hardswish_/silu_ in place: legal in eager on
    values the function computed, while inputs require grad (the in-place check's stand-ins must
    not be leaves requiring grad, which eager refuses only for inputs)."""
    def f(x, w):
        h = x @ w
        h += 1
        g = F.hardswish(h, inplace=True) * 1.5
        g = F.silu(g, inplace=True) + 0
        g.relu_()
        return g.add(1).add_(x.sum())
    jf = fjit.jit(f)
    for _ in range(3):
        x, w = _f32(4, 3), _f32(3, 5)
        got = jf(x, w)
        gx, gw = torch.autograd.grad(got.sum(), (x, w))
        want = f(x, w)
        ex, ew = torch.autograd.grad(want.sum(), (x, w))
        torch.testing.assert_close((got, gx, gw), (want, ex, ew))


def test_cat_with_an_empty_one_dimensional_tensor_differentiates():
    """torch.cat skips 1-D empty tensors whatever the others' rank (a key/value cache's start)."""
    def f(x):
        return torch.cat([torch.empty(0), x.sin()], dim=-1).sum()
    x = _f32(2, 3)
    (got,) = torch.autograd.grad(fjit.jit(f)(x), x)
    torch.testing.assert_close(got, x.detach().cos())


def test_backward_keeps_no_view_that_changes_nothing_and_pads_slices_back():
    """A linear layer's weight is permuted in the forward and back for its gradient, reshapes go
    to the shape a value already has: the cleanup drops such views (passes.basic.simplify_views),
    and a slice's gradient is one zero padding rather than a copy of zeros and a scatter."""
    x, w1, w2 = _f32(4, 6, 8), _f32(10, 8, seed=1), _f32(3, 5, seed=2)

    def f(x, w1, w2):
        h = F.linear(x, w1).tanh()[:, 1:5, 2:7]
        return (F.linear(h, w2) * 2 + 1).sin().sum()
    jf = _grads_match(f, (x.requires_grad_(), w1.requires_grad_(), w2.requires_grad_()))
    backward = fjit.last_backward_traces(jf)[-1]
    made = {}
    for b in backward.bsyms:
        p = prim_of(b)
        if p in (Prim.PERMUTE, Prim.RESHAPE, Prim.SLICE, Prim.EXPAND, Prim.CONTIGUOUS) and not b.subsymbols:
            x_in, y = b.args[0], b.output
            assert (tuple(x_in.shape), x_in.strides) != (tuple(y.shape), y.strides), str(b)
            assert not (p is Prim.PERMUTE and made.get(x_in.name) is Prim.PERMUTE), str(b)
        for v in b.outputs():
            made[v.name] = p
    text = str(backward)
    assert "torch.nn.functional.pad" in text and "setitem" not in text


def _saved(jf) -> list:
    """The values the joint program's forward saves for its backward: its outputs after the
    caller's."""
    forward, backward = fjit.last_traces(jf)[-1], fjit.last_backward_traces(jf)[-1]
    names = {v.name for v in backward.inputs}
    return [v for v in forward.output if getattr(v, "name", None) in names]


@pytest.mark.parametrize("rows", [4, 512])
def test_pointwise_values_are_recomputed_from_what_the_backward_holds(rows, monkeypatch):
    """z * z's backward reads z = |x| * 2, and exp(x) * x's reads exp(x): both are recomputed in
    the backward from x, which the caller holds anyway, at any size, so the forward saves no
    value of x's shape (the minimum cut: saving z or exp(x) would hold bytes that x already
    holds).  The matmul's output, which no cheap op makes again, is saved as tanh's output.
    The gradients are eager's."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(rows, 128, requires_grad=True)
    w = torch.randn(128, 8, requires_grad=True)

    def f(x, w):
        z = torch.abs(x) * 2
        return (((z * z) @ w).tanh()).sum() + (torch.exp(x) * x).sum()
    jf = fjit.jit(f)
    jf(x, w).backward()
    got = (x.grad.clone(), w.grad.clone())
    x.grad = w.grad = None
    f(x, w).backward()
    torch.testing.assert_close(got, (x.grad, w.grad))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "abs" in backward and "exp" in backward, backward
    saved = _saved(jf)
    assert [v.name for v in saved if tuple(v.shape) == (rows, 128)] == ["x"], saved
    assert [tuple(v.shape) for v in saved if v.name not in ("x", "w")] == [(rows, 8)], saved


def test_gelu_output_is_recomputed_for_the_weight_gradient(monkeypatch):
    """An MLP's GELU: the forward saves h alone, where eager saves h and GELU's output (fc2's
    weight gradient reads it); the backward computes GELU(h) again for that gradient, and erf(h)
    for GELU's own.  Half the activation bytes, eager's gradients."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    x = torch.randn(8, 64, 32, requires_grad=True)         # [8, 64, 128]: 2^16 elements
    jm = fjit.jit(mlp)
    jm(x).square().sum().backward()
    got = (x.grad.clone(), *(p.grad.clone() for p in mlp.parameters()))
    x.grad = None
    mlp.zero_grad()
    mlp(x).square().sum().backward()
    torch.testing.assert_close(got, (x.grad, *(p.grad for p in mlp.parameters())))
    wide = [v for v in _saved(jm) if tuple(v.shape) == (8, 64, 128)]
    assert len(wide) == 1, _saved(jm)                                  # h
    assert "erf" in str(fjit.last_backward_traces(jm)[-1])


@pytest.mark.parametrize("what", ["matmul", "linear_bias"])
def test_a_matmuls_operand_is_recomputed_only_from_values_held(what, monkeypatch):
    """A matmul operand the forward computed pointwise from an input (|x| * 2 entering a matmul)
    is computed again in the backward from x, which is held anyway; a linear layer's biased output
    entering attention's matmuls is saved as the forward wrote it (no cheap op makes the matmul's
    output again, and saving it before the bias add would hold as many bytes)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.randn(512, 128, requires_grad=True)
    w = torch.randn(128, 128, requires_grad=True)
    b = torch.randn(128, requires_grad=True)

    def f(x, w, b):
        if what == "matmul":
            return ((torch.abs(x) * 2) @ w).sum()
        q = torch.nn.functional.linear(x, w, b)
        return (q @ q.t()).tanh().sum()
    jf = fjit.jit(f)
    jf(x, w, b).backward()
    got = tuple(t.grad.clone() for t in (x, w, b) if t.grad is not None)
    x.grad = w.grad = b.grad = None
    f(x, w, b).backward()
    torch.testing.assert_close(got, tuple(t.grad for t in (x, w, b) if t.grad is not None))
    backward = str(fjit.last_backward_traces(jf)[-1])
    run = "\n".join(line for line in backward.splitlines() if not line.lstrip().startswith("#"))
    assert ("abs" in backward) is (what == "matmul") and "prims.add(" not in run, backward
    assert all(v.name in ("x", "w", "b") for v in _saved(jf) if tuple(v.shape) == (512, 128)) is (what == "matmul")
    forward = str(fjit.last_traces(jf)[-1])
    assert what == "matmul" or "functional.linear" in forward, forward     # F.linear stays whole


def test_relu_backward_reads_relus_output_recomputed_from_the_input(monkeypatch):
    """relu's rule reads relu(x), as eager's ReluBackward0 does (relu(x) <= 0 exactly where
    x <= 0: a NaN passes the cotangent, 0 and -0.0 block it).  That output, the convolution's
    operand, is computed again in the backward from the input and the statistics rather than
    saved: the forward saves no activation."""
    x = torch.randn(2, 3, 8, 8)
    x[0, 0, 0, :4] = torch.tensor([0.0, -0.0, float("nan"), 1.0])
    x.requires_grad_()
    w = _f32(4, 3, 3, 3, seed=1)

    def f(x, w):
        mean = x.mean((0, 2, 3), keepdim=True)
        var = ((x - mean) ** 2).mean((0, 2, 3), keepdim=True)
        h = torch.relu((x - mean) * torch.rsqrt(var + 1e-5) * 2.0 + 0.5)
        return torch.nn.functional.conv2d(h, w, padding=1)
    monkeypatch.setenv("FJIT_MEASURE", "0")
    jf = fjit.jit(f)
    g = torch.randn(2, 4, 8, 8)
    for _ in range(2):
        got = torch.autograd.grad(jf(x, w), (x, w), g)
    want = torch.autograd.grad(f(x, w), (x, w), g)
    torch.testing.assert_close(got, want, equal_nan=True)
    assert "torch autograd" not in fjit.last_backward_traces(jf)[0].stage     # the joint program
    backward = str(fjit.last_backward_traces(jf)[-1])
    inputs = backward.splitlines()[backward.splitlines().index(next(
        line for line in backward.splitlines() if line.startswith("def computation("))) + 1]
    # the backward reads one activation, x, which the caller holds: relu's output, the next
    # layer's operand, is computed again from it and the statistics
    assert inputs.count('"cpu f32[2, 3, 8, 8]"') == 1 and 'x: "cpu f32[2, 3, 8, 8]"' in inputs, inputs


_SLICED = {
    # name: (function of y [4, 12], what the backward joins the slices' cotangents with)
    "split": (lambda y: (lambda q, k, v: (q * k.sin() + v).sum())(*y.split(4, dim=-1)), "cat"),
    "rotate_half": (lambda y: (torch.cat((-y[..., 6:], y[..., :6]), -1) * 0.5 + y.cos()).sum(), "cat"),
    "gapped": (lambda y: (y[:, :3].exp().sum() + (y[:, 7:] * 3).sum()), "cat"),
    "overlapping": (lambda y: (y[:, :5].exp().sum() + (y[:, 3:] * 3).sum()), "pad"),
}


@pytest.mark.parametrize("name", _SLICED)
def test_cotangents_of_slices_of_one_value_are_one_cat(name, monkeypatch):
    """Slices of one value that cut one dim into disjoint ranges (a split, a rotate-half, slices
    with a gap between) get their cotangents back as one cat, zeros in the gaps; overlapping ones
    are zero-padded and summed. The gradients are eager's either way."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    fn, joined = _SLICED[name]
    jf = _grads_match(lambda x, w: fn(x @ w), (_f32(4, 5), _f32(5, 12, seed=1)))
    # the stage before kernel fusion (a C kernel may then compute the cat piece by piece)
    backward = str(next(t for t in fjit.last_backward_traces(jf) if t.stage == "dce"))
    run = "\n".join(line for line in backward.splitlines() if not line.lstrip().startswith("#"))
    assert ("prims.cat" in run) is (joined == "cat"), backward     # a pad's own cat is in its comment
    assert ("functional.pad" in run) is (joined == "pad"), backward


@pytest.mark.parametrize("index, undo", [((slice(None), None), "reshape"), ((slice(None), 1), "pad"),
                                         ((Ellipsis, None, slice(1, 3)), "pad"),
                                         ((slice(None), slice(0, None)), "nothing")])
def test_basic_index_backward_is_a_view_or_one_pad(index, undo, monkeypatch):
    """x[:, None] gives its cotangent back by a reshape, x[:, 1] and x[..., None, 1:3] by one
    pad, a full slice by nothing: none of them writes into a zeros tensor (setitem)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    jf = _grads_match(lambda x: (x.sin()[index] * 2).exp().sum(), (_f32(3, 4),))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "setitem" not in backward, backward
    assert ("functional.pad" in backward) is (undo == "pad"), backward


def test_square_backward_is_a_product():
    """x ** 2's derivative is 2 * x, not 2 * x ** 1 (a pow the kernel would compute)."""
    jf = _grads_match(lambda x: (x.sin() ** 2).sum(), (_f32(3, 4),))
    assert "pow" not in str(fjit.last_backward_traces(jf)[-1])


def _pool_input():
    """Values with ties (small integers) and NaNs, 32 channels, 2^16+ elements: the shapes
    decompositions/nn_ops.py sends through the channels-last kernel."""
    x = torch.randint(0, 4, (4, 32, 24, 24), generator=torch.Generator().manual_seed(0)).float()
    x[0, 0, 3, 3] = x[1, 5, 4, 4] = x[1, 5, 4, 5] = float("nan")
    return x.requires_grad_()


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_max_pool_through_channels_last_gives_eagers_values_indices_and_double_backward(ceil_mode):
    def f(x, w):
        y = F.max_pool2d(x * w, 3, 2, 1, ceil_mode=ceil_mode)
        return y, torch.autograd.grad(y.nan_to_num().square().sum(), x, create_graph=True)[0]
    x, w = _pool_input(), torch.tensor(1.5, requires_grad=True)

    def step(fn):
        y, gx = fn(x, w)          # the gradient of a gradient reaches w through the pool's backward
        return y, gx, torch.autograd.grad(gx.sum(), w)[0]
    jf = fjit.jit(lambda x, w: F.max_pool2d(x * w, 3, 2, 1, ceil_mode=ceil_mode))
    for _ in range(2):
        got = step(lambda x, w: (lambda y: (y, torch.autograd.grad(y.nan_to_num().square().sum(), x,
                                                                   create_graph=True)[0]))(jf(x, w)))
    want = step(f)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
    assert "fjit_ops.max_pool2d" in str(fjit.last_traces(jf)[-1])


@pytest.mark.parametrize("shape", [(4, 8, 24, 24), (1, 32, 8, 8)])
def test_max_pool_of_few_channels_or_elements_stays_the_torch_call(shape):
    jf = fjit.jit(lambda x: F.max_pool2d(x, 2))
    x = torch.randn(shape)
    torch.testing.assert_close(jf(x), F.max_pool2d(x, 2))
    assert "fjit_ops.max_pool2d" not in str(fjit.last_traces(jf)[-1])


@pytest.mark.parametrize("base", [2, 0, 0.5, -2.0])
def test_number_to_a_tensor_power_differentiates_as_eager(base, monkeypatch):
    """base ** x: the exponent's derivative is out * log(base), a number (0 where base == 0 and
    x >= 0, as torch's rule says); the long property run found it crashing (log of an int)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.tensor([-1.5, 0.0, 0.5, 2.0, 3.0], requires_grad=True)
    w = torch.tensor(1.0, requires_grad=True)
    jf = _grads_match(lambda x, w: ((base ** (x * w)).sin() * 2 + base ** (x * w)).sum(), (x, w),
                      equal_nan=True)
    assert _c_kernels(fjit.last_backward_traces(jf)[-1])


@pytest.mark.parametrize("shape, correction", [((), 0), ((3, 1), 0), ((2, 4), 1)])
def test_std_of_constant_values_has_eagers_zero_gradient(shape, correction, monkeypatch):
    """Eager's std backward is 0 where the result is 0 (a single value, or equal ones); sqrt's own
    rule gives 0 * inf = NaN there.  Found by the long property run (std of a 0-d tensor)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    x = torch.full(shape, 1.5).requires_grad_()
    w = torch.randn(shape, generator=torch.Generator().manual_seed(0)).requires_grad_()
    dim = -1 if shape else None
    _grads_match(lambda x, w: (torch.std(x * 2, dim=dim, correction=correction) * 3 + (w * x).sin().sum()).sum(),
                 (x, w))


@pytest.mark.parametrize("op", [torch.var, torch.std])
def test_the_mean_is_a_constant_to_a_variances_backward(op):
    """var's gradient is eager's 2 (x - mean) g / n: the mean's own term (zero but for rounding)
    is left out, so a row holding an infinity gives NaN only where eager's does, not over the whole
    row (found by the random programs of test_properties.py on special values)."""
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf, -0.0, 1.0], [nan, 2.0, 3.0], [1.0, 2.0, 4.0]], requires_grad=True)
    jf = fjit.jit(lambda x: op(x, dim=1) * 2.5)
    for _ in range(2):
        (got,) = torch.autograd.grad(jf(x).sum(), x)
    (want,) = torch.autograd.grad((op(x, dim=1) * 2.5).sum(), x)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("op", [torch.softmax, torch.log_softmax])
def test_softmax_max_shift_is_a_constant_to_the_backward(op):
    """softmax(x) = softmax(x - max(x)): the shift's derivative is zero, so the backward treats
    the max as a constant (as eager's formula, and jax's stop_gradient): it computes no max, and
    the gradient is eager's, ties at the max included."""
    def f(x):
        return op(x * 2, -1)
    x = torch.tensor([[1.0, 3.0, 3.0, -2.0], [0.5, 0.25, -1.0, 0.5]], dtype=torch.float64,
                     requires_grad=True)
    g = torch.tensor([[1.0, -2.0, 0.5, 3.0], [2.0, 1.0, -1.0, 0.25]], dtype=torch.float64)
    jf = fjit.jit(f)
    for _ in range(2):
        (got,) = torch.autograd.grad(jf(x), x, g)
    (want,) = torch.autograd.grad(f(x), x, g)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # the forward saves the max and the sum: exp(shifted) is computed again from x, held anyway
    assert sorted((v.name == "x", tuple(v.shape)) for v in _saved(jf)) == [(False, (2, 1))] * 2 + [(True, (2, 4))]
    assert "amax" not in str(fjit.last_backward_traces(jf)[-1])


def test_a_reshape_that_copies_is_saved_not_copied_again_in_the_backward():
    """Grouped-query attention repeats keys by expanding and reshaping them, a reshape that must
    copy: the backward reads the forward's copy (a small value is saved) instead of making the
    copy again, as it would for a reshape that is a view.  (The query is transposed, so its heads
    cannot be regrouped as rows without a copy and the repeat stays: see
    test_grouped_query_attention_matmuls_read_each_key_value_head_once.)"""
    def f(q, k):
        keys = k[:, :, None].expand(2, 2, 2, 16, 8).reshape(2, 4, 16, 8)
        scores = torch.softmax((q.transpose(1, 2) @ keys.transpose(-1, -2)) * 0.3 + 1, -1)
        return (scores.mul(2).add(1).tanh() * scores.sigmoid()).sum()
    q = torch.randn(2, 16, 4, 8, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 2, 16, 8, dtype=torch.float64, requires_grad=True)
    jf = fjit.jit(f)
    for _ in range(2):
        got = torch.autograd.grad(jf(q, k), (q, k))
    torch.testing.assert_close(got, torch.autograd.grad(f(q, k), (q, k)))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert not re.search(r"prims\.reshape\(.*# t\d+: \"cpu f64\[2, 4, 16, 8\]\"", backward), backward


def test_a_divisors_gradient_is_torchs_bit_for_bit():
    """d(a / c)/dc is computed as torch's autograd computes it, -g * ((a / c) / c), reading the
    quotient the forward computed (softmax's backward then needs no square of its sum): the same
    float32 bits as eager's, where -g * a / c**2 differed in about half of the elements."""
    def f(a, c):
        return ((a / c) * 3 + 1) * 2
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1000, generator=g, requires_grad=True)
    c = (torch.rand(1000, generator=g) + 0.1).requires_grad_()
    cotangent = torch.randn(1000, generator=g)
    jf = fjit.jit(f)
    for _ in range(2):
        got = torch.autograd.grad(jf(a, c), (a, c), cotangent)
    want = torch.autograd.grad(f(a, c), (a, c), cotangent)
    assert all(torch.equal(x, y) for x, y in zip(got, want))


def test_attention_matmuls_of_a_fused_projection_copy_once_as_eager():
    """q, k and v as views of one projection ([B, N, 3, H, D] permuted): torch.matmul copies a
    batched operand whose batch dims do not merge; the compiled forward makes that copy explicitly,
    so the backward's matmuls read it rather than copying the views again.  The backward then
    copies no more elements than eager's, and the gradients are eager's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.elements = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in (torch.ops.aten.clone.default, torch.ops.aten.copy_.default):
                self.elements += out.numel()
            return out

    def attention(x, w):
        b, n, c = x.shape
        q, k, v = (x @ w).reshape(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4).unbind(0)
        return ((q * 0.5) @ k.transpose(-2, -1)).softmax(-1) @ v

    x, w = _f32(4, 8, 16), _f32(16, 48, seed=1, grad=False).mul(0.25).requires_grad_()
    jf = _grads_match(lambda x, w: attention(x, w).tanh().sum(), (x, w))
    counts = []
    for fn in (jf, lambda x, w: attention(x, w).tanh().sum()):
        loss = fn(x, w)
        with Copies() as mode:
            loss.backward()
        counts.append(mode.elements)
    assert counts[0] <= counts[1], counts


@pytest.mark.parametrize("features", [2, 4, 8, 16])
def test_a_token_mixing_mlp_over_a_few_tokens_trains_as_eager(features):
    """MLP-Mixer's token MLP over `features` tokens: the forward's `x @ w1.T` and the backward's
    cotangent times w2 multiply over `features` terms, so up to 8 they are products and sums in
    the kernel around them (no matmul of that shape left), and the weight gradient `g.T @ x`
    with `features` columns runs as `(x.T @ g).T`; gradients agree with eager's to rounding."""
    x = _f32(4, features, 96)
    w1, b1 = _f32(64, features, seed=1), _f32(64, seed=2)
    w2, b2 = _f32(features, 64, seed=3), _f32(features, seed=4)

    def f(x, w1, b1, w2, b2):
        t = x.transpose(1, 2)
        h = torch.relu(F.linear(t, w1, b1))
        return ((F.linear(h, w2, b2).transpose(1, 2) + x) ** 2).sum()
    jf = _grads_match(f, (x, w1, b1, w2, b2), rtol=1e-4, atol=1e-4)
    traces = str(fjit.last_traces(jf)[-1]) + str(fjit.last_backward_traces(jf)[-1])
    results = re.findall(r'prims\.matmul\(.*# \w+: "cpu f32\[([\d, ]+)\]"', traces)
    # products over `features` terms: x's through w1 and the cotangent's through w2, [4, 96, 64]
    assert ("4, 96, 64" in results) == (features > 8), results
    # w1's gradient [64, features] is the transposed result of a [features, 64] matmul
    assert (f"64, {features}" in results) == (features > 8), results
    assert _c_kernels(fjit.last_traces(jf)[-1]) and _c_kernels(fjit.last_backward_traces(jf)[-1])


def test_a_patch_embedding_is_a_matmul_of_its_patches():
    """A convolution whose stride is its kernel (a ViT or Mixer stem: 3 x 16 x 16 patches) is one
    matmul of the patches laid out as the weight is: gradients as eager's, no convolution left."""
    x = _f32(2, 3, 32, 48, grad=False)
    w, b = _f32(8, 3, 16, 16, seed=1), _f32(8, seed=2)

    def f(x, w, b):
        y = F.conv2d(x, w, b, stride=16)
        return (y.flatten(2).transpose(1, 2).sin() * y.mean()).sum()
    jf = _grads_match(f, (x, w, b), rtol=1e-4, atol=1e-3)      # sums of 768 products, reordered
    traces = str(fjit.last_traces(jf)[-1]) + str(fjit.last_backward_traces(jf)[-1])
    assert "conv" not in traces and "prims.matmul" in traces
    # 2 x 2 patches of 3 channels (12 values) stay oneDNN's convolution, as do 4 x 4 ones over
    # more than 2048 patches
    jf = _grads_match(lambda x, w: F.conv2d(x, w, stride=2).sin().sum(), (x, _f32(8, 3, 2, 2, seed=3)))
    assert "convolution" in str(fjit.last_backward_traces(jf)[-1])
    big = _f32(3, 3, 128, 96, grad=False)
    jf = _grads_match(lambda x, w: F.conv2d(x, w, stride=4).sin().sum(), (big, _f32(8, 3, 4, 4, seed=3)),
                      rtol=1e-4, atol=1e-3)
    assert "convolution" in str(fjit.last_backward_traces(jf)[-1])
    jf = _grads_match(lambda x, w: F.conv2d(x, w, stride=4).sin().sum(), (x, _f32(8, 3, 4, 4, seed=3)),
                      rtol=1e-4, atol=1e-3)
    assert "convolution" not in str(fjit.last_backward_traces(jf)[-1])


@pytest.mark.parametrize("size, matmul", [(2, True), (4, True), (16, False)])
def test_a_pointwise_convolution_is_a_matmul_only_over_few_positions(size, matmul):
    """A 1x1 convolution with stride 1 is a matmul of its positions' channel rows over few
    positions (a CNN's last stages on small images), where oneDNN's backward is slow; over more it
    stays oneDNN's convolution (a 1x1 kernel equals its stride, but is no patch embedding: as
    matmuls, the 1x1 convolutions of a Wide ResNet-50 or InceptionNeXt step, with the permuted
    copies around them, made the joint program 1.5x eager's)."""
    x = _f32(2, 96, size, size, grad=False)
    w, b = _f32(64, 96, 1, 1, seed=1), _f32(64, seed=2)
    jf = _grads_match(lambda x, w, b: F.conv2d(x, w, b).sin().sum(), (x, w, b), rtol=1e-4, atol=1e-4)
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert ("convolution" not in backward) == matmul


def test_einsum_attention_is_differentiated_by_the_joint_backward():
    """torchvision MaxViT's attention, `einsum("B G H I D, B G H J D -> B G H I J")` then softmax
    and the einsum with v, records the permutes, reshapes and batched matmul torch's einsum runs:
    no nested torch autograd call per einsum, gradients as eager's."""
    q, k, v = (_f32(2, 3, 2, 4, 8, seed=s) for s in range(3))

    def f(q, k, v):
        p = torch.einsum("B G H I D, B G H J D -> B G H I J", q * 0.3, k).softmax(-1)
        return torch.einsum("B G H I J, B G H J D -> B G H I D", p, v).sin().sum()
    jf = _grads_match(f, (q, k, v))
    forward, backward = str(fjit.last_traces(jf)[-1]), str(fjit.last_backward_traces(jf)[-1])
    assert "einsum" not in forward and "torch autograd's backward" not in backward
    assert _c_kernels(backward)


def _gemm_calls(jf) -> list:
    traces = str(fjit.last_traces(jf)[-1]) + "".join(map(str, fjit.last_backward_traces(jf)))
    return re.findall(r"fjit_ops\.(linear_as_conv|matmul_as_conv|matmul_as_input_grad|matmul_as_weight_grad)\(", _code(traces))


@pytest.mark.parametrize("measure", ["0", "auto"])
def test_linear_layers_as_onednn_convolutions_train_as_eager(monkeypatch, measure):
    """FJIT_GEMM=onednn: a linear layer's products are oneDNN's 1x1 convolution (passes/gemms.py
    choose_gemms).  In the joint program (FJIT_MEASURE=0) the forward's F.linear (a 1x1
    convolution), the backward's g @ w (its data gradient, reading w where it lies) and the weight
    gradient g.T @ x (its weight gradient) are; in the program torch autograd records (the lone
    F.linear of `one`: nothing to fuse) F.linear is, differentiated by torch autograd.  Gradients
    agree with eager's to rounding, on the compiling and the cached call."""
    monkeypatch.setenv("FJIT_GEMM", "onednn")
    monkeypatch.setenv("FJIT_MEASURE", measure)
    x = _f32(4, 16, 64)
    w1, b1, w2, b2 = _f32(96, 64, seed=1), _f32(96, seed=2), _f32(64, 96, seed=3), _f32(64, seed=4)

    def mlp(x, w1, b1, w2, b2):
        return (F.linear(torch.relu(F.linear(x, w1, b1)), w2, b2) ** 2).sum()
    jf = _grads_match(mlp, (x, w1, b1, w2, b2), rtol=1e-4, atol=1e-4)
    calls = _gemm_calls(jf)
    if measure == "0":
        assert calls.count("matmul_as_weight_grad") == 2, calls
        assert calls.count("matmul_as_input_grad") == 2, calls      # fc2's and fc1's g @ w
        assert calls.count("linear_as_conv") == 2, calls

    def one(x, w1, b1):
        return F.linear(x, w1, b1)
    jf, g = fjit.jit(one), _f32(4, 16, 96, seed=5, grad=False)
    for _ in range(2):
        got = torch.autograd.grad(jf(x, w1, b1), (x, w1, b1), g)
        torch.testing.assert_close(got, torch.autograd.grad(one(x, w1, b1), (x, w1, b1), g),
                                   rtol=1e-4, atol=1e-4)
    assert set(_gemm_calls(jf)) == {"linear_as_conv"}
    # torch autograd's backward of the convolution is differentiable again (a double backward)
    y = jf(x, w1, b1)
    gx, = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    want, = torch.autograd.grad(one(x, w1, b1).square().sum(), x, create_graph=True)
    torch.testing.assert_close(torch.autograd.grad(gx.sum(), w1)[0],
                               torch.autograd.grad(want.sum(), w1)[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(5, 3), (2, 7, 3), (1, 1)])
def test_onednn_product_forms_equal_matmul(shape):
    """runtime's oneDNN forms of a product compute a @ b for any rows (a batch of them, a single
    one), in a's batch shape and row-major order."""
    from fjit.runtime import matmul_as_conv, matmul_as_input_grad, matmul_as_weight_grad
    a, w = _f32(*shape, grad=False), _f32(shape[-1], 6, seed=1, grad=False)
    for form in (matmul_as_conv, matmul_as_input_grad):
        got = form(a, w)
        assert got.shape == (*shape[:-1], 6) and got.is_contiguous()
        torch.testing.assert_close(got, a @ w, rtol=1e-5, atol=1e-5)
    rows = a.reshape(-1, shape[-1])
    g = _f32(rows.shape[0], 4, seed=2, grad=False)
    torch.testing.assert_close(matmul_as_weight_grad(g.t(), rows), g.t() @ rows, rtol=1e-5, atol=1e-5)


def test_gemm_choice_times_a_shape_once_and_keeps_small_products_on_torch(monkeypatch):
    """FJIT_GEMM=auto (the default) times oneDNN's form against torch's matmul once per shape and
    process, and never below GEMM_MIN_MACS multiply-adds; FJIT_GEMM=torch never rewrites."""
    from fjit.passes import gemms
    timed = []

    def seconds(fn, inputs, grad, samples=5):
        timed.append(fn)
        return 1.0 if fn in (torch.matmul, F.linear) else 0.5      # oneDNN's "faster"
    monkeypatch.setattr(gemms, "_seconds", seconds)
    monkeypatch.setattr(gemms, "_timed", {})
    monkeypatch.setenv("FJIT_GEMM", "auto")
    big = (_f32(256, 64, grad=False), _f32(96, 64, seed=1, grad=False), _f32(96, seed=2, grad=False))
    small = (_f32(8, 64, grad=False), *big[1:])
    for args in (big, big, small):
        jf = fjit.jit(lambda x, w, b: F.linear(x, w, b))
        torch.testing.assert_close(jf(*args), F.linear(*args), rtol=1e-4, atol=1e-4)
        assert set(_gemm_calls(jf)) == ({"linear_as_conv"} if args is big else set())
    assert len(timed) == 2          # the big shape's two candidates, once
    # 32 rows are timed for a product's forward and data-gradient forms, not for a weight gradient
    rows32 = (_f32(32, 512, grad=False), _f32(128, 512, seed=1, grad=False), _f32(128, seed=2, grad=False))
    jf = fjit.jit(lambda x, w, b: F.linear(x, w, b))
    jf(*rows32)
    assert _gemm_calls(jf) == ["linear_as_conv"] and len(timed) == 4
    assert not gemms._onednn_faster(gemms.MATMUL_AS_WEIGHT_GRAD, (), torch.matmul, False, 32, 1 << 30)
    assert len(timed) == 4
    monkeypatch.setenv("FJIT_GEMM", "torch")
    jf = fjit.jit(lambda x, w, b: F.linear(x, w, b))
    jf(*big)
    assert _gemm_calls(jf) == []


# (N, C, H, W, O, kh, kw, stride, padding, dilation): a filter over a 2x2 output, a 1x1 stride-2
# downsampling (odd input: the last row and column are read by no output), a strided rectangular
# filter, a dilated one, a filter without padding
_CONVOLUTIONS = [(2, 5, 4, 4, 7, 3, 3, 1, 1, 1), (2, 5, 5, 3, 7, 1, 1, 2, 0, 1), (3, 4, 7, 6, 3, 3, 2, 2, 1, 1),
                 (2, 3, 6, 6, 4, 3, 3, 1, 2, 2), (2, 3, 5, 5, 4, 2, 2, 1, 0, 1)]


@pytest.mark.parametrize("conv", _CONVOLUTIONS)
@pytest.mark.parametrize("mask", [(True, True, True), (False, True, False), (True, True, False)])
def test_convolution_vjp_by_gemm_equals_atens(conv, mask):
    """runtime.convolution_vjp_by_gemm (the weight's gradient as a GEMM over the input's patches,
    a 1x1 filter's input gradient too) gives ATen's convolution_backward's cotangents, in the
    layouts asked for, None where the mask wants none (float64: agreement to rounding)."""
    from fjit.runtime import convolution_vjp, convolution_vjp_by_gemm
    n, c, h, w, o, kh, kw, s, p, d = conv
    x = torch.randn(n, c, h, w, dtype=torch.float64)
    weight = torch.randn(o, c, kh, kw, dtype=torch.float64)
    g = torch.randn_like(F.conv2d(x, weight, None, s, p, d))
    args = (g, x, weight, [o], [s, s], [p, p], [d, d], 1, list(mask),
            [tuple(x.stride()), tuple(weight.stride()), (1,)])
    for want, got in zip(convolution_vjp(*args), convolution_vjp_by_gemm(*args)):
        assert (want is None) == (got is None)
        if want is not None:
            assert got.stride() == want.stride()
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def _small_cnn(x, w1, w2, w3):
    """A CNN's last stage on a small image: a 3x3 and a 1x1 convolution of stride 2 with 2x2
    outputs (the GEMM form's candidates), and a 3x3 one over 4x4 positions (never one)."""
    y = torch.relu(F.conv2d(x, w1, None, 1, 1))
    z = F.conv2d(y, w2, None, 2, 1) * 0.5 + F.conv2d(y, w3, None, 2)
    return (torch.relu(z).sin() * 2).sum()


def _small_cnn_inputs():
    return (_f32(8, 64, 4, 4, grad=False), _f32(64, 64, 3, 3, seed=1), _f32(64, 64, 3, 3, seed=2),
            _f32(64, 64, 1, 1, seed=3))


def _gemm_vjps(jf) -> int:
    return "".join(map(str, fjit.last_backward_traces(jf))).count("fjit_ops.convolution_vjp_by_gemm(")


@pytest.mark.parametrize("gemm, calls", [("torch", 1), ("onednn", 0)])
def test_a_convolutions_weight_gradient_over_few_positions_as_a_gemm(monkeypatch, gemm, calls):
    """In the joint program, a convolution's backward over at most CONV_GEMM_POSITIONS output
    positions an image may compute the weight's gradient as a GEMM (passes/gemms.py
    choose_gemms): always with FJIT_GEMM=torch, never with onednn.  Gradients agree with eager's,
    compiling and cached."""
    monkeypatch.setenv("FJIT_GEMM", gemm)
    monkeypatch.setenv("FJIT_MEASURE", "0")
    from fjit.passes import gemms
    monkeypatch.setattr(gemms, "GEMM_MIN_MACS", 1 << 17)
    jf = _grads_match(_small_cnn, _small_cnn_inputs(), rtol=1e-4, atol=1e-4)
    assert _gemm_vjps(jf) == calls * 2


def test_the_convolution_gemm_choice_is_timed_once_per_shape(monkeypatch):
    """FJIT_GEMM=auto times the GEMM form against ATen's convolution_backward once per shape and
    process, keeps ATen's where the GEMM form is not under GEMM_MARGIN of its time, and never
    times a convolution with more than CONV_GEMM_POSITIONS output positions an image."""
    from fjit.passes import gemms
    from fjit.runtime import convolution_vjp_by_gemm
    timed = []
    verdict = {"gemm": 0.5}

    def seconds(fn, inputs, grad, samples=5):
        timed.append((fn, tuple(inputs[2].shape)))
        return verdict["gemm"] if fn is convolution_vjp_by_gemm else 1.0
    monkeypatch.setattr(gemms, "_seconds", seconds)
    monkeypatch.setattr(gemms, "_timed", {})
    monkeypatch.setattr(gemms, "GEMM_MIN_MACS", 1 << 17)
    monkeypatch.setenv("FJIT_GEMM", "auto")
    monkeypatch.setenv("FJIT_MEASURE", "0")
    for _ in range(2):
        jf = _grads_match(_small_cnn, _small_cnn_inputs(), rtol=1e-4, atol=1e-4)
        assert _gemm_vjps(jf) == 2
    # the two filters over 2x2 outputs, each form once
    assert sorted(shape for _, shape in timed) == [(64, 64, 1, 1)] * 2 + [(64, 64, 3, 3)] * 2
    verdict["gemm"] = 0.95
    monkeypatch.setattr(gemms, "_timed", {})
    jf = _grads_match(_small_cnn, _small_cnn_inputs(), rtol=1e-4, atol=1e-4)
    assert _gemm_vjps(jf) == 0


@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keywords"])
@pytest.mark.parametrize("op", ["addmm", "baddbmm", "addmv"])
def test_input_plus_product_ops_are_prims_not_recorded_ops(op, by_keyword, monkeypatch):
    """torch.addmm, baddbmm (BLOOM's attention scores: alibi.baddbmm(batch1=q, batch2=k,
    alpha=...), by keyword) and addmv are a matmul and an add, with prims' backward in the joint
    program: no op torch autograd has to record (each costs a nested autograd call per backward:
    BLOOM's two took a fifth of its joint program's time), gradients as eager's."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    shapes = {"addmm": ((6,), (4, 5), (5, 6)), "baddbmm": ((1, 4, 6), (3, 4, 5), (3, 5, 6)),
              "addmv": ((4,), (4, 5), (5,))}[op]
    names = {"addmm": ("mat1", "mat2"), "baddbmm": ("batch1", "batch2"), "addmv": ("mat", "vec")}[op]

    def f(c, a, b):
        product = getattr(c, op)(**dict(zip(names, (a, b))), beta=0.5, alpha=0.25) if by_keyword \
            else getattr(c, op)(a, b, beta=0.5, alpha=0.25)
        return (product * 3).tanh().sum()
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g, requires_grad=True) for s in shapes]
    jf = fjit.jit(f)
    for _ in range(2):
        got = torch.autograd.grad(jf(*args), args)
    torch.testing.assert_close(got, torch.autograd.grad(f(*args), args))
    backward = fjit.last_backward_traces(jf)[-1]
    assert "torch_autograd" not in backward.stage, backward.stage
    calls = [line.split("#")[0] for line in str(backward).splitlines()]
    assert "matmul" in str(backward) and not [line for line in calls if op in line], backward


@pytest.mark.parametrize("complex_path", ["fftn", "view_as_complex"])
def test_a_gradient_through_complex_values_is_eagers(complex_path, monkeypatch):
    """The joint program's cotangents are real: one through a complex intermediate (FNet's
    fftn(x, dim=(1, 2)).real, rotary embeddings by view_as_complex) was dropped, so from the
    second call x's gradient was None and w's missed that path (FNet's embeddings: 0.0076 off).
    An op whose complex result one op alone turns real (fftn then .real) runs as one op that torch
    autograd differentiates inside the joint program; a longer complex path keeps torch autograd
    for the function.  (The real part of a complex proxy did not require grad, so merged, FNet's
    gradients were 0.0076 off again.)"""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 64, generator=g, requires_grad=True)
    w = torch.randn(64, generator=g, requires_grad=True)

    def f(x, w):
        h = F.layer_norm(x * w, (64,))
        if complex_path == "fftn":
            y = torch.fft.fftn(h, dim=(1, 2)).real
        else:
            rot = torch.polar(torch.ones(16, 32), torch.linspace(0, 3, 16 * 32).reshape(16, 32))
            y = torch.view_as_real(torch.view_as_complex(h.reshape(2, 16, 32, 2)) * rot).flatten(2)
        return (y * w).tanh().sum()
    jf = fjit.jit(f)
    for _ in range(3):
        want = torch.autograd.grad(f(x, w), (x, w))
        got = torch.autograd.grad(jf(x, w), (x, w))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    stage = fjit.last_backward_traces(jf)[-1].stage
    if complex_path == "fftn":
        assert "torch_autograd" not in stage and "fft_fftn_then" in str(fjit.last_traces(jf)[-1])
    else:
        assert "a complex value lies on a gradient's path" in stage


def test_an_embedding_with_a_padding_row_is_differentiated_through_its_prims(monkeypatch):
    """F.embedding(padding_idx=p) takes the padding rows from a detached copy (no gradient reaches
    row p from this lookup): that detach is a piece no cotangent reaches, so the lookup is still
    differentiated through its prims in the joint program, not recorded for torch autograd (a
    nested autograd call per backward: BERT's word embeddings).  Row p still gets the gradient of
    another use of a tied weight, as in eager."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(32, 8, generator=g, requires_grad=True)
    idx = torch.randint(0, 32, (3, 5), generator=g)
    idx[0, :2] = 2

    def f(idx, w):
        e = torch.nn.functional.embedding(idx, w, padding_idx=2)
        logits = torch.nn.functional.layer_norm(e * 2, (8,)) @ w.t()     # tied weight
        return logits.tanh().sum()
    jf = fjit.jit(f)
    for _ in range(2):
        got = torch.autograd.grad(jf(idx, w), w)
    want = torch.autograd.grad(f(idx, w), w)
    torch.testing.assert_close(got, want)
    assert "runs under torch autograd" not in str(fjit.last_traces(jf)[0])
    assert "torch_autograd" not in fjit.last_backward_traces(jf)[-1].stage


_PRIM_DIFFERENTIATED = {
    # ResMLP's affine layers, Mamba's dt, EdgeNeXt's attention, a CNN's head and squeeze-excite gates
    "addcmul": (lambda x, a, b: torch.addcmul(b, a, x, value=0.5), ((4, 8), (8,), (8,))),
    "addcdiv": (lambda x, a, b: torch.addcdiv(b, x, a.exp()), ((4, 8), (8,), (8,))),
    "softplus": (lambda x, a, b: F.softplus(x * 10 + a) * b, ((16, 8), (8,), (8,))),
    "normalize": (lambda x, a, b: F.normalize(x * a, dim=-1) + b, ((4, 8), (8,), (8,))),
    "adaptive_avg_pool2d": (lambda x, a, b: x * F.adaptive_avg_pool2d(x * a, 1).sigmoid() + b,
                            ((2, 3, 4, 8), (8,), (8,))),
}


@pytest.mark.parametrize("op", sorted(_PRIM_DIFFERENTIATED))
def test_ops_torch_autograd_used_to_record_are_differentiated_through_prims(op, monkeypatch):
    """Each of these was a torch call that torch autograd recorded inside the joint program (a
    nested autograd graph in the forward, a torch.autograd.grad call in the backward); decomposed,
    its prims fuse and are differentiated by the rules, with eager's gradients."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    fn, shapes = _PRIM_DIFFERENTIATED[op]
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(*s, generator=g, requires_grad=True) for s in shapes]

    def f(x, a, b):
        return (fn(x, a, b) * 2).tanh().sum()
    jf = fjit.jit(f)
    for _ in range(2):
        got = torch.autograd.grad(jf(*args), args)
    torch.testing.assert_close(got, torch.autograd.grad(f(*args), args))
    assert "runs under torch autograd" not in str(fjit.last_traces(jf)[0])
    assert "torch_autograd" not in fjit.last_backward_traces(jf)[-1].stage


@pytest.mark.parametrize("call", ["functional", "torch", "ceil_padded"])
def test_a_small_max_pool_has_eagers_backward_in_the_joint_program(call, monkeypatch):
    """A max pool too small for the channels-last route (decompositions/nn_ops.py leaves it a torch
    call: GoogLeNet's and DLA's) runs as ATen's max pool returning its indices, and its backward is
    max_pool2d_with_indices_backward on them, as eager's node: no op torch autograd records.
    Ties (a ReLU's zeros) go where eager's go."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    pool = {"functional": lambda y: F.max_pool2d(y, 2),
            "torch": lambda y: torch.max_pool2d(y, [3, 3], [2, 2], [1, 1]),
            "ceil_padded": lambda y: F.max_pool2d(y, 3, stride=2, padding=1, ceil_mode=True)}[call]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 9, generator=g, requires_grad=True)
    w = torch.randn(9, generator=g, requires_grad=True)

    def f(x, w):
        return (pool((x * w).relu()) * 3).tanh().sum()
    jf = fjit.jit(f)
    for _ in range(2):
        got = torch.autograd.grad(jf(x, w), (x, w))
    torch.testing.assert_close(got, torch.autograd.grad(f(x, w), (x, w)))
    assert "runs under torch autograd" not in str(fjit.last_traces(jf)[0])
    assert "max_pool2d_with_indices_backward" in str(fjit.last_backward_traces(jf)[-1])


def test_a_linear_layer_on_a_transposed_activation_gets_one_matmul_per_gradient():
    """ResMLP's channel MLP reads its token mixer's transposed output: the input's gradient is
    `g @ w` of the flattened cotangent, as eager's, not `w.T @ g.T` per batch (a batched matmul
    of 16 columns, 1.05x eager's training step there), and the weight's is one matmul."""
    x = _f32(4, 24, 6, grad=True)
    w, b = _f32(32, 24, seed=1, grad=True), _f32(32, seed=2, grad=True)

    def f(x, w, b):
        return (F.gelu(F.linear(x.transpose(1, 2), w, b)) * 1.5).sum()
    jf = _grads_match(f, (x, w, b))
    shapes = re.findall(r"= prims\.matmul\(\w+, \w+\)\s+# \w+: \"cpu f32\[([\d, ]+)\]\"",
                        str(fjit.last_backward_traces(jf)[-1]))
    # the input's gradient in the cotangent's [4, 6, 24] (one flattened matmul), not x's [4, 24, 6]
    assert sorted(shapes) == ["32, 24", "4, 6, 24"], shapes
