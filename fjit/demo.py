"""`python -m fjit.demo`: compile an example, print its final trace, and time it against eager."""
from __future__ import annotations

import time

import torch

import fjit
from fjit.executors.c import executor as c_executor


def gelu_layer(x, w, b, scale: float):
    """A small MLP block: linear, tanh-GELU, residual, RMS norm."""
    h = torch.nn.functional.linear(x, w, b)
    h = torch.nn.functional.gelu(h, approximate="tanh") * scale
    y = x + h
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)


def _median_us(fns, args, repeat=15, number=200) -> list[float]:
    """Median time per call of each function, sampled in alternation so drift hits all alike."""
    samples = [[] for _ in fns]
    for _ in range(repeat):
        for fn, out in zip(fns, samples):
            t0 = time.perf_counter()
            for _ in range(number):
                fn(*args)
            out.append((time.perf_counter() - t0) / number * 1e6)
    return [sorted(s)[len(s) // 2] for s in samples]


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    jitted = fjit.jit(gelu_layer)
    print(f"fjit demo on {device}\n")
    # torch's Python meta kernels import torch._dynamo the first time one runs in a process (the
    # same for torch.compile); paid here, and reported, so the first-call figure is fjit's own
    t0 = time.perf_counter()
    torch.sin(torch.empty(1, device="meta"))
    print(f"torch's one-time import for its meta kernels: {(time.perf_counter() - t0) * 1e3:.0f} ms\n")
    for n in (4, 1024):
        x = torch.randn(n, 256, device=device)
        w = torch.randn(256, 256, device=device) / 16
        b = torch.randn(256, device=device)
        args = (x, w, b, 0.5)
        t0 = time.perf_counter()
        out = jitted(*args)
        cold_ms = (time.perf_counter() - t0) * 1e3
        torch.testing.assert_close(out, gelu_layer(*args))
        # CPU: small regions become C kernels, compiled in the background while torch calls run;
        # time the steady state, once they are loaded
        t0 = time.perf_counter()
        c_executor.wait()
        build_ms = (time.perf_counter() - t0) * 1e3
        torch.testing.assert_close(jitted(*args), gelu_layer(*args))
        jitted(x, w, b, 0.75)   # a new float does not recompile
        if n == 4:
            print(fjit.last_traces(jitted)[-1])
        eager_us, fjit_us = _median_us((gelu_layer, jitted), args)
        print(f"[{n}, 256]: first call (trace + compile) {cold_ms:.1f} ms; C kernels ready "
              f"{build_ms:.0f} ms later; cached call {fjit_us:.1f} us vs eager {eager_us:.1f} us "
              f"({fjit_us / eager_us:.2f}x)")
    print(f"\n{fjit.cache_info(jitted)}")


if __name__ == "__main__":
    main()
