"""The decompositions of torch-level ops into prims: importing this package registers every one
with the dispatcher (frontend/record.py's DECOMPOSITIONS and REPLACEMENTS); an op without one is
traced as a torch fallback.  The prims themselves are core/prims/'s."""
from __future__ import annotations

from fjit.frontend.torch_calls import qualified_name
from fjit.frontend.record import DECOMPOSITIONS
from fjit.decompositions import attention, math_ops, nn_ops, shape_ops  # noqa: F401  (they register decompositions)


def claimed_ops() -> set[str]:
    """Qualified names of the torch-level ops fjit decomposes into prims."""
    return {qualified_name(f) for f in DECOMPOSITIONS}
