"""Seeding the global random generator inside the function.

``torch.manual_seed`` changes global state: a tracer runs it once, while tracing, and the cached
program draws fresh numbers on every later call, so the "reproducible" dropout is reproducible
only the first time.  fjit reports the call; random tensor ops themselves (``dropout``,
``torch.rand``) are traced and draw new numbers on every call.
"""
import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "torch.manual_seed inside the function"
FIX = "seed outside the compiled function"
EXPECTED = "torch.manual_seed() in 'bad' runs once, while tracing, and never in compiled calls"
RANDOM = "dropout draws new numbers on every call, so only shapes are compared"


def bad(x):
    torch.manual_seed(0)  # sharp edge
    return torch.nn.functional.dropout(x, p=0.5, training=True)


def good(x):
    return torch.nn.functional.dropout(x, p=0.5, training=True)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    assert fjit.jit(good)(*args).shape == good(*args).shape  # random values: compare shapes
    print("good: fjit matches eager")
