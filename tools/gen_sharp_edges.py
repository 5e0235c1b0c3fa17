"""Generate docs/sharp_edges.md and fjit/strict/hints.py from the sharp-edges catalog.

Every module of sharp_edges_catalog/ named <CODE>_<topic>.py or OK_<topic>.py is imported; its
CODE, ERROR, TITLE, FIX, EXPECTED, docstring, bad() and good() become one entry of the docs, and
the FIX of every entry with a CODE becomes the hint that fjit's errors print for it.

    python tools/gen_sharp_edges.py           # rewrite both files
    python tools/gen_sharp_edges.py --check   # exit 1 if a file differs from what it would write

The output depends only on the catalog's source (never on timestamps, paths or fjit's runtime
behaviour), so --check is stable across machines.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
import symtable
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CATALOG = "sharp_edges_catalog"     # the path errors print (installed as fjit.sharp_edges_catalog)
CATALOG_MODULE = "sharp_edges_catalog"     # imported from the checkout, which ROOT puts on sys.path
CATALOG_DIR = ROOT / CATALOG
DOCS_OUT = ROOT / "docs" / "sharp_edges.md"
HINTS_OUT = ROOT / "fjit" / "strict" / "hints.py"
SCRIPT = "tools/gen_sharp_edges.py"

ENTRY_RE = re.compile(r"^(FJ\d{3}|OK)_[A-Za-z0-9_]+$")
MARK_RE = re.compile(r"#\s*sharp edge\s*$")
# Module attributes that describe the entry rather than the program: never shown as program text.
METADATA = {"CODE", "ERROR", "TITLE", "FIX", "EXPECTED", "RANDOM", "BINDINGS",
            "inputs", "good_inputs", "fjit"}


# ----------------------------------------------------------------------------- the catalog

def entry_names() -> list[str]:
    """Every catalog module name, sorted (the directory listing is the source of truth)."""
    return sorted(p.stem for p in CATALOG_DIR.glob("*.py") if ENTRY_RE.match(p.stem))


def load(name: str):
    return importlib.import_module(f"{CATALOG_MODULE}.{name}")


def marked_lines(mod) -> list[int]:
    """1-based numbers of the lines carrying the trailing `# sharp edge` comment."""
    lines = Path(mod.__file__).read_text().splitlines()
    return [i for i, line in enumerate(lines, 1) if MARK_RE.search(line)]


def check_entry(name: str, mod) -> None:
    """Fail loudly (naming the module) on an entry the docs, hints or tests could not use."""
    from fjit.errors import CATEGORIES, ERROR_CLASSES

    problems = []
    for attr in ("CODE", "ERROR", "TITLE", "FIX", "EXPECTED", "bad", "good", "inputs"):
        if not hasattr(mod, attr):
            problems.append(f"missing {attr}")
    if not (mod.__doc__ or "").strip():
        problems.append("missing module docstring")
    if problems:
        raise SystemExit(f"{CATALOG}/{name}.py: " + "; ".join(problems))
    prefix = name.split("_", 1)[0]
    if prefix == "OK":
        if mod.CODE is not None or mod.ERROR is not None:
            problems.append("an OK_ entry has CODE = None and ERROR = None")
    else:
        if mod.CODE != prefix:
            problems.append(f"CODE is {mod.CODE!r} but the file name says {prefix!r}")
        if prefix not in CATEGORIES:
            problems.append(f"unknown code {prefix!r}")
        expected_cls = ERROR_CLASSES.get(prefix)
        if expected_cls is not None and mod.ERROR is not expected_cls:
            problems.append(f"ERROR should be {expected_cls.__name__}")
        if not isinstance(mod.FIX, str) or not mod.FIX or "\n" in mod.FIX:
            problems.append("FIX must be one non-empty line")
        if not isinstance(mod.EXPECTED, str) or not mod.EXPECTED:
            problems.append("EXPECTED must be a non-empty string")
        if prefix in ERROR_CLASSES and len(marked_lines(mod)) != 1:
            problems.append("exactly one line must carry '# sharp edge'")
    if len(marked_lines(mod)) > 1:
        problems.append("more than one line carries '# sharp edge'")
    if problems:
        raise SystemExit(f"{CATALOG}/{name}.py: " + "; ".join(problems))


def load_all() -> list[tuple[str, object]]:
    entries = []
    for name in entry_names():
        mod = load(name)
        check_entry(name, mod)
        entries.append((name, mod))
    return entries


# ----------------------------------------------------------------------------- program text

def _defined_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [stmt.name]
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in stmt.names]
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    return []


def _scope_globals(table: symtable.SymbolTable) -> set[str]:
    """Names a function or class scope (and the scopes nested in it) reads or assigns at module
    level (`global calls; calls += 1` needs `calls = 0` shown)."""
    names = {s.get_name() for s in table.get_symbols()
             if s.is_global() and (s.is_referenced() or s.is_assigned())}
    for child in table.get_children():
        names |= _scope_globals(child)
    return names


def _statement_refs(stmt: ast.stmt, scopes: dict[str, symtable.SymbolTable]) -> set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        refs = _scope_globals(scopes[stmt.name])
        outer = list(stmt.decorator_list)  # evaluated at module level, like defaults and bases
        if isinstance(stmt, ast.ClassDef):
            outer += stmt.bases + [k.value for k in stmt.keywords]
        else:
            outer += stmt.args.defaults + [d for d in stmt.args.kw_defaults if d is not None]
        for node in outer:
            refs |= {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return refs
    return {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name) and
            isinstance(n.ctx, ast.Load)}


def program_source(mod, attrs: str | tuple[str, ...], shown: set[int] | None = None,
                   names: tuple[str, ...] = ()) -> str:
    """The source of mod.<attr> (of each of attrs) with the module-level code it needs (imports,
    globals, classes, the factory that made it), and that the module-level `names` need, in file
    order, so the snippet reads as a complete program.
    Statements whose first line is in `shown` (already printed) are left out; the first lines of
    the statements printed are added to it."""
    shown = set() if shown is None else shown
    text = Path(mod.__file__).read_text()
    tree = ast.parse(text)
    top = symtable.symtable(text, mod.__file__, "exec")
    scopes = {t.get_name(): t for t in top.get_children()}
    defs: dict[str, list[ast.stmt]] = {}
    for stmt in tree.body:
        for n in _defined_names(stmt):
            defs.setdefault(n, []).append(stmt)

    attrs = (attrs,) if isinstance(attrs, str) else attrs
    queue, chosen = list(names), {}
    for attr in attrs:
        queue += [getattr(mod, attr).__qualname__.split(".")[0], attr]
    while queue:
        n = queue.pop()
        if (n in METADATA and n not in attrs and n not in names) or n not in defs:
            continue
        for stmt in defs[n]:
            if id(stmt) not in chosen:
                chosen[id(stmt)] = stmt
                queue.extend(sorted(_statement_refs(stmt, scopes)))
    stmts = sorted((s for s in chosen.values() if s.lineno not in shown), key=lambda s: s.lineno)
    shown.update(s.lineno for s in stmts)

    lines = text.splitlines()
    out = []
    prev = None
    for stmt in stmts:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        seg = "\n".join(lines[first - 1:stmt.end_lineno])  # whole lines: keeps `# sharp edge`
        if prev is not None:
            simple = not isinstance(prev, (ast.FunctionDef, ast.ClassDef)) and not isinstance(
                stmt, (ast.FunctionDef, ast.ClassDef))
            if simple and stmt.lineno == prev.end_lineno + 1:
                out.append("\n")
            elif simple:
                out.append("\n\n")
            else:
                out.append("\n\n\n")
        out.append(seg)
        prev = stmt
    return "".join(out).rstrip() + "\n"


def call_arguments(mod, attr: str) -> tuple[str, str, set[str]]:
    """What mod.<attr>() returns, from its one `return (a, b)` statement: the elements' source
    joined (a call's arguments), the tuple's source, and the module-level names they read."""
    path = Path(mod.__file__)
    text = path.read_text()
    fn = next(s for s in ast.parse(text).body if isinstance(s, ast.FunctionDef) and s.name == attr)
    ret = fn.body[0]
    if len(fn.body) != 1 or not isinstance(ret, ast.Return) or not isinstance(ret.value, ast.Tuple):
        raise SystemExit(f"{CATALOG}/{path.name}: {attr}() must be one `return (a, b, ...)`, which "
                         f"the docs show inline")
    args = ", ".join(ast.get_source_segment(text, e) for e in ret.value.elts)
    names = {n.id for n in ast.walk(ret.value) if isinstance(n, ast.Name)}
    return args, ast.get_source_segment(text, ret.value), names


# ----------------------------------------------------------------------------- rendering

def documented_error(name: str, mod) -> str:
    """The diagnostic fjit prints for the entry's bad program, as the catalog expects it."""
    from fjit.errors import CATEGORIES

    category = CATEGORIES[mod.CODE]
    if mod.CODE.startswith("FJ1"):
        (line,) = marked_lines(mod)
        return (f"{CATALOG}/{name}.py:{line}: {mod.CODE} {category}: {mod.EXPECTED}. "
                f"Fix: {mod.FIX} (see {CATALOG}/{name}.py)")
    return f"{mod.ERROR.__name__}: {mod.CODE} {category}: ... {mod.EXPECTED} ..."


def bad_program(mod, shown: set[int]) -> str:
    """The bad program as the docs show it: marked with its error code, and called on its inputs
    as the test calls it, so that it raises that error as pasted."""
    args, _, names = call_arguments(mod, "inputs")
    src = program_source(mod, "bad", shown, tuple(sorted(names | {"fjit"})))
    return f"# raises {mod.CODE}\n{_then(src, f'fjit.jit(bad)({args})')}"


def checked_program(mod, fn: str, shown: set[int]) -> str:
    """A program fjit compiles faithfully (`good`, or an OK_ entry's `bad`), as the docs show it:
    called on its inputs and compared with eager (shapes only where it draws random numbers)."""
    inputs = "good_inputs" if fn == "good" and hasattr(mod, "good_inputs") else "inputs"
    _, args, names = call_arguments(mod, inputs)
    src = program_source(mod, fn, shown, tuple(sorted(names | {"fjit", "torch"})))
    if getattr(mod, "RANDOM", None):
        check = f"assert fjit.jit({fn})(*args).shape == {fn}(*args).shape  # random values"
    else:
        check = f"torch.testing.assert_close(fjit.jit({fn})(*args), {fn}(*args))"
    return _then(src, f"args = {args}\n{check}")


def _then(src: str, code: str) -> str:
    """Module-level `code` after `src`: two blank lines after a definition, one otherwise."""
    after_definition = src.rstrip().splitlines()[-1].startswith((" ", "\t", ")"))
    gap = "\n\n" if after_definition else "\n"
    return f"{src}{gap}{code}\n"


def _doc(mod) -> str:
    return textwrap.dedent(inspect.cleandoc(mod.__doc__)).strip()


def _fence(src: str, lang: str = "python") -> str:
    return f"```{lang}\n{src.rstrip()}\n```\n"


INTRO = """\
# Sharp edges

<!-- Generated by tools/gen_sharp_edges.py from sharp_edges_catalog/: do not edit by hand. -->

fjit compiles a function by running it once on proxies for its inputs and recording the tensor
operations it performs.  Anything the function does that is *not* such an operation (print a
value, read a global tensor, draw a Python random number, branch on a tensor's value, write into
an input) happens only while tracing, or is frozen into the trace as a constant: a permissive
tracer would compile a program that silently differs from the Python one.  fjit calls these
*sharp edges* and refuses them by default, with a compiler-style diagnostic that names the file,
the line, the rule, the fix and the catalog entry that explains it:

```
path/file.py:12: FJ101 unproxied tensor: global 'b' is a torch.Tensor that is not an input of \
'bad'. Fix: pass the tensor as an argument of the function (see \
sharp_edges_catalog/FJ101_global_tensor.py)
```

`fjit.jit(fn, sharp_edges="warn")` emits a `fjit.SharpEdgeWarning` instead of raising, and
`sharp_edges="allow"` stays silent; `fjit.diagnose(fn, *args)` traces once and lists every sharp
edge it finds, plus the globals and closure variables it bound as constants, without raising.
What the permissive modes compile for each category is in
[design.md](design.md#the-sharp-edge-modes).

Every entry below is a runnable module of `sharp_edges_catalog/`, shipped with the package as
`fjit.sharp_edges_catalog` (run one with `python -m fjit.sharp_edges_catalog.FJ101_global_tensor`),
checked by `tests/strictness/test_catalog.py`: each bad program raises exactly the error shown, and each
rewrite gives the same result as eager PyTorch.  The examples run as pasted, one after the other:
each bad program ends with the call that raises its error (its first line says which), each
rewrite with the call that compares it with eager, and `tests/api/test_docs.py` runs them so.  The
last section lists constructs that tracing JITs are often expected to break but that fjit
compiles faithfully.
"""

SECTION_TEXT = {
    "FJ101": ("`UnproxiedTensorError`",
              "A tensor that is not a signature input (a global, a closure variable, a default "
              "value, an attribute of a global object, a tensor made from outside data) reaches "
              "an operation.  It would be frozen into the compiled program."),
    "FJ102": ("`InputMutationError`",
              "An in-place operation, an `out=` argument or an item assignment writes into an "
              "input tensor or a view of one.  Compiled programs never write to their inputs."),
    "FJ103": ("`InputMutationError`",
              "An input list or dict is mutated (append, insert, pop, setitem, update, ...).  "
              "Input containers are flattened when traced and are read-only."),
    "FJ104": ("`SideEffectError`",
              "The function does something a trace cannot replay: print, log, file or network "
              "I/O, assign a global or nonlocal variable, mutate an object it does not own, "
              "seed the global random generator.  It would happen only while tracing."),
    "FJ105": ("`NondeterminismError`",
              "A value that differs between runs (`random.*`, `time.*`, `numpy.random.*`, "
              "`os.urandom`, `uuid`, `secrets`) would be frozen into the trace as a constant."),
    "FJ106": ("`DataDependentError`",
              "Python control flow or Python values depend on tensor data (`bool(t)`, "
              "`.item()`, `int(t)`, `float(t)`, `.tolist()`, `.numpy()`): the trace would be "
              "specialized to the example's data."),
    "FJ201": ("`UnsupportedInputError`",
              "An input of a type fjit cannot proxy.  The message names the type and the "
              "accepted types."),
    "FJ202": ("`UnsupportedOpError`",
              "An operation fjit cannot trace, such as one whose output shape depends on data."),
}


def render_entry(name: str, mod) -> str:
    parts = [f"### {mod.TITLE}\n", f"`{CATALOG}/{name}.py`\n", _doc(mod) + "\n"]
    shown: set[int] = set()  # the good program does not repeat the setup the bad one showed
    if mod.CODE is None:
        parts.append("**Works in fjit:**\n")
        parts.append(_fence(checked_program(mod, "bad", shown)))
        parts.append("**Alternative (also works in fjit):**\n")
        parts.append(_fence(checked_program(mod, "good", shown)))
    else:
        parts.append("**Bad:**\n")
        parts.append(_fence(bad_program(mod, shown)))
        parts.append("**Error:**\n")
        parts.append(_fence(documented_error(name, mod), "text"))
        parts.append(f"**Fix:** {mod.FIX}.\n")
        parts.append("**Good:**\n")
        parts.append(_fence(checked_program(mod, "good", shown)))
    if getattr(mod, "RANDOM", None):
        parts.append(f"*The test compares shapes only: {mod.RANDOM}.*\n")
    return "\n".join(parts)


def render_docs(entries) -> str:
    from fjit.errors import CATEGORIES

    out = [INTRO]
    codes = sorted({mod.CODE for _, mod in entries if mod.CODE is not None})
    out.append("## Contents\n")
    toc = [f"- [{c} {CATEGORIES[c]}](#{c.lower()}-{CATEGORIES[c].replace(' ', '-')})"
           for c in codes]
    toc.append("- [Works in fjit](#works-in-fjit)")
    out.append("\n".join(toc) + "\n")
    for code in codes:
        cls, text = SECTION_TEXT.get(code, ("", ""))
        out.append(f"## {code} {CATEGORIES[code]}\n")
        if text:
            out.append(f"Raised as {cls}.  {text}\n")
        for name, mod in entries:
            if mod.CODE == code:
                out.append(render_entry(name, mod))
    out.append("## Works in fjit\n")
    out.append("Each program below is traced faithfully: `fjit.jit(bad)` returns what `bad` "
               "returns, and `fjit.diagnose` reports no sharp edge.\n")
    for name, mod in entries:
        if mod.CODE is None:
            out.append(render_entry(name, mod))
    return "\n".join(out).rstrip() + "\n"


def render_hints(entries) -> str:
    lines = [
        f"# Generated by {SCRIPT} from {CATALOG}/: do not edit by hand.",
        "# Maps each catalog entry (the module sharp_edges_catalog/<entry>.py) to the one-line fix",
        "# that fjit's errors print for it.  Edit the entry's FIX and rerun the script.",
        "HINTS = {",
    ]
    for name, mod in sorted(entries, key=lambda e: e[0]):
        if mod.CODE is not None:
            item = f"    {name!r}: {mod.FIX!r},"
            lines.append(item if len(item) <= 100 else f"    {name!r}:\n        {mod.FIX!r},")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main

def outputs() -> dict[Path, str]:
    entries = load_all()
    return {DOCS_OUT: render_docs(entries), HINTS_OUT: render_hints(entries)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a generated file on disk is stale; write nothing")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        rel = path.relative_to(ROOT).as_posix()
        if args.check:
            stale.append(rel)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {rel}")
    if stale:
        for rel in stale:
            print(f"{rel} is stale: run python {SCRIPT}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
