"""Compiled functions, modules and backend pieces called under torch.func transforms (vmap, grad,
jvp) and forward-mode AD.  A transform's tensors are wrappers whose type is torch.Tensor and whose
metadata is the unbatched value's, and a dual tensor carries a tangent: a compiled program would
compute one example or drop the gradient or tangent, and a C kernel reading a wrapper aborted the
process.  fjit.jit refuses them (FJ201, located at the call); the backend runs such pieces as
torch code.  Plain tensors under a transform still run the compiled program."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call, grad, jvp, vmap

import fjit


def _f(x, y):
    return ((x * 2 + y).sin() * y).tanh()


def _scaled(x, s: float):
    return (x * s).exp()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(4, 300, generator=g), torch.randn(4, 300, generator=g)


def _warm(jf, *args):
    """Calls that file the program in the fast paths a later call checks first."""
    for _ in range(3):
        jf(*args)


TRANSFORMS = {
    "vmap": lambda jf, x, y: vmap(jf)(x, y),
    "grad": lambda jf, x, y: grad(lambda a: jf(a, y[0]).sum())(x[0]),
    "jvp": lambda jf, x, y: jvp(lambda a: jf(a, y[0]), (x[0],), (torch.ones_like(x[0]),)),
    "vmap of grad": lambda jf, x, y: vmap(grad(lambda a, b: jf(a, b).sum()))(x, y),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_a_compiled_function_under_a_torch_func_transform_is_fj201(transform):
    x, y = _inputs()
    jf = fjit.jit(_f)
    _warm(jf, x[0], y[0])
    with pytest.raises(fjit.UnsupportedInputError) as info:
        TRANSFORMS[transform](jf, x, y)
    message = str(info.value)
    assert "FJ201" in message and "torch.func transform" in message
    assert f"{__file__}:" in message or "test_transforms.py:" in message
    assert "FJ201_transformed_tensor" in message      # the catalog entry's fix
    torch.testing.assert_close(jf(x[0], y[0]), _f(x[0], y[0]))     # outside, as before


@pytest.mark.parametrize("signature", ["tensors", "tensor and float"])
def test_a_dual_tensor_of_forward_mode_ad_is_fj201_not_a_dropped_tangent(signature):
    """The cached fast paths check a tensor's metadata and dispatch keys, which a dual tensor
    shares with its primal: without the check the program ran and the tangent was None."""
    x, y = _inputs()
    jf, args = (fjit.jit(_f), (y[0],)) if signature == "tensors" else (fjit.jit(_scaled), (0.5,))
    _warm(jf, x[0], *args)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x[0], torch.ones_like(x[0]))
        with pytest.raises(fjit.UnsupportedInputError, match="dual tensor of forward-mode AD"):
            jf(dual, *args)
        # a plain tensor inside a dual level runs the program
        torch.testing.assert_close(jf(x[0], *args), (_f if signature == "tensors" else _scaled)(x[0], *args))


def test_plain_tensors_under_a_transform_run_the_compiled_program():
    x, y = _inputs()
    jf = fjit.jit(_f)
    _warm(jf, x[0], y[0])
    got = vmap(lambda a: jf(x[0], y[0]) + a)(x)
    torch.testing.assert_close(got, _f(x[0], y[0]) + x)


def test_a_compiled_module_under_grad_of_functional_call_is_fj201():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    jm = fjit.jit(model)
    x = torch.randn(5, 8)
    _warm(jm, x)
    params = {k: v.detach() for k, v in model.named_parameters()}
    with pytest.raises(fjit.UnsupportedInputError, match="torch.func transform"):
        grad(lambda p: functional_call(jm, p, (x,)).sum())(params)
    with pytest.raises(fjit.UnsupportedInputError, match="torch.func transform"):
        vmap(jm)(torch.randn(3, 5, 8))


def test_backend_pieces_run_as_torch_under_transforms():
    """torch.compile(backend="fjit") runs code strict mode rejects, transforms included: a piece
    compiled on a plain call, then called under vmap, jvp and a dual level, gives eager's values,
    gradients and tangents."""
    x, y = _inputs()
    bf = torch.compile(_f, backend="fjit")
    torch.testing.assert_close(bf(x[0], y[0]), _f(x[0], y[0]))
    torch.testing.assert_close(vmap(bf)(x, y), vmap(_f)(x, y))
    t = torch.ones_like(x[0])
    got, want = jvp(lambda a: bf(a, y[0]), (x[0],), (t,)), jvp(lambda a: _f(a, y[0]), (x[0],), (t,))
    torch.testing.assert_close(got, want)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x[0], t)
        torch.testing.assert_close(fwAD.unpack_dual(bf(dual, y[0])).tangent,
                                   fwAD.unpack_dual(_f(dual, y[0])).tangent)
    torch.testing.assert_close(bf(x[1], y[1]), _f(x[1], y[1]))


def _combine(a, b):
    return (b[0] * a[0], b[0] * a[1] + b[1])


def _linear_recurrence(a, x):
    from torch._higher_order_ops.associative_scan import associative_scan
    h = associative_scan(_combine, ((a * 0.5).sigmoid(), x), dim=1, combine_mode="generic")[1]
    return (h * 2 + 1).tanh()


def test_backend_pieces_dynamo_runs_inside_a_vmap_run_as_torch():
    """torch's associative_scan (transformers' Mamba scans with it) runs its combine function under
    vmap, and Dynamo compiles that function's frames with the vmap's wrapped tensors: the fjit
    piece's C kernel read them and the process aborted.  Now such a piece runs as torch code."""
    g = torch.Generator().manual_seed(0)
    a, x = torch.randn(2, 16, 300, generator=g), torch.randn(2, 16, 300, generator=g)
    bf = torch.compile(_linear_recurrence, backend="fjit")
    for _ in range(2):
        torch.testing.assert_close(bf(a, x), _linear_recurrence(a, x))


@pytest.mark.parametrize("how", ["is_grads_batched", "jacobian(vectorize=True)"])
def test_batched_cotangents_through_the_compiled_backward_are_eagers(how, monkeypatch):
    """autograd runs a backward inside a vmap for batched cotangents: the compiled backward's
    kernels got tensors without storage ("Cannot access data pointer"); now that backward runs
    as the differentiable recompute (torch's ops), and the Jacobian is eager's."""
    monkeypatch.setenv("FJIT_MEASURE", "0")      # the joint program, whose backward has kernels
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 64, generator=g)
    x = torch.randn(3, 64, generator=g, requires_grad=True)

    def f(x, w):
        return ((x @ w).tanh() * 2 + x).sin()
    jf = fjit.jit(f)
    _warm(lambda a: jf(a, w).sum().backward(), x)
    assert fjit.last_backward_traces(jf)[-1].stage.startswith("torch_executor") and \
        "fjit_c_" in str(fjit.last_backward_traces(jf)[-1])
    if how == "is_grads_batched":
        v = torch.eye(3 * 64).reshape(-1, 3, 64)
        got, = torch.autograd.grad(jf(x, w), x, v, is_grads_batched=True)
        want, = torch.autograd.grad(f(x, w), x, v, is_grads_batched=True)
    else:
        got = torch.autograd.functional.jacobian(lambda a: jf(a, w), x, vectorize=True)
        want = torch.autograd.functional.jacobian(lambda a: f(a, w), x, vectorize=True)
    torch.testing.assert_close(got, want)
