"""A bf16 mixed-precision training step of the transformers models of the zoo registry
(benchmarks/zoo_models.py), with a padded attention mask, through both entry points, against
eager under the same autocast.

Transformers moves its attention mask with `attention_mask.to(device=..., dtype=torch.bool)` and
builds masks from `arange` indexing; under autocast these crashed fjit.jit (the autocast probe
copied a meta tensor to a device) and the backend (a piece reading a value made after it formed a
cycle with it).  `python benchmarks/zoo.py --autocast bf16` runs the whole registry this way.
"""
import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                reason="needs transformers (the test extra)")

import fjit  # noqa: E402
from fjit.core.ir import Tag  # noqa: E402
from benchmarks.zoo_models import MODELS, Batch  # noqa: E402

MODELS_UNDER_TEST = ["hf_gpt2", "hf_llama_gqa_sdpa", "hf_bert", "hf_t5"]
# bf16 keeps 8 bits of mantissa: a value rounded the other way in one place moves what follows by
# a few units of its last place, so each tensor is compared relative to its largest element.
BF16_ULPS = 4 * torch.finfo(torch.bfloat16).eps


def _with_padding_mask(batch: Batch) -> Batch:
    """The batch as a tokenizer gives it: an attention mask, padding out the last 4 tokens of the
    second sequence (the registry's decoder batches have none)."""
    mask = torch.ones_like(batch.kwargs["input_ids"])
    mask[1, -4:] = 0
    return Batch(batch.args, {**batch.kwargs, "attention_mask": mask}, batch.target)


def _step(model: torch.nn.Module, call, zm, batch) -> dict:
    """One training step as users write it: forward and loss under autocast, backward outside."""
    torch.manual_seed(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = call(*batch.args, **batch.kwargs)
        loss = zm.loss(out, batch)
    loss.backward()
    return {"loss": loss.detach(), "logits": out.logits.detach(),
            **{f"grad:{n}": p.grad for n, p in model.named_parameters()}}


@pytest.mark.parametrize("entry", ["jit", "backend"])
@pytest.mark.parametrize("name", MODELS_UNDER_TEST)
def test_bf16_training_step_matches_eager_autocast(name, entry):
    torch._dynamo.reset()
    zm = MODELS[name]
    base, batch = zm.make(0), _with_padding_mask(zm.example(0))
    eager_model, model = copy.deepcopy(base), copy.deepcopy(base)
    compiled = fjit.jit(model) if entry == "jit" else torch.compile(model, backend="fjit")
    want = _step(eager_model, eager_model, zm, batch)
    got = _step(model, compiled, zm, batch)
    torch._dynamo.reset()
    assert got["logits"].dtype == want["logits"].dtype == torch.bfloat16
    for key, expected in want.items():
        actual = got[key]
        assert (actual is None) == (expected is None), key
        if expected is None:
            continue
        assert actual.dtype == expected.dtype, key
        scale = expected.float().abs().max().item()
        torch.testing.assert_close(actual.float(), expected.float(), rtol=0,
                                   atol=BF16_ULPS * scale + 1e-6, msg=lambda m: f"{key}: {m}")


def test_bf16_training_over_growing_lengths_is_one_symbolic_program_with_kernels():
    """Mixed precision and shapes that vary, as a user's training loop combines them: GPT-2 under
    bf16 autocast at three lengths compiles a symbolic program at the second (the autocast probe
    runs at the compiling call's sizes, the shape rules at the symbols) that serves the third,
    with fused kernels; each step's loss and gradients are eager-under-autocast's."""
    zm = MODELS["hf_gpt2"]
    base = zm.make(0)
    eager_model, model = copy.deepcopy(base), copy.deepcopy(base)
    compiled = fjit.jit(model)
    for length in (8, 13, 21):
        ids = torch.randint(0, 100, (2, length), generator=torch.Generator().manual_seed(length))
        grads = []
        for m, call in ((eager_model, eager_model), (model, compiled)):
            m.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = call(input_ids=ids, labels=ids).loss
            loss.backward()
            grads.append({"loss": loss.detach(), **{n: p.grad for n, p in m.named_parameters()}})
        want, got = grads
        for key, expected in want.items():
            scale = expected.float().abs().max().item()
            torch.testing.assert_close(got[key].float(), expected.float(), rtol=0,
                                       atol=BF16_ULPS * scale + 1e-6, msg=lambda m: f"{length} {key}: {m}")
    assert fjit.cache_info(compiled).misses == 2
    program = fjit.last_traces(compiled)[-1]
    assert "symbolic sizes" in program.stage and program.autocast_off
    assert "prims.convert_element_type(" in str(program)
    assert any(b.sym.has(Tag.KERNEL) for b in program.bsyms)
