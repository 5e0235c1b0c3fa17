"""Reading the clock inside the function.

``time.time()`` returns a float that a tracer freezes at trace time: a schedule driven by wall
time would stop moving after the first call.  fjit reports calls into ``time`` (time, monotonic,
perf_counter, ...).
"""
import time

import torch

import fjit

CODE = "FJ105"
ERROR = fjit.NondeterminismError
TITLE = "Reading the clock inside the function"
FIX = "read the clock outside the compiled function and pass the value in"
EXPECTED = "time.time() in 'bad' would be frozen into the compiled code as one trace-time value"


def bad(x):
    phase = time.time() % 1.0  # sharp edge
    return x * phase


def good(x, phase):
    return x * phase


def inputs():
    return (torch.randn(2, 3),)


def good_inputs():
    return (torch.randn(2, 3), time.time() % 1.0)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
