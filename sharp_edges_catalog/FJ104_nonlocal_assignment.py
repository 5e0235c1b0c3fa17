"""Assigning a ``nonlocal`` variable of an enclosing function.

The closure cell belongs to ``make_counter``'s frame, outside the traced function, so the
increment happens once, while tracing; cached calls neither update ``count`` nor see a new value
of it.  fjit reports assignments to cells the traced function does not own.  (A ``nonlocal`` that
refers to a variable of the traced function itself is fine: see OK_nonlocal_inside_function.)
"""
import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "Assigning a nonlocal variable of an enclosing function"
FIX = "return the new value instead of writing to an enclosing scope"
EXPECTED = (
    "assignment to enclosing-scope variable 'count' (nonlocal) in 'bad'; it happens once, "
    "while tracing, and never in compiled calls"
)


def make_counter():
    count = 0

    def bad(x):
        nonlocal count
        count += 1  # sharp edge
        return x * 2

    return bad


bad = make_counter()


def good(x, count):
    return x * 2, count + 1


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), 0)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
