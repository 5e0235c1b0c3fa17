"""Appending to an input list.

A list argument is flattened into its tensors when the function is traced; the list object itself
is not part of the compiled program.  ``xs.append(...)`` would therefore happen once, during
tracing, and never on later (cached) calls, and the input's structure, which is part of the cache
key, would change under fjit's feet.  Input containers are read-only in fjit.
"""
import torch

import fjit

CODE = "FJ103"
ERROR = fjit.InputMutationError
TITLE = "Appending to an input list"
FIX = "build a new list (xs + [v]) and return it"
EXPECTED = (
    "append() on an input list of 'bad'; compiled code would not see the change on later "
    "calls"
)


def bad(xs):
    xs.append(torch.stack(xs).mean(0))  # sharp edge
    return xs


def good(xs):
    return xs + [torch.stack(xs).mean(0)]


def inputs():
    return ([torch.randn(3), torch.randn(3)],)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
