"""Which FX nodes fjit leaves to torch, and the partition of a graph into fjit and torch pieces.

A node goes to torch for a reason known before tracing (the static rules below: an aten overload
whose schema mutates an argument, BatchNorm updating its running statistics in place) or for the
error fjit raised while tracing it (found from the traceback: the line of the GraphModule's
generated forward that was running, through FX's line-to-node map).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import operator

import torch
import torch.fx
import torch.nn.functional as F

from fjit.frontend.torch_calls import qualified_name


@dataclasses.dataclass(frozen=True)
class SplitReason:
    """Why a node runs as a torch call: the node, its op, and why."""
    node: str
    op: str
    why: str


def op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return f"Tensor.{node.target}"
    if node.op == "call_module":
        return f"module {node.target}"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    name = qualified_name(target)
    return name.replace("torch._C._nn.", "torch.nn.functional.")


def _arg(node: torch.fx.Node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# (callable, index and name of `training`, of `running_mean`): BatchNorm in training mode writes
# its running statistics into its inputs inside the call, which a pure trace cannot express.
_BATCH_NORMS = {F.batch_norm: ((5, "training"), (1, "running_mean")),
                torch.batch_norm: ((5, "training"), (3, "running_mean")),
                torch.native_batch_norm: ((5, "training"), (3, "running_mean"))}


# Dynamo's records of a `with torch.autocast(...)` block: a switch of a process-wide mode whose
# result is a context object, not a value; the pieces between them run under the mode they set.
_MODE_SWITCHES = {torch.amp.autocast_mode._enter_autocast, torch.amp.autocast_mode._exit_autocast}


def static_reason(node: torch.fx.Node) -> str | None:
    """Why `node` must run as a torch call, if that is known without tracing it."""
    if node.op != "call_function":
        return None
    target = node.target
    if target in _MODE_SWITCHES:
        return "enters or leaves an autocast region: a mode switch, run as torch; the pieces " \
               "between run under the mode it sets (autocast is in fjit's cache key)"
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        written = [a.name for a in target._schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
        return (f"writes into its argument{'s' if len(written) > 1 else ''} "
                f"{', '.join(written)} in place (aten schema), which a pure trace cannot express")
    rule = _BATCH_NORMS.get(target)
    if rule is not None:
        (ti, tn), (ri, rn) = rule
        if _arg(node, ti, tn, False) and _arg(node, ri, rn) is not None:
            return ("updates the BatchNorm running statistics in place (training mode), which a "
                    "pure trace cannot express")
    return None


def is_compute(node: torch.fx.Node) -> bool:
    return node.op in ("call_function", "call_method", "call_module") and \
        node.target is not operator.getitem


# Nodes that read a value's metadata (or unpack it) go with the torch piece that made the value:
# split_module orders pieces by the symbols they bind, and a size of nonzero's output belongs with
# nonzero.
_FOLLOWERS = {operator.getitem, torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
              torch.ops.aten.sym_numel.default, torch.ops.aten.sym_storage_offset.default}


def _follows(node: torch.fx.Node, parts: dict) -> tuple | None:
    """The torch piece `node` joins, if it reads the metadata of (or unpacks) a value that piece
    made and reads nothing made after that piece.  A later value would make the two pieces
    depend on each other, a cycle: `mask[(batch_idx, kv_idx)]` of a mask a torch piece made
    (a getitem, but an indexing with tensors made further on) is a node of its own run."""
    if node.target not in _FOLLOWERS or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    made = parts.get(node.args[0])
    if made is None or made[1] != "torch":
        return None
    later = [n for n in node.all_input_nodes if parts.get(n, (-1,))[0] > made[0]]
    return None if later else made


def assign(gm: torch.fx.GraphModule, torch_nodes) -> dict:
    """node -> (partition id, "fjit" | "torch"), in graph order: each node in `torch_nodes` is a
    partition of its own (with the getitems and sizes of its result), every maximal run of other nodes
    between them is one fjit partition.  Every node's partition is at or after those of the nodes
    it reads, so the partitions never form a cycle."""
    parts: dict = {}
    pid, kind = -1, None
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        joined = _follows(node, parts)
        if joined is not None:
            parts[node] = joined
            continue
        if node in torch_nodes:
            pid, kind = pid + 1, "torch"
        elif kind != "fjit":
            pid, kind = pid + 1, "fjit"
        parts[node] = (pid, kind)
    return parts


# Ops whose result aliases their first operand: an in-place write through one writes its base.
_VIEW_NAMES = {"view", "reshape", "view_as", "reshape_as", "transpose", "permute", "flatten",
               "unflatten", "unsqueeze", "squeeze", "expand", "expand_as", "narrow", "select",
               "t", "T", "mT", "__getitem__", "getitem", "split", "chunk", "unbind", "movedim",
               "diagonal", "as_strided", "detach", "view_as_real", "view_as_complex", "unfold"}


def _name(node: torch.fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _writes_in_place(node: torch.fx.Node) -> bool:
    name = _name(node)
    return node.op in ("call_method", "call_function") and (
        (name.endswith("_") and not name.endswith("__")) or _inplace_flag(node)
        or node.kwargs.get("out") is not None or node.target is operator.setitem
        or name == "__setitem__")


@functools.lru_cache(maxsize=None)
def _inplace_position(target) -> int | None:
    try:
        params = list(inspect.signature(target).parameters)
    except (TypeError, ValueError):
        return None
    return params.index("inplace") if "inplace" in params else None


def _inplace_flag(node: torch.fx.Node) -> bool:
    """F.relu(x, inplace=True), with the flag given by name or by position."""
    if node.kwargs.get("inplace") is True:
        return True
    if node.op != "call_function" or not callable(node.target):
        return False
    try:
        i = _inplace_position(node.target)
    except TypeError:         # an unhashable target
        return False
    return i is not None and len(node.args) > i and node.args[i] is True


def _base(node: torch.fx.Node) -> torch.fx.Node:
    while node.op in ("call_method", "call_function") and _name(node) in _VIEW_NAMES and \
            node.args and isinstance(node.args[0], torch.fx.Node):
        node = node.args[0]
    return node


def writes_across_pieces(gm: torch.fx.GraphModule, torch_nodes: dict) -> dict:
    """`torch_nodes` with every in-place write whose target (through views) is not made in the
    writer's own fjit piece: a graph input, or a value another piece made, which fjit would see
    as an input of the piece (FJ102).  Found before tracing, so the graph is split once, flat;
    found by tracing, each write re-split the piece that raised it, one level deeper (timm's
    EfficientViT: hundreds of levels, a RecursionError)."""
    torch_nodes = dict(torch_nodes)
    while True:
        parts = assign(gm, torch_nodes)
        found = {}
        for node in gm.graph.nodes:
            if node in torch_nodes or node not in parts or not _writes_in_place(node) or \
                    not node.args or not isinstance(node.args[0], torch.fx.Node):
                continue
            base = _base(node.args[0])
            if base.op == "placeholder" or parts.get(base, (None,))[0] != parts[node][0]:
                found[node] = (f"FJ102 input mutation (known before tracing): writes in place "
                               f"into {base.name}, which the piece receives from outside; a "
                               f"compiled piece does not mutate its inputs")
        if not found:
            return torch_nodes
        torch_nodes.update(found)


def node_of_error(exc: BaseException, gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The node of `gm` whose line of the generated forward was running when `exc` was raised."""
    code = getattr(type(gm).forward, "__code__", None)
    lineno_map = getattr(gm, "_lineno_map", None)
    if code is None or not lineno_map:
        return None
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            line = tb.tb_lineno
        tb = tb.tb_next
    if line is None:
        return None
    index = lineno_map.get(line - code.co_firstlineno)
    nodes = list(gm.graph.nodes)
    return nodes[index] if index is not None and 0 <= index < len(nodes) else None


def describe_error(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" + ("..." if len(text) > 300 else "")


def is_symbolic(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether Dynamo (or AOTAutograd) made this graph for symbolic shapes."""
    def symbolic(v) -> bool:
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(v, torch.Tensor):
            return any(isinstance(s, torch.SymInt) for s in (*v.shape, *v.stride()))
        return False
    if any(symbolic(x) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "placeholder" and symbolic(node.meta.get("val", node.meta.get("example_value"))):
            return True
    return False
