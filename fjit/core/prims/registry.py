"""How a prim is declared: the `Prim` registry, the kinds and math domains, the `Block` that holds
everything about one prim, `define` (which creates the prim and its block together), and `apply`,
which records a prim through the active tracing context.

A block holds the prim's row (kind, domain, bool result, the torch callables that are exactly it,
its reflected method, alias behaviour, torch lowering), its decompositions from torch-level ops,
its VJP rule (or `nondiff`), its kernel forms, its ATen overloads for the torch.compile backend,
and `notes`: for each part it lacks, why.

Kernel forms are data keyed by part name (`kernels`): a `Form` is an expression template with
its facts (what it costs an element, its measured error, the range outside which it is inexact).
A kernel language (`KernelLanguage`, registered by its executor) names the parts it reads and
says which blocks it covers; core knows no language by name.  The part "expr" is the infix form
that several languages write alike (`({0} + {1})`); the others are each language's own spellings.
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


class Cost(enum.Enum):
    """What a kernel form costs per element, as the executors and autodiff weigh it."""
    ARITHMETIC = "arithmetic"   # a few instructions (a hardware sqrt or floor among them): vectorizes
    VECTOR = "vector"           # an inline vector-math function: vectorizes, tens of instructions
    LIBM = "libm"               # a scalar library call (~10 ns an element): its loop does not vectorize


@dataclasses.dataclass(frozen=True)
class Form:
    """One kernel form of a prim: `expr`, a template over the operands ({0}, {1}, ...; a
    language may define more fields, as C's {f} float suffix), and its facts."""
    expr: str
    cost: Cost | None = None       # None: not stated (arithmetic; a language may require it stated)
    ulp: int | None = None         # measured maximum error against torch, in ulps (None: torch's own)
    guard: str | None = None       # a template true where the form is inexact; the generator then
    #                                computes those elements again with the part's exact form


class KernelLanguage:
    """A kernel language as coverage and the blocks see it: its `name`, the block parts it reads
    (`parts`, in the order it prefers them) and which blocks it can compute.  An executor
    registers its language (`register_language`); subclasses say more where the language needs
    (Triton: interpreted and compiled spellings; C: a library call's cost stated)."""
    name: str = ""
    parts: tuple = ()
    reductions: frozenset = frozenset()    # reduction prims its generator loops over itself

    def forms(self, block: "Block") -> dict:
        """part -> Form, for the parts of this language the block has."""
        return {part: block.kernels[part] for part in self.parts if part in block.kernels}

    def describe(self, block: "Block") -> str | None:
        """What it has for the prim, in a few words (None: nothing)."""
        if block.prim in self.reductions:
            return "reduction loop"
        return ", ".join(self.forms(block)) or None

    def covers(self, block: "Block") -> bool:
        """Whether its kernels can compute the prim (by default: it loops the reduction, or the
        block has one of its parts)."""
        return block.prim in self.reductions or bool(self.forms(block))

    def problems(self, block: "Block") -> list[str]:
        """What is wrong with the block's forms for this language (each a short text)."""
        return []


LANGUAGES: dict[str, KernelLanguage] = {}


def register_language(language: KernelLanguage) -> KernelLanguage:
    """Make `language` known to coverage (one registration, by its executor's package)."""
    LANGUAGES[language.name] = language
    return language


def known_parts() -> frozenset:
    """Every block part a registered language reads."""
    return frozenset(part for lang in LANGUAGES.values() for part in lang.parts)


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
    kernels: dict = dataclasses.field(default_factory=dict)   # part -> Form (languages read them)
    recompute: bool = False        # the backward may compute it again though not pointwise (a copy)
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


_FIELDS = frozenset(f.name for f in dataclasses.fields(Block))


def define(name: str, kind: Kind, domain: Domain = Domain.ANY, *, value: str | None = None,
           names: tuple | None = None, **parts) -> Prim:
    """Declare prim `Prim.<name>` (its value is `value`, by default the name in lower case) and its
    block.  Unary and binary prims are by default exactly torch.<value>/Tensor.<value> (`names`
    overrides).  A keyword that is not a Block field is a kernel form, keyed by its part name (a
    string is a Form of unstated cost): `expr=` the infix form several languages share, `c=`,
    `triton=`, ... each language's own (coverage flags a part no registered language reads)."""
    p = Prim(name, value or name.lower())
    if names is None:
        names = (p.value,) if kind in (Kind.UNARY, Kind.BINARY) else ()
    kernels = {part: form if isinstance(form, Form) else Form(form)
               for part, form in parts.items() if part not in _FIELDS and form is not None}
    fields = {k: v for k, v in parts.items() if k in _FIELDS}
    block = Block(p, kind, domain, torch_names=names, kernels=kernels, **fields)
    fn = block.lowering or getattr(torch, p.value, None)
    if fn is None:
        raise ValueError(f"prim {name}: torch.{p.value} does not exist; give lowering= (how torch runs it)")
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
