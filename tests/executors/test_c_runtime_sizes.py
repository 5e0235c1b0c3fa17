"""C kernels that take their sizes at run time (fjit/executors/runtime_sizes.py): one build
serves every size of the same structure, with eager's results at each."""
from __future__ import annotations

import ast
import operator
import os

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fjit
from fjit.executors.c import executor as c_executor
from fjit.executors import runtime_sizes
from fjit.executors.runtime_sizes import Size

pytestmark = [pytest.mark.ckernels, pytest.mark.usefixtures("sync_build")]


@pytest.fixture(autouse=True)
def own_kernel_cache(tmp_path, monkeypatch):
    """An empty kernel cache directory, and a policy that has met no sizes: a build counted is a
    build this test made, a family's first sizes are this test's."""
    monkeypatch.setenv("FJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(c_executor, "_SIZES_POLICY", runtime_sizes.Policy())


def _c_value(expr: str, env: dict) -> int:
    """A rendered Size expression evaluated with C's int64 semantics (division truncates toward
    zero, the remainder takes the dividend's sign)."""
    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return env[node.id]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Div):
                q = abs(a) // abs(b)
                return q if (a >= 0) == (b > 0) else -q
            if isinstance(node.op, ast.Mod):
                r = abs(a) % abs(b)
                return r if a >= 0 else -r
            return {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}[type(node.op)](a, b)
        raise AssertionError(f"unexpected C expression {ast.dump(node)}")
    return ev(ast.parse(expr, mode="eval"))


_OPS = [operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod,
        lambda a, b: -a, lambda a, b: -(-a // b), lambda a, b: b // a, lambda a, b: b % a]
_DIVISOR = {3: 1, 4: 1, 6: 1, 7: 0, 8: 0}    # op -> which operand divides (0: a, 1: b)


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(2, 5000), min_size=1, max_size=3),
       steps=st.lists(st.tuples(st.integers(0, len(_OPS) - 1), st.integers(0, 5),
                                st.integers(-70, 9000), st.booleans()), min_size=1, max_size=8))
def test_a_size_renders_as_an_expression_with_its_value(sizes, steps):
    """Whatever the generator computes from Sizes, the C expression it writes evaluates, with
    the parameters bound to the region's values, to the value it decided with."""
    env = {f"sz{k}": n for k, n in enumerate(sizes)}
    values = [Size(n, f"sz{k}") for k, n in enumerate(sizes)]
    for op, pick, literal, use_literal in steps:
        a = values[pick % len(values)]
        b = literal if use_literal else values[(pick + 1) % len(values)]
        if op in _DIVISOR and int((a, b)[_DIVISOR[op]]) == 0:
            continue
        result = _OPS[op](a, b)
        assert int(result) == _OPS[op](int(a), int(b))
        if isinstance(result, Size):
            assert _c_value(str(result), env) == int(result), str(result)
            # Python reads "--5" as 5, C as a decrement of a literal (a build error)
            assert "--" not in str(result) and "++" not in str(result), str(result)
            values.append(result)


def _builds_over(fn, shapes, make, **env):
    """fn compiled and called at each shape, compared with eager: the kernels built per shape."""
    jf = fjit.jit(fn, cache="static")
    counts = []
    for k, shape in enumerate(shapes):
        args = make(shape, k)
        before = c_executor.builds()
        torch.testing.assert_close(jf(*args), fn(*args))
        counts.append(c_executor.builds() - before)
    return counts


def _rows(shape, k):
    g = torch.Generator().manual_seed(k)
    return torch.randn(*shape, generator=g), torch.randn(shape[-1], generator=g)


def _norm_softmax(x, w):
    h = F.layer_norm(x, (x.shape[-1],), w) * 2
    return torch.softmax(h @ h.transpose(-1, -2) / 8, dim=-1) + 1


def _transposed(x, w):
    return (x.transpose(-1, -2) * 3).exp().contiguous().sum(-1) + w.sum()


def _sliced_views(x, w):
    q, k = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([torch.tanh(q) * 2, k.sigmoid() - 1], dim=-1) * w


@pytest.mark.parametrize("fn", [_norm_softmax, _transposed, _sliced_views], ids=lambda f: f.__name__)
def test_runtime_sizes_build_once_across_lengths(monkeypatch, fn):
    """FJIT_KERNEL_SIZES=runtime: the lengths after the first build nothing while the structure holds
    (lengths beside a hidden size of 64, each of them at two batch sizes), each with eager's
    answer."""
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "runtime")
    shapes = [(2, n, 64) for n in (40, 45, 51, 37, 60)] + [(3, n, 64) for n in (40, 53)]
    counts = _builds_over(fn, shapes, _rows)
    assert counts[0] > 0 and sum(counts[1:]) <= 1, counts     # one size-dependent variant at most


def test_auto_keeps_the_first_sizes_specialized_and_builds_nothing_from_the_third(monkeypatch):
    """FJIT_KERNEL_SIZES=auto (the default): a family's first sizes get literal sizes; later sizes a
    kernel with the sizes that changed as parameters, built once."""
    monkeypatch.delenv("FJIT_KERNEL_SIZES", raising=False)
    fn = lambda x, w: torch.tanh(x * w) * 2 + 1   # noqa: E731
    counts = _builds_over(fn, [(3, 67), (3, 91), (3, 75), (3, 131), (3, 70)], _rows)
    assert counts == [1, 1, 0, 0, 0]
    monkeypatch.setattr(c_executor, "_SIZES_POLICY", runtime_sizes.Policy())   # a new family
    jf = fjit.jit(fn, cache="static")
    jf(*_rows((3, 67), 0))
    assert "int64_t sz" not in "".join(str(t) for t in fjit.last_traces(jf))   # the first: literals
    jf(*_rows((3, 99), 0))
    source = str(fjit.last_traces(jf)[-1])
    # the row length changed, the 3 rows did not: one parameter, the rows a literal
    assert "int64_t sz0" in source and "int64_t sz1" not in source, source


def test_specialized_builds_per_size(monkeypatch):
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "specialized")
    counts = _builds_over(lambda x, w: torch.tanh(x * w) * 2 + 1, [(5, 67), (5, 91), (5, 75)], _rows)
    assert counts == [1, 1, 1]


def test_number_inputs_and_sizes_have_distinct_parameters(monkeypatch):
    """A float input is parameter s<k> of the kernel; sizes are sz<k>: a kernel with both builds."""
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "runtime")
    fn = lambda x, w, s: ((x * w + s).sin() * 2).exp()   # noqa: E731
    for n in (33, 47):
        x, w = torch.randn(40, n), torch.randn(n)
        jf = fjit.jit(fn, cache="static")
        torch.testing.assert_close(jf(x, w, 0.5), fn(x, w, 0.5))
        source = str(fjit.last_traces(jf)[-1])
        assert "double s2" in source and "int64_t sz0" in source


def _broadcast_rows(x, w):
    return torch.where(x > 0, x * w[:1], (x - w).exp()) + x.mean(0, keepdim=True)


@settings(max_examples=12, deadline=None)
@given(shapes=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 70), st.sampled_from([1, 16, 40])),
                       min_size=3, max_size=6),
       fn=st.sampled_from([_norm_softmax, _transposed, _sliced_views, _broadcast_rows]),
       mode=st.sampled_from(["auto", "runtime"]))
def test_kernels_reused_across_random_shapes_give_eagers_answers(shapes, fn, mode):
    """One jitted function over a sequence of shapes (batch 0 and 1, rows of 1, widths that do
    and do not broadcast), each call's kernels chosen as the mode says from what the earlier
    shapes left (the policy starts empty): every result is eager's."""
    previous = os.environ.get("FJIT_KERNEL_SIZES")
    os.environ["FJIT_KERNEL_SIZES"] = mode
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(c_executor, "_SIZES_POLICY", runtime_sizes.Policy())
            jf = fjit.jit(fn, cache="static")
            for k, (b, n, h) in enumerate(shapes):
                x, w = _rows((b, n, h), k)
                torch.testing.assert_close(jf(x, w), fn(x, w), equal_nan=True)
    finally:
        if previous is None:
            del os.environ["FJIT_KERNEL_SIZES"]
        else:
            os.environ["FJIT_KERNEL_SIZES"] = previous


def test_slices_at_other_offsets_through_one_kernel_keep_their_offsets(monkeypatch):
    """Two regions reading slices at different offsets, through the same ops and layouts: with
    runtime sizes they share one source (the offset is a parameter), and each launcher must pass
    its own offset.  A launcher named by source and layouts alone was one launcher for both, and
    the second region read the first one's slice (GoogLeNet's concatenation backward: wrong
    gradients)."""
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "runtime")

    def fn(x, w):
        a = torch.tanh(x[:, 32:64]) * 2 + 1
        h = torch.cat([a, a, a], 1) @ w            # a matmul between: two regions
        return a, torch.tanh(h[:, 64:96]) * 2 + 1
    x, w = torch.randn(6, 96), torch.randn(96, 96)
    jf = fjit.jit(fn, cache="static")
    for _ in range(2):
        for got, want in zip(jf(x, w), fn(x, w)):
            torch.testing.assert_close(got, want)
    kernels = [line for line in str(fjit.last_traces(jf)[-1]).splitlines() if "= fjit_c_" in line]
    assert len(kernels) == 2 and len({k.split("= ")[1].split("(")[0].rsplit("_", 1)[0] for k in kernels}) == 1, \
        kernels      # one source for both, each with a launcher of its own
