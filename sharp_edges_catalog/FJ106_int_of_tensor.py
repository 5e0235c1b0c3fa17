"""``int()`` or ``float()`` of a tensor.

``int(n)`` reads the tensor's value; used as a loop count it decides how many operations the trace
contains.  A tracer unrolls the loop for the example's count and reuses that program for every
other count.  fjit reports ``int()``/``float()`` of a tensor.
"""
import torch

import fjit

CODE = "FJ106"
ERROR = fjit.DataDependentError
TITLE = "int() or float() of a tensor"
FIX = "keep the value as a tensor, or pass the number in as an argument"
EXPECTED = (
    "int() of input 'n' (a cpu i64[] tensor) needs its data in Python while tracing 'bad'"
    "; the compiled code would freeze one call's value"
)


def bad(x, n):
    steps = int(n)  # sharp edge
    for _ in range(steps):
        x = x * 0.5
    return x


def good(x, steps):
    for _ in range(steps):  # a Python int is a compile-time constant (part of the cache key)
        x = x * 0.5
    return x


def inputs():
    return (torch.randn(2, 3), torch.tensor(3))


def good_inputs():
    return (torch.randn(2, 3), 3)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
