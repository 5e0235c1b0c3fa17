"""A nested function reading a value captured from the signature.

``inner`` closes over ``x``, an argument of the traced function: the closure cell holds a proxy,
not a hidden tensor, so nothing is frozen.  fjit traces nested functions and their closures
exactly as Python runs them (compare FJ101_closure_tensor, where the captured tensor comes from
outside the traced call).
"""
import functools

import torch

import fjit

CODE = None
ERROR = None
TITLE = "A nested function reading a captured argument"
FIX = None
EXPECTED = None


def bad(x, y):
    def inner(z):
        return x * z

    return inner(y), inner(2.0)


def good(x, y):
    def inner(x, z):
        return x * z

    f = functools.partial(inner, x)
    return f(y), f(2.0)


def inputs():
    return (torch.randn(2, 3), torch.randn(2, 3))


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
