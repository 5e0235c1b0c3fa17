"""Printing inside the compiled function.

``print`` is not a tensor operation, so it does not appear in a trace: a tracer runs it once, while
tracing (printing a proxy, not values), and cached calls print nothing.  Debug output that appears
only on the first call is worse than none.  fjit reports the call instead of running it silently
once.
"""
import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "print() inside the function"
FIX = "return the value and print it outside the compiled function"
EXPECTED = "print() in 'bad' runs once, while tracing, and never in compiled calls"


def bad(x):
    y = x.softmax(-1)
    print("row sums:", y.sum(-1))  # sharp edge
    return y


def good(x):
    return x.softmax(-1)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
