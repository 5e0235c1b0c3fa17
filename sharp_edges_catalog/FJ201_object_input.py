"""An arbitrary object as input.

fjit proxies tensors and flattens the containers it knows (tuple, list, dict, namedtuple,
torch.Size); the rest of a Python scalar input is a compile-time constant.  An arbitrary object is
neither: its attributes could change between calls without fjit noticing, and tensors inside it
would be unproxied.  fjit refuses it, naming its type and the accepted types.
"""
import collections

import torch

import fjit

CODE = "FJ201"
ERROR = fjit.UnsupportedInputError
TITLE = "An arbitrary object as input"
FIX = "pass the object's tensors and numbers as arguments, or a dict or namedtuple of them"
# The type is named with its module, which depends on how the entry is run: the class name is stable.
EXPECTED = "Params cannot be proxied"


class Params:
    def __init__(self, weight, bias):
        self.weight = weight
        self.bias = bias


ParamsTuple = collections.namedtuple("ParamsTuple", ["weight", "bias"])


def bad(x, p):
    return x * p.weight + p.bias


def good(x, p):
    return x * p.weight + p.bias


def inputs():
    return (torch.randn(2, 3), Params(torch.randn(3), torch.randn(3)))


def good_inputs():
    return (torch.randn(2, 3), ParamsTuple(torch.randn(3), torch.randn(3)))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
