"""The sharp-edges catalog run as tests.

Every module of sharp_edges_catalog/ is a test case: each bad program gets exactly its error (the
right class, code, entry, file, line and message), `fjit.diagnose` lists it without raising,
`sharp_edges="warn"` turns it into a warning, each rewrite matches eager PyTorch, and each OK_
program compiles to what Python computes.  The generated docs and hints must be up to date.
"""
from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import fjit  # noqa: E402

CATALOG_PREFIX = "sharp_edges_catalog/"     # how errors name an entry
CATALOG_DIR = ROOT / CATALOG_PREFIX
ENTRY_RE = re.compile(r"^(FJ\d{3}|OK)_[A-Za-z0-9_]+$")
MARK_RE = re.compile(r"#\s*sharp edge\s*$")

NAMES = sorted(p.stem for p in CATALOG_DIR.glob("*.py") if ENTRY_RE.match(p.stem))
# Checked at collection: an empty or moved catalog must fail loudly, not collect zero tests.
assert len(NAMES) >= 36, f"expected at least 36 catalog modules in {CATALOG_DIR}, found {NAMES}"
SHARP = [n for n in NAMES if re.match(r"FJ10[1-6]_", n)]
UNSUPPORTED = [n for n in NAMES if re.match(r"FJ2\d\d_", n)]
OK = [n for n in NAMES if n.startswith("OK_")]

# The entries the fjit core names in its diagnostics: each must exist.
REQUIRED = """
FJ101_global_tensor FJ101_closure_tensor FJ101_default_arg_tensor FJ101_attribute_tensor
FJ101_external_tensor FJ102_inplace_input FJ102_view_of_input FJ102_out_argument
FJ102_setitem_input FJ103_list_append FJ103_dict_setitem FJ104_print FJ104_logging FJ104_file_io
FJ104_global_assignment FJ104_nonlocal_assignment FJ104_mutate_global_object FJ104_manual_seed
FJ105_random FJ105_time FJ105_numpy_random FJ105_uuid_urandom FJ106_if_tensor FJ106_item
FJ106_tolist FJ106_int_of_tensor FJ201_tensor_subclass FJ201_object_input
FJ202_data_dependent_shape OK_uninitialized_loop_variable OK_generator OK_attribute_dependent_call
OK_try_except OK_record_function OK_no_grad OK_closure_loop_lambdas
OK_nested_function_captured_arg OK_closure_reads_global
""".split()


def load(name):
    # The checkout's top-level package (a wheel installs the same files as fjit.sharp_edges_catalog).
    return importlib.import_module(f"sharp_edges_catalog.{name}")


def marked_lines(mod):
    lines = Path(mod.__file__).read_text().splitlines()
    return [i for i, line in enumerate(lines, 1) if MARK_RE.search(line)]


def marked_line(mod):
    (line,) = marked_lines(mod)
    return line


def good_args(mod):
    return mod.good_inputs() if hasattr(mod, "good_inputs") else mod.inputs()


def same_file(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def assert_matches_eager(mod, got, want):
    """assert_close, or for entries with RANDOM (their outputs draw random numbers on each call)
    the same structure, shapes and dtypes: the values cannot match eager's draws."""
    if getattr(mod, "RANDOM", None):
        got_leaves, got_spec = pytree.tree_flatten(got)
        want_leaves, want_spec = pytree.tree_flatten(want)
        assert got_spec == want_spec
        for g, w in zip(got_leaves, want_leaves):
            assert type(g) is type(w)
            if isinstance(w, torch.Tensor):
                assert (g.shape, g.dtype, g.device) == (w.shape, w.dtype, w.device)
    else:
        torch.testing.assert_close(got, want)


def _generator():
    spec = importlib.util.spec_from_file_location("gen_sharp_edges",
                                                  ROOT / "tools" / "gen_sharp_edges.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


# ----------------------------------------------------------------------------- the catalog itself

def test_catalog_has_every_required_entry():
    missing = sorted(set(REQUIRED) - set(NAMES))
    assert not missing, f"catalog entries missing: {missing}"
    assert len(NAMES) >= 36


@pytest.mark.parametrize("name", NAMES)
def test_entry_is_well_formed(name):
    mod = load(name)
    assert (mod.__doc__ or "").strip(), "module docstring"
    for attr in ("CODE", "ERROR", "TITLE", "FIX", "EXPECTED"):
        assert hasattr(mod, attr), attr
    for fn in ("bad", "good", "inputs"):
        assert callable(getattr(mod, fn, None)), fn
    assert isinstance(mod.inputs(), tuple)
    assert isinstance(good_args(mod), tuple)
    prefix = name.split("_", 1)[0]
    if prefix == "OK":
        assert mod.CODE is None and mod.ERROR is None
        assert len(marked_lines(mod)) <= 1
    else:
        assert mod.CODE == prefix
        assert isinstance(mod.FIX, str) and mod.FIX and "\n" not in mod.FIX
        assert isinstance(mod.EXPECTED, str) and mod.EXPECTED
        assert issubclass(mod.ERROR, fjit.FjitError)
        # FJ1xx: the one line fjit must report; FJ2xx: optional (the error may have no line).
        assert len(marked_lines(mod)) == 1 if name in SHARP else len(marked_lines(mod)) <= 1


def test_hints_cover_exactly_the_catalog():
    from fjit.strict.hints import HINTS

    entries = {n: load(n) for n in NAMES}
    assert HINTS == {n: m.FIX for n, m in sorted(entries.items()) if m.CODE is not None}


# ----------------------------------------------------------------------------- FJ101..FJ106

@pytest.mark.parametrize("name", SHARP)
def test_bad_raises_exactly_its_error(name):
    mod = load(name)
    with pytest.raises(fjit.SharpEdgeError) as info:
        fjit.jit(mod.bad)(*mod.inputs())
    e = info.value
    assert type(e) is mod.ERROR, f"{type(e).__name__}: {e}"
    assert e.code == mod.CODE, str(e)
    assert e.category == fjit.errors.CATEGORIES[mod.CODE]
    assert e.entry == name, str(e)
    assert same_file(e.filename, mod.__file__), str(e)
    assert e.lineno == marked_line(mod), str(e)
    assert e.hint == mod.FIX
    assert mod.EXPECTED in str(e), str(e)
    assert f"{CATALOG_PREFIX}{name}.py" in str(e)


@pytest.mark.parametrize("name", SHARP)
def test_docs_show_the_real_error(name):
    """docs/sharp_edges.md prints the diagnostic from the catalog's data: it must be fjit's."""
    mod = load(name)
    documented = _generator().documented_error(name, mod)
    with pytest.raises(fjit.SharpEdgeError) as info:
        fjit.jit(mod.bad)(*mod.inputs())
    # The path prefix of the real message is relative to the current directory.
    assert str(info.value).endswith(documented[len(CATALOG_PREFIX):]), str(info.value)


@pytest.mark.parametrize("name", SHARP)
def test_diagnose_lists_the_edge(name):
    mod = load(name)
    report = fjit.diagnose(mod.bad, *mod.inputs())
    assert not report.ok
    hits = [e for e in report.edges if e.entry == name and e.lineno == marked_line(mod)]
    assert hits, f"no {name} edge at line {marked_line(mod)}:\n{report}"
    edge = hits[0]
    assert edge.code == mod.CODE
    assert same_file(edge.filename, mod.__file__)
    assert edge.hint == mod.FIX
    assert mod.EXPECTED in edge.message
    assert f"{mod.CODE}" in str(report)


@pytest.mark.parametrize("name", SHARP)
def test_warn_mode_warns(name):
    mod = load(name)
    with pytest.warns(fjit.SharpEdgeWarning) as record:
        fjit.jit(mod.bad, sharp_edges="warn")(*mod.inputs())
    edges = [w.message.edge for w in record if isinstance(w.message, fjit.SharpEdgeWarning)]
    assert any(e.entry == name and e.lineno == marked_line(mod) for e in edges), edges


# ----------------------------------------------------------------------------- FJ201, FJ202

@pytest.mark.parametrize("name", UNSUPPORTED)
def test_unsupported_raises_its_error(name):
    mod = load(name)
    with pytest.raises(fjit.FjitError) as info:
        fjit.jit(mod.bad)(*mod.inputs())
    e = info.value
    assert type(e) is mod.ERROR, f"{type(e).__name__}: {e}"
    assert mod.CODE in str(e), str(e)
    assert mod.EXPECTED in str(e), str(e)
    base = {"FJ201": TypeError, "FJ202": NotImplementedError}[mod.CODE]
    assert isinstance(e, base)


# ----------------------------------------------------------------------------- rewrites, OK entries

@pytest.mark.parametrize("name", SHARP + UNSUPPORTED)
def test_good_matches_eager(name):
    mod = load(name)
    args = good_args(mod)
    assert_matches_eager(mod, fjit.jit(mod.good)(*args), mod.good(*args))


@pytest.mark.parametrize("name", NAMES)
def test_good_has_no_sharp_edges(name):
    mod = load(name)
    report = fjit.diagnose(mod.good, *good_args(mod))
    assert report.ok, str(report)
    assert report.edges == []


@pytest.mark.parametrize("name", OK)
def test_ok_entry_matches_eager(name):
    mod = load(name)
    args = mod.inputs()
    assert_matches_eager(mod, fjit.jit(mod.bad)(*args), mod.bad(*args))
    args = good_args(mod)
    assert_matches_eager(mod, fjit.jit(mod.good)(*args), mod.good(*args))


@pytest.mark.parametrize("name", OK)
def test_ok_entry_has_no_sharp_edges(name):
    mod = load(name)
    report = fjit.diagnose(mod.bad, *mod.inputs())
    assert report.ok, str(report)
    assert report.edges == []
    bound = {(b.name, b.kind) for b in report.bindings}
    for binding in getattr(mod, "BINDINGS", []):
        assert binding in bound, f"{binding} not in {report.bindings}"


# ----------------------------------------------------------------------------- several edges

def several_edges(x):
    print("x:", x.shape)
    jitter = random.random()
    x.add_(jitter)
    peak = x.max().item()
    return x / peak


SEVERAL = [  # (code, entry, a piece of the line that must carry the edge), in source order
    ("FJ104", "FJ104_print", "print("),
    ("FJ105", "FJ105_random", "random.random()"),
    ("FJ102", "FJ102_inplace_input", "x.add_("),
    ("FJ106", "FJ106_item", ".item()"),
]


def _several_lines():
    source, first = inspect.getsourcelines(several_edges)
    lines = []
    for _, _, needle in SEVERAL:
        (offset,) = [i for i, line in enumerate(source) if needle in line]
        lines.append(first + offset)
    return lines


def test_diagnose_reports_every_edge_in_source_order():
    report = fjit.diagnose(several_edges, torch.randn(3))
    got = [(e.code, e.entry, e.lineno) for e in report.edges]
    want = [(code, entry, line) for (code, entry, _), line in zip(SEVERAL, _several_lines())]
    assert got == want, str(report)
    assert all(same_file(e.filename, __file__) for e in report.edges)
    assert not report.ok
    text = str(report)
    for code, _, line in want:
        assert code in text and f":{line}" in text, text


def test_strict_mode_raises_the_first_edge():
    with pytest.raises(fjit.SideEffectError) as info:
        fjit.jit(several_edges)(torch.randn(3))
    assert info.value.code == "FJ104"
    assert info.value.lineno == _several_lines()[0]


def test_warn_mode_warns_for_every_edge():
    with pytest.warns(fjit.SharpEdgeWarning) as record:
        try:
            fjit.jit(several_edges, sharp_edges="warn")(torch.randn(3))
        except fjit.FjitError:
            pass  # what happens after a data-dependent .item() in warn mode is not the point here
    got = [(w.message.edge.code, w.message.edge.lineno) for w in record
           if isinstance(w.message, fjit.SharpEdgeWarning)]
    want = [(code, line) for (code, _, _), line in zip(SEVERAL, _several_lines())]
    assert got[:len(want)] == want


# ----------------------------------------------------------------------------- generated files

def test_generated_files_are_up_to_date():
    result = subprocess.run([sys.executable, "tools/gen_sharp_edges.py", "--check"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_reports_a_stale_file(tmp_path, monkeypatch, capsys):
    gen = _generator()
    docs, hints = tmp_path / "sharp_edges.md", tmp_path / "hints.py"
    monkeypatch.setattr(gen, "DOCS_OUT", docs)
    monkeypatch.setattr(gen, "HINTS_OUT", hints)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main([]) == 0  # writes both
    assert gen.main(["--check"]) == 0
    hints.write_text(hints.read_text().replace("HINTS = {", "HINTS = {\n    'stale': 'x',"))
    assert gen.main(["--check"]) == 1
    assert "hints.py is stale" in capsys.readouterr().err
    assert "'stale'" in hints.read_text()  # --check writes nothing


def test_generated_hints_are_valid_python():
    gen = _generator()
    text = gen.render_hints(gen.load_all())
    namespace = {}
    exec(compile(text, "hints.py", "exec"), namespace)
    assert namespace["HINTS"] == {n: load(n).FIX for n in NAMES if load(n).CODE is not None}
    assert list(namespace["HINTS"]) == sorted(namespace["HINTS"])


# ----------------------------------------------------------------------------- closures (Thunder #132)

def _assert_fj104_on_second_body_line(fn, text):
    with pytest.raises(fjit.SideEffectError) as info:
        fjit.jit(fn)(torch.ones(2))
    assert info.value.lineno == fn.__code__.co_firstlineno + 2
    assert text in str(info.value)


def test_nonlocal_and_global_deletes_are_fj104_at_their_line():
    marker = 1

    def deletes_nonlocal(x):
        nonlocal marker
        del marker
        return x * 2

    _assert_fj104_on_second_body_line(deletes_nonlocal, "deletion of enclosing-scope variable 'marker'")

    globals()["_DOOMED"] = 1

    def deletes_global(x):
        global _DOOMED
        del _DOOMED
        return x * 2

    _assert_fj104_on_second_body_line(deletes_global, "deletion of global '_DOOMED'")


def test_fj101_names_a_tensor_nested_in_a_global_object():
    with pytest.raises(fjit.UnproxiedTensorError) as info:
        fjit.jit(_reads_nested_tensor)(torch.ones(2))
    assert "item 0 of attribute 'layers' of global '_MODEL'" in str(info.value)


class _Holder:
    def __init__(self):
        self.layers = [torch.ones(2)]


_MODEL = _Holder()


def _reads_nested_tensor(x):
    return x * _MODEL.layers[0]
