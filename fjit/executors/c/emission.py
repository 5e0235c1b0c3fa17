"""What the parts of a C kernel's emitter share: the interface between the emitter (codegen.CEmitter)
and the loop writers it delegates to (accumulators.RowLoops, elementwise.ElementLoops).

The emitter writes the code of one element and the kernel around the loops; a loop writer writes a
region's loop nest and asks the emitter for each element's code.  They share two things, both
passed to a loop writer's constructor: Emission, the state of one region's emission (what the loops
have decided that an element's code reads: each value's pass, offsets, buffers), and Emitter, the
calls a loop writer makes on the emitter.  Neither reads the other's attributes beyond these.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Protocol

import torch

from fjit.core.ir import BoundSymbol, TensorVar
from fjit.executors.render import Language
from fjit.passes.fusion import Region


def indent(line: str) -> str:
    """A line of a loop's body, one level in (a pragma stays at the line's start)."""
    return line if line.startswith("#") else "    " + line


@dataclasses.dataclass
class Emission:
    """One region's emission state: the emitter sets `level` before the loops are written, the
    loop writers set the rest as they choose a walk, and the element code reads all of it."""

    region: Region
    rows: set = dataclasses.field(init=False)   # the names of the region's per-row values
    level: dict = dataclasses.field(default_factory=dict)   # value name -> first pass it is available in
    flat: dict = dataclasses.field(default_factory=dict)    # elementwise loops: tensor name -> its offset
    side: set = dataclasses.field(default_factory=set)      # concatenations: the inputs only their pieces
    #                                                          read (loaded at the piece's index, not up front)
    staged: dict = dataclasses.field(default_factory=dict)  # tiled or blocked loops: input name -> its
    #                                                          element in a stack buffer
    staged_out: dict = dataclasses.field(default_factory=dict)   # rows in blocks: output name -> its
    #                                                               element in the block buffer
    scratch: dict = dataclasses.field(default_factory=dict)  # reductions: value name -> its row buffer,
    #                                                           for later passes

    def __post_init__(self):
        self.rows = set(self.region.row_vars)


class Emitter(Protocol):
    """The calls a loop writer makes on the C emitter (codegen.CEmitter).  Values are
    `name -> (expression, dtype it is held in)`, as render.RegionEmitter keeps them."""

    lang: Language

    def fresh(self) -> str:
        """A new variable name."""

    def bind(self, v: TensorVar, expr: str, dt: torch.dtype, values: dict, lines: list) -> None:
        """`v` = `expr` (held in `dt`) as a new variable in `values`, its definition in `lines`."""

    def compute(self, b: BoundSymbol, values: dict, lines: list) -> None:
        """The elementwise prim `b`'s statements, added to `lines`, and its value."""

    def index_lines(self, names: str, sizes: tuple, flat: str) -> list[str]:
        """The definitions of indices `{names}0, ...` over `sizes` from the flat index `flat`."""

    def offset(self, v: TensorVar, rows_only: bool = False) -> str:
        """The element offset of `v` (broadcast to the domain) at the current loop indices."""

    def element(self, v: TensorVar, k: int, offset: str) -> str:
        """Input k's stored element at `offset`."""

    def load(self, v: TensorVar, k: int, offset: str | None = None) -> str:
        """Input k's element (at `offset`, or where the loops put it) in the type it is computed in."""

    def store(self, v: TensorVar, values: dict) -> str:
        """The value of output `v` as it is stored."""

    def row_bsyms(self) -> list:
        """The region's prims but its column sums."""

    def element_code(self, upto: int, names: dict, store_level: int | None,
                     lines: list | None = None, indexed: bool = True) -> tuple[list, dict]:
        """One iteration over an element: its lines and its values."""

    def guarded_twice(self, emit: Callable[[], list[str]]) -> list[str]:
        """`emit()`'s lines, done again with the C library where a vector form's argument is out
        of its range."""
