"""Python ``if`` on a tensor value.

``if x.sum() > 0`` asks for the truth of a tensor, which only exists once data is known.  A tracer
that evaluates it on the example input takes one branch and compiles only that branch: calls
whose data would take the other branch get the wrong answer, silently.  fjit reports
``bool(tensor)`` in control flow.
"""
import torch

import fjit

CODE = "FJ106"
ERROR = fjit.DataDependentError
TITLE = "Python if on a tensor value"
FIX = "use torch.where(cond, a, b) instead of Python if on a tensor"
EXPECTED = (
    "bool() of a cpu b8[] tensor computed from input 'x' needs its data in Python while tracing 'bad'"
    "; the compiled code would freeze one call's value"
)


def bad(x):
    if x.sum() > 0:  # sharp edge
        return x * 2
    return -x


def good(x):
    return torch.where(x.sum() > 0, x * 2, -x)


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
