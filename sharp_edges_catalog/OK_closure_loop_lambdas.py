"""Lambdas created in a loop, closing over the loop variable.

Python closures bind variables late: every lambda below reads ``k`` when it is called, after the
loop has ended, so all three multiply by 2.  fjit traces the real Python, so it reproduces this
exactly, surprising or not; ``good`` binds each value early with a default argument, giving
``x * 0, x * 1, x * 2``.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "Closures over loop values (lambdas in a loop)"
FIX = None
EXPECTED = None


def bad(x):
    scalers = [lambda t: t * k for k in range(3)]
    return [f(x) for f in scalers]


def good(x):
    scalers = [lambda t, k=k: t * k for k in range(3)]
    return [f(x) for f in scalers]


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
