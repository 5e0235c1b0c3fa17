"""The guards of a symbolic program (core/symbolic.py), as a check a call runs on its flat inputs
before the program: compiled once from the conditions the trace recorded on its symbols, with
the layout check of symbols that may be 1 cached per pattern of ones."""
from __future__ import annotations

import math
from typing import Callable

import torch

# What torch's Python printer of sympy may name in a condition (torch.sym_float, math.floor, ...)
GUARD_NAMES = {"torch": torch, "math": math}


class Guards:
    """A compiled check of the guards on a call's flat inputs `L`: `conditions` are Python
    expressions of `L` (fjit's own text: sizes, integers and operators), `shown` the same
    conditions as the program prints them (of s0, s1, ... and input names).

    `ones` are the symbols that may be 1 ((flat position, dim, name)): a call with some of them at
    1 passes only where `at_one(leaves)` (set by the compile: the program's layouts replayed at
    the call's sizes) found no layout that differs, checked once per pattern of ones."""

    def __init__(self, conditions: list[str], shown: list[str], ones: list | None = None):
        kept = dict.fromkeys(zip(conditions, shown))        # each condition once, in order
        conditions, shown = [c for c, _ in kept], [s for _, s in kept]
        self.conditions, self.shown = conditions, shown
        source = "lambda L: " + (" and ".join(f"({c})" for c in conditions) if conditions else "True")
        self.check: Callable[[list], bool] = eval(source, GUARD_NAMES)      # noqa: S307 - our own text
        self.ones = ones or []
        self.at_one: Callable[[list], str | None] | None = None
        self._at_one: dict[tuple, str | None] = {}        # pattern of ones -> why it differs, or None

    def __call__(self, leaves: list) -> bool:
        try:
            if not self.check(leaves):
                return False
        except (IndexError, AttributeError, ZeroDivisionError):    # another rank, a zero divisor
            return False
        return not self.ones or self._differs_at_one(leaves) is None

    def _differs_at_one(self, leaves: list) -> str | None:
        """Why the program's layouts differ at this call's pattern of ones (None: they do not, or
        no symbol is 1)."""
        pattern = tuple(leaves[p].shape[d] == 1 for p, d, _ in self.ones)
        if not any(pattern):
            return None
        if pattern not in self._at_one:
            try:
                why = "no layout check" if self.at_one is None else self.at_one(leaves)
            except Exception as e:      # noqa: BLE001 -- a check that cannot run admits nothing
                why = f"the layout check failed ({type(e).__name__}: {e})"
            if why is not None:
                at = " and ".join(f"{n} == 1" for (_, _, n), one in zip(self.ones, pattern) if one)
                why = f"at {at}, {why}"
            self._at_one[pattern] = why
        return self._at_one[pattern]

    def failed(self, leaves: list) -> str:
        """The first condition `leaves` fails, as the program prints it (for fjit.explain)."""
        for condition, shown in zip(self.conditions, self.shown):
            try:
                if eval("lambda L: " + condition, GUARD_NAMES)(leaves):     # noqa: S307
                    continue
            except (IndexError, AttributeError, ZeroDivisionError):
                pass
            return shown
        if self.ones:
            why = self._differs_at_one(leaves)
            if why is not None:
                return f"of layouts ({why})"
        return "no guard"
