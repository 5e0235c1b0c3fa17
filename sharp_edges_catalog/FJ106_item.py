"""``.item()`` turns a tensor into a Python number.

The number only exists when the data does: a tracer either fails or takes the value of the example
input and freezes it into the program as a constant, so later calls divide by the wrong peak.
fjit reports ``.item()``.
"""
import torch

import fjit

CODE = "FJ106"
ERROR = fjit.DataDependentError
TITLE = ".item() on a tensor"
FIX = "keep the value as a 0-d tensor instead of calling .item()"
EXPECTED = (
    ".item() of a cpu f32[] tensor computed from input 'x' needs its data in Python while tracing 'bad'"
    "; the compiled code would freeze one call's value"
)


def bad(x):
    peak = x.abs().max().item()  # sharp edge
    return x / peak


def good(x):
    return x / x.abs().max()


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
