"""The coverage table: for every prim, which parts its block has (decomposition, VJP, C and Triton
expressions, ATen overloads) and, for each part it lacks, the block's note saying why.  Printed by
`python -m fjit.core.prims`; tests/core/test_prims.py fails on a missing part without a note."""
from __future__ import annotations

from fjit.core.prims import ROWS, Block, Kind, Prim

# Kinds kernels never take, and why: the C and Triton parts of their blocks need no note.
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
    """part -> what the block has for it (a short text), or None."""
    decomposed = list(block.torch_names) + _names(block.also) + [
        n for fns, _ in block.decompositions for n in _names(fns)]
    triton = ("common" if block.triton else None) if not (
        block.triton_interpreted or block.triton_compiled) else "/".join(
        k for k, v in (("interpreted", block.triton_interpreted or block.triton),
                       ("compiled", block.triton_compiled or block.triton)) if v)
    if block.triton_f32:
        triton = f"{triton}, f32"
    return {
        "decomposition": ", ".join(dict.fromkeys(decomposed)) or None,
        "vjp": "rule" if block.vjp else "nondiff" if block.nondiff else None,
        "c": (block.c and ("vector + libm" if block.c_vector else "expression")) or None,
        "triton": triton,
        "aten": ", ".join(block.aten) or None,
    }


def _complete(block: Block, part: str, has) -> bool:
    if part == "triton":
        return bool(block.triton or (block.triton_interpreted and block.triton_compiled))
    return has is not None


def rows() -> list[tuple[Prim, dict]]:
    """(prim, {part: (has, why missing)}) for every prim."""
    out = []
    for p, block in ROWS.items():
        has = _has(block)
        row = {}
        for part in has:
            why = block.notes.get(part)
            if why is None and part in ("c", "triton") and block.kind in _NOT_KERNEL:
                why = _NOT_KERNEL[block.kind]
            row[part] = (has[part], None if _complete(block, part, has[part]) else why)
        out.append((p, row))
    return out


def unexplained() -> list[str]:
    """'PRIM: part' for each part a prim lacks with no note saying why."""
    return [f"{p.name}: {part}" for p, row in rows() for part, (has, why) in row.items()
            if not _complete(p.block, part, has) and not why]


def stale_notes() -> list[str]:
    """'PRIM: part' for each note on a part the block has in full (a note that no longer holds)."""
    return [f"{p.name}: {part}" for p, block in ROWS.items() for part in block.notes
            if _complete(block, part, _has(block)[part])]


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
