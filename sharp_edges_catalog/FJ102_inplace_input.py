"""An in-place operation on an input tensor.

In eager PyTorch ``x.mul_(2)`` changes the caller's tensor.  A tracer that records the op
functionally (as most do, to optimize) returns the right value but leaves the caller's tensor
unchanged, or changes it only on the first, traced call: the caller observes a different program.
fjit's compiled programs never write to their inputs, so writing to one is an error.
"""
import torch

import fjit

CODE = "FJ102"
ERROR = fjit.InputMutationError
TITLE = "An in-place operation on an input tensor"
FIX = "use the out-of-place op (e.g. y = x.mul(2), not x.mul_(2)) and return the result"
EXPECTED = (
    "Tensor.mul_ writes to input 'x' of 'bad'; the compiled function does not mutate its "
    "inputs"
)


def bad(x):
    x.mul_(2)  # sharp edge
    return x + 1


def good(x):
    y = x.mul(2)
    return y + 1


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
