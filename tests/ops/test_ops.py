"""The op test suite: every (op, dtype, sample) of tests/op_samples.py, fjit against eager.

For each case: `jf = fjit.jit(fn)` with the default sharp_edges="error" (so a pass also proves there
is no false alarm), `jf(*args)` must match `fn(*args)` under torch.testing.assert_close (exact
dtype, shape and container structure; default tolerances, bfloat16 included), the inputs must be
left untouched, a second call with the same metadata must be a cache hit, and the last trace
must print.  `test_op_gradients` compares the compiled backward with eager's on every float32 sample
(in float64), first and cached call.

FJIT_OP_SAMPLES=quick runs the float32 samples plus the first two samples of every other dtype.
"""
from __future__ import annotations

import os
import sys
import warnings

import pytest
import torch
import torch.utils._pytree as pytree

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/: op_samples
import op_samples
from op_samples import OP_SAMPLES, all_names

import fjit
from fjit.passes.verify import verify

_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16", torch.float16: "f16",
          torch.int64: "i64", torch.int32: "i32", torch.bool: "b8"}
_QUICK = os.environ.get("FJIT_OP_SAMPLES", "all") == "quick"


def _params():
    params = []
    for info, dtype, i, args in op_samples.cases():
        if _QUICK and dtype != info.dtypes[0] and i >= 2:
            continue
        tag = "-fallback" if info.fallback else ""
        params.append(pytest.param(info, args, id=f"{info.id}-{_SHORT.get(dtype, dtype)}-{i}{tag}"))
    return params


PARAMS = _params()


# --------------------------------------------------------------------------------------------------
# helpers

def _clone_tree(tree):
    return pytree.tree_map(lambda a: a.clone() if isinstance(a, torch.Tensor) else a, tree)


def _assert_unchanged(args, snapshot):
    for now, before in zip(pytree.tree_leaves(args), pytree.tree_leaves(snapshot)):
        if isinstance(now, torch.Tensor):
            torch.testing.assert_close(now, before, equal_nan=True, rtol=0, atol=0,
                                       msg="fjit mutated an input")


def assert_same_structure(actual, expected):
    sa, se = pytree.tree_structure(actual), pytree.tree_structure(expected)
    assert sa == se, f"output structure differs:\n fjit:  {sa}\n eager: {se}"


def assert_matches_eager(actual, expected):
    assert_same_structure(actual, expected)
    torch.testing.assert_close(actual, expected, equal_nan=True)


def assert_same_metadata(actual, expected):
    assert_same_structure(actual, expected)
    for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
        assert type(a) is type(e)
        if isinstance(e, torch.Tensor):
            assert (a.shape, a.dtype, a.device) == (e.shape, e.dtype, e.device), \
                f"fjit {a.shape} {a.dtype} {a.device} vs eager {e.shape} {e.dtype} {e.device}"


def _draws_differ(first, second):
    pairs = [(a, b) for a, b in zip(pytree.tree_leaves(first), pytree.tree_leaves(second))
             if isinstance(a, torch.Tensor) and a.numel() > 1]
    return not pairs or any(not torch.equal(a, b) for a, b in pairs)


# --------------------------------------------------------------------------------------------------
# the suite

@pytest.mark.parametrize("info, args", PARAMS)
def test_op(info, args):
    fn = info.fn
    expected = fn(*args)
    snapshot = _clone_tree(args)

    jf = fjit.jit(fn)
    actual = jf(*args)
    _assert_unchanged(args, snapshot)
    first = fjit.cache_info(jf)
    assert (first.hits, first.misses) == (0, 1), first

    if info.check == "close":
        assert_matches_eager(actual, expected)
    elif info.check == "random":
        assert_same_metadata(actual, expected)
        if info.name in ("torch.rand", "torch.rand_like"):
            for t in pytree.tree_leaves(actual):
                assert bool(((t >= 0) & (t < 1)).all()), "torch.rand draws outside [0, 1)"
    else:
        assert_same_metadata(actual, expected)
        info.check(args, actual)

    again = jf(*args)                        # same metadata: a cache hit, no retrace
    second = fjit.cache_info(jf)
    assert (second.hits, second.misses) == (first.hits + 1, first.misses), second
    if info.check == "close":
        assert_matches_eager(again, expected)
    else:
        assert _draws_differ(actual, again), "two calls of a random op drew the same numbers"

    traces = fjit.last_traces(jf)
    assert traces and str(traces[-1]).strip()
    for t in traces:                # SSA, defined before use, every prim's output by its rule
        verify(t)


def test_registry_covers_claimed_ops():
    """Every op fjit decomposes into prims has samples here."""
    from fjit.decompositions import claimed_ops

    missing = set(claimed_ops()) - all_names()
    assert not missing, f"claimed ops without samples in tests/op_samples.py: {sorted(missing)}"


def test_registry_runs_eagerly():
    """Every sample is valid for eager torch (no error, no warning): the registry is sound."""
    for info, dtype, i, args in op_samples.cases():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            try:
                info.fn(*args)
            except Exception as e:
                raise AssertionError(f"{info.id} {dtype} sample {i} fails eagerly: {e!r}") from e


def test_registry_dtypes():
    """Every entry has samples for each of its dtypes, and every name is covered in float32 or (for
    integer-only ops) int64."""
    by_name: dict = {}
    for info in OP_SAMPLES:
        assert info.dtypes, info.id
        for dtype in info.dtypes:
            assert info.samples(dtype), f"{info.id} has no samples for {dtype}"
        by_name.setdefault(info.name, set()).update(info.dtypes)
    for name, dtypes in by_name.items():
        assert torch.float32 in dtypes or torch.int64 in dtypes, name


# Gradients: the compiled backward against eager's ------------------------------------------------
# Every float32 sample compared with assert_close, in float64 (so a rounding difference cannot hide
# a wrong rule): the gradient of a fixed random weighting of the outputs, to every floating input,
# on the first call and on the cached call.  Each floating output is scaled and shifted, so
# that something fuses and the cached call runs the joint program: the backward of the op's prims
# by fjit's rules (a lone op keeps torch autograd over its torch call).  This is where a
# decomposition whose values are right but whose backward is not shows (hardswish at its bounds,
# max over all elements at a NaN, view_as's shape operand).  Embedding's padding row needs a
# second use of the weight to show: tests/autodiff/test_autodiff.py has that case.

def _scaled(fn):
    def scaled(*args):
        return pytree.tree_map(lambda t: t * 1.5 + 0.25 if isinstance(t, torch.Tensor) and t.is_floating_point() else t,
                               fn(*args))
    return scaled


def _float64_leaves(args):
    return [a.detach().to(torch.float64).requires_grad_()
            if isinstance(a, torch.Tensor) and a.dtype in (torch.float32, torch.float64) else a for a in args]


def _weighted_sum(out):
    leaves = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad]
    if not leaves:
        return None
    g = torch.Generator().manual_seed(1)
    return sum((t * torch.randn(t.shape, generator=g, dtype=t.dtype)).nan_to_num(0.0, 0.0, 0.0).sum()
               for t in leaves)


def _grad_params():
    params = []
    for p in PARAMS:
        info, args = p.values
        if "-f32-" not in p.id or info.check != "close":
            continue
        leaves = _float64_leaves(args)
        if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in leaves):
            continue
        try:
            total = _weighted_sum(info.fn(*leaves))
            if total is None:
                continue
            torch.autograd.grad(total, [a for a in leaves if isinstance(a, torch.Tensor)], allow_unused=True)
        except RuntimeError:       # an op torch does not differentiate (or not in float64)
            continue
        params.append(p)
    return params


@pytest.mark.parametrize("info, args", _grad_params())
def test_op_gradients(info, args):
    expected_in = _float64_leaves(args)
    wrt = [a for a in expected_in if isinstance(a, torch.Tensor) and a.requires_grad]
    fn = _scaled(info.fn)
    expected = torch.autograd.grad(_weighted_sum(fn(*expected_in)), wrt, allow_unused=True)
    jf = fjit.jit(fn)
    for call in ("first", "cached"):
        inputs = _float64_leaves(expected_in)
        wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        actual = torch.autograd.grad(_weighted_sum(jf(*inputs)), wrt, allow_unused=True)
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert (a is None) == (e is None), f"{call} call, input {k}: fjit {a}, eager {e}"
            if e is not None:
                torch.testing.assert_close(a, e, equal_nan=True, rtol=1.3e-6, atol=1e-5,   # float32's: a
                                           msg=lambda m: f"{call} call, input {k}: {m}")  # dtype= rounds


# Data-dependent output shapes: fjit cannot trace them, and says so -------------------------------

def _mask_args():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, generator=g)
    return x, x > 0


DATA_DEPENDENT = [
    pytest.param(lambda x, m: x[m], id="x[bool_mask]"),
    pytest.param(lambda x, m: x[m[:, 0]], id="x[bool_row_mask]"),
    pytest.param(lambda x, m: x[x > 0.5], id="x[x > 0.5]"),
    pytest.param(lambda x, m: x[:, m[0]] * 2, id="x[:, bool_mask]*2"),
    pytest.param(lambda x, m: torch.masked_select(x, m), id="masked_select"),
    pytest.param(lambda x, m: torch.nonzero(m), id="nonzero"),
    pytest.param(lambda x, m: torch.where(m), id="where(cond)"),
]


@pytest.mark.parametrize("fn", DATA_DEPENDENT)
def test_data_dependent_shape_is_unsupported(fn):
    x, m = _mask_args()
    fn(x, m)  # fine eagerly
    with pytest.raises(fjit.UnsupportedOpError):
        fjit.jit(fn)(x, m)


# --------------------------------------------------------------------------------------------------
# test_op runs the default executors: small regions are C kernels (tests/conftest.py builds them
# synchronously).  The first sample of every op and dtype also runs with torch calls only, and
# through the Triton executor on CPU tensors under TRITON_INTERPRET=1.

FIRST_PARAMS = [p for p in PARAMS if p.id.endswith("-0") and p.values[0].check == "close"]


@pytest.mark.parametrize("info, args", FIRST_PARAMS)
def test_op_with_torch_executor(info, args):
    expected = info.fn(*args)
    snapshot = _clone_tree(args)
    jf = fjit.jit(info.fn, executors=("torch",))
    actual = jf(*args)
    _assert_unchanged(args, snapshot)
    assert_matches_eager(actual, expected)
    assert "C kernel" not in str(fjit.last_traces(jf)[-1])


TRITON_PARAMS = FIRST_PARAMS


@pytest.mark.triton
@pytest.mark.parametrize("info, args", TRITON_PARAMS)
def test_op_with_triton(info, args, monkeypatch):
    """The first sample of every op and dtype, with the Triton executor claiming what it can."""
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")
    expected = info.fn(*args)
    snapshot = _clone_tree(args)
    actual = fjit.jit(info.fn, executors=("triton", "torch"))(*args)
    _assert_unchanged(args, snapshot)
    assert_matches_eager(actual, expected)


NUMPY_NAMED = {
    # what transformers' Funnel writes, and numpy's names of other native functions
    "cat_axis": lambda a, b: torch.cat((a, b), axis=1),
    "sum_axis_keepdims": lambda a, b: a.sum(axis=0, keepdims=True) + b,
    "amax_axis": lambda a, b: torch.amax(a * b, axis=-1),
    "softmax_axis": lambda a, b: torch.softmax(a, axis=-1) * b,
    "stack_axis": lambda a, b: torch.stack([a, b], axis=2),
}


@pytest.mark.parametrize("name", NUMPY_NAMED)
def test_numpy_argument_names_of_native_functions(name):
    """torch's argument parser takes numpy's `axis` and `keepdims` for `dim` and `keepdim` of any
    native function; the ops are decomposed as under torch's names (no opaque fallback)."""
    fn = NUMPY_NAMED[name]
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    jf = fjit.jit(fn)
    torch.testing.assert_close(jf(a, b), fn(a, b))
    trace = str(fjit.last_traces(jf)[0])
    assert "axis" not in trace and "keepdims" not in trace and "fallback" not in trace, trace


def test_an_argument_a_decomposition_does_not_know_leaves_the_op_whole(monkeypatch):
    """A decomposition whose signature does not take a call's arguments (an argument torch added)
    leaves the op one torch call with eager's result, rather than failing inside fjit."""
    from fjit.frontend import record
    decompositions = dict(record.DECOMPOSITIONS)
    monkeypatch.setitem(record.DECOMPOSITIONS, torch.cat, lambda tensors: None)
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    jf = fjit.jit(lambda a, b: torch.cat((a, b), dim=1) * 2)
    torch.testing.assert_close(jf(a, b), torch.cat((a, b), dim=1) * 2)
    assert "prims.cat" not in str(fjit.last_traces(jf)[0])
    assert decompositions[torch.cat] is not None
