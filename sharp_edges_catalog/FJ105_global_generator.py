"""Drawing from a random generator that lives outside the function.

``rng`` is a ``numpy.random.Generator`` created at import (the same holds for a global
``random.Random(0)``): each draw advances its state, so eager PyTorch gets a new number on every
call, while a trace would freeze the first draw into the program.  A generator created *inside* the
function from a fixed seed is deterministic and fine: every call draws the same numbers in eager
too.
"""
import numpy as np
import torch

import fjit

CODE = "FJ105"
ERROR = fjit.NondeterminismError
TITLE = "A global random generator"
FIX = "draw with torch inside, or pass the drawn number in as an argument"
EXPECTED = (
    "drawing from 'rng', a Generator that existed before the call, in 'bad' would be frozen into "
    "the compiled code as one trace-time value"
)
RANDOM = "torch.randn_like draws new numbers on every call, so only shapes are compared"

rng = np.random.default_rng(0)


def bad(x):
    jitter = rng.normal(0.0, 0.01)  # sharp edge
    return x + jitter


def good(x):
    return x + 0.01 * torch.randn_like(x)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    assert fjit.jit(good)(*args).shape == good(*args).shape  # random values: compare shapes
    print("good: fjit matches eager")
