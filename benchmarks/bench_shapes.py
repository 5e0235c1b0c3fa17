"""Shapes that vary: text models over many sequence lengths and batch sizes (issue 54).

For each model (the zoo's tiny GPT-2, BERT and Llama configs, positions raised to 256 so long
lengths fit) and mode (inference under no_grad; a training step: forward, loss, backward), every
entry is called once per shape in a fixed order (lengths x batch sizes), then each shape again
until timed:
- compiles: programs compiled (fjit.jit: cache misses; torch.compile: graphs Dynamo compiled),
  over the grid of shapes and the unseen shapes below;
- C kernels built: compiled from source in this process (each entry starts from an empty kernel
  cache directory; fjit only), in all and after the second distinct shape (counted once the first
  two shapes' builds are done);
- new shape first call: once the entry is warm (every grid shape called, its builds done), the
  first call of shapes it has not seen (a length one past every other grid length): the median
  time, and the median ratio to the same shape's cached call;
- steady: the geomean over shapes of the cached call's time against eager's, paired per shape in
  interleaved rounds.
Also the function of issue 54 (linear, tanh-GELU, a softmax over h h^T, layer norm).

Entries: `fjit.jit` (automatic symbolic sizes: the second shape compiles a program with symbolic
sizes that serves the rest), `jit_symbolic` (cache="symbolic": every size of 2 or more a symbol
from the first call, as torch.compile's dynamic=True makes them), `jit_static` (fjit.jit with
cache="static": a program per shape, each specialized, the yardstick of the symbolic program's
steady time), `jit_specialized` (cache="static"
and FJIT_KERNEL_SIZES=specialized: also a kernel build per size),
`torch.compile(backend="fjit", dynamic=True)`, `torch.compile(dynamic=True)` (Inductor), and
`eager` (not by default: its own first call of a new shape against its cached call, torch's cost
of a size it has not run yet, which every entry pays).

    python benchmarks/bench_shapes.py [--models gpt2 bert llama fn] [--modes infer train]
        [--lengths 20] [--batches 1 2 3] [--entries jit backend inductor] [--rounds 3]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fjit
from benchmarks.harness import environment, fmt, format_table
from benchmarks.zoo_models import VOCAB, import_torchvision
from fjit.executors.c import executor as c_executor

_CONFIGS = {
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", dict(vocab_size=VOCAB, n_positions=256, n_embd=64, n_layer=2,
                                                   n_head=4, bos_token_id=1, eos_token_id=2)),
    "bert": ("BertForSequenceClassification", "BertConfig",
             dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, max_position_embeddings=256, num_labels=3)),
    "llama": ("LlamaForCausalLM", "LlamaConfig",
              dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)),
}


def _model(name: str) -> torch.nn.Module:
    import_torchvision()
    import transformers
    from benchmarks.zoo_models import _hf_config, no_dropout
    model_cls, config_cls, kwargs = _CONFIGS[name]
    torch.manual_seed(0)
    return no_dropout(getattr(transformers, model_cls)(_hf_config(config_cls, "eager", **kwargs)))


def _function():
    torch.manual_seed(0)
    w, b = torch.randn(64, 64) / 8, torch.randn(64)

    def f(x, w, b):
        h = torch.nn.functional.linear(x, w, b)
        h = 0.5 * h * (1 + torch.tanh(0.7978845608 * (h + 0.044715 * h ** 3)))
        a = torch.softmax(h @ h.transpose(-1, -2) / 8.0, dim=-1)
        return torch.nn.functional.layer_norm(a @ h, (64,))
    return f, w, b


def _step(name: str, mode: str, fn):
    """A call of `fn` (the entry's model or function) on one (batch, length) shape's inputs."""
    if name == "fn":
        _, w, b = _function()

        def call(x):
            with torch.no_grad():
                return fn(x, w, b)
        return call

    def call(ids):
        kwargs = {"labels": ids} if name != "bert" else {"labels": ids[:, 0] % 3}
        if mode == "infer":
            with torch.no_grad():
                return fn(ids)
        loss = fn(ids, **kwargs).loss
        loss.backward()
        return loss
    return call


def _inputs(name: str, batch: int, length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if name == "fn":
        return torch.randn(batch, length, 64, generator=g)
    return torch.randint(3, VOCAB, (batch, length), generator=g)


def _entry(entry: str, name: str):
    """(the callable, a function giving its compile count so far)."""
    import torch._dynamo
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    target = _function()[0] if name == "fn" else _model(name)
    if entry == "eager":
        return target, lambda: 0
    if entry in ("jit", "jit_symbolic", "jit_static", "jit_specialized"):
        cache = {"jit": "metadata", "jit_symbolic": "symbolic"}.get(entry, "static")
        jitted = fjit.jit(target, cache=cache)
        return jitted, lambda: fjit.cache_info(jitted).misses
    compiled = torch.compile(target, backend="fjit" if entry == "backend" else "inductor", dynamic=True)
    return compiled, lambda: torch._dynamo.utils.counters["stats"]["unique_graphs"]


def run(name: str, mode: str, entries: list[str], shapes: list[tuple[int, int]], rounds: int) -> list[list[str]]:
    rows = []
    data = [_inputs(name, b, n, k) for k, (b, n) in enumerate(shapes)]
    # shapes no entry has seen, met once the entry is warm: one length past every other grid
    # length, the batch sizes in turn
    unseen = [(b, n + 1) for k, (b, n) in enumerate(shapes[::2])][:8]
    new_data = [_inputs(name, b, n, 1000 + k) for k, (b, n) in enumerate(unseen)]
    eager_fn, _ = _entry("eager", name)
    eager = _step(name, mode, eager_fn)
    sizes = os.environ.get("FJIT_KERNEL_SIZES", "auto")      # what the fjit entries run with
    cache_size = os.environ.get("FJIT_CACHE_SIZE", "64")
    for entry in entries:
        with tempfile.TemporaryDirectory() as kernels:
            os.environ["FJIT_CACHE_DIR"] = kernels
            os.environ["FJIT_KERNEL_SIZES"] = "specialized" if entry == "jit_specialized" else sizes
            # a program per shape: room for every shape (more shapes than FJIT_CACHE_SIZE's 64,
            # called in turn, evict each other and compile on every call)
            os.environ["FJIT_CACHE_SIZE"] = str(4 * (len(shapes) + len(unseen))) if entry in (
                "jit_static", "jit_specialized") else cache_size
            built_before = c_executor.builds()
            fn, compiles = _entry(entry, name)
            call = _step(name, mode, fn)
            built_by_two = None
            for k, x in enumerate(data):
                call(x)
                if k == 1:        # the second distinct shape: its kernels built, then count
                    c_executor.wait(600)
                    built_by_two = c_executor.builds()
            c_executor.wait(600)
            for x in data:            # settle: kernels loaded, the measured choice made
                call(x)
                call(x)
            firsts, new_cached = [], []
            for x in new_data:        # a new shape once warm: its first call, then its cached call
                start = time.perf_counter()
                call(x)
                firsts.append(time.perf_counter() - start)
                again = []
                for _ in range(3):
                    start = time.perf_counter()
                    call(x)
                    again.append(time.perf_counter() - start)
                new_cached.append(statistics.median(again))
            c_executor.wait(600)
            cached, ratios = [], []
            for x in data:
                mine, theirs = [], []
                for _ in range(rounds):
                    for who, f, out in ((0, call, mine), (1, eager, theirs)):
                        start = time.perf_counter()
                        f(x)
                        out.append(time.perf_counter() - start)
                cached.append(statistics.median(mine))
                ratios.append(statistics.median(mine) / statistics.median(theirs))
            fjit_entry = entry not in ("inductor", "eager")
            rows.append([name, mode, entry, str(compiles()),
                         str(c_executor.builds() - built_before) if fjit_entry else "-",
                         str(c_executor.builds() - built_by_two) if fjit_entry else "-",
                         fmt(1e3 * statistics.median(firsts), ".1f"),
                         fmt(statistics.median(f / c for f, c in zip(firsts, new_cached)), ".1f"),
                         fmt(math.exp(statistics.fmean(math.log(r) for r in ratios)))])
            print(" | ".join(rows[-1]), flush=True)
            os.environ.pop("FJIT_CACHE_DIR", None)
    os.environ["FJIT_KERNEL_SIZES"], os.environ["FJIT_CACHE_SIZE"] = sizes, cache_size
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["gpt2", "bert", "llama", "fn"])
    parser.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    parser.add_argument("--lengths", type=int, default=20, help="sequence lengths, spread over 8..160")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--entries", nargs="+", default=["jit", "jit_symbolic", "jit_static", "backend", "inductor"],
                        choices=["jit", "jit_symbolic", "jit_static", "jit_specialized", "backend", "inductor",
                                 "eager"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    lengths = sorted({round(8 + k * (160 - 8) / max(1, args.lengths - 1)) for k in range(args.lengths)})
    shapes = [(b, n) for n in lengths for b in args.batches]
    print(environment())
    print(f"{len(shapes)} shapes: lengths {lengths}, batch sizes {args.batches}")
    rows = []
    for name in args.models:
        for mode in (["infer"] if name == "fn" else args.modes):
            rows += run(name, mode, args.entries, shapes, args.rounds)
    print(format_table(["model", "mode", "entry", "compiles", "C kernels built", "built after 2nd shape",
                        "new shape first call ms", "first / cached", "steady vs eager"], rows))


if __name__ == "__main__":
    main()
