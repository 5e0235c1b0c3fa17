"""A compiled function called under a torch.func transform (vmap, grad, jvp, ...) or forward-mode AD.

A transform hands the function its own tensors: vmap's carry a hidden batch dim, grad's and jvp's
record what the transform differentiates, and a dual tensor of forward-mode AD carries a tangent.
Each still says it is a torch.Tensor, with the unbatched value's shape.  A compiled program runs
on the values alone: it would compute one example, or drop the gradient or the tangent, and a C
kernel cannot read a wrapper's data at all.  fjit refuses the input.  The transform goes inside
the compiled function instead (torch.vmap is traced as one op), and gradients are taken in
reverse mode through the compiled function's outputs (its backward is compiled too).
"""
import torch

import fjit

CODE = "FJ201"
ERROR = fjit.UnsupportedInputError
TITLE = "A compiled function called under torch.vmap, torch.func or forward-mode AD"
FIX = ("apply the transform inside the compiled function, fjit.jit(lambda x: torch.vmap(f)(x)); "
       "for gradients call backward() or torch.autograd.grad on the compiled function's outputs")
EXPECTED = "a tensor of a torch.func transform"


def row_norm(x):
    return (x * x).sum().sqrt()


def bad(x):
    return torch.vmap(fjit.jit(row_norm))(x)  # sharp edge


def good(x):
    return torch.vmap(row_norm)(x)


def inputs():
    return (torch.randn(4, 3),)


if __name__ == "__main__":
    try:
        bad(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
