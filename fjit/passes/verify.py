"""The structural verifier of a trace (JAX's check_jaxpr, tinygrad's spec): what every stage must
satisfy whatever pass produced it.

- SSA: every value is defined once, by an input or by one bound symbol's outputs.
- Defined before use: every value a bound symbol reads (and the trace returns) is defined earlier
  and not yet deleted.
- Each prim's recorded output (at top level or as a subsymbol of a torch-level op) has the shape
  and dtype its row's lowering gives on meta tensors of its inputs: the prim's rule.

Run after every stage under FJIT_CHECK=1 (pipeline.lower) and by the tests.  A violation is an
internal error of fjit, raised as TraceVerificationError with the stage, the line and the rule.
"""
from __future__ import annotations

import torch

from fjit.core.ir import BoundSymbol, GeneratorVar, NumberVar, Tag, TensorVar, Var, flatten_values, map_values
from fjit.core.trace import Trace
from fjit.core.prims import ROWS, Kind, prim_of
from fjit.core.meta import meta_tensor, run_meta


class TraceVerificationError(AssertionError):
    """A trace broke a structural rule: a bug in the pass that made it, never the user's."""


def verify(trace: Trace) -> Trace:
    """`trace` unchanged if it satisfies every rule above; else TraceVerificationError."""
    defined: dict[str, Var] = {}

    def fail(b: BoundSymbol | None, rule: str):
        where = f" at `{b.sym.qualname}` -> {[v.name for v in b.outputs()]}" if b is not None else ""
        raise TraceVerificationError(f"fjit internal error: stage {trace.stage!r} of {trace.name!r}"
                                     f"{where}: {rule}")

    for v in trace.inputs:
        if v.name in defined:
            fail(None, f"input {v.name} is defined twice")
        defined[v.name] = v
    for b in trace.bsyms:
        for v in b.inputs():
            if v.name not in defined and v.name not in trace.consts:
                fail(b, f"{v.name} is read before it is defined (or after its del)")
        if b.sym.qualname == "del":
            for v in b.args:
                defined.pop(v.name, None)
            continue
        for v in b.outputs():
            if v.name in defined:
                fail(b, f"{v.name} is defined twice (not SSA)")
            defined[v.name] = v
        for p in [b] + list(_prims_under(b)):
            problem = _prim_rule_violation(p)
            if problem:
                fail(p, problem)
    for v in flatten_values(trace.output):
        if isinstance(v, Var) and v.name not in defined and v.name not in trace.consts:
            fail(None, f"the output {v.name} is never defined")
    return trace


def _prims_under(b: BoundSymbol):
    for s in b.subsymbols:
        yield s
        yield from _prims_under(s)


# Prims whose lowering would draw numbers or make data even on meta inputs: their rule is checked on
# the meta device (factories) or not at all (none so far).
_FACTORIES = (Kind.FACTORY, Kind.RANDOM)


def _prim_rule_violation(b: BoundSymbol) -> str | None:
    p = prim_of(b)
    if p is None or b.sym.has(Tag.KERNEL):
        return None
    outs = b.outputs()
    if not all(isinstance(v, TensorVar) for v in outs):
        return None
    if ROWS[p].kind in _FACTORIES and any(isinstance(a, NumberVar) for a in b.inputs()):
        return None     # its shape follows runtime numbers (arange(a, b)) the trace guards on

    def to_meta(x):
        if isinstance(x, TensorVar):
            return meta_tensor(x)
        if isinstance(x, NumberVar):
            return x.pytype(1)
        if isinstance(x, GeneratorVar):
            return None
        return x
    with torch._C.DisableTorchFunction():
        args, kwargs = map_values(to_meta, (b.args, b.kwargs))
        if ROWS[p].kind in _FACTORIES:
            kwargs = {k: v for k, v in kwargs.items() if k != "generator"}
            kwargs["device"] = "meta"
        try:
            result = run_meta(b.sym.fn, args, kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError, NotImplementedError) as e:
            # the prim refuses its own recorded arguments
            return f"its lowering refuses the recorded arguments: {type(e).__name__}: {e}"
    got = [m for m in flatten_values(result) if isinstance(m, torch.Tensor)]
    if len(got) != len(outs):
        return f"records {len(outs)} outputs, its rule gives {len(got)}"
    for v, m in zip(outs, got):
        if tuple(m.shape) != v.shape or m.dtype != v.dtype:
            return (f"records {v.name} as {list(v.shape)} {v.dtype}, its rule gives "
                    f"{list(m.shape)} {m.dtype}")
    return None
