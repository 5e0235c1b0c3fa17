"""``functools.partial`` and helper functions called from the traced function.

Calls into other Python functions are inlined by tracing: fjit records the tensor operations
they perform, and the keyword values bound by ``partial`` (numbers here) are constants of the
trace.
"""
import functools

import torch

import fjit

CODE = None
ERROR = None
TITLE = "functools.partial and helper functions"
FIX = None
EXPECTED = None


def scale_shift(x, scale, shift):
    return x * scale + shift


def bad(x):
    f = functools.partial(scale_shift, scale=2.0, shift=1.0)
    return f(x)


def good(x):
    return scale_shift(x, 2.0, 1.0)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
