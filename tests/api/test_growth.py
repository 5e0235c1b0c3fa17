"""Nothing grows without bound: an evicted program takes its generated source (linecache), its C
kernels and any reference to the caller's tensors with it."""
import gc
import linecache
import weakref

import pytest
import torch

import fjit
from fjit import config
from fjit.executors.c import build_queue as c_build_queue, executor as c_executor

CACHE_SIZE = config.cache_size()
SHAPES = 3 * CACHE_SIZE + 20     # more programs than the cache and the fast path's cache hold


def _fjit_sources() -> int:
    return sum(1 for name in linecache.cache if name.startswith("<fjit "))


def test_linecache_is_bounded_over_many_recompiles():
    jf = fjit.jit(lambda x: torch.tanh(x) * 2 + 1, executors=("torch",))
    gc.collect()
    before = _fjit_sources()
    for n in range(1, SHAPES):
        jf(torch.randn(n))
    gc.collect()
    # one source per live program: the cache's and the fast path's, at most
    assert _fjit_sources() - before <= 2 * CACHE_SIZE


def test_check_mode_leaves_no_linecache_entries(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    gc.collect()
    before = _fjit_sources()
    for n in range(1, 40):
        fjit.jit(lambda x: x.sin() + 1)(torch.randn(n))
    gc.collect()
    assert _fjit_sources() == before


def test_a_dropped_function_takes_its_sources_with_it():
    gc.collect()
    before = _fjit_sources()
    jf = fjit.jit(lambda x: x * 3)
    for n in range(1, 10):
        jf(torch.randn(n))
    assert _fjit_sources() > before
    del jf
    gc.collect()
    assert _fjit_sources() == before


def test_generated_source_stays_visible_while_the_program_lives():
    jf = fjit.jit(lambda x: x * 3, executors=("torch",))
    jf(torch.randn(4))
    (program,) = jf._cache.programs.values()
    filename = program.__code__.co_filename
    gc.collect()
    assert "return" in "".join(linecache.getlines(filename))   # what a traceback would show
    del jf, program
    gc.collect()
    assert filename not in linecache.cache


def test_c_kernel_registry_is_bounded_over_many_recompiles(monkeypatch):
    if c_executor.compiler() is None:
        pytest.fail("the C kernel test needs a C compiler on this machine")
    monkeypatch.setenv("FJIT_C_KERNELS", "sync")
    monkeypatch.setattr(c_build_queue, "_BINARIES", weakref.WeakValueDictionary())
    monkeypatch.setenv("FJIT_CACHE_SIZE", "8")     # a kernel build costs ~0.1 s: fewer shapes
    jf = fjit.jit(lambda x: x * 3 + 2)
    for n in range(1, 5 * 8):
        jf(torch.randn(n))
    gc.collect()
    assert 0 < len(c_build_queue._BINARIES) <= 2 * 8
    del jf
    gc.collect()
    assert len(c_build_queue._BINARIES) == 0


def _alive_after(make_call) -> bool:
    x = torch.randn(7)
    ref = weakref.ref(x)
    make_call(x)
    del x
    gc.collect()
    return ref() is not None


@pytest.mark.parametrize("fn", [
    lambda x: x * 2,
    lambda x: (x, x + 1),                       # the input itself returned
    lambda x: {"a": x, "n": x.shape},           # rebuilt output
], ids=["plain", "returns-input", "rebuilt"])
def test_no_caller_tensor_kept_by_cache_or_last_traces(fn):
    jf = fjit.jit(fn)
    assert not _alive_after(lambda x: jf(x))
    assert fjit.last_traces(jf)
    assert not _alive_after(lambda x: (jf(x), fjit.last_traces(jf)))


def test_no_caller_tensor_kept_by_check_mode(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    jf = fjit.jit(lambda x: x.exp() - 1)
    assert not _alive_after(lambda x: jf(x))


def _raise(error, *args):
    raise error


@pytest.mark.parametrize("fn, error", [
    (lambda x: (x + i for i in range(2)), fjit.UnsupportedInputError),   # unrebuildable output
    (lambda x: _raise(ValueError("boom"), x), ValueError),          # the user's own error
    (lambda x: bool(x.sum() > 0) and x, fjit.DataDependentError),    # a sharp edge
])
def test_no_caller_tensor_kept_by_a_failed_trace(fn, error):
    jf = fjit.jit(fn)

    def call(x):
        with pytest.raises(error):
            jf(x)
    assert not _alive_after(call)
    assert fjit.cache_info(jf).entries == 0
