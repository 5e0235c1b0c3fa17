"""Random tensor operations inside the function.

Unlike Python's ``random`` (FJ105), ``torch.rand`` and ``dropout`` are tensor operations: they are
recorded in the trace and draw new numbers on every call of the compiled function.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "torch random ops (dropout, torch.rand_like)"
FIX = None
EXPECTED = None
RANDOM = "dropout and torch.rand_like draw new numbers on every call, so only shapes are compared"


def bad(x):
    return torch.nn.functional.dropout(x, p=0.5, training=True)


def good(x):
    keep = torch.rand_like(x) >= 0.5
    return torch.where(keep, x * 2.0, 0.0)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    assert fjit.jit(bad)(*args).shape == bad(*args).shape  # random values: compare shapes
    print(fjit.diagnose(bad, *args))
    assert fjit.jit(good)(*args).shape == good(*args).shape
    print("bad and good: fjit matches eager (shapes)")
