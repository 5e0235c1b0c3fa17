"""fjit where the ecosystem expects a function: one config module, pickling and copying,
lru_cache-style cache control, FJIT_DISABLE, a first call that imports neither Dynamo nor sympy, and
the stand-ins that make it so giving torch's own answers."""
from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import tomllib
import typing
from pathlib import Path

import pytest
import torch

import fjit
from fjit import config
from fjit.frontend import light_imports
from fjit.strict.locate import is_user_file

ROOT = Path(__file__).resolve().parents[2]


@fjit.jit
def decorated(x, s: float):
    return x * s + 1


def plain(x):
    return x - 1


jitted_plain = fjit.jit(plain, sharp_edges="warn", executors=("torch",))


# -- config ------------------------------------------------------------------------------------

def test_a_bad_option_lists_exactly_the_accepted_values():
    with pytest.raises(ValueError) as info:
        fjit.jit(plain, sharp_edges="wrn")
    message = str(info.value)
    assert "'error', 'warn', 'allow'" in message and "diagnose" not in message
    with pytest.raises(ValueError, match="'metadata', 'static', 'symbolic'"):
        fjit.jit(plain, cache="symbol")


def test_cache_static_keeps_one_program_per_shape():
    jf = fjit.jit(lambda x: x * 2 + 1, cache="static")
    for n in (3, 4, 3, 4):
        torch.testing.assert_close(jf(torch.ones(n)), torch.full((n,), 3.0))
    assert fjit.cache_info(jf) == (2, 2, 2)
    with pytest.raises(ValueError, match="executors='cuda' is not one of 'triton', 'c', 'torch'"):
        fjit.jit(plain, executors=("cuda",))


def test_options_accept_their_enums_and_executors_their_registered_names():
    from fjit.executors import REGISTERED, TORCH
    assert {"c", "triton"} <= set(REGISTERED) and TORCH not in REGISTERED
    jf = fjit.jit(plain, sharp_edges=config.SharpEdges.ALLOW, executors=TORCH,
                  cache=config.CacheMode.NONE)
    x = torch.randn(3)
    torch.testing.assert_close(jf(x), plain(x))
    assert jf.cache_info().entries == 0          # cache=None keeps nothing


def test_user_options_and_internal_modes_are_separate_enums():
    assert {m.value for m in config.SharpEdges} == {"error", "warn", "allow"}
    assert "diagnose" in {m.value for m in config.TraceMode}
    assert config.TraceMode.of(config.SharpEdges.WARN) is config.TraceMode.WARN


def test_environment_variables_are_parsed_in_config(monkeypatch):
    monkeypatch.setenv("FJIT_C_KERNELS", "off")
    assert config.c_kernels() is config.CKernels.OFF
    monkeypatch.setenv("FJIT_LOGS", "recompiles, kernels")
    assert config.log_topics() == [config.LogTopic.RECOMPILES, config.LogTopic.KERNELS]
    monkeypatch.setenv("FJIT_LOGS", "recompile")
    with pytest.raises(ValueError, match="FJIT_LOGS='recompile' is not one of 'recompiles'"):
        config.log_topics()
    monkeypatch.setenv("FJIT_CACHE_DIR", "/some/where")
    assert config.kernel_cache_root() == "/some/where"


def test_every_fjit_variable_read_in_the_package_is_documented_in_config():
    import re
    read = set()
    for path in (ROOT / "fjit").rglob("*.py"):
        read |= set(re.findall(r"\bFJIT_[A-Z_]+\b", path.read_text()))
    documented = set(re.findall(r"\| (FJIT_[A-Z_]+) \|", config.__doc__))
    # FJIT_OPS is a namespace name; the catalog's FJ104 example writes a variable of its own
    assert read - {"FJIT_OPS", "FJIT_CATALOG_LAST_ROWS"} <= documented, read - documented


# -- conventions ---------------------------------------------------------------------------------

def test_pickles_by_reference_and_copies_to_itself():
    assert pickle.loads(pickle.dumps(decorated)) is decorated
    assert copy.deepcopy(decorated) is decorated and copy.copy(decorated) is decorated
    assert copy.deepcopy({"f": decorated})["f"] is decorated
    # jitted under another name than the function's: fjit.jit of the function, same options
    again = pickle.loads(pickle.dumps(jitted_plain))
    assert isinstance(again, fjit.JittedFunction) and again.__wrapped__ is plain
    assert again._options == jitted_plain._options
    x = torch.randn(2)
    torch.testing.assert_close(again(x), plain(x))


def test_cache_info_and_cache_clear_as_lru_cache_has_them():
    jf = fjit.jit(lambda x: x * 2)
    x = torch.randn(3)
    jf(x), jf(x), jf(x)
    assert jf.cache_info() == fjit.cache_info(jf) == (2, 1, 1)
    jf.cache_clear()
    assert jf.cache_info() == (0, 0, 0) and fjit.last_traces(jf) == []
    jf(x)
    assert jf.cache_info() == (0, 1, 1)


def test_clear_caches_clears_every_jitted_function():
    a, b = fjit.jit(lambda x: x + 1), fjit.jit(lambda x: x - 1)
    x = torch.randn(2)
    a(x), b(x)
    fjit.clear_caches()
    assert a.cache_info().entries == 0 and b.cache_info().entries == 0
    torch.testing.assert_close(a(x), x + 1)
    assert a.cache_info() == (0, 1, 1)


def test_fjit_disable_runs_the_function_eagerly(monkeypatch):
    calls = []

    def f(x):
        calls.append(type(x))
        return x + 1
    monkeypatch.setenv("FJIT_DISABLE", "1")
    jf = fjit.jit(f)
    x = torch.randn(2)
    torch.testing.assert_close(jf(x), x + 1)
    jf(x)
    assert calls == [torch.Tensor, torch.Tensor]        # real tensors, every call: no trace
    assert jf.cache_info() == (0, 0, 0)
    monkeypatch.setenv("FJIT_DISABLE", "0")
    with pytest.raises(fjit.SideEffectError):           # traced again: append is a side effect
        jf(x)


def test_jit_is_typed_and_the_package_says_so():
    assert (ROOT / "fjit" / "py.typed").exists()
    overloads = typing.get_overloads(fjit.jit)
    assert len(overloads) == 2                          # bare and configured use
    hints = typing.get_type_hints(fjit.api.JittedFunction.__init__, vars(fjit.api))
    assert "sharp_edges" in hints and "cache" in hints


def test_errors_name_a_catalog_file_that_ships_in_the_package():
    """The fix line names a file of the top-level catalog; pyproject.toml ships that directory as
    fjit.sharp_edges_catalog, beside every package of fjit/ (a new subpackage must be listed)."""
    with pytest.raises(fjit.UnsupportedInputError) as info:
        fjit.jit(plain)(object())
    entry = str(info.value).rsplit("see ", 1)[1].rstrip(")")
    assert entry.startswith("sharp_edges_catalog/")
    assert (ROOT / entry).is_file(), entry
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"fjit.sharp_edges_catalog": "sharp_edges_catalog"}
    packages = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fjit").rglob("__init__.py")}
    assert sorted(setuptools["packages"]) == sorted(packages | {"fjit.sharp_edges_catalog"})


def test_catalog_files_are_user_code_where_they_are_installed():
    """A wheel puts the catalog inside fjit/, whose other files are library code: its example
    programs must still be located as the user's (a checkout's copy is outside fjit/ anyway)."""
    installed = Path(fjit.__file__).parent / "sharp_edges_catalog" / "FJ101_global_tensor.py"
    assert is_user_file(str(installed))
    assert is_user_file(str(ROOT / "sharp_edges_catalog" / "FJ101_global_tensor.py"))
    assert not is_user_file(fjit.api.__file__)


# -- the first call ------------------------------------------------------------------------------

_FIRST_CALL = r"""
import json, sys, time
import torch, torch.nn.functional as F
import fjit
x, w = torch.randn(4, 4), torch.randn(4, 4)
img, k = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
cases = {
    "small": (lambda x, w: torch.relu(x * w + 1.0).sum(-1), (x, w)),
    "matmul": (lambda x, w: x @ w, (x, w)),
    "softmax": (lambda x, w: torch.softmax(x, -1) + w, (x, w)),
    "conv": (lambda i, k: F.conv2d(i, k, padding=1), (img, k)),
    "layer_norm": (lambda x, w: F.layer_norm(x, (4,), w[0], w[1]), (x, w)),
    "fallback": (lambda x, w: torch.cumsum(x, 0) + torch.special.erfinv(w.tanh() * 0.5), (x, w)),
}
heavy = ("torch._dynamo", "sympy", "torch.fx.experimental.symbolic_shapes", "triton")
# without a CUDA device (and Triton's interpreter off) nothing can be a Triton kernel
heavy += () if torch.cuda.is_available() else ("fjit.executors.triton.executor",)
report = {}
for name, (f, args) in cases.items():
    got = fjit.jit(f)(*args)
    # torch.allclose, not torch.testing.assert_close: that one imports sympy itself
    report[name] = [m for m in heavy if m in sys.modules] + \
        ([] if torch.allclose(got, f(*args), atol=1e-5) else ["a wrong result"])
print(json.dumps(report))
"""


def test_a_first_call_imports_neither_dynamo_nor_sympy_nor_triton_nor_fjits_triton_executor():
    env = dict(os.environ, PYTHONPATH=str(ROOT), FJIT_C_KERNELS="0")
    env.pop("TRITON_INTERPRET", None)
    out = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {name: [] for name in report}, report


def _real_symbolic_shapes():
    import torch.fx.experimental.symbolic_shapes as shapes
    return shapes


_BOOLS = [True, False]
_INTS = [0, 1, 7, -3]
_SEQS = [(), (1, 2), [1, 2], (1, 3), torch.Size([1, 2]), [1, 2, 3], ((1, 2), 3), ((1, 2), 4)]


def _same(standin, real, *args):
    """The stand-in answers as torch's function does, or raises the same exception type."""
    def run(f):
        try:
            return "ok", f(*args)
        except Exception as e:  # noqa: BLE001  (the exception type is the answer compared)
            return "raised", type(e)
    assert run(standin) == run(real), (standin.__name__, args)


def test_stand_ins_answer_as_torch_on_concrete_values():
    shapes = _real_symbolic_shapes()
    standin = light_imports._STANDINS["torch.fx.experimental.symbolic_shapes"][1]
    for name in ("expect_true", "guard_or_false", "guard_or_true", "statically_known_true"):
        for a in _BOOLS + [1, None]:
            _same(getattr(standin, name), getattr(shapes, name), a)
    for name in ("guard_int", "guarding_hint_or_throw"):
        for a in _INTS + _BOOLS + [1.5]:
            _same(getattr(standin, name), getattr(shapes, name), a)
    for name in ("sym_and", "sym_or"):
        for args in ((True,), (True, False), (False, False, True), (True, True, True), (1, True)):
            _same(getattr(standin, name), getattr(shapes, name), *args)
    for a in _SEQS + _INTS:
        for b in _SEQS + _INTS:
            _same(standin.sym_eq, shapes.sym_eq, a, b)
    for a in _INTS + [1.5, True]:
        _same(standin.is_nested_int, shapes.is_nested_int, a)
        _same(standin.has_guarding_hint, shapes.has_guarding_hint, a)
    # anything not stood in for is torch's own
    assert standin.guard_bool is shapes.guard_bool


def test_stand_ins_serve_only_torch_and_only_while_compiling():
    import builtins
    assert builtins.__import__ is not light_imports._import           # not installed at rest
    with light_imports.light_imports():
        assert builtins.__import__ is light_imports._import
        # user code importing the same names gets the real modules
        g = {"__name__": "user_module"}
        exec("import torch.fx.experimental.symbolic_shapes as s", g)
        assert g["s"] is sys.modules["torch.fx.experimental.symbolic_shapes"]
    assert builtins.__import__ is not light_imports._import
