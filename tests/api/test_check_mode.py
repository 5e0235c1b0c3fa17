"""Check mode (FJIT_CHECK=1): every torch fallback's real output metadata is checked against the
metadata the trace recorded from meta tensors.  (The random-program slice that runs under it is
tests/ops/test_properties.py::test_check_mode_random_programs.)"""
import torch
import torch.nn.functional as F
import pytest

import fjit
from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar
from fjit.core.trace import Trace
from fjit.executors import torch_executor

CPU = torch.device("cpu")


def _conv_trace(recorded_strides):
    """computation(x, w) = F.conv2d(x, w) as a fallback whose output strides are `recorded`."""
    x = TensorVar("x", (1, 3, 5, 5), torch.float32, CPU, (75, 1, 15, 3))
    w = TensorVar("w", (4, 3, 3, 3), torch.float32, CPU, (27, 9, 3, 1))
    out = TensorVar("t0", (1, 4, 3, 3), torch.float32, CPU, recorded_strides)
    conv = Symbol("torch.conv2d", torch.conv2d, frozenset({Tag.FALLBACK}))
    return Trace("conv", [x, w], [BoundSymbol(conv, (x, w), {}, out)], out), x, w


def _inputs():
    x = torch.randn(1, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    return x, torch.randn(4, 3, 3, 3)


def test_fallback_metadata_mismatch_raises_naming_op_and_both(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    trace, _, _ = _conv_trace((36, 9, 3, 1))       # contiguous; real output is channels_last
    program = torch_executor.compile_trace(trace)
    with pytest.raises(AssertionError, match=r"torch\.conv2d output t0: recorded .*strides "
                                             r"\(36, 9, 3, 1\); real .*strides \(36, 1, 12, 4\)"):
        program(*_inputs())


def test_fallback_metadata_match_passes_and_normal_mode_adds_nothing(monkeypatch):
    trace, _, _ = _conv_trace((36, 1, 12, 4))
    monkeypatch.setenv("FJIT_CHECK", "1")
    x, w = _inputs()
    torch.testing.assert_close(torch_executor.compile_trace(trace)(x, w), F.conv2d(x, w))
    assert "# check mode: t0 has the recorded metadata" in str(torch_executor.with_metadata_checks(trace))
    monkeypatch.setenv("FJIT_CHECK", "0")
    wrong, _, _ = _conv_trace((36, 9, 3, 1))
    torch_executor.compile_trace(wrong)(x, w)       # no check in the normal program


def test_check_traces_checks_every_stage(monkeypatch):
    trace, _, _ = _conv_trace((36, 9, 3, 1))
    with pytest.raises(AssertionError, match="torch fallback torch.conv2d"):
        fjit.pipeline.check_traces([trace, trace.with_stage("later")], list(_inputs()))


def test_check_mode_on_a_jitted_function(monkeypatch):
    """A fallback whose meta strides are right passes check mode end to end."""
    monkeypatch.setenv("FJIT_CHECK", "1")

    def f(x):
        return F.max_pool2d(x, 2) * 2 + 1

    x = torch.randn(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)
    jf = fjit.jit(f, executors=("torch",))
    torch.testing.assert_close(jf(x), f(x))
    assert any(b.sym.has(Tag.FALLBACK) for b in fjit.last_traces(jf)[-1].bsyms)
