"""How a C kernel's reductions loop and accumulate.

A region with reductions is a loop over rows and one loop over the row per reduction level
(RowLoops, a collaborator of the C emitter: the emitter writes each element's code, through
emission.py's interface).  A row reduction (a reduction over a region's inner dims) keeps LANES
partial accumulators per row (WIDE_LANES in a wide row), in the dtype below (float sums and
products in double, a float32 sum first in float lanes: see codegen.py); `accumulator` declares
one, `accumulate` adds a value into it.

A column sum (a sum over a region's outer dims: a bias's or a norm weight's gradient, summed over
the batch and sequence dims of the value the region computes anyway) cuts the rows into CHUNKS
fixed ranges (one when the kernel is not threaded); each range adds its rows' values into a
double accumulator per column of its own, and after the loop over the ranges the accumulators are
added in range order and rounded once.  A region with no row reduction and at least as many
blocks of COLUMN_BLOCK columns as it would have ranges walks the column blocks instead: each block
adds every row, in order, into double accumulators on its stack.  Either way the order depends
only on the shapes, so a result never depends on the thread count.
"""
from __future__ import annotations

import math

import torch

from fjit.core.ir import BoundSymbol, TensorVar
from fjit.core.prims import Prim, prim_of
from fjit.executors.c.emission import Emission, Emitter, indent
from fjit.executors.c.language import C_TYPE, PARTS, calls_libm, storage, vector_form
from fjit.executors.render import domain_strides, held, index_terms
from fjit.executors.runtime_sizes import preferred, symbolic_size

# Row ranges of a threaded kernel with column sums (the work a thread pool shares).
CHUNKS = 16
# Columns a block of a column-blocked kernel sums (see the module docstring).  Few long rows are
# that form's case: TinyViT's attention-bias gradient sums 8 rows of 192,080 scores, and as 8
# ranges of one row each it zeroed, filled and added 12 MB of double accumulators a call (the
# kernel was ~10% of perf's samples of the model's training step).
COLUMN_BLOCK = 1024
# Reductions keep LANES partial accumulators per row, WIDE_LANES in a row of at least
# 4 * WIDE_LANES elements: one vector of accumulators is a chain of dependent max or add
# instructions, one per vector of the row, waiting on each other's latency (a 64x1024 softmax's
# max and sum passes took 28 of its 37 us in one float32 vector of lanes, 25 us in all in two).
LANES = 16
WIDE_LANES = 32


def row_lanes(width: int) -> int:
    """The partial accumulators of a row reduction over `width` elements (a choice of speed: a
    symbolic row length takes it at the program's compiling call, runtime_sizes.preferred)."""
    return WIDE_LANES if preferred(width) >= 4 * WIDE_LANES else LANES


# A float32 sum adds blocks of SUM_BLOCK elements in float lanes (64 roundings a lane at most),
# folded into double lanes: |error| <= 64 * 2^-24 * sum|x| at any row length, at float32 vector width
# (tests/executors/test_c_executor.py measures it, and torch's cascade sum, against float64).
SUM_BLOCK = 1024
# Bytes of a row's costly values (exp, tanh, libm calls) a reduction region keeps in per-thread
# stack buffers for its later passes, instead of computing them again (softmax's exp).
SCRATCH_BYTES = 1 << 16
# Rows walked with a stride (RowLoops.row_blocks) go in blocks of at most ROW_BLOCK rows, each
# strided tensor's block at most STAGED_ELEMENTS elements in a stack buffer.
ROW_BLOCK = 32
STAGED_ELEMENTS = 1 << 13
# The last inner dim a pass's loop nests inside the others at (see RowLoops.pass_loop).
NESTED_MIN = 8
REDUCE = PARTS.reductions


class ColumnSums:
    """The column sums of one region: their accumulators, the wrap of the row loop, the stores."""

    def __init__(self, region, threaded: bool):
        self.sums = [b for b in region.bsyms if b.outputs()[0].name in region.columns]
        self.names = {b.outputs()[0].name for b in self.sums}
        self.width = math.prod(region.inner)
        self.rows = math.prod(region.outer)
        # a symbolic row count takes CHUNKS ranges whatever the rows (those past the rows empty):
        # the order of additions is then fixed by the rows alone, so the threads can be decided
        # per call (CEmitter.runtime_threads) and one kernel serves every row count
        self.chunks = CHUNKS if symbolic_size(self.rows) else min(self.rows, CHUNKS) if threaded else 1
        # a block is whole runs of the last inner dim where one fits (see RowLoops.pass_loop):
        # its accumulators live on a thread's stack
        last = region.inner[-1] if region.inner else 1
        self.block = (COLUMN_BLOCK // last) * last if 0 < last <= COLUMN_BLOCK else COLUMN_BLOCK
        self.blocks = -(-self.width // self.block)
        self.blocked = bool(self.sums) and not region.row_vars and self.blocks >= self.chunks
        self.items = self.blocks if self.blocked else self.chunks    # the loop a thread pool shares

    def span(self) -> tuple[str, str]:
        """The columns a pass over a row walks: the block's, or the whole row."""
        return ("lo", "hi") if self.blocked else ("0", str(self.width))

    def whole_runs(self, size: int) -> bool:
        """Whether the span is whole runs of `size` columns."""
        return not self.blocked or self.block % size == 0

    def accumulate(self, upto: int, level: dict, values: dict) -> list[str]:
        """In a pass over a row's elements: the values summed that this pass computes, added."""
        column = "c - lo" if self.blocked else "c"
        return [f"fj_col{j}[{column}] += {values[b.args[0].name][0]};" for j, b in enumerate(self.sums)
                if level[b.args[0].name] == upto]

    def wrap(self, row_lines: list[str], outputs: list) -> tuple[list[str], list[str], list[str]]:
        """(the lines before the loop, the loop with `row_lines` per row, the lines after it)."""
        rows = ["        " + x if not x.startswith("#") else x for x in row_lines]
        if self.blocked:
            return [], self.blocked_loop(rows, outputs), []
        w, n, per = self.width, self.chunks, -(-self.rows // self.chunks)
        before = [f"double *fj_all{j} = (double *)calloc({n * w}, sizeof(double));"
                  for j in range(len(self.sums))]
        loop = [f"for (int64_t ch = 0; ch < {n}; ch++) {{"]
        loop += [f"    double *fj_col{j} = fj_all{j} + ch * {w};" for j in range(len(self.sums))]
        loop += [f"    for (int64_t r = ch * {per}; r < (ch + 1) * {per} && r < {self.rows}; r++) {{"]
        loop += rows + ["    }", "}"]
        return before, loop, self.stores(outputs)

    def blocked_loop(self, rows: list[str], outputs: list) -> list[str]:
        """The loop over column blocks: each block's accumulators, its rows, its stores."""
        w, block = self.width, self.block
        loop = [f"for (int64_t cb = 0; cb < {self.blocks}; cb++) {{",
                f"    int64_t lo = cb * {block}, hi = lo + {block} < {w} ? lo + {block} : {w};"]
        for j in range(len(self.sums)):
            loop += [f"    double fj_col{j}[{block}];", f"    for (int64_t c = 0; c < {block}; c++) fj_col{j}[c] = 0;"]
        loop += [f"    for (int64_t r = 0; r < {self.rows}; r++) {{"] + rows + ["    }"]
        loop += [f"    for (int64_t c = lo; c < hi; c++) {store}fj_col{j}[c - lo];"
                 for j, store in self.stored(outputs) if store]
        return loop + ["}"]

    def stored(self, outputs: list) -> list[tuple[int, str | None]]:
        """Each column sum's accumulator index and the start of its store, `outK[c] = (type)`
        (None for a sum the kernel does not output)."""
        position = {v.name: k for k, v in enumerate(outputs)}
        return [(j, f"out{position[o.name]}[c] = ({C_TYPE[o.dtype]})" if o.name in position else None)
                for j, o in enumerate(b.outputs()[0] for b in self.sums)]

    def stores(self, outputs: list) -> list[str]:
        """After the loop over row ranges: each column's accumulators added in range order,
        rounded, stored."""
        lines = []
        for j, store in self.stored(outputs):
            lines += [f"for (int64_t c = 0; c < {self.width}; c++) {{",
                      "    double s = 0;",
                      f"    for (int64_t ch = 0; ch < {self.chunks}; ch++) s += fj_all{j}[ch * {self.width} + c];"]
            if store:
                lines.append(f"    {store}s;")
            lines += ["}", f"free(fj_all{j});"]
        return lines


def costly(b: BoundSymbol) -> bool:
    """Whether `b` costs a vector-math or libm call per element."""
    return calls_libm(b) or bool(vector_form(b))


def float_lanes(b: BoundSymbol) -> bool:
    """A sum of float32 values (float16/bfloat16 ones are held as float32): float lanes."""
    return prim_of(b) is Prim.SUM and held(b.args[0].dtype) == torch.float32


def accumulator(b: BoundSymbol, lang) -> tuple[str, str]:
    """(the C type, the identity literal) of the row reduction `b`'s accumulators."""
    p, o = prim_of(b), b.outputs()[0]
    # float sums and products accumulate in double, narrow rows too: a row of one SUM_BLOCK
    # summed in float lanes and a float tree took a layer norm backward 4% less time, and moved
    # MobileNetV3-Small's squeeze-excite means enough to cross a hard-sigmoid kink that float64
    # does not (the zoo's accuracy rule failed at seed 0)
    if p in (Prim.SUM, Prim.PROD):
        ctype = "double" if o.dtype.is_floating_point else "int64_t"
    else:
        ctype = C_TYPE[held(o.dtype)]
    return ctype, lang.identity_literal(p, o.dtype)


def accumulate(b: BoundSymbol, acc: str, value: str) -> str:
    p = prim_of(b)
    if p is Prim.SUM:
        return f"{acc} += {value};"
    if p is Prim.PROD:
        return f"{acc} *= {value};"
    return f"{acc} = {'FJ_MAX' if p is Prim.AMAX else 'FJ_MIN'}({acc}, {value});"


class RowLoops:
    """The loops of a region with reductions: a loop over rows (or blocks of rows walked with a
    stride), in each row one pass over the row per reduction level.  The element code comes from
    the emitter (`code`, the calls of emission.Emitter); the passes and buffers chosen go in
    `state`, which the element code reads; `columns` adds the region's column sums."""

    def __init__(self, code: Emitter, state: Emission, columns: ColumnSums):
        self.code, self.state, self.columns = code, state, columns

    def reduction_body(self, passes: int, names: dict) -> tuple[list[str], int]:
        rows = math.prod(self.state.region.outer)
        across, tensors = self.strided_rows()
        if across is not None:
            return self.row_blocks(passes, names, across, tensors)
        row_lines = self.row_loop(passes, names)
        return [f"for (int64_t r = 0; r < {rows}; r++) {{"] + [indent(x) for x in row_lines] + ["}"], rows

    def strided_rows(self) -> tuple[int | None, list]:
        """(the row dim, the (slot, tensor) pairs) where a tensor of the whole domain is contiguous
        along a row dim, so its row is a strided walk (a mean over H and W of channels-last data,
        a layer norm over channels of an NCHW value viewed as NHWC); (None, []) where none is."""
        r = self.state.region
        width = math.prod(r.inner)
        if width < 8 or r.columns:
            return None, []
        slots = [(k, v) for k, v in enumerate(r.inputs) if isinstance(v, TensorVar)] + \
            [(-1 - k, v) for k, v in enumerate(r.outputs) if v.name not in self.state.rows]
        for j, size in enumerate(r.outer):
            if size < 4:
                continue
            chosen = []
            for k, v in slots:
                st = domain_strides(v, r.domain)
                if st[j] == 1 and all(st[len(r.outer):]):
                    chosen.append((k, v))
            if chosen:
                return j, chosen
        return None, []

    def row_blocks(self, passes: int, names: dict, across: int, tensors: list) -> tuple[list[str], int]:
        """The rows in blocks of consecutive indices along row dim `across`, one block per item:
        each strided tensor's block is copied into (inputs) or out of (outputs) a stack buffer
        of [block][row] in its own memory order, and each row, computed as row_loop computes it,
        reads and writes the buffer contiguously (gcc vectorizes it: a strided load or store in
        the row loop kept vector math scalar, 5 ns an element)."""
        r = self.state.region
        width = math.prod(r.inner)
        block = max(1, min(ROW_BLOCK, STAGED_ELEMENTS // width))
        others = [j for j in range(len(r.outer)) if j != across]
        sizes = tuple(r.outer[j] for j in others) + (-(-r.outer[across] // block),)
        o = f"o{across}"
        head = self.code.index_lines("q", sizes, "it") + [f"int64_t o{j} = q{i};" for i, j in enumerate(others)]
        head.append(f"int64_t first = q{len(others)} * {block}, last = first + {block} < {r.outer[across]}"
                    f" ? first + {block} : {r.outer[across]};")
        rows_index = " + ".join(f"o{j} * {math.prod(r.outer[j + 1:])}" for j in range(len(r.outer)))
        self.choose_scratch(passes)
        copies_in, copies_out = [], []
        for k, v in tensors:
            buffer = f"fj_in{k}" if k >= 0 else f"fj_out{-1 - k}"
            head.append(f"{storage(v.dtype)} {buffer}[{block}][{width}];")
            walk = [f"for (int64_t c = 0; c < {width}; c++) {{"] + \
                [indent(x) for x in self.code.index_lines("i", r.inner, "c")] + \
                [indent(f"for (int64_t {o} = first; {o} < last; {o}++) {{"),
                 indent(indent(f"int64_t r = {rows_index};"))]
            if k >= 0:
                copies_in += walk + [indent(indent(f"{buffer}[{o} - first][c] = "
                                                   f"{self.code.element(v, k, self.code.offset(v))};")),
                                     indent("}"), "}"]
                self.state.staged[v.name] = f"{buffer}[{o} - first][c]"
            else:
                copies_out += walk + [indent(indent(f"out{-1 - k}[{self.code.offset(v)}] = {buffer}[{o} - first][c];")),
                                      indent("}"), "}"]
                self.state.staged_out[v.name] = f"{buffer}[{o} - first][c]"
        rows = [f"for (int64_t {o} = first; {o} < last; {o}++) {{", indent(f"int64_t r = {rows_index};")] + \
            [indent(x) for x in self.code.guarded_twice(lambda: self.row_code(passes, names))] + ["}"]
        items = math.prod(sizes)
        body = head + copies_in + rows + copies_out
        return [f"for (int64_t it = 0; it < {items}; it++) {{"] + [indent(x) for x in body] + ["}"], items

    def row_loop(self, passes: int, names: dict) -> list[str]:
        """The work of row `r`."""
        self.choose_scratch(passes)
        return self.code.index_lines("o", self.state.region.outer, "r") + \
            self.code.guarded_twice(lambda: self.row_code(passes, names))

    def choose_scratch(self, passes: int) -> None:
        """Costly elementwise values (a vector-math or libm call) that the pass of their level
        computes for its reduction and a later pass over the row reads again: each gets a row
        buffer, while they fit in SCRATCH_BYTES.  One no reduction of its pass reads is left to
        the pass that reads it (a log-softmax backward's exp, computed again from the input: kept
        in the first pass, which sums only the cotangent, its store kept gcc from vectorizing it)."""
        r = self.state.region
        width, budget = math.prod(r.inner), SCRATCH_BYTES
        level = self.state.level
        reduced = set()           # values a pass computes for a reduction of that pass
        for b in reversed(r.bsyms):
            o = b.outputs()[0]
            if prim_of(b) in REDUCE or o.name in reduced:
                reduced.update(v.name for v in b.inputs() if v.name in level
                               and (prim_of(b) in REDUCE or level[v.name] == level[o.name]))
        for b in r.bsyms:
            o = b.outputs()[0]
            if prim_of(b) in REDUCE or o.name in self.state.rows or not costly(b) or o.name not in reduced:
                continue
            lvl = self.state.level[o.name]
            later = any(o.name in {v.name for v in b2.inputs()} and self.state.level[b2.outputs()[0].name] > lvl
                        and b2.outputs()[0].name not in self.state.rows and prim_of(b2) not in REDUCE
                        for b2 in r.bsyms)
            size = width * torch.empty((), dtype=held(o.dtype)).element_size()
            if later and lvl < passes and size <= budget:
                budget -= size
                self.state.scratch[o.name] = f"fj_s{len(self.state.scratch)}"

    def pass_loop(self, p: int, names: dict) -> list[str]:
        """A pass over the row's columns that reduces nothing.  Over several inner dims it nests a
        loop over the last one, whose index is the loop's own: the other indices are worked out
        once per run of it, where per element their divisions kept gcc from vectorizing the loop
        and each broadcast operand's load was a gather (TinyViT's attention-bias gradient)."""
        lo, hi = self.columns.span()
        inner = self.state.region.inner
        if len(inner) < 2 or inner[-1] < NESTED_MIN or not self.columns.whole_runs(inner[-1]):
            loop, _ = self.code.element_code(p, names, p)
            return [f"for (int64_t c = {lo}; c < {hi}; c++) {{"] + [indent(x) for x in loop] + ["}"]
        last, size = len(inner) - 1, inner[-1]
        loop, _ = self.code.element_code(p, names, p, [f"int64_t c = cq * {size} + i{last};"], indexed=False)
        return [f"for (int64_t cq = {lo} / {size}; cq < {hi} / {size}; cq++) {{"] + \
            [indent(x) for x in self.code.index_lines("i", inner[:-1], "cq")] + \
            [indent(f"for (int64_t i{last} = 0; i{last} < {size}; i{last}++) {{")] + \
            [indent(indent(x)) for x in loop] + [indent("}"), "}"]

    def row_code(self, passes: int, names: dict) -> list[str]:
        r = self.state.region
        width = math.prod(r.inner)
        row_lines: list[str] = [f"{C_TYPE[held(v.dtype)]} {buffer}[{width}];"
                                for v in (b.outputs()[0] for b in r.bsyms)
                                for buffer in [self.state.scratch.get(v.name)] if buffer]
        row_names = dict(names)
        # inputs constant along the row (of the row's own shape: a norm's saved statistics) are
        # loaded once a row, for row values and element loops alike: loaded per element, gcc's
        # partial redundancy elimination hoisted them into the loop's latch, and the loop stayed
        # scalar (a layer norm backward's last pass: 3.5x the time)
        n_outer = len(r.outer)
        for k, v in enumerate(r.inputs):
            if isinstance(v, TensorVar) and v.name not in self.state.side and v.name not in self.state.staged and \
                    not any(domain_strides(v, r.domain)[n_outer:]):
                # (its offset from the row indices alone: the whole domain's flat offset reads c)
                offset = " + ".join(index_terms(r, v.shape, v.strides)) or "0"
                var = f"xr{k}"
                row_lines.append(f"{C_TYPE[held(v.dtype)]} {var} = {self.code.load(v, k, offset)};")
                row_names[v.name] = (var, held(v.dtype))
        for p in range(passes + 1):
            # row values of level p: reductions finished by pass p - 1, then elementwise on rows
            for b in r.bsyms:
                o = b.outputs()[0]
                if o.name in self.state.rows and self.state.level[o.name] == p and prim_of(b) not in REDUCE:
                    self.code.compute(b, row_names, row_lines)
            if p == passes:
                break
            reductions = [b for b in self.code.row_bsyms() if prim_of(b) in REDUCE and
                          self.state.level[b.outputs()[0].name] == p + 1]
            if not reductions:
                row_lines += self.pass_loop(p, row_names)
                continue
            accs, lanes = [], row_lanes(width)
            for b in reductions:
                acc = self.code.fresh()
                ctype, identity = accumulator(b, self.code.lang)
                row_lines += [f"{ctype} {acc}[{lanes}];",
                              f"for (int l = 0; l < {lanes}; l++) {acc}[l] = {identity};"]
                accs.append((b, acc))
            # `lanes` partial accumulators, lane = c % lanes: blocks of lanes, then the tail (a
            # float32 sum's in float lanes per SUM_BLOCK elements, folded into double lanes)
            blocked = {acc for b, acc in accs if float_lanes(b)}
            row_lines += ["{", "    int64_t c0 = 0;"]
            if blocked:
                row_lines += [f"    while (c0 + {lanes} <= {width}) {{",
                              f"    int64_t cb = c0 + {SUM_BLOCK} < {width} ? c0 + {SUM_BLOCK} : {width};"]
                for acc in sorted(blocked):
                    row_lines += [f"    float {acc}_b[{lanes}];",
                                  f"    for (int l = 0; l < {lanes}; l++) {acc}_b[l] = 0;"]
            end = "cb" if blocked else width
            # (the lane loop must not be unrolled before the vectorizer sees it: unrolled, its
            # NaN-propagating max/min stay scalar)
            for head, tail in (([f"for (; c0 + {lanes} <= {end}; c0 += {lanes}) {{",
                                 "#pragma GCC unroll 1",
                                 f"for (int64_t l = 0; l < {lanes}; l++) {{"], ["}", "}"]),
                               ([f"for (int64_t l = 0; c0 + l < {width}; l++) {{"], ["}"])):
                loop, local = self.code.element_code(p, row_names, p, ["int64_t c = c0 + l;"])
                for b, acc in accs:
                    lane = f"{acc}_b[l]" if acc in blocked and tail == ["}", "}"] else f"{acc}[l]"
                    loop.append(accumulate(b, lane, local[b.args[0].name][0]))
                row_lines += [indent(x) for x in head]
                row_lines += ["        " + x for x in loop]
                row_lines += ["    " + x for x in tail]
                if blocked and tail == ["}", "}"]:
                    row_lines += [f"    for (int l = 0; l < {lanes}; l++) {acc}[l] += {acc}_b[l];"
                                  for acc in sorted(blocked)] + ["    }"]
            row_lines.append("}")
            for b, acc in accs:
                o = b.outputs()[0]
                # one loop per level of the pairwise tree, each of a constant length, so each
                # is a vector op (a loop over the levels stayed scalar: ~10% of a narrow softmax)
                row_lines += [f"for (int l = 0; l < {w}; l++) " + accumulate(b, f"{acc}[l]", f"{acc}[l + {w}]")
                              for w in (lanes >> k for k in range(1, lanes.bit_length())) if w]
                self.code.bind(o, f"({C_TYPE[held(o.dtype)]}){acc}[0]", o.dtype, row_names, row_lines)
        for k, v in enumerate(r.outputs):
            if v.name in self.state.rows:
                row_lines.append(f"out{k}[{self.code.offset(v, rows_only=True)}] = "
                                 f"{self.code.store(v, row_names)};")
        return row_lines
