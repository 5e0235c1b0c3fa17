"""Proxies pass for what they stand for: inside a jitted function a proxy answers every question
as the tensor (or float) it stands for would: type checks, metadata properties, attribute probes,
unbound methods."""
import numbers

import pytest
import torch

import fjit


def _same(f, *args):
    expected = f(*args)
    got = fjit.jit(f)(*args)
    torch.testing.assert_close(got, expected)
    return got


QUESTIONS = {
    "isinstance_tensor": lambda x: x * 2 if isinstance(x, torch.Tensor) else x,
    "is_tensor": lambda x: x + 1 if torch.is_tensor(x) else x,
    "isinstance_parameter_is_false": lambda x: x * 0 if isinstance(x, torch.nn.Parameter) else x,
    "hasattr_weight": lambda x: x.weight if hasattr(x, "weight") else x - 1,
    "getattr_default": lambda x: x * getattr(x, "scale", 2.0),
    "is_sparse": lambda x: x * 3 if not x.is_sparse else x,
    "is_quantized": lambda x: x * 3 if not x.is_quantized else x,
    "is_meta": lambda x: x * 3 if not x.is_meta else x,
    "is_nested": lambda x: x * 3 if not x.is_nested else x,
    "is_mkldnn": lambda x: x * 3 if not x.is_mkldnn else x,
    "layout": lambda x: x * 3 if x.layout == torch.strided else x,
    "itemsize": lambda x: x * x.itemsize,
    "nbytes": lambda x: x * x.nbytes,
    "element_size": lambda x: x * x.element_size(),
    "is_cpu": lambda x: x + 1 if x.is_cpu else x,
    "device_type": lambda x: x + 1 if x.device.type == "cpu" else x,
    "get_device": lambda x: x + x.get_device(),
    "H": lambda x: x.H + 1,
    "mH": lambda x: x.mH * 2,
    "mT": lambda x: x.mT - 1,
    "T": lambda x: x.T,
    "is_contiguous_channels_last": lambda x: x + 1 if x.is_contiguous() else x,
    "is_floating_point": lambda x: x / 2 if x.is_floating_point() else x,
    "len_and_iter": lambda x: sum(row for row in x) + len(x),
    "requires_grad": lambda x: x + 1 if not x.requires_grad else x,
    "is_leaf": lambda x: x + 1 if x.is_leaf else x,
    "dim_size_stride": lambda x: x * (x.dim() + x.size(0) + x.stride(0) + x.numel()),
}


@pytest.mark.parametrize("name", sorted(QUESTIONS))
def test_metadata_questions_get_eagers_answer(name):
    _same(QUESTIONS[name], torch.randn(3, 4))


def test_type_checks_inside_library_style_code():
    def normalize(x, eps):
        if not isinstance(x, torch.Tensor):
            raise TypeError("tensor expected")
        if isinstance(eps, (int, float)) and isinstance(eps, numbers.Real):
            return x / (x.abs().amax() + eps)
        return x
    _same(normalize, torch.randn(5), 1e-3)


def test_unbound_methods_and_dunders():
    def f(x, y):
        return torch.Tensor.__radd__(x, 1.5) * torch.Tensor.add(x, y) - torch.Tensor.__mul__(y, 2)
    _same(f, torch.randn(4), torch.randn(4))


def test_isinstance_float_of_a_number_input():
    def f(x, s):
        return x * s if isinstance(s, float) else x
    _same(f, torch.randn(3), 2.5)


def test_type_is_float_of_a_number_input_specializes():
    def f(x, s):
        return x * s if type(s) is float else x
    jf = fjit.jit(f)
    x = torch.randn(3)
    for s in (2.5, 0.5):
        torch.testing.assert_close(jf(x, s), f(x, s))


def test_proxy_metadata_follows_a_moved_handle():
    def f(x, w):
        y = x * 2                       # requires_grad False
        y.add_(w)                       # now it requires grad, as in eager
        return y * 2 if y.requires_grad else y
    x, w = torch.randn(3), torch.randn(3, requires_grad=True)
    got, expected = fjit.jit(f)(x, w), f(x, w)
    torch.testing.assert_close(got, expected)
    assert got.requires_grad == expected.requires_grad


@pytest.mark.parametrize("question, code", [
    (lambda x: x.data_ptr(), "FJ202"),
    (lambda x: x.untyped_storage(), "FJ202"),
    (lambda x: x.grad, "FJ202"),
    (lambda x: str(x), "FJ106"),
    (lambda x: f"{x}", "FJ106"),
    (lambda x: repr(x), "FJ106"),
    (lambda x: 0.5 in x, "FJ106"),
])
def test_questions_without_a_trace_time_answer_are_located_errors(question, code):
    with pytest.raises(fjit.FjitError) as info:
        fjit.jit(question)(torch.randn(3))
    assert code in str(info.value)
    assert "test_proxies.py:" in str(info.value)


def test_numpy_asarray_of_a_tensor_is_fj106():
    np = pytest.importorskip("numpy")
    with pytest.raises(fjit.DataDependentError) as info:
        fjit.jit(lambda x: np.asarray(x))(torch.randn(3))
    assert info.value.code == "FJ106"


@pytest.mark.parametrize("check", [torch.allclose, torch.equal])
def test_allclose_and_equal_in_an_if_are_fj106(check):
    def f(x, y):
        if check(x, y):
            return x
        return y
    with pytest.raises(fjit.DataDependentError) as info:
        fjit.jit(f)(torch.randn(3), torch.randn(3))
    assert info.value.code == "FJ106" and info.value.lineno == f.__code__.co_firstlineno + 1


def test_deepcopy_of_a_tensor_is_a_fresh_value():
    import copy

    def f(x):
        y = x * 2
        z = copy.deepcopy(y)
        z.add_(1)
        return y, z
    _same(f, torch.randn(3))
