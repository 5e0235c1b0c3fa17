"""No program runs unverified (passes/verify.py before torch_executor.compile_trace makes it a
function): a stage that a buggy pass broke is never run.  Each path that makes a program is given
a broken one, the way a pass would break it (a line that defines a value dropped): the program
with kernels, the joint forward/backward program, the forms of the measured choice and the
backend's pieces.  Without check mode fjit runs the form that verified, and says why in the stage
line and on the fjit.recompiles log; with check mode the failure is an error naming the stage, so
the pass, that broke the rule.  Never a NameError from the generated source."""
from __future__ import annotations

import logging

import pytest
import torch

import fjit
import fjit.autodiff.joint as joint
import fjit.executors.c.executor as c_executor
from fjit.core.ir import Var, flatten_values
from fjit.passes.verify import TraceVerificationError


def _without_a_definition(trace):
    """`trace` with the first line dropped whose output a later line or the output reads."""
    read = {v.name for b in trace.bsyms for v in b.inputs()}
    read |= {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    for k, b in enumerate(trace.bsyms):
        if b.sym.qualname != "del" and any(v.name in read for v in b.outputs()):
            return trace.with_stage(trace.stage, trace.bsyms[:k] + trace.bsyms[k + 1:])
    raise AssertionError("nothing to drop")


def _mlp(x, w1, w2):
    h = torch.nn.functional.gelu(x @ w1, approximate="tanh")
    return (torch.tanh(h @ w2) * 2 + 1).square().mean()


def _inputs(requires_grad=True):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g, requires_grad=requires_grad)
            for shape in ((8, 16), (16, 32), (32, 4))]


@pytest.fixture
def broken_joint_forward(monkeypatch):
    """The joint builder (autodiff/joint.py) returns a forward that misses a definition."""
    real = joint._Builder._forward
    monkeypatch.setattr(joint._Builder, "_forward", lambda self, saved: _without_a_definition(real(self, saved)))


@pytest.fixture
def broken_kernel_claim(monkeypatch):
    """The C executor's claim returns a stage that misses a definition."""
    real = c_executor.claim

    def claim(trace, leaves):
        claimed = real(trace, leaves)
        return None if claimed is None else _without_a_definition(claimed)
    monkeypatch.setattr(c_executor, "claim", claim)


def _grads(fn, inputs):
    out = fn(*inputs)
    return out, torch.autograd.grad(out, inputs)


@pytest.mark.parametrize("measure", ["0", "all"])
def test_a_broken_joint_program_never_runs_torch_autograd_does(monkeypatch, broken_joint_forward, measure, caplog):
    """The joint forward lacks a definition (as YOSO's did: a saved value CSE had renamed): the
    program runs torch autograd over its forward, with eager's values and gradients, on every
    call (the measured choice's second call times only the forms that verified)."""
    monkeypatch.setenv("FJIT_MEASURE", measure)
    inputs = _inputs()
    jf = fjit.jit(_mlp)
    with caplog.at_level(logging.WARNING, logger="fjit.recompiles"):
        for _ in range(3):
            got = _grads(jf, inputs)
    torch.testing.assert_close(got, _grads(_mlp, inputs), rtol=1e-4, atol=1e-5)
    stage = fjit.last_backward_traces(jf)[-1].stage
    assert stage.startswith("torch_autograd") and "failed verification" in stage
    assert "is never defined" in stage or "before it is defined" in stage
    assert any("joint program does not run" in r.getMessage() for r in caplog.records)


def test_a_broken_joint_program_in_check_mode_names_the_stage_that_broke_it(monkeypatch, broken_joint_forward):
    monkeypatch.setenv("FJIT_CHECK", "1")
    with pytest.raises(TraceVerificationError, match="stage 'autodiff_forward'"):
        _grads(fjit.jit(_mlp), _inputs())


def test_a_broken_program_with_kernels_runs_its_torch_calls(monkeypatch, broken_kernel_claim, caplog):
    """A kernel executor's stage misses a definition: the forward runs as torch calls alone, and
    its last stage says why."""
    monkeypatch.setenv("FJIT_C_KERNELS", "sync")
    x = torch.randn(64, 64)
    f = lambda x: torch.softmax(x * 2 + 1, dim=-1).sum(0)  # noqa: E731
    jf = fjit.jit(f)
    with caplog.at_level(logging.WARNING, logger="fjit.recompiles"):
        for _ in range(3):
            torch.testing.assert_close(jf(x), f(x))
    final = fjit.last_traces(jf)[-1]
    assert "failed verification" in final.stage and "fjit_c_" not in str(final)
    assert any("program with kernels does not run" in r.getMessage() for r in caplog.records)


def test_a_broken_program_with_kernels_in_check_mode_names_the_executors_stage(monkeypatch, broken_kernel_claim):
    monkeypatch.setenv("FJIT_CHECK", "1")
    with pytest.raises(TraceVerificationError, match="stage 'c_fusion' of"):
        fjit.jit(lambda x: torch.softmax(x * 2 + 1, dim=-1).sum(0))(torch.randn(64, 64))


def test_a_program_no_form_of_which_verifies_is_a_located_error_not_a_name_error(monkeypatch):
    """Every final stage broken (the last pass, freeing dead values, drops a line): no form is
    left to run, and the error says which stage of which function broke which rule."""
    import fjit.pipeline as pipeline
    real = pipeline.free_dead_values
    monkeypatch.setattr(pipeline, "free_dead_values", lambda t: _without_a_definition(real(t)))
    with pytest.raises(TraceVerificationError, match=r"fjit internal error: stage 'torch_executor' of '<lambda>'"):
        fjit.jit(lambda x: (x * 2).sin())(torch.randn(4))


def test_the_backends_pieces_are_verified(monkeypatch, broken_joint_forward):
    """torch.compile(backend="fjit") compiles its pieces through the same pipeline: a broken
    joint program leaves the piece to torch autograd, with eager's gradients."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    torch._dynamo.reset()
    inputs = _inputs()
    compiled = torch.compile(_mlp, backend="fjit")
    for _ in range(2):
        got = _grads(compiled, inputs)
    torch.testing.assert_close(got, _grads(_mlp, inputs), rtol=1e-4, atol=1e-5)
    torch._dynamo.reset()
