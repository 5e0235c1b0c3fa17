"""A tensor captured by a closure.

Closing over a tensor hides it from the signature exactly as a global does: the traced program
would carry the captured tensor as a constant, and a later update of that tensor (say, a weight
that is trained) would not reach the compiled code.  fjit binds closure variables as constants,
which is right for numbers and functions but not for tensors, so it reports the capture.
"""
import torch

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A tensor captured by a closure"
FIX = "pass the captured tensor as an argument instead of closing over it"
EXPECTED = "closure variable 'scale' is a torch.Tensor that is not an input of 'bad'"


def make_scaler(scale):
    def bad(x):
        return x * scale  # sharp edge

    return bad


bad = make_scaler(torch.full((3,), 2.0))


def good(x, scale):
    return x * scale


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), torch.full((3,), 2.0))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
