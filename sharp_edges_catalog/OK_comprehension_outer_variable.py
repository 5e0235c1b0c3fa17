"""A comprehension reading a variable of the enclosing function.

A comprehension is a nested function; reading ``offset`` from it makes ``offset`` a closure
variable.  Some source-translating tracers reject that; fjit runs it as Python does.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "A comprehension reading an outer variable"
FIX = None
EXPECTED = None


def bad(x):
    offset = x.mean()
    return [x + offset * i for i in range(3)]


def good(x):
    offset = x.mean()
    result = []
    for i in range(3):
        result.append(x + offset * i)
    return result


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
