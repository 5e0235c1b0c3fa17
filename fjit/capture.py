"""Whether another of PyTorch's tracers is capturing a call of a jitted function or module.

torch.compile (Dynamo), torch.export and torch.jit.trace (and torch.onnx.export, built on the last
two) record the ops a call runs.  A compiled fjit program is calls into kernels that none of them
can follow, and export gives a jitted call fake tensors, which no program takes; so while one of
them captures, a jitted function runs its own Python and a jitted module its wrapped module, and
the capture records the user's ops, as it would without fjit.

Dynamo answers is_dynamo_compiling() as True while it traces (a constant in its graph), and False
when the code it compiled runs; fjit's own trace sets torch.compiler's broader is_compiling flag
(frontend/tracer.compiling_answered_true), process-wide, so that flag cannot tell the two apart
and is not read here.
"""
from __future__ import annotations

import torch

_dynamo_tracing = torch.compiler.is_dynamo_compiling
_exporting = torch.compiler.is_exporting
_jit_tracing = torch._C._get_tracing_state


def captured() -> bool:
    """Whether Dynamo, torch.export or torch.jit.trace is recording the current call."""
    return _dynamo_tracing() or _exporting() or _jit_tracing() is not None
