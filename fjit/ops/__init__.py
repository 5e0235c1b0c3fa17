"""Prims and the torch-level ops fjit decomposes into them.  Importing this package registers every
decomposition with the dispatcher; anything not registered is traced as a torch fallback."""
from __future__ import annotations

from fjit.frontend.torch_calls import qualified_name
from fjit.frontend.record import DECOMPOSITIONS
from fjit.ops import attention, math_ops, nn_ops, shape_ops  # noqa: F401  (they register decompositions)
from fjit.runtime import fjit_ops, prims

# The names printed traces refer to besides torch and operator.
TRACE_NAMESPACE = {"prims": prims, "fjit_ops": fjit_ops}


def claimed_ops() -> set[str]:
    """Qualified names of the torch-level ops fjit decomposes into prims."""
    return {qualified_name(f) for f in DECOMPOSITIONS}
