"""Mutating a mutable default argument.

A default value is created once, when ``def`` runs, and shared by every call: ``cache=[]`` is one
list that outlives the call, so appending to it is a side effect, not a write to an input.  It would
happen once, while tracing.  (The caller did not pass the list, so this is FJ104, not the FJ103 of
an input list.)
"""
import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "Mutating a mutable default argument"
FIX = "default to None and build the list inside (seen = [] if seen is None else list(seen)), or return the value"
EXPECTED = (
    "append() on default argument 'seen', a list that persists between calls in 'bad'; a "
    "compiled call would not repeat it"
)


def bad(x, seen=[]):  # noqa: B006 (the sharp edge this entry is about)
    seen.append(x.shape[0])  # sharp edge
    return x.relu(), len(seen)


def good(x, seen=None):
    seen = [] if seen is None else list(seen)
    seen.append(x.shape[0])
    return x.relu(), len(seen)


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
