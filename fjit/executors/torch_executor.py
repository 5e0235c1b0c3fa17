"""The torch executor: the final trace becomes a generated Python function of direct torch calls.

It claims everything: a torch-level op runs as the very torch call the user made (so its numerics
are eager's), and a prim left at top level by another executor runs as its torch lowering.

In check mode (FJIT_CHECK=1, read when a program is compiled) the generated function also checks,
after every torch fallback, that the real output's shape, dtype and strides are the ones recorded
in the trace (which came from meta tensors): kernels and later ops rely on them.  Without it the
program has no such calls.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar, Trace
from fjit.passes.basic import free_dead_values, reuse_buffers


def finalize(trace: Trace) -> Trace:
    """The last stage: what the generated function is compiled from."""
    return free_dead_values(reuse_buffers(trace)).with_stage("torch_executor")


def compile_trace(trace: Trace) -> Callable:
    if os.environ.get("FJIT_CHECK") == "1":
        trace = with_metadata_checks(trace)
    return trace.python_callable()


def check_metadata(value, op: str, name: str, shape: tuple, dtype, strides: tuple) -> None:
    """Check mode: the real output `value` of the fallback `op` has the recorded metadata."""
    if not isinstance(value, torch.Tensor):
        raise AssertionError(f"fjit check: torch fallback {op} returned {type(value).__name__} "
                             f"for {name}, recorded as a tensor")
    real = (tuple(value.shape), value.dtype, tuple(value.stride()))
    if real != (shape, dtype, strides):
        raise AssertionError(
            f"fjit check: torch fallback {op} output {name}: recorded shape {list(shape)}, dtype "
            f"{dtype}, strides {strides}; real shape {list(real[0])}, dtype {real[1]}, strides "
            f"{real[2]}")


CHECK_METADATA = Symbol("fjit_check.metadata", check_metadata, frozenset({Tag.IMPURE}))


def with_metadata_checks(trace: Trace) -> Trace:
    """The trace with a check_metadata call after each torch fallback, one per tensor output."""
    out = []
    for b in trace.bsyms:
        out.append(b)
        if b.sym.has(Tag.FALLBACK):
            for v in b.outputs():
                if isinstance(v, TensorVar):
                    out.append(BoundSymbol(CHECK_METADATA, (v, b.sym.qualname, v.name, v.shape,
                                                            v.dtype, v.strides), {}, None,
                                           comment=f"check mode: {v.name} has the recorded metadata"))
    return trace.with_stage(trace.stage + "+checks", out)
