"""What the joint program saves for its backward (fjit/autodiff/remat.py's minimum cut): fewer bytes
than eager saves on the blocks of real models, and eager's gradients.

The bytes are counted as the zoo runner counts them (benchmarks/zoo.py `saved_bytes`: the distinct
storages saved for the backward, the parameters left out), for eager and for the compiled module
on the same inputs.
"""
import copy
import sys
from pathlib import Path

import pytest
import torch

import fjit
from fjit.autodiff.remat import recomputed
from fjit.core.ir import TensorVar

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.zoo import saved_bytes  # noqa: E402


def _var(name: str, n: int) -> TensorVar:
    return TensorVar(name, (n,), torch.float32, torch.device("cpu"), (1,), False)


@pytest.mark.parametrize("held", [True, False])
def test_the_cut_saves_the_fewest_bytes_from_which_the_reads_are_recomputed(held):
    """a (not recomputable, 10000 elements) -> b = f(a) (100) -> c = g(b), d = h(b) (100 each);
    the backward reads c and d.  Saving b (400 bytes) recomputes c and d, where saving them costs
    800 and saving a 40000; where a is held anyway (an input), saving it costs nothing and b, c
    and d are recomputed from it."""
    values = {"a": _var("a", 10000), "b": _var("b", 100), "c": _var("c", 100), "d": _var("d", 100)}
    made_from = {"b": ("a",), "c": ("b",), "d": ("b",)}

    def operands(name):
        return tuple(values[u] for u in made_from[name]) if name in made_from else None
    again = recomputed([values["c"], values["d"]], operands, lambda name: held and name == "a",
                       lambda name: False)
    assert again == ({"b", "c", "d"} if held else {"c", "d"})


def test_of_cuts_as_cheap_the_one_that_recomputes_least_is_taken():
    """c = g(b), b = f(a), all of 100 elements, the backward reading c: saving a, b or c costs the
    same, and c is saved (nothing is computed again)."""
    values = {n: _var(n, 100) for n in "abc"}
    made_from = {"b": ("a",), "c": ("b",)}
    again = recomputed([values["c"]], lambda n: tuple(values[u] for u in made_from[n]) if n in made_from else None,
                       lambda name: False, lambda name: False)
    assert again == frozenset()


def test_small_means_small_next_to_the_values_computed_from_it():
    """A value of at most 1/32 of the widest value computed from it is saved, not computed again
    (a layer norm's row statistics t = f(s), broadcast along rows of 64): saved beside s though
    made from it.  A value as wide as what is computed from it is computed again, however small
    next to the rest of the program (the logits, a wide held value; a hierarchical model's late
    stages): c = g(b), b = f(x) from the input x, and d = h(y), 2 elements, from the input y."""
    values = {"x": _var("x", 100), "b": _var("b", 100), "c": _var("c", 100), "s": _var("s", 2),
              "t": _var("t", 2), "rows": _var("rows", 64), "logits": _var("logits", 1_000_000),
              "y": _var("y", 2), "d": _var("d", 2)}
    made_from = {"b": ("x",), "c": ("b",), "t": ("s",), "rows": ("t", "x"), "d": ("y",)}

    def operands(name):
        return tuple(values[u] for u in made_from[name]) if name in made_from else None
    again = recomputed([values["c"], values["rows"], values["s"], values["logits"], values["d"]],
                       operands, lambda name: name in ("x", "logits", "y"), lambda name: False)
    assert again == {"b", "c", "rows", "d"}


def test_a_checkpointed_value_is_never_saved():
    values = {n: _var(n, 100) for n in "abc"}
    made_from = {"b": ("a",), "c": ("b",)}
    again = recomputed([values["c"]], lambda n: tuple(values[u] for u in made_from[n]) if n in made_from else None,
                       lambda name: False, lambda name: name in ("b", "c"))
    assert again == {"b", "c"}


class _ConvBlock(torch.nn.Module):
    """Conv-BatchNorm-ReLU twice with a residual add, as ResNet's basic block."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + x)


class _TransformerBlock(torch.nn.Module):
    """A pre-norm transformer block: layer norm, attention by matmuls and softmax, a GELU MLP."""

    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.fc1, self.fc2 = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attention = torch.softmax(q @ k.transpose(-1, -2) * (c // self.heads) ** -0.5, -1) @ v
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


def _stacked(block, n):
    return torch.nn.Sequential(*(block() for _ in range(n)))


@pytest.mark.parametrize("name, model, shape, at_most", [
    ("conv_bn_relu", lambda: _stacked(_ConvBlock, 3), (4, 8, 16, 16), 0.75),
    ("transformer", lambda: _stacked(_TransformerBlock, 2), (4, 16, 32), 0.9),
])
def test_saved_bytes_are_below_eagers_with_eagers_gradients(name, model, shape, at_most, monkeypatch):
    """A CNN's ReLU(BatchNorm(conv)) is computed again in the backward from the convolution's
    output and the batch statistics (eager saves both that output and the ReLU's); a transformer
    block's layer norm outputs and GELU's output, which enter matmuls, from their inputs.  The
    compiled training step saves at most `at_most` of eager's bytes; its gradients are eager's."""
    monkeypatch.setenv("FJIT_MEASURE", "0")     # the joint program, whatever a measurement says
    torch.manual_seed(0)
    eager = model()
    compiled = copy.deepcopy(eager)
    jitted = fjit.jit(compiled)
    x = torch.randn(*shape)

    def step(m, run):
        def go():
            m.zero_grad()
            run(x).square().mean().backward()
        return go
    step(compiled, jitted)()                    # compiled and measured
    ours = saved_bytes(step(compiled, jitted), compiled.parameters())
    theirs = saved_bytes(step(eager, eager), eager.parameters())
    assert ours <= at_most * theirs, (ours, theirs)
    for p, q in zip(compiled.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    assert "torch autograd" not in fjit.last_backward_traces(jitted)[-1].stage
