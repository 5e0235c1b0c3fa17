"""A module-level tensor used inside the compiled function.

A permissive tracer reads the global once, while tracing, and freezes its values (or its address)
into the compiled program: reassigning or updating ``bias`` later is silently ignored, or worse,
the program keeps reading memory that the global no longer owns.  fjit only proxies the tensors it
is given, so a tensor that reaches an operation from anywhere else is an error.
"""
import torch

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A global tensor used inside the function"
FIX = "pass the tensor as an argument of the function"
EXPECTED = "global 'bias' is a torch.Tensor that is not an input of 'bad'"

bias = torch.ones(3)


def bad(x):
    return x + bias  # sharp edge


def good(x, bias):
    return x + bias


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), bias)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
