"""How a prim is declared: the `Prim` registry, the kinds and math domains, the `Block` that holds
everything about one prim, `define` (which creates the prim and its block together), and `apply`,
which records a prim through the active tracing context.

A block holds the prim's row (kind, domain, bool result, the torch callables that are exactly it,
its reflected method, alias behaviour, torch lowering), its decompositions from torch-level ops,
its VJP rule (or `nondiff`), its kernel expressions (C, C's float32 vector form, Triton's common,
interpreted, compiled and compiled-float32 forms), its ATen overloads for the torch.compile
backend, and `notes`: for each part it lacks, why.  Expression strings are data: the generators
read them, so core names no kernel language's machinery.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Callable

import torch

from fjit.core.ir import Symbol, Tag


class _Registry(type):
    """Iterating `Prim` gives its members in definition order, as an enum's would."""

    def __iter__(cls):
        return iter(cls._members.values())

    def __len__(cls):
        return len(cls._members)


class Prim(metaclass=_Registry):
    """One prim: `Prim.EXP`, with `.name` ("EXP") and `.value` ("exp"); made only by `define`."""
    _members: dict = {}
    __slots__ = ("name", "value", "block")

    def __init__(self, name: str, value: str):
        if hasattr(Prim, name) or any(p.value == value for p in Prim):
            raise ValueError(f"prim {name} ({value}) is defined twice")
        self.name, self.value = name, value
        Prim._members[name] = self
        setattr(Prim, name, self)

    def __repr__(self):
        return f"<Prim.{self.name}: {self.value!r}>"

    def __reduce__(self):
        return getattr, (Prim, self.name)


class Kind(enum.Enum):
    UNARY = "unary"            # elementwise, one operand
    BINARY = "binary"          # elementwise, two operands (a tensor and a tensor or a number)
    WHERE = "where"            # elementwise select
    CAST = "cast"              # elementwise dtype conversion
    REDUCTION = "reduction"    # over dims, keepdim or not
    SHAPE = "shape"            # a view: moves no data
    DATA = "data"              # moves data into a new tensor (cat, gather, ...)
    FACTORY = "factory"        # makes a tensor from numbers
    RANDOM = "random"          # a factory that draws from a generator
    OPAQUE = "opaque"          # computed by torch only (matmul, attention)


ELEMENTWISE_KINDS = (Kind.UNARY, Kind.BINARY, Kind.WHERE, Kind.CAST)


class Domain(enum.Enum):
    """The computation dtypes the prim's math is defined on (the kernel expression's domain)."""
    ANY = "any"
    FLOAT = "float"       # transcendental and rounding math
    INT = "int"           # bitwise math (bool included)


@dataclasses.dataclass(eq=False)
class Block:
    prim: Prim
    kind: Kind
    domain: Domain = Domain.ANY
    bool_result: bool = False      # bool whatever the operands (computed in their promotion)
    torch_names: tuple = ()        # torch.<n> / Tensor.<n> that are exactly this prim
    also: tuple = ()               # further torch callables that are exactly this prim
    decompositions: tuple = ()     # ((torch callables, decomposition), ...) with their own rule
    reflected: str | None = None   # the Tensor method that runs it with a Python number first
    aliases: bool = False          # its result may share memory with its first operand
    lowering: Callable | None = None   # how torch runs it (None: torch.<prim value>)
    vjp: Callable | None = None    # rule(b, g, value) -> [(forward var, cotangent), ...]
    nondiff: bool = False          # no cotangent flows through it
    c: str | None = None           # C expression ({0}, {1}: operands; {f}: float suffix)
    c_vector: str | None = None    # C's vectorizable float32 form (executors/c/vecmath.py)
    triton: str | None = None      # Triton expression, interpreted and compiled ({t}: dtype)
    triton_interpreted: str | None = None   # under TRITON_INTERPRET=1 only
    triton_compiled: str | None = None      # compiled for a GPU only
    triton_f32: str | None = None  # compiled, float32 computation
    aten: tuple = ()               # "<op>.<overload>" the backend maps to torch.<op>
    notes: dict = dataclasses.field(default_factory=dict)   # part -> why it is missing
    symbol: Symbol | None = None

    @property
    def tags(self) -> frozenset:
        tags = {Tag.PRIM}
        if self.kind in ELEMENTWISE_KINDS:
            tags.add(Tag.ELEMENTWISE)
        if self.kind is Kind.REDUCTION:
            tags.add(Tag.REDUCTION)
        if self.kind is Kind.SHAPE:
            tags.add(Tag.SHAPE)
        if self.kind is Kind.RANDOM:
            tags.add(Tag.RANDOM)
        if self.aliases:
            tags.add(Tag.VIEW)
        return frozenset(tags)


def _binary_lowering(block: Block, fn: Callable) -> Callable:
    """Runs a binary prim with a Python number first through its reflected method."""
    reflected = getattr(torch.Tensor, block.reflected) if block.reflected else None

    def lower(a, b):
        if isinstance(a, torch.Tensor) or reflected is None:
            return fn(a, b)
        return reflected(b, a)
    lower.__name__ = block.prim.value
    return lower


def define(name: str, kind: Kind, domain: Domain = Domain.ANY, *, value: str | None = None,
           names: tuple | None = None, expr: str | None = None, **parts) -> Prim:
    """Declare prim `Prim.<name>` (its value is `value`, by default the name in lower case) and its
    block.  Unary and binary prims are by default exactly torch.<value>/Tensor.<value> (`names`
    overrides); `expr` is an expression C and Triton both write alike."""
    p = Prim(name, value or name.lower())
    if names is None:
        names = (p.value,) if kind in (Kind.UNARY, Kind.BINARY) else ()
    if expr is not None:
        parts.setdefault("c", expr)
        parts.setdefault("triton", expr)
    block = Block(p, kind, domain, torch_names=names, **parts)
    fn = block.lowering or getattr(torch, p.value)
    if kind is Kind.BINARY:
        fn = _binary_lowering(block, fn)
    block.symbol = Symbol(f"prims.{p.value}", fn, block.tags)
    p.block = block
    return p


def torch_callables(name: str) -> list:
    """torch.<name> and Tensor.<name>, where they exist (dunders only as methods)."""
    in_torch = None if name.startswith("__") else getattr(torch, name, None)
    return [f for f in (in_torch, getattr(torch.Tensor, name, None)) if callable(f)]


# -- recording ---------------------------------------------------------------------------------------

_recorder: list = []


def set_recorder(record: Callable) -> None:
    """The tracing frontend registers how a prim is recorded: record(symbol, args, kwargs)."""
    _recorder[:] = [record]


def apply(p: Prim, *args, **kwargs):
    """Record prim `p` applied to proxies in the active trace (what decompositions and VJP rules
    are written in), as JAX's `bind` finds the current trace."""
    if not _recorder:
        raise RuntimeError("no tracing frontend is loaded to record prims (import fjit)")
    return _recorder[0](p.block.symbol, args, kwargs)
