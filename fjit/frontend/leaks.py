"""A proxy never outlives its trace: find the tracing proxies a traced run left in outside state,
and put back what they replaced.

The observer reports such a write (a global assignment, a mutated object, FJ104); this module
undoes it, so that the user's state holds no proxy once the trace ends, whether the trace
raised or not.  `fjit.jit(module)` uses the same undo on the module's own attributes.
"""
from __future__ import annotations

import types

import torch

from fjit.frontend.proxies import NumberProxy, TensorProxy
from fjit.strict.reach import EMPTY, Reach, cell_value, snapshot


def undo_reach_leaks(reach: Reach) -> None:
    """Put back every piece of the state in `reach` that the traced run left holding a tracing
    proxy (the observer calls this once the run ends; the reports are its, from `reach.changes()`)."""
    for g, before in reach.globals_dicts.values():
        undo_proxy_writes(g, before)
    for _, cell, before in reach.cells:
        if holds_proxy(cell_value(cell)):
            if before is EMPTY:
                del cell.cell_contents
            else:
                cell.cell_contents = before
    for _, _, obj, before, _ in reach.objects:
        undo_proxy_writes(obj, before)


def undo_proxy_writes(obj, before) -> bool:
    """Restore the entries of `obj` (a container, a class, an object's attributes, a globals
    dict) that now hold a tracing proxy to their values in `before` (a `snapshot` of `obj`);
    whether anything was."""
    now = snapshot(obj)
    if isinstance(before, dict):
        bad = [k for k in now if now[k] is not before.get(k, EMPTY) and holds_proxy(now[k])]
        target = obj if isinstance(obj, dict) else None
        for k in bad:
            old = before.get(k, EMPTY)
            if target is not None:
                if old is EMPTY:
                    del target[k]
                else:
                    target[k] = old
            elif old is EMPTY:
                delattr(obj, k) if isinstance(obj, type) else vars(obj).pop(k, None)
            elif isinstance(obj, type):
                setattr(obj, k, old)
            else:
                vars(obj)[k] = old
        return bool(bad)
    if any(holds_proxy(x) for x in now):
        if isinstance(obj, (set, bytearray)):
            obj.clear()
            obj.update(before) if isinstance(obj, set) else obj.extend(before)
        else:
            obj[:] = before
        return True
    return False


def holds_proxy(value) -> bool:
    """Whether a tracing proxy is reachable from `value` through containers and the attributes
    of plain objects (bounded: a trace-time check)."""
    return bool(proxies_in(value, first_only=True))


def proxies_in(value, first_only: bool = False, budget: int = 4096) -> list:
    """The tracing proxies reachable from `value` (see holds_proxy)."""
    found, stack, seen = [], [value], set()
    while stack and budget > 0:
        v = stack.pop()
        budget -= 1
        if isinstance(v, (TensorProxy, NumberProxy)):
            found.append(v)
            if first_only:
                break
            continue
        if id(v) in seen or isinstance(v, (str, bytes, int, float, type(None), torch.Tensor, type,
                                           types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(v))
        if isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
        elif isinstance(v, dict):
            stack.extend(v.values())
        else:
            d = getattr(v, "__dict__", None)
            if isinstance(d, dict):
                stack.extend(d.values())
    return found
