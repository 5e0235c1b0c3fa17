"""Item assignment into an input tensor.

``x[:, 0] = 0.0`` is an in-place ``copy_`` into a view of ``x``: in eager mode the caller's tensor
changes.  A functional trace would return the softmax of the modified values but leave the
caller's ``x`` as it was.  fjit reports setitem on an input (or on any view of one).
"""
import torch

import fjit

CODE = "FJ102"
ERROR = fjit.InputMutationError
TITLE = "Item assignment into an input tensor"
FIX = "clone the input, assign into the clone, and return it"
EXPECTED = (
    "item assignment writes to input 'x' of 'bad'; the compiled function does not mutate its "
    "inputs"
)


def bad(x):
    x[:, 0] = 0.0  # sharp edge
    return x.softmax(-1)


def good(x):
    x = x.clone()
    x[:, 0] = 0.0
    return x.softmax(-1)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
