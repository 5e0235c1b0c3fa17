"""Grad-mode and autocast regions are honoured: blocks, decorators and calls inside the function,
and the state outside it at compile time and at later calls."""
import pytest
import torch

import fjit


def _grads(f, *args):
    xs = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    out = f(*xs)
    out.sum().backward()
    return out, [x.grad for x in xs]


def _check_grads(f, *args):
    e_out, e_grads = _grads(f, *args)
    g_out, g_grads = _grads(fjit.jit(f), *args)
    torch.testing.assert_close(g_out, e_out)
    assert g_out.requires_grad == e_out.requires_grad
    for g, e in zip(g_grads, e_grads):
        assert (g is None) == (e is None)
        if e is not None:
            torch.testing.assert_close(g, e)


def no_grad_block(x):
    with torch.no_grad():
        y = x * 2
    return y * x


def set_grad_enabled_block(x):
    with torch.set_grad_enabled(False):
        y = x.exp()
    return y + x * x


def nested_enable_grad(x):
    with torch.no_grad():
        a = x * 3
        with torch.enable_grad():
            b = x * a
    return a + b


def inference_mode_block(x):
    with torch.inference_mode():
        y = x.sin()
    return x * y.clone()


@torch.no_grad()
def _helper(x):
    return x * 4


def decorated_helper(x):
    return _helper(x) * x


def detach_and_data(x):
    return x.detach() * x + x.data * x


@pytest.mark.parametrize("f", [no_grad_block, set_grad_enabled_block, nested_enable_grad,
                               inference_mode_block, decorated_helper, detach_and_data])
def test_grad_regions_give_eagers_gradients(f):
    _check_grads(f, torch.randn(5, requires_grad=True))


def test_a_no_grad_region_is_a_barrier_for_cse():
    def f(x):
        with torch.no_grad():
            a = x * 2
        b = x * 2            # the same expression, with grad: must not be merged with a
        return a + b
    _check_grads(f, torch.randn(4, requires_grad=True))


def test_whole_function_decorated_with_no_grad():
    f = torch.no_grad()(lambda x: x * 2)
    out = fjit.jit(f)(torch.randn(3, requires_grad=True))
    assert not out.requires_grad
    assert torch.is_grad_enabled()


def test_grad_mode_at_the_call_is_part_of_the_key():
    jf = fjit.jit(lambda x: x * 2)
    x = torch.randn(3, requires_grad=True)
    assert jf(x).requires_grad
    with torch.no_grad():
        assert not jf(x).requires_grad
    assert jf(x).requires_grad


def autocast_matmul(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x @ w


def autocast_linear_then_float(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.nn.functional.linear(x, w.T)
        s = torch.softmax(h, -1)
    return s.float() * 2 + h.float()


def autocast_mixed_dtypes(x, w):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return x.bfloat16() @ w


@pytest.mark.parametrize("f", [autocast_matmul, autocast_linear_then_float, autocast_mixed_dtypes])
def test_autocast_inside_the_function(f):
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    expected = f(x, w)
    for _ in range(2):
        got = fjit.jit(f)(x, w)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    assert not torch.is_autocast_enabled("cpu")


def test_autocast_outside_at_compile_time_and_later_calls():
    f = lambda x, w: (x @ w) * 2  # noqa: E731
    jf = fjit.jit(f)
    x, w = torch.randn(3, 4), torch.randn(4, 5)
    for dtype in (torch.bfloat16, None, torch.float16, torch.bfloat16):
        if dtype is None:
            got, expected = jf(x, w), f(x, w)
        else:
            with torch.autocast("cpu", dtype=dtype):
                got, expected = jf(x, w), f(x, w)
        assert got.dtype == expected.dtype, dtype
        torch.testing.assert_close(got, expected)


def test_a_mode_is_restored_when_an_op_raises():
    def f(x, idx):
        with torch.no_grad():
            return x[idx] * 2
    jf = fjit.jit(f)
    jf(torch.randn(3), torch.tensor([0]))                  # compiled
    with pytest.raises(IndexError):
        jf(torch.randn(3), torch.tensor([7]))              # same key, fails at run time
    assert torch.is_grad_enabled()


def test_set_grad_enabled_left_off_stays_off_as_in_eager():
    def f(x):
        torch.set_grad_enabled(False)
        return x * 2
    try:
        out = fjit.jit(f)(torch.randn(3, requires_grad=True))
        assert not out.requires_grad and not torch.is_grad_enabled()
    finally:
        torch.set_grad_enabled(True)


def test_custom_autograd_function_runs_its_own_backward():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 10      # deliberately not the true derivative: it must be the one used

    def f(x):
        return Double.apply(x) + x
    _check_grads(f, torch.randn(3, requires_grad=True))


def test_gradient_hooks_on_intermediates_run_with_eagers_gradient_on_every_call():
    """register_hook / retain_grad on a value the function computes: an op of the program, which
    registers the hook on each call's value; torch autograd runs that backward."""
    def f(x):
        y = x * 2
        y.register_hook(lambda g: g * 3)
        z = y.sin() * x
        z.retain_grad()
        return z.sum(), z
    jf = fjit.jit(f)
    x = torch.randn(3, requires_grad=True)
    for _ in range(3):
        (got, z), (want, ez) = jf(x), f(x)
        got.backward()
        gx = x.grad.clone()
        x.grad = None
        want.backward()
        torch.testing.assert_close((gx, z.grad), (x.grad, ez.grad))
        x.grad = None
    assert "gradient hook" in fjit.last_backward_traces(jf)[0].stage


def test_removing_a_hook_registered_while_tracing_is_a_located_error():
    def f(x):
        y = x * 2
        y.register_hook(lambda g: g * 3).remove()
        return y * x
    with pytest.raises(fjit.UnsupportedOpError) as info:
        fjit.jit(f)(torch.randn(3, requires_grad=True))
    assert info.value.code == "FJ202" and info.value.lineno == f.__code__.co_firstlineno + 2
