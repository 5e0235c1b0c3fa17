"""PyTorch's other capture systems over a jitted function or module: torch.export, torch.jit.trace,
torch.jit.script and torch.compile record what the wrapped code computes (fjit/capture.py), and
fjit.jit of a TorchScript object is a located FJ201.

Before: export was FJ201 "FakeTensor" at `<string>:1`; jit.trace an AssertionError from
passes/matmuls.py; jit.script a TypeError; fjit.jit(torch.jit.script(m)) a TypeError from
module_layout.py; torch.compile(fjit.jit(m)) an internal Dynamo error from strict/bindings.py."""
from __future__ import annotations

import pytest
import torch

import fjit


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                               torch.nn.Linear(8, 2))


def scaled_tanh(x, w):
    return torch.tanh(x @ w) * 2 + x.sum(-1, keepdim=True)


def _warm(f, *args):
    for _ in range(2):      # the compiled program is cached and on its fast path
        f(*args)


def test_torch_export_of_a_jitted_module_exports_what_it_computes():
    model, x = _model(), torch.randn(3, 4)
    jm = fjit.jit(model)
    _warm(jm, x)
    exported = torch.export.export(jm, (x,))
    other = torch.randn(3, 4)
    torch.testing.assert_close(exported.module()(other), model(other))
    # its state under the module's own names, as exporting the module gives it
    assert set(exported.state_dict) == set(torch.export.export(model, (x,)).state_dict)


def test_torch_export_of_a_jitted_function_inside_a_module():
    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4, 4))
            self.f = fjit.jit(scaled_tanh)

        def forward(self, x):
            return self.f(x, self.w)
    module, x = Wrapper(), torch.randn(2, 4)
    exported = torch.export.export(module, (x,))
    torch.testing.assert_close(exported.module()(x), scaled_tanh(x, module.w))


@pytest.mark.parametrize("what", ["module", "function"])
def test_torch_jit_trace_records_the_wrapped_ops(what):
    model, x = _model(), torch.randn(3, 4)
    w = torch.randn(4, 4)
    if what == "module":
        jitted, eager, args = fjit.jit(model), model, (x,)
    else:
        jitted, eager, args = fjit.jit(scaled_tanh), scaled_tanh, (x, w)
    _warm(jitted, *args)
    traced = torch.jit.trace(jitted, args)
    other = (torch.randn(3, 4),) + args[1:]
    torch.testing.assert_close(traced(*other), eager(*other))


def test_torch_jit_script_scripts_the_original():
    model, x = _model(), torch.randn(3, 4)
    scripted = torch.jit.script(fjit.jit(model))
    assert isinstance(scripted, torch.jit.ScriptModule)
    torch.testing.assert_close(scripted(x), model(x))
    w = torch.randn(4, 4)
    script_fn = torch.jit.script(fjit.jit(scaled_tanh))
    torch.testing.assert_close(script_fn(x, w), scaled_tanh(x, w))


@pytest.mark.parametrize("scripted", ["module", "function"])
def test_fjit_jit_of_a_torchscript_object_is_a_located_fj201(scripted):
    obj = torch.jit.script(_model() if scripted == "module" else scaled_tanh)
    with pytest.raises(fjit.UnsupportedInputError) as info:
        fjit.jit(obj)
    message = str(info.value)
    assert "FJ201" in message and "TorchScript" in message and "test_export.py:" in message
    assert "before torch.jit.script" in message      # the fix names the route that works


def test_torch_compile_of_a_jitted_module_and_function():
    model, x = _model(), torch.randn(3, 4)
    jm = fjit.jit(model)
    _warm(jm, x)
    torch.testing.assert_close(torch.compile(jm, backend="eager")(x), model(x))
    w = torch.randn(4, 4)
    jf = fjit.jit(scaled_tanh)
    _warm(jf, x, w)
    torch.testing.assert_close(torch.compile(lambda a, b: jf(a, b) + 1, backend="fjit")(x, w),
                               scaled_tanh(x, w) + 1)
    torch.testing.assert_close(jf(x, w), scaled_tanh(x, w))     # still its own program after
    assert jf.cache_info().misses == 1
