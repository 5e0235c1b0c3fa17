"""A tensor attribute of a module that is neither a parameter nor a buffer.

``self.mask = torch.tril(...)`` makes a plain attribute: ``named_parameters()``,
``named_buffers()`` and ``state_dict()`` do not list it, ``module.to(device)`` does not move it, and
neither ``fjit.jit(module)`` nor ``torch.func.functional_call`` passes it in, so the compiled
program would hold one tensor object as a constant.  Register it as a buffer: it is then an input
of the compiled forward, read at every call (``persistent=False`` keeps it out of the state dict).
"""
import torch
from torch import nn

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A tensor attribute of a module that is not a buffer"
FIX = ("register it as a buffer, self.register_buffer('mask', t, persistent=False), and compile "
       "the module with fjit.jit(module)")
EXPECTED = ("global 'causal', tensor attribute 'mask' (neither a parameter nor a buffer) is a "
            "torch.Tensor that is not an input of 'bad'")


class CausalMask(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.mask = torch.ones(n, n, dtype=torch.bool).triu(1)

    def forward(self, scores):
        return scores.masked_fill(self.mask, float("-inf"))  # sharp edge


class CausalMaskBuffer(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("mask", torch.ones(n, n, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, scores):
        return scores.masked_fill(self.mask, float("-inf"))


causal = CausalMask(4)
causal_buffer = CausalMaskBuffer(4)


def bad(scores):
    return causal(scores).softmax(-1)


def good(buffers, scores):
    return torch.func.functional_call(causal_buffer, buffers, (scores,)).softmax(-1)


def inputs():
    return (torch.randn(4, 4),)


def good_inputs():
    return (dict(causal_buffer.named_buffers()), torch.randn(4, 4))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
