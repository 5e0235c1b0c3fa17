"""Activation checkpointing (torch.utils.checkpoint, reentrant or not) under fjit.jit: the joint program
saves a checkpointed region's inputs and recomputes the rest of the region in its backward, fused,
so the bytes saved for the backward (distinct storages that saved-tensor hooks see, parameters
excluded) are eager-with-checkpoint's, not eager-without's; gradients are eager's.  Ops of a region
that have no prims to rerun (a convolution, a batch norm) keep their values, and fjit says so."""
from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import fjit

ROOT = Path(__file__).resolve().parents[2]


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class _Stack(torch.nn.Module):
    def __init__(self, checkpointed: bool, reentrant: bool = False):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(6))
        self.checkpointed, self.reentrant = checkpointed, reentrant

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant) if self.checkpointed else block(x)
        return x


def _saved_mib(call, module, *args) -> float:
    """MiB of the distinct storages saved for the backward by one call, parameters excluded."""
    storages: dict = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call(*args)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    return sum(n for ptr, n in storages.items() if ptr not in params) / 2 ** 20, out


def _compiled(module, *args):
    jm = fjit.jit(module)
    for _ in range(2):      # compiled, then the cached program (whose call is measured)
        jm(*args)
    return jm


def _backend(module, *args, **kwargs):
    compiled = torch.compile(module, backend="fjit")
    for _ in range(2):
        compiled(*args, **kwargs)
    return compiled


def _grads_of(out, leaves) -> list:
    """The leaves' gradients of out.square().sum() by .backward() (a reentrant checkpoint refuses
    torch.autograd.grad)."""
    for t in leaves:
        t.grad = None
    out.square().sum().backward()
    return [t.grad.clone() for t in leaves]


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_blocks_save_what_eager_checkpoint_saves(reentrant):
    """A reentrant checkpoint was FJ202 blaming a data-dependent shape; it is the same region."""
    torch.manual_seed(0)
    model = _Stack(checkpointed=True, reentrant=reentrant)
    x = torch.randn(8, 128, 64, requires_grad=True)
    eager, want = _saved_mib(model, model, x)
    plain, _ = _saved_mib(_Stack(checkpointed=False), model, x)
    jm = _compiled(model, x)
    got, out = _saved_mib(jm, model, x)
    through_backend, backend_out = _saved_mib(_backend(model, x), model, x)
    assert max(got, through_backend) <= 1.1 * eager < plain / 4, (got, through_backend, eager, plain)
    leaves = [x, *model.parameters()]
    want_grads = _grads_of(want, leaves)
    for result in (out, backend_out):
        for a, b in zip(_grads_of(result, leaves), want_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


def test_a_model_without_checkpointing_saves_as_before():
    """No region, no recomputation: the joint program's choice of what to save is unchanged."""
    torch.manual_seed(0)
    model = _Stack(checkpointed=False)
    x = torch.randn(8, 128, 64, requires_grad=True)
    plain, _ = _saved_mib(model, model, x)
    got, _ = _saved_mib(_compiled(model, x), model, x)
    assert got > 0.5 * plain


_ZOO_MISSING = importlib.util.find_spec("timm") is None


def _zoo(name: str):
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.zoo_models import MODELS, import_torchvision
    import_torchvision()
    zm = MODELS[name]
    return zm.make(0), zm.example(0)


@pytest.mark.skipif(_ZOO_MISSING, reason="needs timm (the test extra)")
def test_timms_grad_checkpointing_switch_is_honoured():
    """timm's model.set_grad_checkpointing(): a ViT's blocks run under checkpoint_seq."""
    model, batch = _zoo("timm_vit_tiny_patch16_224")
    model.set_grad_checkpointing()
    eager, want = _saved_mib(model, model, *batch.args)
    jm = _compiled(model, *batch.args)
    got, out = _saved_mib(jm, model, *batch.args)
    through_backend, _ = _saved_mib(_backend(model, *batch.args), model, *batch.args)
    model.set_grad_checkpointing(False)
    plain, _ = _saved_mib(model, model, *batch.args)
    assert max(got, through_backend) <= 1.1 * eager < plain / 4, (got, through_backend, eager, plain)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers (the test extra)")
def test_transformers_gradient_checkpointing_switch_is_honoured():
    """transformers' model.gradient_checkpointing_enable(): each decoder layer runs under checkpoint,
    and a forward hook marks the embeddings' output requires_grad_(True), a no-op on a value that
    requires grad already, which fjit recorded as an opaque op keeping two more copies of it
    (Llama: 22% over eager-with-checkpoint's bytes, now 7%)."""
    model, batch = _zoo("hf_llama_gqa_sdpa")
    model.train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    def call(m):
        return lambda: m(*batch.args, **batch.kwargs)
    eager, want = _saved_mib(call(model), model)
    jm = fjit.jit(model)
    for _ in range(2):
        call(jm)()
    got, out = _saved_mib(call(jm), model)
    through_backend, _ = _saved_mib(call(_backend(model, *batch.args, **batch.kwargs)), model)
    model.gradient_checkpointing_disable()
    plain, _ = _saved_mib(call(model), model)
    assert max(got, through_backend) <= 1.1 * eager < plain / 4, (got, through_backend, eager, plain)
    torch.testing.assert_close(out.loss, want.loss, rtol=1e-4, atol=1e-4)


class _Convolutions(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU())

    def forward(self, x):
        return checkpoint(self.body, x, use_reentrant=False).tanh().sum()


def test_a_region_of_convolutions_is_honoured_in_part_and_says_so():
    x = torch.randn(2, 3, 16, 16, requires_grad=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fjit.jit(_Convolutions())(x)
    assert any("honoured in part" in str(w.message) and "conv2d" in str(w.message) for w in caught)
