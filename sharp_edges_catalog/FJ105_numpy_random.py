"""NumPy's random generator inside the function.

``np.random.normal`` runs outside torch: a tracer records its result, a NumPy float, as a constant,
and the "noise" is the same on every call.  fjit reports calls into ``numpy.random``; torch's own
random ops are traced and draw new numbers per call.
"""
import numpy as np
import torch

import fjit

CODE = "FJ105"
ERROR = fjit.NondeterminismError
TITLE = "numpy.random inside the function"
FIX = "draw with torch inside, or pass the array in as a tensor argument"
EXPECTED = (
    "numpy.random in 'bad' would be frozen into the compiled code as one trace-time "
    "value"
)
RANDOM = "torch.randn_like draws new numbers on every call, so only shapes are compared"


def bad(x):
    jitter = np.random.normal(0.0, 0.01)  # sharp edge
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
