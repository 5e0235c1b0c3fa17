"""An in-place operation on a view of an input, several views away.

``x[0]``, ``.view(...)`` and ``.t()`` share memory with ``x``, so writing into ``block`` writes
into the caller's ``x``.  A tracer that does not follow aliasing sees only a write to a temporary,
drops the effect on ``x`` and computes ``x.sum()`` from the unmodified values.  fjit tracks which
input every view aliases and reports the write, naming the input it reaches.
"""
import torch

import fjit

CODE = "FJ102"
ERROR = fjit.InputMutationError
TITLE = "An in-place operation on a view of an input"
FIX = "clone the input before writing into a view of it, and return the result"
EXPECTED = (
    "Tensor.add_ writes to input 'x' of 'bad' through a view of it; the compiled function "
    "does not mutate its inputs"
)


def bad(x):
    first = x[0]
    block = first.view(2, 2).t()
    block.add_(1)  # sharp edge
    return x.sum()


def good(x):
    x = x.clone()
    block = x[0].view(2, 2).t()
    block.add_(1)  # on a clone the function owns: fjit rewrites it out-of-place
    return x.sum()


def inputs():
    return (torch.randn(3, 4),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
