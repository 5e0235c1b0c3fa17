"""A toy kernel executor, as a third party would add one to fjit: this folder and the one
registration below, with nothing in fjit's core or its prim blocks touched.

Its "kernels" evaluate a region's elementwise prims as one Python expression over whole tensors,
from the prim blocks' shared infix forms (`expr`: `({0} + {1})` is a Python expression too), so it
is also an oracle: a program it claims must give eager's answer.  Its language reads only `expr`,
so coverage lists every prim written in another spelling (`exp{f}` in C, `tl.exp` in Triton) as
one of its gaps, by name.
"""
from fjit.core.prims import KernelLanguage, register_language
from fjit.executors import register


class ToyLanguage(KernelLanguage):
    name = "toy"
    parts = ("expr",)


LANGUAGE = ToyLanguage()


def install() -> None:
    """The one registration: the executor (imported when a program asks for "toy") and its language."""
    register("toy", "toy_language.executor")
    register_language(LANGUAGE)
