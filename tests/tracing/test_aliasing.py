"""Aliasing is modelled.  Writes through detach(), .data, view(dtype), view_as_real, unflatten,
_foreach_*_ and out= reach the aliased value as in eager; reaching an input that way is FJ102,
located at the writing line."""
import copy

import pytest
import torch

import fjit


def _same(f, *args):
    expected = f(*copy.deepcopy(args))
    got = fjit.jit(f)(*args)
    flat_e = expected if isinstance(expected, (list, tuple)) else [expected]
    flat_g = got if isinstance(got, (list, tuple)) else [got]
    for g, e in zip(flat_g, flat_e):
        assert torch.equal(g, e), (g, e)


LOCAL_ALIASES = {
    "detach": lambda x: (lambda y: (y.detach().add_(1), y)[1])(x * 1),
    "data": lambda x: (lambda y: (y.data.mul_(2), y)[1])(x * 1),
    "view_dtype": lambda x: (lambda y: (y.view(torch.int32).add_(1), y)[1])(x * 1),
    "unflatten": lambda x: (lambda y: (y.unflatten(0, (2, 2)).add_(1), y)[1])(x * 1),
    "view_then_detach": lambda x: (lambda y: (y.view(2, 2).detach().mul_(3), y)[1])(x * 1),
    "out_into_local": lambda x: (lambda y: (torch.mul(x, 2, out=y), y)[1])(torch.empty(4)),
    "data_assignment": lambda x: (lambda y: (setattr(y, "data", x * 5), y)[1])(x * 1),
}


@pytest.mark.parametrize("name", sorted(LOCAL_ALIASES))
def test_writes_through_an_alias_of_a_local_reach_it(name):
    _same(LOCAL_ALIASES[name], torch.randn(4))


def test_view_as_real_write_reaches_the_complex_value():
    def f(z):
        y = z * 1
        torch.view_as_real(y).mul_(2)
        return y
    _same(f, torch.randn(3, dtype=torch.complex64))


def test_foreach_inplace_on_a_list_of_locals():
    def f(xs):
        ys = [x * 1 for x in xs]
        torch._foreach_add_(ys, 1.0)
        torch._foreach_mul_(ys, 2.0)
        return ys
    _same(f, [torch.randn(3), torch.randn(2)])


INPUT_ALIASES = {
    "detach_add_": (lambda x: x.detach().add_(1), "FJ102"),
    "data_mul_": (lambda x: x.data.mul_(2), "FJ102"),
    "view_dtype_add_": (lambda x: x.view(torch.int32).add_(1), "FJ102"),
    "data_assignment": (lambda x: setattr(x, "data", x * 2), "FJ102"),
    "unflatten_fill_": (lambda x: x.unflatten(0, (2, 2)).fill_(0), "FJ102"),
}


@pytest.mark.parametrize("name", sorted(INPUT_ALIASES))
def test_reaching_an_input_through_an_alias_is_fj102(name):
    f, code = INPUT_ALIASES[name]
    with pytest.raises(fjit.InputMutationError) as info:
        fjit.jit(f)(torch.randn(4))
    assert info.value.code == code
    assert info.value.filename.endswith("test_aliasing.py")


def test_foreach_on_an_input_list_is_fj102_at_its_line():
    def f(xs):
        torch._foreach_add_(xs, 1.0)
        return xs
    with pytest.raises(fjit.InputMutationError) as info:
        fjit.jit(f)([torch.randn(3)])
    assert info.value.lineno == f.__code__.co_firstlineno + 1


def test_detach_stops_gradients():
    def f(x):
        return x.detach() * x
    x = torch.randn(3, requires_grad=True)
    fjit.jit(f)(x).sum().backward()
    assert torch.equal(x.grad, x.detach())
