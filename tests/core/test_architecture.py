"""The package's layout holds (docs/design.md, "Layout"): rooms of bounded size, imports that only
run down, no private name reached from another module, the autodiff and pass rooms free of
executors and of the frontend, and no code written twice between the C and Triton generators.

Read from the source with `ast` (nothing is imported), so a violation names its file and line."""
from __future__ import annotations

import ast
import pathlib
import warnings

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fjit"
# A module is as long as its one job: past LONG_MODULE a warning asks whether it holds two jobs;
# past MAX_LINES it fails.  A line count is never a reason to move or squeeze code.
LONG_MODULE = 400
MAX_LINES = 600


def _modules() -> dict[str, pathlib.Path]:
    """Dotted module name -> path, for every module of the package (the catalog is data)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        if "sharp_edges_catalog" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom in `module` names."""
    if not node.level:
        return node.module or ""
    package = module.split(".")
    if not MODULES[module].name == "__init__.py":
        package = package[:-1]
    package = package[:len(package) - (node.level - 1)]
    return ".".join(package + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, int]]:
    """(imported fjit module, line) for every import in `module`, at any depth (a lazy import
    inside a function is an arrow too)."""
    tree = ast.parse(MODULES[module].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names if a.name.startswith("fjit")]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            if not base.startswith("fjit"):
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub if sub in MODULES else base, node.lineno))
    return out


def _owner(name: str) -> str:
    """The module a dotted import target lives in (`fjit.a.b` may name `fjit.a`'s attribute b)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def test_no_module_over_the_limit():
    lines = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    long = {m: n for m, n in lines.items() if n > LONG_MODULE}
    if long:
        warnings.warn(f"modules over {LONG_MODULE} lines (one job each?): {long}", stacklevel=1)
    over = {m: n for m, n in lines.items() if n > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def test_import_graph_has_no_circles():
    graph = {m: {_owner(t) for t, _ in _imports(m)} - {m, ""} for m in MODULES}
    # a package's __init__ re-exporting its submodules is its face, not a dependency of them
    for m in graph:
        graph[m] = {t for t in graph[m] if not (MODULES[t].name == "__init__.py" and m.startswith(t + "."))}
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("room", ["fjit.autodiff", "fjit.passes"])
def test_room_imports_no_executor_and_no_frontend(room):
    bad = [(m, t, line) for m in MODULES if m == room or m.startswith(room + ".")
           for t, line in _imports(m)
           if t.startswith(("fjit.executors", "fjit.frontend"))]
    assert not bad, f"{room} reaches into executors or the frontend: {bad}"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_crosses_a_module():
    """`from fjit.x import _y`, and `Y._z` where Y was imported from another fjit module."""
    bad = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _resolve(module, node).startswith("fjit"):
                for a in node.names:
                    if _private(a.name):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name}")
                    imported.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                imported.update(a.asname or a.name.split(".")[0] for a in node.names
                                if a.name.startswith("fjit"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                base = node.value
                while isinstance(base, ast.Attribute):
                    base = base.value
                if isinstance(base, ast.Name) and base.id in imported:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {ast.unparse(node)}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def _windows(path: pathlib.Path, size: int = 6) -> dict[tuple, int]:
    """Each run of `size` code lines (comments, blanks and imports left out) -> its first line."""
    lines = [(n, s.strip()) for n, s in enumerate(path.read_text().splitlines(), 1)]
    code = [(n, s) for n, s in lines if s and not s.startswith(("#", "import ", "from "))]
    return {tuple(s for _, s in code[i:i + size]): code[i][0] for i in range(len(code) - size + 1)}


def test_c_and_triton_generators_share_no_block_of_six_lines():
    c_side = {w: (p, n) for p in sorted((PACKAGE / "executors" / "c").glob("*.py"))
              for w, n in _windows(p).items()}
    shared = [(c_side[w], (p, n)) for p in sorted((PACKAGE / "executors" / "triton").glob("*.py"))
              for w, n in _windows(p).items() if w in c_side]
    assert not shared, f"blocks written in both generators: {shared[:5]}"
