"""The prim blocks (fjit/core/prims/): every prim has each part (decomposition, VJP, C and Triton
expressions, ATen overloads) or a note saying why not, the tables the rest of fjit reads are the
blocks', and the Prim registry behaves as the enum it replaced."""
from __future__ import annotations

import ast
import pathlib
import pickle
import subprocess
import sys

import pytest
import torch

import fjit  # (loads the frontend, which registers the recorder)
from fjit.core.prims import ROWS, Kind, Prim, coverage
from fjit.core.prims.registry import define

CORE = pathlib.Path(fjit.__file__).parent / "core"


def test_every_missing_part_has_a_note():
    assert coverage.unexplained() == []


def test_no_note_on_a_part_a_block_has():
    assert coverage.stale_notes() == []


def test_the_coverage_table_lists_every_prim_and_prints_from_the_command_line():
    table = coverage.table()
    for p in Prim:
        assert f"\n{p.name} (" in f"\n{table}"
    out = subprocess.run([sys.executable, "-m", "fjit.executors"], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == table.strip()


def test_the_known_gaps_are_recorded():
    notes = {p: ROWS[p].notes for p in Prim}
    for p in (Prim.ERFC, Prim.PROD, Prim.SDPA):
        assert ROWS[p].vjp is None and not ROWS[p].nondiff and "torch autograd" in notes[p]["vjp"]
    for p in (Prim.FLOOR_DIVIDE, Prim.TRUNC_DIVIDE, Prim.SHIFT_LEFT, Prim.SHIFT_RIGHT):
        assert p.name in coverage.gaps("c") and notes[p]["c"]
    for p in (Prim.ASIN, Prim.ACOS, Prim.ATAN, Prim.POW, Prim.REMAINDER, Prim.FMOD, Prim.ATAN2):
        assert p.name in coverage.gaps("triton") and notes[p]["triton"]


def test_the_tables_are_derived_from_the_blocks():
    from fjit.autodiff.rules import NONDIFF, VJP
    from fjit.dynamo.aten import ATEN_TO_TORCH
    from fjit.executors.c import language
    from fjit.executors.triton import language as triton_language
    from fjit.frontend.record import DECOMPOSITIONS
    for p, b in ROWS.items():
        assert (p in VJP) == (b.vjp is not None) and (p in NONDIFF) == b.nondiff
        general = b.kernels.get("c") or b.kernels.get("expr")
        assert language.C.exprs.get(p) == (general.expr if general else None)
        if "c_vector" in b.kernels:
            assert language.PARTS.form(p, torch.float32) is b.kernels["c_vector"]
        common = b.kernels.get("triton") or b.kernels.get("expr")
        for interpreted, table in ((True, triton_language.INTERPRETED), (False, triton_language.COMPILED)):
            own = b.kernels.get("triton_interpreted" if interpreted else "triton_compiled") or common
            assert table.get(p) == (own.expr if own else None)
        for name in b.aten:
            op, overload = name.split(".")
            assert getattr(getattr(__import__("torch").ops.aten, op), overload) in ATEN_TO_TORCH
        for fns, decomposition in b.decompositions:
            assert all(DECOMPOSITIONS[f] is decomposition for f in fns)


def test_core_imports_nothing_above_it():
    """core/ is the IR's vocabulary: no frontend, ops, autodiff or executors (the frontend
    registers how `apply` records)."""
    above = ("fjit.frontend", "fjit.decompositions", "fjit.autodiff", "fjit.executors", "fjit.dynamo",
             "fjit.passes", "fjit.api")
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.startswith(above)], path


def test_prim_registry_behaves_as_an_enum():
    assert Prim.EXP.value == "exp" and Prim.EXP.name == "EXP" and Prim.SHIFT_LEFT.value == "bitwise_left_shift"
    assert len(Prim) == len(ROWS) == len(set(Prim)) and list(Prim) == list(ROWS)
    assert {Prim.EXP: 1}[Prim.EXP] == 1 and Prim.EXP in set(Prim)
    assert pickle.loads(pickle.dumps(Prim.EXP)) is Prim.EXP
    assert all(p.block.prim is p and p.block.symbol.qualname == f"prims.{p.value}" for p in Prim)
    with pytest.raises(ValueError, match="defined twice"):
        define("EXP", Kind.UNARY)
