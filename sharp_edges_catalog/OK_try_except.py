"""try/except inside the function.

A missing key in an input dict raises ``KeyError`` while tracing, and the ``except`` branch runs,
exactly as in Python.  Which keys a dict has is part of fjit's cache key, so a call with a
``"scale"`` entry gets its own trace.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "try/except"
FIX = None
EXPECTED = None


def bad(x, params):
    try:
        return x * params["scale"]
    except KeyError:
        return x


def good(x, params):
    return x * params["scale"] if "scale" in params else x


def inputs():
    return (torch.randn(2, 3), {"bias": torch.zeros(3)})


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
