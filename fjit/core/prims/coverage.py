"""The coverage table: for every prim, which parts its block has (decomposition, VJP, a form in each
registered kernel language, ATen overloads) and, for each part it lacks, the block's note saying
why.  Printed by `python -m fjit.executors`; tests/core/test_prims.py fails on a missing part
without a note, and on a block that is wrong where nothing would say so at run time: a torch name
that names no torch callable, a kernel part no registered language reads, a form a language
finds fault with (C: a library call whose cost is not stated)."""
from __future__ import annotations

from fjit.core.prims import LANGUAGES, ROWS, Block, Kind, Prim, torch_callables
from fjit.core.prims.registry import known_parts

# Kinds kernels never take, and why: their blocks need no note for any kernel language.
_NOT_KERNEL = {
    Kind.CAST: "the generators convert in code (no expression)",
    Kind.SHAPE: "a view: kernels read it through strides, torch makes it",
    Kind.DATA: "moves data: kernels take elementwise and reduction prims only",
    Kind.FACTORY: "a factory: kernels take elementwise and reduction prims only",
    Kind.RANDOM: "a random draw: torch draws it, so eager's numbers come out",
    Kind.OPAQUE: "torch's own kernel runs it",
}


def _names(fns) -> list[str]:
    return [getattr(f, "__qualname__", None) or getattr(f, "__name__", repr(f)) for f in fns]


def _has(block: Block) -> dict:
    """part -> what the block has for it (a short text), or None; a registered language's name is
    a part."""
    decomposed = list(block.torch_names) + _names(block.also) + [
        n for fns, _ in block.decompositions for n in _names(fns)]
    has = {"decomposition": ", ".join(dict.fromkeys(decomposed)) or None,
           "vjp": "rule" if block.vjp else "nondiff" if block.nondiff else None}
    for name, language in LANGUAGES.items():
        has[name] = language.describe(block)
    has["aten"] = ", ".join(block.aten) or None
    return has


def _complete(block: Block, part: str, has) -> bool:
    if part in LANGUAGES:
        return LANGUAGES[part].covers(block)
    return has is not None


def rows() -> list[tuple[Prim, dict]]:
    """(prim, {part: (has, why missing)}) for every prim."""
    out = []
    for p, block in ROWS.items():
        has = _has(block)
        row = {}
        for part in has:
            why = block.notes.get(part)
            if why is None and part in LANGUAGES and block.kind in _NOT_KERNEL:
                why = _NOT_KERNEL[block.kind]
            row[part] = (has[part], None if _complete(block, part, has[part]) else why)
        out.append((p, row))
    return out


def gaps(language: str) -> list[str]:
    """The prims whose kernels `language` cannot compute, by name (kinds no kernel takes left out)."""
    lang = LANGUAGES[language]
    return [p.name for p, b in ROWS.items() if b.kind not in _NOT_KERNEL and not lang.covers(b)]


def unexplained() -> list[str]:
    """'PRIM: part' for each part a prim lacks with no note saying why, and 'PRIM: what' for
    each fault: a torch name naming no torch callable, a kernel part no registered language
    reads, a form a language finds fault with."""
    missing = [f"{p.name}: {part}" for p, row in rows() for part, (has, why) in row.items()
               if not _complete(p.block, part, has) and not why]
    parts = known_parts()
    for p, block in ROWS.items():
        missing += [f"{p.name}: torch name {n!r} is neither torch.{n} nor Tensor.{n}"
                    for n in block.torch_names if not torch_callables(n)]
        missing += [f"{p.name}: kernel part {part!r} is read by no registered language"
                    for part in block.kernels if part not in parts]
        missing += [f"{p.name}: {name}: {problem}" for name, language in LANGUAGES.items()
                    for problem in language.problems(block)]
    return missing


def stale_notes() -> list[str]:
    """'PRIM: part' for each note on a part the block has in full (a note that no longer holds)."""
    return [f"{p.name}: {part}" for p, block in ROWS.items() for part in block.notes
            if part in _has(block) and _complete(block, part, _has(block)[part])]


def table() -> str:
    lines = []
    for p, row in rows():
        lines.append(f"{p.name} ({p.block.kind.value}, {p.block.domain.value})")
        for part, (has, why) in row.items():
            text = has or "-"
            if why:
                text = f"{text} ({why})"
            lines.append(f"    {part:<14} {text}")
    return "\n".join(lines)
