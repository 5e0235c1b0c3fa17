"""Fixtures the C executor's tests share."""
import pytest


@pytest.fixture
def sync_build(monkeypatch):
    """Each C kernel built before the compile returns, whatever FJIT_C_KERNELS the run was given."""
    monkeypatch.setenv("FJIT_C_KERNELS", "sync")


@pytest.fixture
def counted_calls(monkeypatch):
    """count(module): the calls of the written kernels through `module.call`, in order (each the
    binary it ran), from then on in the test."""
    def count(module) -> list:
        calls, real = [], module.call

        def counted(binary, *args):
            calls.append(binary)
            return real(binary, *args)
        monkeypatch.setattr(module, "call", counted)
        return calls
    return count
