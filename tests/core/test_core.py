"""Unit tests of the core layers: IR printing, passes, functionalization, the cache, inputs."""
import collections
import gc
import re
import threading
import weakref

import pytest
import torch

import fjit
from fjit.core.trace import Trace


def _eager_and_jit(fn, *args, **kwargs):
    jf = fjit.jit(fn, executors=("torch",))
    torch.testing.assert_close(jf(*args, **kwargs), fn(*args, **kwargs))
    return jf


# -- traces --------------------------------------------------------------------------------------

def test_every_stage_prints_runnable_python_that_agrees():
    def f(x, y, s):
        z = torch.sin(x) + y * s
        return z.softmax(-1), (z * z).sum(), x.shape[0] * s
    x, y = torch.randn(3, 4), torch.randn(4)
    jf = _eager_and_jit(f, x, y, 0.5)
    traces = fjit.last_traces(jf)
    assert [t.stage for t in traces][0] == "traced" and traces[-1].stage == "torch_executor"
    expected = f(x, y, 0.5)
    for t in traces:
        src = str(t)
        assert src.startswith("# fjit trace") and "def computation(x, y, s):" in src
        torch.testing.assert_close(t.python_callable()(x, y, 0.5), expected)


def test_torch_level_op_is_printed_above_its_prims():
    jf = _eager_and_jit(lambda a, b: torch.add(a, b), torch.ones(2, 2), torch.ones(2, 2))
    src = str(fjit.last_traces(jf)[0])
    assert "= torch.add(a, b)" in src and "#" in src.split("torch.add(a, b)")[1].split("\n")[1]
    assert "prims.add(a, b)" in src


def test_unknown_op_is_a_marked_torch_fallback():
    jf = _eager_and_jit(lambda x: torch.cumsum(x, 0) * 2, torch.randn(5))
    assert "torch.cumsum(x, 0)" in str(fjit.last_traces(jf)[0])
    assert "# torch fallback" in str(fjit.last_traces(jf)[0])


def test_data_dependent_output_shape_is_fj202():
    with pytest.raises(fjit.UnsupportedOpError, match="FJ202"):
        fjit.jit(lambda x: x[x > 0])(torch.randn(5))


def test_passes_remove_dead_and_common_code_and_fold_constants():
    def f(x):
        unused = torch.exp(x)  # noqa: F841
        a, b = torch.sin(x), torch.sin(x)
        mask = torch.ones(4, 4).tril()
        return a + b + mask
    jf = _eager_and_jit(f, torch.randn(4, 4))
    final = str(fjit.last_traces(jf)[-1])
    assert "exp" not in final and final.count("torch.sin") == 1 and "tril" not in final
    out1, out2 = jf(torch.zeros(4, 4)), jf(torch.zeros(4, 4))
    assert out1.data_ptr() != out2.data_ptr()


def test_a_mask_built_from_new_zeros_of_an_input_folds_to_a_constant():
    """Swin's shifted-window mask: x.new_zeros(...) reads no element of x, so the region labels
    written into it, the masked_fills and the comparison fold once at compile time."""
    def f(x):
        img = x.new_zeros((6, 6))
        for k, (h, w) in enumerate([(slice(0, -2), slice(0, -2)), (slice(0, -2), slice(-2, None)),
                                    (slice(-2, None), slice(None))]):
            img[h, w] = k
        diff = img.reshape(1, 36) - img.reshape(36, 1)
        mask = diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)
        return x + mask
    jf = _eager_and_jit(f, torch.randn(36, 36))
    final = str(fjit.last_traces(jf)[-1])
    assert not re.search(r"new_zeros|setitem|masked_fill", final), final


def test_free_dead_values_deletes_intermediates():
    jf = _eager_and_jit(lambda x: torch.exp(torch.sin(x)).sum(), torch.randn(3))
    assert "del " in str(fjit.last_traces(jf)[-1])


# -- functionalization ---------------------------------------------------------------------------

def test_inplace_on_created_values_and_their_views():
    def f(x):
        y = x.clone()
        v = y.t()[1]
        v.mul_(3)           # writes through a view into y
        y[0] += 1           # setitem with an in-place op
        w = y[:, :2]        # a view taken before the next write sees it
        y.add_(1)
        return y, w, v
    _eager_and_jit(f, torch.randn(3, 3))


def test_out_argument_on_created_value():
    def f(x):
        buf = torch.empty(3)
        torch.mul(x, 2, out=buf)
        return buf
    _eager_and_jit(f, torch.randn(3))


# -- the cache -----------------------------------------------------------------------------------

def test_cache_hits_misses_and_floats_do_not_recompile():
    jf = fjit.jit(lambda x, s: x * s)
    x = torch.randn(3)
    for s in (0.1, 0.2, 0.3):
        torch.testing.assert_close(jf(x, s), x * s)
    assert fjit.cache_info(jf) == fjit.CacheInfo(hits=2, misses=1, entries=1)
    jf(torch.randn(4), 0.5)                      # new shape
    jf(x.double(), 0.5)                          # new dtype
    jf(torch.randn(3, 2)[:, 0], 0.5)             # new strides
    assert fjit.cache_info(jf).misses == 4


def test_float_deciding_control_flow_is_specialized_and_guarded():
    def f(x, s):
        return x * 2 if s > 0.5 else x * 3
    jf = fjit.jit(f)
    x = torch.ones(2)
    assert jf(x, 0.9).tolist() == [2, 2]
    assert jf(x, 0.1).tolist() == [3, 3]
    assert jf(x, 0.9).tolist() == [2, 2]


def test_ints_and_strings_are_constants_in_the_key():
    jf = fjit.jit(lambda x, n, mode: x.sum() if mode == "sum" else x[:n])
    x = torch.arange(5.0)
    assert jf(x, 2, "sum").item() == 10
    assert jf(x, 2, "slice").tolist() == [0, 1]
    assert jf(x, 3, "slice").tolist() == [0, 1, 2]
    assert fjit.cache_info(jf).misses == 3


def test_cache_is_bounded():
    from fjit.config import cache_size
    jf = fjit.jit(lambda x: x + 1, cache="static")     # one program per shape
    for n in range(cache_size() + 5):
        jf(torch.ones(n + 1))
    assert fjit.cache_info(jf).entries == cache_size()


@pytest.mark.parametrize("path", ["fast", "general"])
def test_cache_evicts_the_least_recently_used_program(monkeypatch, path):
    # the general path: a list argument, which the generated fast path does not take
    monkeypatch.setenv("FJIT_CACHE_SIZE", "4")
    jf = fjit.jit(lambda x: x[0] * 2 if isinstance(x, list) else x * 2, cache="static")
    call = (lambda n: jf([torch.ones(n)])) if path == "general" else (lambda n: jf(torch.ones(n)))
    for n in (1, 2, 3, 4, 1):          # 1 used again: 2 is now the least recently used
        call(n)
    assert fjit.cache_info(jf).misses == 4
    call(5)                            # evicts 2, not 1
    call(1)
    assert fjit.cache_info(jf).misses == 5
    call(2)
    assert fjit.cache_info(jf).misses == 6
    assert fjit.cache_info(jf).entries == 4


def test_cache_size_is_configurable_and_checked(monkeypatch):
    monkeypatch.setenv("FJIT_CACHE_SIZE", "100")
    jf = fjit.jit(lambda x: x + 1, cache="static")
    for n in range(1, 90):
        jf(torch.ones(n))
    for n in range(1, 90):             # the second pass hits every program
        jf(torch.ones(n))
    assert fjit.cache_info(jf) == (89, 89, 89)
    monkeypatch.setenv("FJIT_CACHE_SIZE", "zero")
    with pytest.raises(ValueError, match="FJIT_CACHE_SIZE='zero' is not a positive integer"):
        fjit.jit(lambda x: x - 1)(torch.ones(2))


def test_cache_holds_no_reference_to_the_callers_tensors():
    jf = fjit.jit(lambda x: x * 2)
    x = torch.randn(8)
    ref = weakref.ref(x)
    jf(x)
    del x
    gc.collect()
    assert ref() is None


def test_thread_safety():
    jf = fjit.jit(lambda x, s: torch.tanh(x) * s)
    inputs = [torch.randn(16) for _ in range(8)]
    errors = []

    def work(i):
        try:
            for _ in range(50):
                torch.testing.assert_close(jf(inputs[i], 0.5), torch.tanh(inputs[i]) * 0.5)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert fjit.cache_info(jf).misses == 1


def test_fast_path_keeps_ints_floats_and_bools_apart():
    """The fast path is generated for one call signature; calls typed otherwise take the general
    path and get their own programs (an int or bool is a constant, a float a runtime value)."""
    jf = fjit.jit(lambda x, n: x * n)
    x = torch.arange(3)
    for n in (2, 2.0, True, 3, 2.5, False, 2):
        out = jf(x, n)
        assert out.dtype == (x * n).dtype and out.tolist() == (x * n).tolist(), n
    # misses: 2, 2.0, True, 3, False; hits: 2.5 (a float like 2.0) and the second 2
    assert fjit.cache_info(jf) == fjit.CacheInfo(hits=2, misses=5, entries=5)


def test_fast_path_serves_calls_that_alternate_between_shapes(monkeypatch):
    """Calls alternating between cached shapes are served without the general path's key: by the
    fast path generated once (its arity compared, not its cache: every general-path hit had
    regenerated it, a compile() of about 0.25 ms, and dropped the programs it held), or by the
    symbolic program's check (cache.symbolic_call)."""
    import fjit.cache
    made, keys = [], []
    real, real_key = fjit.cache.fast_path, fjit.cache.call_key
    monkeypatch.setattr(fjit.cache, "fast_path", lambda *a: made.append(1) or real(*a))
    monkeypatch.setattr(fjit.cache, "call_key", lambda *a: keys.append(1) or real_key(*a))
    jf = fjit.jit(lambda r: r.sum(0) * 2)
    xs = [torch.randn(16, 3), torch.randn(4, 5), torch.randn(7, 2)]
    for x in xs:
        torch.testing.assert_close(jf(x), x.sum(0) * 2)
    keys.clear()
    hits = fjit.cache_info(jf).hits
    for _ in range(4):
        for x in xs:
            torch.testing.assert_close(jf(x), x.sum(0) * 2)
    assert len(made) <= 1 and keys == []
    assert fjit.cache_info(jf).hits == hits + 12


def test_fast_path_makes_a_shapes_guards_at_its_first_hit_not_when_filed(monkeypatch):
    """A shape met once (a ragged batch) costs no guards: an entry's tensor guards, which let the
    next call of the same shape skip the key, are made when the entry is first hit.  The call
    that makes them and every call after compute the function's result.  (A program per shape:
    a symbolic program serves new shapes without the fast path's entries.)"""
    import fjit.frontend.inputs as inputs
    made = []
    real = inputs._tensor_guards
    monkeypatch.setattr(inputs, "_tensor_guards", lambda *t: made.append(len(t)) or real(*t))
    jf = fjit.jit(lambda a, b: a * b + 1, cache="static")
    xs = [(torch.randn(n), torch.randn(n)) for n in (3, 4, 5, 6)]
    for a, b in xs:
        torch.testing.assert_close(jf(a, b), a * b + 1)
    assert made == []
    for _ in range(3):
        torch.testing.assert_close(jf(*xs[1]), xs[1][0] * xs[1][1] + 1)
    assert made == [2]
    for a, b in xs:
        torch.testing.assert_close(jf(a, b), a * b + 1)
    assert len(made) == 1 + len(xs) - 1


def test_fast_path_of_another_arity_never_serves_a_program():
    """(x, 2) and (x, 0.5, 2) build equal flat keys; each signature's fast path has its own cache."""
    def f(x, *rest):
        out = x
        for r in rest:
            out = out * r
        return out + len(rest)
    jf = fjit.jit(f)
    x = torch.randn(3)
    for args in [(x, 2), (x, 0.5, 2), (x, 2), (x, 0.5, 2), (x, 0.25, 2), (x, 3)]:
        torch.testing.assert_close(jf(*args), f(*args))


def test_fast_path_check_of_the_last_program_sees_every_key_field():
    """The last program found is checked first by one C call; a call differing from it in any
    field of the key (size, stride, dtype, requires_grad, conjugate and negative bits, grad mode,
    autocast) gets the program compiled for it, never the last one."""
    jf = fjit.jit(lambda x: x * 2 + 1)
    x = torch.randn(4, 3)
    z = torch.randn(4, 3, dtype=torch.complex64)
    variants = [lambda: x, lambda: torch.randn(3, 4), lambda: x.t(), lambda: x.double(),
                lambda: x.clone().requires_grad_(), lambda: torch.randn(4, 3)._neg_view(),
                lambda: x[:, :2], lambda: torch.nn.Parameter(x.clone()), lambda: z, lambda: z.conj()]
    for _ in range(3):                 # every variant after every other: the check is exercised
        for make in variants:
            t = make()
            for grad in (True, False):
                with torch.set_grad_enabled(grad):
                    out = jf(t)
                    want = t * 2 + 1
                assert out.shape == want.shape and out.dtype == want.dtype
                assert out.requires_grad == want.requires_grad
                torch.testing.assert_close(out.detach(), want.detach())
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert jf(t).dtype == (t * 2 + 1).dtype
    # tensors mixed with constants and floats: the fast path's own check of its last program
    jf3 = fjit.jit(lambda x, n, s, name: x * n + s if name == "a" else x - n)
    for _ in range(2):
        for args in [(x, 2, 0.5, "a"), (x, 3, 0.5, "a"), (x, 2, 0.25, "b"), (x, True, 0.5, "a"),
                     (x.double(), 2, 0.5, "a"), (x.t(), 2, 0.5, "a"), (x, 2.0, 0.5, "a")]:
            want = args[0] * args[1] + args[2] if args[3] == "a" else args[0] - args[1]
            out = jf3(*args)
            assert out.dtype == want.dtype and out.shape == want.shape, args
            torch.testing.assert_close(out, want)
    jf2 = fjit.jit(lambda a, b: a @ b)
    a = torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert jf2(a, a.t()).dtype == torch.bfloat16
    assert jf2(a, a.t()).dtype == torch.float32


def test_float_on_the_left_of_a_comparison_does_not_recompile():
    jf = fjit.jit(lambda x, s: s < x)
    x = torch.randn(5)
    for s in (-0.5, 0.0, 0.5):
        assert torch.equal(jf(x, s), s < x)
    assert fjit.cache_info(jf).misses == 1


# -- inputs --------------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


def test_containers_and_constants_as_inputs_and_outputs():
    def f(d, pair, xs, size, dtype, sl, ell, none):
        total = d["w"] * pair.a + xs[1]
        return {"out": total[sl][ell].to(dtype), "shape": size, "pair": Pair(pair.b, none)}
    args = ({"w": torch.randn(4)}, Pair(torch.randn(4), 2.0), [torch.randn(4), torch.randn(4)],
            torch.Size([4]), torch.float64, slice(1, 3), Ellipsis, None)
    _eager_and_jit(f, *args)


class Opaque:
    pass


class MyTensor(torch.Tensor):
    pass


@pytest.mark.parametrize("bad", [Opaque(), object(), 1 + 2j, {1, 2}, b"bytes", torch.nn.Linear(2, 2),
                                 torch.randn(2).as_subclass(MyTensor), lambda: 0, [Opaque()]])
def test_unsupported_inputs_are_fj201_naming_the_type(bad):
    with pytest.raises(fjit.UnsupportedInputError) as info:
        fjit.jit(lambda x: x)(bad)
    message = str(info.value)
    assert "FJ201" in message
    shown = type(bad) if not isinstance(bad, list) else Opaque
    assert shown.__qualname__ in message
    assert isinstance(info.value, TypeError)


def test_adversarial_strings_are_never_executed():
    evil = "__import__('os').system('echo pwned > /tmp/fjit_pwned')"
    keys = {evil: torch.ones(2), "a'b\"c\n": torch.ones(2), "def": torch.ones(2)}

    def f(d, s):
        return {k + "!": v * 2 for k, v in d.items()}, s, len(s)
    jf = fjit.jit(f)
    out = jf(keys, evil)
    assert set(out[0]) == {k + "!" for k in keys} and out[1] == evil
    for t in fjit.last_traces(jf):
        assert isinstance(t.python_callable(), type(f))
    import os
    assert not os.path.exists("/tmp/fjit_pwned")


# -- options and API -----------------------------------------------------------------------------

def test_sparse_tensor_input_is_fj201_naming_the_layout():
    sparse = torch.eye(3).to_sparse()
    jf = fjit.jit(lambda x: x * 2 * 3)
    jf(torch.eye(3))
    with pytest.raises(fjit.UnsupportedInputError, match=r"FJ201.*torch.sparse_coo tensor.*to_dense"):
        jf(sparse)
    with pytest.raises(fjit.UnsupportedInputError, match=r"torch.sparse_coo"):   # nested
        fjit.jit(lambda xs: xs[0] * 2)([sparse])


def test_bad_option_lists_allowed_values():
    with pytest.raises(ValueError, match="'error', 'warn', 'allow'"):
        fjit.jit(lambda x: x, sharp_edges="strict")
    with pytest.raises(ValueError, match="'triton', 'c', 'torch'"):
        fjit.jit(lambda x: x, executors=("cuda",))


def test_wraps_metadata_and_alias():
    def documented(x):
        """Docs."""
        return x
    jf = fjit.fjit(documented)
    assert jf.__name__ == "documented" and jf.__doc__ == "Docs." and jf.__wrapped__ is documented
    assert fjit.fjit is fjit.jit


def test_nested_jitted_function_is_inlined():
    inner = fjit.jit(lambda x: torch.sin(x) * 2)
    outer = fjit.jit(lambda x: inner(x) + 1)
    x = torch.randn(3)
    torch.testing.assert_close(outer(x), torch.sin(x) * 2 + 1)
    assert fjit.cache_info(inner).misses == 0


def test_cache_none_retraces():
    jf = fjit.jit(lambda x: x + 1, cache=None)
    jf(torch.ones(1))
    jf(torch.ones(1))
    assert fjit.cache_info(jf).misses == 2


def test_trace_type_is_public():
    jf = fjit.jit(lambda x: x + 1)
    jf(torch.ones(1))
    assert all(isinstance(t, Trace) for t in fjit.last_traces(jf))


# -- buffer reuse ----------------------------------------------------------------------------------

def _final_source(jf) -> str:
    return str(fjit.last_traces(jf)[-1])


def test_dead_intermediates_are_reused_in_place_but_inputs_never():
    def f(x, y):
        a = x + y
        b = torch.sin(a * 2)
        return b.clamp(-0.5, 0.5)
    x, y = torch.randn(6), torch.randn(6)
    x0, y0 = x.clone(), y.clone()
    jf = _eager_and_jit(f, x, y)
    src = _final_source(jf)
    assert "torch.Tensor.mul_(t0, 2)" in src and "torch.Tensor.sin_(" in src, src
    assert "torch.Tensor.add(x, y)" in src, src        # x, y are inputs: never written
    assert torch.equal(x, x0) and torch.equal(y, y0)


def test_results_of_reductions_are_reused_too():
    def f(x, y):
        return torch.softmax(x * 2, -1) + y.sum(-1, keepdim=True)
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    jf = _eager_and_jit(f, x, y)
    assert "torch.Tensor.add_(t" in _final_source(jf), _final_source(jf)


def test_commutative_ops_reuse_their_second_operand():
    def f(x, y, z):
        return x + torch.sin(y) * 2, x * (z - 1), x - (y * 3)   # '-' does not commute
    x, y, z = torch.randn(3, 5), torch.randn(3, 5), torch.randn(5)
    jf = _eager_and_jit(f, x, y, z)
    src = _final_source(jf)
    assert "torch.Tensor.add_(t1, x)" in src, src
    assert "torch.Tensor.sub(x, t" in src, src
    # broadcasting: z - 1 is [5], the product [3, 5]: not written into the smaller buffer
    assert "torch.Tensor.mul(x, t" in src, src


def test_no_reuse_of_a_value_a_live_view_aliases():
    def f(x):
        a = x * 2
        v = a.view(2, 3)
        b = a + 1                  # in place, this would change v
        return v, b
    x = torch.randn(6)
    jf = _eager_and_jit(f, x)
    assert "add_(" not in _final_source(jf) and "__iadd__" not in _final_source(jf)


def test_no_reuse_when_autograd_may_record():
    def f(x):
        return torch.tanh(x * 3).sum()
    x = torch.randn(5, requires_grad=True)
    jf = fjit.jit(f, executors=("torch",))    # torch autograd records the program's ops
    out = jf(x)
    assert "torch.tanh(t0)" in _final_source(jf), _final_source(jf)
    out.backward()
    expected = torch.autograd.grad(f(x), x)[0]
    torch.testing.assert_close(x.grad, expected)


# -- errors carry the user's location ------------------------------------------------------------

def test_unbound_tensor_methods_and_dunders_trace_as_eager():
    def f(x, y):
        z = torch.Tensor.add(x, y)
        w = torch.Tensor.__radd__(x, 2.0)
        u = x * 2
        torch.Tensor.add_(u, 1)
        return torch.Tensor.mul(z, w) + u
    x, y = torch.randn(3), torch.randn(3)
    torch.testing.assert_close(fjit.jit(f)(x, y), f(x, y))


def test_fj201_names_the_call_site():
    jf = fjit.jit(lambda x: x)
    with pytest.raises(fjit.UnsupportedInputError) as info:
        jf(Opaque())
    assert "test_core.py:" in str(info.value).split(" FJ201")[0]
    assert "see sharp_edges_catalog/FJ201_object_input.py" in str(info.value)


def test_writing_through_a_tensor_indexed_view_is_fj202_not_lost():
    def f(x, i):
        y = x * 2
        y[i].add_(1)               # eager writes into y through the view y[i]
        return y
    with pytest.raises(fjit.UnsupportedOpError, match="FJ202"):
        fjit.jit(f)(torch.ones(3, 2), torch.tensor(1))


def test_tensor_index_selects_like_an_int():
    x = torch.randn(4, 3, 2)
    for f in (lambda x, i: x[i], lambda x, i: x[:, i], lambda x, i: x[..., i], lambda x, i: x[None, 1:, i]):
        for i in (0, 1, -1):
            torch.testing.assert_close(fjit.jit(f)(x, torch.tensor(i)), f(x, torch.tensor(i)))


def _called_after_compiling():
    return 1


def test_compiling_under_cprofile_leaves_the_profiler_on():
    # Asked of the profiler's own record, not of sys.getprofile(): since Python 3.12 cProfile
    # runs on sys.monitoring and sys.getprofile() is None under it.
    import cProfile
    import pstats
    jf = fjit.jit(lambda x: torch.sin(x) + 1)
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        jf(torch.randn(3))
        _called_after_compiling()
    finally:
        profiler.disable()
    recorded = {name for (_, _, name) in pstats.Stats(profiler).stats}
    assert "_called_after_compiling" in recorded


def _float_unary_names():
    """The shared table's unary ops with a float result and an in-place twin, plus relu and frac."""
    from op_samples import UNARY
    x = torch.ones(1)
    return [n for n, (dtypes, *_) in UNARY.items() if torch.float32 in dtypes and hasattr(torch, n)
            and hasattr(torch.Tensor, f"{n}_") and getattr(torch, n)(x).dtype == torch.float32
            ] + ["relu", "frac"]


_UNARY = _float_unary_names()
# each op of fjit.core.prims.INPLACE_TWIN (the ops passes.basic.reuse_buffers runs in place),
# called the way user code calls it
_POINTWISE = {
    **{n: (lambda f: lambda a, y: f(a))(getattr(torch, n)) for n in _UNARY},
    "add": lambda a, y: torch.add(a, y, alpha=2), "sub": lambda a, y: a.sub(y),
    "mul": lambda a, y: torch.mul(a, y), "div": lambda a, y: torch.div(a, y, rounding_mode="floor"),
    "true_divide": lambda a, y: torch.true_divide(a, y), "remainder": lambda a, y: a.remainder(y),
    "fmod": lambda a, y: torch.fmod(a, y), "pow": lambda a, y: a.pow(2),
    "atan2": lambda a, y: torch.atan2(a, y), "clamp": lambda a, y: a.clamp(-0.5, 0.5),
    "clip": lambda a, y: torch.clip(a, max=0.3), "clamp_min": lambda a, y: a.clamp_min(0.1),
    "clamp_max": lambda a, y: a.clamp_max(0.1),
    "__add__": lambda a, y: a + y, "__sub__": lambda a, y: a - y, "__mul__": lambda a, y: a * y,
    "__truediv__": lambda a, y: a / y, "__floordiv__": lambda a, y: a // y,
    "__mod__": lambda a, y: a % y, "__pow__": lambda a, y: a ** 2,
}


def _pointwise_callers():
    """A caller for every op that has an in-place twin (core.prims.INPLACE_TWIN): the ones above,
    and every other prim-named op as a method call; ops whose arguments are not (tensor, tensor)
    (masked_fill, scatter, ...) and bitwise ops (integers only) are left out."""
    from fjit.core.prims import INPLACE_TWIN, ROWS, Domain, Kind
    callers = dict(_POINTWISE)
    for row in ROWS.values():
        if row.domain is Domain.INT or row.bool_result:   # no float result to write back
            continue
        for n in row.torch_names:
            if n not in callers and any(getattr(f, "__name__", "") == n for f in INPLACE_TWIN):
                method = getattr(torch.Tensor, n)
                callers[n] = ((lambda m: lambda a, y: m(a)) if row.kind is Kind.UNARY else
                              (lambda m: lambda a, y: m(a, y)))(method)
    return callers


_CALLERS = _pointwise_callers()


@pytest.mark.parametrize("name", sorted(_CALLERS))
def test_every_in_place_rewrite_computes_what_the_op_does(name):
    op = _CALLERS[name]

    def f(x, y):
        a = x * 0.5                      # a fresh intermediate, dead after `op`
        return op(a, y)
    x, y = torch.rand(6) * 0.9 + 0.05, torch.rand(6) + 0.5
    jf = _eager_and_jit(f, x, y)
    src = _final_source(jf)
    # ops without a decomposition (torch fallbacks) are opaque, and stay as they were called
    rewritten = re.search(r"= torch\.Tensor\.(\w+_|__i\w+__)\(t0", src)
    assert rewritten or "# torch fallback" in src, src


def test_in_place_table_is_covered():
    from fjit.core.prims import INPLACE_TWIN, ROWS, Domain
    integer_only = {n for r in ROWS.values() if r.domain is Domain.INT or r.bool_result
                    for n in r.torch_names}
    other_arguments = {"masked_fill", "index_put", "scatter", "scatter_add", "index_add",
                       "index_fill", "lerp", "addcmul", "addcdiv"}
    untested = {f.__name__ for f in INPLACE_TWIN} - set(_CALLERS) - integer_only - other_arguments
    assert not untested, untested


def test_demo_runs_and_prints_its_trace_and_timings(monkeypatch, capsys):
    """The README's first command runs `python -m fjit.demo`: keep it working (timing shortened)."""
    from fjit import demo
    fast = demo._median_us
    monkeypatch.setattr(demo, "_median_us", lambda fns, args: fast(fns, args, repeat=2, number=3))
    demo.main()
    out = capsys.readouterr().out
    assert "# fjit trace of 'gelu_layer', stage: torch_executor" in out
    assert out.count("cached call") == 2 and "CacheInfo(hits=" in out
