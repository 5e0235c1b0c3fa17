"""fjit.jit(model) against eager and torch.compile(model) (default mode), measured in one run.

A GELU MLP (Linear, GELU, Linear) at a small and a large size, forward under no_grad (inference)
and forward + backward (`model(x).sum().backward()`, parameters requiring grad: until fjit has a
compiled backward, its program runs as torch calls under torch autograd).  Every figure is a paired
ratio of medians from the same interleaved rounds (benchmarks/harness.py).  Targets from issue 9:
fjit/eager <= 1.0 at every size; fjit/torch.compile <= 0.5 up to 64K elements, <= 1.0 above.

    python benchmarks/bench_modules.py [--quick] [--threads N]     # results/modules.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fjit
from benchmarks import harness as H

SIZES = {   # label -> (batch, width in, hidden): activations of batch x hidden elements
    "small": (8, 32, 64),          # 512 elements: dispatch-bound
    "large": (256, 256, 1024),     # 262144 elements: compute-bound
}


def gelu_mlp(d_in: int, hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Linear(hidden, d_in))


def candidates(model: nn.Module, x: torch.Tensor, backward: bool) -> tuple[dict, dict]:
    """(name -> thunk, name -> error) for eager, fjit and torch.compile, each checked once."""
    runners = {"eager": model, "fjit": fjit.jit(model)}
    errors = {}
    try:
        runners["compile"] = torch.compile(model)
    except Exception as exc:      # noqa: BLE001 - reported, never hidden
        errors["compile"] = H.describe_error(exc)
    thunks = {}
    with torch.no_grad():
        expected = model(x)
    for name, run in runners.items():
        if backward:
            def thunk(run=run):
                run(x).sum().backward()
        else:
            def thunk(run=run):
                with torch.no_grad():
                    return run(x)
        try:
            for _ in range(3):      # compile, then the steady state
                out = thunk()
            if not backward:
                mismatch = H.check_close(out, expected)
                if mismatch:
                    raise AssertionError(mismatch)
            thunks[name] = thunk
        except Exception as exc:      # noqa: BLE001
            errors[name] = H.describe_error(exc)
    return thunks, errors, runners["fjit"]


def run(quick: bool) -> list[dict]:
    timer = H.CpuTimer()
    rows = []
    for label, (batch, d_in, hidden) in SIZES.items():
        for backward in (False, True):
            torch._dynamo.reset()
            model = gelu_mlp(d_in, hidden)
            x = torch.randn(batch, d_in)
            thunks, errors, jm = candidates(model, x, backward)
            misses = fjit.cache_info(jm).misses
            iters = H.calibrate_iters(thunks["eager"], timer, 20e6 if quick else 60e6)
            stats = H.measure(thunks, timer, rounds=5 if quick else 15, iters=iters)
            if fjit.cache_info(jm).misses != misses:
                errors["fjit_cache"] = "fjit recompiled during the timed calls"
            rows.append({
                "size": label, "elements": batch * hidden, "pass": "fwd+bwd" if backward else "fwd",
                "median_us": {k: s.median_us for k, s in stats.items()},
                "fjit_over_eager": H.paired_ratio(stats, "fjit", "eager"),
                "fjit_over_compile": H.paired_ratio(stats, "fjit", "compile"),
                "errors": errors,
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's); 1 on a loaded machine")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args.quick)
    print(f"{'size':6} {'elements':>9} {'pass':8} {'eager us':>9} {'fjit us':>9} {'compile us':>10} "
          f"{'fjit/eager':>10} {'fjit/compile':>12}  targets")
    for r in rows:
        med = r["median_us"]
        limit = 0.5 if r["elements"] <= 65536 else 1.0
        ok_e = r["fjit_over_eager"] is not None and r["fjit_over_eager"] <= 1.0
        ok_c = r["fjit_over_compile"] is not None and r["fjit_over_compile"] <= limit
        print(f"{r['size']:6} {r['elements']:>9} {r['pass']:8} {H.fmt(med.get('eager')):>9} "
              f"{H.fmt(med.get('fjit')):>9} {H.fmt(med.get('compile')):>10} "
              f"{H.fmt(r['fjit_over_eager'], '.3f'):>10} {H.fmt(r['fjit_over_compile'], '.3f'):>12}  "
              f"eager<=1.0 {'PASS' if ok_e else 'MISS'}, compile<={limit} {'PASS' if ok_c else 'MISS'}"
              + (f"  errors: {r['errors']}" if r["errors"] else ""))
    H.RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (H.RESULTS_DIR / "modules.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
