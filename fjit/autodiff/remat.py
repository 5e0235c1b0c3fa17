"""What the joint program saves for its backward and what the backward recomputes: a minimum cut
over the forward's values, weighted by their bytes (AOTAutograd's min-cut rematerialization, on
fjit's traces).

The backward's rules read a set of forward values (joint.py records the backward once with every
one of them saved, and notes them).  Each value is either made by an op the backward may run again
(recompute.py: views, pointwise arithmetic and library prims, factories, copies, a training batch
norm's normalized output) or not (a matmul, a convolution, a reduction, a random draw, an input, a
value the caller gets).  A choice of saved values is valid when every value read can be computed
from the saved ones by recomputable ops; the cheapest valid choice is a minimum cut in the graph
where each value is an edge `in -> out` of its bytes, a recomputable value's operands feed its
`in`, a value that cannot be recomputed hangs from the source and a value read from the sink.

What the cut decides, as eager does it: a layer norm's output entering the next linear is
recomputed from its input and the per-row statistics saved for its backward anyway; a CNN's
ReLU(BatchNorm(conv)) from the convolution's output, which the batch norm's backward reads; a
tanh-GELU's dozen intermediates from the linear's output.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from fjit.core.ir import TensorVar
from fjit.core.symbolic import hint

_INFINITE = 1 << 62
# What keeping a value costs where it is alive anyway (an input, a value returned to the caller),
# or where it is small: nothing in memory that counts, but a cut through it should still beat one
# through a computed value of the same size.
_NEARLY_FREE = 1
# A value of at most 1/SMALL of the widest value computed from it is saved rather than computed
# again (unless checkpointed, or a view): a layer norm's mean and inverse std, a softmax's max,
# next to the rows they are broadcast along.  Their bytes are nothing next to those rows', and
# computing them again is an op of its own in the backward (a per-row value does not fuse into the
# row kernel that reads it), where reading them back costs nothing.  (Against the widest value of
# the whole program, a hierarchical model's small stages were all "small": SegFormer saved 1.12x
# eager's bytes.)
SMALL = 32


def nbytes(v: TensorVar) -> int:
    return int(hint(v.numel())) * v.dtype.itemsize


def recomputed(read: Iterable[TensorVar], operands: Callable[[str], tuple | None],
               held: Callable[[str], bool], never_saved: Callable[[str], bool]) -> frozenset:
    """The names of the forward values the backward recomputes, the others it reads being saved.
    `read`: the values the backward's rules read.  `operands(name)`: the tensor operands of the op
    that makes a recomputable value, or None where it cannot be recomputed.  `held(name)`: the
    value is alive anyway (an input, an output): saving it costs nothing.  `never_saved(name)`: a
    recomputable value the cut must not go through: a checkpointed value, and a view (saving it
    would hold its base's storage, whose bytes the view's size does not tell: the base is saved
    instead, once for all its views)."""
    read = list(read)
    values: dict[str, TensorVar] = {}
    made_from: dict[str, tuple | None] = {}
    widest_use: dict[str, int] = {}       # name -> bytes of the widest value computed from it
    pending = deque(read)
    while pending:                        # the values the reads can be computed from
        v = pending.popleft()
        if v.name in values:
            continue
        values[v.name] = v
        made_from[v.name] = operands(v.name)
        for u in made_from[v.name] or ():
            widest_use[u.name] = max(widest_use.get(u.name, 0), nbytes(v))
            pending.append(u)
    graph = _Graph()
    nodes: dict[str, tuple[int, int]] = {}
    for name, v in values.items():
        small = nbytes(v) * SMALL <= widest_use.get(name, 0) and not never_saved(name)
        if small:
            made_from[name] = None
        into, out = graph.vertex(), graph.vertex()
        nodes[name] = (into, out)
        recompute = made_from[name] is not None
        cost = _NEARLY_FREE if held(name) or small else nbytes(v)
        graph.edge(into, out, _INFINITE if recompute and never_saved(name) else cost)
        if not recompute:
            graph.edge(graph.source, into, _INFINITE)
    for name, (into, _) in nodes.items():
        for u in made_from[name] or ():
            graph.edge(nodes[u.name][1], into, _INFINITE)
    for v in read:
        graph.edge(nodes[v.name][1], graph.sink, _INFINITE)
    reached = graph.cut()
    return frozenset(name for name, (into, _) in nodes.items()
                     if made_from[name] is not None and into not in reached)


class _Graph:
    """A flow network and its minimum s-t cut (Dinic's algorithm): the vertices the source still
    reaches once the maximum flow saturates the cut."""

    def __init__(self):
        self.head: list[list[int]] = [[], []]
        self.to: list[int] = []
        self.capacity: list[int] = []
        self.source, self.sink = 0, 1

    def vertex(self) -> int:
        self.head.append([])
        return len(self.head) - 1

    def edge(self, a: int, b: int, capacity: int) -> None:
        for x, y, c in ((a, b, capacity), (b, a, 0)):     # an edge and its residual twin
            self.head[x].append(len(self.to))
            self.to.append(y)
            self.capacity.append(c)

    def _levels(self) -> list[int] | None:
        level = [-1] * len(self.head)
        level[self.source] = 0
        queue = deque([self.source])
        while queue:
            x = queue.popleft()
            for e in self.head[x]:
                if self.capacity[e] > 0 and level[self.to[e]] < 0:
                    level[self.to[e]] = level[x] + 1
                    queue.append(self.to[e])
        return level if level[self.sink] >= 0 else None

    def _push(self, level: list[int], cursor: list[int]) -> int:
        """One augmenting path along the level graph (iteratively: traces are deep), its flow."""
        path: list[int] = []
        x = self.source
        while x != self.sink:
            edges = self.head[x]
            while cursor[x] < len(edges):
                e = edges[cursor[x]]
                if self.capacity[e] > 0 and level[self.to[e]] == level[x] + 1:
                    break
                cursor[x] += 1
            else:
                if not path:
                    return 0
                level[x] = -1                # a dead end: never entered again this phase
                e = path.pop()
                x = self.to[e ^ 1]
                cursor[x] += 1
                continue
            path.append(e)
            x = self.to[e]
        flow = min(self.capacity[e] for e in path)
        for e in path:
            self.capacity[e] -= flow
            self.capacity[e ^ 1] += flow
        return flow

    def cut(self) -> set[int]:
        """The vertices on the source's side of the minimum cut nearest the sink: of the cuts
        as cheap, the one that recomputes least."""
        while (level := self._levels()) is not None:
            cursor = [0] * len(self.head)
            while self._push(level, cursor):
                pass
        into: list[list[int]] = [[] for _ in self.head]      # residual edges, by their head
        for e, y in enumerate(self.to):
            if self.capacity[e] > 0:
                into[y].append(self.to[e ^ 1])
        reaches_sink, queue = {self.sink}, deque([self.sink])
        while queue:
            for x in into[queue.popleft()]:
                if x not in reaches_sink:
                    reaches_sink.add(x)
                    queue.append(x)
        return set(range(len(self.head))) - reaches_sink
