"""Custom autograd.Functions taken from real models, shared by the tests that trace them."""
from __future__ import annotations

import torch


class TanhGelu(torch.autograd.Function):
    """BLOOM's GeLUFunction: saves its input, and its backward unpacks ctx.saved_tensors whole.
    Dynamo hands it to the backend as torch.ops.higher_order.autograd_function_apply."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
        return g * (0.5 * x * ((1 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1 + t))
