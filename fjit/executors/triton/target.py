"""Compile generated kernels for a real NVIDIA target without a GPU, and read ptxas's report.

The interpreter (how the tests run kernels on the CPU) is lenient and says nothing about registers,
so every kernel fjit generates must also compile for sm_90 (and sm_80) with no register spills.
Triton compiles for any target on the CPU: `triton.compile(ASTSource(fn, signature, constexprs),
target=GPUTarget("cuda", 90, 32))` gives PTX and a cubin, and the ptxas that Triton runs (shipped in
its wheel) reports registers and spill bytes with `-v`.

Compiling needs Triton's compiler, not its interpreter, so `check` compiles in a child process with
TRITON_INTERPRET unset (a pool of them), and keeps each report on disk keyed by the kernel source,
its signature, its launch options, the target and Triton's version: a sweep compiles a kernel once.

    python -m fjit.executors.triton.target DIR    # every kernel dumped in DIR (*.json), as a table
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys

TARGETS = {"sm_90": 90, "sm_80": 80}
REGISTER_FILE = 65536    # 32-bit registers per SM on sm_80 and sm_90


@dataclasses.dataclass(frozen=True)
class Job:
    """One kernel to compile: its module source, the function's name, its signature (argument ->
    Triton type, "constexpr" for constexprs), the constexprs' values, and launch options."""
    name: str
    source: str
    signature: dict
    constexprs: dict
    num_warps: int
    arch: str = "sm_90"

    def key(self) -> str:
        import triton       # optional: not imported with this module
        text = json.dumps([self.source, self.name, self.signature, self.constexprs, self.num_warps,
                           self.arch, triton.__version__], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]


def job_of(kernel, arch: str = "sm_90") -> list[Job]:
    """The Jobs of a generated Kernel (its stages: one, or two for a split reduction)."""
    return [Job(k.name, k.source, k.signature, k.constexprs, k.num_warps, arch)
            for k in kernel.stages()]


_REPORT = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_STACK = re.compile(r"(\d+) bytes stack frame")


def _compile_here(job: dict, workdir: str) -> dict:
    """Compile one job in this process (which must not be interpreting): ptxas's figures."""
    import triton       # optional: imported only where a kernel is compiled
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    path = os.path.join(workdir, f"{job['name']}_{job['key']}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(job["source"])
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"{job['name']}_{job['key']}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, job["name"])
    names = list(job["signature"])
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
             if job["signature"][n].startswith("*")}
    src = ASTSource(fn, job["signature"], job["constexprs"], attrs)
    target = GPUTarget("cuda", TARGETS[job["arch"]], 32)
    log = io.StringIO()
    triton.knobs.nvidia.dump_ptxas_log = True
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=target, options={"num_warps": job["num_warps"]})
    except Exception as exc:   # noqa: BLE001 - the report says what failed
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    text = log.getvalue()
    regs = [int(m) for m in _REPORT.findall(text)]
    spills = [int(a) + int(b) for a, b in _SPILLS.findall(text)]
    stack = [int(m) for m in _STACK.findall(text)]
    if not regs:
        return {"ok": False, "error": f"no ptxas report in:\n{text[:2000]}"}
    return {"ok": True, "registers": max(regs), "spill_bytes": max(spills, default=0),
            "stack_bytes": max(stack, default=0), "shared": compiled.metadata.shared,
            "ptx_lines": compiled.asm["ptx"].count("\n")}


def _worker(args):
    job, workdir = args
    return job["key"], _compile_here(job, workdir)


def child_main(workers: int) -> None:
    """In the child: compile the jobs read from stdin, with `workers` processes; JSON to stdout."""
    request = json.load(sys.stdin)
    jobs, workdir = request["jobs"], request["workdir"]
    os.environ.pop("TRITON_INTERPRET", None)
    results = {}
    if workers <= 1 or len(jobs) <= 1:
        results = dict(map(_worker, [(j, workdir) for j in jobs]))
    else:
        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
            results = dict(pool.map(_worker, [(j, workdir) for j in jobs], chunksize=1))
    json.dump(results, sys.stdout)


def check(jobs: list[Job], cache_dir: str, workers: int | None = None) -> list[dict]:
    """The ptxas report of each job, in order: {ok, registers, spill_bytes, stack_bytes, ...} or
    {ok: False, error}.  Reports are cached in `cache_dir`; the rest compile in a child process."""
    os.makedirs(cache_dir, exist_ok=True)
    keys = [j.key() for j in jobs]
    reports: dict = {}
    todo = {}
    for job, key in zip(jobs, keys):
        path = os.path.join(cache_dir, f"{key}.json")
        if os.path.exists(path):
            with open(path) as f:
                reports[key] = json.load(f)
        elif key not in todo:
            todo[key] = dict(dataclasses.asdict(job), key=key)
    if todo:
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["TRITON_DEFAULT_FP_FUSION"] = env.get("TRITON_DEFAULT_FP_FUSION", "1")
        env.setdefault("TRITON_CACHE_DIR", os.path.join(cache_dir, "triton"))
        workers = workers or min(len(todo), os.cpu_count() or 1)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        out = subprocess.run(
            [sys.executable, "-c", f"from fjit.executors.triton.target import child_main; "
             f"child_main({workers})"],
            input=json.dumps({"jobs": list(todo.values()), "workdir": cache_dir}),
            capture_output=True, text=True, env=env, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"the target compiler failed:\n{out.stderr[-4000:]}")
        fresh = json.loads(out.stdout)
        for key, report in fresh.items():
            reports[key] = report
            if report.get("ok"):
                with open(os.path.join(cache_dir, f"{key}.json"), "w") as f:
                    json.dump(report, f)
    out = [dict(reports[k], name=j.name, arch=j.arch, num_warps=j.num_warps, constexprs=j.constexprs)
           for j, k in zip(jobs, keys)]
    for r in out:   # one program's registers must fit an SM's register file (64K on sm_80/sm_90)
        r["fits"] = not r["ok"] or r["registers"] * 32 * r["num_warps"] <= REGISTER_FILE
    return out


def problem(report: dict) -> str | None:
    """What is wrong with a kernel's report, or None."""
    if not report["ok"]:
        return report["error"]
    if report["spill_bytes"]:
        return f"{report['spill_bytes']} spill bytes"
    if not report["fits"]:
        return f"{report['registers']} registers x {32 * report['num_warps']} threads exceed the register file"
    return None


def dump(kernel, directory: str) -> None:
    """Write a generated Kernel's jobs to `directory` (FJIT_TRITON_DUMP_TARGET), for `main`."""
    os.makedirs(directory, exist_ok=True)
    for job in job_of(kernel):
        with open(os.path.join(directory, f"{job.key()}.json"), "w") as f:
            json.dump(dataclasses.asdict(job), f)


def main(argv: list[str]) -> int:
    """Compile every kernel dumped in a directory for sm_90 and sm_80; print a summary; exit
    status 1 if any fails or spills."""
    directory = argv[0]
    jobs = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            with open(os.path.join(directory, name)) as f:
                job = Job(**json.load(f))
            jobs += [dataclasses.replace(job, arch=arch) for arch in TARGETS]
    reports = check(jobs, os.path.join(directory, "reports"))
    bad = [r for r in reports if problem(r)]
    for arch in TARGETS:
        mine = [r for r in reports if r["arch"] == arch and r["ok"]]
        most = max(mine, key=lambda r: r["registers"], default=None)
        print(f"{arch}: {len(mine)} kernels compiled, "
              f"{sum(1 for r in mine if r['spill_bytes'])} spill, max spill bytes "
              f"{max((r['spill_bytes'] for r in mine), default=0)}, max registers "
              + (f"{most['registers']} ({most['name']}, {most['constexprs']}, {most['num_warps']} warps)"
                 if most else "-"))
    for r in bad:
        print(f"  ! {r['arch']} {r['name']} {r['constexprs']} warps={r['num_warps']}: {problem(r)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
