"""fjit benchmarks: run ``python benchmarks/bench_cpu.py`` or ``python benchmarks/bench_gpu.py``."""
