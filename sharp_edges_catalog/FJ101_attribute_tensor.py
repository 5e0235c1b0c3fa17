"""A tensor attribute of a global object, such as ``model.weight``.

The object itself is a global, so it is bound as a constant when the function is traced; the
tensors hanging off it are then constants too.  After an optimizer step (or a
``model.weight = new_weight``) the compiled program would keep using the old values.  fjit follows
attribute reads on bound objects and reports a tensor found there.
"""
import torch

import fjit

CODE = "FJ101"
ERROR = fjit.UnproxiedTensorError
TITLE = "A tensor attribute of a global object"
FIX = "pass the object's tensors (or a dict of them) as arguments"
EXPECTED = "attribute 'weight' of global 'model' is a torch.Tensor that is not an input of 'bad'"


class TinyLinear:
    def __init__(self, n_in, n_out):
        self.weight = torch.randn(n_out, n_in)


model = TinyLinear(4, 2)


def bad(x):
    return x @ model.weight.t()  # sharp edge


def good(x, weight):
    return x @ weight.t()


def inputs():
    return (torch.randn(3, 4),)


def good_inputs():
    return (torch.randn(3, 4), model.weight)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
