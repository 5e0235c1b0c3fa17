"""``with torch.autograd.profiler.record_function(...)`` inside the function.

Context managers are try/finally blocks, which tracers that compile Python source often reject.
fjit runs them: the profiler range opens and closes while tracing and the tensor work inside is
traced as usual.  (The range itself is not replayed by the compiled program; profile the call
from outside to see it.)
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "with record_function(...)"
FIX = None
EXPECTED = None


def bad(x):
    with torch.autograd.profiler.record_function("scale_and_shift"):
        y = x * 2 + 1
    return y.relu()


def good(x):
    y = x * 2 + 1
    return y.relu()


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
