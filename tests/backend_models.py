"""Small models for the torch.compile backend's tests (tests/backend/test_backend.py) and benchmark
(benchmarks/bench_backend.py): an MLP, a transformer block and a conv net with BatchNorm, each with
a factory of example inputs."""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d_in=16, d_hidden=32, d_out=8):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.fc3 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        x = F.gelu(self.fc1(x))
        x = torch.tanh(self.fc2(x)) + x
        return self.fc3(x)


class TransformerBlock(nn.Module):
    """Pre-norm block: causal self-attention written out (matmul, mask, softmax), GELU MLP,
    residuals."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q = q.view(b, t, h, d // h).transpose(1, 2)
        k = k.view(b, t, h, d // h).transpose(1, 2)
        v = v.view(b, t, h, d // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class ConvNet(nn.Module):
    def __init__(self, c=4, classes=5):
        super().__init__()
        self.conv1 = nn.Conv2d(3, c, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x))) + x
        return self.head(x.mean(dim=(2, 3)))


def example_input(name: str, batch: int = 4, generator=None) -> torch.Tensor:
    if name == "mlp":
        return torch.randn(batch, 16, generator=generator)
    if name == "transformer":
        return torch.randn(batch, 8, 16, generator=generator)
    if name == "convnet":
        return torch.randn(batch, 3, 8, 8, generator=generator)
    raise ValueError(name)


MODELS = {"mlp": MLP, "transformer": TransformerBlock, "convnet": ConvNet}


def make_model(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()
