"""Logging: fjit.recompiles names the key field that changed between a miss and the nearest cached
entry, with both values; fjit.traces logs every stage; fjit.kernels every kernel; FJIT_LOGS or
logging itself switches them on; fjit.explain gives the history."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fjit
from fjit.executors.c import executor as c_executor

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def recompiles(caplog):
    caplog.set_level(logging.DEBUG, logger="fjit.recompiles")
    return caplog


def _changes(jf):
    return [(c.where, c.what, c.old, c.new) for c in fjit.explain(jf).compilations[-1].changes]


def test_each_key_field_that_changed_is_named_with_old_and_new_value(recompiles):
    def f(x, n: int, s: float):
        return x * n + s
    jf = fjit.jit(f)
    x = torch.randn(2, 3)
    jf(x, 1, 0.5)
    assert fjit.explain(jf).compilations[-1].reason == "first call"
    jf(torch.randn(4, 3), 1, 0.5)
    assert _changes(jf) == [("argument 'x' (position 0)", "shape", (2, 3), (4, 3))]
    jf(x.double(), 1, 0.5)
    assert ("argument 'x' (position 0)", "dtype", torch.float32, torch.float64) in _changes(jf)
    jf(x, 2, 0.5)
    assert _changes(jf) == [("argument 'n' (position 1)", "value", 1, 2)]
    jf(x.t(), 1, 0.5)
    assert _changes(jf) == [("argument 'x' (position 0)", "shape", (2, 3), (3, 2)),
                            ("argument 'x' (position 0)", "stride", (3, 1), (1, 3))]
    jf(x.requires_grad_(), 1, 0.5)
    assert _changes(jf) == [("argument 'x' (position 0)", "requires_grad", False, True)]
    with torch.no_grad():
        jf(x, 1, 0.5)
    assert ("grad mode", "value", True, False) in _changes(jf)
    # the logger said the same, one record per compilation
    messages = [r.getMessage() for r in recompiles.records if r.name == "fjit.recompiles"]
    assert len(messages) == len(fjit.explain(jf).compilations) == 7
    assert "requires_grad False -> True" in messages[5]


def test_a_float_the_trace_specialized_on_is_named(recompiles):
    def f(x, s: float):
        return x * 2 if s > 0 else x
    jf = fjit.jit(f)
    x = torch.randn(3)
    jf(x, 1.0)
    jf(x, 2.0)        # specialized on s: a new value compiles
    assert _changes(jf) == [("argument 's' (position 1)", "specialized float value", 1.0, 2.0)]


def test_autocast_and_structure_changes_are_named():
    jf = fjit.jit(lambda xs: xs[0] + 1)
    x = torch.randn(3)
    jf([x])
    jf([x, x])
    assert fjit.explain(jf).compilations[-1].reason == \
        "the inputs' structure differs from all 1 cached entry"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        jf([x])
    assert [c.where for c in fjit.explain(jf).compilations[-1].changes] == ["autocast state"]


def test_explain_prints_the_history():
    jf = fjit.jit(lambda x: x + 1)
    jf(torch.randn(2))
    jf(torch.randn(3))
    text = str(fjit.explain(jf))
    assert "compiled 2 times" in text and "call 1: first call" in text
    assert "shape (2,) -> (3,)" in text


def test_traces_logger_logs_every_stage(caplog):
    caplog.set_level(logging.DEBUG, logger="fjit.traces")
    jf = fjit.jit(lambda x: torch.sin(x) * 2)
    jf(torch.randn(2))
    logged = [r.getMessage() for r in caplog.records if r.name == "fjit.traces"]
    assert len(logged) == len(fjit.last_traces(jf))
    assert str(fjit.last_traces(jf)[-1]) in logged[-1]


@pytest.mark.ckernels
@pytest.mark.skipif(c_executor.compiler() is None, reason="no C compiler on PATH")
def test_kernels_logger_logs_builds_and_cache_hits(caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("FJIT_C_KERNELS", "sync")
    monkeypatch.setenv("FJIT_CACHE_DIR", str(tmp_path))
    caplog.set_level(logging.DEBUG, logger="fjit.kernels")
    f = lambda x: (x * 3.25 + 1.5).relu()  # noqa: E731
    fjit.jit(f, executors=("c", "torch"))(torch.randn(4))
    fjit.jit(f, executors=("c", "torch"))(torch.randn(4))
    logged = [r.getMessage() for r in caplog.records if r.name == "fjit.kernels"]
    assert any(" built in " in m and "void fjit_c_" in m for m in logged), logged
    assert any("cache hit" in m for m in logged), logged


def test_nothing_is_logged_unless_asked(caplog):
    caplog.set_level(logging.WARNING)
    jf = fjit.jit(lambda x: x + 1)
    jf(torch.randn(2))
    jf(torch.randn(3))
    assert not [r for r in caplog.records if r.name.startswith("fjit")]


def test_fjit_logs_switches_loggers_on_to_stderr():
    env = dict(os.environ, PYTHONPATH=str(ROOT), FJIT_LOGS="recompiles", FJIT_C_KERNELS="0")
    code = ("import torch, fjit\n"
            "f = fjit.jit(lambda x: x + 1)\n"
            "f(torch.randn(2)); f(torch.randn(5))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[fjit.recompiles]" in out.stderr and "shape (2,) -> (5,)" in out.stderr, out.stderr
    assert "[fjit.traces]" not in out.stderr


def test_a_bad_fjit_logs_value_warns_instead_of_breaking_the_import(monkeypatch):
    from fjit import logs
    monkeypatch.setenv("FJIT_LOGS", "recompiles,everything")
    with pytest.warns(RuntimeWarning, match="FJIT_LOGS='everything' is not one of"):
        logs.enable_from_environment()
