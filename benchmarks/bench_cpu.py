"""CPU figures of fjit against eager PyTorch and torch.compile (default mode), measured in one run.

    python benchmarks/bench_cpu.py                # full run, a few minutes
    python benchmarks/bench_cpu.py --quick        # short run, under a minute
    python benchmarks/bench_cpu.py --c-crossover  # C kernels vs torch calls by size (sets MAX_NUMEL_LIBM)
    python benchmarks/bench_cpu.py --workloads    # pointwise chains and row norms, 4 elements to 16M

Writes benchmarks/results/cpu.json and prints the table and the PASS/MISS targets.
See benchmarks/README.md for what each figure means.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import fjit
from benchmarks import harness as H
from fjit.executors.c import build_queue as c_build_queue, executor as c_executor
from fjit.core import meta
from fjit.frontend import tracer

FJIT_OPTIONS: dict = {}   # fjit's defaults: C kernels for small CPU regions, torch calls for the rest
SIZES = {"small": 4, "large": 4 * 2**20}
SCALE = 0.75
COLD_CACHE_ROOT = None   # set by bench_cold


def elementwise10(x, y, s):
    """Ten elementwise ops on two float32 tensors and a runtime float."""
    a = x + y
    b = a * s
    c = torch.sin(b)
    d = c - y
    e = torch.tanh(d)
    f = e * x
    g = torch.sigmoid(f)
    h = f / g
    i = torch.abs(h)
    return torch.clamp(i, 0.0, 4.0)


# The 50-op function of the cold-call figure: these ten steps five times over (values stay bounded).
CHAIN_STEPS = ("{} + y", "{} * s", "torch.sin({})", "{} - x", "torch.tanh({})", "{} * 0.5",
               "torch.sigmoid({})", "torch.abs({})", "{} / 1.5", "torch.clamp({}, -2.0, 2.0)")


def chain50_source(name: str) -> str:
    lines = [f"def {name}(x, y, s):", "    t = x"]
    lines += [f"    t = {CHAIN_STEPS[i % len(CHAIN_STEPS)].format('t')}" for i in range(50)]
    return "\n".join(lines + ["    return t", ""])


def fresh_chain50(i: int):
    name = f"chain50_{i}"
    return H.fresh_function(chain50_source(name), name, {"torch": torch})


def bench_elementwise(quick: bool) -> list[dict]:
    timer = H.CpuTimer()
    rows = []
    for label, numel in SIZES.items():
        torch._dynamo.reset()  # each size gets its own static-shape compile, compile's best case
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(numel, generator=gen)
        y = torch.randn(numel, generator=gen)
        args = (x, y, SCALE)
        prep = H.prepare(elementwise10, args, fjit_options=FJIT_OPTIONS)
        c_executor.wait()   # cached calls: the steady state, with the kernels built
        if "fjit" in prep.candidates:    # prepare() checked the calls before the build: again
            mismatch = H.check_close(prep.candidates["fjit"](), elementwise10(*args))
            if mismatch:
                prep.errors["fjit"] = f"wrong result once the C kernels were loaded: {mismatch}"
                del prep.candidates["fjit"]
        if label == "small":
            iters, rounds = (500, 10) if quick else (2000, 30)
        else:
            iters = H.calibrate_iters(prep.candidates["eager"], timer, 30e6 if quick else 100e6)
            rounds = 5 if quick else 15
        misses_before = prep.fjit_misses()
        stats = H.measure(prep.candidates, timer, rounds=rounds, iters=iters)
        misses_after = prep.fjit_misses()
        if misses_before is not None and misses_after != misses_before:
            prep.errors["fjit_cache"] = (f"cache misses grew from {misses_before} to "
                                         f"{misses_after} during the timed (cached) calls")
        med = {k: s.median_us for k, s in stats.items()}
        rows.append({
            "size": label, "numel": numel, "dtype": "float32",
            "stats": {k: s.to_json() for k, s in stats.items()},
            "fjit_over_eager": H.paired_ratio(stats, "fjit", "eager"),
            "fjit_over_compile": H.paired_ratio(stats, "fjit", "compile"),
            "ratio_of_medians": {"fjit_over_eager": H.ratio(med.get("fjit"), med.get("eager")),
                                 "fjit_over_compile": H.ratio(med.get("fjit"), med.get("compile"))},
            "errors": prep.errors,
        })
    return rows


def _forget_c_kernels() -> None:
    """A fresh kernel cache directory and no kernel in memory: the next C kernel is compiled anew."""
    os.environ["FJIT_CACHE_DIR"] = tempfile.mkdtemp(dir=COLD_CACHE_ROOT)
    c_build_queue._BINARIES.clear()


def bench_cold(quick: bool) -> dict:
    """First call of a freshly decorated 50-op function: trace, passes, codegen, first run.

    C kernels are built in the background (fjit's default), so the first call returns before the
    compiler runs; `c_build_ms` is how long after the call the kernels were loaded."""
    global COLD_CACHE_ROOT
    COLD_CACHE_ROOT = H.isolate_compiler_caches()
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(1024, generator=gen), torch.randn(1024, generator=gen)
    samples_ns, build_ms, errors = [], [], {}
    for i in range(5 if quick else 10):
        # Empty fjit's process-wide memo of meta results and its kernel cache: every sample is a
        # true cold start.
        meta.clear_memo()
        _forget_c_kernels()
        fn = fresh_chain50(i)
        jf = fjit.jit(fn, **FJIT_OPTIONS)
        out = {}
        try:
            samples_ns.append(H.time_once_ns(lambda: out.setdefault("v", jf(x, y, SCALE))))
            build_ms.append(H.time_once_ns(c_executor.wait) / 1e6)
        except Exception as exc:  # noqa: BLE001 - reported in the results
            errors["fjit"] = H.describe_error(exc)
            break
        mismatch = H.check_close(out["v"], fn(x, y, SCALE))
        if mismatch:
            errors["fjit"] = f"wrong result: {mismatch}"
            break
    warm_ns = []     # a new function of ops the process has traced before (meta results memoized)
    for i in range(5 if quick else 10):
        fn = fresh_chain50(100 + i)
        warm_ns.append(H.time_once_ns(lambda: fjit.jit(fn, **FJIT_OPTIONS)(x, y, SCALE)))
        c_executor.wait()
    compile_ns = None
    fn = fresh_chain50(1000)
    compiled = torch.compile(fn)
    try:
        compile_ns = H.time_once_ns(lambda: compiled(x, y, SCALE))
    except Exception as exc:  # noqa: BLE001
        errors["compile"] = H.describe_error(exc)
    fjit_ms = statistics.median(samples_ns) / 1e6 if samples_ns and not errors.get("fjit") else None
    return {
        "ops": 50, "numel": 1024,
        "fjit_first_call_ms": fjit_ms,
        "fjit_samples_ms": [s / 1e6 for s in samples_ns],
        "fjit_warm_process_ms": statistics.median(warm_ns) / 1e6,
        "c_build_ms": statistics.median(build_ms) if build_ms else None,
        "compile_first_call_ms": None if compile_ns is None else compile_ns / 1e6,
        "compile_over_fjit": H.ratio(compile_ns and compile_ns / 1e6, fjit_ms),
        "errors": errors,
    }


def _cold_chain50_ms(index: int, args: tuple) -> float:
    """First call of a fresh chain50 function, with the meta memo and kernel cache emptied before it."""
    meta.clear_memo()
    _forget_c_kernels()
    f = fjit.jit(fresh_chain50(index), **FJIT_OPTIONS)
    ms = H.time_once_ns(lambda: f(*args)) / 1e6
    c_executor.wait()    # the background build must not overlap the next sample
    return ms


def bench_detection(quick: bool) -> dict:
    """What sharp-edge detection costs.  The same function is compiled twice: as fjit does (the
    observer of strict/observer.py watching the traced run) and with the observer replaced by a
    no-op.  Cached calls of the two are timed in the same rounds; detection runs only while
    tracing, so their ratio shows whether the cached path pays anything for it.  Cold chain50
    compiles are sampled in alternation, with and without, and compared pairwise."""
    gen = torch.Generator().manual_seed(2)
    args = (torch.randn(4, generator=gen), torch.randn(4, generator=gen), SCALE)
    with_detection = fjit.jit(elementwise10, **FJIT_OPTIONS)
    without_detection = fjit.jit(elementwise10, **FJIT_OPTIONS)
    with_detection(*args)
    real_observe = tracer.observe
    no_observer = lambda ctx, fn, **tracing: contextlib.nullcontext()  # noqa: E731
    cold_with, cold_without = [], []
    try:
        tracer.observe = no_observer
        without_detection(*args)
        for i in range(10 if quick else 30):
            tracer.observe = real_observe
            cold_with.append(_cold_chain50_ms(300 + i, args))
            tracer.observe = no_observer
            cold_without.append(_cold_chain50_ms(600 + i, args))
    finally:
        tracer.observe = real_observe
    stats = H.measure({"with": lambda: with_detection(*args), "without": lambda: without_detection(*args)},
                      H.CpuTimer(), rounds=10 if quick else 30, iters=500 if quick else 2000)
    return {
        "cached_with_us": stats["with"].median_us, "cached_without_us": stats["without"].median_us,
        "cached_with_over_without": H.paired_ratio(stats, "with", "without"),
        "cold_with_ms": statistics.median(cold_with), "cold_without_ms": statistics.median(cold_without),
        "cold_with_over_without": statistics.median(a / b for a, b in zip(cold_with, cold_without)),
    }


FIRST_IN_PROCESS = """
import json, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import fjit
t2 = time.perf_counter()
x = torch.randn(1024)
f = {wrap}(lambda a, b: torch.sin(a) * b + 1.0)
t3 = time.perf_counter()
f(x, x)
t4 = time.perf_counter()
print(json.dumps({{"import_torch_ms": (t1 - t0) * 1e3, "import_fjit_ms": (t2 - t1) * 1e3,
                  "first_call_ms": (t4 - t3) * 1e3}}))
"""


def bench_first_in_process(quick: bool) -> dict:
    """The first call of a 3-op function in a new interpreter: what a user waits for on the first
    call of a script, one-time initialisation of the compiler included. No target."""
    out = {"fjit": H.run_in_fresh_process(FIRST_IN_PROCESS.format(wrap="fjit.jit"))}
    if not quick:
        out["compile"] = H.run_in_fresh_process(FIRST_IN_PROCESS.format(wrap="torch.compile"))
    return out


def report(rows: list[dict], cold: dict, first: dict, detection: dict) -> list[H.Target]:
    table = []
    for r in rows:
        med = {k: s["median_us"] for k, s in r["stats"].items()}
        table.append([r["size"], f"{r['numel']:,}", H.fmt(med.get("eager")), H.fmt(med.get("fjit")),
                      H.fmt(med.get("compile")), H.fmt(r["fjit_over_eager"], ".3f"),
                      H.fmt(r["fjit_over_compile"], ".3f")])
    print("\n10-op elementwise, float32: median us per cached call; ratios are medians of the "
          "per-round paired ratios (see README)")
    print(H.format_table(["size", "elements", "eager us", "fjit us", "compile us", "fjit/eager",
                          "fjit/compile"], table))
    for r in rows:
        for who, err in r["errors"].items():
            print(f"  ! {r['size']} {who}: {err}")

    print("\ncold first call, 50-op function (trace + compile + run), ms")
    print(H.format_table(["function", "fjit ms (median)", "fjit ms, warm process",
                          "compile ms (1 sample)", "compile/fjit"],
                         [["chain50", H.fmt(cold["fjit_first_call_ms"]),
                           H.fmt(cold["fjit_warm_process_ms"]),
                           H.fmt(cold["compile_first_call_ms"], ".0f"),
                           H.fmt(cold["compile_over_fjit"], ".1f")]]))
    print("  (fjit ms: meta-result memo and kernel cache emptied before each sample; warm process: "
          "a new function of ops already traced)")
    print(f"  C kernels of chain50 built and loaded {H.fmt(cold['c_build_ms'])} ms after the first "
          "call returned (background build; torch calls run until then)")
    for who, err in cold["errors"].items():
        print(f"  ! cold {who}: {err}")
    for who, r in first.items():
        print(f"first call of a 3-op function in a new process, {who}: " + (
            f"{r['first_call_ms']:.0f} ms (import torch {r['import_torch_ms']:.0f} ms, "
            f"import fjit {r['import_fjit_ms']:.0f} ms)" if "error" not in r else f"! {r['error']}"))

    print("\nsharp-edge detection (observer on vs replaced by a no-op), same function and rounds")
    print(H.format_table(["", "with detection", "without", "with/without"], [
        ["cached call, 4 elements (us)", H.fmt(detection["cached_with_us"]),
         H.fmt(detection["cached_without_us"]), H.fmt(detection["cached_with_over_without"], ".3f")],
        ["cold chain50 (ms)", H.fmt(detection["cold_with_ms"]), H.fmt(detection["cold_without_ms"]),
         H.fmt(detection["cold_with_over_without"], ".3f")]]))

    by_size = {r["size"]: r for r in rows}
    targets = [
        H.Target("small fjit/eager", by_size["small"]["fjit_over_eager"], "<=", 1.1),
        H.Target("small fjit/compile", by_size["small"]["fjit_over_compile"], "<=", 0.6),
        H.Target("large fjit/eager", by_size["large"]["fjit_over_eager"], "<=", 1.0),
        H.Target("cold 50-op first call ms", cold["fjit_first_call_ms"], "<", 50.0),
        H.Target("cached call with/without detection", detection["cached_with_over_without"], "<=",
                 1.05),
    ]
    print()
    H.print_targets(targets)
    return targets


def arithmetic10(x, y, s):
    """Ten ops with no C library call: what a C loop vectorizes."""
    a = (x + y) * s
    b = (a - x) * (a - x) + 1.0
    c = b / y - s
    return torch.clamp(torch.abs(c * 0.5), 0.0, 4.0)


def softmax_rows(x, y, s):
    return torch.softmax(x * s, -1) + y


def gelu_tanh(x, y, s):
    """GELU's tanh form written out (F.gelu itself stays one torch call)."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


def softmax(x, y, s):
    return torch.softmax(x * s, -1)


def rms_norm(x, y, s):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), y[0], 1e-6)


def layer_norm(x, y, s):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), y[0], y[0] - 3.0)


# workload -> (function, tensors it reads and writes in units of x's size: the least memory traffic)
WORKLOADS = {"chain10": (elementwise10, 3), "gelu_tanh": (gelu_tanh, 2), "arithmetic10": (arithmetic10, 3),
             "softmax": (softmax, 2), "rms_norm": (rms_norm, 2), "layer_norm": (layer_norm, 2)}
WORKLOAD_SHAPES = ((1, 4), (64, 1024), (1024, 1024), (4096, 4096))


def copy_bandwidth(quick: bool) -> float:
    """GB/s of a 64 MB clone (read + write): what a memory-bound fused kernel can approach."""
    x = torch.randn(1 << 24)
    timer = H.CpuTimer()
    stats = H.measure({"copy": lambda: x.clone()}, timer, rounds=5 if quick else 11, iters=5)
    return 2 * x.numel() * 4 / (stats["copy"].median_us * 1e3)


def bench_workloads(quick: bool, names=None, shapes=WORKLOAD_SHAPES) -> dict:
    """fjit, eager and torch.compile on each workload and shape, cached calls, all candidates
    interleaved round by round in one process (paired ratios: the machine may be loaded)."""
    timer, rows = H.CpuTimer(), []
    copy_gbs = copy_bandwidth(quick)
    for name in names or WORKLOADS:
        fn, traffic = WORKLOADS[name]
        for shape in shapes:
            torch._dynamo.reset()
            gen = torch.Generator().manual_seed(4)
            x = torch.randn(shape, generator=gen)
            y = torch.randn(shape, generator=gen) + 3.0
            args = (x, y, SCALE)
            prep = H.prepare(fn, args, fjit_options=FJIT_OPTIONS, rtol=1e-4, atol=1e-4)
            c_executor.wait()
            iters = H.calibrate_iters(prep.candidates["eager"], timer, 20e6 if quick else 60e6)
            stats = H.measure(prep.candidates, timer, rounds=5 if quick else 11, iters=iters)
            fjit_us = stats["fjit"].median_us if "fjit" in stats else None
            gbs = traffic * x.numel() * 4 / (fjit_us * 1e3) if fjit_us else None
            rows.append({"workload": name, "shape": list(shape), "numel": x.numel(),
                         "stats": {k: v.to_json() for k, v in stats.items()},
                         "fjit_over_eager": H.paired_ratio(stats, "fjit", "eager"),
                         "fjit_over_compile": H.paired_ratio(stats, "fjit", "compile"),
                         "fjit_gbs": gbs, "fjit_copy_fraction": gbs / copy_gbs if gbs else None,
                         "errors": prep.errors})
            r = rows[-1]
            print(f"{name:13} {'x'.join(map(str, shape)):>10}  eager {H.fmt(stats['eager'].median_us):>9} us"
                  f"  fjit/eager {H.fmt(r['fjit_over_eager'], '.3f')}  fjit/compile "
                  f"{H.fmt(r['fjit_over_compile'], '.3f')}  fjit {H.fmt(gbs, '.1f')} GB/s "
                  f"({H.fmt(r['fjit_copy_fraction'], '.2f')} of copy)"
                  + "".join(f"  ! {k}: {v}" for k, v in prep.errors.items()), flush=True)
    print(f"copy bandwidth (64 MB clone, read + write): {copy_gbs:.1f} GB/s")
    targets = []
    for r in rows:
        label = f"{r['workload']} {'x'.join(map(str, r['shape']))}"
        targets.append(H.Target(f"{label} fjit/eager", r["fjit_over_eager"], "<=", 1.0))
        if r["numel"] >= 1 << 20:
            targets.append(H.Target(f"{label} fjit/compile", r["fjit_over_compile"], "<=", 0.8))
            targets.append(H.Target(f"{label} fraction of copy GB/s", r["fjit_copy_fraction"], ">=", 0.6))
        if r["numel"] <= 4:
            targets.append(H.Target(f"{label} fjit/compile", r["fjit_over_compile"], "<=", 0.3))
    print()
    H.print_targets(targets)
    return {"copy_gbs": copy_gbs, "rows": rows, "targets": [t.to_json() for t in targets]}


def bench_c_crossover(quick: bool) -> list[dict]:
    """The C executor against fjit's torch calls and eager at growing sizes, every region claimed
    whatever its size: where C stops paying is what MAX_NUMEL_LIBM is set from."""
    limit = c_executor.MAX_NUMEL_LIBM
    c_executor.MAX_NUMEL_LIBM = 1 << 40
    os.environ["FJIT_C_KERNELS"] = "sync"
    timer, rows = H.CpuTimer(), []
    try:
        for fn, dtype in ((elementwise10, torch.float32), (elementwise10, torch.float64),
                          (arithmetic10, torch.float32), (softmax_rows, torch.float32)):
            for numel in (64, 256, 1024, 4096, 16384, 65536):
                gen = torch.Generator().manual_seed(3)
                shape = (numel // 64, 64) if fn is softmax_rows else (numel,)
                args = (torch.randn(shape, generator=gen, dtype=dtype),
                        torch.randn(shape, generator=gen, dtype=dtype), SCALE)
                c = fjit.jit(fn)
                torch_calls = fjit.jit(fn, executors=("torch",))
                candidates = {"eager": lambda: fn(*args), "c": lambda: c(*args),
                              "torch_calls": lambda: torch_calls(*args)}
                for name in ("c", "torch_calls"):
                    mismatch = H.check_close(candidates[name](), fn(*args))
                    assert not mismatch, f"{fn.__name__} {name}: {mismatch}"
                iters = H.calibrate_iters(candidates["eager"], timer, 5e6 if quick else 20e6)
                stats = H.measure(candidates, timer, rounds=5 if quick else 11, iters=iters)
                rows.append({"function": f"{fn.__name__} {str(dtype)[6:]}", "numel": numel,
                             "eager_us": stats["eager"].median_us,
                             "c_over_eager": H.paired_ratio(stats, "c", "eager"),
                             "torch_calls_over_eager": H.paired_ratio(stats, "torch_calls", "eager")})
    finally:
        c_executor.MAX_NUMEL_LIBM = limit
        os.environ.pop("FJIT_C_KERNELS")
    print(f"C kernels vs torch calls (MAX_NUMEL_LIBM={limit} lifted)")
    print(H.format_table(["function", "elements", "eager us", "C/eager", "torch calls/eager"], [
        [r["function"], f"{r['numel']:,}", H.fmt(r["eager_us"]), H.fmt(r["c_over_eager"], ".2f"),
         H.fmt(r["torch_calls_over_eager"], ".2f")] for r in rows]))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (under a minute)")
    parser.add_argument("--c-crossover", action="store_true",
                        help="only the C-kernel size crossover table (results/cpu_c_crossover.json)")
    parser.add_argument("--workloads", action="store_true",
                        help="only the workload table (results/cpu_workloads.json)")
    parser.add_argument("--only", default=None, help="with --workloads: comma-separated workloads")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads first")
    parser.add_argument("--default-allocator", action="store_true",
                        help="leave glibc's malloc trimming its heap (see harness.pin_allocator)")
    args = parser.parse_args(argv)
    if not args.default_allocator:
        H.pin_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.workloads:
        out = bench_workloads(args.quick, args.only.split(",") if args.only else None)
        path = H.write_json(f"cpu_workloads{'_t%d' % args.threads if args.threads else ''}.json", {
            "suite": "cpu_workloads", "quick": args.quick, "threads": torch.get_num_threads(),
                                                    "environment": H.environment(), **out})
        print(f"\nwrote {path.relative_to(H.REPO_ROOT)}")
        return 0
    if args.c_crossover:
        rows = bench_c_crossover(args.quick)
        path = H.write_json("cpu_c_crossover.json", {"suite": "cpu_c_crossover", "quick": args.quick,
                                                      "environment": H.environment(), "rows": rows})
        print(f"\nwrote {path.relative_to(H.REPO_ROOT)}")
        return 0
    rows = bench_elementwise(args.quick)
    cold = bench_cold(args.quick)
    first = bench_first_in_process(args.quick)
    detection = bench_detection(args.quick)
    targets = report(rows, cold, first, detection)
    path = H.write_json("cpu.json", {
        "suite": "cpu", "quick": args.quick, "environment": H.environment(),
        "fjit_options": FJIT_OPTIONS, "timer": H.CpuTimer.name,
        "elementwise10": rows, "cold": cold,
        "first_call_in_new_process": first, "detection": detection, "targets": [t.to_json() for t in targets],
    })
    print(f"\nwrote {path.relative_to(H.REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
