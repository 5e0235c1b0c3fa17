"""Storing a new key into an input dict.

Like a list, a dict argument is flattened when traced: its keys are part of the cache key and the
dict object is not part of the compiled program.  ``batch["scaled"] = ...`` would add the key once,
while tracing, and never again on cached calls.  fjit reports the store.
"""
import torch

import fjit

CODE = "FJ103"
ERROR = fjit.InputMutationError
TITLE = "Storing into an input dict"
FIX = "build a new dict ({**d, k: v}) and return it"
EXPECTED = (
    "__setitem__() on an input dict of 'bad'; compiled code would not see the change on later"
    " calls"
)


def bad(batch):
    batch["scaled"] = batch["x"] * batch["scale"]  # sharp edge
    return batch["scaled"].sum()


def good(batch):
    batch = {**batch, "scaled": batch["x"] * batch["scale"]}
    return batch["scaled"].sum(), batch


def inputs():
    return ({"x": torch.randn(2, 3), "scale": torch.tensor(0.5)},)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
