"""The torch executor: the final trace becomes a generated Python function of direct torch calls.

It claims everything: a torch-level op runs as the very torch call the user made (so its numerics
are eager's), and a prim left at top level by another executor runs as its torch lowering.
"""
from __future__ import annotations

from typing import Callable

from fjit.core.ir import Trace
from fjit.passes.basic import free_dead_values, reuse_buffers


def finalize(trace: Trace) -> Trace:
    """The last stage: what the generated function is compiled from."""
    return free_dead_values(reuse_buffers(trace)).with_stage("torch_executor")


def compile_trace(trace: Trace) -> Callable:
    return trace.python_callable()
