"""The trace IR's values and instructions: variables, symbols, bound symbols, and the walks over
nested values.  A program of them is a `Trace` (core/trace.py)."""
from __future__ import annotations

import dataclasses
import enum
import math
import weakref
from typing import Any, Callable

import torch


class Tag(enum.Enum):
    """Properties of a symbol.  Behaviour is looked up by tag in tables, not by subclass."""

    PRIM = "prim"                # one of the closed set in fjit.core.prims
    ELEMENTWISE = "elementwise"  # prim applied per element (torch broadcasting and promotion)
    REDUCTION = "reduction"      # prim reducing over dims
    SHAPE = "shape"              # prim that only moves or views data
    RANDOM = "random"            # draws new numbers on every call: never CSE'd or folded
    FALLBACK = "fallback"        # torch op fjit has no decomposition for; metadata from meta tensors
    VIEW = "view"                # output aliases its first input in eager torch
    NUMBER = "number"            # Python arithmetic on runtime numbers
    IMPURE = "impure"            # must stay even when its outputs are unused
    MODE = "mode"                # sets grad mode or autocast for what follows: a barrier for
                                 # CSE and fusion, never moved or removed
    HOOK = "hook"                # registers an autograd hook on a value at run time: the
                                 # backward is torch autograd's, which runs it
    KERNEL = "kernel"            # a generated kernel, printed by name and importable by that name
                                 # from fjit.runtime while a program runs it
    CUSTOM_VJP = "custom_vjp"    # an autograd.Function whose forward was traced into its prims:
                                 # its backward is the Function's own (CUSTOM_VJPS)


# Tag.CUSTOM_VJP symbols' backwards, by symbol (frontend/library_calls.py records them, the joint
# program calls them): backward(value, cotangents) -> [(forward input Var, cotangent proxy)], where
# value(var) is a forward value's proxy in the backward being recorded and cotangents are one proxy
# (or None) per output of the op.
CUSTOM_VJPS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


# ----------------------------------------------------------------------------------------------
# Variables
# ----------------------------------------------------------------------------------------------

class TensorVar:
    """An SSA tensor value: metadata only, never data.

    `conj_bit` and `neg_bit` are torch's lazy conjugate and negative bits (`is_conj()`,
    `is_neg()`): a view such as `z.conj()`, `z.H` or `z.conj().imag` holds its base's data and
    reads it conjugated or negated, so what reads raw memory (a kernel, a reinterpretation of
    another view) would read a different value."""

    __slots__ = ("name", "shape", "dtype", "device", "strides", "requires_grad", "conj_bit", "neg_bit")

    def __init__(self, name, shape, dtype, device, strides, requires_grad=False, conj_bit=False,
                 neg_bit=False):
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self.device = device
        self.strides = tuple(strides)
        self.requires_grad = requires_grad
        self.conj_bit = conj_bit
        self.neg_bit = neg_bit

    def replaced(self, **changes) -> "TensorVar":
        """This value's metadata with `changes` (another name, strides, requires_grad)."""
        return TensorVar(**{**{k: getattr(self, k) for k in TensorVar.__slots__}, **changes})

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def type_string(self, size_text: Callable = str) -> str:
        """'cpu f32[2, s0, 16]': `size_text` prints a size (a symbolic trace's printer passes its
        own, which names the symbols as the program binds them)."""
        dt = DTYPE_SHORT.get(self.dtype, str(self.dtype).replace("torch.", ""))
        dims = ", ".join(size_text(s) for s in self.shape)
        bits = " conj" * self.conj_bit + " neg" * self.neg_bit
        return f"{self.device.type} {dt}[{dims}]{bits}"

    def __repr__(self):
        return self.name


class NumberVar:
    """An SSA Python number that is a runtime value (float inputs and arithmetic on them)."""

    __slots__ = ("name", "pytype")

    def __init__(self, name, pytype=float):
        self.name = name
        self.pytype = pytype

    def type_string(self, size_text: Callable = str) -> str:
        return self.pytype.__name__

    def __repr__(self):
        return self.name


class GeneratorVar:
    """An SSA torch.Generator the program creates itself (a generator made inside the traced
    function): random ops that take it draw from it in program order."""

    __slots__ = ("name", "device")

    def __init__(self, name, device):
        self.name = name
        self.device = device

    def type_string(self, size_text: Callable = str) -> str:
        return f"generator {self.device.type}"

    def __repr__(self):
        return self.name


Var = (TensorVar, NumberVar, GeneratorVar)

DTYPE_SHORT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


# ----------------------------------------------------------------------------------------------
# Symbols and bound symbols
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, eq=False)
class Symbol:
    """An operation: how it prints (`qualname`), how it runs eagerly (`fn`), and its tags."""

    qualname: str            # e.g. "torch.add", "prims.exp", "fjit_ops.view_scatter"
    fn: Callable             # the callable the printed name resolves to at run time
    tags: frozenset = frozenset()

    def has(self, tag: Tag) -> bool:
        return tag in self.tags

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    def __repr__(self):
        return self.qualname


@dataclasses.dataclass(frozen=True, eq=False)
class BoundSymbol:
    """One operation in a trace: outputs = sym(*args, **kwargs); `subsymbols` are its prims."""

    sym: Symbol
    args: tuple
    kwargs: dict
    output: Any                       # a Var, or a tuple/list of Vars, or None
    subsymbols: tuple = ()
    comment: str | None = None        # e.g. "functionalized x.add_(1)"

    def outputs(self) -> list:
        return [v for v in flatten_values(self.output) if isinstance(v, Var)]

    def inputs(self) -> list:
        return [v for v in flatten_values((self.args, self.kwargs)) if isinstance(v, Var)]

    def replace(self, **changes) -> "BoundSymbol":
        return dataclasses.replace(self, **changes)


def flatten_values(x) -> list:
    """Leaves of nested tuples/lists/dicts/slices (the containers args are made of)."""
    out = []
    _flatten_into(x, out)
    return out


def _flatten_into(x, out):
    if isinstance(x, (tuple, list)):
        for y in x:
            _flatten_into(y, out)
    elif isinstance(x, dict):
        for y in x.values():
            _flatten_into(y, out)
    elif isinstance(x, slice):
        _flatten_into((x.start, x.stop, x.step), out)
    else:
        out.append(x)


def is_structseq(x) -> bool:
    """torch.return_types.* (what max(dim), sort, topk return): tuples built from one tuple."""
    return isinstance(x, tuple) and hasattr(type(x), "n_sequence_fields")


def map_values(fn, x):
    """Rebuild nested args with every leaf replaced by fn(leaf)."""
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(map_values(fn, y) for y in x))
    if is_structseq(x):
        return type(x)(tuple(map_values(fn, y) for y in x))
    if isinstance(x, (tuple, list)):   # subclasses (fjit's read-only input lists) become plain
        return (tuple if isinstance(x, tuple) else list)(map_values(fn, y) for y in x)
    if isinstance(x, dict):
        return {k: map_values(fn, v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(map_values(fn, x.start), map_values(fn, x.stop), map_values(fn, x.step))
    return fn(x)


# ----------------------------------------------------------------------------------------------
# Traces
# ----------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Binding:
    """A global or closure variable read at trace time and bound as a constant."""

    name: str
    kind: str          # "global" | "closure" | "default"
    type_name: str

    def __str__(self):
        return f"{self.kind} {self.name!r}: {self.type_name}"


DEL = Symbol("del", None, frozenset({Tag.IMPURE}))
