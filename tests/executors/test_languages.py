"""Languages register and blocks hold facts (docs/design.md, "Adding a language", "Adding a prim"):
a kernel executor is one folder and one registration (the toy executor of toy_language/), and a
prim is one source file, with coverage saying what each lacks by name."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import fjit
from fjit.core.prims import LANGUAGES, coverage
from fjit.executors import REGISTERED

PACKAGE = pathlib.Path(fjit.__file__).parent


@pytest.fixture
def toy():
    import toy_language
    from toy_language import executor
    toy_language.install()
    executor.CALLS.clear()
    try:
        yield executor
    finally:
        REGISTERED.pop("toy", None)
        LANGUAGES.pop("toy", None)


def test_a_toy_executor_from_one_folder_and_one_registration_runs_programs(toy):
    def f(x, y):
        return ((x * 2 + y) / 3 - (x > y) * 0.5) * y + 1

    x, y = torch.randn(5, 7), torch.randn(7)
    jf = fjit.jit(f, executors=("toy", "torch"))
    torch.testing.assert_close(jf(x, y), f(x, y), rtol=0, atol=0)
    assert toy.CALLS, "the toy executor claimed nothing"
    source = str(fjit.last_traces(jf)[-1])
    assert "toy_" in source and "toy_fusion" in str(fjit.last_traces(jf)[-2].stage)
    # the default executors are untouched by a registration
    assert fjit.jit(f)(x, y).shape == (5, 7) and len(toy.CALLS) == 1


def test_coverage_lists_the_toy_languages_gaps_by_name(toy):
    gaps = coverage.gaps("toy")
    # it reads only the shared infix form: C's libm calls and Triton's tl.* forms are gaps
    assert {"EXP", "SIN", "ABS", "WHERE", "MAXIMUM"} <= set(gaps)
    assert not {"ADD", "MUL", "NEG", "EQ"} & set(gaps)
    assert "EXP: toy" in coverage.unexplained()          # no block has a note for a new language
    assert "\n    toy " in coverage.table()
    # and nothing of fjit names it: core and the blocks were not touched to add it
    assert not [p for p in PACKAGE.rglob("*.py") if "toy_language" in p.read_text()]


# -- adding a prim: one file in fjit/core/prims/ ----------------------------------------------------

_SOFTSIGN = '''
"""softsign(x) = x / (1 + |x|): a unary prim whose C form calls a C library function (fabs)."""
import torch.nn.functional as F

from fjit.core.prims.registry import Cost, Domain, Form, Kind, Prim, apply, define
from fjit.core.prims.toolkit import derivative, square

define("SOFTSIGN", Kind.UNARY, Domain.FLOAT, names={names}, also=(F.softsign,), lowering=F.softsign,
       vjp=derivative(lambda x, o, v: apply(Prim.RECIPROCAL, square(apply(Prim.ADD, apply(Prim.ABS, v(x)), 1)))),
       c={c_form}, triton="({{0}} / (1 + tl.abs({{0}})))",
       notes={{"aten": "ATen has no softsign op: Dynamo's graphs hold its decomposition"}})
'''

_CHECK = '''
import torch, torch.nn.functional as F
import fjit
from fjit.core.prims import Prim, coverage
from fjit.executors.c import executor
print("UNEXPLAINED", coverage.unexplained())
if hasattr(Prim, "SOFTSIGN"):
    print("C_ROW", dict(coverage.rows())[Prim.SOFTSIGN]["c"][0])
    f = lambda x: F.softsign(x * 3)
    jf = fjit.jit(f)
    for n in (10, 1000, 100000):
        x = torch.randn(n)
        got = jf(x)
        executor.wait(120)
        got = jf(x)
        src = str(fjit.last_traces(jf)[-1])
        kernels = src.count("= fjit_c_")
        torch.testing.assert_close(got, f(x))
        print("SIZE", n, kernels, "fabsf" in src)
    x = torch.randn(64, requires_grad=True)
    jf(x).sum().backward()
    g = x.grad.clone(); x.grad = None
    f(x).sum().backward()
    torch.testing.assert_close(g, x.grad)
    print("GRAD ok")
'''


def _with_prim(tmp_path, names: str, c_form: str) -> str:
    """Run _CHECK against a copy of the package with softsign.py added; its output."""
    root = tmp_path / "copy"
    shutil.copytree(PACKAGE, root / "fjit", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "fjit" / "core" / "prims" / "softsign.py").write_text(
        textwrap.dedent(_SOFTSIGN.format(names=names, c_form=c_form)))
    env = dict(os.environ, PYTHONPATH=str(root), FJIT_CACHE_DIR=str(tmp_path / "kernels"))
    run = subprocess.run([sys.executable, "-c", _CHECK], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def test_a_prim_is_one_file_and_its_libm_form_fuses_at_every_size(tmp_path):
    out = _with_prim(tmp_path, "()", 'Form("({0} / (1 + fabs{f}({0})))", Cost.ARITHMETIC)')
    assert "UNEXPLAINED []" in out and "C_ROW c\n" in out
    for n in (10, 1000, 100000):        # one kernel with the multiply, fabsf inside, at each size
        assert f"SIZE {n} 1 True" in out, out
    assert "GRAD ok" in out


def test_a_prim_whose_c_form_is_a_library_call_says_where_it_stops_fusing(tmp_path):
    out = _with_prim(tmp_path, "()", 'Form("({0} / (1 + fabs{f}({0})))", Cost.LIBM)')
    assert "UNEXPLAINED []" in out and "fused up to 256 elements" in out
    assert "SIZE 10 1 True" in out and "SIZE 100000 0 False" in out, out     # a torch call past 256


def test_coverage_fails_on_a_misspelled_torch_name_and_an_unstated_library_cost(tmp_path):
    out = _with_prim(tmp_path, '("softsgn",)', '"({0} / (1 + fabs{f}({0})))"')
    assert "torch name 'softsgn' is neither torch.softsgn nor Tensor.softsgn" in out
    assert "calls a C library function but states no cost" in out
