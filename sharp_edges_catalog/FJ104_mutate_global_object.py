"""Mutating an object that existed before the call and is not an input.

``seen_batch_sizes`` is a global list: appending to it is a side effect that a trace cannot replay,
so it would happen once, while tracing.  fjit reports mutations (append, setitem, attribute
assignment, ...) of objects the function did not create and was not given.
"""
import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "Mutating a global object"
FIX = "return the new value; do not mutate objects the function does not own"
EXPECTED = (
    "append() on 'seen_batch_sizes', a list that existed before the call in 'bad'; a compiled"
    " call would not repeat it"
)

seen_batch_sizes = []


def bad(x):
    seen_batch_sizes.append(x.shape[0])  # sharp edge
    return x.relu()


def good(x):
    return x.relu(), x.shape[0]


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
