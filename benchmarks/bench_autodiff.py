"""Forward + backward on the CPU: fjit's compiled backward against eager PyTorch and torch.compile,
measured in one run (interleaved rounds, paired ratios).

    python benchmarks/bench_autodiff.py            # every case
    python benchmarks/bench_autodiff.py --quick    # fewer rounds, no torch.compile

Cases: a GELU MLP block (linear, gelu, linear), RMSNorm and softmax, each at a small size (4 x 256)
and a large one (1024 x 1024); one call is `loss = f(...); loss.backward()`, gradients cleared.
Targets (issue 9): fjit/eager <= 1.0 at every size; fjit/torch.compile <= 0.5 up to 64K elements,
<= 1.0 above.  Writes benchmarks/results/autodiff.json.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

import fjit
from benchmarks import harness as H

SIZES = {"small": (4, 256), "large": (1024, 1024)}


def mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2).sum()


def rms_norm(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6).sum()


def softmax(x, w):
    return torch.softmax(x * w, -1).square().sum()


def inputs(case: str, rows: int, cols: int) -> list:
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).requires_grad_()  # noqa: E731
    if case == "mlp":
        x = torch.randn(rows, cols, generator=g)
        return [x, r(cols, cols) * 0.05, r(cols), r(cols, cols) * 0.05, r(cols)]
    return [r(rows, cols), r(cols)]


CASES = {"mlp": mlp, "rms_norm": rms_norm, "softmax": softmax}


def step(fn, args):
    leaves = [a for a in args if a.requires_grad]

    def run():
        for a in leaves:
            a.grad = None
        fn(*args).backward()
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    rounds = 5 if opts.quick else 15
    rows, results, targets = [], {}, []
    for case, fn in CASES.items():
        for size, (m, n) in SIZES.items():
            args = [a.detach().requires_grad_(a.requires_grad) for a in inputs(case, m, n)]
            jf = fjit.jit(fn)
            candidates = {"eager": step(fn, args), "fjit": step(jf, args)}
            if not opts.quick:
                candidates["compile"] = step(torch.compile(fn), args)
            for run in candidates.values():
                run()                 # compile outside the timing
            compiled_backward = bool(fjit.last_backward_traces(jf))
            kernels = sum("C kernel" in (b.comment or "") for t in fjit.last_backward_traces(jf)[-1:]
                          for b in t.bsyms)
            timer = H.CpuTimer()
            iters = H.calibrate_iters(candidates["eager"], timer, 2e7)
            stats = H.measure(candidates, timer, rounds=rounds, iters=iters)
            vs_eager = H.paired_ratio(stats, "fjit", "eager")
            vs_compile = H.paired_ratio(stats, "fjit", "compile")
            name = f"{case} {size} {m}x{n}"
            rows.append([name, H.fmt(stats["eager"].median_us, ".1f"),
                         H.fmt(stats["fjit"].median_us, ".1f"),
                         H.fmt(stats["compile"].median_us, ".1f") if "compile" in stats else "-",
                         H.fmt(vs_eager), H.fmt(vs_compile),
                         f"{'compiled' if compiled_backward else 'torch autograd'} ({kernels} C)"])
            results[name] = {"eager_us": stats["eager"].median_us,
                             "fjit_us": stats["fjit"].median_us,
                             "compile_us": stats["compile"].median_us if "compile" in stats else None,
                             "fjit_vs_eager": vs_eager, "fjit_vs_compile": vs_compile,
                             "compiled_backward": compiled_backward, "backward_c_kernels": kernels}
            targets.append((f"{name}: fjit/eager <= 1.0", vs_eager, 1.0))
            if vs_compile is not None:
                limit = 0.5 if m * n <= 65536 else 1.0
                targets.append((f"{name}: fjit/torch.compile <= {limit}", vs_compile, limit))
    print(H.format_table(["case", "eager us", "fjit us", "compile us", "fjit/eager",
                          "fjit/compile", "fjit backward"], rows))
    for label, value, limit in targets:
        print(f"{'PASS' if value is not None and value <= limit else 'MISS'}  {label}: "
              f"{H.fmt(value)}")
    H.write_json("autodiff.json", {"environment": H.environment(), "results": results})


if __name__ == "__main__":
    main()
