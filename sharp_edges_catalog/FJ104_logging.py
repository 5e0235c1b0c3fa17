"""Logging inside the compiled function.

A logging call is a side effect that the trace cannot contain: it would be emitted once, during
tracing, with proxies for values, and never on the cached calls that follow.  fjit reports calls
to the logging API (whatever the logger's level: the configuration may change between calls).
"""
import logging

import torch

import fjit

CODE = "FJ104"
ERROR = fjit.SideEffectError
TITLE = "logging inside the function"
FIX = "return the value and log it outside the compiled function"
EXPECTED = "logging.warning() in 'bad' runs once, while tracing, and never in compiled calls"

log = logging.getLogger("sharp_edges_catalog.demo")


def bad(x):
    log.warning("normalizing a batch of %d rows", x.shape[0])  # sharp edge
    return torch.nn.functional.normalize(x, dim=-1)


def good(x):
    return torch.nn.functional.normalize(x, dim=-1)


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
