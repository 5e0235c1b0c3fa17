"""In-place operations on tensors the function created.

Writing into a tensor the function made itself is invisible to the caller, so fjit accepts it and
functionalizes it: ``add_`` and the item assignment are rewritten out of place, with views kept
consistent.  Only writes that reach an input are errors (FJ102).
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "In-place operations on the function's own tensors"
FIX = None
EXPECTED = None


def bad(x):
    y = x.clone()
    y.add_(1)
    y[0] = 0.0
    return y


def good(x):
    y = x + 1
    return torch.cat([torch.zeros_like(y[:1]), y[1:]])


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
