"""File I/O inside the compiled function.

Opening, reading or writing a file happens while tracing only: a metrics file would get one line
instead of one per call, and a value read from a file would be frozen at its first content.
fjit reports file and network I/O made by the function.
"""
import os
import tempfile

import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "File I/O inside the function"
FIX = "do the I/O outside the compiled function"
EXPECTED = "open() in 'bad' runs once, while tracing, and never in compiled calls"


def bad(x, path):
    y = x.softmax(-1)
    with open(path, "a") as f:  # sharp edge
        f.write(f"rows={y.shape[0]}\n")
    return y


def good(x):
    return x.softmax(-1)


def inputs():
    return (torch.randn(2, 3), os.path.join(tempfile.gettempdir(), "fjit_catalog_metrics.txt"))


def good_inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
