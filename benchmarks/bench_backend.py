"""The torch.compile backend: backend="fjit" against backend="inductor" and eager, in one run.

    python benchmarks/bench_backend.py            # full run
    python benchmarks/bench_backend.py --quick    # fewer rounds
    python benchmarks/bench_backend.py --threads 1   # torch.set_num_threads(1) first

On the models of tests/backend_models.py (an MLP, a transformer block, a conv net with BatchNorm,
batch 4: small CPU tensors), for inference (eval, no_grad) and training (forward + backward):
  - cold compile: the first call (first step in training: forward and backward) of a freshly reset
    Dynamo, fjit against Inductor, with fresh disk caches; for fjit also the time until its
    background C kernel builds are loaded;
  - steady state: time per call (per step), fjit and Inductor over eager, measured in interleaved
    rounds (paired ratios).
Writes benchmarks/results/backend.json and prints the table and the PASS/MISS targets.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

import fjit  # noqa: E402
from backend_models import MODELS, example_input, make_model  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from fjit.executors.c import executor as c_executor  # noqa: E402


def _step_fn(model, x, train: bool):
    """One call: forward in eval under no_grad, or forward + backward in training mode."""
    if not train:
        def run():
            with torch.no_grad():
                return model(x)
        return run

    def run():
        out = model(x)
        out.float().pow(2).mean().backward()
        return out.detach()
    return run


def _prepare(name: str, train: bool, backend: str):
    model = make_model(name)
    model.train(train)
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    return model, compiled


def _warm_imports(quick: bool) -> None:
    """One throwaway compile per backend, so import time is not counted as any model's compile."""
    def f(x):
        return torch.relu(x) * 2 + 1
    for backend in ("fjit", "inductor"):
        torch._dynamo.reset()
        torch.compile(f, backend=backend)(torch.randn(8, requires_grad=True)).sum().backward()
    c_executor.wait()


def bench_model(name: str, train: bool, quick: bool) -> dict:
    x = example_input(name)
    row: dict = {"model": name, "mode": "train (fwd+bwd)" if train else "inference", "errors": {}}
    # cold compile: the first call of each backend on a freshly reset Dynamo
    candidates = {}
    eager_model = make_model(name).train(train)
    expected = _step_fn(copy.deepcopy(eager_model), x, train)()
    for backend in ("fjit", "inductor"):
        torch._dynamo.reset()
        _, compiled = _prepare(name, train, backend)
        call = _step_fn(compiled, x, train)
        out = {}
        try:
            ms = H.time_once_ns(lambda: out.setdefault("v", call())) / 1e6
        except Exception as exc:  # noqa: BLE001 - reported in the results
            row["errors"][backend] = H.describe_error(exc)
            continue
        row[f"{backend}_first_call_ms"] = ms
        if backend == "fjit":
            row["fjit_with_c_builds_ms"] = ms + H.time_once_ns(c_executor.wait) / 1e6
        mismatch = H.check_close(call(), _step_fn(copy.deepcopy(eager_model), x, train)()) or \
            H.check_close(out["v"], expected)
        if mismatch:
            row["errors"][backend] = f"wrong result: {mismatch}"
            continue
        candidates[backend] = call
    candidates["eager"] = _step_fn(copy.deepcopy(eager_model), x, train)
    row["compile_over_fjit_first_call"] = H.ratio(row.get("inductor_first_call_ms"),
                                                  row.get("fjit_first_call_ms"))
    row["compile_over_fjit_with_builds"] = H.ratio(row.get("inductor_first_call_ms"),
                                                   row.get("fjit_with_c_builds_ms"))
    # steady state (the compiled graphs stay cached: Dynamo's cache holds one entry per code
    # object and backend, and each candidate is its own model copy)
    timer = H.CpuTimer()
    iters = H.calibrate_iters(candidates["eager"], timer, 2e6 if quick else 5e6)
    stats = H.measure(candidates, timer, rounds=9 if quick else 25, iters=iters)
    for n, s in stats.items():
        row[f"{n}_us"] = s.median_us
    row["fjit_over_eager"] = H.paired_ratio(stats, "fjit", "eager")
    row["inductor_over_eager"] = H.paired_ratio(stats, "inductor", "eager")
    row["fjit_over_inductor"] = H.paired_ratio(stats, "fjit", "inductor")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's); on a loaded machine, "
                             "1 keeps eager's OpenMP regions from waiting for a busy core")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    H.isolate_compiler_caches()
    if "fjit" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(fjit.backend, "fjit")   # a checkout not pip-installed
    _warm_imports(args.quick)
    rows = [bench_model(name, train, args.quick) for name in MODELS for train in (False, True)]

    headers = ("model", "mode", "fjit 1st ms", "+C builds ms", "inductor 1st ms", "ind/fjit 1st",
               "eager us", "fjit us", "inductor us", "fjit/eager", "fjit/inductor")
    table = [(r["model"], r["mode"], H.fmt(r.get("fjit_first_call_ms"), ".0f"),
              H.fmt(r.get("fjit_with_c_builds_ms"), ".0f"),
              H.fmt(r.get("inductor_first_call_ms"), ".0f"),
              H.fmt(r.get("compile_over_fjit_first_call"), ".1f"), H.fmt(r.get("eager_us"), ".1f"),
              H.fmt(r.get("fjit_us"), ".1f"), H.fmt(r.get("inductor_us"), ".1f"),
              H.fmt(r.get("fjit_over_eager")), H.fmt(r.get("fjit_over_inductor")))
             for r in rows]
    print(H.format_table(headers, table))
    for r in rows:
        for backend, err in r["errors"].items():
            print(f"  {r['model']} {r['mode']} {backend}: {err}")

    def worst(key, pick=max):
        values = [r[key] for r in rows if r.get(key) is not None]
        return pick(values) if len(values) == len(rows) else None

    targets = [
        H.Target("cold compile, Inductor over fjit first call (worst model)",
                 worst("compile_over_fjit_first_call", min), ">=", 10.0),
        H.Target("cold compile, Inductor over fjit incl. C builds (worst model)",
                 worst("compile_over_fjit_with_builds", min), ">=", 10.0),
        H.Target("steady state, fjit over eager (worst model)", worst("fjit_over_eager"), "<=", 1.0),
        H.Target("steady state, fjit over Inductor (worst model)", worst("fjit_over_inductor"),
                 "<", 1.0),
    ]
    H.print_targets(targets)
    path = H.write_json("backend.json", {
        "environment": H.environment(), "quick": args.quick, "threads": torch.get_num_threads(),
        "rows": rows,
        "geomean_fjit_over_eager": _geomean(r.get("fjit_over_eager") for r in rows),
        "targets": [t.to_json() for t in targets]})
    print(f"wrote {path}")


def _geomean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.geometric_mean(values) if values else None


if __name__ == "__main__":
    main()
