"""`python -m fjit.executors`: print the coverage table of the prims over the kernel languages the
executors register (core/prims/coverage.py; core itself knows no language)."""
from fjit.core.prims.coverage import table

print(table())
