"""Random ops draw what eager draws: compiling draws nothing, the program draws in eager's order,
generators created inside the function are re-created on every call, generators from outside advance
on every call.  Comparisons are bitwise (torch.equal)."""
import pytest
import torch
import torch.nn.functional as F

import fjit
from fjit.pipeline import check_traces

X = torch.randn(4, 5)
P = torch.rand(4, 5)


def _leaves(y):
    return torch.utils._pytree.tree_leaves(y)


def _equal(a, b) -> bool:
    la, lb = _leaves(a), _leaves(b)
    return len(la) == len(lb) and all(
        torch.equal(u, v) if isinstance(u, torch.Tensor) else u == v for u, v in zip(la, lb))


def assert_eager_stream(f, *args, calls=3, **jit_kwargs):
    """From the same seed, each call (the first one compiles) returns eager's numbers and leaves the
    global generator where eager leaves it."""
    jf = fjit.jit(f, **jit_kwargs)
    for seed in range(calls):
        torch.manual_seed(seed)
        expected = f(*args)
        state, after = torch.get_rng_state(), torch.rand(8)
        torch.manual_seed(seed)
        got = jf(*args)
        assert _equal(got, expected), f"call {seed}: fjit drew other numbers than eager"
        assert torch.equal(torch.get_rng_state(), state), f"call {seed}: generator state differs"
        assert torch.equal(torch.rand(8), after)
    return jf


def _local_uniform(x):
    t = torch.empty(4, 5)
    t.uniform_()
    return x + t


def _loop(x):
    for _ in range(3):
        x = x + torch.rand(4, 5)
    return x


def _unused(x):
    torch.rand_like(x)       # result unused: eager still draws
    return x + torch.rand_like(x)


def _one_output_uses(x):
    r = torch.randn(4, 5)
    s = torch.rand(4, 5)
    return x * 2, x + s, r.shape


def _two_ops(x):
    a = torch.randn_like(x)
    b = torch.rand_like(x)
    return b - a, a


CASES = {
    "rand_like": (lambda x: x + torch.rand_like(x), X),
    "randn": (lambda x: x * torch.randn(4, 5), X),
    "randn_dtype": (lambda x: x + torch.randn(4, 5, dtype=torch.float64), X),
    "dropout": (lambda x: F.dropout(x, 0.5, training=True), X),
    "bernoulli": (lambda p: p.bernoulli(), P),
    "randint": (lambda x: x + torch.randint(0, 10, (4, 5)), X),
    "randint_like": (lambda x: torch.randint_like(x, 5) * x, X),
    "uniform_local": (_local_uniform, X),
    "uniform_zeros_like": (lambda x: torch.zeros_like(x).uniform_(-1, 1) + x, X),
    "normal_local": (lambda x: torch.empty(4, 5).normal_() * x, X),
    "randperm": (lambda x: x[torch.randperm(4)], X),
    "randperm_alone": (lambda x: torch.randperm(6) + x.shape[0], X),
    "multinomial": (lambda p: torch.multinomial(p, 2), P),
    "normal_tensor": (lambda x: torch.normal(x, 1.0), X),
    "normal_size": (lambda x: torch.normal(0.0, 1.0, (4, 5)) + x, X),
    "rand_in_loop": (_loop, X),
    "unused_draw": (_unused, X),
    "draw_used_by_one_output": (_one_output_uses, X),
    "two_ops_in_order": (_two_ops, X),
    "same_op_twice": (lambda x: torch.rand_like(x) - torch.rand_like(x), X),
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_stream_as_eager(name):
    f, x = CASES[name]
    assert_eager_stream(f, x)


@pytest.mark.parametrize("name", ["randn", "rand_in_loop", "unused_draw", "normal_size"])
def test_same_stream_torch_executor_only(name):
    f, x = CASES[name]
    assert_eager_stream(f, x, executors=("torch",))


def test_fresh_numbers_on_every_call():
    jf = fjit.jit(_one_output_uses)
    a, b = jf(X), jf(X)
    assert not torch.equal(a[1], b[1])
    jl = fjit.jit(_loop)
    assert not torch.equal(jl(X), jl(X))


def test_no_grad_region():
    def f(x):
        with torch.no_grad():
            y = x + torch.rand_like(x)
        return y * torch.randn(4, 5)
    assert_eager_stream(f, X)
    assert_eager_stream(f, X.clone().requires_grad_())


def test_c_executor_keeps_random_ops_in_order():
    def f(x):   # + and * only: the C kernel is bit-identical to eager
        a = torch.rand(4, 5)
        b = x * a + 1.0
        c = torch.randn(4, 5)
        return b * c + a
    jf = assert_eager_stream(f, X)
    final = str(fjit.last_traces(jf)[-1])
    assert final.index("torch.rand(") < final.index("torch.randn(")


# ---------------------------------------------------------------------------------------------
# Generators
# ---------------------------------------------------------------------------------------------

def test_generator_created_inside_gives_eager_numbers_every_call():
    def f(x):
        g = torch.Generator().manual_seed(0)
        return x + torch.randn(x.shape, generator=g)
    expected = f(X)
    jf = fjit.jit(f)
    state = torch.get_rng_state()
    for _ in range(3):
        assert torch.equal(jf(X), expected)
    assert torch.equal(torch.get_rng_state(), state)    # the global generator is not touched
    traced = str(fjit.last_traces(jf)[0])
    assert "fjit_ops.generator(torch.device('cpu'), seed=0)" in traced


def test_generator_inside_drawn_twice_and_reseeded():
    def f(x):
        g = torch.Generator(device="cpu")
        g.manual_seed(3)
        a = torch.rand(x.shape, generator=g)
        b = torch.randn(5, generator=g)
        c = torch.empty(4, 5).uniform_(generator=g)
        g.manual_seed(3)
        d = torch.rand(x.shape, generator=g)
        return a * x, b, c, d, torch.bernoulli(x.sigmoid(), generator=g), a
    expected = f(X)
    assert torch.equal(expected[5], expected[3])
    jf = fjit.jit(f)
    for _ in range(3):
        assert _equal(jf(X), expected)


def test_generator_inside_default_seed():
    def f(x):
        return x + torch.rand(x.shape, generator=torch.Generator())
    jf = fjit.jit(f)
    expected = f(X)
    assert torch.equal(jf(X), expected) and torch.equal(jf(X), expected)


def test_generator_inside_set_state():
    def f(x):
        g = torch.Generator()
        g.set_state(torch.Generator().manual_seed(7).get_state())
        return x * torch.rand(x.shape, generator=g)
    jf = fjit.jit(f)
    expected = f(X)
    assert torch.equal(jf(X), expected) and torch.equal(jf(X), expected)
    assert "fjit_ops.generator(torch.device('cpu'), state=" in str(fjit.last_traces(jf)[0])


STATE = torch.Generator().manual_seed(7).get_state()


def test_generator_set_state_from_global_tensor_is_fj101():
    def f(x):
        g = torch.Generator()
        g.set_state(STATE)      # read once at trace time, like any global tensor
        return x * torch.rand(x.shape, generator=g)
    with pytest.raises(fjit.UnproxiedTensorError, match="FJ101"):
        fjit.jit(f)(X)


def test_two_generators_seeded_alike_are_two_streams():
    def f(x):
        g, h = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
        return torch.rand(x.shape, generator=g) + torch.rand(x.shape, generator=h) * 2
    jf = fjit.jit(f)
    assert torch.equal(jf(X), f(X))


GLOBAL_GEN = torch.Generator().manual_seed(5)


def _draw_global(x):
    return x + torch.randn(x.shape, generator=GLOBAL_GEN)


def test_generator_from_outside_advances_as_in_eager():
    GLOBAL_GEN.manual_seed(5)
    expected = [_draw_global(X) for _ in range(3)]
    after = GLOBAL_GEN.get_state()
    GLOBAL_GEN.manual_seed(5)
    jf = fjit.jit(_draw_global)
    state = torch.get_rng_state()
    got = [jf(X) for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert torch.equal(GLOBAL_GEN.get_state(), after)
    assert torch.equal(torch.get_rng_state(), state)


def test_generator_from_outside_closure():
    gen = torch.Generator().manual_seed(2)

    def f(x):
        return F.dropout(x, 0.5, training=True) + torch.rand(4, 5, generator=gen)
    expected_gen = torch.Generator().manual_seed(2)

    def eager(x):
        return F.dropout(x, 0.5, training=True) + torch.rand(4, 5, generator=expected_gen)
    jf = fjit.jit(f)
    for seed in range(2):
        torch.manual_seed(seed)
        want = eager(X)
        torch.manual_seed(seed)
        assert torch.equal(jf(X), want)


def test_isinstance_generator_while_tracing():
    def f(x):
        assert isinstance(GLOBAL_GEN, torch.Generator)
        g = torch.Generator()
        assert isinstance(g, torch.Generator) and type(g) is torch.Generator
        return x + 1
    fjit.jit(f)(X)
    assert torch.Generator is torch._C.Generator


def test_reseeding_outside_generator_is_fj104():
    def f(x):
        GLOBAL_GEN.manual_seed(0)
        return x + torch.rand(x.shape, generator=GLOBAL_GEN)
    with pytest.raises(fjit.SideEffectError, match="FJ104"):
        fjit.jit(f)(X)

    def g(x):
        torch.default_generator.manual_seed(0)
        return x + torch.rand_like(x)
    with pytest.raises(fjit.SideEffectError, match="FJ104"):
        fjit.jit(g)(X)
    assert torch.Generator is torch._C.Generator


def test_seed_of_generator_inside_is_fj105():
    def f(x):
        g = torch.Generator()
        g.seed()
        return x + torch.rand(x.shape, generator=g)
    with pytest.raises(fjit.NondeterminismError, match="FJ105"):
        fjit.jit(f)(X)


def test_get_state_after_drawing_is_fj202():
    def f(x):
        g = torch.Generator().manual_seed(0)
        y = torch.rand(x.shape, generator=g)
        return y, g.get_state()
    with pytest.raises(fjit.UnsupportedOpError, match="FJ202"):
        fjit.jit(f)(X)


# ---------------------------------------------------------------------------------------------
# What runs real ops at compile time draws nothing
# ---------------------------------------------------------------------------------------------

def test_permissive_replay_draws_nothing():
    def f(x):
        r = torch.rand(())
        if r > 2.0:        # FJ106: the replay computes r
            return x - r
        return x + r + torch.randn(4, 5)
    assert_eager_stream(f, X, calls=1, sharp_edges="allow")


def test_permissive_replay_leaves_outside_generator():
    gen = torch.Generator().manual_seed(4)

    def f(x):
        r = torch.rand((), generator=gen)
        if r > 2.0:
            return x - r
        return x + r
    want = f(X)
    gen.manual_seed(4)
    assert torch.equal(fjit.jit(f, sharp_edges="allow")(X), want)


def test_check_mode_draws_nothing(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    assert_eager_stream(_two_ops, X)
    assert_eager_stream(_draw_global_seeded, X)


def _draw_global_seeded(x):
    return x * torch.rand(x.shape, generator=torch.Generator().manual_seed(9)) + torch.rand(4, 5)


def test_check_traces_compares_same_numbers():
    jf = fjit.jit(_loop)
    jf(X)
    state = torch.get_rng_state()
    check_traces(fjit.last_traces(jf), [X])
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("executors", [("triton", "torch"), ("c", "torch")])
def test_dropout_draws_eagers_numbers_in_every_compiled_call(executors, monkeypatch):
    """A kernel executor may fuse what follows dropout, never the mask: eager draws it with
    bernoulli_, and a uniform-based mask would give other numbers for the same seed."""
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")

    def f(x):
        return torch.nn.functional.dropout(x * 2, 0.5, training=True) + 1
    x = torch.randn(4, 8)
    jf = fjit.jit(f, executors=executors)
    for _ in range(3):              # the compiling call and two compiled ones
        torch.manual_seed(1)
        got = jf(x)
        torch.manual_seed(1)
        torch.testing.assert_close(got, f(x))
