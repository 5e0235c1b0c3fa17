"""Strictness: finding the sharp edges, the places where a compiled program could silently differ
from the Python function it was traced from (the FJ1xx codes).

Apart from tracing, and beneath it: nothing here imports `fjit.frontend`.  The tracer
(frontend/tracer.py) calls in: `bindings` scans what the function reads from outside before the
run; `observer` watches the run (calls from user code, and a before/after comparison of what the
function reaches, `reach`, with the lines found by `bytecode_lines`).  `locate` says which code is
the user's and at which line a sharp edge is reported; `jitted_callable` reads where the jitted
callable's Python code is; `hints` (generated) holds each catalog entry's one-line fix, which `fjit.errors` prints.
"""
