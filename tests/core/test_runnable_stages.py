"""Every stage prints as a runnable module: `exec(str(trace))` in a fresh namespace defines a
function that computes the result, C and Triton kernel stages included (they import their kernels
by name from fjit.runtime; objects with no literal come from trace_constants)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F

import fjit


@dataclasses.dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor


def _softmax_mlp(x, w):
    return F.softmax(F.linear(x, w).tanh() * 2.0, dim=-1)


def _pair(x, w):
    y = x.exp() + 1
    return Pair(y.sum(-1), (y * w[0]).relu())


def _inplace_and_index(x, w):
    y = x.clone()
    y[0] += w[0]
    return y.sin().mean(0)


def _random(x, w):
    return F.dropout(x @ w, 0.5, training=True) + torch.rand(x.shape)


PROGRAMS = [_softmax_mlp, _pair, _inplace_and_index, _random]


def _run_printed(trace, leaves):
    ns = {}
    exec(compile(str(trace), f"<printed {trace.stage}>", "exec"), ns)
    return ns["computation"](*leaves)


def _flat(out):
    return [out.a, out.b] if isinstance(out, Pair) else out


@pytest.mark.parametrize("executors", [("c", "torch"), ("triton", "torch"), ("torch",)])
@pytest.mark.parametrize("fn", PROGRAMS, ids=lambda f: f.__name__)
def test_every_stage_runs_as_printed(fn, executors, monkeypatch):
    monkeypatch.setenv("FJIT_TRITON_CPU", "1")      # Triton runs CPU tensors under the interpreter
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    jf = fjit.jit(fn, executors=executors)
    torch.manual_seed(0)
    expected = jf(x, w)
    stages = fjit.last_traces(jf)
    kinds = {"c": "# C kernel", "triton": "# Triton kernel"}
    if executors[0] in kinds and fn in (_softmax_mlp, _pair):
        assert kinds[executors[0]] in str(stages[-1]), str(stages[-1])
    for trace in stages:
        torch.manual_seed(0)
        got = _run_printed(trace, [x, w])
        torch.testing.assert_close(_flat(got), _flat(expected), msg=lambda m: f"{trace.stage}: {m}")


def test_printed_source_carries_its_imports():
    jf = fjit.jit(_pair, executors=("c", "torch"))
    jf(torch.randn(3, 4), torch.randn(2, 4))
    src = str(fjit.last_traces(jf)[-1])
    assert "import torch" in src and "from fjit.runtime import" in src
    assert "= trace_constants(" in src        # the dataclass the output is rebuilt as
    kernel = next(line for line in src.splitlines() if "from fjit.runtime import fjit_c_" in line)
    name = kernel.split("import ")[1].strip()
    assert f"= {name}(" in src


def _long_chain(x, m):
    """A program of 300 elementwise ops and a Cholesky factorization: its frame holds more than
    RESUMABLE_MIN_SLOTS locals (with C kernels off every op is a torch call of its own)."""
    for k in range(300):
        x = x * 1.001 + 0.001 if k % 2 else x.sin()
    return x, torch.linalg.cholesky(m)


def test_a_big_program_runs_in_a_resumable_frame(monkeypatch):
    """A program whose frame holds RESUMABLE_MIN_SLOTS slots or more runs in a generator's frame
    (core/generated.py Resumable): results equal eager's call after call, its values are freed when
    the caller drops them (the waiting frame keeps none), a program that raised runs again, and
    calls from several threads at once each get their own frame."""
    import gc
    import threading
    import weakref
    from fjit.core import generated as generated_module
    monkeypatch.setenv("FJIT_C_KERNELS", "0")
    made = []

    class Counted(generated_module.Resumable):
        def __init__(self, make):
            made.append(self)
            super().__init__(make)
    monkeypatch.setattr(generated_module, "Resumable", Counted)
    jf = fjit.jit(_long_chain)
    x, m = torch.randn(64), torch.eye(3) * 2
    for _ in range(3):
        got = jf(x, m)
        torch.testing.assert_close(got, _long_chain(x, m))
    assert len(made) == 1 and "while True:" in "".join(
        __import__("linecache").getlines(made[0]._make.__code__.co_filename))
    dropped = weakref.ref(got[0])
    kept_input = weakref.ref(x)
    del got, x
    gc.collect()
    assert dropped() is None and kept_input() is None
    x = torch.randn(64)
    with pytest.raises(Exception):           # not positive definite: raises inside the program
        jf(x, -torch.eye(3))
    torch.testing.assert_close(jf(x, m), _long_chain(x, m))
    results, barrier = {}, threading.Barrier(4)

    def worker(k):
        barrier.wait()
        for _ in range(5):
            results[k] = jf(x * k, m)[0]
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        torch.testing.assert_close(results[k], _long_chain(x * k, m)[0])


def test_compile_function_makes_big_generated_functions_resumable():
    """core/generated.py compile_function: a generated function of RESUMABLE_MIN_SLOTS slots or more
    becomes a Resumable that returns what the function returns on each branch (a `return` in an
    `if`, a bare one, falling off the end), takes *args; one whose body loops, or a small one,
    stays a function; a big module's fast path and state reader are Resumables."""
    from fjit.core.generated import RESUMABLE_MIN_SLOTS, Resumable, compile_function
    n = RESUMABLE_MIN_SLOTS
    locals_ = "".join(f"    v{i} = x + {i}\n" for i in range(n))
    src = (f"def f(x, *rest):\n{locals_}    if x < 0:\n        return None\n    if x == 0:\n        return\n"
           f"    if x == 1:\n        return (v{n - 1}, rest)\n    y = x\n")
    f, _ = compile_function(src, "f", {}, "<test>")
    assert isinstance(f, Resumable)
    for _ in range(2):
        assert f(-1) is None and f(0) is None and f(1, "a") == (n, ("a",)) and f(2) is None
    looped, _ = compile_function(src.replace("    y = x\n", "    for i in range(2):\n        y = i\n"), "f", {}, "<t>")
    small, _ = compile_function("def f(x):\n    return x + 1\n", "f", {}, "<t>")
    assert not isinstance(looped, Resumable) and not isinstance(small, Resumable) and small(1) == 2

    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(n))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x
    model, x = Wide(), torch.randn(3, 2)
    jm = fjit.jit(model)
    for _ in range(3):
        torch.testing.assert_close(jm(x), model(x))
    import gc
    import warnings
    with warnings.catch_warnings():      # isinstance on every object touches deprecated ones
        warnings.simplefilter("ignore")
        made = [o for o in gc.get_objects() if isinstance(o, Resumable)]
    filenames = {r._make.__code__.co_filename for r in made}
    assert "<fjit fast path>" in filenames and any(f.startswith("<fjit module reader") for f in filenames)
