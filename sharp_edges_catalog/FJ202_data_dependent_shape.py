"""An operation whose output shape depends on tensor data (boolean-mask indexing, torch.nonzero).

``x[x > 0]`` has as many elements as ``x`` has positive entries: the shape is unknown until the
data is.  A tracer that records the example's shape compiles a program that is wrong for every
other input.  fjit rejects such operations; a fixed-shape rewrite with ``torch.where`` usually
does the job.
"""
import torch

import fjit

CODE = "FJ202"
ERROR = fjit.UnsupportedOpError
TITLE = "Output shape depends on data (x[x > 0], torch.nonzero)"
FIX = "keep shapes fixed: use torch.where(mask, x, 0) and reduce"
EXPECTED = "Tensor.__getitem__ cannot be traced: its output shape depends on tensor data"


def bad(x):
    return x[x > 0].sum()  # sharp edge


def good(x):
    return torch.where(x > 0, x, 0.0).sum()


def inputs():
    return (torch.randn(4, 5),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
