"""The loop nests of a C kernel's elementwise regions (ElementLoops, a collaborator of codegen's
CEmitter through emission.py's interface): a flat loop or rows of the merged domain, a transposing
loop cut into tiles, and rows whose columns run piece by piece through concatenations along the last
dim.  Each item of the outer loop is one unit of the work an OpenMP loop shares among threads."""
from __future__ import annotations

import itertools
import math

from fjit.core.ir import BoundSymbol, TensorVar
from fjit.core.prims import Prim, prim_of
from fjit.executors import render
from fjit.executors.c.emission import Emission, Emitter, indent
from fjit.executors.c.language import C_TYPE, storage
from fjit.executors.render import coalesce, held
from fjit.executors.runtime_sizes import Size, preferred

# Elements of a flat loop are handed out in blocks of BLOCK (reductions: accumulators.py).
BLOCK = 1 << 13
# A transposing elementwise loop (tiled_body) is cut into tiles of up to TILE x TILE elements, where
# it has at least TILED_MIN of them and both dims have at least TILED_MIN_SIZE.  Short dims matter:
# a residual gradient of ResNet's stage 3, [8, 1024, 4, 4] NCHW plus one in NHWC, read the NHWC one
# 16 loads 4 KiB apart a row, all in one cache set: 520 us untiled, 46 us tiled.
TILE = 32
TILED_MIN = 1 << 12
TILED_MIN_SIZE = 4


class ElementLoops:
    """The loop nests of an elementwise region, each body returning (lines, number of items).  The
    element code comes from the emitter (`code`, the calls of emission.Emitter); the offsets, tile
    buffers and the inputs only concatenations read go in `state`, which the element code reads;
    the element code asks `piece_value` for a concatenation's value in the run being written."""

    def __init__(self, code: Emitter, state: Emission):
        self.code, self.state = code, state
        self.piece = 0           # with concatenations: the first column of the run being written
        self.row_terms: dict = {}   # ... tensor name -> (its row's offset, its stride along a row)

    def flat_body(self, names: dict) -> tuple[list[str], int]:
        """An elementwise region: items (rows of the merged domain, or blocks of a flat loop), each
        a loop over consecutive elements."""
        r = self.state.region
        tensors = [v for v in r.inputs if isinstance(v, TensorVar)] + list(r.outputs)
        sizes, strides = coalesce(r.domain, tensors, r.outputs[0])
        width, rows = sizes[-1], math.prod(sizes[:-1])
        across = _transposed_dim(sizes, [strides[v.name] for v in tensors])
        if across is not None:
            return self.tiled_body(names, tensors, sizes, strides, across)
        lines: list[str] = []
        if rows == 1:
            items = -(-width // BLOCK)
            # (a kernel of runtime sizes takes blocks at any width: one source either side of BLOCK)
            head = [f"int64_t lo = it * {BLOCK}, hi = lo + {BLOCK} < {width} ? lo + {BLOCK} : {width};"] \
                if isinstance(width, Size) or items > 1 else [f"int64_t lo = 0, hi = {width};"]
            bases = {}
        else:
            items = rows
            head = [f"int64_t lo = 0, hi = {width};"] + self.code.index_lines("o", tuple(sizes[:-1]), "it")
            bases = {v.name: _row_base(k, strides[v.name], head) for k, v in enumerate(tensors)}
        for v in tensors:
            self.state.flat[v.name] = _at(bases.get(v.name), strides[v.name][-1])

        lines = [f"for (int64_t it = 0; it < {items}; it++) {{"] + \
            [indent(x) for x in head + self.code.guarded_twice(lambda: self.element_loop(names))] + ["}"]
        return lines, items

    def element_loop(self, names: dict) -> list[str]:
        """The loop over a row's columns lo..hi, each an element."""
        inner, _ = self.code.element_code(0, names, None)
        return ["for (int64_t c = lo; c < hi; c++) {"] + [indent(x) for x in inner] + ["}"]

    def tiled_body(self, names: dict, tensors: list, sizes: tuple, strides: dict,
                   across: int) -> tuple[list[str], int]:
        """An elementwise region where some tensor walks dim `across` (not the last) in memory
        order, where the output walks the last: a transpose.  A strided load in the element loop
        keeps gcc from vectorizing it (erf, exp: 10x slower), and reads a cache line per element.
        Instead the two dims are cut into TILE x TILE tiles, one per item; each input strided
        along the last dim is first copied into a tile buffer walking its own memory order, and
        the element loop reads the buffer, contiguous like the other operands."""
        width, n = sizes[-1], len(sizes)
        others = [j for j in range(n - 1) if j != across]
        tiles_across, tiles_width = -(-sizes[across] // TILE), -(-width // TILE)
        item_sizes = tuple(sizes[j] for j in others) + (tiles_across, tiles_width)
        head = self.code.index_lines("q", item_sizes, "it")
        head += [f"int64_t o{j} = q{i};" for i, j in enumerate(others)]
        q_across, q_width = f"q{len(others)}", f"q{len(others) + 1}"
        head += [f"int64_t first = {q_across} * {TILE}, "
                 f"last = first + {TILE} < {sizes[across]} ? first + {TILE} : {sizes[across]};",
                 f"int64_t lo = {q_width} * {TILE}, hi = lo + {TILE} < {width} ? lo + {TILE} : {width};"]
        row: list[str] = []
        bases = {v.name: _row_base(k, strides[v.name], row) for k, v in enumerate(tensors)}
        for v in tensors:
            self.state.flat[v.name] = _at(bases.get(v.name), strides[v.name][-1])
        for k, v in enumerate(self.state.region.inputs):
            st = strides.get(v.name) if isinstance(v, TensorVar) else None
            if st is None or st[-1] in (0, 1) or v.name in self.state.staged:
                continue
            buffer, copy = f"tile{k}", []
            offset = _at(_row_base(k, st, copy), st[-1])
            head += [f"{storage(v.dtype)} {buffer}[{TILE}][{TILE}];",   # raw elements
                     "for (int64_t c = lo; c < hi; c++) {",
                     indent(f"for (int64_t o{across} = first; o{across} < last; o{across}++) {{")] + \
                [indent(indent(x)) for x in copy] + \
                [indent(indent(f"{buffer}[o{across} - first][c - lo] = {self.code.element(v, k, offset)};")),
                 indent("}"), "}"]
            self.state.staged[v.name] = f"{buffer}[o{across} - first][c - lo]"

        loop = [f"for (int64_t o{across} = first; o{across} < last; o{across}++) {{"] + \
            [indent(x) for x in row + self.code.guarded_twice(lambda: self.element_loop(names))] + ["}"]
        items = math.prod(item_sizes)
        return [f"for (int64_t it = 0; it < {items}; it++) {{"] + [indent(x) for x in head + loop] + ["}"], items

    def piece_body(self, names: dict) -> tuple[list[str], int]:
        """An elementwise region with concatenations along its last dim: a loop over rows, and along
        a row one loop per run of columns in which each concatenation reads one piece (so no loop
        branches, and each vectorizes)."""
        r = self.state.region
        dom = r.domain
        cuts = {0, dom[-1]}
        for b in r.bsyms:
            if prim_of(b) is Prim.CAT:
                cuts.update(itertools.accumulate(t.shape[-1] for t in b.args[0]))
        cuts = sorted(cuts)
        reads = lambda bs: {v.name for b in bs for v in b.inputs()}   # noqa: E731
        pieces = [b for b in r.bsyms if prim_of(b) is Prim.CAT or b.outputs()[0].name in r.private]
        self.state.side = reads(pieces) - reads(b for b in r.bsyms if b not in pieces)
        head = self.code.index_lines("o", dom[:-1], "it")
        for k, v in enumerate([v for v in r.inputs if isinstance(v, TensorVar)] + list(r.outputs)):
            strides = render.domain_strides(v, dom)
            self.row_terms[v.name] = (_row_base(k, strides, head), strides[-1])
            self.state.flat[v.name] = self.piece_offset(v, 0)

        def emit():
            lines = []
            for self.piece, end in zip(cuts, cuts[1:]):
                inner, _ = self.code.element_code(0, names, None)
                lines += [f"for (int64_t c = {self.piece}; c < {end}; c++) {{"] + \
                    [indent(x) for x in inner] + ["}"]
            return lines
        rows = math.prod(dom[:-1])
        return [f"for (int64_t it = 0; it < {rows}; it++) {{"] + \
            [indent(x) for x in head + self.code.guarded_twice(emit)] + ["}"], rows

    def piece_offset(self, v: TensorVar, start: int) -> str:
        """v's element offset at column c of a row, v read as a piece that starts at `start`."""
        return _at(*self.row_terms[v.name], start)

    def piece_value(self, b: BoundSymbol, local: dict, lines: list) -> None:
        """The concatenation `b` at the current run of columns: its piece there, computed by the
        prims only that piece reads, from inputs loaded at the piece's own index."""
        r, start = self.state.region, 0
        for v in b.args[0]:
            if self.piece < start + v.shape[-1]:
                break
            start += v.shape[-1]
        chain, wanted = [], {v.name}
        for p in reversed(r.bsyms):
            if p.outputs()[0].name in wanted and p.outputs()[0].name in r.private:
                chain.insert(0, p)
                wanted |= {u.name for u in p.inputs()}
        made = {p.outputs()[0].name for p in chain}
        env = dict(local)
        slots = {u.name: k for k, u in enumerate(r.inputs)}
        for u in dict.fromkeys(u for p in chain for u in p.inputs()) if chain else [v]:
            if isinstance(u, TensorVar) and u.name not in made:
                env[u.name] = (self.code.fresh(), held(u.dtype))
                lines.append(f"{C_TYPE[held(u.dtype)]} {env[u.name][0]} = "
                             f"{self.code.load(u, slots[u.name], self.piece_offset(u, start))};")
        for p in chain:
            self.code.compute(p, env, lines)
        self.code.bind(b.outputs()[0], *env[v.name], local, lines)


def _transposed_dim(sizes: tuple, strides: list) -> int | None:
    """The dim (not the last) along which some tensor of an elementwise loop nest is contiguous
    while it is not along the last dim, where that tiles the loop (tiled_body); else None."""
    # (whether to tile decides only speed: symbolic sizes take it at the program's compiling call)
    if len(sizes) < 2 or preferred(sizes[-1]) < TILED_MIN_SIZE or preferred(math.prod(sizes)) < TILED_MIN:
        return None
    for st in strides:
        if st[-1] not in (0, 1):
            for j in range(len(sizes) - 1):
                if st[j] == 1 and preferred(sizes[j]) >= TILED_MIN_SIZE:
                    return j
    return None


def _row_base(k: int, strides: tuple, head: list) -> str | None:
    """The name of tensor k's offset at the row indices o<j> (`strides` along the row dims, then
    along the row), its definition added to `head`; None where it is 0."""
    terms = [f"o{j} * {st}" if st != 1 else f"o{j}" for j, st in enumerate(strides[:-1]) if st]
    if not terms:
        return None
    head.append(f"int64_t b{k} = {' + '.join(terms)};")
    return f"b{k}"


def _at(base: str | None, step: int, start: int = 0) -> str:
    """The offset at column c of a row: the row's `base` plus c (less `start`) times `step`."""
    column = "c" if not start else f"(c - {start})"
    column = "" if not step else column if step == 1 else f"{column} * {step}"
    return " + ".join(t for t in (base, column) if t) or "0"
