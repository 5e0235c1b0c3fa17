"""The sharp-edges catalog: one runnable module per sharp edge fjit detects (FJ1xx), per input or
operation it rejects (FJ2xx), and per construct that a tracing JIT might be expected to break but
fjit compiles faithfully (OK_*).  It lives at the repository's top level and ships with fjit as the
package ``fjit.sharp_edges_catalog`` (pyproject.toml maps it), so the file every error names is
installed.

Each module defines CODE, ERROR, TITLE, FIX, EXPECTED, bad(), good() and inputs(); run one with
``python -m fjit.sharp_edges_catalog.FJ101_global_tensor`` (from a checkout without fjit
installed: ``python -m sharp_edges_catalog.FJ101_global_tensor``).  ``tools/gen_sharp_edges.py`` turns the
catalog into docs/sharp_edges.md and fjit/hints.py, and tests/strictness/test_catalog.py runs it as tests.
"""
