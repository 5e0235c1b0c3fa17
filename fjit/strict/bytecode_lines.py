"""Where, in the bytecode of the user code that ran, a name was written or drawn from.

The observer (strict/observer.py) learns *what* outside state a traced run changed by comparing
snapshots (strict/reach.py); the line it reports is found here, in the instructions of the code
objects the profile hook saw running.
"""
from __future__ import annotations

import dis
import sys

from fjit.strict.reach import EMPTY

_STORES = {"FJ104_global_assignment": ("STORE_GLOBAL", "DELETE_GLOBAL"),
           "FJ104_nonlocal_assignment": ("STORE_DEREF", "DELETE_DEREF")}
_OBJECT_WRITES = ("STORE_ATTR", "STORE_SUBSCR", "DELETE_ATTR", "DELETE_SUBSCR", "STORE_GLOBAL",
                  "STORE_DEREF")
_NAME_LOADS = ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_FAST", "LOAD_CLOSURE")


def line_starting(ins: dis.Instruction) -> int | None:
    """The source line `ins` is the first instruction of, or None.  Python 3.13 made
    `Instruction.starts_line` a bool and put the number in `line_number`."""
    if _STARTS_LINE_IS_BOOL:
        return ins.line_number if ins.starts_line else None
    return ins.starts_line


_STARTS_LINE_IS_BOOL = sys.version_info >= (3, 13)


def code_lines(code):
    """[(line, [instructions])] of a code object, one group per source line, in bytecode order."""
    groups, line = [], None
    for ins in dis.get_instructions(code):
        start = line_starting(ins)
        if start is not None and start != line:
            line = start
            groups.append((line, []))
        if groups:
            groups[-1][1].append(ins)
    return groups


def _aliases(code, name) -> set[str]:
    """Local names bound straight from `name` (`o = OBJ`, `rng = RNG`), plus `name` itself."""
    names = {name}
    previous = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("STORE_FAST", "STORE_DEREF") and previous is not None \
                and previous.opname in _NAME_LOADS and previous.argval in names:
            names.add(ins.argval)
        previous = ins
    return names


def line_of(entry: str, name: str, codes: list, ran_lines: set, attr=None, value=EMPTY):
    """Where, in user code that ran, `name` was assigned, written into, or drawn from.

    The bytecode is read one statement at a time (the instructions since the last store, pop or
    jump), so a write spread over several lines is found and reported at the line that names the
    object.  Each candidate is scored: a write through the name (or a local alias of it) beats a
    write of the same attribute through `self` in a method, which beats any write of that
    attribute; a statement storing a constant other than the value found after the run is the
    branch that did not run (`if c: G = 1 else: G = 2`); between equals, a line the profile hook
    saw running wins."""
    best, best_score = None, 0
    for code in codes:
        aliases = _aliases(code, name)
        statement: list = []          # (instruction, line) since the last statement boundary
        line = None
        for ins in dis.get_instructions(code):
            if line_starting(ins) is not None:
                line = line_starting(ins)
            statement.append((ins, line))
            hit, where = 0, line
            if entry in _STORES:
                hit = 3 if ins.opname in _STORES[entry] and ins.argval == name else 0
            elif entry == "draw":    # a method of a generator reached through `name`
                hit = 3 if ins.opname in _NAME_LOADS and ins.argval in aliases else 0
            elif ins.opname in _OBJECT_WRITES:
                roots = [(i.argval, ln) for i, ln in statement if i.opname in _NAME_LOADS]
                named = [ln for n, ln in roots if n in aliases]
                same_attr = attr is not None and ins.argval == attr
                if named and (ins.opname.endswith("SUBSCR") or attr is None or same_attr
                              or ins.argval in aliases):
                    hit, where = 3, named[0]
                elif same_attr and any(n == "self" for n, _ in roots):
                    hit = 2
                else:
                    hit = 1 if same_attr else 0
            if hit:
                if _stores_other_constant([i for i, _ in statement], value):
                    hit = 1
                score = hit * 2 + ((id(code), where) in ran_lines)
                if score > best_score:
                    best, best_score = (code.co_filename, where), score
            if ins.opname.startswith(_BOUNDARIES):
                statement = []
    return best


_BOUNDARIES = ("STORE_", "DELETE_", "POP_TOP", "RETURN_", "POP_JUMP", "JUMP", "RESUME")


def _stores_other_constant(instructions, value) -> bool:
    """Whether the line's statement stores a literal constant that is not `value` (a simple
    `G = 2`, `obj.a = 2` or `d[k] = 2`: CPython evaluates the stored value first)."""
    if value is EMPTY:
        return False
    first = next((i for i in instructions if i.opname not in ("NOP", "RESUME")), None)
    if first is None or first.opname != "LOAD_CONST":
        return False
    const = first.argval
    try:
        return type(const) is not type(value) or bool(const != value)
    except Exception:  # noqa: BLE001  (a value whose comparison raises tells nothing)
        return False
