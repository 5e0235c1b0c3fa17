"""``nonlocal`` state owned by the traced function itself.

``count`` is a local variable of ``bad``; the nested ``step`` updates it through ``nonlocal``.
Since the cell is created by the traced call, every call starts from ``count = 0`` and the update
is part of the computation, not a side effect: fjit traces it (compare FJ104_nonlocal_assignment,
where the cell belongs to an enclosing function outside the call).
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "nonlocal state owned by the function"
FIX = None
EXPECTED = None


def bad(x):
    count = 0

    def step(t):
        nonlocal count
        count += 1
        return t * count

    return step(step(x))


def good(x):
    return x * 1 * 2


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
