"""``with torch.no_grad()`` inside the function.

Grad mode is part of what fjit traces: operations inside the block are recorded as not
requiring gradients, exactly as eager PyTorch computes them, here a norm used as a constant scale.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "with torch.no_grad()"
FIX = None
EXPECTED = None


def bad(x, w):
    with torch.no_grad():
        scale = w.norm()
    return x * w / scale


def good(x, w):
    return x * w / w.detach().norm()


def inputs():
    return (torch.randn(2, 3), torch.randn(3, requires_grad=True))


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
