"""The toy executor (see __init__.py): claims regions of elementwise prims its language covers on
CPU tensors, and runs each as one generated Python function of torch operators."""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, NumberVar, TensorVar
from fjit.core.prims import ROWS, computation_dtype, prim_of
from fjit.core.trace import Trace
from fjit.executors import kernel_bsym, kernel_inputs_usable
from fjit.passes.fusion import FusionPolicy, Partitioner, Region
from toy_language import LANGUAGE

name = "toy"
CALLS: list = []       # the regions it ran, by kernel name (what the test asserts on)


def fuses_on(device: torch.device) -> bool:
    return device.type == "cpu"


def supported(b: BoundSymbol) -> bool:
    p = prim_of(b)
    outs = b.outputs()
    return (p is not None and LANGUAGE.covers(ROWS[p])
            and len(outs) == 1 and isinstance(outs[0], TensorVar)
            and all(isinstance(a, (TensorVar, NumberVar, bool, int, float)) for a in b.args))


_PARTITIONER = Partitioner(FusionPolicy(supported, max_row=None))


def claim(trace: Trace, leaves: list) -> Trace | None:
    if not kernel_inputs_usable(trace, fuses_on):
        return None
    return _PARTITIONER.fuse(trace, "toy_fusion", _kernel, worth=lambda r: len(r.bsyms) > 1)


def _operand(x, names: dict, dtype: torch.dtype) -> str:
    if isinstance(x, TensorVar):        # computed in the prim's computation dtype, as kernels do
        return f"{names[x.name]}.to({str(dtype)})"
    if isinstance(x, NumberVar):
        return names[x.name]
    if isinstance(x, float) and not math.isfinite(x):
        return f"float({str(x)!r})"
    return repr(x)      # a number: never user text


def _kernel(region: Region) -> BoundSymbol:
    names = {v.name: f"a{k}" for k, v in enumerate(region.inputs)}
    lines = [f"def toy_kernel({', '.join(names[v.name] for v in region.inputs)}):"]
    for k, b in enumerate(region.bsyms):
        out = b.outputs()[0]
        names[out.name] = f"v{k}"
        dtype = computation_dtype(b)
        expr = ROWS[prim_of(b)].kernels["expr"].expr.format(*(_operand(a, names, dtype) for a in b.args))
        lines.append(f"    v{k} = torch.as_tensor({expr}).to({str(out.dtype)})")
    lines.append(f"    return ({', '.join(names[v.name] for v in region.outputs)},)")
    source = "\n".join(lines)
    scope = {"torch": torch}
    exec(compile(source, "<toy kernel>", "exec"), scope)
    fn = scope["toy_kernel"]
    kernel_name = f"toy_{len(CALLS)}"
    outputs = list(region.outputs)

    def launch(*args):
        CALLS.append(kernel_name)
        results = fn(*args)
        placed = [torch.empty_strided(tuple(v.shape), tuple(v.strides), dtype=v.dtype).copy_(r)
                  for v, r in zip(outputs, results)]
        return placed[0] if len(placed) == 1 else tuple(placed)
    return kernel_bsym(region, kernel_name, launch, source)


def differentiates(b: BoundSymbol) -> bool:
    return all(supported(s) for s in b.subsymbols or (b,))


def fused_prims(b: BoundSymbol) -> int:
    prims = b.subsymbols or (b,)
    return len(prims) if all(supported(s) for s in prims) else 0


def pending() -> bool:
    return False


def wait() -> bool:
    return True
