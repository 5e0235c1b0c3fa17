"""Setting an environment variable inside the function.

``os.environ[...] = ...`` (or ``os.environ.update``, ``os.putenv``, ``del os.environ[...]``) changes
the process's state: it would happen once, while tracing, and never on compiled calls, so whatever
reads the variable later sees it set or not depending on whether the call was the first one.
"""
import os

import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "Setting an environment variable"
FIX = "set environment variables before calling the compiled function"
EXPECTED = "os.environ assignment in 'bad' runs once, while tracing, and never in compiled calls"


def bad(x):
    os.environ["FJIT_CATALOG_LAST_ROWS"] = str(x.shape[0])  # sharp edge
    return x.relu()


def good(x):
    return x.relu()


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
