"""A parameter of a global module, such as ``model(x)`` inside a jitted function.

The module is a global, so it is bound as a constant when the function is traced, and its
parameters and buffers would be constants too: after ``optimizer.step()`` the compiled program
would keep using the old weights.  fjit names the parameter.  Compile the module itself, whose
parameters and buffers are then inputs read at every call, or pass them in and call the module
through ``torch.func.functional_call``.
"""
import torch
from torch import nn

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A parameter of a global module"
FIX = ("compile the module itself, fjit.jit(model), or pass dict(model.named_parameters()) in and "
       "call torch.func.functional_call(model, params, (x,))")
EXPECTED = "global 'model', parameter 'fc1.weight' is a torch.Tensor that is not an input of 'bad'"


class TwoLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))  # sharp edge


model = TwoLayer()


def bad(x):
    return model(x) * 2


def good(params, x):
    return torch.func.functional_call(model, params, (x,)) * 2


def inputs():
    return (torch.randn(3, 4),)


def good_inputs():
    return (dict(model.named_parameters()), torch.randn(3, 4))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
