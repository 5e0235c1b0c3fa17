"""CUDA figures of fjit (executors=("triton", "torch")) against eager PyTorch and torch.compile
(default mode), measured in one run, with achieved bandwidth as a percentage of device copy.

    python benchmarks/bench_gpu.py            # needs a CUDA GPU; writes results/gpu.json, gpu.png
    python benchmarks/bench_gpu.py --smoke    # any machine: every function at tiny sizes on the
                                              # CPU under TRITON_INTERPRET=1, fjit checked against
                                              # eager; writes results/gpu_smoke.json

See benchmarks/README.md for what each figure means and the bytes formula of each function.
"""

from __future__ import annotations

import os
import sys

if "--smoke" in sys.argv:
    # Triton decides at kernel definition whether to interpret, so this precedes every import
    # that may define kernels (triton, fjit).
    os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import dataclasses
import functools
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F

import fjit
from benchmarks import harness as H
from benchmarks.gpu_cases import (BF16, CASES, COLD_SOURCE, COPY, Case, Rand,
                                  nbytes, raw_triton_add, rms_args)

FJIT_OPTIONS = {"executors": ("triton", "torch")}
MEMORY_BOUND_TARGET_PCT = 90.0
# small (overhead-bound) calls, reductions of 32K+ columns and non-power-of-two widths (issue 12)
COMPILE_1_2X = ("tiny_add", "softmax_wide", "softmax_vocab", "cross_entropy", "sum_of_squares")


# --------------------------------------------------------------------------------------------
# running


@dataclasses.dataclass
class Settings:
    smoke: bool
    device: str
    with_compile: bool
    rounds: int
    sample_ns: float          # target duration of one timed sample

    def timer(self, kind: str):
        if kind == "host" or self.device != "cuda":
            return H.CpuTimer(cuda_sync=self.device == "cuda")
        return self.events_timer

    @functools.cached_property
    def events_timer(self) -> H.CudaEventTimer:
        return H.CudaEventTimer()

    def sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def final_trace(jitted) -> str | None:
    try:
        traces = fjit.last_traces(jitted)
        return str(traces[-1]) if traces else None
    except Exception as exc:  # noqa: BLE001 - best effort, for reading the results
        return f"<last_traces failed: {H.describe_error(exc)}>"


def run_case(case: Case, s: Settings) -> dict:
    torch._dynamo.reset()  # a static-shape compile per case (softmax runs at two shapes)
    args = case.make(case.smoke if s.smoke else case.full, Rand(s.device))
    rtol, atol = case.tol
    prep = H.prepare(case.fn, args, fjit_options=FJIT_OPTIONS, use_compile=s.with_compile,
                     rtol=rtol, atol=atol, sync=s.sync)
    if case.name == "tiny_add":
        try:
            mismatch = H.check_close(raw_triton_add(*args), case.fn(*args), rtol=0, atol=0)
            if mismatch:
                prep.errors["raw_triton"] = f"wrong result: {mismatch}"
            else:
                prep.candidates["raw_triton"] = lambda: raw_triton_add(*args)
        except Exception as exc:  # noqa: BLE001
            prep.errors["raw_triton"] = H.describe_error(exc)
        # the same fjit program launched through kernel[grid] on every call (FJIT_TRITON_LAUNCH=jit,
        # read when the program is compiled) against the default pre-bound compiled launcher
        old = os.environ.get("FJIT_TRITON_LAUNCH")
        os.environ["FJIT_TRITON_LAUNCH"] = "jit"
        try:
            jit_launch = fjit.jit(lambda x, y: x + y, **FJIT_OPTIONS)
            mismatch = H.check_close(jit_launch(*args), case.fn(*args), rtol=0, atol=0)
            if mismatch:
                prep.errors["fjit_jit_launch"] = f"wrong result: {mismatch}"
            else:
                prep.candidates["fjit_jit_launch"] = lambda: jit_launch(*args)
        except Exception as exc:  # noqa: BLE001
            prep.errors["fjit_jit_launch"] = H.describe_error(exc)
        finally:
            os.environ.pop("FJIT_TRITON_LAUNCH") if old is None else os.environ.update(FJIT_TRITON_LAUNCH=old)
    timer = s.timer(case.timer)
    iters = H.calibrate_iters(prep.candidates["eager"], timer, s.sample_ns,
                              max_iters=2000 if case.timer == "host" else 200)
    misses_before = prep.fjit_misses()
    stats = H.measure(prep.candidates, timer, rounds=s.rounds, iters=iters)
    if misses_before is not None and prep.fjit_misses() != misses_before:
        prep.errors["fjit_cache"] = "cache misses grew during the timed (cached) calls"
    med_ns = {k: v.median_ns for k, v in stats.items()}
    row = {
        "name": case.name, "shape": case.shape(s.smoke), "timer": timer.name,
        "stats": {k: v.to_json() for k, v in stats.items()},
        "fjit_speedup_vs_eager": H.paired_ratio(stats, "eager", "fjit"),
        "fjit_speed_vs_compile": H.paired_ratio(stats, "compile", "fjit"),
        "errors": prep.errors, "fjit_final_trace": final_trace(prep.jitted),
    }
    if case.traffic:
        traffic = case.traffic(args)
        row["bytes"], row["bytes_formula"] = traffic, case.bytes_formula
        row["gbps"] = {k: traffic / ns for k, ns in med_ns.items()}  # bytes/ns == GB/s
    if case.flops:
        flops = case.flops(args)
        row["flops"] = flops
        row["tflops"] = {k: flops / ns / 1e3 for k, ns in med_ns.items()}
    if case.name == "tiny_add":
        row["fjit_over_raw_triton"] = H.paired_ratio(stats, "fjit", "raw_triton")
        row["fjit_over_compile"] = H.paired_ratio(stats, "fjit", "compile")
        row["jit_launch_over_fjit"] = H.paired_ratio(stats, "fjit_jit_launch", "fjit")
    return row


def copy_reference(s: Settings) -> dict:
    numel = COPY["smoke" if s.smoke else "full"]
    src = torch.randn(numel, device=s.device).to(BF16)
    dst = torch.empty_like(src)
    timer = s.timer("events")
    stats = H.measure({"copy": lambda: dst.copy_(src)}, timer, rounds=s.rounds,
                      iters=H.calibrate_iters(lambda: dst.copy_(src), timer, s.sample_ns, 200))
    traffic = 2 * nbytes(src)
    return {"numel": numel, "dtype": "bfloat16", "bytes": traffic,
            "bytes_formula": "2 * 2*N (read src, write dst; bf16)",
            "stats": stats["copy"].to_json(), "gbps": traffic / stats["copy"].median_ns}




def cold_call(s: Settings) -> dict:
    """First call of a function seen by nobody before, with fresh Inductor and Triton disk caches:
    trace, passes, Triton codegen and compile, first run. Measured after the warm suites, so the
    one-time costs of the process (imports, CUDA context) are paid for both compilers."""
    H.isolate_compiler_caches()
    d = {"M": 8, "N": 64} if s.smoke else {"M": 4096, "N": 4096}
    args = rms_args(d, Rand(s.device, seed=2)) + (Rand(s.device, seed=3)(d["N"]),)
    ns = {"torch": torch, "F": F}
    result: dict = {"function": "add + layer_norm + gelu_tanh * sigmoid", "shape": d, "errors": {}}
    impls = {"fjit": lambda fn: fjit.jit(fn, **FJIT_OPTIONS)}
    if s.with_compile:
        impls["compile"] = torch.compile
    for who, wrap in impls.items():
        fn = H.fresh_function(COLD_SOURCE.format(name=f"cold_{who}"), f"cold_{who}", ns)
        impl, out = wrap(fn), {}
        try:
            result[f"{who}_ms"] = H.time_once_ns(lambda: out.setdefault("v", impl(*args)),
                                                 s.sync) / 1e6
            mismatch = H.check_close(out["v"], fn(*args), rtol=2e-2, atol=2e-2)
            if mismatch:
                result["errors"][who] = f"wrong result: {mismatch}"
        except Exception as exc:  # noqa: BLE001
            result["errors"][who] = H.describe_error(exc)
    result["compile_over_fjit"] = H.ratio(result.get("compile_ms"), result.get("fjit_ms"))
    return result


# --------------------------------------------------------------------------------------------
# reporting


def pct_of_copy(row: dict, who: str, copy_gbps: float) -> float | None:
    gbps = row.get("gbps", {}).get(who)
    return None if gbps is None else 100.0 * gbps / copy_gbps


def report(rows: list[dict], copy: dict, cold: dict, smoke: bool) -> list[H.Target]:
    unit = "us"
    table = []
    for r in rows:
        med = {k: v["median_us"] for k, v in r["stats"].items()}
        table.append([
            r["name"], H.fmt(med.get("eager")), H.fmt(med.get("compile")), H.fmt(med.get("fjit")),
            H.fmt(r["fjit_speedup_vs_eager"]), H.fmt(r["fjit_speed_vs_compile"]),
            H.fmt(r.get("gbps", {}).get("fjit"), ".4g"),
            H.fmt(pct_of_copy(r, "fjit", copy["gbps"]), ".1f"),
            H.fmt(pct_of_copy(r, "compile", copy["gbps"]), ".1f"),
            H.fmt(r.get("tflops", {}).get("fjit"), ".1f"), r["shape"]])
    print(f"\nmedian {unit} per call; speed ratios (medians of the per-round paired ratios) "
          "> 1 mean fjit is faster")
    print(H.format_table(["function", "eager", "compile", "fjit", "fjit x eager", "fjit x compile",
                          "fjit GB/s", "fjit %copy", "compile %copy", "fjit TFLOP/s", "shape"],
                         table))
    print(f"copy reference: {copy['gbps']:.0f} GB/s ({copy['numel']:,} bf16 elements, "
          f"{copy['stats']['median_us']:.1f} us)")
    tiny = next((r for r in rows if r["name"] == "tiny_add"), None)
    if tiny:
        med = {k: H.fmt(v["median_us"]) for k, v in tiny["stats"].items()}
        print("tiny call (host-side, per cached call): " +
              ", ".join(f"{k} {v} us" for k, v in med.items()))
    print(f"cold first call: fjit {H.fmt(cold.get('fjit_ms'), '.1f')} ms, "
          f"compile {H.fmt(cold.get('compile_ms'), '.0f')} ms, "
          f"compile/fjit {H.fmt(cold['compile_over_fjit'], '.1f')}")
    for r in rows + [dict(cold, name="cold")]:
        for who, err in r["errors"].items():
            print(f"  ! {r['name']} {who}: {err}")

    targets = []
    for r in rows:
        if "gbps" in r:
            targets.append(H.Target(f"{r['name']} fjit % of copy bandwidth",
                                    pct_of_copy(r, "fjit", copy["gbps"]), ">=",
                                    MEMORY_BOUND_TARGET_PCT))
    targets += [H.Target(f"{r['name']} fjit speed / compile speed", r["fjit_speed_vs_compile"],
                         ">=", 1.2 if r["name"] in COMPILE_1_2X else 1.0) for r in rows]
    if tiny:
        targets += [H.Target("tiny call fjit / raw triton launch", tiny["fjit_over_raw_triton"],
                             "<=", 1.5),
                    H.Target("tiny call fjit / compile cached call", tiny["fjit_over_compile"],
                             "<=", 1 / 1.2),
                    H.Target("tiny call fjit us (allocation + one launch)",
                             tiny["stats"].get("fjit", {}).get("median_us"), "<=", 5.0),
                    H.Target("tiny call kernel[grid] launch / pre-bound launch",
                             tiny.get("jit_launch_over_fjit"), ">=", 1.0)]
    targets.append(H.Target("cold call compile / fjit", cold["compile_over_fjit"], ">=", 5.0))
    print()
    if smoke:
        print("(smoke run: CPU timings under the Triton interpreter; the targets mean nothing)")
    H.print_targets(targets)
    return targets


def plot(rows: list[dict], copy: dict, path: Path) -> Path | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: skipping the bar chart")
        return None
    names = [r["name"] for r in rows]
    who = ["eager", "compile", "fjit"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(13, 8), constrained_layout=True)
    width = 0.27
    for i, w in enumerate(who):
        speed = [H.ratio(r["stats"]["eager"]["median_us"], r["stats"].get(w, {}).get("median_us"))
                 or 0.0 for r in rows]
        top.bar([x + (i - 1) * width for x in range(len(rows))], speed, width, label=w)
    top.axhline(1.0, color="grey", lw=0.8)
    top.set_ylabel("speed vs eager (x)")
    top.set_xticks(range(len(rows)), names, rotation=30, ha="right")
    top.legend()
    bw_rows = [r for r in rows if "gbps" in r]
    for i, w in enumerate(who):
        pct = [pct_of_copy(r, w, copy["gbps"]) or 0.0 for r in bw_rows]
        bottom.bar([x + (i - 1) * width for x in range(len(bw_rows))], pct, width, label=w)
    bottom.axhline(MEMORY_BOUND_TARGET_PCT, color="red", lw=0.8, ls="--",
                   label=f"target {MEMORY_BOUND_TARGET_PCT:g}%")
    bottom.set_ylabel(f"% of copy bandwidth ({copy['gbps']:.0f} GB/s)")
    bottom.set_xticks(range(len(bw_rows)), [r["name"] for r in bw_rows], rotation=30, ha="right")
    bottom.legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU under TRITON_INTERPRET=1: checks fjit == eager")
    parser.add_argument("--with-compile", action="store_true",
                        help="in --smoke, also run torch.compile (slow on the CPU)")
    parser.add_argument("--only", nargs="*", metavar="NAME", help="run only these functions")
    args = parser.parse_args(argv)
    if not args.smoke and not torch.cuda.is_available():
        print("no CUDA device: run with --smoke to check the suite on the CPU", file=sys.stderr)
        return 2
    s = Settings(smoke=args.smoke, device="cpu" if args.smoke else "cuda",
                 with_compile=not args.smoke or args.with_compile,
                 rounds=2 if args.smoke else 10, sample_ns=1e6 if args.smoke else 25e6)
    cases = [c for c in CASES if not args.only or c.name in args.only]
    copy = copy_reference(s)
    rows = []
    for case in cases:
        print(f"running {case.name} ({case.shape(s.smoke)}) ...", flush=True)
        rows.append(run_case(case, s))
        if s.device == "cuda":
            torch.cuda.empty_cache()
    cold = cold_call(s)
    targets = report(rows, copy, cold, s.smoke)
    stem = "gpu_smoke" if s.smoke else "gpu"
    path = H.write_json(f"{stem}.json", {
        "suite": "gpu", "smoke": s.smoke, "environment": H.environment(),
        "fjit_options": FJIT_OPTIONS, "settings": dataclasses.asdict(s), "copy": copy,
        "functions": rows, "cold": cold, "targets": [t.to_json() for t in targets],
    })
    print(f"\nwrote {path.relative_to(H.REPO_ROOT)}")
    png = plot(rows, copy, H.RESULTS_DIR / f"{stem}.png")
    if png:
        print(f"wrote {png.relative_to(H.REPO_ROOT)}")
    checked = rows + [dict(cold, name="cold")]
    failed = [r["name"] for r in checked if any(w.startswith("fjit") for w in r["errors"])]
    if s.smoke:
        print(f"\nsmoke: {len(checked) - len(failed)}/{len(checked)} functions correct under fjit"
              + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if s.smoke and failed else 0


if __name__ == "__main__":
    sys.exit(main())
