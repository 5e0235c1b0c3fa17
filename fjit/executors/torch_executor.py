"""The torch executor: the final trace becomes a generated Python function of direct torch calls.

It claims everything: a torch-level op runs as the very torch call the user made (so its numerics
are eager's), and a prim left at top level by another executor runs as its torch lowering.

In check mode (FJIT_CHECK=1, read when a program is compiled) the generated function also checks,
after every torch fallback, that the real output's shape, dtype, strides and conjugate and
negative bits are the ones recorded in the trace (which came from meta tensors): kernels and later
ops rely on them.  Without it the program has no such calls.
"""
from __future__ import annotations

from typing import Callable

import torch

import fjit.config as config
from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar
from fjit.core.trace import Trace
from fjit.passes.verify import verify


def compile_trace(trace: Trace) -> Callable:
    """The function that runs `trace`, a final stage.  It is verified first (passes/verify.py):
    a program some pass broke (a name read that no line defines) raises TraceVerificationError
    here and never runs, so its caller can keep another form."""
    verify(trace)
    if config.check_mode():
        trace = with_metadata_checks(trace)
    return trace.python_callable()


def check_metadata(value, op: str, name: str, shape: tuple, dtype, strides: tuple,
                   bits: tuple) -> None:
    """Check mode: the real output `value` of the fallback `op` has the recorded metadata (`bits`:
    its conjugate and negative bits)."""
    if not isinstance(value, torch.Tensor):
        raise AssertionError(f"fjit check: torch fallback {op} returned {type(value).__name__} "
                             f"for {name}, recorded as a tensor")
    real = (tuple(value.shape), value.dtype, (value.is_conj(), value.is_neg()), tuple(value.stride()))
    if real != (shape, dtype, bits, strides):
        raise AssertionError(
            f"fjit check: torch fallback {op} output {name}: recorded shape {list(shape)}, dtype "
            f"{dtype}, conjugate and negative bits {bits}, strides {strides}; real shape "
            f"{list(real[0])}, dtype {real[1]}, bits {real[2]}, strides {real[3]}")


CHECK_METADATA = Symbol("fjit_check.metadata", check_metadata, frozenset({Tag.IMPURE}))


def with_metadata_checks(trace: Trace) -> Trace:
    """The trace with a check_metadata call after each torch fallback, one per tensor output."""
    out = []
    for b in trace.bsyms:
        out.append(b)
        if b.sym.has(Tag.FALLBACK):
            for v in b.outputs():
                if isinstance(v, TensorVar):
                    bits = (v.conj_bit, v.neg_bit)
                    out.append(BoundSymbol(CHECK_METADATA, (v, b.sym.qualname, v.name, v.shape,
                                                            v.dtype, v.strides, bits), {}, None,
                                           comment=f"check mode: {v.name} has the recorded metadata"))
    return trace.with_stage(trace.stage + "+checks", out)
