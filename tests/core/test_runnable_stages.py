"""Every stage prints as a runnable module: `exec(str(trace))` in a fresh namespace defines a
function that computes the result, C and Triton kernel stages included (they import their kernels
by name from fjit.runtime; objects with no literal come from trace_constants)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fjit


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def _softmax_mlp(x, w):
    return F.softmax(F.linear(x, w).tanh() * 2.0, dim=-1)


def _pair(x, w):
    y = x.exp() + 1
    return Pair(y.sum(-1), (y * w[0]).relu())


def _inplace_and_index(x, w):
    y = x.clone()
    y[0] += w[0]
    return y.sin().mean(0)


def _random(x, w):
    return F.dropout(x @ w, 0.5, training=True) + torch.rand(x.shape)


PROGRAMS = [_softmax_mlp, _pair, _inplace_and_index, _random]


def _run_printed(trace, leaves):
    ns = {}
    exec(compile(str(trace), f"<printed {trace.stage}>", "exec"), ns)
    return ns["computation"](*leaves)


def _flat(out):
    return [out.a, out.b] if isinstance(out, Pair) else out


@pytest.mark.parametrize("executors", [("c", "torch"), ("triton", "torch"), ("torch",)])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_every_stage_runs_as_printed(fn, executors, monkeypatch):
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")      # Triton runs CPU tensors under the interpreter
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    jf = fjit.jit(fn, executors=executors)
    torch.manual_seed(0)
    expected = jf(x, w)
    stages = fjit.last_traces(jf)
    kinds = {"c": "# C kernel", "triton": "# Triton kernel"}
    if executors[0] in kinds and fn in (_softmax_mlp, _pair):
        assert kinds[executors[0]] in str(stages[-1]), str(stages[-1])
    for trace in stages:
        torch.manual_seed(0)
        got = _run_printed(trace, [x, w])
        torch.testing.assert_close(_flat(got), _flat(expected), msg=lambda m: f"{trace.stage}: {m}")


def test_printed_source_carries_its_imports():
    jf = fjit.jit(_pair, executors=("c", "torch"))
    jf(torch.randn(3, 4), torch.randn(2, 4))
    src = str(fjit.last_traces(jf)[-1])
    assert "import torch" in src and "from fjit.runtime import" in src
    assert "= trace_constants(" in src        # the dataclass the output is rebuilt as
    kernel = next(line for line in src.splitlines() if "from fjit.runtime import fjit_c_" in line)
    name = kernel.split("import ")[1].strip()
    assert f"= {name}(" in src
