"""Operating-system entropy (``os.urandom``, ``uuid.uuid4``, ``secrets``) inside the function.

These return fresh bytes on every call; a tracer bakes the first result into the program, so a
"unique" salt or id is the same forever.  fjit reports calls to os.urandom, uuid and secrets.
"""
import os

import torch

import fjit

CODE = "FJ105"
ERROR = fjit.NondeterminismError
TITLE = "os.urandom / uuid / secrets inside the function"
FIX = "generate the value outside the compiled function and pass it in"
EXPECTED = "os.urandom() in 'bad' would be frozen into the compiled code as one trace-time value"


def bad(x):
    salt = int.from_bytes(os.urandom(1), "little")  # sharp edge
    return x + salt


def good(x, salt):
    return x + salt


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), int.from_bytes(os.urandom(1), "little"))


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
