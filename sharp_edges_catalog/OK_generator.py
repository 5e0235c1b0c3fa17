"""A generator (``yield``) used inside the function.

Generators are ordinary Python control flow: fjit runs the generator while tracing and records
the tensor operations it performs, exactly as a list comprehension would.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "Generators and yield"
FIX = None
EXPECTED = None


def bad(x, n):
    def powers():
        for i in range(1, n + 1):
            yield x**i

    return sum(powers())


def good(x, n):
    return sum([x**i for i in range(1, n + 1)])


def inputs():
    return (torch.randn(2, 3), 3)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
