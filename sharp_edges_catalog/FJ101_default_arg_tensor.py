"""A tensor as the default value of a parameter.

A default value is evaluated once, when ``def`` runs, and shared by every call that omits the
argument: it is a hidden global.  When the caller does not pass it, a tracer sees a real tensor
that is not one of the values it was handed, and would freeze it into the program.  fjit proxies
the arguments actually passed; a tensor that arrives through a default is reported.
"""
import torch

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A tensor as a parameter's default value"
FIX = "make the default None and pass the tensor explicitly"
EXPECTED = "default argument 'bias' is a torch.Tensor that is not an input of 'bad'"


def bad(x, bias=torch.zeros(3)):
    return x + bias  # sharp edge


def good(x, bias=None):
    return x if bias is None else x + bias


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), torch.zeros(3))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
