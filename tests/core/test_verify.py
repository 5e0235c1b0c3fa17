"""The structural verifier: every rule it states can fail, on a trace broken the way a buggy pass
would break it; and every stage of real compilations passes it (tests/ops/test_ops.py runs it on
every stage of every op sample, and FJIT_CHECK=1 runs it after every pass)."""
import pytest
import torch

import fjit
from fjit.core.ir import TensorVar
from fjit.passes.verify import TraceVerificationError, verify


def _stages(fn, *args):
    jf = fjit.jit(fn)
    jf(*args)
    return fjit.last_traces(jf)


def _f(x, y):
    return torch.softmax(x * y + 1, dim=-1).sum(0)


def test_real_stages_verify():
    for t in _stages(_f, torch.randn(3, 4), torch.randn(4)):
        assert verify(t) is t


def test_use_before_definition_is_caught():
    t = _stages(_f, torch.randn(3, 4), torch.randn(4))[1]
    broken = t.with_stage("broken", t.bsyms[::-1])
    with pytest.raises(TraceVerificationError, match="read before it is defined"):
        verify(broken)


def test_a_value_defined_twice_is_caught():
    t = _stages(_f, torch.randn(3, 4), torch.randn(4))[1]
    broken = t.with_stage("broken", [t.bsyms[0], t.bsyms[0]] + t.bsyms[1:])
    with pytest.raises(TraceVerificationError, match="defined twice"):
        verify(broken)


def test_an_undefined_output_is_caught():
    t = _stages(_f, torch.randn(3, 4), torch.randn(4))[1]
    with pytest.raises(TraceVerificationError, match="never defined"):
        verify(t.with_stage("broken", t.bsyms[:-1]))


def test_a_prim_output_against_its_rule_is_caught():
    t = _stages(lambda x: x.exp(), torch.randn(3, 4))[1]
    (b,) = t.bsyms
    (sub,) = b.subsymbols
    out = sub.output
    wrong = TensorVar(out.name, out.shape, torch.float64, out.device, out.strides)
    broken = t.with_stage("broken", [b.replace(subsymbols=(sub.replace(output=wrong),))])
    with pytest.raises(TraceVerificationError, match="its rule gives"):
        verify(broken)


def test_check_mode_verifies_every_stage(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    calls = []
    import fjit.pipeline
    real = fjit.pipeline.verify
    monkeypatch.setattr(fjit.pipeline, "verify", lambda t: calls.append(t.stage) or real(t))
    jf = fjit.jit(_f)
    jf(torch.randn(3, 4), torch.randn(4))
    assert calls == [t.stage for t in fjit.last_traces(jf)]
