"""Every Triton kernel of a representative sweep compiles for sm_90 and sm_80 with no register
spills, and one program's registers fit an SM's register file: the CPU-side proof that the GPU path is real (the interpreter says nothing about registers).

The sweep is the kinds of programs the tests run (pointwise chains, softmax, layer/RMS norm,
log_softmax, cross-entropy, variance, full reductions, strided and broadcast inputs) over float32,
float16, bfloat16 and integer types and row widths from 3 to 65536.  Each program is traced with the
torch executor (cheap), and the Triton executor's kernels for its regions are generated as for a
GPU (`target_kernels`) and compiled by Triton's compiler and ptxas in a child process
(fjit/executors/triton/target.py).  Reports are cached on disk by kernel source, so a second run
costs nothing.

The default sweep is deduplicated to a representative set (a few tens of seconds cold on two
cores); FJIT_TARGET_FULL=1 compiles the full product of programs, dtypes and widths (marker
`target_full`).  Every kernel the test suite itself builds can be compiled too: run the suite with
FJIT_TRITON_DUMP_TARGET=DIR, then `python -m fjit.executors.triton.target DIR`.
"""
import os

import pytest
import torch
import torch.nn.functional as F

import fjit
from fjit.executors import kernel_cache_dir

pytest.importorskip("triton")
from fjit.executors.triton import executor, target

pytestmark = pytest.mark.triton
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _rms(x, r, w):
    h = x + r
    return F.rms_norm(h, (h.shape[-1],), w, 1e-6), h


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


# name -> (function, inputs from (rows, width, dtype))
PROGRAMS = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "log_softmax": (lambda x: F.log_softmax(x, -1), lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b), lambda m, n, dt: (
        torch.randn(m, n).to(dt), torch.randn(n).to(dt), torch.randn(n).to(dt))),
    "rms_norm": (_rms, lambda m, n, dt: (torch.randn(m, n).to(dt), torch.randn(m, n).to(dt),
                                         torch.randn(n).to(dt))),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda m, n, dt: (
        torch.randn(m, n).to(dt), torch.randint(0, n, (m,)))),
    "variance": (lambda x: x.var(-1, keepdim=True), lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "sum_of_squares": (lambda x: (x * x).sum(), lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "amax_amin": (lambda x: torch.amax(x, -1) + x.amin(-1), lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "gelu_tanh": (_gelu_tanh, lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "swiglu": (lambda a, b: F.silu(a) * b, lambda m, n, dt: (torch.randn(m, n).to(dt), torch.randn(m, n).to(dt))),
    "transposed": (lambda x, y: torch.exp(x) * y + 1, lambda m, n, dt: (
        torch.randn(n, m).to(dt).t(), torch.randn(m, 1).to(dt))),
    "math_chain": (lambda x: torch.expm1(x) + torch.log1p(x.abs()) + torch.erfc(x) + torch.sinh(x) * torch.tanh(x),
                   lambda m, n, dt: (torch.randn(m, n).to(dt),)),
    "where_int": (lambda x, i: torch.where(i > 2, x, -x) + i, lambda m, n, dt: (
        torch.randn(m, n).to(dt), torch.randint(0, 5, (n,)))),
    "int_chain": (lambda a, b: (a * 3 + b) // 2 - (a & b), lambda m, n, dt: (
        torch.randint(-9, 9, (m, n)), torch.randint(1, 9, (m, n)).int())),
    # Python literals out of the operand's range: torch wraps them to its dtype (int8 & 0xFF is
    # int8 & -1), and Triton refuses an out-of-range literal when it compiles for a GPU
    "int_literals": (lambda x: ((x & 0xFF) + 3 | 0x7FFF) ^ 0x1FFFF, lambda m, n, dt: (
        torch.randint(0, 100, (m, n)).to(dt),)),
}
WIDTHS = (3, 100, 1000, 4096, 8192, 32768, 50000, 65536)
DTYPES = (F32, F16, BF16)

# The representative sweep: every program at a few shapes, the reductions at every width in one
# dtype and at the widest in the others.
REDUCTIONS = ("softmax", "log_softmax", "layer_norm", "rms_norm", "cross_entropy", "variance", "amax_amin")
SWEEP = sorted(
    {(p, 64, n, BF16 if p in ("layer_norm", "rms_norm") else F32) for p in REDUCTIONS for n in WIDTHS}
    | {(p, 4, 65536, dt) for p in ("softmax", "layer_norm", "rms_norm") for dt in DTYPES}
    | {(p, 8, 1000, dt) for p in ("gelu_tanh", "swiglu", "transposed", "math_chain") for dt in DTYPES}
    | {("gelu_tanh", 4096, 4096, BF16), ("swiglu", 1, 3, F32), ("where_int", 5, 7, F32),
       ("int_chain", 33, 65, torch.int64), ("sum_of_squares", 37, 19, F32),
       *(("int_literals", 3, 5, dt) for dt in (torch.int8, torch.uint8, torch.int16, torch.int32,
                                               torch.int64)),
       ("sum_of_squares", 4096, 4096, F32), ("sum_of_squares", 1, 65536, BF16)},
    key=str)
FULL = sorted({(p, rows, n, dt) for p in PROGRAMS for n in WIDTHS for dt in DTYPES
               for rows in (4, 512) if p not in ("where_int", "int_chain", "int_literals")}, key=str)


def kernels_of(program: str, rows: int, width: int, dtype, cache: str = "metadata") -> list:
    fn, make = PROGRAMS[program]
    torch.manual_seed(0)
    jf = fjit.jit(fn, executors=("torch",), cache=cache)
    jf(*make(rows, width, dtype))
    return executor.target_kernels(fjit.last_traces(jf)[-2])


def _jobs(cases) -> list:
    jobs, seen = [], set()
    for case in cases:
        for kernel in kernels_of(*case):
            for arch in target.TARGETS:
                for job in target.job_of(kernel, arch):
                    if job.key() not in seen:
                        seen.add(job.key())
                        jobs.append((case, job))
    return jobs


def _check_all(cases) -> list:
    jobs = _jobs(cases)
    reports = target.check([j for _, j in jobs], os.path.join(kernel_cache_dir(), "target"))
    failed = [f"{case} {r['arch']} {r['constexprs']} warps={r['num_warps']}: {target.problem(r)}"
              for (case, _), r in zip(jobs, reports) if target.problem(r)]
    assert not failed, f"{len(failed)} of {len(reports)} kernels fail or spill:\n" + "\n".join(failed)
    return reports


def test_representative_kernels_compile_for_sm90_and_sm80_without_spills():
    reports = _check_all(SWEEP)
    assert len({r["arch"] for r in reports}) == 2 and len(reports) >= 2 * 40


# Kernels that take their sizes at run time (FJIT_KERNEL_SIZES=runtime: what a later sequence length
# or batch size runs, fjit/executors/runtime_sizes.py): each mode of the plan, and the dtypes.
RUNTIME_SWEEP = sorted(
    {(p, 64, n, F32) for p in ("softmax", "layer_norm", "cross_entropy") for n in (100, 4096, 50000)}
    | {("rms_norm", 64, 1000, BF16), ("gelu_tanh", 8, 1000, F16), ("transposed", 8, 1000, F32),
       ("sum_of_squares", 37, 19, F32), ("sum_of_squares", 4096, 4096, F32), ("where_int", 5, 7, F32)},
    key=str)


def test_runtime_size_kernels_compile_for_sm90_and_sm80_without_spills(monkeypatch):
    monkeypatch.setenv("FJIT_KERNEL_SIZES", "runtime")
    jobs = _jobs(RUNTIME_SWEEP)
    assert all(any(t == "i64" for t in job.signature.values()) for _, job in jobs), \
        "every kernel of the sweep takes its sizes as int64 parameters"
    reports = _check_all(RUNTIME_SWEEP)
    assert len({r["arch"] for r in reports}) == 2


def test_symbolic_program_kernels_compile_for_sm90_and_sm80_without_spills():
    """A symbolic program's kernels (cache="symbolic": rows and width are symbols, so every size
    of the region is an int64 parameter, the plan's choices taken at the hints): the same tier."""
    cases = [case + ("symbolic",) for case in RUNTIME_SWEEP]
    jobs = _jobs(cases)
    # (the transposed input is not contiguous: its sizes stay static, as they do in any symbolic compile)
    assert all(any(any(t == "i64" for t in job.signature.values()) for c, job in jobs if c == case)
               for case in cases if case[0] != "transposed")
    reports = _check_all(cases)
    assert len({r["arch"] for r in reports}) == 2


@pytest.mark.target_full
@pytest.mark.skipif(os.environ.get("FJIT_TARGET_FULL") != "1", reason="FJIT_TARGET_FULL=1 runs the full sweep")
def test_full_sweep_compiles_for_sm90_and_sm80_without_spills():
    _check_all(FULL)


_SPILLING = '''
import triton
import triton.language as tl


@triton.jit
def wide_row(in0, out0, BLOCK: tl.constexpr):
    c = tl.arange(0, BLOCK)
    x = tl.load(in0 + c)
    y = tl.exp(x) * tl.sin(x) + tl.cos(x)
    tl.store(out0, tl.sum(y, axis=0) + tl.max(y, axis=0) * tl.min(x, axis=0))
'''


def test_the_tier_reports_a_kernel_that_spills(tmp_path):
    """The check can fail: a whole 4096-wide row held by one warp (128 values a thread, each kept
    for two reductions) spills, and problem() names the spill bytes."""
    job = target.Job("wide_row", _SPILLING, {"in0": "*fp32", "out0": "*fp32", "BLOCK": "constexpr"},
                     {"BLOCK": 4096}, num_warps=1)
    (report,) = target.check([job], str(tmp_path))
    assert report["ok"], report
    assert report["spill_bytes"] > 0 and "spill bytes" in target.problem(report)
