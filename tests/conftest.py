"""Test-wide settings.

Triton reads TRITON_INTERPRET when it is first imported, so the interpreter is switched on here,
before anything imports triton, on a machine without a CUDA device (with one, Triton imported
under the interpreter refuses compiled kernels, which tests/executors/test_cuda.py runs, and the
CPU tests of the generator switch the interpreter on themselves).  FJIT_TRITON_CPU=0 then keeps
the Triton executor off CPU tensors except in the tests that ask for it
(tests/executors/test_triton.py), so the rest of the suite runs at torch speed.

FJIT_C_KERNELS=sync builds each C kernel before the compile returns, so every test knows what runs:
the default executors' C kernels for small CPU regions (the background build users get is tested in
tests/executors/test_c_executor.py).

FJIT_KERNEL_SIZES=specialized gives every kernel literal sizes: by default (auto) whether a kernel
takes its sizes at run time depends on the sizes its family met before in the process, so in one
pytest process a test's kernels would depend on which tests ran first.  The tests of runtime
sizes (tests/executors/test_c_runtime_sizes.py, the Triton ones, the runtime-size property in
tests/ops/test_properties.py) set the mode they test.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("FJIT_TRITON_CPU", "0")
os.environ.setdefault("FJIT_C_KERNELS", "sync")
os.environ.setdefault("FJIT_KERNEL_SIZES", "specialized")


def pytest_collection_modifyitems(config, items):
    """Tests marked `slow` (long sweeps) run only with FJIT_SLOW_TESTS=1; tests marked `zoo` (the
    whole model zoo of benchmarks/zoo_models.py) only with FJIT_ZOO=1."""
    import pytest
    for marker, env, why in (("slow", "FJIT_SLOW_TESTS", "long sweep"),
                             ("zoo", "FJIT_ZOO", "the whole model zoo")):
        if os.environ.get(env) == "1":
            continue
        skip = pytest.mark.skip(reason=f"{why}: set {env}=1 to run it")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
