"""torch.func transforms inside a compiled function, and over one.

Inside: a transform (`vmap`, `grad`, `jacrev`, ...) applied while fjit traces is recorded as one
op, whose inputs are every traced tensor it reaches, the function's closure included (here the
input `x` the vmapped function closes over); at run time the op calls the transform on the real
tensors.  Over: `torch.func.grad(fjit.jit(f))` traces `f` on plain stand-ins and runs its
program's torch form on the transform's tensors.  Both give eager's values.
"""
import torch
from torch.func import grad, vmap

import fjit

CODE = None
ERROR = None
TITLE = "torch.func transforms inside and over a compiled function"
FIX = None
EXPECTED = None


def bad(x):
    row_scores = vmap(lambda row: (row * x[0]).sum())(x)        # closes over the input x
    return row_scores + grad(lambda y: (y.sin() * x[0]).sum())(x[1])


def good(x):
    return (x * x[0]).sum(1) + x[0] * x[1].cos()


def inputs():
    return (torch.randn(4, 4),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    torch.testing.assert_close(grad(lambda t: fjit.jit(good)(t).sum())(*args),
                               grad(lambda t: good(t).sum())(*args))
    print("bad and good: fjit matches eager, inside and under torch.func.grad")
