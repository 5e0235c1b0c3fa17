"""The prims: the small closed set of operations every executor must implement, one block each.

Each prim is declared by one `define(...)` call in its family's file (unary.py, transcendental.py,
arithmetic.py, logic.py, reductions.py, layout.py, opaque.py, or a new file: every module of this
package but the machinery is a family), next to everything else about it: its decompositions, its
VJP rule, its kernel forms, its ATen overloads and the reason for each part it lacks (registry.py
says what a block holds).  Everything below is derived from the blocks, as are the tables of
decompositions/math_ops.py (decompositions), autodiff (VJP rules, what is recomputed), the kernel
languages (forms) and dynamo/aten.py (ATen overloads); coverage.py prints what each prim has and each
registered kernel language covers (`python -m fjit.executors`).

Elementwise prims have torch's broadcasting and type promotion, so a torch-level elementwise op is
exactly one prim.  This package is the IR's vocabulary: it imports nothing from the tracing
frontend, the decompositions, autodiff or the executors; the frontend registers how `apply` records.
"""
from __future__ import annotations

import importlib
import pkgutil
import types

import torch

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, TensorVar
from fjit.core.prims.registry import (LANGUAGES, Block, Cost, Domain, Form, KernelLanguage,  # noqa: F401
                                      Kind, Prim, apply, register_language, set_recorder,
                                      torch_callables)

# The machinery of this package; every other module is a family, and importing it defines its
# prims (in name order, so a new family file is all a new prim needs).
_MACHINERY = frozenset({"registry", "toolkit", "coverage"})
FAMILIES = tuple(importlib.import_module(f"{__name__}.{m.name}")
                 for m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name)
                 if m.name not in _MACHINERY)

# Every prim's block, keyed by prim (its row fields are what the rest of fjit reads most).
ROWS: dict[Prim, Block] = {p: p.block for p in Prim}


def of_kind(*kinds: Kind) -> frozenset:
    return frozenset(p for p, b in ROWS.items() if b.kind in kinds)


UNARY = of_kind(Kind.UNARY)
BINARY = of_kind(Kind.BINARY)
REDUCTIONS = of_kind(Kind.REDUCTION)
BOOL_RESULT = frozenset(p for p, b in ROWS.items() if b.bool_result)

PRIMS: dict[Prim, Symbol] = {p: b.symbol for p, b in ROWS.items()}
PRIM_OF_QUALNAME: dict[str, Prim] = {s.qualname: p for p, s in PRIMS.items()}

# What printed traces call `prims.<name>` with.
NAMESPACE = types.SimpleNamespace(**{p.value: s.fn for p, s in PRIMS.items()})


def aten_overloads() -> dict:
    """"<op>.<overload>" -> the prim whose block names it, for the torch.compile backend."""
    return {name: p for p, b in ROWS.items() for name in b.aten}
def _inplace_name(name: str) -> str | None:
    """The in-place method of torch-level op `name` (x.exp_ for exp, x += for __add__), if any."""
    candidate = f"__i{name[2:]}" if name.startswith("__") else f"{name}_"
    return candidate if hasattr(torch.Tensor, candidate) else None


# Pointwise torch-level ops that are not one prim but have an in-place twin of the same signature.
_COMPOSITE_POINTWISE = ("round", "relu", "clamp", "clip", "clamp_min", "clamp_max", "square", "frac",
                        "masked_fill", "index_put", "scatter", "scatter_add", "index_add",
                        "index_fill", "lerp", "addcmul", "addcdiv")
_POINTWISE_NAMES = [n for r in ROWS.values() if r.kind in (Kind.UNARY, Kind.BINARY)
                    for n in r.torch_names] + list(_COMPOSITE_POINTWISE)
_INPLACE_NAMES = {n: i for n in _POINTWISE_NAMES if (i := _inplace_name(n)) is not None}

# The in-place method of each pointwise torch callable (torch.add and Tensor.add -> Tensor.add_),
# and the out-of-place method of each in-place one (Tensor.add_ and Tensor.__iadd__ -> the op).
INPLACE_TWIN: dict = {f: getattr(torch.Tensor, i) for n, i in _INPLACE_NAMES.items()
                      for f in torch_callables(n)}
OUT_OF_PLACE: dict = {getattr(torch.Tensor, i): getattr(torch.Tensor, n)
                      for n, i in _INPLACE_NAMES.items() if hasattr(torch.Tensor, n)}

# Pointwise torch callables whose operands commute exactly (IEEE + and * do).
COMMUTATIVE: frozenset = frozenset(f for p in (Prim.ADD, Prim.MUL) for n in ROWS[p].torch_names
                                   for f in torch_callables(n))

# Torch-level ops whose result may share memory with their first operand in eager torch: their
# symbols carry Tag.VIEW, as the prims that alias do.
_VIEW_NAMES = ("reshape", "view", "view_as", "reshape_as", "permute", "transpose", "swapaxes",
               "swapdims", "t", "expand", "expand_as", "squeeze", "unsqueeze", "__getitem__",
               "narrow", "select", "split", "chunk", "unbind", "flatten", "unflatten", "detach",
               "alias", "as_strided", "diagonal", "contiguous", "movedim", "to", "type_as", "float",
               "half", "bfloat16", "double", "int", "long", "bool", "view_as_real", "real", "imag",
               "broadcast_to", "unfold", "dropout", "conj", "adjoint", "_neg_view", "view_as_complex")
VIEW_OPS: frozenset = frozenset(f for n in _VIEW_NAMES for f in torch_callables(n)) | frozenset(
    {torch.nn.functional.dropout, torch.Tensor.T.__get__, torch.Tensor.mT.__get__,
     torch.Tensor.H.__get__, torch.Tensor.mH.__get__, torch.Tensor.real.__get__,
     torch.Tensor.imag.__get__})


def prim_of(b: BoundSymbol) -> Prim | None:
    """The prim `b` applies, or None for a torch-level op."""
    return PRIM_OF_QUALNAME.get(b.sym.qualname)


def computation_dtype(b: BoundSymbol) -> torch.dtype:
    """The dtype torch computes the elementwise prim `b` in, before the result is rounded to its
    output dtype: a comparison's operands' promotion, isnan's or logical_not's operand's dtype, or
    else the output's.  (Kernel generators then compute half types in float32.)"""
    if prim_of(b) in BOOL_RESULT:
        if len(b.args) == 1:
            return b.args[0].dtype
        return torch.result_type(*(torch.empty((), dtype=a.dtype) if isinstance(a, TensorVar) else
                                   1.0 if isinstance(a, NumberVar) else a for a in b.args))
    return b.outputs()[0].dtype
