"""``.tolist()`` turns tensor data into Python numbers.

Like ``.item()``, the numbers depend on the data: a tracer would freeze the weights of the example
input into the program.  fjit reports ``.tolist()`` (and ``.numpy()``).
"""
import torch

import fjit

CODE = "FJ106"
ERROR = fjit.DataDependentError
TITLE = ".tolist() on a tensor"
FIX = "keep the values as a tensor; convert after the compiled call"
EXPECTED = (
    ".tolist() of input 'weights' (a cpu f32[3] tensor) needs its data in Python while tracing 'bad'"
    "; the compiled code would freeze one call's value"
)


def bad(x, weights):
    ws = weights.tolist()  # sharp edge
    return sum(w * row for w, row in zip(ws, x))


def good(x, weights):
    return (weights[:, None] * x).sum(0)


def inputs():
    return (torch.randn(3, 4), torch.tensor([0.2, 0.3, 0.5]))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
