"""Assigning a global variable.

``global calls; calls += 1`` runs once, while tracing: the counter stops at 1 no matter how often
the compiled function is called.  fjit reads globals once and binds them as constants, so writing
one is reported.
"""
import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "Assigning a global variable"
FIX = "return the new value instead of assigning a global"
EXPECTED = (
    "assignment to global 'calls' in 'bad'; it happens once, while tracing, and never in "
    "compiled calls"
)

calls = 0


def bad(x):
    global calls
    calls += 1  # sharp edge
    return x * 2


def good(x, calls):
    return x * 2, calls + 1


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), 0)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
