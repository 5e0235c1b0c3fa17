"""The C executor: small CPU regions as C kernels built by the system compiler (FJIT_C_KERNELS)."""
import dataclasses
import math
import os
import re
import signal
import stat
import subprocess
import tempfile
import sys
import threading
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import fjit
from fjit.executors.c import build as c_build, build_queue as c_build_queue, elementwise, executor as c_executor

pytestmark = [pytest.mark.ckernels, pytest.mark.usefixtures("sync_build"),
              pytest.mark.skipif(c_executor.compiler() is None, reason="no C compiler on PATH")]


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    """An empty kernel cache, so the kernel really is compiled (and the in-memory builds forgotten)."""
    monkeypatch.setenv("FJIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(c_build_queue, "_BINARIES", {})
    return tmp_path


def _kernels(jf) -> list[str]:
    return re.findall(r"# C kernel (fjit_c_\w+)", str(fjit.last_traces(jf)[-1]))


def _check(fn, *args, kernels=None, exact=False):
    jf = fjit.jit(fn)
    got, want = jf(*args), fn(*args)
    tolerance = {"rtol": 0, "atol": 0} if exact else {}
    torch.testing.assert_close(got, want, equal_nan=True, **tolerance)
    if kernels is not None:
        assert len(_kernels(jf)) == kernels, str(fjit.last_traces(jf)[-1])
    return jf


def _per_thread_count(call, counts):
    """call()'s result under each torch thread count of `counts`, the caller's count restored."""
    threads = torch.get_num_threads()
    try:
        results = []
        for n in counts:
            torch.set_num_threads(n)
            results.append(call())
        return results
    finally:
        torch.set_num_threads(threads)


def _elementwise10(x, y, s):
    a = torch.sin((x + y) * s) - y
    f = torch.tanh(a) * x
    return torch.clamp(torch.abs(f / torch.sigmoid(f)), 0.0, 4.0)


NAN, INF = float("nan"), float("inf")
SPECIAL = torch.tensor([NAN, -INF, INF, -0.0, 0.0, 1.5, -2.5, 3e38, -1e-30, 7.0])

CASES = {
    "elementwise10": (_elementwise10, lambda: (torch.randn(4), torch.randn(4), 0.75), 1),
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(6, 17),), 1),
    "log_softmax_f64": (lambda x: F.log_softmax(x, -1), lambda: (torch.randn(5, 9).double(),), 1),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (12,), w, b), lambda: (
        torch.randn(4, 12), torch.randn(12), torch.randn(12)), 1),
    "rms_norm_residual": (lambda x, r, w: F.rms_norm(x + r, (16,), w, 1e-6), lambda: (
        torch.randn(3, 16), torch.randn(3, 16), torch.randn(16)), None),
    "variance_keepdim": (lambda x: x.var(-1, keepdim=True) + x.mean(-1, keepdim=True),
                         lambda: (torch.randn(7, 11),), 1),
    "full_sum_of_squares": (lambda x: (x * x).sum() + 1, lambda: (torch.randn(9, 5),), 1),
    "prod_and_amin": (lambda x: (x * 0.5).prod(-1) + (x * 2).amin(-1), lambda: (torch.randn(3, 6),), 1),
    "nan_propagating_max_min_clamp": (
        lambda x, y: (torch.maximum(x, y) + torch.minimum(x, y), torch.clamp(x * 2, -1.0, 1.0),
                      (x * 1).amax(-1)),
        lambda: (SPECIAL.view(2, 5), SPECIAL.flip(0).view(2, 5)), None),
    "transposed_and_broadcast": (lambda x, y: torch.exp(x) * y - x, lambda: (
        torch.randn(8, 6).t(), torch.randn(6, 1)), 1),
    "zero_dim_and_scalar_tensor": (lambda x, y: (x * y + 2) / 3, lambda: (
        torch.tensor(1.5), torch.randn(5)), 1),
    "int_wraparound": (lambda a, b: (a * b + a) * 3, lambda: (
        torch.tensor([2**62, -2**62, 7, -1]), torch.tensor([4, 4, -3, 2**63 - 1])), 1),
    "int8_wraparound_and_compare": (lambda a, b: ((a + b) * 3, a * 2 > b), lambda: (
        torch.tensor([100, -100, 5, 127], dtype=torch.int8),
        torch.tensor([100, -100, -5, 1], dtype=torch.int8)), 1),
    "int_true_division_promotes": (lambda a, b: a / b + a, lambda: (
        torch.tensor([7, -7, 0, 3]), torch.tensor([2, 2, 0, -4])), 1),
    "bool_logic_and_where": (lambda x, m: torch.where(m & (x > 0), x, -x) * (~m).float(), lambda: (
        torch.randn(10), torch.rand(10) > 0.5), 1),
    "casts": (lambda x: ((x * 3).to(torch.int32) + 1).to(torch.float64) * 0.5 + (x != 0).float(),
              lambda: (torch.randn(8) * 10,), 1),
    "remainder_fmod_pow_atan2": (
        lambda x, y: torch.remainder(x, y) + torch.fmod(x, y) + torch.pow(x.abs(), y) + torch.atan2(x, y),
        lambda: (torch.randn(12) * 5, torch.randn(12)), 1),
    "bf16_chain_rounds_every_op": (lambda x, y, s: torch.tanh(x * s + y) * 3 - x, lambda: (
        torch.randn(16).bfloat16(), torch.randn(16).bfloat16(), 0.3), 1),
    "f16_softmax_and_sum": (lambda x: (torch.softmax(x, -1), x.sum(-1) * 2), lambda: (
        torch.randn(4, 9).half(),), None),
    "mixed_half_and_float": (lambda x, y: (x.float() * y + 1).half() * 2, lambda: (
        torch.randn(8).half(), torch.randn(8)), 1),
    "round_half_even_sign": (lambda x: torch.round(x * 1) + torch.sign(x - 1),
                             lambda: (torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, NAN, 3.0]),), 1),
    "special_values_math": (lambda x: (torch.exp(x) + torch.log(x.abs()) + torch.sqrt(x.abs()),
                                       torch.rsqrt(x.abs()),             # abs(-0.0) is +0.0
                                       x.isnan(), (x * 2).isinf(), (x + 1).isfinite()),
                            lambda: (SPECIAL,), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_eager(name):
    fn, make, kernels = CASES[name]
    _check(fn, *make(), kernels=kernels)


def test_signed_zeros_as_torch_keeps_them():
    """1 / x shows the sign of a zero: maximum, minimum, clamp and amax keep their first operand
    when the two are equal, abs and sign give +0."""
    z, o = torch.tensor([-0.0, 0.0, -0.0]), torch.tensor([0.0, -0.0, -0.0])
    def f(z, o):
        return (1 / torch.maximum(z, o), 1 / torch.minimum(z, o), 1 / torch.clamp(z * 1, min=0.0),
                1 / torch.clamp(z * 1, max=0.0), 1 / torch.sign(z), 1 / torch.abs(z),
                1 / (z * 1).amax(), 1 / torch.stack([o, z]).amax(0))
    _check(f, z, o, exact=True)


def test_float32_arithmetic_is_bit_identical_to_eager():
    """+ - * / on float32 are correctly rounded in C as in torch, and a Python float is rounded to
    float32 before it is used, as torch's CPU kernels do (0.1 is not 0.1f)."""
    def f(x, y, s):
        return ((x * 0.1 + y) / 3.7 - s) * (y - x * s)
    x, y = torch.randn(64), torch.randn(64)
    _check(f, x, y, 0.3, kernels=1, exact=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_conversions_match_torch_bit_for_bit(dtype):
    """Every 16-bit pattern to float and back, and floats across the whole range (subnormals,
    ties, overflow to inf, NaN) to the half type, as torch converts them."""
    every = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    samples = torch.cat([torch.randn(4000) * 10.0 ** torch.randint(-9, 6, (4000,)),
                         every.float() * (1 + 2.0 ** -12),     # between neighbours: ties and near-ties
                         torch.tensor([6e4, 7e4, 65520.0, 3.4e38, -1e-8, 2.0 ** -25, NAN, INF])])
    to_float = fjit.jit(lambda h: h.float() * 1.0, cache="static")
    to_half = fjit.jit(lambda f: (f * 1.0).to(dtype), cache="static")
    for chunk in every.split(16384):
        torch.testing.assert_close(to_float(chunk), chunk.float(), rtol=0, atol=0, equal_nan=True)
    for chunk in samples.split(16384):
        got, want = to_half(chunk), chunk.to(dtype)
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got[~want.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))
    assert _kernels(to_float) and _kernels(to_half)


def test_half_log_softmax_is_computed_in_float32_and_rounded_once():
    """fjit's decomposition upcasts, as torch's refs do; torch's CPU kernel rounds log(sum(exp))
    to bfloat16 first, which is off by 4% here (eager -0.0825, exact -0.0789)."""
    x = torch.tensor([-1.0, 1.5]).bfloat16()
    jf = fjit.jit(lambda x: F.log_softmax(x, 0))
    assert torch.equal(jf(x), F.log_softmax(x.float(), 0).bfloat16())
    assert len(_kernels(jf)) == 1


def test_runtime_float_is_an_argument_not_a_literal():
    jf = fjit.jit(lambda x, s: x * s + s)
    x = torch.randn(5)
    for s in (0.5, -3.25, 1e-3):
        torch.testing.assert_close(jf(x, s), x * s + s)
    assert fjit.cache_info(jf).misses == 1
    assert len(_kernels(jf)) == 1


def test_large_tensors_fuse_and_scalar_libm_math_stays_with_torch():
    big = torch.randn(1 << 17)
    _check(lambda x: torch.sin(x * 2 + 1) * 3 - 1, big, kernels=1)
    # float64's sin is a scalar libm call: at a size where that is slower than torch's vector code,
    # sin stays a torch call between kernels
    mid = torch.randn(c_executor.MAX_NUMEL_LIBM * 2).double()
    jf = _check(lambda x: torch.sin(x * 2 + 1) * 3 - 1, mid, kernels=2)
    assert "prims.sin" in str(fjit.last_traces(jf)[-1])


def test_square_is_a_product_not_a_libm_call():
    mid = torch.randn(c_executor.MAX_NUMEL_LIBM * 4)
    jf = _check(lambda x: (x * 0.5).pow(2) + 1, mid, kernels=1, exact=True)
    assert "(x0 * x0)" in _kernel_text(jf) or "v1 * v1" in _kernel_text(jf), _kernel_text(jf)


def test_bool_tensors_are_bytes_in_memory_and_read_as_bools():
    """A bool tensor's elements are uint8_t in a kernel's signature (gcc vectorizes no loop that
    loads _Bool next to floats), read into bool values and written as 0 or 1: a mask in, a mask
    out, and a select on it, as eager's."""
    g = torch.Generator().manual_seed(0)
    mask, x = torch.rand(4, 4096, generator=g) > 0.5, torch.randn(4, 4096, generator=g)

    def f(mask, x):
        y = torch.where(mask, x, x * 0.01) + 1
        return y, (y > 1) & ~mask
    jf = _check(f, mask, x, kernels=1, exact=True)
    text = str(fjit.last_traces(jf)[-1])
    assert "const uint8_t *restrict in1" in text and "uint8_t *restrict out1" in text, text
    assert "bool *restrict" not in text and "bool x1 = in1[c];" in text, text


def test_torch_level_ops_stay_whole_unless_all_their_prims_fuse():
    """At a size where gelu's tanh stays with torch, gelu stays one torch call (not ten prims)."""
    x = torch.randn(4, c_executor.MAX_NUMEL_LIBM)
    jf = _check(lambda x, s: F.gelu(x, approximate="tanh") * s + 1, x, 0.5, kernels=1)
    calls = [line for line in str(fjit.last_traces(jf)[-1]).splitlines()
             if not line.strip().startswith("#")]
    assert any("torch.nn.functional.gelu(" in c for c in calls), calls
    assert not any("prims." in c for c in calls), calls


def test_tensors_with_the_negative_bit_are_read_by_value():
    """x.conj().imag is a view whose data holds -value: kernels read raw data, so such inputs (and
    programs making complex values) stay with torch, and the cache keeps them apart."""
    z = torch.randn(4, dtype=torch.complex64)
    neg = z.conj().imag
    assert neg.is_neg()
    plain = neg.resolve_neg()
    jf = fjit.jit(lambda x: x * 2 + 1)
    assert torch.equal(jf(plain), plain * 2 + 1) and _kernels(jf)
    assert torch.equal(jf(neg), neg * 2 + 1) and not _kernels(jf)
    assert fjit.cache_info(jf).misses == 2
    jf = _check(lambda z: z.conj().imag * 2 + 1, z)
    assert not _kernels(jf)


def test_grad_runs_kernels_forward_and_backward():
    # an input requiring grad gets a compiled backward, fused like the forward
    x = torch.randn(4, requires_grad=True)
    jf = fjit.jit(lambda x: (x * 2 + 1).sin())
    jf(x).sum().backward()
    assert _kernels(jf) != []
    assert re.findall(r"# C kernel (fjit_c_\w+)", str(fjit.last_backward_traces(jf)[-1]))
    torch.testing.assert_close(x.grad, 2 * torch.cos(x.detach() * 2 + 1))


def test_executor_choice_and_off_switch(monkeypatch):
    x = torch.randn(4)
    assert _kernels(_check(lambda x: x * 2 + 1, x)) != []
    jf = fjit.jit(lambda x: x * 2 + 1, executors=("torch",))
    jf(x)
    assert _kernels(jf) == []
    monkeypatch.setenv("FJIT_C_KERNELS", "0")
    assert _kernels(_check(lambda x: x * 2 + 1, x)) == []
    monkeypatch.setenv("FJIT_C_KERNELS", "yes please")
    with pytest.raises(ValueError, match="FJIT_C_KERNELS='yes please' is not one of"):
        fjit.jit(lambda x: x * 2 + 1)(x)
    monkeypatch.setattr(c_build, "_COMPILER", [None])
    monkeypatch.setenv("FJIT_C_KERNELS", "sync")
    assert _kernels(_check(lambda x: x * 2 + 1, x)) == []


def _kernel_text(jf) -> str:
    return "".join(re.findall(r"# C kernel.*?\n  t", str(fjit.last_traces(jf)[-1]), re.S))


def _slow_compiler(tmp_path):
    """A compiler that waits for the file `go` before running the real one."""
    real = c_executor.compiler()
    script = tmp_path / "slow-cc"
    flag = tmp_path / "go"
    script.write_text(f"#!/bin/sh\nwhile [ ! -e {flag} ]; do sleep 0.01; done\nexec {real} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script), flag


def test_background_build_runs_torch_until_the_kernel_is_loaded(monkeypatch, fresh_cache, tmp_path):
    monkeypatch.setenv("FJIT_C_KERNELS", "background")
    cc, go = _slow_compiler(tmp_path)
    monkeypatch.setattr(c_build, "_COMPILER", [cc])
    x, y = torch.randn(4), torch.randn(4)
    jf = fjit.jit(_elementwise10)
    torch.testing.assert_close(jf(x, y, 0.5), _elementwise10(x, y, 0.5))   # returned before the build
    (name,) = _kernels(jf)
    binary = c_build_queue._BINARIES[name]
    assert binary.fn is None and not binary.done.is_set()
    torch.testing.assert_close(jf(x, y, 0.25), _elementwise10(x, y, 0.25))  # the torch fallback
    go.touch()
    assert c_executor.wait(60)
    assert binary.fn is not None and binary.error is None
    torch.testing.assert_close(jf(x, y, 0.25), _elementwise10(x, y, 0.25))  # the kernel
    assert fjit.cache_info(jf).misses == 1


def test_every_case_is_right_while_its_kernel_is_still_building(monkeypatch, fresh_cache, tmp_path):
    """Until a kernel is loaded its region's prims run one by one (the fallback)."""
    monkeypatch.setenv("FJIT_C_KERNELS", "background")
    cc, go = _slow_compiler(tmp_path)
    monkeypatch.setattr(c_build, "_COMPILER", [cc])
    try:
        for name, (fn, make, kernels) in CASES.items():
            args = make()
            jf = fjit.jit(fn)
            torch.testing.assert_close(jf(*args), fn(*args), equal_nan=True, msg=name)
            assert all(c_build_queue._BINARIES[k].fn is None for k in _kernels(jf)), name
    finally:
        go.touch()
        assert c_executor.wait(120)


def test_a_kernel_no_program_refers_to_is_unloaded(fresh_cache, monkeypatch):
    import gc
    monkeypatch.setattr(c_build_queue, "_BINARIES", weakref.WeakValueDictionary())
    jf = _check(lambda x: x * 3 + 2, torch.randn(5), kernels=1)
    (name,) = _kernels(jf)
    assert name in c_build_queue._BINARIES
    del jf
    gc.collect()
    assert name not in c_build_queue._BINARIES
    # loaded again from disk; `jf` keeps it loaded (a binary no function refers to is unloaded)
    jf = _check(lambda x: x * 3 + 2, torch.randn(5), kernels=1)  # noqa: F841
    assert c_build_queue._BINARIES[name].fn is not None


def test_kernel_binaries_are_reused_from_disk(monkeypatch, fresh_cache):
    x = torch.randn(6)
    (name,) = _kernels(_check(lambda x: x * 3 - 1, x))
    assert (fresh_cache / f"{name}.so").exists()
    # a new process: nothing in memory, and no compiler to build with
    monkeypatch.setattr(c_build_queue, "_BINARIES", {})
    monkeypatch.setattr(c_build, "_COMPILER", ["/nonexistent/cc"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jf = _check(lambda x: x * 3 - 1, x)
    assert _kernels(jf) == [name] and c_build_queue._BINARIES[name].fn is not None


def test_a_broken_binary_on_disk_is_built_again(fresh_cache):
    """In a new process (this one has the kernel's library loaded under its name already)."""
    x = torch.randn(6)
    (name,) = _kernels(_check(lambda x: x * 3 - 1, x))
    # replaced (a new file, as a build writes one), never overwritten: this process has the
    # library mapped, and truncating a mapped file kills the process with SIGBUS when it is read
    (fresh_cache / "broken").write_bytes(b"not a shared library")
    os.replace(fresh_cache / "broken", fresh_cache / f"{name}.so")
    script = ("import torch, fjit\n"
              "f = fjit.jit(lambda x: x * 3 - 1)\n"
              "x = torch.randn(6)\n"
              "assert torch.equal(f(x), x * 3 - 1)\n")
    env = dict(os.environ, FJIT_CACHE_DIR=str(fresh_cache), FJIT_C_KERNELS="sync")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300)
    assert (fresh_cache / f"{name}.so").read_bytes()[:4] == b"\x7fELF"


def test_an_unwritable_cache_directory_gives_one_temporary_directory(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("FJIT_CACHE_DIR", str(blocked / "kernels"))
    monkeypatch.setattr(c_build_queue, "_BINARIES", {})
    kernels_dir = c_build_queue.kernel_cache_dir()
    assert kernels_dir != str(blocked / "kernels") and os.path.isdir(kernels_dir)
    _check(lambda x: x * 4 - 1, torch.randn(3), kernels=1)
    assert c_build_queue.kernel_cache_dir() == kernels_dir and len(os.listdir(kernels_dir)) == 1


def test_a_failing_compiler_warns_once_and_results_stay_right(monkeypatch, fresh_cache, tmp_path):
    failing = tmp_path / "broken-cc"
    failing.write_text("#!/bin/sh\necho 'cc: fatal error: no space left' >&2\nexit 1\n")
    failing.chmod(failing.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(c_build, "_COMPILER", [str(failing)])
    monkeypatch.setattr(c_build_queue, "_WARNED", [])
    x = torch.randn(4)
    with pytest.warns(RuntimeWarning, match="no space left"):
        jf = _check(lambda x: x * 3 - 1, x)
    (name,) = _kernels(jf)
    assert c_build_queue._BINARIES[name].error is not None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(lambda x: x * 5 - 2, x)     # a second failure does not warn again


def test_threads_share_one_build(monkeypatch, fresh_cache):
    monkeypatch.setenv("FJIT_C_KERNELS", "background")
    jf = fjit.jit(_elementwise10)
    x, y = torch.randn(4), torch.randn(4)
    errors = []

    def worker(seed):
        try:
            for i in range(50):
                s = (seed + i) / 50
                torch.testing.assert_close(jf(x, y, s), _elementwise10(x, y, s))
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert fjit.cache_info(jf).misses == 1
    assert c_executor.wait(60)
    assert len(c_build_queue._BINARIES) == 1


def test_kernel_source_holds_only_generated_names_and_numbers():
    """Strings of the user never reach C: the source's identifiers are fjit's own."""
    def f(x, d):
        return x * d["scale; system(\"rm -rf /\");"] + 1
    x = torch.randn(3)
    jf = _check(f, x, {"scale; system(\"rm -rf /\");": 2.0}, kernels=1)
    assert "system" not in _kernel_text(jf) and "rm -rf" not in _kernel_text(jf)


def test_kernels_take_tensors_through_their_entry_point_and_agree_with_ctypes():
    """Where the Python headers are there, a binary carries an entry point taking the tensors
    themselves (launch.py); it computes what the ctypes call computes, from parameters and from
    tensor types whose data pointer torch's exported function does not read (asked of the tensor
    instead), and a wrong argument count is a TypeError, not a crash."""
    from fjit.executors.c import launch

    class Marked(torch.Tensor):
        pass
    fn = lambda x, w, s: ((x * w + s).sin() * 2).exp()  # noqa: E731
    x, w = torch.randn(40, 33), torch.nn.Parameter(torch.randn(33))
    with torch.no_grad():
        jf = _check(fn, x, w, 0.5, kernels=1)
        expected = fn(x, w, 0.5)
    binary = next(b for b in list(c_build_queue._BINARIES.values()) if b.kernel.name == _kernels(jf)[0])
    assert binary.fn is not None and (binary.fast is not None) == bool(launch.PYTHON_FLAGS)
    if binary.fast is None:
        return
    # x, w, s, out (and, where FJIT_KERNEL_SIZES=runtime, the sizes after them)
    assert [p for p in binary.kernel.params if p[0] != "size"] == [("in", 0), ("in", 1), ("in", 2), ("out", 0)]
    sizes = [value for kind, value in binary.kernel.params if kind == "size"]
    sizes += [1] if binary.kernel.threaded else []      # and the thread count, last
    for first in (x, x.as_subclass(Marked)):
        out, out2 = torch.empty_like(expected), torch.empty_like(expected)
        binary.fast(first, w, 0.5, out, *sizes)
        binary.fn(x.data_ptr(), w.data_ptr(), 0.5, out2.data_ptr(), *sizes)
        torch.testing.assert_close(out, expected)
        assert torch.equal(out, out2)
    with pytest.raises(TypeError, match=f"takes {4 + len(sizes)} arguments"):
        binary.fast(x, w)


def test_integer_division_stays_with_torch():
    """Integer division (whose division by zero raises in torch) stays torch calls."""
    jf = _check(lambda a, b: (a // b) + (a % b) * 2, torch.tensor([7, -7, 5]), torch.tensor([2, 3, -2]),
                kernels=1)
    final = str(fjit.last_traces(jf)[-1])
    assert "prims.floor_divide(" in final and "prims.remainder(" in final


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_build_state_is_reset_in_a_forked_child(monkeypatch, fresh_cache):
    monkeypatch.setenv("FJIT_C_KERNELS", "background")
    jf = fjit.jit(lambda x: x * 7 + 1)
    x = torch.randn(4)
    jf(x)
    pid = os.fork()
    if pid == 0:   # the child: a build it inherited unfinished is queued again by the next call
        signal.alarm(120)    # a hung child must fail the test, not hang it
        ok = torch.equal(jf(x), x * 7 + 1) and c_executor.wait(60)
        ok = ok and all(b.fn is not None for b in c_build_queue._BINARIES.values())
        os._exit(0 if ok and torch.equal(jf(x), x * 7 + 1) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_executors_are_asked_in_the_users_order(monkeypatch):
    """executors= is an order: the first executor that can take a region takes it, and the stages
    say which ran (Triton runs CPU tensors under TRITON_INTERPRET=1 with FJIT_TRITON_CPU on)."""
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")

    def f(x):
        return torch.exp(x) * 2 + 1
    x = torch.randn(8)
    for order, first in ((("c", "triton", "torch"), "c_fusion"), (("triton", "c", "torch"), "triton_fusion")):
        jf = fjit.jit(f, executors=order)
        torch.testing.assert_close(jf(x), f(x))
        stages = [t.stage for t in fjit.last_traces(jf)]
        assert first in stages, (order, stages)
        other = "triton_fusion" if first == "c_fusion" else "c_fusion"
        assert other not in stages, (order, stages)    # the first took the only region


# -- kernels at every size: vector math, threads, flags -------------------------------------------

def _ordered(t: torch.Tensor) -> torch.Tensor:
    """float32 bit patterns as integers in the order of the values (ulp distance = difference)."""
    i = t.view(torch.int32).to(torch.int64)
    return torch.where(i < 0, -(i & 0x7FFFFFFF), i)


def _float32_sample(step: int) -> torch.Tensor:
    """Every `step`-th float32 bit pattern, with every special value (+-0, +-inf, NaN, the
    smallest denormals, the largest finite values)."""
    bits = torch.cat([torch.arange(0, 2**32, step, dtype=torch.int64), torch.tensor(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x80000001, 0x7F7FFFFF, 0xFF7FFFFF])])
    return (bits - (bits >= 2**31).long() * 2**32).to(torch.int32).view(torch.float32)


def _vector_forms() -> dict:
    """prim -> its C float32 vector form (each states its measured ulp bound)."""
    from fjit.core.prims import ROWS
    return {p: b.kernels["c_vector"] for p, b in ROWS.items() if "c_vector" in b.kernels}


def _max_ulp_against_torch(step: int) -> dict:
    x = _float32_sample(step)
    out = {}
    for prim in _vector_forms():
        op = getattr(torch, prim.name.lower())
        jf = fjit.jit(lambda x: op(x * 1.0))            # x * 1.0 keeps every value: one kernel
        got, want = jf(x), op(x)
        assert len(_kernels(jf)) == 1 and f"fj_{prim.name.lower()}f" in _kernel_text(jf)
        assert torch.equal(got.isnan(), want.isnan()), prim
        ok = ~want.isnan()
        out[prim] = int((_ordered(got[ok]) - _ordered(want[ok])).abs().max())
    return out


def test_vector_math_ulp_error_against_torch():
    """float32 exp, log, log1p, tanh, sigmoid, erf, sin, cos in C kernels: within their vector
    forms' `ulp` of torch over a dense sample of float32 (NaN where torch gives NaN); sin/cos of
    huge arguments (past vecmath's range) are recomputed with the C library."""
    forms = _vector_forms()
    assert len(forms) == 8 and all(f.ulp is not None for f in forms.values())
    for prim, ulps in _max_ulp_against_torch(65537).items():
        assert ulps <= forms[prim].ulp, (prim, ulps)


@pytest.mark.slow
def test_vector_math_ulp_error_dense_sweep():
    """The same over every 61st float32 (70 million values): the figures in docs/design.md."""
    forms = _vector_forms()
    for prim, ulps in _max_ulp_against_torch(61).items():
        assert ulps <= forms[prim].ulp, (prim, ulps)


def test_denormals_survive_in_torch_after_kernels_load():
    """Kernels are built without -ffast-math, which could switch on flush-to-zero process-wide."""
    jf = _check(lambda x: torch.exp(x) * 2 + x, torch.randn(64), kernels=1)
    assert c_build_queue._BINARIES[_kernels(jf)[0]].fn is not None
    tiny = torch.tensor([1e-40, -3e-42, 2.0 ** -148])
    assert bool((tiny * 0.5 != 0).all()) and bool((tiny + 0 == tiny).all())
    assert (torch.tensor([2.0 ** -126]) / 4).item() == 2.0 ** -128
    assert "-ffast-math" not in c_build.CFLAGS and "-Ofast" not in c_build.CFLAGS
    # and the kernels themselves keep denormal inputs and results
    torch.testing.assert_close(jf(tiny), torch.exp(tiny) * 2 + tiny, rtol=0, atol=0)


def test_large_regions_are_threaded_and_bit_identical_whatever_the_thread_count():
    """Above PARALLEL_MIN elements a kernel shares rows or blocks among torch.get_num_threads()
    threads; reductions keep a fixed lane chunking, so results do not depend on the thread count."""
    from fjit.executors.c import codegen
    x = torch.randn(64, 2048) * 4
    y = torch.randn(2048)
    fn = lambda x, y: (torch.softmax(x * 0.5, -1) + y, (x * y).sum(-1), (x * 2).amax(-1),  # noqa: E731
                       torch.tanh(x) * y - torch.exp(-x.abs()))
    assert x.numel() >= codegen.PARALLEL_MIN
    jf = fjit.jit(fn)
    results = _per_thread_count(lambda: jf(x, y), (1, 2, 3))
    assert "omp parallel for" in str(fjit.last_traces(jf)[-1])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert torch.equal(a, b)
    want = fn(x, y)
    for k in (0, 2, 3):
        torch.testing.assert_close(results[0][k], want[k], rtol=1e-5, atol=1e-5)
    # float32 sums: within accumulators.SUM_BLOCK's bound of the exact sum (test below); against
    # torch's, whose summation order is another, a 2048-term sum of magnitude ~100 can differ by
    # 1e-4 (a fixed 1e-5 tolerance failed on some random draws)
    exact = (x.double() * y.double()).sum(-1)
    bound = 64 * 2.0 ** -24 * (x.double() * y.double()).abs().sum(-1) + exact.abs() * 2.0 ** -23
    assert ((results[0][1].double() - exact).abs() <= bound).all()


def test_a_softmax_of_narrow_rows_is_threaded_from_fewer_elements():
    """A row reduction over costly values (softmax's exp) is shared among threads from
    PARALLEL_MIN_COSTLY_ROWS elements (attention's rows of 16 keys), a cheap one not; either way
    the result is the same whatever the thread count."""
    from fjit.executors.c import codegen
    x = torch.randn(512, 16)
    assert codegen.PARALLEL_MIN_COSTLY_ROWS <= x.numel() < codegen.PARALLEL_MIN
    for fn, threaded in ((lambda x: torch.softmax(x, -1), True), (lambda x: (x * 2).sum(-1), False)):
        jf = fjit.jit(fn)
        results = _per_thread_count(lambda: jf(x), (1, 2, 3))
        assert ("omp parallel for" in str(fjit.last_traces(jf)[-1])) is threaded
        assert all(torch.equal(results[0], r) for r in results[1:])
        torch.testing.assert_close(results[0], fn(x))


@pytest.mark.parametrize("width", [64, 1024])
def test_a_wide_row_reduction_keeps_two_vectors_of_partial_results(width):
    """One float32 vector of partial maxima or sums is a chain of dependent instructions, one per
    vector of the row; a row of at least 4 * WIDE_LANES elements keeps WIDE_LANES partial results
    (softmax 64x1024: 37 -> 25 us a call on one thread), a narrower row LANES (a row of 64 would
    leave most of it to the scalar tail)."""
    from fjit.executors.c import accumulators
    lanes = accumulators.row_lanes(width)
    assert lanes == (accumulators.WIDE_LANES if width == 1024 else accumulators.LANES)
    x = torch.randn(64, width) * 4
    fn = lambda x: torch.softmax(x * 1.5, -1)  # noqa: E731
    jf = fjit.jit(fn)
    got = jf(x)
    text = _kernel_text(jf)
    # the max's and the sum's partial results, each set to its identity in a loop over the lanes
    declared = re.findall(r"for \(int l = 0; l < (\d+); l\+\+\) \w+\[l\] = (?:-INFINITY|0);", text)
    assert len(declared) >= 2 and set(declared) == {str(lanes)}, declared
    torch.testing.assert_close(got, fn(x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("width", [17, 1024, 1030, 5000, 1 << 18])
def test_float32_sums_in_float_lanes_stay_within_their_bound_and_near_torch(width):
    """accumulators.SUM_BLOCK's precision argument, measured: a float32 row sum adds blocks of 1024
    elements in 16 float lanes (64 roundings each; 32 lanes in a wide row, 32 roundings) folded
    into double, so its error against the exact sum is at most 64 * 2^-24 * sum|x| plus the final
    rounding, whatever the row's length;
    and over many rows it is as close to the exact sum as torch's own float32 sum, on mixed signs
    and on positive terms (softmax's denominator)."""
    torch.manual_seed(width)
    rows = max(2, (1 << 19) // width)
    for x in (torch.randn(rows, width) * 3, torch.rand(rows, width) + 0.5):
        jf = fjit.jit(lambda x: (x * 1.0 + 0.0).sum(-1))
        got = jf(x).double()
        assert "C kernel" in str(fjit.last_traces(jf)[-1])
        exact = x.double().sum(-1)
        bound = 64 * 2.0 ** -24 * x.double().abs().sum(-1) + exact.abs() * 2.0 ** -23
        err = (got - exact).abs()
        assert (err <= bound).all(), (err / bound).max()
        torch_err = (x.sum(-1).double() - exact).abs()
        assert err.mean() <= 2 * torch_err.mean() + 1e-12, (err.mean(), torch_err.mean())


def test_large_float32_arithmetic_is_bit_identical_and_broadcasts_read_by_stride():
    """+ - * / stay exact at every size, through merged loops, broadcasts and transposed inputs;
    x ** 3 is x * x * x as in torch's kernel."""
    x, y = torch.randn(300, 257), torch.randn(257)
    z = torch.randn(257, 300).t()
    fn = lambda x, y, z, s: ((x * 0.1 + y) / 3.7 - s) * (z - x * s) + x ** 3  # noqa: E731
    jf = _check(fn, x, y, z, 0.3, kernels=1, exact=True)
    assert "pow" not in _kernel_text(jf)
    _check(lambda x: (x + 1) * 2, torch.randn(1 << 16)[::2], kernels=1, exact=True)


def test_a_channels_last_region_is_walked_in_memory_order_as_one_loop():
    """An elementwise region over channels-last activations (a per-channel scale broadcast over
    them) walks the elements in memory order: one loop with unit stride, not the logical NCHW
    order with the channel stride innermost; the result has eager's layout and values."""
    x = torch.randn(4, 24, 10, 10).contiguous(memory_format=torch.channels_last)
    scale = torch.randn(24, 1, 1)
    fn = lambda x, s: (x * s + 1.5) * x  # noqa: E731
    jf = _check(fn, x, scale, kernels=1, exact=True)
    assert jf(x, scale).stride() == fn(x, scale).stride()
    text = _kernel_text(jf)
    assert re.search(r"hi = (lo \+ )?\d+", text) and "* 24]" not in text and "* 24 +" not in text, text


def test_costly_row_values_are_kept_for_later_passes_and_huge_trig_arguments_use_libm():
    """softmax's exp is computed once per element (a row buffer holds it for the last pass); a row
    holding a sin argument past vecmath's range is computed again with the C library."""
    x = torch.randn(8, 300)
    jf = _check(lambda x: torch.softmax(torch.sin(x * 3.0), -1), x, kernels=1)
    text = _kernel_text(jf)
    assert "fj_s0[c] = " in text and "fj_bad" in text and "sinf(" in text
    huge = x * 1e7
    huge[3, 7] = float("inf")
    torch.testing.assert_close(jf(huge), torch.softmax(torch.sin(huge * 3.0), -1), equal_nan=True)


def test_regions_sharing_one_kernel_source_keep_their_own_output_layouts():
    """Two regions can generate one C source (a flat elementwise loop over 1536 values is the same
    for [16, 6, 4, 4] and [4, 24, 4, 4]) and share its binary, but each launcher allocates its own
    region's outputs.  Registered under the source's name alone, one launcher served both, and one
    region got the other's output shape back: a silently wrong result (how torchvision's swin_t
    computed wrong gradients from its second call on)."""
    def f(a, b):
        return (a * 2 + 1).exp(), (b * 2 + 1).exp()

    a, b = torch.randn(16, 6, 4, 4), torch.randn(4, 24, 4, 4)
    jf = fjit.jit(f)
    for _ in range(2):
        torch.testing.assert_close(jf(a, b), f(a, b))
    final = str(fjit.last_traces(jf)[-1])
    assert len(set(_kernels(jf))) == 1, final                 # one binary...
    launchers = re.findall(r"= (fjit_c_\w+)\(", final)
    assert len(launchers) == 2 and len(set(launchers)) == 2, final   # ...two launchers


def _kernel_calls(trace) -> list[tuple[int, int]]:
    """(outputs, inputs) of each C kernel call of a printed trace."""
    calls = re.findall(r"^  (\(?[\w, ]+\)?) = (fjit_c_\w+)\(([\w, ]*)\)", str(trace), re.M)
    return [(len(outs.strip("()").split(",")), len(args.split(","))) for outs, _, args in calls]


def test_values_a_later_kernel_reads_are_computed_again_there_not_stored():
    """GELU's pieces feed a matmul and, after it, another kernel: the first kernel stores only what
    the matmul reads, and the second computes x/2, erf(x/sqrt(2)) + 1 again from x."""
    def f(x, b, w):
        h = x + b
        half, e = h * 0.5, torch.erf(h * 0.7071067811865476) + 1
        y = half * e
        m = y @ w
        return m, (m.sum(-1, keepdim=True) * half * e.exp() + h * 3)
    x, b, w = torch.randn(8, 64), torch.randn(64), torch.randn(64, 64)
    jf = _check(f, x, b, w)
    calls = _kernel_calls(fjit.last_traces(jf)[-1])
    assert calls and calls[0][0] == 1, (calls, str(fjit.last_traces(jf)[-1]))


def test_a_recomputed_value_that_a_later_recomputation_reads_is_defined_once(monkeypatch):
    """Residual blocks (RegNet's eval forward): the second kernel computes relu(a + b) again
    rather than loading it, and the third computes the second's output again, reading
    relu(a + b): the value is stored by the kernel that computed it first, never defined twice
    (check mode verifies every stage is SSA and agrees with the first)."""
    monkeypatch.setenv("FJIT_CHECK", "1")

    def f(a, b, w):
        h1 = torch.relu(a + b)
        h2 = torch.relu(torch.conv2d(h1, w, padding=1) + h1)
        return torch.relu(torch.conv2d(h2, w, padding=1) + h2)
    a, b, w = torch.randn(2, 4, 5, 5), torch.randn(2, 4, 5, 5), torch.randn(4, 4, 3, 3)
    jf = _check(f, a, b, w)
    names = re.findall(r"^  \(?([\w, ]+?)\)? = ", str(fjit.last_traces(jf)[-1]), re.M)
    defined = [n.strip() for group in names for n in group.split(",")]
    assert len(defined) == len(set(defined)), str(fjit.last_traces(jf)[-1])


def test_a_value_still_read_after_the_later_kernel_is_not_computed_twice():
    """h is returned, so it is stored anyway: the later kernel loads it rather than computing it."""
    def f(x, w):
        h = (x * 2 + 1).sin()
        m = h @ w
        return m, m * h + 1, h
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    jf = _check(f, x, w)
    text = str(fjit.last_traces(jf)[-1])
    assert len(_kernel_calls(fjit.last_traces(jf)[-1])) == 2, text
    assert text.count("fj_sinf(") == 1, text


@pytest.mark.parametrize("torch_wins", [False, True])
def test_a_forward_with_kernels_keeps_the_faster_of_kernels_and_torch_calls(monkeypatch, torch_wins):
    """A forward program with kernels measures them against its torch calls alone on its second
    call (fjit/program_choice.py) and keeps the faster: every call's result is eager's either way,
    random draws included, and the last traces show the form that runs."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    monkeypatch.setattr(program_choice, "FORWARD_MARGIN", 1e9 if torch_wins else 0.0)
    fn = lambda x, w: F.dropout(torch.nn.functional.layer_norm(x, (x.shape[-1],), w) * 2, 0.25)  # noqa: E731
    x, w = torch.randn(64, 300 + torch_wins), torch.randn(300 + torch_wins)
    jf = fjit.jit(fn)
    for seed in range(4):
        torch.manual_seed(seed)
        got = jf(x, w)
        torch.manual_seed(seed)
        torch.testing.assert_close(got, fn(x, w))
    text = str(fjit.last_traces(jf)[-1])
    assert ("C kernel" in text) is not torch_wins
    kept = "its torch calls" if torch_wins else "the program with kernels"
    assert f"measured on the second call, {kept} took" in fjit.last_traces(jf)[-1].stage


@pytest.mark.parametrize("form", [0, 1])
def test_a_stress_runs_forced_form_is_kept_whatever_it_measured(monkeypatch, form):
    """FJIT_KEEP_FORM (zoo.py --stress): the measured choice still times its forms, then keeps
    the one asked for, against the margin that favours the other."""
    import fjit.program_choice as program_choice
    monkeypatch.setenv("FJIT_MEASURE", "all")
    monkeypatch.setenv("FJIT_KEEP_FORM", str(form))
    monkeypatch.setattr(program_choice, "FORWARD_MARGIN", 0.0 if form else 1e9)
    fn = lambda x: torch.nn.functional.layer_norm(x, (x.shape[-1],)) * 2  # noqa: E731
    x = torch.randn(64, 302 + form)
    jf = fjit.jit(fn)
    for _ in range(3):
        torch.testing.assert_close(jf(x), fn(x))
    kept = "its torch calls" if form else "the program with kernels"
    assert f"measured on the second call, {kept} took" in fjit.last_traces(jf)[-1].stage


@pytest.mark.parametrize("variable, value", [("FJIT_KEEP_FORM", "3"), ("FJIT_C_BUILD_DELAY", "-1"),
                                             ("FJIT_C_BUILD_DELAY", "soon")])
def test_a_bad_stress_setting_names_the_variable(monkeypatch, variable, value):
    import fjit.config as config
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=variable):
        config.kept_form() if variable == "FJIT_KEEP_FORM" else config.c_build_delay()


@pytest.mark.parametrize("program", [
    lambda x: torch.abs(torch.abs(F.softmax(x, dim=0).detach())),
    lambda x: torch.abs(F.softmax(x, dim=0).detach() * 2),
    lambda x: (x.sum(0, keepdim=True) / x).detach().sin(),
])
def test_a_prim_run_by_torch_gives_its_result_the_recorded_layout(program):
    """A decomposition's last prim records its op's layout; run as a torch call (softmax's
    division, not fused) it gets torch's own: for a permuted [2, 2, 1, 1] input, ATen's softmax is
    contiguous and the division of the permuted exponentials is not.  A kernel reading it as
    recorded read it transposed (found by the long property run: wrong values, silently)."""
    from fjit.executors.c import executor
    jf = fjit.jit(program)
    x = torch.randn(1, 1, 2, 2).permute(3, 2, 1, 0)
    jf(x)
    executor.wait()
    for seed in range(3):
        x = torch.randn(1, 1, 2, 2, generator=torch.Generator().manual_seed(seed)).permute(3, 2, 1, 0)
        got, want = jf(x), program(x)
        torch.testing.assert_close(got, want)
        assert got.stride() == want.stride() or got.is_contiguous() == want.is_contiguous()


# -- column sums -----------------------------------------------------------------------------------

def _layer_norm_tanh(x, w, b):
    return (torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b) * 3).tanh().sum()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_norm_weight_and_bias_gradients_are_column_sums_in_a_kernel(dtype):
    """A layer norm's weight and bias gradients are sums over the batch and sequence dims of values
    the backward's kernels compute: the kernels sum them as they go (no torch sum left), and the
    gradients are eager's."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, 48, generator=g, dtype=dtype, requires_grad=True)
    w = torch.randn(48, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(48, generator=g, dtype=dtype, requires_grad=True)
    jf = fjit.jit(_layer_norm_tanh)
    for _ in range(2):
        got = torch.autograd.grad(jf(x, w, b), (x, w, b))
    want = torch.autograd.grad(_layer_norm_tanh(x, w, b), (x, w, b))
    torch.testing.assert_close(got, want)
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "prims.sum(" not in backward and "fj_all0" in backward, backward


def test_column_sums_do_not_depend_on_the_thread_count():
    """A threaded kernel's column sums add fixed row ranges in a fixed order: the same bits with 1
    thread and with 2 (and eager's values)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, 48, generator=g)
    w = torch.randn(48, generator=g)

    def f(x, w):
        return (x * w).exp().sum((0, 1)), (x * w).tanh().sum(0, keepdim=True)
    jf = fjit.jit(f)
    one, two = _per_thread_count(lambda: jf(x, w), (1, 2))
    assert all(torch.equal(a, b) for a, b in zip(one, two))
    torch.testing.assert_close(one, f(x, w))
    text = _kernel_text(jf)
    assert "omp parallel" in text and "fj_all0" in text, text


def test_few_long_rows_are_summed_by_column_blocks_in_an_order_fixed_by_the_shapes():
    """A sum over 8 rows of 12005 columns (TinyViT's attention-bias gradient had that shape).  Cut
    into row ranges, 8 rows made 8 ranges of one row and a double accumulator per column and range
    (calloc'd, filled, added); the kernel walks blocks of whole runs of the last dim instead, each
    adding every row in order on its stack, so the bits are the same with 1 thread and 2, and the
    values are eager's."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 5, 49, 49, generator=g)
    b = torch.randn(5, 49, 49, generator=g)

    def f(x, b):
        return torch.tanh(x * b).sum(0)
    jf = fjit.jit(f)
    results = _per_thread_count(lambda: jf(x, b), (1, 2, 2))
    assert torch.equal(results[0], results[2])
    torch.testing.assert_close(results[2], f(x, b))
    text = _kernel_text(jf)
    assert "prims.sum(" not in text and "fj_all0" not in text, text
    assert "for (int64_t cb = 0; cb < 13; cb++)" in text        # 12005 columns, 980 a block
    assert "for (int64_t i2 = 0; i2 < 49; i2++)" in text        # the last dim's own loop


def test_a_softmax_backward_is_one_row_kernel_that_reads_the_forwards_row_sums():
    """An attention-bias gradient: a softmax backward over [8, 5, 49, 49] summed over its 8 batch
    rows.  Its per-row value -sum(g * e) / s**2 reads the forward's row sums s, an input of the
    row's shape: computed in the row kernel, the backward is one pass of rows (two loops over a
    row in cache) instead of a row-sum kernel, a per-row kernel and a second pass over g and e from
    memory.  The batch sum is then torch's.  Values are eager's, the same with 1 thread and 2."""
    g = torch.Generator().manual_seed(2)
    x = torch.randn(8, 5, 49, 49, generator=g, requires_grad=True)
    b = torch.randn(5, 49, 49, generator=g, requires_grad=True)
    cotangent = torch.randn(8, 5, 49, 49, generator=g)

    def f(x, b):
        return torch.softmax(x + b, -1)
    jf = fjit.jit(f)
    grads = _per_thread_count(lambda: torch.autograd.grad(jf(x, b), (x, b), cotangent), (1, 2, 2))
    assert all(torch.equal(a, b) for a, b in zip(grads[0], grads[2]))
    torch.testing.assert_close(grads[2], torch.autograd.grad(f(x, b), (x, b), cotangent))
    backward = str(fjit.last_backward_traces(jf)[-1])
    calls = [line for line in backward.splitlines() if line.startswith("  ") and " = " in line
             and not line.lstrip().startswith("#")]
    assert len(calls) == 2 and "fjit_c_" in calls[0] and "prims.sum(" in calls[1], backward
    assert "float xr1 = in1[" in backward, backward      # the row sums, loaded once a row


def test_column_blocks_of_rows_whose_last_dim_is_longer_than_a_block():
    """A last dim longer than COLUMN_BLOCK: the blocks are COLUMN_BLOCK columns (the
    accumulators stay that size on the stack), walked flat; eager's values."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 2, 3000, generator=g)
    w = torch.randn(3000, generator=g)

    def f(x, w):
        return (x * w).tanh().sum(0)
    jf = _check(f, x, w)
    text = _kernel_text(jf)
    assert "double fj_col0[1024];" in text and "cq" not in text, text


def test_a_value_read_after_its_column_sum_is_not_read_before_the_sum_is_complete():
    """An op that reads a column sum waits for the kernel that computes it (a region never reads
    its own column sums)."""
    def f(x):
        e = x.exp()
        return e - e.sum(0) * 0.5, (e * x).sum((0, 1))
    x = torch.randn(6, 5, 7)
    _check(f, x)
    _check(f, x)


def test_interleaved_independent_chains_fuse_each_into_one_kernel():
    """Two chains of different shapes traced interleaved (a rotary embedding's q and k halves,
    forward and backward) each become one kernel: a region stays open while another one grows."""
    def f(a, b):
        x = a * 2
        y = b * 3
        x = x + 1
        y = y - 1
        return x.exp(), y.tanh()
    jf = _check(f, torch.randn(4, 8), torch.randn(4, 6), kernels=2)
    assert not re.search(r"= prims\.", str(fjit.last_traces(jf)[-1]))


def test_an_elementwise_prim_read_through_a_reshape_fuses_with_its_reader():
    """A residual add whose result the next norm reads reshaped ([B, L, D] as [B*L, D]) is computed
    in the reshaped shape, from views of its operands: one kernel, not an add, a view and a
    norm kernel.  Where the reshape would copy (a transposed operand) or its reader fuses with
    nothing, the add stays where it was."""
    x, r, w = torch.randn(2, 6, 16), torch.randn(2, 6, 16), torch.randn(16)
    fn = lambda x, r, w: F.layer_norm((x + r).reshape(12, 16), (16,), w) * 2  # noqa: E731
    jf = _check(fn, x, r, w, kernels=1)
    assert "prims.add" not in str(fjit.last_traces(jf)[-1])
    t = torch.randn(2, 16, 6).transpose(1, 2)
    jf = _check(fn, x, t, w, kernels=1)   # a transposed operand cannot view as [12, 16]: add kept
    assert "prims.add" in str(fjit.last_traces(jf)[-1])
    m = torch.randn(16, 5)
    jf = _check(lambda x, r, m: (x * r + 1).reshape(12, 16) @ m, x, r, m)
    assert "_as_" not in str(fjit.last_traces(jf)[-1])   # a matmul fuses with nothing: not moved


def test_a_view_of_a_regions_value_waits_for_the_region():
    """A view taken of a value a region computes runs right after the region, which stays open:
    an op that reads such a view never joins that region (it would read the view before it is
    written), and GPT-2's Conv1D bias gradient (a sum over dim 0 of the 2-d view of a 3-d
    cotangent, the view also read by a matmul) is a column sum of the kernel that computes it."""
    def edge(x):
        y = x * 2 + 1
        return (y * y[:, :1]).exp(), y.reshape(2, 2, 16) @ torch.ones(16, 3)
    jf = fjit.jit(edge)
    x = torch.randn(4, 16)
    for _ in range(2):      # (the first call's result is the layout check's op-by-op run)
        torch.testing.assert_close(jf(x), edge(x))

    def conv1d(x, w, b):
        h = torch.addmm(b, x.view(-1, 16), w).view(2, 8, 16)
        return torch.nn.functional.layer_norm(h, (16,)).tanh().sum()
    g = torch.Generator().manual_seed(3)
    x, w, b = (torch.randn(*s, generator=g, requires_grad=True) for s in ((2, 8, 16), (16, 16), (16,)))
    jf = fjit.jit(conv1d)
    for _ in range(2):
        got = torch.autograd.grad(jf(x, w, b), (x, w, b))
    torch.testing.assert_close(got, torch.autograd.grad(conv1d(x, w, b), (x, w, b)))
    backward = str(fjit.last_backward_traces(jf)[-1])
    assert "prims.sum(" not in backward, backward


def test_a_column_sum_of_a_row_with_a_huge_trig_argument_adds_the_row_once():
    """A row whose sin argument is out of the vector form's range is computed again with the C
    library; a region with column sums uses the C library's sin throughout instead, since the
    rerun would add the row to the column sums twice."""
    def f(x):
        return (torch.sin(x * 3.0) * 2).sum(0)
    x = torch.randn(8, 16)
    x[3, 5] = 1e7
    _check(f, x)
    jf = _check(f, x)
    assert "fj_col0" in _kernel_text(jf)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _code(trace) -> str:
    return "\n".join(line for line in str(trace).splitlines() if not line.lstrip().startswith("#"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_a_rotary_embedding_is_one_kernel_computing_the_cat_piece_by_piece(dtype):
    """q * cos + rotate_half(q) * sin, q a transposed view as a projection gives it: the negation
    and the concatenation are computed inside the kernel along each half of the last dim (no cat,
    no lone negation), bit-identical to eager; the backward's cat([g2, -g1]) of the halves of
    g * sin likewise, with eager's gradients."""
    fn = lambda q, cos, sin: q * cos + _rotate_half(q) * sin  # noqa: E731
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 5, 3, 8, generator=g).to(dtype).transpose(1, 2)
    cos, sin = (torch.randn(1, 1, 5, 8, generator=g).to(dtype) for _ in range(2))
    jf = _check(fn, q, cos, sin, kernels=1, exact=True)
    assert not re.search(r"cat|neg", _code(fjit.last_traces(jf)[-1])), fjit.last_traces(jf)[-1]
    q = q.detach().requires_grad_()
    jf = fjit.jit(fn)
    for _ in range(2):
        got = torch.autograd.grad(jf(q, cos, sin).square().sum(), q)
    want = torch.autograd.grad(fn(q, cos, sin).square().sum(), q)
    torch.testing.assert_close(got, want)
    backward = fjit.last_backward_traces(jf)[-1]
    assert not re.search(r"cat|neg", _code(backward)), backward


def test_cats_of_several_uneven_pieces_and_pieces_read_elsewhere_match_eager():
    """Three pieces of uneven widths (each a chain of elementwise prims, one a broadcast [.., 1]
    operand's product), two concatenations with different cuts in one kernel, a piece whose value
    is also read whole after the cat (so it is stored, not recomputed), and a sliced value also read
    whole (its slices are not pushed through it): all eager's values."""
    def pieces(x, y, s):
        a = (x[..., :3] * s).exp()
        b = x[..., 3:4] + y[..., 1:]
        c = torch.cat((a, b, (x[..., 4:] - 1).abs()), dim=-1)
        d = torch.cat((x[..., 5:], x[..., :5] * 2), dim=-1)
        return c * d + x, a.sum()
    g = torch.Generator().manual_seed(1)
    args = (torch.randn(4, 3, 7, generator=g), torch.randn(3, 2, generator=g), torch.randn(4, 3, 1, generator=g))
    jf = _check(pieces, *args)
    assert not re.search(r"= (torch\.cat|prims\.cat)", _code(fjit.last_traces(jf)[-1]))

    def shared(x):
        y = x * 2
        return torch.cat((y[:, 4:], y[:, :4]), dim=-1) + y
    _check(shared, torch.randn(3, 6))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_add_and_sub_round_a_scalar_operand_first_as_torch(dtype):
    """torch's add and sub convert a scalar operand (a literal, a runtime float, a 0-d tensor of
    another dtype) to the half type before adding; mul and div take it unrounded.  Each is
    bit-identical to eager, alpha times a number included (left to torch)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1000, generator=g).to(dtype)
    s = torch.tensor(0.4054651)
    programs = [lambda x, s, r: (x + 0.4054651) * 1, lambda x, s, r: (0.4054651 - x) * 1,
                lambda x, s, r: (x - math.log(abs(r) + 1.5)) * 1, lambda x, s, r: (x + s) * 1,
                lambda x, s, r: (x * 1.3862943) / 1.3862943, lambda x, s, r: torch.add(x, 0.4054651, alpha=3) * 1]
    for fn in programs:
        jf = fjit.jit(fn)
        for r in (2.5, 0.0):
            torch.testing.assert_close(jf(x, s, r), fn(x, s, r), rtol=0, atol=0)


def test_a_contiguous_copy_joins_the_kernel_computing_its_operand():
    """Attention's q * scale read as a contiguous copy by the matmul (q a view of a fused
    projection), in a training forward: the product is written contiguous by one kernel (no lone multiply, no copy
    after it), and v's copy joins the softmax's kernel; values as eager's."""
    def attention(x, w):
        b, n, c = x.shape
        q, k, v = (x @ w).reshape(b, n, 3, 2, c // 2).permute(2, 0, 3, 1, 4).unbind(0)
        return ((q * 0.5) @ k.transpose(-2, -1)).softmax(-1) @ v
    g = torch.Generator().manual_seed(0)
    x, w = (torch.randn(*s, generator=g, requires_grad=True) for s in ((4, 8, 16), (16, 48)))
    jf = _check(attention, x, w, kernels=2)     # (the training forward splits matmul into its prims)
    code = _code(fjit.last_traces(jf)[-1])
    assert not re.search(r"= (prims\.mul|prims\.contiguous|torch\.Tensor\.contiguous)\(", code), code


def test_a_kernel_reads_its_input_views_from_the_value_they_view():
    """Slices and transposes feeding a kernel are read from the tensor they view, at their strides
    and offset: no view call is left in the program.  A reshape that copies (of a transposed
    value) is no view and stays a copy: values as eager's either way, also while the kernel
    builds (its fallback rebuilds the views)."""
    def views(x, y):
        a = x[:, 2:].t() * 2 + y[1:].t()
        b = x.t().reshape(8, 3) + 1       # a copy: x.t() is not viewable as [8, 3]
        return a.exp(), b.sin()
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(4, 6, generator=g), torch.randn(5, 4, generator=g)
    jf = _check(views, x, y)
    code = _code(fjit.last_traces(jf)[-1])
    assert re.search(r"= fjit_c_\w+\(x, y\)", code), code          # a's kernel reads x and y themselves
    assert code.count("reinterpret") == 1, code                    # the view the copying reshape reads


@pytest.mark.parametrize("k", [2, 4, 8])
def test_a_batched_matmul_over_a_few_products_is_one_kernel(k):
    """Attention over windows of 4 (MaxViT, EfficientViT: `p @ v` with 4 keys) multiplies over k
    terms: its products and sums are one kernel with what reads it, each of p and v read through
    one pointer however many slices of it the kernel takes."""
    p, v = torch.randn(64, 16, k), torch.randn(64, k, 32)
    jf = _check(lambda p, v: (p @ v) * 2.0 + 1.0, p, v, kernels=1)
    trace = str(fjit.last_traces(jf)[-1])
    assert "matmul" not in trace
    assert set(re.findall(r"\bin\d+\[", _kernel_text(jf))) == {"in0[", "in1["}
    # past 8 terms, or below 4096 results, the matmul stays BLAS's
    assert "matmul" in str(fjit.last_traces(_check(lambda p, v: (p @ v) * 2.0, torch.randn(64, 16, 9),
                                                   torch.randn(64, 9, 32)))[-1])
    assert "matmul" in str(fjit.last_traces(_check(lambda p, v: (p @ v) * 2.0, torch.randn(2, 16, k),
                                                   torch.randn(2, k, 32)))[-1])


@pytest.mark.parametrize("k", [4, 8])
def test_a_thin_matmul_unrolls_only_while_its_weight_rows_fit_the_panel(k):
    """A weight gradient over a batch of k rows (`g.t() @ x`, AlexNet's classifier: [4096, 8] @
    [8, 9216]) is thin, but its k rows of x are read again for every output row: past
    THIN_MATMUL_PANEL_BYTES they stream from L2 and BLAS is the faster, so the matmul stays."""
    from fjit.passes.regroup import THIN_MATMUL_PANEL_BYTES
    wide = THIN_MATMUL_PANEL_BYTES // (4 * k) * 2          # twice the panel
    narrow = THIN_MATMUL_PANEL_BYTES // (4 * k) // 2       # half of it
    g = torch.Generator().manual_seed(0)
    for n, unrolled in ((narrow, True), (wide, False)):
        jf = _check(lambda a, x: a.t() @ x, torch.randn(k, 64, generator=g), torch.randn(k, n, generator=g))
        assert ("matmul" not in str(fjit.last_traces(jf)[-1])) == unrolled, (k, n)


def test_copies_of_permuted_values_are_kernels():
    """A reshape that copies (heads merged back after attention, a window partition) and a batched
    matmul operand whose batch dims do not merge (torch.matmul would copy it in its own reshape)
    are contiguous() copies C kernels write, exactly, in the recorded layouts; no torch copy is
    left for either."""
    x = torch.randn(4, 8, 6, 16)
    jf = _check(lambda x: x.permute(0, 2, 1, 3).reshape(4, 6, 128), x, kernels=1, exact=True)
    assert "reshape" not in _kernel_text(jf) and jf(x).is_contiguous()
    q, k = torch.randn(4, 16, 6, 32), torch.randn(4, 6, 32, 16)
    jf = _check(lambda q, k: q.transpose(1, 2) @ k, q, k, kernels=1, exact=True)
    trace = str(fjit.last_traces(jf)[-1])
    assert "prims.contiguous" not in trace.replace("# t", "") and "matmul" in trace
    # a reshape that views stays a view: no kernel
    assert _kernels(_check(lambda x: x.reshape(32, 96), x)) == []


def test_a_column_sum_before_the_kernel_reading_its_value_joins_it():
    """A bias gradient (a sum over the leading dims of a cotangent a matmul returned) recorded
    before the layer norm backward that reads the same cotangent is one kernel with it, as when
    it comes after: one pass over the cotangent, not a sum of its own."""
    a, w, v = torch.randn(8, 16, 32), torch.randn(32, 64), torch.randn(8, 16, 64)

    def f(a, w, v):
        g = a @ w
        bias_grad = g.sum((0, 1))
        return bias_grad, g * v - (g * v).sum(-1, keepdim=True)
    jf = _check(f, a, w, v, kernels=1)
    assert "prims.sum" not in str(fjit.last_traces(jf)[-1]).replace("# t", "")


def test_a_layer_norm_backward_with_its_weight_gradients_is_one_kernel():
    """The layer norm backward's per-row coefficients read the forward's saved row statistics (an
    input of the row's shape): in the row kernel that sums the rows and the weight and bias
    gradients' columns, the input gradient is one more loop over the row, not two more kernels
    each reading the rows from memory again.  Gradients are eager's."""
    g = torch.Generator().manual_seed(5)
    x, r = torch.randn(8, 66, 192, generator=g, requires_grad=True), torch.randn(8, 66, 192, generator=g)
    w, b = (torch.randn(192, generator=g, requires_grad=True) for _ in range(2))
    cotangent = torch.randn(8, 66, 192, generator=g)

    def block(x, r, w, b):
        return F.layer_norm(x + r, (192,), w, b)
    jf = fjit.jit(block)
    got = torch.autograd.grad(jf(x, r, w, b), (x, w, b), cotangent)
    # (sums over 528 rows: eager's order is another; both are within float32's rounding of them)
    torch.testing.assert_close(got, torch.autograd.grad(block(x, r, w, b), (x, w, b), cotangent),
                               rtol=1e-5, atol=1e-4)
    backward = str(fjit.last_backward_traces(jf)[-1])
    kernels = [line for line in backward.splitlines() if line.startswith("  ") and "= fjit_c_" in line]
    assert len(kernels) == 1 and kernels[0].count("cpu f32[192]") == 2, backward


def _gcc() -> str | None:
    """The kernels' compiler where it is gcc (whose vectorization report the tests read), else None."""
    compiler = c_executor.compiler()
    if compiler and "Free Software Foundation" in subprocess.run(
            [compiler, "--version"], capture_output=True, text=True).stdout:
        return compiler
    return None


def _vectorization_report(compiler: str, source: str, flags, report: str = "-fopt-info-vec-all") -> str:
    """gcc's report on `source` (after the entry point's header, its lines named k.c:N) built
    with `flags`."""
    from fjit.executors.c.launch import HEADER
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.c")
        with open(path, "w") as f:
            f.write(HEADER + source)
        return subprocess.run([compiler, *[f for f in flags if f != "-shared"], report, "-c", path, "-o", os.devnull],
                              capture_output=True, text=True).stderr


_TRAINING_PATTERNS = {
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (160,), w, b), [(8, 196, 160), (160,), (160,)]),
    "residual_layer_norm": (lambda x, r, w, b: F.layer_norm(x + r, (160,), w, b),
                            [(8, 196, 160), (8, 196, 160), (160,), (160,)]),
    "rms_norm": (lambda x, w: F.rms_norm(x, (160,), w, 1e-6), [(8, 196, 160), (160,)]),
    "bias_softmax": (lambda x, b: torch.softmax(x + b, -1), [(8, 5, 49, 49), (5, 49, 49)]),
    "log_softmax": (lambda x: torch.log_softmax(x, -1), [(64, 1000)]),
    "silu_gate": (lambda x, y: F.silu(x) * y, [(8, 196, 640), (8, 196, 640)]),
    "channel_gate": (lambda x, s: F.hardswish(x) * torch.sigmoid(s), [(8, 64, 16, 16), (8, 64, 1, 1)]),
}


@pytest.mark.parametrize("pattern", sorted(_TRAINING_PATTERNS))
def test_every_loop_over_a_row_or_its_elements_of_a_training_kernel_is_vectorized_by_gcc(pattern):
    """gcc's own report on the forward and backward kernels of common training patterns: no loop
    over a row's elements (the passes, the lane loops, the flat loops) stays scalar.  A layer norm
    backward's last pass did: its saved statistics, loaded per element, were hoisted by gcc's
    partial redundancy elimination into the loop's latch, which the vectorizer refuses ("latch
    block not empty"), and the kernel took 3.5x its time.  Inputs constant along a row are now
    loaded once a row."""
    compiler = _gcc()
    if compiler is None:
        pytest.skip("gcc's vectorization report: another compiler builds the kernels here")
    fn, shapes = _TRAINING_PATTERNS[pattern]
    args = [torch.randn(*shape, requires_grad=True) for shape in shapes]
    jf = fjit.jit(fn)
    out = jf(*args)
    torch.autograd.grad(out, args, torch.ones_like(out))
    text = str(fjit.last_traces(jf)[-1]) + str(fjit.last_backward_traces(jf)[-1])
    names = sorted(set(re.findall(r"# C kernel (fjit_c_\w+)", text)))
    assert len(names) >= 2, text           # a forward kernel and a backward one at least
    from fjit.executors.c.launch import HEADER
    for name in names:
        source = c_build_queue._BINARIES[name].kernel.source
        report = _vectorization_report(compiler, source, c_build.kernel_flags())
        lines = (HEADER + source).splitlines()
        scalar = [lines[int(n) - 1].strip() for n in re.findall(r"k\.c:(\d+):\d+: missed: couldn't vectorize loop", report)
                  if lines[int(n) - 1].strip().startswith(("for (int64_t c ", "for (int64_t l ", "for (int64_t i"))]
        assert not scalar, (name, scalar, source)


def test_a_kernel_with_many_pointers_and_column_sums_is_vectorized_by_gcc(monkeypatch):
    """Inside an OpenMP region gcc vectorizes a loop only behind runtime alias checks (10 at most
    by default), so a layer norm backward with its weight and bias gradients stayed scalar: the
    cap is raised for gcc, and gcc's own report on such a kernel says its row loop vectorized.
    (The kernel is the row-sum kernel of the layer norm backward in three kernels, as partitioned
    before per-row values read the forward's row statistics: the one kernel made now has fewer
    pointers in that loop, which gcc vectorizes either way.)"""
    monkeypatch.setattr(c_executor._PARTITIONER, "policy",
                        dataclasses.replace(c_executor._PARTITIONER.policy, external_rows=False))
    compiler = _gcc()
    if compiler is None:
        assert c_build.GCC_PARAMS[0] not in c_build.kernel_flags()   # clang: no such parameter
        return
    x, r = torch.randn(8, 66, 192, requires_grad=True), torch.randn(8, 66, 192)
    w, b, w2, b2 = (torch.randn(192, requires_grad=True) for _ in range(4))

    def block(x, r, w, b, w2, b2):
        return (F.gelu(F.layer_norm(x + r, (192,), w, b)) * w2 + b2).sum()
    jf = fjit.jit(block)
    jf(x, r, w, b, w2, b2).backward()
    names = re.findall(r"# C kernel (fjit_c_\w+)", str(fjit.last_backward_traces(jf)[-1]))
    source = max((c_build_queue._BINARIES[n].kernel.source for n in names), key=lambda s: s.count("fj_col"))
    assert source.count("double *fj_col") >= 3    # the weight, bias and scale gradients, with rows
    from fjit.executors.c.launch import HEADER
    # the loop over a row's lanes, where the columns are summed and the row reduced
    text = HEADER + source
    lanes = text[:text.index("#pragma GCC unroll 1")].count("\n") + 2

    def vectorized(flags) -> bool:
        report = _vectorization_report(compiler, source, flags, "-fopt-info-vec-optimized")
        return f"k.c:{lanes}:" in report and "loop vectorized" in report.split(f"k.c:{lanes}:")[1].split("\n")[0]
    assert vectorized(c_build.kernel_flags())
    assert not vectorized([f for f in c_build.kernel_flags() if f not in c_build.GCC_PARAMS])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32])
def test_a_transposing_elementwise_kernel_reads_tiles_of_its_strided_inputs(dtype):
    """TinyViT's GELU backward read its channels-last saved input along the channels of a
    contiguous cotangent: a strided load per element kept gcc from vectorizing erf and exp, 10x
    slower than the same kernel on one layout.  Such a loop is cut into tiles, and each strided
    input's tile copied into a buffer first.  Sizes that are not multiples of the tile, two
    strided inputs (one a permuted view), a broadcast operand."""
    def make(*shape):
        return (torch.randn(*shape) * 3).to(dtype)
    a = make(3, 40, 5, 9).to(memory_format=torch.channels_last)
    b, c, d = make(3, 40, 5, 9), make(40, 1, 1), make(3, 5, 9, 40)

    if dtype.is_floating_point:
        def f(a, b, c, d):
            return b * torch.exp(a * 0.25) + c * d.permute(0, 3, 1, 2) - torch.erf(a)
    else:
        def f(a, b, c, d):
            return b * a + c * d.permute(0, 3, 1, 2) - a
    jf = _check(f, a, b, c, d, kernels=1, exact=not dtype.is_floating_point)
    source = _kernel_text(jf)
    assert source.count(f"[{elementwise.TILE}][{elementwise.TILE}]") >= 2, source   # a and d (f64: erf(a) too)
    assert jf(a, b, c, d).stride() == f(a, b, c, d).stride()


@pytest.mark.parametrize("hw, tiled", [((4, 4), True), ((2, 2), True), ((3, 5), True), ((1, 3), False)])
def test_a_transposing_kernel_with_short_rows_is_tiled(hw, tiled):
    """ResNet's residual gradients at its last stages: an NCHW value plus one in NHWC over 4x4,
    2x2 (or 3x5) positions.  Rows of TILED_MIN_SIZE (4) or more positions are tiled too: untiled,
    each row read the NHWC operand at a stride of C floats (4 KiB at 1024 channels, all in one
    cache set: 10x slower).  Exact: the same elementwise ops either way."""
    a, m = torch.randn(8, 256, *hw), torch.randn(8, 256, *hw)
    b = torch.randn(8, *hw, 256).permute(0, 3, 1, 2)

    def f(a, b, m):
        return torch.where(m <= 0, 0.0, a + b)
    jf = _check(f, a, b, m, kernels=1, exact=True)
    assert (f"[{elementwise.TILE}][{elementwise.TILE}]" in _kernel_text(jf)) == tiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rows_walked_with_a_stride_are_computed_in_blocks_through_buffers(dtype):
    """GCViT's squeeze-excite means over H and W of channels-last values, and its layer norms over
    the channels of NCHW values viewed as NHWC: each row was a strided walk, which kept gcc from
    vectorizing the row loop (5 ns an element).  Such rows go in blocks, each strided tensor's
    block copied through a stack buffer; each row is computed as before, so the results are the
    same bits as the row-by-row kernel's.  Row counts that are not multiples of the block,
    several full-size outputs, a max and a sum in one region."""
    from fjit.executors.c import accumulators
    x = (torch.randn(3, 37, 5, 7) * 2).to(dtype).to(memory_format=torch.channels_last)
    w, b = torch.randn(37).to(dtype), torch.randn(37).to(dtype)

    def pooled(x):
        y = F.gelu(x) * 2
        return y, y.mean((2, 3), keepdim=True), y.amax((2, 3))

    def norm(x, w, b):
        return F.layer_norm(x.permute(0, 2, 3, 1), (37,), w, b).softmax(-1)
    for fn, args in ((pooled, (x,)), (norm, (x.contiguous(), w, b))):
        jf = _check(fn, *args)
        source = str(fjit.last_traces(jf)[-1])
        assert "first = q" in source and "fj_in" in source, source
        got = jf(*args)
        saved = accumulators.ROW_BLOCK
        try:                 # one row a block: the row-by-row order, compared bit for bit
            accumulators.ROW_BLOCK = 1
            rowwise = fjit.jit(lambda *a: fn(*a))(*args)
        finally:
            accumulators.ROW_BLOCK = saved
        for g, r in zip(got if isinstance(got, tuple) else (got,), rowwise if isinstance(rowwise, tuple) else (rowwise,)):
            torch.testing.assert_close(g, r, rtol=0, atol=0)


# -- building (executors/c/build.py) ---------------------------------------------------------------

def test_a_compiler_without_openmp_builds_kernels_single_threaded(monkeypatch, tmp_path):
    """A compiler that refuses -fopenmp builds the same source without it, and every later kernel
    is built without it; a source that does not compile is an OSError with the compiler's
    message, and leaves neither the library nor the temporary source behind."""
    real = c_build.compiler()
    script = tmp_path / "no-openmp-cc"
    script.write_text("#!/bin/sh\nfor a in \"$@\"; do [ \"$a\" = -fopenmp ] && "
                      "{ echo 'unsupported option -fopenmp' >&2; exit 1; }; done\n"
                      f"exec {real} \"$@\"\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(c_build, "_COMPILER", [str(script)])
    monkeypatch.setattr(c_build, "_NO_OPENMP", [])
    assert "-fopenmp" in c_build.kernel_flags()
    path = str(tmp_path / "k.so")
    c_build.build_library("int fj_one(void) { return 1; }\n", path, c_build.kernel_flags())
    assert os.path.exists(path) and "-fopenmp" not in c_build.kernel_flags()
    import ctypes
    assert ctypes.CDLL(path).fj_one() == 1
    bad = str(tmp_path / "bad.so")
    with pytest.raises(OSError, match="exited with"):
        c_build.build_library("this is not C\n", bad, c_build.kernel_flags())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.so", "no-openmp-cc"]


def test_a_region_reading_more_tensors_than_a_kernel_can_take_is_split():
    """A chain reading 1100 inputs (a long scan recorded step by step is one) is cut into kernels of
    at most MAX_OPERANDS tensors: ctypes calls at most 1024 arguments, and one kernel of the whole
    chain failed to load (its region then ran as torch calls, with a warning)."""
    from fjit.passes.fusion import MAX_OPERANDS

    def chain(*xs):
        acc = xs[0]
        for x in xs[1:]:
            acc = acc * 0.5 + x
        return acc

    xs = [torch.randn(16, generator=torch.Generator().manual_seed(k)) for k in range(1100)]
    jf = fjit.jit(chain)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        got = jf(*xs)
    torch.testing.assert_close(got, chain(*xs))
    calls = re.findall(r"= fjit_c_\w+\(([^)]*)\)", str(fjit.last_traces(jf)[-1]))
    assert len(calls) > 1 and all(len(a.split(",")) <= MAX_OPERANDS for a in calls), calls


def test_a_value_two_batched_matmuls_read_is_copied_once():
    """Attention's output cotangent (a matmul's output, heads split from [B, N, H*D]) is read by
    the gradients of its probabilities (g @ V^T) and of V (P^T @ g): one kernel copies it
    row-major for both matmuls (each matmul made its own copy, the same kernel twice on the same
    value: BERT's backward had two such pairs)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 64, generator=g, requires_grad=True)
    w = (torch.randn(64, 192, generator=g) / 8).requires_grad_()
    w_out = (torch.randn(64, 64, generator=g) / 8).requires_grad_()

    def attention(x, w, w_out):
        q, k, v = (t.unflatten(-1, (4, 16)).transpose(1, 2) for t in (x @ w).chunk(3, -1))
        o = (q @ k.transpose(-2, -1) / 4).softmax(-1) @ v
        return (o.transpose(1, 2).flatten(2) @ w_out).sum()

    jf = fjit.jit(attention)
    for _ in range(2):
        got = torch.autograd.grad(jf(x, w, w_out), (x, w, w_out))
    want = torch.autograd.grad(attention(x, w, w_out), (x, w, w_out))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    backward = str(fjit.last_backward_traces(jf)[-1])
    calls = re.findall(r"= (fjit_c_\w+\([^)]*\))", backward)
    assert calls and len(calls) == len(set(calls)), calls


def test_an_input_expanded_along_the_row_is_loaded_once_a_row(recwarn):
    """An input broadcast along a row kernel's row by an expand (stride 0, size > 1) is constant
    along the row: loaded once a row, from the row indices alone.  Its offset once named the
    element index of the row's dim (times 0), undeclared there, and the kernel did not build
    (found by the random programs of test_properties.py)."""
    x, y = torch.randn(4, 8), torch.randn(4, 1).expand(4, 8)
    jf = _check(lambda x, y: torch.softmax(x * y, -1) + y, x, y, kernels=1)
    assert not [w for w in recwarn if "building a C kernel failed" in str(w.message)]
    assert re.search(r"xr1 = in1\[o0\];", str(fjit.last_traces(jf)[-1]))
