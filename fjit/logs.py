"""fjit's logging: three standard `logging` loggers, and the history of one function's compilations.

- `fjit.recompiles`: why a call compiled: the first call, or the key field that changed between
  the call and the nearest cached entry, with the old and the new value;
- `fjit.traces`: every stage of every compilation, as the Python it prints as;
- `fjit.kernels`: every generated kernel: its source, its build time, and cache hits.

They log at DEBUG, so nothing shows unless asked for: `FJIT_LOGS=recompiles,kernels` (or `all`)
sets those loggers to DEBUG and gives the `fjit` logger one stderr handler (as TORCH_LOGS does),
or the application configures them as any other logger (`logging.getLogger("fjit.recompiles")
.setLevel(logging.DEBUG)` with a handler, or `logging.basicConfig(level=logging.DEBUG)`).
Messages are formatted only when a logger is on: a cached call never reaches this module.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import warnings

import fjit.config as config
from fjit.config import LogTopic

LOGGERS = {topic: logging.getLogger(f"fjit.{topic.value}") for topic in LogTopic}
recompiles = LOGGERS[LogTopic.RECOMPILES]
traces = LOGGERS[LogTopic.TRACES]
kernels = LOGGERS[LogTopic.KERNELS]

HISTORY_SIZE = 64        # compilations remembered per function, for explain()


@dataclasses.dataclass(frozen=True)
class Change:
    """One field of the cache key that differs from the nearest cached entry's."""
    where: str          # "argument 'x' (position 0)", "grad mode", ...
    what: str           # "shape", "dtype", "value", "container structure", ...
    old: object
    new: object

    def __str__(self) -> str:
        return f"{self.where}: {self.what} {self.old!r} -> {self.new!r}"


@dataclasses.dataclass(frozen=True)
class Compilation:
    """One compilation of a jitted function and why it happened."""
    call: int                   # which call of the function (1-based) compiled
    reason: str                 # "first call", "N key fields changed", ...
    changes: tuple = ()         # Change records against the nearest cached entry
    outcome: str = ""           # what was compiled, where it was not one program per shape

    def __str__(self) -> str:
        head = f"call {self.call}: {self.reason}"
        tail = [f"    -> {self.outcome}"] if self.outcome else []
        return "\n".join([head] + [f"    {c}" for c in self.changes] + tail)


class History:
    """The last HISTORY_SIZE compilations of one function."""

    def __init__(self):
        self.compilations: collections.deque = collections.deque(maxlen=HISTORY_SIZE)

    def add(self, name: str, compilation: Compilation) -> None:
        self.compilations.append(compilation)
        if recompiles.isEnabledFor(logging.DEBUG):
            recompiles.debug("%s compiled on %s", name, compilation)


class Explanation:
    """What fjit.explain returns: a function's compilations, readable as text."""

    def __init__(self, name: str, compilations: list[Compilation], info):
        self.name = name
        self.compilations = compilations
        self.info = info

    def __str__(self) -> str:
        n = len(self.compilations)
        lines = [f"fjit: '{self.name}' compiled {n} time{'s' if n != 1 else ''} "
                 f"({self.info.hits} cache hits, {self.info.entries} programs cached)"]
        lines += [f"  {c}".replace("\n", "\n  ") for c in self.compilations]
        return "\n".join(lines)

    __repr__ = __str__


def log_traces(name: str, stages: list) -> None:
    if traces.isEnabledFor(logging.DEBUG):
        for t in stages:
            traces.debug("%s, stage %s:\n%s", name, t.stage, t)


_HANDLER: list = []


def enable(topics, stream=None) -> None:
    """Turn the given topics' loggers on, with one handler on the `fjit` logger (to stderr)."""
    for topic in topics:
        LOGGERS[config.parse(LogTopic, topic, "fjit: FJIT_LOGS")].setLevel(logging.DEBUG)
    if topics and not _HANDLER:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        root = logging.getLogger("fjit")
        root.addHandler(handler)
        root.propagate = False        # one copy of each message, not one more per root handler
        _HANDLER.append(handler)


def enable_from_environment() -> None:
    """FJIT_LOGS, read when fjit is imported; a bad value warns rather than breaking the import."""
    try:
        enable(config.log_topics())
    except ValueError as e:
        warnings.warn(str(e), RuntimeWarning, stacklevel=2)
