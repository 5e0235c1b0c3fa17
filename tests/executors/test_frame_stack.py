"""The frame-stack chunk cache (fjit/executors/c/frame_stack.py): on CPython 3.11 and 3.12 a call
whose frame crosses a chunk's end must not map fresh memory each time."""
import resource
import sys

import pytest
import torch

import fjit
from fjit.executors.c import frame_stack
from fjit.executors.c.build import compiler

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or not (3, 11) <= sys.version_info[:2] <= (3, 12) or compiler() is None,
    reason="the cache is for CPython 3.11 and 3.12 (3.13+ keeps a chunk itself), built with a C compiler")


def _crossing():
    """A function whose frame (2100 stack slots, 16.8 KiB) no 16 KiB chunk holds: each call needs a
    chunk of its own, which CPython 3.11 maps on the call and unmaps on the return."""
    def call(g):
        return g()
    call.__code__ = call.__code__.replace(co_stacksize=2100)
    return call


def test_calls_crossing_a_chunk_reuse_a_cached_one():
    assert frame_stack.install()
    assert frame_stack.install()          # once: a second install keeps the one there
    call, one = _crossing(), (lambda: 1)
    assert sum(call(one) for _ in range(10)) == 10
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert sum(call(one) for _ in range(2000)) == 2000
    # a freshly mapped chunk page-faults when its first page is written: 2000 faults without it
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 100


def test_the_first_compile_installs_it_and_programs_run_as_before():
    f = fjit.jit(lambda x: (x * 2).sin() + 1)
    x = torch.randn(8)
    torch.testing.assert_close(f(x), (x * 2).sin() + 1)
    assert frame_stack._STARTED and frame_stack.install()


def test_off_by_config(monkeypatch):
    monkeypatch.setenv("FJIT_FRAME_CACHE", "0")
    assert not frame_stack.wanted()
    monkeypatch.setenv("FJIT_FRAME_CACHE", "1")
    assert frame_stack.wanted()


def test_a_full_cache_keeps_the_chunks_freed_last():
    """Chunks of other sizes freed earlier (a deep recursion's) must not keep a crossing call's
    chunk out of the cache."""
    assert frame_stack.install()

    def deep(n):
        return 0 if n == 0 else 1 + deep(n - 1)
    for depth in (100, 400, 900):          # frees 16 KiB chunks, several at a time
        assert deep(depth) == depth
    call, one = _crossing(), (lambda: 1)
    call(one)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    assert sum(call(one) for _ in range(2000)) == 2000
    assert resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before < 100
