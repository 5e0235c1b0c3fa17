"""Compiled functions and modules under torch.func transforms (vmap, grad, vjp, jvp, jacrev,
jacfwd, hessian, per-sample gradients) and forward-mode AD, and those transforms inside a compiled
function.  A transform's tensors are wrappers whose type is torch.Tensor and whose metadata is the
unbatched value's, and a dual tensor carries a tangent: a compiled program would compute one
example or drop the gradient or tangent, and a C kernel reading a wrapper aborted the process.
So under a transform, fjit traces the function (as strictly as ever) on plain stand-ins and runs
its program's torch form on the transform's tensors; the backend runs such pieces as torch code.
Plain tensors under a transform still run the compiled program."""
from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from torch.func import functional_call, grad, grad_and_value, hessian, jacfwd, jacrev, jvp, vjp, vmap

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


def _loss(x, y):
    return _f(x, y).sum()


TRANSFORMS = {
    "vmap": lambda f, x, y: vmap(f)(x, y),
    "vmap(in_dims=(0, None))": lambda f, x, y: vmap(f, in_dims=(0, None))(x, y[0]),
    "grad": lambda f, x, y: grad(lambda a: f(a, y[0]).sum())(x[0]),
    "grad_and_value": lambda f, x, y: grad_and_value(lambda a: f(a, y[0]).sum())(x[0]),
    "vjp": lambda f, x, y: vjp(lambda a: f(a, y[0]), x[0])[1](torch.ones_like(x[0])),
    "jvp": lambda f, x, y: jvp(lambda a: f(a, y[0]), (x[0],), (torch.ones_like(x[0]),)),
    "jacrev": lambda f, x, y: jacrev(f)(x[0, :6], y[0, :6]),
    "jacfwd": lambda f, x, y: jacfwd(f, argnums=1)(x[0, :6], y[0, :6]),
    "hessian": lambda f, x, y: hessian(lambda a: f(a, y[0, :5]).sum())(x[0, :5]),
    "vmap of grad": lambda f, x, y: vmap(grad(lambda a, b: f(a, b).sum()))(x, y),
}


@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_a_torch_func_transform_over_a_compiled_function_gives_eagers_values(transform):
    """Before: FJ201 for every one of them."""
    x, y = _inputs()
    jf = fjit.jit(_f)
    _warm(jf, x[0], y[0])
    for _ in range(2):       # the second call finds the torch form's program in its cache
        torch.testing.assert_close(TRANSFORMS[transform](jf, x, y), TRANSFORMS[transform](_f, x, y))
    torch.testing.assert_close(jf(x[0], y[0]), _f(x[0], y[0]))     # outside, as before
    assert jf.cache_info().misses == 1      # the transform's calls did not displace the program


def _views(x, y):
    """Views of an input and chains of elementwise ops: what the torch form must not lower into
    storage reinterpretations (a transform's wrapper has no storage) or in-place writes into
    values the transform saves."""
    return (x * x[0]).sum(1) + x[0] * x[1].cos() + y.t()[0] * y[:, 1].exp()


@pytest.mark.parametrize("transform", ["vmap", "grad", "jacrev", "jvp"])
def test_views_of_inputs_under_a_transform_run_in_the_torch_form(transform):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 4, 4, generator=g), torch.randn(3, 4, 4, generator=g)
    run = {"vmap": lambda f: vmap(f)(x, y),
           "grad": lambda f: grad(lambda a: f(a, y[0]).sum())(x[0]),
           "jacrev": lambda f: jacrev(f)(x[0], y[0]),
           "jvp": lambda f: jvp(lambda a: f(a, y[0]), (x[0],), (torch.ones_like(x[0]),))}[transform]
    jf = fjit.jit(_views)
    torch.testing.assert_close(run(jf), run(_views))


def test_under_a_transform_the_function_is_traced_as_strictly_as_outside():
    def noisy(x):
        print("side effect")
        return x * 2
    with pytest.raises(fjit.SideEffectError, match="FJ104"):
        vmap(fjit.jit(noisy))(torch.randn(3, 4))


@pytest.mark.parametrize("signature", ["tensors", "tensor and float"])
def test_a_dual_tensor_of_forward_mode_ad_gets_eagers_tangent(signature):
    """The cached fast paths check a tensor's metadata and dispatch keys, which a dual tensor
    shares with its primal: once the program ran and the tangent was None, then it was FJ201;
    now the tangent is eager's."""
    x, y = _inputs()
    f = _f if signature == "tensors" else _scaled
    jf, args = fjit.jit(f), ((y[0],) if signature == "tensors" else (0.5,))
    _warm(jf, x[0], *args)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x[0], torch.ones_like(x[0]))
        got, want = fwAD.unpack_dual(jf(dual, *args)), fwAD.unpack_dual(f(dual, *args))
        torch.testing.assert_close(got.tangent, want.tangent)
        torch.testing.assert_close(got.primal, want.primal)
        # a plain tensor inside a dual level runs the program
        torch.testing.assert_close(jf(x[0], *args), f(x[0], *args))


def test_plain_tensors_under_a_transform_run_the_compiled_program():
    x, y = _inputs()
    jf = fjit.jit(_f)
    _warm(jf, x[0], y[0])
    got = vmap(lambda a: jf(x[0], y[0]) + a)(x)
    torch.testing.assert_close(got, _f(x[0], y[0]) + x)


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))


def test_per_sample_gradients_over_a_compiled_module_are_eagers():
    """vmap(grad(functional_call(jm, ...))): functional_call swaps the jitted module's
    parameters by name (before: a KeyError, then FJ201)."""
    model = _mlp()
    jm = fjit.jit(model)
    x, t = torch.randn(5, 8), torch.randn(5, 1)
    _warm(jm, x)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def per_sample(module):
        def loss(p, xi, ti):
            return ((functional_call(module, p, (xi[None],)) - ti) ** 2).sum()
        return vmap(grad(loss), in_dims=(None, 0, 0))(params, x, t)
    got, want = per_sample(jm), per_sample(model)
    assert set(got) == set(want)
    for name in want:
        torch.testing.assert_close(got[name], want[name])
    torch.testing.assert_close(vmap(jm)(torch.randn(3, 5, 8)).shape, torch.Size([3, 5, 1]))
    torch.testing.assert_close(jm(x), model(x))      # the module's own parameters are back


def _closure_vmap(x):
    return vmap(lambda r: (r * x[0]).sum())(x) + 1


def _inner_grad(x):
    return grad(lambda y: (y.sin() * x).sum())(x) * 2


def _inner_jacrev(x):
    return jacrev(lambda y: (y.sin() * x[:3].cos()).cumsum(0))(x[:3]).sum(0)


def _inner_jvp(x):
    return jvp(lambda y: (y * y).sin(), (x,), (torch.ones_like(x),))[1] + x


def _inner_vjp(x):
    out, pull = vjp(lambda y: y.exp() * 3, x)
    return pull(torch.ones_like(out))[0] + out


def _inner_hessian(x):
    return hessian(lambda y: (y.sin() * y).sum())(x[:4]).diagonal() + 1


INSIDE = {f.__name__: f for f in (_closure_vmap, _inner_grad, _inner_jacrev, _inner_jvp, _inner_vjp,
                                  _inner_hessian)}


@pytest.mark.parametrize("name", list(INSIDE))
def test_a_torch_func_transform_inside_a_compiled_function_gives_eagers_values(name):
    """Before: vmap of a function closing over an input was FJ202 or FJ101, torch.func.grad FJ101
    "not an input" of the input itself."""
    f = INSIDE[name]
    x = torch.randn(4, 4)
    jf = fjit.jit(f)
    for _ in range(2):
        torch.testing.assert_close(jf(x), f(x))


def test_per_sample_gradients_inside_a_compiled_function_are_eagers():
    """The route the documentation gives for per-sample gradients, inside fjit.jit (before: an
    internal ValueError from frontend/record.py)."""
    model = _mlp()

    def per_sample(p, xs, ts):
        def loss(q, xi, ti):
            return ((functional_call(model, q, (xi[None],)) - ti) ** 2).sum()
        return vmap(grad(loss), in_dims=(None, 0, 0))(p, xs, ts)
    params = {k: v.detach() for k, v in model.named_parameters()}
    x, t = torch.randn(6, 8), torch.randn(6, 1)
    got, want = fjit.jit(per_sample)(params, x, t), per_sample(params, x, t)
    for name in want:
        torch.testing.assert_close(got[name], want[name])


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


class _VmappedHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.vmap(self.head)(x).tanh().sum()


def test_a_transform_of_a_jitted_modules_submodule_trains_as_eager():
    """vmap(self.head) inside a jitted module: the submodule's parameters are the trace's proxies
    while it runs, and become the op's inputs through functional_call (before: a false FJ202
    blaming a data-dependent shape)."""
    torch.manual_seed(0)
    model, x = _VmappedHead(), torch.randn(5, 2, 4)
    jm = fjit.jit(model)
    for _ in range(3):
        model.zero_grad()
        jm(x).backward()
        got = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        model(x).backward()
        for a, p in zip(got, model.parameters()):
            torch.testing.assert_close(a, p.grad)
