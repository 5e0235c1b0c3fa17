"""A variable first assigned inside a loop and used after it.

Tracers that translate Python into a graph language (rather than running it) choke on ``y``
being defined only inside the loop body.  fjit runs the Python itself: the loop over a constant
``range(n)`` unrolls at trace time and ``y`` is simply the last value assigned.  (With ``n == 0``
Python raises ``UnboundLocalError``, and so does fjit.)
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "A loop variable first assigned inside the loop"
FIX = None
EXPECTED = None


def bad(x, n):
    for i in range(n):
        y = x * i
    return y


def good(x, n):
    y = torch.zeros_like(x)
    for i in range(n):
        y = x * i
    return y


def inputs():
    return (torch.randn(2, 3), 3)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
