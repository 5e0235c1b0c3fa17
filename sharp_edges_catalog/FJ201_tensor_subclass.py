"""A ``torch.Tensor`` subclass with its own ``__torch_function__`` as input.

Such a subclass runs its own code around every torch operation on it (this one counts them;
others log, reroute or change results).  A tracer that proxies it as a plain tensor drops that
behaviour from the compiled program.  fjit refuses the input, naming its type and the types it
accepts.
"""
import torch

import fjit

CODE = "FJ201"
ERROR = fjit.UnsupportedInputError
TITLE = "A tensor subclass with __torch_function__ as input"
FIX = "pass a plain torch.Tensor (for example t.as_subclass(torch.Tensor))"
# The type is named with its module, which depends on how the entry is run: the class name is stable.
EXPECTED = "CountingTensor cannot be proxied"


class CountingTensor(torch.Tensor):
    """Counts every torch operation applied to it."""

    ops = 0

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.ops += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def bad(x):
    return x + 1


def good(x):
    return x + 1


def inputs():
    return (torch.randn(2, 3).as_subclass(CountingTensor),)


def good_inputs():
    return (torch.randn(2, 3),)


if __name__ == "__main__":
    try:
        fjit.jit(bad)(*inputs())
    except fjit.FjitError as e:
        print(e)
    args = good_inputs()
    torch.testing.assert_close(fjit.jit(good)(*args), good(*args))
    print("good: fjit matches eager")
