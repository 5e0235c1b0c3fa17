"""Reading a global (or an enclosing function's) number.

``SCALE`` is read once, at trace time, and bound as a constant, like numba does:
``fjit.diagnose`` lists it among the bindings.  Assigning ``SCALE`` a new value later does not
retrace; pass a value that changes as an argument (a float argument is a runtime value and does
not recompile).
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "Reading a global number"
FIX = None
EXPECTED = None
BINDINGS = [("SCALE", "global")]

SCALE = 0.5


def bad(x):
    return x * SCALE


def good(x, scale=SCALE):
    return x * scale


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
