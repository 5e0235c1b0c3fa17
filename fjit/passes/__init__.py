"""Trace -> Trace passes: the cleanup and the final program's buffer reuse (basic.py), the
rewrites that put prims in a kernel's shape before fusion (regroup.py), fusion partitioning
(fusion.py), the GEMM library choice of the last stage (gemms.py), the real layouts a program is
observed with and made to hold (layouts.py), and the structural verifier (verify.py).  Nothing
here imports the frontend or an executor."""
