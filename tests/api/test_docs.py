"""The docs run as written: the ```python blocks of the README and docs/*.md, run in order in one
fresh namespace per file (in a subprocess, as a new user pasting them would), do what the text
around them says.

What the docs say, and this runner checks:
- `# raises FJ104` on a block's first line: the block raises the fjit error with that code; every
  other block runs without raising.
- `# prints <text>` at the end of a line: <text> appears in what the block prints (the comments of
  one block in order).
- a ```text block right after a python block (with blank lines and at most one label line such as
  `**Error:**` between them) shows what the block prints, or for a block that raises, its error
  as `ErrorClass: message`: it must appear in it.
In expected text, `...` stands for anything, runs of whitespace compare as one space, and a
`file.py:12: ` location matches any location (a pasted example runs from another file).
Other fences (```bash, ```text on their own, unlabelled ones) are not run.

    python tests/api/test_docs.py README.md     # what each block of a file prints and raises
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fjit

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
TIMEOUT = 300      # per file; they take a few seconds each

FENCE = re.compile(r"^```(\w*)\s*$")
RAISES = re.compile(r"#\s*raises\s+(FJ\d{3})\b")
PRINTS = re.compile(r"#\s*prints\s+(.*\S)\s*$")
LABEL = re.compile(r".*:(\*\*)?\s*$")               # `**Error:**`, `It prints:`
LOCATION = re.compile(r"(?<!\S)[\w./<>-]+\.\w+:\d+: ")   # `path/file.py:12: `


@dataclasses.dataclass
class Block:
    line: int                   # the line of the block's first code line in its file
    code: str
    raises: str | None          # the error code its first line says it raises
    prints: list[str]           # what its `# prints` comments say it prints
    expected: str | None = None  # the ```text block that shows its output


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, each with what the text says it prints or raises."""
    lines = text.splitlines()
    blocks: list[Block] = []
    previous_python_end = None      # the closing fence of the last fence, if it closed a python block
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        code = "\n".join(lines[i + 1:end]) + "\n"
        lang = fence.group(1)
        if lang == "python":
            first = code.lstrip().splitlines()[0] if code.strip() else ""
            raises = RAISES.match(first)
            blocks.append(Block(i + 2, code, raises and raises.group(1),
                                [m.group(1) for m in map(PRINTS.search, code.splitlines()) if m]))
        elif lang == "text" and previous_python_end is not None:
            between = [x for x in lines[previous_python_end + 1:i] if x.strip()]
            if len(between) <= 1 and all(LABEL.fullmatch(x) for x in between):
                blocks[-1].expected = code
        previous_python_end = end if lang == "python" else None
        i = end + 1
    return blocks


def run_file(path: Path) -> list[dict]:
    """Run the python blocks of `path` in order in one namespace, a module of the file (so its
    functions and classes are user code located at the file's lines): what each printed, and the
    error it raised (type, fjit code, message) or None."""
    module = types.ModuleType("doc_example")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    results = []
    try:
        for block in python_blocks(path.read_text()):
            out, error = io.StringIO(), None
            code = compile("\n" * (block.line - 1) + block.code, str(path), "exec")
            try:
                with contextlib.redirect_stdout(out):
                    exec(code, module.__dict__)
            except Exception as e:  # noqa: BLE001  (whatever a block raises is its result)
                error = {"type": type(e).__name__, "message": str(e),
                         "code": e.code if isinstance(e, fjit.FjitError) else None}
            results.append({"line": block.line, "stdout": out.getvalue(), "error": error})
    finally:
        del sys.modules[module.__name__]
    return results


def contains(output: str, expected: str) -> bool:
    """Whether `expected` appears in `output`: `...` stands for anything, whitespace runs compare
    as one space, locations as none."""
    text = " ".join(LOCATION.sub("", output).split())
    at = 0
    for piece in LOCATION.sub("", expected).split("..."):
        piece = " ".join(piece.split())
        found = text.find(piece, at)
        if found < 0:
            return False
        at = found + len(piece)
    return True


def problems(block: Block, result: dict) -> list[str]:
    """What a block did that its text does not say, one line each."""
    where, error, stdout = f"line {block.line}", result["error"], result["stdout"]
    found = []
    if block.raises is None and error is not None:
        found.append(f"{where}: raised {error['type']}: {error['message']}")
    elif block.raises is not None and error is None:
        found.append(f"{where}: says it raises {block.raises} but ran without an error")
    elif block.raises is not None and error["code"] != block.raises:
        found.append(f"{where}: says it raises {block.raises}, raised {error['type']}: "
                     f"{error['message']}")
    if block.prints and not contains(stdout, " ... ".join(block.prints)):
        found.append(f"{where}: its comments say it prints {block.prints}; it printed:\n{stdout}")
    if block.expected is not None:
        output = stdout + (f"{error['type']}: {error['message']}" if error else "")
        if not contains(output, block.expected):
            found.append(f"{where}: the text after it shows\n{block.expected}but it gave\n{output}")
    return found


# ----------------------------------------------------------------------------- the docs

def _with_examples(docs):
    return [d.relative_to(ROOT).as_posix() for d in docs if python_blocks(d.read_text())]


@pytest.mark.parametrize("doc", _with_examples(DOCS))
def test_the_examples_run_as_written(doc, tmp_path):
    blocks = python_blocks((ROOT / doc).read_text())
    results = tmp_path / "results.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TRITON_INTERPRET", None)       # the tests' setting (conftest.py), not a user's
    run = subprocess.run([sys.executable, __file__, doc, str(results)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr[-5000:]
    found = [p for block, result in zip(blocks, json.loads(results.read_text()), strict=True)
             for p in problems(block, result)]
    assert not found, f"{doc}:\n" + "\n".join(found)


def test_the_docs_with_examples_are_the_ones_expected():
    """A doc whose examples stopped being found (a fence renamed) would pass without running."""
    assert _with_examples(DOCS) == ["README.md", "docs/backend.md", "docs/sharp_edges.md"]
    sharp = (ROOT / "docs" / "sharp_edges.md").read_text()
    blocks = python_blocks(sharp)
    assert sum(b.raises is not None for b in blocks) == sharp.count("**Bad:**") >= 34
    assert all(b.expected is not None for b in blocks if b.raises is not None)


def test_the_readme_lists_every_environment_variable():
    documented = set(re.findall(r"^\| (FJIT_\w+) \|", fjit.config.__doc__, re.M))
    listed = set(re.findall(r"^\| `(FJIT_\w+)` \|", (ROOT / "README.md").read_text(), re.M))
    assert documented and listed == documented


# ----------------------------------------------------------------------------- the runner itself

RUNNER_CHECK = '''\
Prose.

```python
import torch, fjit
x = torch.ones(2)
print(fjit.jit(lambda t: t * 2)(x).sum().item())   # prints 4.0
print(3)                                            # prints 5
```

```bash
exit 1
```

```python
# raises FJ104
def logs(t):
    print(t.shape)
    return t

fjit.jit(logs)(x)
```

**Error:**

```text
example.py:3: FJ104 side effect: print() in 'logs' runs once, ...
```

```python
# raises FJ104
y = x + 1
```

```python
undefined_name
```

```python
print("something else")
```

```text
what the text promised
```
'''


def test_the_runner_reports_what_the_text_does_not_say(tmp_path):
    doc = tmp_path / "example.md"
    doc.write_text(RUNNER_CHECK)
    blocks = python_blocks(RUNNER_CHECK)
    assert [b.line for b in blocks] == [4, 15, 30, 35, 39]       # the bash block is not run
    assert [b.raises for b in blocks] == [None, "FJ104", "FJ104", None, None]
    assert blocks[0].prints == ["4.0", "5"]
    assert blocks[1].expected.startswith("example.py:3: FJ104")
    results = run_file(doc)
    assert results[1]["error"]["code"] == "FJ104"
    # located at the doc's line (the path is shortened relative to the working directory)
    assert "example.md:17: FJ104" in results[1]["error"]["message"]
    found = [p for b, r in zip(blocks, results) for p in problems(b, r)]
    assert [p.split(":")[0] for p in found] == ["line 4", "line 30", "line 35", "line 39"]
    assert "prints ['4.0', '5']" in found[0]
    assert "ran without an error" in found[1]
    assert "NameError" in found[2]
    assert "what the text promised" in found[3]


def test_expected_text_matches_as_the_docs_mean_it():
    out = "UnsupportedInputError: a/b.md:12: FJ201 unsupported input: argument of type\n  m.Params x"
    assert contains(out, "UnsupportedInputError: FJ201 unsupported input: ... Params ...")
    assert contains(out, "x.py:3: FJ201    unsupported input")
    assert not contains(out, "Params ... FJ201")           # in order
    assert not contains(out, "FJ202")


if __name__ == "__main__":
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps(run_file(ROOT / sys.argv[1])))
    else:
        for r in run_file(Path(sys.argv[1]).resolve()):
            print(f"--- line {r['line']}: {r['error'] or 'no error'}\n{r['stdout']}", end="")
