"""The torch.compile backend: Dynamo's FX graphs compiled by fjit, with the rest split out to torch.

    torch.compile(model, backend="fjit")          # the torch_dynamo_backends entry point
    torch.compile(model, backend=fjit.backend)    # the same object
    fjit.backend.with_options(executors=("c", "torch"), split_executor="inductor")
    print(fjit.backend.explain())                 # subgraphs and split reasons

Routes.  A graph that needs gradients (grad mode on and an input requiring grad) is compiled, by
default, as fjit.jit would compile it: fjit's compiled backward where it fuses, torch autograd
elsewhere.  With `autograd="aot"` it goes through AOTAutograd instead, with fjit compiling the
forward and the backward aten graphs, first rewritten to torch-level calls (fjit/dynamo/aten.py) so
their pointwise and reduction work fuses.  Any other graph is compiled as Dynamo hands it over, at
the torch level, which fjit's decompositions cover best and which skips AOTAutograd's tracing.

Each graph is cut into pieces (fjit/dynamo/split.py): nodes that fjit cannot compile run as torch
calls, each in a piece of its own with a recorded reason, every run of nodes between them is one
fjit piece.  A piece is compiled when it is first called, on that call's real tensors (AOTAutograd
hands its compilers fake tensors, and fjit's compile runs opaque ops once to see their real
layouts); if tracing raises, the node that raised goes to torch with fjit's error as its reason and
the piece is cut again.  After that a call is the compiled program itself, behind one list lookup:
no fjit cache key, because Dynamo's guards (shapes, strides, dtypes, grad mode) decide when a graph
is compiled again.  A graph with symbolic shapes is the exception: its pieces keep fjit's metadata
cache, one program per concrete shape.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.fx
from torch.fx.passes.split_module import split_module

import fjit.pipeline as pipeline
from fjit.api import JittedFunction, last_traces
from fjit.config import DEFAULT_EXECUTORS, SharpEdges, TraceMode
from fjit.core.ir import Tag
from fjit.core.trace import Trace
from fjit.dynamo import aten as aten_table
from fjit.executors import parse_executors
from fjit.dynamo.split import (SplitReason, assign, describe_error, is_compute, is_symbolic,
                               node_of_error, op_name, static_reason, writes_across_pieces)
from fjit.frontend.inputs import call_key, transformed

SPLIT_EXECUTORS = ("torch", "inductor")
_MAX_RESPLITS = 6
# Who differentiates a graph whose inputs require grad: fjit (its own compiled backward, on the
# torch-level graph) or AOTAutograd (aten forward and backward graphs, each compiled by fjit).
AUTOGRAD = ("fjit", "aot")


@dataclasses.dataclass
class SubgraphInfo:
    """One piece of a graph the backend compiled."""
    graph: int                  # the backend's count of Dynamo graphs, from 1
    stage: str                  # "inference" (as Dynamo gave it), or AOT's "forward" / "backward"
    name: str                   # where the piece sits: "0", "2.1" (piece 1 of piece 2, re-split)
    executor: str               # "fjit", "torch", "inductor", or "pending" (not called yet)
    nodes: list                 # FX node names
    ops: list                   # their ops, as op_name prints them
    reason: SplitReason | None = None    # why it runs as torch calls (torch/inductor pieces)
    traces: list = dataclasses.field(default_factory=list)   # fjit pieces: every stage
    dynamic: bool = False       # symbolic shapes: fjit's cache keeps one program per shape
    note: str | None = None     # e.g. why Inductor did not compile a split piece

    @property
    def kernels(self) -> int:
        """Fused kernel regions (C or Triton) in the program fjit runs."""
        if not self.traces:
            return 0
        return sum(b.sym.has(Tag.KERNEL) for b in self.traces[-1].bsyms)

    @property
    def final_trace(self) -> Trace | None:
        return self.traces[-1] if self.traces else None


def _short(why: str, width: int = 160) -> str:
    """A reason as the table shows it: up to fjit's ' Fix:' (the fix is in the full reason)."""
    why = why.split(" Fix: ")[0]
    return why if len(why) <= width else why[:width - 3] + "..."


def _table(headers, rows) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), fmt.format(*("-" * w for w in widths))] + \
        [fmt.format(*map(str, r)).rstrip() for r in rows]


class Backend:
    """A torch.compile backend: `torch.compile(model, backend=Backend())`."""

    def __init__(self, executors=DEFAULT_EXECUTORS, split_executor="torch", autograd="fjit"):
        self.executors = parse_executors(executors, "fjit.backend: executors")
        if split_executor not in SPLIT_EXECUTORS:
            raise ValueError(f"fjit.backend: split_executor={split_executor!r} is not one of "
                             f"{', '.join(map(repr, SPLIT_EXECUTORS))}")
        self.split_executor = split_executor
        if autograd not in AUTOGRAD:
            raise ValueError(f"fjit.backend: autograd={autograd!r} is not one of "
                             f"{', '.join(map(repr, AUTOGRAD))}")
        self.autograd = autograd
        self.subgraph_infos: list[SubgraphInfo] = []
        self._graphs = 0

    def with_options(self, *, executors=None, split_executor=None, autograd=None) -> "Backend":
        """A new backend with these options (the others as this one's)."""
        return Backend(self.executors if executors is None else executors,
                       self.split_executor if split_executor is None else split_executor,
                       self.autograd if autograd is None else autograd)

    def clear(self) -> None:
        """Forget the recorded subgraph infos (compiled graphs keep working)."""
        self.subgraph_infos.clear()

    def __repr__(self):
        return (f"<fjit torch.compile backend executors={self.executors} "
                f"split_executor={self.split_executor!r} autograd={self.autograd!r}>")

    # ------------------------------------------------------------------------------------------
    # Dynamo's entry

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        _specialize_settled_floats(gm)
        self._graphs += 1
        graph = self._graphs
        training = torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad
                                                   for x in example_inputs)
        if training and self.autograd == "fjit":
            # The torch-level graph, as fjit.jit would trace it: inputs that require grad get
            # fjit's compiled backward where it fuses, torch autograd over its calls elsewhere.
            return self.compile_graph(gm, example_inputs, graph, "train")
        if training:
            from torch._dynamo.backends.common import aot_autograd   # Dynamo/AOT: only once Dynamo calls
            return aot_autograd(
                fw_compiler=functools.partial(self._compile_aot, graph=graph, stage="forward"),
                bw_compiler=functools.partial(self._compile_aot, graph=graph, stage="backward"),
                inference_compiler=functools.partial(self._compile_aot, graph=graph,
                                                     stage="inference"),
                decompositions=aten_table.decompositions())(gm, example_inputs)
        return self.compile_graph(gm, example_inputs, graph, "inference")

    def _compile_aot(self, gm, example_inputs, *, graph, stage):
        from torch._functorch.aot_autograd import make_boxed_func   # only once AOTAutograd calls
        return make_boxed_func(self.compile_graph(gm, example_inputs, graph, stage, aten=True))

    def compile_graph(self, gm: torch.fx.GraphModule, example_inputs, graph: int, stage: str,
                      aten: bool = False):
        """A callable computing `gm`: its fjit pieces compiled on first call."""
        dynamic = is_symbolic(gm, example_inputs)
        reasons = {}
        for node in gm.graph.nodes:
            why = static_reason(node)
            if why is not None:
                reasons[node] = why
        reasons = writes_across_pieces(gm, reasons)
        numbers = _numbers_from_inputs(gm)
        run = _Splitter(self, graph, stage, aten, dynamic).runner(gm, reasons, "")
        if not numbers:
            return run

        def with_numbers(*args):
            return run(*[a.item() if k in numbers else a for k, a in enumerate(args)])
        return with_numbers

    # ------------------------------------------------------------------------------------------
    # Reading what happened

    def explain(self) -> str:
        """The subgraphs compiled so far and every split reason, as tables."""
        infos = self.subgraph_infos
        if not infos:
            return "fjit backend: no graphs compiled"
        n_fjit = sum(i.executor == "fjit" for i in infos)
        n_split = sum(i.reason is not None for i in infos)
        lines = [f"fjit backend: {len({i.graph for i in infos})} graph(s), {len(infos)} "
                 f"subgraph(s): {n_fjit} compiled by fjit, {n_split} split out"]
        rows = [(i.graph, i.stage, i.name or "0", i.executor, len(i.nodes),
                 i.kernels if i.executor == "fjit" else "-", "yes" if i.dynamic else "")
                for i in infos]
        lines += _table(("graph", "stage", "subgraph", "executor", "nodes", "kernels",
                         "dynamic"), rows)
        split = [i for i in infos if i.reason is not None]
        lines.append("")
        if split:
            lines.append("split reasons:")
            lines += _table(("graph", "stage", "node", "op", "why"),
                            [(i.graph, i.stage, i.reason.node, i.reason.op, _short(i.reason.why))
                             for i in split])
            lines.append("(full reasons: fjit.backend.subgraph_infos[i].reason.why)")
        else:
            lines.append("split reasons: none")
        return "\n".join(lines)


def _specialize_settled_floats(gm: torch.fx.GraphModule) -> None:
    """Ask Dynamo to make constants of the float inputs whose value is settled already.

    Under dynamic shapes Dynamo passes a Python float it has not specialized (a module's `eps`, a
    dropout's `p`) as a 0-d float64 graph input: every call builds that tensor in Dynamo's
    bytecode and reads it back with `.item()`, a few microseconds each, 17 times a call in GPT-2.
    Where the graph's `.item()` of it already has a constant value (Python code compared it, so a
    guard holds it) or is not read at all, the input only costs.  Inductor specializes such inputs
    (its tensorify pass): it names them to Dynamo and restarts the analysis, and Dynamo then guards
    on the value and leaves the input out.  This does the same, through the same hooks.  A float
    whose value is still free stays a runtime number of the program (`_numbers_from_inputs`)."""
    try:
        from torch._dynamo.exc import TensorifyScalarRestartAnalysis
        from torch._dynamo.symbolic_convert import TensorifyState
        from torch.fx.experimental.symbolic_shapes import free_symbols
    except ImportError:       # a torch without the hooks: the inputs stay runtime numbers
        return
    settled = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("example_value")
        memo = getattr(value, "item_memo", None)
        # the condition under which Dynamo drops a specialized input after the restart
        # (OutputGraph.remove_tensorify_specialized_graphargs)
        if memo is None or not hasattr(memo.node._expr, "name") or not node.users \
                or not all(u.target == "item" for u in node.users):
            continue
        unread = all(not u.users for u in node.users)
        if (unread or not free_symbols(memo)) and not TensorifyState.should_specialize(memo.node._expr.name):
            settled.append(memo.node._expr.name)
    if settled:
        for name in settled:
            TensorifyState.specialize(name)
        raise TensorifyScalarRestartAnalysis


def _numbers_from_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Graph inputs that are Python floats in the user's code: Dynamo hands a float it does not
    specialize on (a module's `eps`, `math.pi` read as a global, a scale) to the graph as a 0-d
    float64 tensor and reads it back with `.item()`.  Such an `.item()` is not data-dependent
    control flow, and as an op it would split the graph (fjit's FJ106) at every use.  So where a
    0-d floating-point input is read only by `.item()`, the graph takes the number itself (its
    uses read the input), the caller passes `x.item()` in its place, and the number reaches fjit
    as a float: a runtime value of the program, which changes nothing compiled.  Returns the
    positions of the inputs rewritten so."""
    numbers = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for k, node in enumerate(placeholders):
        value = node.meta.get("example_value", node.meta.get("val"))
        if not (isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()
                and value.device.type == "cpu" and node.users
                and all(u.op == "call_method" and u.target == "item" and u.args == (node,)
                        and not u.kwargs for u in node.users)):
            continue
        for use in list(node.users):
            use.replace_all_uses_with(node)
            gm.graph.erase_node(use)
        node.meta.pop("example_value", None)     # no longer a tensor (its value comes per call)
        node.meta.pop("val", None)
        numbers.add(k)
    if numbers:
        gm.graph.lint()
        gm.recompile()
    return numbers


class _Splitter:
    """Cuts one graph into pieces and makes their callables."""

    def __init__(self, backend: Backend, graph: int, stage: str, aten: bool, dynamic: bool):
        self.backend, self.graph, self.stage, self.aten, self.dynamic = \
            backend, graph, stage, aten, dynamic

    def _info(self, gm, name, executor, reason=None, at=None) -> SubgraphInfo:
        nodes = [n for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
        info = SubgraphInfo(self.graph, self.stage, name, executor, [n.name for n in nodes],
                            [op_name(n) for n in nodes], reason, dynamic=self.dynamic)
        infos = self.backend.subgraph_infos
        infos.insert(len(infos) if at is None else at, info)
        return info

    def runner(self, gm: torch.fx.GraphModule, torch_nodes: dict, name: str, at=None):
        """A callable computing `gm`, with each node in `torch_nodes` (node -> why) a torch call."""
        if not any(is_compute(n) for n in gm.graph.nodes):     # only moves values around
            return gm.forward
        parts = assign(gm, torch_nodes)
        if len({p for p, _ in parts.values()}) == 1 and not torch_nodes:
            return _FjitPiece(self, gm, self._info(gm, name or "0", "pending", at=at)).entry()
        split = split_module(
            gm, None, lambda n: parts[n][0], keep_original_order=True)
        kinds = {f"submod_{p}": k for p, k in parts.values()}
        reason_of = {parts[n][0]: (n, why) for n, why in torch_nodes.items() if n in parts}
        for node in split.graph.nodes:
            if node.op != "call_module":
                continue
            sub = getattr(split, node.target)
            pid = int(node.target.rsplit("_", 1)[1])
            piece_name = f"{name}.{pid}" if name else str(pid)
            if at is not None:
                at += 1
            if kinds[node.target] == "fjit" and any(is_compute(n) for n in sub.graph.nodes):
                fn = _FjitPiece(self, sub, self._info(sub, piece_name, "pending",
                                                      at=None if at is None else at - 1)).entry()
            else:
                bad, why = reason_of.get(pid, (None, None))
                reason = SplitReason(bad.name, op_name(bad), why) if bad is not None else None
                info = self._info(sub, piece_name, "torch", reason, at=None if at is None else at - 1)
                fn = _torch_piece(self.backend, sub, info)
            node.op, node.target = "call_function", fn
        split.graph.lint()
        split.recompile()
        return split.forward


def _torch_piece(backend: Backend, sub: torch.fx.GraphModule, info: SubgraphInfo):
    if backend.split_executor != "inductor":
        return _named(sub.forward, f"torch_piece_{info.name.replace('.', '_')}")
    slot: list = []

    def first(*args):
        try:
            from torch._inductor import compile as inductor_compile   # heavy: only for inductor pieces
            compiled = inductor_compile(sub, list(args))
            result = compiled(*args)
            info.executor = "inductor"
            slot[0] = compiled
        except Exception as e:      # noqa: BLE001  what Inductor cannot compile runs as torch calls
            info.note = f"Inductor could not compile it: {describe_error(e)}"
            slot[0] = sub.forward
            result = sub.forward(*args)
        return result

    slot.append(first)

    def run(*args):
        return slot[0](*args)
    return _named(run, f"inductor_piece_{info.name.replace('.', '_')}")


def _named(fn, name: str):
    """FX prints a call_function target by its name: give each piece one it can print."""
    if getattr(fn, "__name__", None) == name:
        return fn

    @functools.wraps(fn)
    def call(*args):
        return fn(*args)
    call.__name__ = call.__qualname__ = name
    call.__module__ = __name__
    return call


class _FjitPiece:
    """A piece fjit compiles on its first call; its callable is then the compiled program."""

    def __init__(self, splitter: _Splitter, gm: torch.fx.GraphModule, info: SubgraphInfo):
        self.splitter, self.gm, self.info = splitter, gm, info
        self.slot = [self._first_call]

    def entry(self):
        slot = self.slot

        def run(*args):
            return slot[0](*args)
        run.__name__ = run.__qualname__ = f"fjit_piece_{self.info.name.replace('.', '_')}"
        run.__module__ = __name__
        return run

    def _first_call(self, *args):
        if transformed():     # see _compiled: compiled by the first call made outside a transform
            return self.gm.forward(*args)
        copy, to_original, consts = _traceable_copy(self.gm, self.splitter.aten)
        full = args + consts
        try:
            runner, result = self._compile(copy, full)
        except Exception as e:      # noqa: BLE001  anything fjit cannot trace goes to torch
            bad = node_of_error(e, copy)
            bad = to_original.get(bad) if bad is not None else None
            why = describe_error(e)
            infos = self.splitter.backend.subgraph_infos
            at = infos.index(self.info)
            del infos[at]
            # A piece re-split this often keeps failing: the rest of it runs as torch, flat,
            # rather than one nested level per failure (Python's recursion limit)
            if bad is None or sum(is_compute(n) for n in self.gm.graph.nodes) == 1 or \
                    self.info.name.count(".") >= _MAX_RESPLITS:
                bad = bad or next(n for n in self.gm.graph.nodes if is_compute(n))
                info = self.splitter._info(self.gm, self.info.name, "torch",
                                           SplitReason(bad.name, op_name(bad), why), at=at)
                runner = _torch_piece(self.splitter.backend, self.gm, info)
            else:
                runner = self.splitter.runner(self.gm, {bad: why}, self.info.name, at=at)
            self.slot[0] = runner
            return runner(*args)
        self.slot[0] = self._compiled(runner, consts)
        return result

    def _compiled(self, program, consts: tuple):
        """`program` (after the lifted constants), or the piece's torch code under a torch.func
        transform or forward-mode AD: Dynamo runs pieces inside vmap (transformers' Mamba), whose
        wrappers a C kernel cannot read (the process aborted); a program drops tangents."""
        torch_code = self.gm.forward

        def runner(*args):
            if transformed():
                return torch_code(*args)
            return program(*args, *consts)
        return runner

    def _compile(self, gm: torch.fx.GraphModule, args: tuple):
        """(the callable later calls run, this call's result)."""
        info = self.info
        info.executor = "fjit"
        executors = self.splitter.backend.executors
        if self.splitter.dynamic or is_symbolic(self.gm, ()):
            # fjit's cache: a size that varies becomes a symbol.  Dynamo passes the graph's
            # symbolic sizes as int inputs, which fjit's key takes as constants (a program per
            # value): each comes in as the first dim of an empty tensor instead, a dim that varies.
            positions = frozenset(i for i, a in enumerate(args) if type(a) is int)
            jf = JittedFunction(_sizes_from_carriers(gm.forward, positions) if positions else gm.forward,
                                sharp_edges="error", executors=executors)
            call = _sizes_in_carriers(jf, positions) if positions else jf
            result = call(*args)
            info.traces, info.dynamic = last_traces(jf), True
            return call, result
        _, leaves = call_key(args, {}, frozenset())
        compiled = pipeline.compile_call(gm.forward, args, {}, leaves,
                                         TraceMode.of(SharpEdges.ERROR), executors)
        info.traces = compiled.traces
        result = compiled.result(leaves)
        if compiled.specialized:     # a float input's value matters: the metadata cache keys on it
            return JittedFunction(gm.forward, sharp_edges="error", executors=executors), result
        program = compiled.program
        positions = [i for i, a in enumerate(args) if isinstance(a, (torch.Tensor, float))]
        if positions == list(range(len(args))):
            return program, result

        def select(*a):
            return program(*[a[i] for i in positions])
        return select, result


def _sizes_from_carriers(forward, positions: frozenset):
    """`forward`, taking at each of `positions` a size carrier (_sizes_in_carriers) or the int."""
    def forward_of_carriers(*args):
        return forward(*(a.shape[0] if i in positions and isinstance(a, torch.Tensor) else a
                         for i, a in enumerate(args)))
    return forward_of_carriers


_CARRIERS: dict[int, torch.Tensor] = {}


def _sizes_in_carriers(jf: JittedFunction, positions: frozenset):
    """`jf` called with each int at `positions` as an empty tensor of that many rows (the same
    one per value), which fjit's cache makes a symbolic size when it varies (a negative int, no
    size, goes as itself: a program per value)."""
    def call(*args):
        carried = []
        for i, a in enumerate(args):
            if i in positions and type(a) is int and a >= 0:
                c = _CARRIERS.get(a)
                if c is None:
                    if len(_CARRIERS) > 4096:
                        _CARRIERS.clear()
                    c = _CARRIERS[a] = torch.empty((a, 0))
                a = c
            carried.append(a)
        return jf(*carried)
    return call


def _traceable_copy(gm: torch.fx.GraphModule, aten: bool):
    """(a copy of gm that fjit can trace, copy node -> gm node, constant tensors it now takes as
    trailing inputs).  Tensors read with get_attr become inputs (fjit proxies only inputs); aten
    overloads become torch-level calls; device constants become strings."""
    graph = torch.fx.Graph()
    val_map: dict = {}
    out = graph.graph_copy(gm.graph, val_map)
    graph.output(out)
    to_original = {new: old for old, new in val_map.items()}
    consts = []
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    last = placeholders[-1] if placeholders else None
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = gm
        for part in node.target.split("."):
            value = getattr(value, part)
        if not isinstance(value, torch.Tensor):
            continue
        if last is None:
            with graph.inserting_before(next(iter(graph.nodes))):
                ph = graph.placeholder(f"const_{len(consts)}")
        else:
            with graph.inserting_after(last):
                ph = graph.placeholder(f"const_{len(consts)}")
        last = ph
        node.replace_all_uses_with(ph)
        graph.erase_node(node)
        consts.append(value)
    for node in graph.nodes:
        # FX prints a device constant as the call `device(type='cpu')`, which fjit would trace as
        # an op; the string names the same device for every torch call that takes one.
        node.args, node.kwargs = torch.fx.node.map_aggregate(
            (node.args, node.kwargs), lambda a: str(a) if isinstance(a, torch.device) else a)
    copy = torch.fx.GraphModule(gm, graph)
    if aten:
        aten_table.to_torch_level(copy)
        copy.recompile()
    return copy, to_original, tuple(consts)
