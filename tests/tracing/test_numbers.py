"""A float input's value never leaks stale.  Wherever the value leaves the trace (math.*,
str/format, int/round, a shape, a dict key, a branch) the trace specializes on it and the cache key
guards it; a float used only in tensor arithmetic is a runtime value and never recompiles."""
import math

import pytest
import torch
import torch.nn.functional as F

import fjit

LEAKS = {
    "math_log": lambda x, s: x * math.log(s),
    "math_sqrt_exp": lambda x, s: x * math.sqrt(s) + math.exp(-s),
    "math_floor_ceil_trunc": lambda x, s: x * (math.floor(s) + math.ceil(s) + math.trunc(s)),
    "str": lambda x, s: x * float(str(s)[:3]),
    "fstring": lambda x, s: x * len(f"{s:.3f}"),
    "format_percent": lambda x, s: x * float("%.1f" % s),
    "int_round": lambda x, s: x * (int(s) + round(s, 1)),
    "as_size": lambda x, s: torch.zeros(int(s * 2)) + x.sum(),
    "as_slice_bound": lambda x, s: x[: int(s)],
    "dict_key": lambda x, s: x * {2.5: 1.0, 3.5: -1.0}.get(s, 0.5),
    "branch": lambda x, s: x * 2 if s > 3.0 else x - 1,
    "is_integer": lambda x, s: x + 1 if s.is_integer() else x,
    "divmod": lambda x, s: x * divmod(s, 2.0)[0],
    "float_of": lambda x, s: x * float(s) ** 2,
    "max_with_const": lambda x, s: x * max(s, 3.0),
    "isclose": lambda x, s: x * 0 if math.isclose(s, 2.5) else x,
}


@pytest.mark.parametrize("name", sorted(LEAKS))
def test_a_value_that_leaves_the_trace_is_guarded(name):
    f = LEAKS[name]
    jf = fjit.jit(f)
    x = torch.randn(6)
    for s in (2.5, 3.5, 2.5, 4.0):
        torch.testing.assert_close(jf(x, s), f(x, s))


@pytest.mark.parametrize("f", [
    lambda x, s: x * s + 1,
    lambda x, s: torch.add(x, x, alpha=s),
    lambda x, s: x * (s * 2 + 1) - s / 3,
    lambda x, s: torch.clamp(x, min=-s, max=s),
    lambda x, s: torch.nn.functional.leaky_relu(x, s),
    lambda x, s: torch.full((3,), s) + x[:3],
    lambda x, s: x.pow(s ** 0.5),
])
def test_a_float_used_only_in_tensor_arithmetic_never_recompiles(f):
    jf = fjit.jit(f)
    x = torch.rand(6) + 0.1
    for s in (0.25, 0.5, 0.75, 1.25):
        torch.testing.assert_close(jf(x, s), f(x, s))
    assert fjit.cache_info(jf).misses == 1


def test_number_arithmetic_is_recorded_in_the_trace():
    jf = fjit.jit(lambda x, s: x * (s * 2 + 1))
    jf(torch.randn(3), 0.5)
    assert "operator.mul" in str(fjit.last_traces(jf)[0])


def test_number_proxy_reads_as_a_float():
    def f(x, s):
        assert isinstance(s, float) and not isinstance(s, int)
        return x * s
    jf = fjit.jit(f)
    torch.testing.assert_close(jf(torch.ones(2), 1.5), torch.full((2,), 1.5))


def test_a_guarded_value_recompiles_once_per_value_and_caches():
    f = LEAKS["math_log"]
    jf = fjit.jit(f)
    x = torch.randn(3)
    for s in (2.0, 5.0, 2.0, 5.0):
        torch.testing.assert_close(jf(x, s), f(x, s))
    info = fjit.cache_info(jf)
    assert (info.misses, info.hits) == (2, 2), info


@pytest.mark.parametrize("first, second", [(0.0, -0.0), (-0.0, 0.0), (float("nan"), float("nan"))])
def test_specialized_floats_are_keyed_by_their_bits(first, second):
    """A trace specialized on str(s) must not serve -0.0 with 0.0's program (0.0 == -0.0 and they
    hash alike); a NaN must hit its own program (nan != nan).  Found by the property test."""
    def f(x, s):
        return x * 2 if str(s).startswith("-") else x - 1
    jf = fjit.jit(f)
    x = torch.ones(3)
    for s in (first, second, first, second):
        torch.testing.assert_close(jf(x, s), f(x, s))
    assert jf.cache_info().misses == (1 if str(first) == str(second) else 2)


# A float input that reaches an output's shape: specialized (a new value recompiles), never a
# stale shape; one that is only a value (full's fill, linspace's bounds) stays a runtime value.
SHAPE_FROM_NUMBER = {
    "interpolate_scale": (lambda x, s: F.interpolate(x, scale_factor=s, mode="nearest").sin() * 2 + 1, True),
    "upsample_module": (lambda x, s: torch.nn.Upsample(scale_factor=s)(x).sin() * 2 + 1, True),
    "arange_end": (lambda x, s: torch.arange(0, s).sin() * 2 + x.sum(), True),
    "arange_step": (lambda x, s: torch.arange(0.0, 3.0, s).sin() * 2 + x.sum(), True),
    "int_of_product": (lambda x, s: x.flatten()[: int(s * 2)].sin() * 2 + 1, True),
    "pad_amount": (lambda x, s: F.pad(x, (int(s), int(s))).sin() * 2 + 1, True),
    "floor_slice": (lambda x, s: x.reshape(-1)[: math.floor(s)].sin() * 2 + 1, True),
    "full_value": (lambda x, s: torch.full((2,), s).sin() * 2 + x.sum(), False),
    "linspace_bounds": (lambda x, s: torch.linspace(0, s, 5).sin() * 2 + x.sum(), False),
}


@pytest.mark.parametrize("name", sorted(SHAPE_FROM_NUMBER))
def test_a_float_reaching_a_shape_is_guarded_and_a_value_is_not(name):
    fn, reaches_shape = SHAPE_FROM_NUMBER[name]
    jf = fjit.jit(fn)
    x = torch.randn(1, 1, 2, 2)
    for s in (2.0, 3.0, 1.5, 3.0):
        torch.testing.assert_close(jf(x, s), fn(x, s))
    assert fjit.cache_info(jf).misses == (3 if reaches_shape else 1)
