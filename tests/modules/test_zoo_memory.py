"""The zoo runner's memory column (benchmarks/zoo.py --memory): `saved_bytes` counts the storages
saved for the backward, once each, without the parameters, whoever saves them (eager autograd or an
autograd.Function's ctx.save_for_backward, as fjit's joint program and Inductor's graphs do)."""
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.zoo import saved_bytes  # noqa: E402


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def test_eager_mlp_saves_its_activations_once_and_no_parameters():
    model, x = _mlp(), torch.randn(2, 8)

    def step():
        model(x).pow(2).sum().backward()
    # The first linear saves its input x (2x8 floats: its weight's gradient needs it; the weight
    # itself is a parameter); the ReLU its output (2x16), which the second linear saves again as
    # its input, one storage; pow its input (2x4).  The second weight (16x4), saved for x's
    # gradient path through the ReLU, is a parameter.
    assert saved_bytes(step, model.parameters()) == 4 * (2 * 8 + 2 * 16 + 2 * 4)
    assert saved_bytes(step) == 4 * (2 * 8 + 2 * 16 + 2 * 4 + 16 * 4)


class _SavesAView(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x[:1], x[1:])     # two views of one storage
        return x * 2

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_save_for_backward_counts_each_storage_once_at_its_size():
    x = torch.randn(4, 8, requires_grad=True)
    assert saved_bytes(lambda: _SavesAView.apply(x).sum().backward()) == 4 * 4 * 8
    assert saved_bytes(lambda: _SavesAView.apply(x).sum().backward(), [x]) == 0
