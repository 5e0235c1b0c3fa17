"""Python control flow on shapes.

Shapes, dtypes and devices are known at trace time (they are part of the cache key), so ``if``
on them is resolved while tracing; a call with another shape gets its own trace.  Only control
flow on tensor values is data-dependent (FJ106).
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "Control flow on shapes"
FIX = None
EXPECTED = None


def bad(x):
    if x.shape[-1] > 4:
        return x[..., :4]
    return x


def good(x):
    return x[..., :4]


def inputs():
    return (torch.randn(2, 6),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
