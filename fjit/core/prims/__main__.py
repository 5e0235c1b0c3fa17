"""`python -m fjit.core.prims`: print the coverage table of the prims (importing fjit first, so
that every executor's kernel language is registered)."""
import fjit  # noqa: F401
from fjit.core.prims.coverage import table

print(table())
