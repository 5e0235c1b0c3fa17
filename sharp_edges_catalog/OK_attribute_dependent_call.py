"""A call whose target is chosen by an attribute of a global object.

``(block.gelu if block.use_gelu else block.relu)(x)`` picks a method from configuration.  fjit
reads globals once, at trace time, and binds them as constants (``fjit.diagnose`` lists the
binding), so the choice is made while tracing and the trace contains only the chosen op.  Like
any bound constant, changing ``block.use_gelu`` after the first call does not retrace: pass it as
an argument (a bool is part of the cache key) if it changes.
"""
import torch

import fjit

CODE = None
ERROR = None
TITLE = "Attribute-dependent calls"
FIX = None
EXPECTED = None
BINDINGS = [("block", "global")]


class Block:
    use_gelu = True

    def gelu(self, x):
        return torch.nn.functional.gelu(x)

    def relu(self, x):
        return torch.relu(x)


block = Block()


def bad(x):
    return (block.gelu if block.use_gelu else block.relu)(x)


def good(x):
    return block.gelu(x) if block.use_gelu else block.relu(x)


def inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    args = inputs()
    torch.testing.assert_close(fjit.jit(bad)(*args), bad(*args))
    print(fjit.diagnose(bad, *args))
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("bad and good: fjit matches eager")
