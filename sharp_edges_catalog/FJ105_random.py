"""Python's ``random`` module inside the function.

``random.uniform`` returns a plain float; a tracer sees a number, not an operation, and bakes the
first draw into the program as a constant.  Every later call reuses it: the augmentation is no
longer random.  fjit reports calls into ``random``.
"""
import random

import torch

import fjit

CODE = "FJ105"
ERROR = fjit.NondeterminismError
TITLE = "random.* inside the function"
FIX = "draw with torch (torch.rand) inside, or pass the number in as an argument"
EXPECTED = (
    "random.uniform() in 'bad' would be frozen into the compiled code as one trace-time value"
)


def bad(x):
    scale = random.uniform(0.9, 1.1)  # sharp edge
    return x * scale


def good(x, scale):
    return x * scale  # floats are runtime values: a new scale does not recompile


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), random.uniform(0.9, 1.1))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
