"""Composition benchmarks: generation's time per token, and vmap of a jitted function.

Generation: transformers' `generate` (greedy, batch 1, an 8-token prompt) on the zoo's tiny Llama
and GPT-2, with the default DynamicCache and with a StaticCache, through
- eager,
- `fjit.jit(model).generate(...)` (the compiled forward, the cache as program state),
- `model.compile(backend="fjit")` and `model.compile()` (Inductor): torch.compile's way of
  compiling what `generate` calls (`model(...)` goes through the compiled call).
Each candidate generates once untimed (compiles, builds kernels, lets the measured choice decide),
then the rounds time one whole generation each, interleaved; the figure is milliseconds per new
token (median), with each candidate's ratio to eager paired within rounds.  The dynamic cache's
shapes grow every token, and fjit compiles a program per length until sizes are symbolic (issue
54), so its rows show the cached calls of a second generation of the same prompt.

vmap: `torch.vmap(fjit.jit(f))(x)` against `torch.vmap(f)(x)` (a transform's tensors run the
program's torch form: fjit/api.py) and against `fjit.jit(torch.vmap(f))(x)` (vmap as one opaque
op inside the trace, fjit/frontend/transforms.py).

    python benchmarks/bench_compose.py [--tokens 32] [--rounds 5] [--models hf_llama_gqa_sdpa hf_gpt2]
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fjit
from benchmarks.harness import CpuTimer, environment, fmt, format_table, measure, paired_ratio
from benchmarks.zoo_models import MODELS, import_torchvision


def generation(name: str, tokens: int, rounds: int, cache: str) -> list[list[str]]:
    torch.manual_seed(0)
    model = MODELS[name].build().eval()
    model.generation_config.eos_token_id = None       # every run makes `tokens` tokens
    ids = torch.randint(3, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    extra = {"cache_implementation": "static"} if cache == "static" else {}

    def generate(m):
        return lambda: m.generate(ids, max_new_tokens=tokens, do_sample=False, pad_token_id=0,
                                  use_cache=True, **extra)
    fjit_backend, inductor = copy.deepcopy(model), copy.deepcopy(model)
    fjit_backend.compile(backend="fjit")
    inductor.compile()
    candidates = {"eager": generate(model), "fjit.jit": generate(fjit.jit(model)),
                  "compile(fjit)": generate(fjit_backend), "compile(inductor)": generate(inductor)}
    want = candidates["eager"]()
    for label, run in candidates.items():
        got = run()            # compiles; and checks the tokens before anything is timed
        if not torch.equal(got, want):
            raise SystemExit(f"{name} {cache}: {label} generated other tokens than eager")
    stats = measure(candidates, CpuTimer(), rounds=rounds, iters=1, warmup=1)
    rows = []
    for label, s in stats.items():
        rows.append([name, cache, label, fmt(s.median_ns / tokens / 1e6), fmt(paired_ratio(stats, label, "eager"))])
    return rows


def _chain(x):
    return (torch.tanh(x * 1.5 + 0.25) * x.sigmoid()).sum(-1) / x.shape[-1]


def vmap_rows(rounds: int) -> list[list[str]]:
    x = torch.randn(64, 128, 256)
    over = torch.vmap(fjit.jit(_chain))
    inside = fjit.jit(torch.vmap(_chain))
    candidates = {"vmap(f)": lambda: torch.vmap(_chain)(x), "vmap(fjit.jit(f))": lambda: over(x),
                  "fjit.jit(vmap(f))": lambda: inside(x)}
    want = candidates["vmap(f)"]()
    for label, run in candidates.items():
        torch.testing.assert_close(run(), want)
    stats = measure(candidates, CpuTimer(), rounds=rounds, iters=5)
    return [[label, fmt(s.median_us, ".0f"), fmt(paired_ratio(stats, label, "vmap(f)"))]
            for label, s in stats.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["hf_llama_gqa_sdpa", "hf_gpt2"])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    import_torchvision()
    env = environment()
    print(f"torch {env.get('torch')}, {env.get('cpu', '')}, {torch.get_num_threads()} threads")
    rows = []
    for name in args.models:
        for cache in ("dynamic", "static"):
            rows += generation(name, args.tokens, args.rounds, cache)
    print(f"\ngeneration, greedy, batch 1, prompt 8, {args.tokens} new tokens (ms per token, ratio to eager):")
    print(format_table(["model", "cache", "candidate", "ms/token", "x eager"], rows))
    print("\nvmap over [64, 128, 256] (us per call, ratio to eager vmap):")
    print(format_table(["candidate", "us", "x vmap(f)"], vmap_rows(args.rounds * 4)))


if __name__ == "__main__":
    main()
