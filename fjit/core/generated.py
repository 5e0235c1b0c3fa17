"""Generated Python source made into functions: `compile_function` executes a generated source and
returns its function, and a function whose frame is large runs as a `Resumable`, in a generator's
heap frame.  Programs (core/trace.py), a module's fast path (frontend/inputs.py) and its state
reader (module_layout.py) are made here.
"""
from __future__ import annotations

import ast
from typing import Callable


# A generated function whose frame holds at least this many slots (locals and stack, 8 bytes
# each) runs as a Resumable.  CPython (3.11+) keeps frames in 16 KiB chunks of a per-thread stack:
# a chunk is mmap'ed when a frame does not fit in the current one, and munmap'ed when that frame
# returns, so a frame that crosses a chunk's end maps and unmaps memory on every call (with an
# inter-processor interrupt to flush the other threads' TLBs).  A joint program's frame is 9-14
# KiB (1100+ locals), a big module's fast path and state reader 2-5 KiB: whether a step paid that
# depended on the caller's stack depth.  LeViT's step read 19.5 ms called from a module's top
# level and 24.3 ms from inside a function (10 chunks a step), eager's 21.5 ms.  (The smaller
# frames a program calls can cross a chunk's end too: executors/c/frame_stack.py caches chunks,
# started by the C executor.)
RESUMABLE_MIN_SLOTS = 256


def compile_function(src: str, name: str, ns: dict, filename: str) -> tuple[Callable, str]:
    """(function `name` of the generated source `src` executed in `ns`, which keeps the name; the
    source executed): a Resumable where its frame holds RESUMABLE_MIN_SLOTS slots or more and its
    body has no loop."""
    exec(compile(src, filename, "exec"), ns)
    code = ns[name].__code__
    slots = code.co_nlocals + code.co_stacksize + len(code.co_cellvars) + len(code.co_freevars)
    resumable = _resumable_source(src, name, code) if slots >= RESUMABLE_MIN_SLOTS else None
    if resumable is not None:
        src = resumable
        exec(compile(src, filename, "exec"), ns)
        ns[name] = Resumable(ns[name])
    return ns[name], src


def _resumable_source(src: str, name: str, code) -> str | None:
    """`src` with function `name` as a generator function that loops: it binds the arguments sent
    to it, runs the body (each `return x` setting the result and leaving a one-pass loop), sets
    every local to None (a waiting frame must not keep values alive) and yields the result in a
    one-item list.  None where the body has a loop of its own (a `break` would leave it)."""
    lines = src.split("\n")
    start = next(k for k, line in enumerate(lines) if line.startswith(f"def {name}("))
    end = next((k for k in range(start + 1, len(lines)) if lines[k][:1] not in ("", " ")), len(lines))
    params = lines[start][len(f"def {name}("):lines[start].rindex("):")]
    body = [line for line in lines[start + 1:end] if line.strip()]
    if any(line.lstrip().startswith(("for ", "while ", "async ")) for line in body):
        return None
    base = len(body[0]) - len(body[0].lstrip())
    inner = []
    for line in body:
        text, pad = line.lstrip(), " " * (12 + len(line) - len(line.lstrip()) - base)
        if text == "return" or text.startswith(("return ", "return(")):
            inner += [f"{pad}_result = {text[len('return'):].strip() or 'None'}", f"{pad}break"]
        else:
            inner.append(pad + text)
    star = [p.strip()[1:] for p in params.split(",") if p.strip().startswith("*")]
    bind = f"{params[1:]} = _args" if params.startswith("*") else f"({params},) = _args" if params else ""
    if star and not params.startswith("*"):      # a starred target binds a list
        bind += f"; {star[0]} = tuple({star[0]})"
    names = [n for n in _bound_at_end("\n".join(lines[start:end]), code) if n not in ("_args", "_result")]
    loop = ["def " + name + "():", "    _args = yield", "    while True:",
            *([f"        {bind}"] if bind else []), "        _args = _result = None", "        while True:",
            *inner, "            break", "        _result = [_result]",
            *([f"        {' = '.join(names)} = None"] if names else []), "        _args = yield _result"]
    return "\n".join(lines[:start] + loop + lines[end:])


def _bound_at_end(function_src: str, code) -> list:
    """The locals a function may still hold where it returns: for a straight-line body (a
    program: assignments, deletions, calls, a final return), those assigned and not deleted since;
    otherwise every local (setting 1000 locals to None costs 2 us a call)."""
    body = ast.parse(function_src).body[0].body
    if not all(isinstance(s, (ast.Assign, ast.Delete, ast.Expr, ast.Return)) for s in body):
        return list(code.co_varnames)
    bound = dict.fromkeys(code.co_varnames[:code.co_argcount + code.co_kwonlyargcount
                                           + bool(code.co_flags & 0x04)])
    def names(target) -> list:       # the names a target binds (not x in x[i] = ...)
        if isinstance(target, ast.Name):
            return [target.id]
        if isinstance(target, ast.Starred):
            return names(target.value)
        return [n for t in getattr(target, "elts", ()) for n in names(t)]
    for s in body:
        for target in s.targets if isinstance(s, (ast.Assign, ast.Delete)) else ():
            for n in names(target):
                if isinstance(s, ast.Delete):
                    bound.pop(n, None)
                else:
                    bound[n] = None
    return list(bound)


class Resumable:
    """A generated function run in a generator's frame, which lives on the heap: a call resumes a
    generator that waits for its next arguments (a generator's frame is not on CPython's frame
    stack, so no chunk is mapped per call: see RESUMABLE_MIN_SLOTS).  A call while every waiting
    generator is busy (a reentrant or concurrent one) starts another; one that raised is dropped."""

    def __init__(self, make):
        self._make = make
        self._waiting: list = []

    def __call__(self, *args):
        try:
            gen = self._waiting.pop()
        except IndexError:
            gen = self._make()
            next(gen)
        box = gen.send(args)
        self._waiting.append(gen)
        out = box[0]
        box.clear()
        return out
