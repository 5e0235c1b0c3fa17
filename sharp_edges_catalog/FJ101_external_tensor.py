"""A real tensor made from data fjit cannot see, e.g. ``torch.from_numpy`` on a global array.

``torch.from_numpy`` returns a tensor that shares memory with the NumPy array.  A tracer that lets
it through records a constant: if the array is later updated in place, or replaced, the compiled
program still computes with the values (or the buffer) it saw while tracing.  fjit treats every
real tensor that does not come from the signature or from a traced torch operation as unproxied.
"""
import numpy as np
import torch

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A tensor created from outside data (torch.from_numpy of a global array)"
FIX = "create the tensor with torch inside the function or pass it in"
EXPECTED = (
    "a cpu tensor of shape (4,) that no traced op created (e.g. from torch.from_numpy) is "
    "used, and it is not an input of 'bad'"
)

lookup = np.linspace(0.0, 1.0, 4, dtype=np.float32)


def bad(x):
    return x * torch.from_numpy(lookup)  # sharp edge


def good(x, table):
    return x * table


def inputs():
    return (torch.randn(2, 4),)


def good_inputs():
    return (torch.randn(2, 4), torch.from_numpy(lookup))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
