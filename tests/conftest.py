"""Test-wide settings.

Triton reads TRITON_INTERPRET when it is first imported, so the interpreter is switched on here,
before anything imports triton; FJIT_TRITON_CPU=0 then keeps the Triton executor off CPU tensors
except in the tests that ask for it (tests/test_triton.py), so the rest of the suite runs at torch
speed.

FJIT_C_KERNELS=sync builds each C kernel before the compile returns, so every test knows what runs:
the default executors' C kernels for small CPU regions (the background build users get is tested in
tests/test_c_executor.py).
"""
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FJIT_TRITON_CPU", "0")
os.environ.setdefault("FJIT_C_KERNELS", "sync")


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` (long sweeps) run only with FJIT_SLOW_TESTS=1."""
    if os.environ.get("FJIT_SLOW_TESTS") == "1":
        return
    import pytest
    skip = pytest.mark.skip(reason="long sweep: set FJIT_SLOW_TESTS=1 to run it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
