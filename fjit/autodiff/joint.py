"""The joint forward/backward program: a reverse walk over the forward trace, split in two.

Each top-level op of the (cleaned) forward trace is one of
- plain: none of its outputs requires grad; it runs as traced and gets no backward;
- prims: it is differentiated through its prims' VJP rules (rules.py), and its backward is traced
  as prims the kernel executors fuse, like the forward;
- aten: a convolution, a training batch norm, a 2-D pool or a flash attention; it runs as traced
  (or as a kernel also returning what its backward reads), and its backward is the ATen function
  eager's autograd node calls (convolution_backward on its saved operands, ...: aten_backward.py);
- custom: an autograd.Function whose forward the frontend traced into its prims (Tag.CUSTOM_VJP):
  its forward is those prims, and its backward is the Function's own backward, recorded on the
  backward's proxies (CUSTOM_VJPS), whose ops fuse like the rules';
- recorded: torch autograd keeps it (an opaque op, a prim without a rule, or an op whose prims no
  executor would fuse, where torch's own backward kernel is the fast one): the forward runs it under
  enable_grad on detached leaves (`record`) and saves that small graph; the backward calls
  torch.autograd.grad on it (`torch_vjp`).

The backward is recorded by running the rules on proxies in a trace context of its own, so every
value's metadata comes from torch's meta kernels, as in a traced forward; the context and the
proxies are the frontend's, handed in as a Recorder.  A rule asks for the forward values it reads
(`_Backward.value`).  The backward is recorded twice: first with every value it reads saved, which
names them; then remat.py's minimum cut over the forward's values chooses the saved ones (an extra
output of the forward trace, an input of the backward trace) of fewest bytes from which the others
are recomputed in the backward by cheap ops (recompute.py: views, pointwise prims, copies), fused
there into the backward's kernels; the second recording follows that choice.  A checkpointed
region's values are recomputed whatever they cost, as eager recomputes them.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import torch
from torch._prims_common import make_contiguous_strides_for

from fjit.core.ir import CUSTOM_VJPS, BoundSymbol, NumberVar, Symbol, Tag, TensorVar, Var, flatten_values, map_values
from fjit.core.trace import Trace
from fjit.autodiff.aten_backward import aten_backward, dense
from fjit.autodiff.function import record, torch_vjp
from fjit.autodiff.recompute import batch_norm_operands, batch_norm_output, is_view, recomputable
from fjit.autodiff.remat import recomputed
from fjit.autodiff.rules import NONDIFF, VJP, Pieces, fit, has_rule
from fjit.core.prims import Prim, apply, prim_of
from fjit.core.prims.layout import undo_index
from fjit.core.prims.toolkit import full

RECORD = Symbol("fjit_autodiff.record", record, frozenset({Tag.FALLBACK, Tag.RANDOM}))
TORCH_VJP = Symbol("fjit_autodiff.torch_vjp", torch_vjp, frozenset({Tag.FALLBACK}))
@dataclasses.dataclass(frozen=True)
class Recorder:
    """How the backward is recorded on proxies, as the frontend records a traced function."""
    # (forward trace, first free `t` number) -> a trace context, entered while recording: it has
    # inputs, scopes, consts, record(bsym) and new_name()
    context: Callable[[Trace, int], Any]
    tensor: Callable[..., Any]                  # (TensorVar, is_input=False) -> its proxy
    number: Callable[[Any, NumberVar], Any]     # (value, NumberVar) -> its proxy


def differentiable(v) -> bool:
    return isinstance(v, TensorVar) and v.requires_grad and v.dtype.is_floating_point


def _connected_inputs(trace: Trace) -> set:
    """Names of the values eager's autograd graph links to a differentiable output: every
    differentiable operand of an op one of whose differentiable outputs is (or feeds) one.  A
    decomposed op links what its prims read: view_as's, reshape_as's and expand_as's second
    operand gives only its shape, and eager's graph does not reach it."""
    linked = {v.name for v in flatten_values(trace.output) if differentiable(v)}

    def walk(bsyms):
        for b in reversed(bsyms):
            if any(differentiable(v) and v.name in linked for v in b.outputs()):
                linked.update(() if b.subsymbols else (v.name for v in b.inputs() if differentiable(v)))
                walk(b.subsymbols)      # nothing where the op is a prim
    walk(trace.bsyms)
    return linked


@dataclasses.dataclass
class Joint:
    forward: Trace          # the caller's flat outputs (distinct tensors first), then the saved values
    backward: Trace         # saved values, then one cotangent per differentiable output -> grads
    outputs: list           # the distinct Vars the forward returns to the caller, in order
    differentiable: list    # per entry of `outputs`: whether a cotangent flows back through it
    n_saved: int
    # ops of checkpointed regions whose values are saved all the same (no prim to rerun: a
    # convolution, a batch norm, an op torch autograd records), by name
    checkpoint_saved: tuple = ()


class Unsupported(Exception):
    """Something the joint program does not handle: the whole function keeps torch autograd."""


def build(trace: Trace, leaves: list, fusion, recorder: Recorder) -> Joint | str:
    """The joint program of `trace`, or why torch autograd should run it as before (nothing
    would be fused, or something is unsupported).  `fusion` is the kernel executor that fuses on
    the trace's device: `fusion.differentiates(b)` says whether to differentiate an op through its
    prims, `fusion.fused_prims(b)` how many of its prims its kernels would take."""
    if any(b.sym.has(Tag.MODE) for b in trace.bsyms):
        # grad-mode regions inside the function: eager's semantics need autograd
        return "the function enters a grad-mode region (no_grad/enable_grad) itself"
    if any(b.sym.has(Tag.HOOK) for b in trace.bsyms):
        return "the function registers a gradient hook, which torch autograd runs"
    if not any(differentiable(v) for v in trace.inputs):
        return "no input is differentiable"
    if any(isinstance(v, TensorVar) and v.requires_grad and v.dtype.is_complex
           for b in trace.bsyms for v in b.outputs()):     # cotangents here are real: they were dropped
        return "a complex value lies on a gradient's path (fft), which torch autograd differentiates"
    kinds = []
    for b in trace.bsyms:
        if not any(differentiable(v) for v in b.outputs()):
            kinds.append("plain")
            continue
        prims = b.subsymbols or ((b,) if prim_of(b) is not None else ())
        # a piece no cotangent reaches needs no rule (the detached rows of an embedding's padding)
        ok = prims and all(has_rule(prim_of(s)) or not any(differentiable(v) for v in s.outputs())
                           for s in prims) and fusion.differentiates(b)
        custom = b.sym in CUSTOM_VJPS and b.subsymbols     # an autograd.Function's own backward
        kinds.append("custom" if custom else "prims" if ok else "aten" if aten_backward(b) else "record")
    # Worth it when kernels take enough work: a recorded op costs a graph in the forward and a
    # nested autograd call in the backward (tens of us on the CPU), which a few fused prims do
    # not pay back; otherwise torch autograd over the forward's torch calls is as fast.
    # (an op kept whole with eager's backward counts where a kernel takes it whole: a batch norm)
    fused = sum(fusion.fused_prims(b) for b, kind in zip(trace.bsyms, kinds) if kind in ("prims", "aten", "custom"))
    # (checkpointing is honoured by the joint program alone: it is built whatever it fuses)
    if fused < max(2, 4 * kinds.count("record")) and not trace.checkpointed:
        return (f"kernels would take {fused} prims of the backward against "
                f"{kinds.count('record')} ops kept by torch autograd: not worth a joint program")
    try:
        return _Builder(trace, leaves, kinds, recorder).build()
    except Unsupported as e:
        return f"the joint program cannot be built ({e})"


class _Builder:
    def __init__(self, trace: Trace, leaves: list, kinds: list, recorder: Recorder):
        self.trace, self.leaves, self.kinds, self.recorder = trace, leaves, kinds, recorder
        self.input_names = {v.name for v in trace.inputs}
        self.used = set(self.input_names)
        self.top_level: set = set()
        self.producer: dict[str, tuple[BoundSymbol, int]] = {}   # var -> (prim or op, unit)
        for i, (b, kind) in enumerate(zip(trace.bsyms, kinds)):
            self.top_level.update(v.name for v in b.outputs())
            for s in (b.subsymbols if b.subsymbols and kind != "record" else (b,)):
                for v in s.outputs():
                    self.producer[v.name] = (s, i)
                    self.used.add(v.name)
            for v in b.outputs():
                self.used.add(v.name)
        outs: dict = {}
        for v in flatten_values(trace.output):
            if isinstance(v, Var):
                outs.setdefault(v.name, v)
        self.outputs, self.output_names = list(outs.values()), set(outs)
        self.checkpointed = _read_inside_their_region(trace, self.output_names)
        self.records: dict[int, tuple] = {}    # unit -> (graph outputs, leaves, their inputs)

    def fresh(self, base: str) -> str:
        name = base
        while name in self.used:
            name += "_"
        self.used.add(name)
        return name

    # -- the record units: fixed before the backward asks for their graphs ------------------------
    def _record_vars(self, i: int, b: BoundSymbol):
        if i not in self.records:
            graph = [v.replaced(name=self.fresh(f"{v.name}_graph"), requires_grad=True)
                     for v in b.outputs() if differentiable(v)]
            inputs, seen = [], set()
            for v in b.inputs():
                if differentiable(v) and v.name not in seen:
                    seen.add(v.name)
                    inputs.append(v)
            leaf = [v.replaced(name=self.fresh(f"{v.name}_leaf"), requires_grad=True) for v in inputs]
            self.records[i] = (graph, leaf, inputs)
        return self.records[i]

    def build(self) -> Joint:
        with torch.no_grad():
            names, records = set(self.used), dict(self.records)
            backward, read = _Backward(self, frozenset()).trace()
            again = recomputed([v for v in read if isinstance(v, TensorVar)], self._recompute_operands,
                               self._held, self._never_saved)
            if again:
                self.used, self.records = names, records     # the same names the second time
                backward, read = _Backward(self, again).trace()
        saved = read
        backward, sizes = self._sizes_passed(backward, len(saved))
        forward = self._forward(saved)
        if sizes:
            forward = forward.with_stage(forward.stage, output=forward.output + sizes)
        diff = [differentiable(v) for v in self.outputs]
        kept = tuple(sorted({self.producer[v.name][0].sym.qualname for v in saved if v.name in self.checkpointed}))
        return Joint(forward, backward, self.outputs, diff, len(saved) + len(sizes), kept)

    def _recompute_operands(self, name: str) -> tuple | None:
        """The tensor operands of the prim that makes forward value `name`, where the backward
        may run it again; None where it may not (not a prim, a random one, a matmul or a reduction,
        a value returned to the caller, an operand that is a number computed in the function)."""
        made = self.producer.get(name)
        if made is None or name in self.output_names:
            return None
        s = made[0]
        if prim_of(s) is None:
            return batch_norm_operands(s, next(v for v in s.outputs() if v.name == name))
        if not (recomputable(s) or name in self.checkpointed and not s.sym.has(Tag.RANDOM)):
            return None
        operands = [x for x in flatten_values((s.args, s.kwargs)) if isinstance(x, Var)]
        if any(isinstance(x, NumberVar) and x.name not in self.input_names for x in operands):
            return None
        return tuple(x for x in operands if isinstance(x, TensorVar))

    def _never_saved(self, name: str) -> bool:
        """A checkpointed value, or a view: the cut goes through the view's base instead."""
        made = self.producer.get(name)
        return name in self.checkpointed or made is not None and is_view(made[0])

    def _held(self, name: str) -> bool:
        """Alive whatever the backward reads: an input of the function, or a value it returns."""
        return name in self.output_names or name in self.input_names

    def _sizes_passed(self, backward: Trace, n_saved: int) -> tuple[Trace, tuple]:
        """A symbolic program's backward with the values of the symbols it uses as number inputs
        after its saved values (named as the symbols, so that they need no binding), and those
        symbols, which the forward returns after its saved values: the backward's inputs need not
        show every size (a flattened loss has the batch size and length only as a product)."""
        sizes = self.trace.sizes
        if sizes is None:
            return backward, ()
        used = sizes.symbols_of((backward.bsyms, backward.output))
        if not used:
            return backward, ()
        numbers = [NumberVar(str(sizes.names[s.node.expr]), int) for s in used]
        inputs = backward.inputs[:n_saved] + numbers + backward.inputs[n_saved:]
        return backward.with_stage(backward.stage, inputs=inputs), tuple(used)

    def _forward(self, saved: list) -> Trace:
        internal = {v.name for v in saved if v.name not in self.top_level}
        bsyms = []
        for i, (b, kind) in enumerate(zip(self.trace.bsyms, self.kinds)):
            if kind == "record" and i in self.records:
                graph, leaf, inputs = self.records[i]
                flat = flatten_values((b.args, b.kwargs))
                names = [v.name for v in inputs]
                slots = tuple((k, names.index(x.name)) for k, x in enumerate(flat)
                              if isinstance(x, Var) and x.name in names)
                outs = flatten_values(b.output)
                graph_slots = tuple(k for k, v in enumerate(outs) if differentiable(v))
                bsyms.append(BoundSymbol(RECORD, (b.sym.fn, slots, len(leaf), graph_slots)
                                         + tuple(b.args),
                                         dict(b.kwargs), (b.output, tuple(graph), tuple(leaf)),
                                         comment=f"{b.sym.qualname} runs under torch autograd, "
                                                 f"which keeps its backward"))
            elif kind == "aten" and (how := aten_backward(b)).forward is not None:
                bsyms.append(how.forward)      # the op's kernel, returning what the backward reads
            elif b.subsymbols and any(v.name in internal for s in b.subsymbols for v in s.outputs()):
                bsyms.extend(b.subsymbols)     # a value inside the op is saved: run its prims
            else:
                bsyms.append(b)
        out = tuple(self.outputs) + tuple(saved)
        return self.trace.with_stage("autodiff_forward", bsyms, output=out, rebuild=None)


def _read_inside_their_region(trace: Trace, outputs: set) -> set:
    """The names of trace.checkpointed whose every reader is an op of their own checkpointed
    region: what the backward recomputes.  A region's result, read after it (the next block's
    input) or returned, is saved, as eager's checkpoint saves each region's inputs."""
    region = trace.checkpointed
    if not region:
        return set()
    escaped = set(outputs)
    for b in trace.bsyms:
        outs = b.outputs()
        mine = region.get(outs[0].name) if outs else None
        escaped.update(v.name for v in b.inputs() if v.name in region and region[v.name] != mine)
    return set(region) - escaped


class _Backward:
    """Records the backward trace: cotangents flow from the outputs to the inputs."""

    def __init__(self, builder: _Builder, recompute: frozenset):
        self.b = builder
        self.recompute = recompute            # names of the forward values it recomputes
        self.env: dict[str, object] = {}      # forward var name -> its proxy in the backward
        self.saved: list = []                 # forward Vars the backward reads, in first-read order
        self.ct: dict[str, object] = {}       # forward var name -> cotangent proxy so far
        self.recorder = builder.recorder
        numbers = [int(m.group(1)) for n in builder.used if (m := re.fullmatch(r"t(\d+)", n))]
        self.ctx = self.recorder.context(builder.trace, max(numbers, default=-1) + 1)

    def _input(self, var: Var, name: str):
        if isinstance(var, NumberVar):
            try:
                position = self.b.trace.inputs.index(var)
            except ValueError:
                raise Unsupported("a number computed in the function is used by the backward") from None
            v = NumberVar(name, var.pytype)
            self.ctx.inputs.append(v)
            return self.recorder.number(self.b.leaves[position], v)
        v = var.replaced(name=name, requires_grad=False)
        self.ctx.inputs.append(v)
        return self.recorder.tensor(v, is_input=True)

    def value(self, var: Var):
        """A forward value in the backward: recomputed where the cut said so (a number computed
        in the function, wherever it can be), else saved by the forward."""
        p = self.env.get(var.name)
        if p is not None:
            return p
        made = self.b.producer.get(var.name)
        if var.name in self.recompute or isinstance(var, NumberVar) and made is not None \
                and recomputable(made[0]):
            s = made[0]
            if prim_of(s) is None:
                p = batch_norm_output(s, self.value)
            else:
                args, kwargs = map_values(lambda x: self.value(x) if isinstance(x, Var) else x, (s.args, s.kwargs))
                p = apply(prim_of(s), *args, **kwargs)
        else:
            self.saved.append(var)
            p = self._input(var, var.name)
        self.env[var.name] = p
        return p

    def _accumulate(self, var, g, shape, undo=None) -> None:
        """Add g, a contribution standing for a value of `shape`, to var's cotangent; with `undo`
        (undo_index's), g is the cotangent of a basic index of var, held until read (Pieces)."""
        if not differentiable(var) or g is None:
            return
        old = self.ct.get(var.name)
        if undo is not None or isinstance(old, Pieces):
            held = old if isinstance(old, Pieces) else Pieces(var, old, [])
            self.ct[var.name] = held.add(g if undo is not None else fit(g, var, shape), undo)
            return
        g = fit(g, var, shape)
        self.ct[var.name] = g if old is None else apply(Prim.ADD, old, g)

    def _take(self, name: str):
        """var's cotangent, removed from the pending ones; held slices joined."""
        g = self.ct.pop(name, None)
        return g.join() if isinstance(g, Pieces) else g

    def trace(self) -> tuple[Trace, list]:
        b, ctx = self.b, self.ctx
        with ctx:
            cotangents = []
            for v in b.outputs:
                if differentiable(v):
                    g = TensorVar(b.fresh(f"grad_{v.name}"), v.shape, v.dtype, v.device,
                                  make_contiguous_strides_for(v.shape), False)
                    cotangents.append(g)
                    self.ct[v.name] = self.recorder.tensor(g, is_input=True)
            for i in reversed(range(len(b.trace.bsyms))):
                kind, op = b.kinds[i], b.trace.bsyms[i]
                if kind == "prims":
                    for s in reversed(op.subsymbols or (op,)):
                        self._pullback(s)
                elif kind == "record":
                    self._record_pullback(i, op)
                elif kind == "aten":
                    self._aten_pullback(op)
                elif kind == "custom":
                    self._custom_pullback(op)
            grads = []
            connected = _connected_inputs(b.trace)
            for v in b.trace.inputs:
                g = self._take(v.name) if differentiable(v) else None
                if g is None and v.name in connected:
                    # eager's autograd graph reaches it (through sign, floor, ...: zero
                    # derivatives): its .grad is zeros, not None (an optimizer skips None)
                    g = apply(Prim.FULL, v.shape, 0, dtype=v.dtype, device=v.device)
                grads.append(full(g, v).ir if g is not None else None)
            ctx.inputs.extend(cotangents)      # saved values first, then the cotangents
            trace = Trace(b.trace.name, list(ctx.inputs), list(ctx.scopes[0]), tuple(grads),
                          dict(ctx.consts), stage="autodiff_backward", namespace=b.trace.namespace,
                          sizes=b.trace.sizes, autocast_off=b.trace.autocast_off)
        return trace, self.saved

    def _pullback(self, s: BoundSymbol) -> None:
        outs = s.outputs()
        g = self._take(outs[0].name) if outs else None
        if g is None or prim_of(s) in NONDIFF:
            return
        if prim_of(s) is Prim.SLICE:
            undo = undo_index(s.args[1], tuple(s.args[0].shape))
            if undo is not None:
                self._accumulate(s.args[0], full(g, outs[0]), None, undo)
                return
        if not s.sym.has(Tag.ELEMENTWISE):     # elementwise rules broadcast; others need the shape
            g = full(g, outs[0])
        elementwise = s.sym.has(Tag.ELEMENTWISE)
        for var, contribution in VJP[prim_of(s)](s, g, self.value):
            # an elementwise contribution stands for a value of the output's shape; another
            # rule's for one of its operand's (or one broadcast further, as matmul's batch dims)
            shape = outs[0].shape if elementwise else torch.broadcast_shapes(
                tuple(contribution.shape), var.shape)
            self._accumulate(var, contribution, shape)

    def _record_pullback(self, i: int, op: BoundSymbol) -> None:
        outs = [v for v in op.outputs() if differentiable(v)]
        gs = [self._take(v.name) for v in outs]
        if all(g is None for g in gs):
            return
        graph, leaf, inputs = self.b._record_vars(i, op)
        used = [(gv, full(g, gv)) for gv, g in zip(graph, gs) if g is not None]
        graph_in = tuple(self.value(gv) for gv, _ in used)
        leaf_in = tuple(self.value(lv) for lv in leaf)
        results = tuple(TensorVar(self.ctx.new_name(), v.shape, v.dtype, v.device,
                                  make_contiguous_strides_for(v.shape), False) for v in inputs)
        self.ctx.record(BoundSymbol(TORCH_VJP, (tuple(p.ir for p in graph_in),
                                                tuple(p.ir for p in leaf_in),
                                                tuple(g.ir for _, g in used)), {}, results,
                                    comment=f"torch autograd's backward of {op.sym.qualname}"))
        for var, r in zip(inputs, results):
            self._accumulate(var, self.recorder.tensor(r), var.shape)

    def _custom_pullback(self, op: BoundSymbol) -> None:
        """An autograd.Function's backward, recorded on the backward's proxies (CUSTOM_VJPS); a
        cotangent no output got is zeros (autograd's materialized gradients), or None where the
        forward called ctx.set_materialize_grads(False)."""
        outs = [v for v in flatten_values(op.output) if isinstance(v, Var)]
        gs = [self._take(v.name) for v in outs]
        if all(g is None for g in gs):
            return
        zeros = getattr(CUSTOM_VJPS[op.sym], "materialize_grads", True)
        gs = [full(g, v) if g is not None else apply(Prim.FULL, v.shape, 0, dtype=v.dtype, device=v.device)
              if zeros else None for g, v in zip(gs, outs)]
        try:
            grads = CUSTOM_VJPS[op.sym](op, self.value, gs)
        except Exception as e:      # noqa: BLE001 -- the Function's backward does not trace
            raise Unsupported(f"{op.sym.qualname}'s backward: {type(e).__name__}: {e}") from None
        for var, g in grads:
            self._accumulate(var, g, tuple(g.shape))

    def _aten_pullback(self, op: BoundSymbol) -> None:
        out = op.outputs()[0]
        g = self._take(out.name)
        if g is None:
            return
        how = aten_backward(op)
        mask = [v is not None and differentiable(v) for v in how.operands]
        layouts = [None if not m else tuple(v.strides) if dense(v) else
                   tuple(make_contiguous_strides_for(v.shape)) for v, m in zip(how.operands, mask)]
        results = tuple(TensorVar(self.ctx.new_name(), v.shape, v.dtype, v.device, s, False)
                        if m else None for v, m, s in zip(how.operands, mask, layouts))
        saved = tuple(self.value(v).ir if v is not None else None for v in how.saved)
        symbol = Symbol(f"fjit_autodiff.{how.fn.__name__}", how.fn, frozenset({Tag.FALLBACK}))
        self.ctx.record(BoundSymbol(symbol, (full(g, out).ir, *saved, *how.static, mask, layouts), {}, results,
                                    comment=f"ATen's {how.aten}, as eager's {op.sym.qualname}"))
        for var, r in zip(how.operands, results):
            if r is not None:
                self._accumulate(var, self.recorder.tensor(r), var.shape)
