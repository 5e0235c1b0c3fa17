"""Property tests of three families the op-level generator (tests/ops/test_properties.py) does not
draw:

- number inputs that reach shapes (a scale factor, a bound, a slice length computed from a float):
  every call, with new values, gives eager's shapes and values;
- callables other than plain functions as the jitted callable: bound methods, callable objects,
  `functools.partial`, builtins and method descriptors;
- gradients of gradients: `create_graph=True` through random programs, compared with eager's
  second derivatives.

`FJIT_FAMILY_EXAMPLES` sets the examples per test (default 15; the long run in the docs uses 200).
"""
from __future__ import annotations

import functools
import math
import operator
import os

import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fjit

EXAMPLES = int(os.environ.get("FJIT_FAMILY_EXAMPLES", "15"))
SETTINGS = dict(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                derandomize=os.environ.get("FJIT_PROPERTY_RANDOM") != "1")

# -- numbers reaching shapes --------------------------------------------------------------------

# (function of (x [1, 1, 4, 4], s), the range of s it is defined on)
SHAPE_ROUTES = [
    (lambda x, s: F.interpolate(x, scale_factor=s, mode="nearest"), (1.0, 3.0)),
    (lambda x, s: F.interpolate(x, scale_factor=s, mode="bilinear", align_corners=False), (1.0, 3.0)),
    (lambda x, s: torch.arange(0.0, s) + x.sum(), (0.5, 9.0)),
    (lambda x, s: torch.arange(0.0, 4.0, s) * x.mean(), (0.25, 2.0)),
    (lambda x, s: x.flatten()[: int(s * 3)], (0.0, 5.0)),
    (lambda x, s: x.flatten()[: math.ceil(s)], (0.0, 16.0)),
    (lambda x, s: F.pad(x, (round(s), int(s))), (0.0, 3.0)),
    (lambda x, s: x.reshape(-1)[: max(1, int(s))].reshape(1, -1).expand(int(s) + 1, -1), (1.0, 6.0)),
    (lambda x, s: torch.full((int(s) + 1,), s) + x.sum(), (0.0, 4.0)),
    (lambda x, s: x.repeat(1, 1, int(s) + 1, 1), (0.0, 3.0)),
]


@settings(**SETTINGS)
@given(route=st.sampled_from(range(len(SHAPE_ROUTES))), data=st.data())
def test_numbers_reaching_shapes_never_give_a_stale_shape(route, data):
    fn, (lo, hi) = SHAPE_ROUTES[route]
    program = lambda x, s: (fn(x, s).sin() * 2 + 1, s * 2)   # noqa: E731 - fused work after the shape
    jf = fjit.jit(program)
    x = torch.randn(1, 1, 4, 4)
    values = data.draw(st.lists(st.floats(lo, hi, allow_nan=False), min_size=2, max_size=5))
    for s in values:
        got, want = jf(x, s), program(x, s)
        assert got[0].shape == want[0].shape, (route, s)
        torch.testing.assert_close(got, want)


# -- callables -----------------------------------------------------------------------------------

class _Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, x, y):
        return (x * self.k + y).tanh()

    def __call__(self, x, y):
        return self.apply(x, y) - y


def _callables(k):
    scaler = _Scaler(k)
    return [
        scaler.apply,                                          # a bound method
        scaler,                                                # a callable object
        functools.partial(lambda x, y, k: x * k - y, k=k),    # a partial of a lambda
        functools.partial(torch.add, alpha=k),                 # a partial of a builtin
        torch.Tensor.__radd__, torch.Tensor.add, torch.Tensor.mul, torch.maximum,   # descriptors, builtins
        operator.sub, torch.hypot, torch.atan2,
    ]


@settings(**SETTINGS)
@given(which=st.integers(0, 10), k=st.integers(-3, 3),
       shape=st.lists(st.integers(1, 5), min_size=0, max_size=3))
def test_any_callable_jits_and_matches_eager(which, k, shape):
    fn = _callables(k)[which]
    x, y = torch.randn(shape), torch.randn(shape)
    jf = fjit.jit(fn)
    for _ in range(2):
        torch.testing.assert_close(jf(x, y), fn(x, y))
    assert fjit.cache_info(jf).misses == 1


# -- gradients of gradients ----------------------------------------------------------------------

UNARY = [torch.sin, torch.tanh, torch.sigmoid, torch.exp, lambda t: t * t, F.gelu, F.silu,
         lambda t: t.softmax(-1), lambda t: F.layer_norm(t, t.shape[-1:])]


@settings(**SETTINGS)
@given(ops=st.lists(st.integers(0, len(UNARY) - 1), min_size=1, max_size=5),
       rows=st.integers(1, 4), cols=st.integers(2, 6), matmul=st.booleans(),
       executors=st.sampled_from([("c", "torch"), ("torch",)]))
def test_create_graph_backward_gives_eagers_second_derivatives(ops, rows, cols, matmul, executors):
    def f(x, w):
        h = x @ w if matmul else x * w
        for i in ops:
            h = UNARY[i](h)
        return h.sum()
    jf = fjit.jit(f, executors=executors)
    x = torch.randn(rows, cols, dtype=torch.float64, requires_grad=True)
    w = torch.randn(cols, cols, dtype=torch.float64, requires_grad=True) if matmul else \
        torch.randn(rows, cols, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        results = []
        for fn in (jf, f):
            (gx,) = torch.autograd.grad(fn(x, w), x, create_graph=True)
            results.append((gx.detach(), *torch.autograd.grad((gx * gx).sum(), (x, w))))
        torch.testing.assert_close(results[0], results[1])
