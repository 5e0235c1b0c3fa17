"""Generation through a jitted module: `fjit.jit(model).generate(...)` and a user's own sampling
method run the compiled forward, with transformers' key/value caches as program state (their
tensors inputs, their updates written back after each call: fjit/state_objects.py).

Before, `generate` reached the wrapped model, whose `self(...)` ran eagerly: the output was right
and the compiled forward never ran (cache_info 0 hits, 0 misses); `fjit.jit(model.forward)` under
generate was FJ201 on DynamicCache."""
from __future__ import annotations

import os
import sys

import pytest
import torch

import fjit

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
pytest.importorskip("transformers")
from benchmarks.zoo_models import MODELS, import_torchvision

import_torchvision()

NEW_TOKENS = 6


def _model(name: str):
    torch.manual_seed(0)
    model = MODELS[name].build().eval()
    model.generation_config.eos_token_id = None      # always NEW_TOKENS tokens
    return model


def _generate(model, ids, **kwargs):
    torch.manual_seed(1)       # sampling draws from torch's generator: the same draws for both
    return model.generate(ids, max_new_tokens=NEW_TOKENS, pad_token_id=0, use_cache=True,
                          attention_mask=torch.ones_like(ids), **kwargs)


CASES = {
    "gpt2 greedy": ("hf_gpt2", {"do_sample": False}),
    "gpt2 sampling": ("hf_gpt2", {"do_sample": True, "top_k": 20}),
    "llama greedy": ("hf_llama_gqa_sdpa", {"do_sample": False}),
    "llama static cache": ("hf_llama_gqa_sdpa", {"do_sample": False, "cache_implementation": "static"}),
    "mistral sliding window": ("hf_mistral", {"do_sample": False}),
    "t5 encoder-decoder": ("hf_t5", {"do_sample": False}),
    "bart static cache": ("hf_bart", {"do_sample": False, "cache_implementation": "static",
                                      "min_new_tokens": NEW_TOKENS}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_generate_through_a_jitted_model_is_token_identical_and_runs_the_compiled_forward(case):
    name, kwargs = CASES[case]
    model = _model(name)
    ids = torch.randint(3, 100, (2, 5), generator=torch.Generator().manual_seed(2))
    want = _generate(model, ids, **kwargs)
    jm = fjit.jit(model)
    jm.cache_clear()
    got = _generate(jm, ids, **kwargs)
    assert torch.equal(got, want)
    info = jm.cache_info()
    assert info.hits + info.misses == NEW_TOKENS      # every step ran the compiled forward
    if kwargs.get("cache_implementation") == "static":
        # one program for the prompt, one for every later token: the cache's shapes are fixed
        assert info.misses == 2, info


def test_the_static_cache_ends_as_eagers_and_keeps_its_storage():
    """The cache object generate reads between steps holds eager's values, written into its
    tensors in place (a static cache's address must not change)."""
    from transformers import StaticCache
    model = _model("hf_llama_gqa_sdpa")
    ids = torch.randint(3, 100, (1, 5), generator=torch.Generator().manual_seed(3))
    caches = [StaticCache(config=model.config, max_cache_len=16) for _ in range(2)]
    want = _generate(model, ids, cache=caches[0], do_sample=False)
    jm = fjit.jit(model)
    assert torch.equal(_generate(jm, ids, cache=caches[1], do_sample=False), want)
    addresses = []
    for eager_layer, layer in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(layer.keys, eager_layer.keys)
        torch.testing.assert_close(layer.values, eager_layer.values)
        torch.testing.assert_close(layer.cumulative_length, eager_layer.cumulative_length)
        addresses.append((layer.keys.data_ptr(), layer.cumulative_length.data_ptr()))
    caches[1].reset()           # zeroed in place; the next generation writes into the same tensors
    assert torch.equal(_generate(jm, ids, cache=caches[1], do_sample=False), want)
    assert [(layer.keys.data_ptr(), layer.cumulative_length.data_ptr())
            for layer in caches[1].layers] == addresses


class _Sampler(torch.nn.Module):
    """A user's module with its own decoding loop calling self(...)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids).mean(1)))

    def sample(self, ids, steps: int):
        for _ in range(steps):
            ids = torch.cat([ids, self(ids).argmax(-1, keepdim=True)], 1)
        return ids


def test_generate_over_batches_of_one_and_more_is_token_identical_with_few_programs():
    """Prompts of batch 1, then 2, then 1 and 3 again, each growing its cache a token a step: a
    batch of one before a batch of two makes the batch a symbol that may be 1 (fjit/cache.py), and
    the calls stay token-identical to eager's.  The prompt and the step are two kinds of call (the
    step's inputs hold the cache), each compiled at most three times for every batch and length:
    the first call, the symbolic program, and one for batch 1 where transformers' own code
    branches on the batch being 1 (its guard `s0 != 1`)."""
    model = _model("hf_llama_gqa_sdpa")
    jm = fjit.jit(model)
    for k, (batch, n) in enumerate([(1, 8), (2, 8), (1, 5), (3, 6), (1, 9)]):
        ids = torch.randint(3, 100, (batch, n), generator=torch.Generator().manual_seed(k))
        with torch.no_grad():
            assert torch.equal(_generate(jm, ids, do_sample=False), _generate(model, ids, do_sample=False))
    info = jm.cache_info()
    assert info.hits + info.misses == 5 * NEW_TOKENS and info.misses <= 2 * 3, info


def test_a_users_method_calling_self_runs_the_compiled_forward():
    torch.manual_seed(0)
    model = _Sampler()
    ids = torch.randint(0, 50, (3, 4))
    jm = fjit.jit(model)
    torch.testing.assert_close(jm.sample(ids, 5), model.sample(ids, 5))
    assert jm.cache_info().misses == 2          # the first length, then every length (symbolic)
    model(ids)                                  # the module itself, called directly, stays eager
    assert jm.cache_info().misses + jm.cache_info().hits == 5


def test_a_cache_holding_an_object_fjit_cannot_carry_is_a_located_fj201():
    from transformers import DynamicCache
    model = _model("hf_gpt2")
    cache = DynamicCache(config=model.config)
    cache.note = object()          # state fjit cannot describe between calls
    ids = torch.randint(3, 100, (1, 4))
    with pytest.raises(fjit.UnsupportedInputError) as info:
        fjit.jit(model)(ids, cache=cache, use_cache=True)
    message = str(info.value)
    assert "FJ201" in message and "'cache'.note" in message and "test_generation.py:" in message
