"""Anything callable jits: builtins and method descriptors, functools.partial, bound methods and
objects with `__call__` are traced to eager's answer, or refused with a located error; the jitted
function carries the metadata `functools.wraps` copies, with fallbacks where the callable lacks a
name."""
from __future__ import annotations

import functools
import inspect
import logging
import operator
import pickle
import random
import time

import pytest
import torch

import fjit


class Scale:
    """Multiplies by a constant."""

    def __init__(self, k):
        self.k = k

    def __call__(self, x):
        return x * self.k

    def mul(self, x):
        return x * self.k + 1


class Weighted:
    def __init__(self):
        self.w = torch.randn(3)

    def __call__(self, x):
        return x * self.w


def scaled(x, k):
    return x * k


def appends(x, acc):
    acc.append(1)
    return x * 2


X = torch.randn(3)

CALLABLES = {
    "method descriptor __radd__": (torch.Tensor.__radd__, (X, 2)),
    "method descriptor add": (torch.Tensor.add, (X, X)),
    "torch builtin": (torch.sin, (X,)),
    "Python builtin": (abs, (X,)),
    "operator": (operator.mul, (X, X)),
    "partial of a lambda": (functools.partial(lambda x, k: x * k, k=2), (X,)),
    "partial of a partial": (functools.partial(functools.partial(scaled, k=3)), (X,)),
    "partial of a method descriptor": (functools.partial(torch.Tensor.add, alpha=2), (X, X)),
    "bound method": (Scale(3).mul, (X,)),
    "object with __call__": (Scale(3), (X,)),
    "jit of a jitted function": (fjit.jit(scaled), (X, 2)),
}


@pytest.mark.parametrize("name", CALLABLES)
def test_a_callable_gives_eagers_answer_and_is_cached(name):
    fn, args = CALLABLES[name]
    jf = fjit.jit(fn)
    torch.testing.assert_close(jf(*args), fn(*args))
    torch.testing.assert_close(jf(*args), fn(*args))
    assert jf.cache_info() == (1, 1, 1)


def test_a_function_carries_what_functools_wraps_copies():
    jf = fjit.jit(scaled)
    for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
        assert getattr(jf, attr) == getattr(scaled, attr), attr
    assert jf.__wrapped__ is scaled
    assert inspect.signature(jf) == inspect.signature(scaled)


@pytest.mark.parametrize("fn, args, module, name, qualname", [
    (torch.Tensor.__radd__, (X, 2), "torch._C", "__radd__", "TensorBase.__radd__"),  # no __module__
    (functools.partial(scaled, k=2), (X,), "functools", "partial(scaled)", "partial(scaled)"),
    (Scale(2), (X,), __name__, "Scale", "Scale"),
    (Scale(2).mul, (X,), __name__, "mul", "Scale.mul"),
])
def test_names_a_callable_lacks_are_made_up(fn, args, module, name, qualname):
    jf = fjit.jit(fn)
    assert (jf.__module__, jf.__name__, jf.__qualname__) == (module, name, qualname)
    assert jf.__wrapped__ is fn
    assert jf.__doc__ == fn.__doc__
    jf(*args)
    assert str(fjit.explain(jf)).startswith(f"fjit: '{qualname}' compiled 1 time")
    assert str(fjit.diagnose(fn, *args)).startswith(f"fjit diagnosis of '{name}': no sharp edges")


def test_an_objects_state_is_not_copied_onto_the_jitted_function():
    jf = fjit.jit(Scale(2))
    assert not hasattr(jf, "k")
    assert callable(jf.cache_info)


def test_a_jitted_builtin_pickles_by_reference():
    jf = pickle.loads(pickle.dumps(fjit.jit(torch.Tensor.__radd__)))
    torch.testing.assert_close(jf(X, 2), X + 2)


# -- what a callable reaches that is not an input ------------------------------------------------

def test_a_tensor_attribute_of_a_callable_object_is_fj101():
    with pytest.raises(fjit.UnproxiedTensorError) as info:
        fjit.jit(Weighted())(X)
    assert "attribute 'w' of 'self' of 'Weighted.__call__'" in str(info.value)
    assert info.value.entry == "FJ101_attribute_tensor"


def test_a_tensor_bound_by_a_partial_is_fj101():
    with pytest.raises(fjit.UnproxiedTensorError) as info:
        fjit.jit(functools.partial(scaled, k=torch.ones(3)))(X)
    assert "argument 'k' bound by functools.partial is a torch.Tensor that is not an input of " \
           "'partial(scaled)'" in str(info.value)


def test_a_bound_tensor_method_is_fj101():
    with pytest.raises(fjit.UnproxiedTensorError) as info:
        fjit.jit(X.add)(X)
    assert "'self' of 'Tensor.add' is a torch.Tensor" in str(info.value)


def test_mutating_a_list_bound_by_a_partial_is_fj104():
    acc = []
    with pytest.raises(fjit.SideEffectError) as info:
        fjit.jit(functools.partial(appends, acc=acc))(X)
    assert "append() on 'acc'" in str(info.value)
    assert info.value.lineno == appends.__code__.co_firstlineno + 1


@pytest.mark.parametrize("fn, args, error, what", [
    (print, ("hello",), fjit.SideEffectError, "print()"),
    (random.random, (), fjit.NondeterminismError, "random.random()"),
    (random.randint, (0, 9), fjit.NondeterminismError, "random.randint()"),
    (time.time, (), fjit.NondeterminismError, "time.time()"),
    (logging.getLogger("fjit.tests.callables").warning, ("hi",), fjit.SideEffectError, "logging."),
    (torch.manual_seed, (0,), fjit.SideEffectError, "torch.manual_seed()"),
])
def test_a_jitted_builtin_with_a_side_effect_is_reported_at_the_call(fn, args, error, what):
    """Called by fjit itself, not from user code: still classified, at the line of the call."""
    jf = fjit.jit(fn)
    with pytest.raises(error) as info:
        jf(*args)
    line = inspect.currentframe().f_lineno - 1
    assert what in str(info.value)
    assert (info.value.filename, info.value.lineno) == (__file__, line)


def test_a_jitted_in_place_method_descriptor_is_fj102():
    with pytest.raises(fjit.InputMutationError):
        fjit.jit(torch.Tensor.add_)(X.clone(), 1)
