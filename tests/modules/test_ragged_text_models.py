"""Text models of the zoo (benchmarks/zoo_models.py) trained over ragged batches, as a data loader
that pads each batch to its longest sequence feeds them: lengths and batch sizes that change every
step, a batch of one among them.  Each step's loss and gradients equal eager's, and the automatic
symbolic sizes (docs/design.md, "Shapes that vary") serve every shape with at most three programs:
the first call's, the symbolic program, and the batch-of-one program that transformers' own
branches on a batch of 1 ask for.

The models are the ones whose patterns had each length compile a program of its own: GPT-Neo
slices its causal-mask buffer to the length (a view of a static tensor at a symbolic size), Gemma
and Falcon lay out their grouped heads at batch 1 with a stride only a size-1 dim differs in; Llama
and GPT-2 are the common case."""
import copy
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

import fjit

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_MISSING = [m for m in ("timm", "transformers", "torchvision") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(_MISSING), reason=f"needs {', '.join(_MISSING)} (the test extra)")

from benchmarks.zoo_models import MODELS, VOCAB  # noqa: E402

# (batch, length): lengths up and down, a batch of one twice, the first shape again
SHAPES = [(2, 16), (2, 12), (3, 12), (1, 9), (2, 20), (4, 7), (1, 16), (3, 24), (2, 16)]


def _step(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad], allow_unused=True)
    return loss.detach(), grads


@pytest.mark.parametrize("name", ["hf_gpt_neo", "hf_gemma", "hf_falcon", "hf_llama_gqa", "hf_gpt2"])
def test_a_text_model_trains_over_ragged_batches_as_eager_with_three_programs(name):
    eager = MODELS[name].make(0)
    jitted = fjit.jit(copy.deepcopy(eager))
    g = torch.Generator().manual_seed(0)
    for batch, length in SHAPES:
        ids = torch.randint(3, VOCAB, (batch, length), generator=g)
        loss, grads = _step(jitted, ids)
        expected_loss, expected_grads = _step(eager, ids)
        torch.testing.assert_close(loss, expected_loss, rtol=1e-4, atol=1e-5)
        for got, want in zip(grads, expected_grads):
            assert (got is None) == (want is None)
            if want is not None:
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * (1 + want.abs().max().item()))
    assert fjit.cache_info(jitted).misses <= 3, fjit.explain(jitted)
