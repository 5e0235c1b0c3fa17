"""The functions of the GPU suite and their cases: inputs at full and smoke sizes, the minimal
memory traffic of each (bytes read + written), tolerances against eager.

Importing this module defines a Triton kernel: under ``--smoke`` TRITON_INTERPRET=1 must be set
before (bench_gpu.py does so).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

BF16, F32 = torch.bfloat16, torch.float32

# --------------------------------------------------------------------------------------------
# the functions


def gelu_tanh_chain(x):
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


def add_rmsnorm(x, residual, weight):
    h = x + residual
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-6)
    return y.to(x.dtype) * weight, h


def layernorm(x, weight, bias):
    return F.layer_norm(x, (x.shape[-1],), weight, bias, 1e-5)


def softmax(x):
    return torch.softmax(x, dim=-1)


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def swiglu(a, b):
    return F.silu(a) * b


def rope(q, cos, sin):
    half = q.shape[-1] // 2
    rotated = torch.cat((-q[..., half:], q[..., :half]), dim=-1)
    return q * cos + rotated * sin


def matmul_bias_gelu(x, w, b):
    return F.gelu(x @ w + b, approximate="tanh")


def sum_of_squares(x):
    return (x * x).sum()


def transposed_input(xt, y):
    return torch.sigmoid(xt) * y + 1.0


def sort_between(x):
    a = torch.sin(x) * 2.0 + 1.0
    s, _ = torch.sort(a, dim=-1)
    return torch.exp(s[:, 1:] - s[:, :-1]).sum(-1)


def tiny_add(x, y):
    return x + y


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def raw_triton_add(x, y):
    """The floor for a one-kernel call: allocate the output, launch a hand-written kernel."""
    out = torch.empty_like(x)
    n = x.numel()
    _add_kernel[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out


# --------------------------------------------------------------------------------------------
# the cases: inputs at full and smoke sizes, minimal traffic, tolerance


def nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    make: Callable  # (dims, rand) -> args
    full: dict
    smoke: dict
    bytes_formula: str | None = None          # None: not memory-bound, no bandwidth figure
    traffic: Callable | None = None           # (args) -> minimal bytes read + written
    flops: Callable | None = None             # (args) -> flops, for compute-bound cases
    tol: tuple = (2e-2, 2e-2)                 # (rtol, atol) against eager
    timer: str = "events"                     # "events" (device time) or "host" (call overhead)

    def shape(self, smoke: bool) -> str:
        return " ".join(f"{k}={v}" for k, v in (self.smoke if smoke else self.full).items())


def rms_args(d, r):
    return r(d["M"], d["N"]), r(d["M"], d["N"]), r(d["N"])


def _ln_args(d, r):
    return r(d["M"], d["N"]), r(d["N"]), r(d["N"])


def _ce_args(d, r):
    return r(d["M"], d["N"]), torch.randint(0, d["N"], (d["M"],), device=r.device,
                                            generator=r.generator)


def _rope_args(d, r):
    return r(d["B"], d["H"], d["S"], d["D"]), r(d["S"], d["D"]), r(d["S"], d["D"])


def _transposed_args(d, r):
    return r(d["N"], d["M"]).t(), r(d["M"], d["N"])  # first input: strides (1, M)


CASES = [
    Case("gelu_tanh", gelu_tanh_chain, lambda d, r: (r(d["N"]),), {"N": 64 * 2**20}, {"N": 1000},
         "2 * N (read x, write y; bf16)", lambda a: 2 * nbytes(a[0])),
    Case("add_rmsnorm", add_rmsnorm, rms_args, {"M": 16384, "N": 4096}, {"M": 8, "N": 64},
         "2 * (4*M*N + N) (read x, residual, weight; write y, h; bf16)",
         lambda a: 2 * nbytes(a[0]) + nbytes(a[2]) + 2 * nbytes(a[0])),
    Case("layernorm", layernorm, _ln_args, {"M": 16384, "N": 4096}, {"M": 8, "N": 64},
         "2 * (2*M*N + 2*N) (read x, weight, bias; write y; bf16)",
         lambda a: 2 * nbytes(a[0]) + nbytes(a[1], a[2])),
    Case("softmax", softmax, lambda d, r: (r(d["M"], d["N"]),), {"M": 16384, "N": 4096},
         {"M": 8, "N": 64}, "2 * 2*M*N (read x, write y; bf16)", lambda a: 2 * nbytes(a[0])),
    Case("softmax_wide", softmax, lambda d, r: (r(d["M"], d["N"]),), {"M": 1024, "N": 32768},
         {"M": 2, "N": 256}, "2 * 2*M*N (read x, write y; bf16)", lambda a: 2 * nbytes(a[0])),
    Case("softmax_vocab", softmax, lambda d, r: (r(d["M"], d["N"]),), {"M": 4096, "N": 50257},
         {"M": 2, "N": 300}, "2 * 2*M*N (read x, write y; bf16)", lambda a: 2 * nbytes(a[0])),
    Case("cross_entropy", cross_entropy, _ce_args, {"M": 8192, "N": 32000}, {"M": 8, "N": 100},
         "2*M*N + 8*M + 2 (read bf16 logits, int64 targets; write the bf16 mean)",
         lambda a: nbytes(*a) + a[0].element_size()),
    Case("swiglu", swiglu, lambda d, r: (r(d["M"], d["N"]), r(d["M"], d["N"])),
         {"M": 16384, "N": 11008}, {"M": 8, "N": 96},
         "2 * 3*M*N (read a, b; write y; bf16)", lambda a: 3 * nbytes(a[0])),
    Case("rope", rope, _rope_args, {"B": 4, "H": 32, "S": 2048, "D": 128},
         {"B": 1, "H": 2, "S": 8, "D": 16},
         "2 * (2*B*H*S*D + 2*S*D) (read q, cos, sin; write y; bf16)",
         lambda a: 2 * nbytes(a[0]) + nbytes(a[1], a[2])),
    Case("matmul_bias_gelu", matmul_bias_gelu,
         lambda d, r: (r(d["M"], d["K"]), r(d["K"], d["N"]) / math.sqrt(d["K"]), r(d["N"])),
         {"M": 8192, "K": 4096, "N": 4096}, {"M": 16, "K": 32, "N": 24},
         flops=lambda a: 2 * a[0].shape[0] * a[0].shape[1] * a[1].shape[1]),
    Case("sum_of_squares", sum_of_squares, lambda d, r: (r(d["N"], dtype=F32),),
         {"N": 64 * 2**20}, {"N": 1000}, "4 * N + 4 (read float32 x, write the sum)",
         lambda a: nbytes(a[0]) + 4, tol=(1e-3, 1e-3)),
    Case("transposed_input", transposed_input, _transposed_args, {"M": 8192, "N": 8192},
         {"M": 24, "N": 40}, "2 * 3*M*N (read x^T through its strides, y; write out; bf16)",
         lambda a: 3 * nbytes(a[0])),
    Case("sort_between", sort_between, lambda d, r: (r(d["M"], d["N"], dtype=F32),),
         {"M": 4096, "N": 4096}, {"M": 8, "N": 32}, tol=(1e-4, 1e-4)),
    Case("tiny_add", tiny_add, lambda d, r: (r(d["N"], dtype=F32), r(d["N"], dtype=F32)),
         {"N": 1024}, {"N": 1024}, tol=(0, 0), timer="host"),
]
COPY = {"full": 256 * 2**20, "smoke": 4096}   # elements of the bf16 copy reference


class Rand:
    """Seeded normal tensors on one device; bf16 unless told."""

    def __init__(self, device: str, seed: int = 0):
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __call__(self, *shape, dtype=BF16):
        return torch.randn(*shape, device=self.device, generator=self.generator).to(dtype)


# The cold-call function: compiled by nobody before it is measured.
COLD_SOURCE = """
def {name}(x, residual, weight, bias):
    h = x + residual
    y = F.layer_norm(h, (h.shape[-1],), weight, bias, 1e-5)
    g = 0.5 * y * (1.0 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y * y * y)))
    return g * torch.sigmoid(h), h
"""
