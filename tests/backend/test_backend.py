"""The torch.compile backend (fjit/dynamo): torch.compile(model, backend="fjit") against eager.

Every test starts and ends with torch._dynamo.reset(), and most use a backend of their own
(fjit.dynamo.make_backend()) so their subgraph infos are theirs.
"""
from __future__ import annotations

import copy
import math
import importlib.metadata
import tomllib
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo

import fjit

import fjit.dynamo
from backend_models import example_input, make_model
from custom_functions import TanhGelu
from fjit.dynamo.aten import ATEN_TO_TORCH
from fjit.executors.c import executor as c_executor

aten = torch.ops.aten
REPO = Path(__file__).resolve().parents[2]
needs_cc = pytest.mark.skipif(c_executor.compiler() is None, reason="no C compiler on PATH")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def be():
    return fjit.dynamo.make_backend()


def _ensure_registered():
    """backend="fjit" resolves through the installed entry point; a checkout whose installed
    metadata predates it registers the same object by hand."""
    if "fjit" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(fjit.backend, "fjit")


# ------------------------------------------------------------------------------------------------
# Registration and the public object

def test_entry_point_names_fjit_backend():
    with open(REPO / "pyproject.toml", "rb") as f:
        declared = tomllib.load(f)["project"]["entry-points"]["torch_dynamo_backends"]
    assert declared == {"fjit": "fjit.dynamo:backend"}
    ep = importlib.metadata.EntryPoint(name="fjit", value="fjit.dynamo:backend",
                                       group="torch_dynamo_backends")
    assert ep.load() is fjit.backend is fjit.dynamo.backend


def test_backend_by_name(capsys):
    _ensure_registered()
    assert torch._dynamo.lookup_backend("fjit") is fjit.backend
    fjit.backend.clear()

    def f(x, y):
        return torch.sin(x) * y + 1

    x, y = torch.randn(4), torch.randn(4)
    torch.testing.assert_close(torch.compile(f, backend="fjit")(x, y), f(x, y))
    assert [i.executor for i in fjit.backend.subgraph_infos] == ["fjit"]
    fjit.backend.clear()


def test_importing_fjit_leaves_dynamo_alone():
    code = ("import sys, torch, fjit\n"
            "assert 'torch._dynamo' not in sys.modules, 'fjit imported torch._dynamo'\n"
            "b = fjit.backend\n"
            "assert 'torch._dynamo' not in sys.modules, 'fjit.backend imported torch._dynamo'\n"
            "assert b is fjit.backend\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_options():
    b = fjit.backend.with_options(executors=("torch",))
    assert b is not fjit.backend and b.executors[0] == "torch"
    assert b.with_options(split_executor="inductor").executors == b.executors
    with pytest.raises(ValueError, match="'triton', 'c', 'torch'"):
        fjit.dynamo.make_backend(executors=("cuda",))
    with pytest.raises(ValueError, match="'torch', 'inductor'"):
        fjit.dynamo.make_backend(split_executor="tvm")

    def f(x):
        return torch.tanh(x) * 2 + x

    x = torch.randn(8)
    torch.testing.assert_close(torch.compile(f, backend=b)(x), f(x))
    (info,) = b.subgraph_infos
    assert info.executor == "fjit" and info.kernels == 0


# ------------------------------------------------------------------------------------------------
# Models: outputs and gradients over optimizer steps, from identical initial states

def _train_and_compare(name, backend, steps=3):
    model = make_model(name)
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    shape = copy.deepcopy(ref)(example_input(name)).shape   # a copy: BatchNorm counts calls
    for _ in range(steps):
        x = example_input(name, generator=gen)
        target = torch.randn(shape, generator=gen)
        for m, o, fn in ((model, opt, compiled), (ref, ref_opt, ref)):
            o.zero_grad()
            out = fn(x)
            torch.nn.functional.mse_loss(out, target).backward()
            m._last_out = out.detach()
        torch.testing.assert_close(model._last_out, ref._last_out)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, msg=lambda m: f"grad of {n}: {m}")
        opt.step()
        ref_opt.step()
    for a, b in zip(model.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b)
    return model, ref, compiled


@pytest.mark.parametrize("route", ["fjit", "aot"])
@pytest.mark.parametrize("name", ["mlp", "transformer", "convnet"])
def test_training_and_eval_match_eager(be, name, route):
    """Both autograd routes: fjit's compiled backward on the torch-level graph (the default), and
    AOTAutograd's aten forward and backward graphs, each compiled by fjit."""
    be = be.with_options(autograd=route)
    model, ref, compiled = _train_and_compare(name, be)
    infos = list(be.subgraph_infos)
    if route == "aot":
        assert {i.stage for i in infos} == {"forward", "backward"}
        assert all(i.executor == "fjit" for i in infos), be.explain()
        assert all(i.kernels >= 1 for i in infos) or c_executor.compiler() is None, be.explain()
    else:
        assert {i.stage for i in infos} == {"train"}
        fjit_pieces = [i for i in infos if i.executor == "fjit"]
        assert fjit_pieces, be.explain()
        # what writes module state in place (batch norm's running statistics and its counter's
        # add_) is split out to torch, each piece with its reason
        torch_pieces = [i for i in infos if i.executor != "fjit"]
        assert all(i.reason is not None for i in torch_pieces), be.explain()
        assert all("batch_norm" in i.reason.op or "add_" in i.reason.op for i in torch_pieces), \
            be.explain()
        assert any(i.kernels >= 1 for i in fjit_pieces) or c_executor.compiler() is None, be.explain()
    model.eval()
    ref.eval()
    x = example_input(name, batch=3)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), ref(x))
    assert any(i.stage == "inference" for i in be.subgraph_infos)
    torch.testing.assert_close(compiled(x), ref(x))        # eval mode with grad: AOT again


def test_batchnorm_training_without_grad_updates_running_stats(be):
    """Inference route (no grad) in training mode: BatchNorm writes its running statistics into
    its inputs, which fjit cannot express, so those nodes run as torch calls, with reasons."""
    model = make_model("convnet")
    ref = copy.deepcopy(model)
    compiled = torch.compile(model, backend=be)
    x = example_input("convnet")
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled(x), ref(x))
    for (n, a), b in zip(model.state_dict().items(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, msg=lambda m: f"{n}: {m}")
    whys = [i.reason.why for i in be.subgraph_infos if i.reason is not None]
    assert any("running statistics" in w for w in whys), be.explain()
    assert any(i.executor == "fjit" for i in be.subgraph_infos)


# ------------------------------------------------------------------------------------------------
# Graph breaks and splits

def test_graph_break_print_and_data_dependent_branch(be, capsys):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x):
            y = torch.relu(self.lin(x)) * 2
            print("between graphs")
            if y.sum() > 1:
                return torch.sigmoid(y) + x
            return torch.tanh(y) - x

    net = Net()
    compiled = torch.compile(net, backend=be)
    with torch.no_grad():
        net.lin.bias.fill_(0.5)
        big = torch.ones(2, 6)
        small = -torch.ones(2, 6)
        net.lin.weight.fill_(0.0)
    for x in (big, small):
        with torch.no_grad():
            net.lin.bias.fill_(0.5 if x is big else -1.0)
        torch.testing.assert_close(compiled(x), net(x))
    assert capsys.readouterr().out.count("between graphs") == 4   # eager's print, every call
    assert len({i.graph for i in be.subgraph_infos}) >= 3          # before, and both branches


@torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
def test_nonzero_is_split_out_with_reason(be):
    def f(x, y):
        a = torch.sin(x) * 2 + y
        idx = torch.nonzero(a > 0)
        return torch.tanh(a) * 3, idx.float() * 2

    compiled = torch.compile(f, backend=be)
    gen = torch.Generator().manual_seed(0)
    counts = set()
    for _ in range(3):
        x, y = torch.randn(6, generator=gen), torch.randn(6, generator=gen)
        got, want = compiled(x, y), f(x, y)
        torch.testing.assert_close(got, want)
        counts.add(want[1].shape[0])
    assert len(counts) > 1          # the nonzero count changed, without a wrong answer
    (split,) = [i for i in be.subgraph_infos if i.reason is not None]
    assert split.executor == "torch"
    assert (split.reason.node, split.reason.op) == ("idx", "torch.nonzero")
    assert "FJ202" in split.reason.why
    assert sum(i.executor == "fjit" for i in be.subgraph_infos) == 2
    text = be.explain()
    assert "split reasons:" in text and "torch.nonzero" in text and "FJ202" in text
    for header in ("node", "op", "why"):
        assert header in text.split("split reasons:")[1].splitlines()[1].split()


def test_indexing_a_split_value_with_tensors_made_later_forms_no_cycle(be):
    """A getitem of a torch piece's result goes with that piece, unless its index is made after
    it: then the pieces would read each other (split_module's "cycle exists between partitions",
    transformers' `mask[batch_idx, kv_idx]` of a mask moved by a torch piece)."""
    def f(x, mean, var):
        y = torch.nn.functional.batch_norm(x, mean, var, training=True)   # a torch piece
        rows = torch.arange(x.shape[0] - 1) + 1                           # made after it
        return y[rows] * 2

    x = torch.randn(4, 3)
    got = torch.compile(f, backend=be)(x, torch.zeros(3), torch.ones(3))
    torch.testing.assert_close(got, f(x, torch.zeros(3), torch.ones(3)))
    (split,) = [i for i in be.subgraph_infos if i.reason is not None]
    assert split.reason.op == "torch.nn.functional.batch_norm" and len(split.nodes) == 1
    (piece,) = [i for i in be.subgraph_infos if i.executor == "fjit"]
    assert "getitem" in piece.nodes


def test_input_mutation_is_split_out(be):
    def f(x):
        y = x * 2
        x.add_(1)
        return y * x

    a, b = torch.randn(5), None
    b = a.clone()
    torch.testing.assert_close(torch.compile(f, backend=be)(a), f(b))
    torch.testing.assert_close(a, b)          # the input was mutated, as in eager
    (split,) = [i for i in be.subgraph_infos if i.reason is not None]
    assert split.reason.op == "Tensor.add_" and "FJ102" in split.reason.why


def test_dynamic_shapes(be):
    def f(x):
        return torch.relu(x) * 3 + x.sum()

    compiled = torch.compile(f, backend=be, dynamic=True)
    for n in (3, 7, 12):
        x = torch.randn(n)
        torch.testing.assert_close(compiled(x), f(x))
    (info,) = be.subgraph_infos
    assert info.executor == "fjit" and info.dynamic


def test_dynamic_sizes_dynamo_passes_as_ints_make_one_symbolic_program(be, caplog):
    """Under dynamic=True Dynamo passes a graph's sizes as int inputs; fjit takes each as the
    first dim of an empty tensor, a dim that varies, so the piece compiles once specialized and
    once with symbolic sizes for every later length (ints in fjit's key would be a program each)."""
    import logging

    def f(x, w):
        h = torch.tanh(x @ w)
        return (h @ h.transpose(-1, -2)).softmax(-1).view(-1, x.shape[1] * x.shape[1]).sum(-1)

    compiled = torch.compile(f, backend=be, dynamic=True)
    w = torch.randn(16, 16)
    with caplog.at_level(logging.DEBUG, logger="fjit.recompiles"):
        for n in (5, 9, 14, 20, 27, 33):
            x = torch.randn(2, n, 16)
            torch.testing.assert_close(compiled(x, w), f(x, w), rtol=1e-4, atol=1e-5)
    compiles = [r.getMessage() for r in caplog.records if " compiled on call " in r.getMessage()]
    assert len(compiles) == 2, compiles
    assert "symbolic program" in compiles[1], compiles


class _Scaled(torch.nn.Module):
    """Float attributes and a float global read in forward: Dynamo under dynamic=True hands such
    floats to the graph as 0-d tensors read back with .item()."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.eps = 1e-5
        self.scale = 0.5

    def forward(self, x):
        h = self.lin(x) * self.scale
        h = h / (h.pow(2).mean(-1, keepdim=True) + self.eps).sqrt()
        return torch.tanh(h * math.pi) + x.size(0)


@pytest.mark.parametrize("grad", [False, True])
def test_dynamic_float_inputs_are_numbers_not_splits(be, grad):
    """Under dynamic=True, a float Dynamo passes as a 0-d tensor and reads with .item() is a
    number input of the fjit program: no FJ106 split, and a new value is used, not baked in."""
    model = _Scaled()
    compiled = torch.compile(model, backend=be, dynamic=True)
    for n, scale in ((3, 0.5), (5, 0.5), (7, 2.0), (9, -1.5)):
        model.scale = scale
        x = torch.randn(n, 8, requires_grad=grad)
        with torch.set_grad_enabled(grad):
            torch.testing.assert_close(compiled(x), model(x))
    assert [i.reason for i in be.subgraph_infos if i.reason is not None] == []
    assert all(i.executor == "fjit" for i in be.subgraph_infos)


class _Settled(torch.nn.Module):
    """A dropout probability Python compares (Dynamo guards its value), a layer norm's eps (a
    constant to the op) and a scale that stays free."""

    def __init__(self):
        super().__init__()
        self.p, self.eps, self.scale = 0.0, 1e-5, 0.5

    def forward(self, x):
        if self.p > 0:
            x = x * (1 - self.p)
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), eps=self.eps) * self.scale


def _float_inputs(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "placeholder"
               and isinstance(n.meta.get("example_value"), torch.Tensor)
               and n.meta["example_value"].dim() == 0 and n.meta["example_value"].is_floating_point())


def test_dynamic_floats_whose_value_is_settled_are_constants_not_inputs(be):
    """A float Dynamo already guards (compared in Python, or given to an op that specializes it)
    is made a constant, as Inductor makes it: no tensor built and read back per call.  A new value
    recompiles and is used; a float still free stays a runtime number (a new value compiles
    nothing)."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(_float_inputs(gm))
        return be(gm, example_inputs)
    model = _Settled()
    compiled = torch.compile(model, backend=counting, dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 8)
        torch.testing.assert_close(compiled(x), model(x))
    # the restarted analysis reaches the backend once more: its graph takes only the free scale
    assert graphs[-1] == 1 and len(graphs) == 2, graphs
    model.scale = -2.0        # free: a runtime number, nothing compiled
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 2, graphs
    for name, value in (("p", 0.25), ("eps", 0.5)):      # settled: guarded, compiled again
        setattr(model, name, value)
        torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) > 2, graphs
    assert [i.reason for i in be.subgraph_infos if i.reason is not None] == []


# ------------------------------------------------------------------------------------------------
# What fjit compiled

@needs_cc
def test_fjit_compiles_fused_c_kernels(be):
    model = make_model("mlp")
    x = example_input("mlp")
    with torch.no_grad():
        compiled = torch.compile(model, backend=be)
        torch.testing.assert_close(compiled(x), model(x))
        torch.testing.assert_close(compiled(x), model(x))
    (info,) = be.subgraph_infos
    assert info.executor == "fjit" and info.stage == "inference" and info.kernels >= 1
    assert "C kernel fjit_c_" in str(info.final_trace)
    assert "fjit" in be.explain()


def test_get_attr_tensors_are_inputs_read_by_reference(be):
    """An FX graph with get_attr parameters (symbolic_trace's form): fjit takes them as inputs,
    so an in-place update of the parameter is seen on the next call."""
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.tanh(torch.nn.functional.linear(x, self.lin.weight, self.lin.bias))

    layer = Layer()
    lin = layer.lin
    gm = torch.fx.symbolic_trace(layer)
    assert sum(n.op == "get_attr" for n in gm.graph.nodes) == 2
    x = torch.randn(2, 4)
    with torch.no_grad():
        fn = be(gm, [x])
        torch.testing.assert_close(fn(x), torch.tanh(lin(x)))
        lin.weight.mul_(2)
        torch.testing.assert_close(fn(x), torch.tanh(lin(x)))
    (info,) = be.subgraph_infos
    assert info.executor == "fjit"


# ------------------------------------------------------------------------------------------------
# The aten table: each row computes what its overload computes

_X = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
_Y = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
_M = _X > 0
_ROW_SAMPLES = [
    (aten.add.Tensor, (_X, _Y), {"alpha": 2}), (aten.rsub.Scalar, (_X, 1.5), {}),
    (aten.rsub.Scalar, (_X, 2.0), {"alpha": 3}), (aten.sum.dim_IntList, (_X, [1], True), {}),
    (aten.sum.dim_IntList, (_X, []), {}), (aten.mean.dim, (_X, [0]), {}),
    (aten.amax.default, (_X, [1]), {}), (aten.amax.default, (_X,), {}),
    (aten.var_mean.correction, (_X, [1]), {"correction": 0, "keepdim": True}),
    (aten.view.default, (_X, [4, 3]), {}), (aten._unsafe_view.default, (_X, [12]), {}),
    (aten.expand.default, (_X[:1], [3, 4]), {}), (aten.squeeze.dims, (_X[None, :, None], [0, 2]), {}),
    (aten.slice.Tensor, (_X, 1, 1, 3), {}), (aten.slice.Tensor, (_X, -1, 0, 9223372036854775807, 2), {}),
    (aten._softmax.default, (_X, 1, False), {}), (aten._log_softmax.default, (_X, 0, False), {}),
    (aten.gelu.default, (_X,), {"approximate": "tanh"}),
    (aten.full.default, ([2, 3], 1.5), {"dtype": torch.float32, "device": torch.device("cpu"),
                                        "pin_memory": False}),
    (aten.scalar_tensor.default, (2.0,), {"dtype": torch.float32}),
    (aten.masked_fill.Scalar, (_X, _M, -1.0), {}), (aten.masked_fill.Scalar, (_X.long(), _M, 2), {}),
    (aten._to_copy.default, (_X,), {"dtype": torch.float64}),
    (aten.addmm.default, (_Y[0, :3], _X, _Y.t()), {}), (aten.where.self, (_M, _X, _Y), {}),
    (aten.split.Tensor, (_X, 2, 1), {}), (aten.clone.default, (_X,), {}),
    (aten.le.Scalar, (_X, 0.0), {}), (aten.pow.Tensor_Scalar, (_X, 2), {}),
]


@pytest.mark.parametrize("op, args, kwargs", _ROW_SAMPLES, ids=[str(s[0]) for s in _ROW_SAMPLES])
def test_aten_row_matches_overload(op, args, kwargs):
    want = op(*args, **kwargs)
    got = ATEN_TO_TORCH[op](*args, **kwargs)
    want, got = (list(want), list(got)) if isinstance(want, (tuple, list)) else ([want], [got])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w)


def test_aten_rows_trace_into_prims():
    """Through fjit, mapped rows decompose into prims (no opaque aten calls left)."""
    def f(x, y):
        a = ATEN_TO_TORCH[aten.mul.Tensor](x, y)
        b = ATEN_TO_TORCH[aten._softmax.default](a, 1, False)
        return ATEN_TO_TORCH[aten.sum.dim_IntList](b, [0], True)

    jf = fjit.jit(f, executors=("torch",))
    torch.testing.assert_close(jf(_X, _Y), f(_X, _Y))
    source = str(fjit.last_traces(jf)[0])
    assert "prims." in source and "aten" not in source and "torch fallback" not in source


@pytest.mark.filterwarnings("ignore::DeprecationWarning")   # importing Inductor warns
@torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True)
def test_inductor_split_executor_falls_back_to_torch_with_a_note():
    be = fjit.dynamo.make_backend(split_executor="inductor")

    def f(x):
        return torch.nonzero(torch.cos(x) > 0.5).float() + 1

    x = torch.randn(6)
    torch.testing.assert_close(torch.compile(f, backend=be)(x), f(x))
    (split,) = [i for i in be.subgraph_infos if i.reason is not None]
    assert split.executor == "torch" and "Inductor could not compile" in split.note


# ------------------------------------------------------------------------------------------------
# Splits known before tracing: in-place writes across pieces, autocast regions

class _InPlaceAcrossPieces(torch.nn.Module):
    """What timm's EfficientViT does many times over: BatchNorm in training (a torch piece), an
    in-place activation on its output, a buffer counter bumped in place, an autocast region."""

    def __init__(self, blocks=12):
        super().__init__()
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(4, 4, 1) for _ in range(blocks))
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(4) for _ in range(blocks))

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms):
            y = torch.nn.functional.hardswish(norm(conv(x)), inplace=True)
            with torch.autocast(device_type=x.device.type, enabled=False):
                y = y.float() * 0.5
            x = x + y
        return x


def test_in_place_writes_across_pieces_split_once_flat_and_match_eager(be):
    torch.manual_seed(0)
    model = _InPlaceAcrossPieces()
    reference = copy.deepcopy(model)
    compiled = torch.compile(model, backend=be)
    x = torch.randn(2, 4, 3, 3)
    got, want = compiled(x), reference(x)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
    infos = be.subgraph_infos
    # every write across pieces and every autocast switch was split before tracing: no piece
    # was re-split after a failed trace
    assert infos and all("." not in i.name for i in infos), [i.name for i in infos if "." in i.name]
    reasons = {i.reason.why.split(" ")[0] for i in infos if i.reason is not None}
    assert {"FJ102", "enters"} <= reasons, reasons


def test_a_custom_functions_gradient_reaches_what_is_before_it_on_every_call(monkeypatch):
    """The joint program recorded the Function's outputs as needing no gradient, so from the second
    call (the first runs op by op) every gradient before it was None: BLOOM through the backend,
    silently.  Dynamo runs the Function's forward graph with gradients off, which apply undoes
    for its outputs: such a Function is one opaque op, whose real apply gives them their gradient
    function (frontend/library_calls._traced_forward)."""
    monkeypatch.setenv("FJIT_MEASURE", "0")
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    w1, w2 = torch.randn(8, 16, generator=g, requires_grad=True), torch.randn(16, 4, generator=g, requires_grad=True)

    def f(x):
        return (TanhGelu.apply(x @ w1) @ w2).square().sum()
    compiled = torch.compile(f, backend="fjit")
    x = torch.randn(5, 8, generator=g)
    for _ in range(3):
        got = torch.autograd.grad(compiled(x), (w1, w2))
        torch.testing.assert_close(got, torch.autograd.grad(f(x), (w1, w2)), rtol=1e-4, atol=1e-4)
    torch._dynamo.reset()
