"""`python -m fjit.core.prims`: print the coverage table of the prims."""
from fjit.core.prims.coverage import table

print(table())
