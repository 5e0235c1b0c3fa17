"""Trace -> Trace passes: dead code elimination, common subexpression elimination, constant
folding and the removal of view prims that change nothing (the cleanup), then, for the final
program, running elementwise ops in place on buffers nothing reads later and freeing each
intermediate after its last use.  Each pass stamps its name on the trace it returns."""
from __future__ import annotations

import collections

import torch

from fjit import config
from fjit.core.prims import COMMUTATIVE, INPLACE_TWIN, Prim, prim_of
from fjit.core.ir import DEL, BoundSymbol, NumberVar, Symbol, Tag, TensorVar, Var, flatten_values, map_values
from fjit.core.symbolic import is_symbolic, same
from fjit.core.trace import Trace
from fjit.runtime import register_kernel


# view prims that are the identity when their output has their input's shape and strides
_VIEWS = frozenset({Prim.PERMUTE, Prim.RESHAPE, Prim.SLICE, Prim.EXPAND, Prim.CONTIGUOUS})


def _output_vars(trace: Trace) -> set[str]:
    return {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}


def dce(trace: Trace) -> Trace:
    """Drops ops whose results nothing reads, except random ops: eager's draw moves the generator,
    so dropping it would change the numbers every later random op draws."""
    live = _output_vars(trace)
    kept = []
    for b in reversed(trace.bsyms):
        if b.sym.has(Tag.IMPURE) or b.sym.has(Tag.RANDOM) or any(v.name in live for v in b.outputs()):
            kept.append(b)
            live.update(v.name for v in b.inputs())
    return trace.with_stage("dce", reversed(kept))


def _rename(mapping: dict, b: BoundSymbol) -> BoundSymbol:
    if not mapping:
        return b
    sub = lambda x: mapping.get(x.name, x) if isinstance(x, Var) else x  # noqa: E731
    args, kwargs = map_values(sub, (b.args, b.kwargs))
    return b.replace(args=args, kwargs=kwargs,
                     subsymbols=tuple(_rename(mapping, s) for s in b.subsymbols))


def simplify_views(trace: Trace) -> Trace:
    """Drop view prims that change nothing (a permute by the identity, a reshape to the same shape, a
    full slice, contiguous of a contiguous value: the output has its input's shape and strides)
    and compose chains of permutes (a permute of a permute is one permute of the first's input,
    with the same strides; two that undo each other are nothing); a sum over the leading dims of
    a reshape that only merged them sums the reshape's input.  The backward writes many: a
    linear layer's weight is permuted in the forward and permuted back for its gradient."""
    mapping: dict = {}
    permuted: dict = {}      # name -> (the input of its chain of permutes, the composed order)
    reshaped: dict = {}      # name -> the input of the reshape that made it
    out = []
    for b in trace.bsyms:
        b = _rename(mapping, b)
        p = prim_of(b)
        if p is None or b.subsymbols or not b.args or not isinstance(b.args[0], TensorVar) \
                or not isinstance(b.output, TensorVar):
            out.append(b)
            continue
        if p is Prim.SUM and b.args[0].name in reshaped:
            b = _sum_before_reshape(b, reshaped[b.args[0].name])
        x, y = b.args[0], b.output
        if p is Prim.RESHAPE:
            reshaped[y.name] = x
        if p is Prim.PERMUTE and x.name in permuted:
            root, first = permuted[x.name]
            order = tuple(first[i] for i in b.args[1])
            b = b.replace(args=(root, order))
            x = root
        if p in _VIEWS and x.dtype == y.dtype and same((x.shape, x.strides), (y.shape, y.strides)):
            mapping[y.name] = x
            continue
        if p is Prim.PERMUTE:
            permuted[y.name] = (b.args[0], tuple(b.args[1]))
        out.append(b)
    output = map_values(lambda v: mapping.get(v.name, v) if isinstance(v, Var) else v, trace.output)
    return trace.with_stage("simplify_views", out, output=output)


def _sum_before_reshape(b: BoundSymbol, v: TensorVar) -> BoundSymbol:
    """sum(reshape(v), leading dims) as a sum of v over its leading dims, where the reshape only
    merges or splits the dims summed and keeps the others (GPT-2's Conv1D bias gradient is a sum
    over dim 0 of the 2-d view of a 3-d cotangent): the sum then reads a value a kernel computes,
    and fuses into it as a column sum.  Else b unchanged."""
    x, dims, keepdim = b.args[:3]
    lead = len(dims)
    kept = tuple(x.shape[lead:])
    if keepdim or b.kwargs or tuple(dims) != tuple(range(lead)) or not kept or \
            tuple(v.shape[v.ndim - len(kept):]) != kept or v.ndim <= len(kept):
        return b
    return b.replace(args=(v, tuple(range(v.ndim - len(kept))), False, *b.args[3:]))


def _hashable(x):
    if isinstance(x, Var):
        return ("var", x.name)
    if isinstance(x, (list, tuple)):
        return (type(x).__name__,) + tuple(_hashable(y) for y in x)
    if isinstance(x, dict):
        return ("dict",) + tuple((k, _hashable(v)) for k, v in x.items())
    if isinstance(x, slice):
        return ("slice", _hashable(x.start), _hashable(x.stop), _hashable(x.step))
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        # by its expression: hashing a SymBool or SymFloat takes its value, a guard that would
        # pin the sizes (a returned `x.shape[1] > 6` specialized the program to s1 <= 6)
        return (type(x).__name__, str(x.node.expr))
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return (type(x).__name__, x)


def cse(trace: Trace) -> Trace:
    seen: dict = {}
    mapping: dict = {}
    out = []
    for b in trace.bsyms:
        b = _rename(mapping, b)
        if b.sym.has(Tag.MODE):   # x * 2 under no_grad is not x * 2 with grad
            seen.clear()
        if b.sym.has(Tag.RANDOM) or b.sym.has(Tag.IMPURE):
            out.append(b)
            continue
        key = (b.sym.qualname, id(b.sym.fn), _hashable(b.args), _hashable(b.kwargs))
        first = seen.get(key)
        if first is None:
            seen[key] = b
            out.append(b)
        else:
            for mine, theirs in zip(b.outputs(), first.outputs()):
                mapping[mine.name] = theirs
    output = map_values(lambda x: mapping.get(x.name, x) if isinstance(x, Var) else x, trace.output)
    return trace.with_stage("cse", out, output=output)


def constant_fold(trace: Trace) -> Trace:
    """Evaluate, once at compile time, ops that read only compile-time constants (a causal mask
    built with torch.ones(n, n).tril(), say).  Random ops are never folded, nor any value an output
    could alias, since every call must return fresh tensors.

    In a symbolic program, an op that reads only constants and sizes (a causal mask of the
    length, the positions arange(s1)) is not one constant but one per set of sizes: those ops
    become one call of a PerSizeValues, which computes them once per set of the symbols' values."""
    aliasable = _output_vars(trace)
    for b in reversed(trace.bsyms):
        if b.sym.has(Tag.VIEW) and any(v.name in aliasable for v in b.outputs()):
            aliasable.update(v.name for v in b.inputs())
    consts = dict(trace.consts)
    captured = set(trace.consts)      # tensors captured in permissive mode stay references
    folded: set[str] = set()
    per_size: list[BoundSymbol] = []    # ops of constants and sizes alone (symbolic programs)
    sized: set[str] = set()             # what they make
    kept = []
    for b in trace.bsyms:
        # an op whose prims read less than it does (x.new_zeros(n) reads no element of x) folds
        # when its prims read only constants: they are evaluated instead of the op
        steps = b.subsymbols if b.subsymbols and not all(v.name in folded for v in b.inputs()) else (b,)
        made = {v.name for s in steps[:-1] for v in s.outputs()}
        ins, outs = [v for s in steps for v in s.inputs() if v.name not in made], b.outputs()
        pure = bool(outs) and not any(s.sym.has(Tag.RANDOM) or s.sym.has(Tag.IMPURE) or s.sym.has(Tag.NUMBER)
                                      for s in (b, *steps)) \
            and not any(v.name in aliasable for v in outs) \
            and all(isinstance(v, TensorVar) for v in outs)
        foldable = (pure and all(v.name in folded for v in ins) and not any(v.name in captured for v in ins)
                    # a value made from sizes that are symbols is not one constant
                    and not any(is_symbolic(x) for s in steps for x in flatten_values((s.args, s.kwargs)))
                    and all(not is_symbolic(v.shape) and v.numel() <= 1 << 20 for v in outs)
                    and {v.name for v in outs} <= {v.name for s in steps for v in s.outputs()})
        if not foldable and trace.sizes is not None and pure \
                and all(v.name in folded or v.name in sized for v in b.inputs()) \
                and not any(v.name in captured for v in b.inputs()):
            per_size.append(b)
            sized.update(v.name for v in outs)
            continue
        if not foldable:
            kept.append(b)
            continue
        for s in steps:
            args, kwargs = map_values(lambda x: consts[x.name] if isinstance(x, Var) else x, (s.args, s.kwargs))
            with torch.no_grad():
                value = s.sym.fn(*args, **kwargs)
            for var, val in zip(flatten_values(s.output), flatten_values(value)):
                if isinstance(var, Var):
                    consts[var.name] = val
                    folded.add(var.name)
    if per_size:
        kept = [_per_size_call(trace, per_size, consts, kept), *kept]
    return trace.with_stage("constant_fold", kept, consts=consts)


def _per_size_call(trace: Trace, bsyms: list[BoundSymbol], consts: dict, rest: list[BoundSymbol]) -> BoundSymbol:
    """One call computing, from the symbols' values, the values of `bsyms` (ops of constants and
    sizes alone) that the rest of the program reads."""
    made = {v.name: v for b in bsyms for v in b.outputs()}
    read = {v.name for b in rest for v in b.inputs()}
    outputs = [v for name, v in made.items() if name in read]
    symbols = trace.sizes.symbols_of((bsyms, outputs))
    values = PerSizeValues(trace, bsyms, outputs, symbols,
                           {v.name: consts[v.name] for b in bsyms for v in b.inputs() if v.name in consts})
    name = f"fjit_per_size_{id(values):x}"
    register_kernel(name, values)
    shown = "; ".join(f"{', '.join(v.name for v in b.outputs())} = {b.sym.name}(...)" for b in bsyms)
    return BoundSymbol(Symbol(name, values, frozenset()), tuple(symbols), {}, tuple(outputs),
                       comment=f"computed once per set of sizes: {shown}")


class PerSizeValues:
    """Values of a symbolic program that depend only on its sizes and constants (a causal mask of
    the length): computed, at a call with new values of the symbols, by a program of their ops
    that takes the symbols as numbers, and kept for the next calls with the same values (as many
    sets as a function keeps programs, FJIT_CACHE_SIZE).  The values are shared between calls as
    constants are: nothing writes into them (reuse_buffers writes only into values of the ops it
    sees make them)."""

    def __init__(self, trace: Trace, bsyms: list[BoundSymbol], outputs: list, symbols: list, consts: dict):
        inputs = [NumberVar(trace.sizes.text(s), int) for s in symbols]
        program = Trace("per_size_values", inputs, list(bsyms), tuple(outputs), dict(consts),
                        stage="values of sizes alone", namespace=trace.namespace, sizes=trace.sizes,
                        autocast_off=trace.autocast_off)
        self.compute = program.python_callable()
        self.kept: collections.OrderedDict = collections.OrderedDict()

    def __call__(self, *values):
        got = self.kept.get(values)
        if got is None:
            with torch.no_grad():
                got = tuple(self.compute(*values))
            while len(self.kept) >= config.cache_size():
                self.kept.popitem(last=False)
            self.kept[values] = got
        return got


def _last_reads(trace: Trace) -> dict[str, int]:
    """Name -> index of the last op that reads it."""
    last: dict[str, int] = {}
    for i, b in enumerate(trace.bsyms):
        for v in b.inputs():
            last[v.name] = i
    return last


def free_dead_values(trace: Trace) -> Trace:
    """Insert `del` after each intermediate's last use so its memory returns to the allocator."""
    keep = _output_vars(trace) | set(trace.consts)
    last_use = _last_reads(trace)
    for i, b in enumerate(trace.bsyms):
        for v in b.outputs():
            last_use.setdefault(v.name, i)     # never read: dead right after it is made
    dead_after: dict[int, list] = {}
    by_name = {v.name: v for b in trace.bsyms for v in b.inputs() + b.outputs()}
    for name, i in last_use.items():
        if name not in keep:
            dead_after.setdefault(i, []).append(by_name[name])
    out = []
    for i, b in enumerate(trace.bsyms):
        out.append(b)
        if i in dead_after:
            out.append(BoundSymbol(DEL, tuple(sorted(dead_after[i], key=lambda v: v.name)), {}, None))
    return trace.with_stage("free_dead_values", out)


def _made_of(b: BoundSymbol, *tags: Tag) -> bool:
    """Whether `b` is an op (not a view) whose prims all carry one of `tags`.  Elementwise and
    reduction prims (softmax, layer_norm, sum) make new tensors, so its results alias nothing."""
    return bool(b.subsymbols) and not b.sym.has(Tag.VIEW) and all(
        any(s.sym.has(t) for t in tags) for s in b.subsymbols)


def autograd_may_record(trace: Trace) -> bool:
    """Whether autograd records some op of the trace: an op's result requires grad.  The trace's
    values carry the grad mode it was traced under (which a program is cached by), so under
    no_grad nothing it computes requires grad even where a parameter it reads does."""
    return any(isinstance(v, TensorVar) and v.requires_grad for b in trace.bsyms for v in b.outputs())


def reuse_buffers(trace: Trace) -> Trace:
    """Run an elementwise op in place on its first operand when that operand is an intermediate
    this trace allocated, nothing else aliases it, and this op is its last use: on small tensors
    the allocation is a good part of an op's cost.  Skipped when autograd may be recording (it
    saves operands for backward) and for anything an output, an input or a constant could alias."""
    if autograd_may_record(trace):
        return trace.with_stage("reuse_buffers")
    last_use = _last_reads(trace)
    keep = _output_vars(trace) | set(trace.consts)
    fresh: set[str] = set()      # allocated by an elementwise or reduction op of this trace
    shared: set[str] = set()     # passed to an op whose result may alias it
    for b in trace.bsyms:
        if _made_of(b, Tag.ELEMENTWISE, Tag.REDUCTION):
            fresh.update(v.name for v in b.outputs())
        else:
            shared.update(v.name for v in b.inputs())

    def reusable(v, i: int, result) -> bool:
        return (isinstance(v, TensorVar) and v.name in fresh and v.name not in shared
                and v.name not in keep and last_use.get(v.name) == i
                and (result.dtype, result.device) == (v.dtype, v.device)
                and same((result.shape, result.strides), (v.shape, v.strides)))

    out = []
    for i, b in enumerate(trace.bsyms):
        twin = INPLACE_TWIN.get(b.sym.fn)
        result = b.output
        if (twin is not None and _made_of(b, Tag.ELEMENTWISE) and not b.sym.has(Tag.RANDOM)
                and isinstance(result, TensorVar) and b.args):
            args = b.args
            if (not reusable(args[0], i, result) and b.sym.fn in COMMUTATIVE and not b.kwargs
                    and len(args) == 2 and reusable(args[1], i, result)):
                args = (args[1], args[0])      # x + t -> t += x: IEEE + and * commute exactly
            if reusable(args[0], i, result):
                sym = Symbol(f"torch.Tensor.{twin.__name__}", twin, b.sym.tags)
                b = b.replace(sym=sym, args=args)
        out.append(b)
    return trace.with_stage("reuse_buffers", out)
