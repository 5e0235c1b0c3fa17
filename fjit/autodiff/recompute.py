"""What the joint program's backward recomputes rather than saves: `recomputable` says of the op
that made a forward value whether running it again in the backward is cheap (views, and arithmetic
pointwise prims of RECOMPUTE_FROM elements or more; never the COSTLY ones, whose blocks' kernel
forms call a library or vector-math function).
joint.py's `_Backward.value` asks it for each forward value a rule reads, and saves what it refuses.
"""
from __future__ import annotations

from fjit.core.ir import BoundSymbol, Tag, TensorVar
from fjit.core.prims import ROWS, Kind, Prim, prim_of
from fjit.core.prims.layout import reshape_copies
from fjit.core.symbolic import known

# A computed value of fewer elements than this is saved by the forward rather than recomputed in
# the backward, a view excepted.  Recomputing saves memory traffic, which on small values is
# nothing next to the op a recomputation adds wherever it does not fuse into a backward kernel
# (a transformer's step with batch 2 and width 64: backward 1.30x eager's recomputing, 0.98x
# saving).
RECOMPUTE_FROM = 1 << 16
# Prims saved at any size: recomputed, each would be a library or vector-math call per element
# again (their blocks' kernel forms say so, or their block says otherwise: erf is recomputed).
COSTLY = frozenset(p for p, b in ROWS.items() if b.costly)


def recomputable(b: BoundSymbol | None) -> bool:
    """Cheap to run again in the backward: view prims, and arithmetic pointwise ones, factories, a
    reshape that copies and the prims whose block says so (a contiguous copy) of RECOMPUTE_FROM
    elements or more (random ones are draws)."""
    p = prim_of(b) if b is not None else None
    if p is None or p in COSTLY or b.sym.has(Tag.RANDOM):
        return False
    copy = p is Prim.RESHAPE and reshape_copies(b.args[0], b.args[1])
    if b.sym.has(Tag.SHAPE) and not copy:
        return True
    # of symbolic sizes: recomputed where that holds at every size (either choice is right; a
    # guard would split the program by size class)
    block = ROWS[p]
    return (b.sym.has(Tag.ELEMENTWISE) or copy or block.kind is Kind.FACTORY or block.recompute) and \
        all(known(v.numel() >= RECOMPUTE_FROM) for v in b.outputs() if isinstance(v, TensorVar))
