"""An ``out=`` argument that is an input tensor.

``torch.mul(x, 2, out=out)`` stores the product in the caller's ``out``.  A functional trace
computes the product into a fresh buffer and the caller's tensor is never written (except perhaps
once, while tracing).  fjit reports ``out=`` targets that are inputs or views of inputs.
"""
import torch

import fjit

CODE = "FJ102"
ERROR = fjit.InputMutationError
TITLE = "out= writes into an input tensor"
FIX = "drop out= and return the result"
EXPECTED = "out= writes to input 'out' of 'bad'; the compiled function does not mutate its inputs"


def bad(x, out):
    torch.mul(x, 2, out=out)  # sharp edge
    return out


def good(x):
    return torch.mul(x, 2)


def inputs():
    return (torch.randn(2, 3), torch.empty(2, 3))


def good_inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
