"""Outputs come back as eager returns them: same types, same field values, same keys in the same
order, never a tracing proxy; what fjit cannot rebuild is FJ201 at compile time."""
import collections
import dataclasses
import types
import typing

import pytest
import torch
import torch.utils._pytree as pytree

import fjit
from fjit.frontend.proxies import NumberProxy, TensorProxy


def _same(got, expected, path="out"):
    """Exact types all the way down, equal keys/fields in the same order, close tensors."""
    assert type(got) is type(expected), f"{path}: {type(got)} is not {type(expected)}"
    assert not isinstance(got, (TensorProxy, NumberProxy)), path
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, equal_nan=True)
    elif isinstance(expected, dict):
        assert list(got) == list(expected), path
        if isinstance(expected, collections.defaultdict):
            assert got.default_factory is expected.default_factory, path
        for k in expected:
            _same(got[k], expected[k], f"{path}[{k!r}]")
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected), path
        for i, (g, e) in enumerate(zip(got, expected)):
            _same(g, e, f"{path}[{i}]")
    elif dataclasses.is_dataclass(expected) or hasattr(expected, "__dict__"):
        assert list(_attributes(got)) == list(_attributes(expected)), path
        for k, v in _attributes(expected).items():
            _same(getattr(got, k), v, f"{path}.{k}")
    elif isinstance(expected, float) and expected != expected:
        assert got != got, path
    else:
        assert got == expected, path


def _attributes(x) -> dict:
    if hasattr(x, "__dict__"):
        return vars(x)
    return {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}   # __slots__


def _check(fn, *args, calls=3):
    """The jitted function returns what eager returns, on the compiling call and cached calls."""
    jf = fjit.jit(fn)
    for i in range(calls):
        args_i = tuple(a + i if isinstance(a, torch.Tensor) else a for a in args)
        _same(jf(*args_i), fn(*args_i))
    assert fjit.cache_info(jf).misses == 1
    return jf


@dataclasses.dataclass
class ModelOutput:
    logits: torch.Tensor
    loss: torch.Tensor
    extra: dict


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    n: int = 3


@dataclasses.dataclass
class WithPostInit:
    x: torch.Tensor
    doubled: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self):
        self.doubled = self.x * 2


@dataclasses.dataclass
class Slotted:
    __slots__ = ("a", "b")
    a: torch.Tensor
    b: float


Pair = collections.namedtuple("Pair", ["value", "mask"])


class Point(typing.NamedTuple):
    x: torch.Tensor
    y: typing.Optional[torch.Tensor]
    label: str


class Registered:
    """A class a library registered with torch.utils._pytree."""

    def __init__(self, a, b, tag):
        self.a, self.b, self.tag = a, b, tag


pytree.register_pytree_node(
    Registered, lambda r: ([r.a, r.b], r.tag), lambda children, tag: Registered(*children, tag))


@dataclasses.dataclass
class RegisteredData:
    w: torch.Tensor
    scale: float


pytree.register_dataclass(RegisteredData)


def test_dataclass_of_tensors_and_dict():
    def fn(x, y):
        logits = x @ y
        return ModelOutput(logits, logits.sum(), {"n": 3, "h": logits.relu()})
    _check(fn, torch.randn(3, 4), torch.randn(4, 2))


def test_frozen_dataclass():
    _check(lambda x: Frozen(x.sin()), torch.randn(5))


def test_dataclass_with_post_init_field_keeps_eager_values():
    _check(lambda x: WithPostInit(x + 1), torch.randn(4))


def test_slotted_dataclass():
    out = _check(lambda x, s: Slotted(x * s, s), torch.randn(3), 0.5)
    got = out(torch.ones(3), 2.0)
    assert got.b == 2.0 and type(got.b) is float


def test_simple_namespace():
    _check(lambda x: types.SimpleNamespace(a=x.exp(), b=x.shape[0], c="name"), torch.randn(6))


def test_dict_with_dtype_int_and_tuple_keys():
    def fn(x, u):
        return {torch.float32: x * 2, 3: u - 1, (1, "a"): x + u, torch.int64: None}
    _check(fn, torch.randn(4), torch.randn(4))


def test_torch_size_alone_and_mixed_with_tensors():
    _check(lambda x: x.shape, torch.randn(2, 3))
    _check(lambda x: (x.shape, x.size(), x * 2, x.size(0)), torch.randn(2, 3))
    _check(lambda x: {"shape": x.shape, "y": x.t()}, torch.randn(2, 3))


def test_ordered_dict_keeps_type_and_order():
    def fn(x):
        d = collections.OrderedDict()
        d["z"] = x + 1
        d["a"] = x * 2
        return d
    _check(fn, torch.randn(3))


def test_defaultdict_keeps_its_factory():
    def fn(x):
        d = collections.defaultdict(list)
        d["b"] = x + 1
        d["a"] = [x * 2]
        return d
    _check(fn, torch.randn(3))


def test_namedtuples_with_none_and_str_fields():
    _check(lambda x: Pair(x.abs(), None), torch.randn(3))
    _check(lambda x: Point(x + 1, None, "p"), torch.randn(3))
    _check(lambda x: [Pair(x, None), Point(x, x * 2, "q")], torch.randn(3))
    _check(lambda x: Pair(x.shape, None), torch.randn(3))


def test_tuples_and_lists_with_none_str_int_float():
    _check(lambda x, s: (x * s, None, "tag", 7, 2.5, s, [None, x.sum(), x.shape]), torch.randn(4), 0.25)


def test_registered_pytree_node():
    out = _check(lambda x: Registered(x + 1, x.cos(), "t"), torch.randn(3))
    got = out(torch.zeros(3))
    assert type(got) is Registered and got.tag == "t"
    torch.testing.assert_close(got.a, torch.ones(3))
    assert not isinstance(got.b, TensorProxy)


def test_registered_dataclass():
    _check(lambda x, s: RegisteredData(x * s, s), torch.randn(3), 1.5)


def test_nested_mix():
    def fn(x, y):
        inner = collections.OrderedDict(sizes=(x.shape, y.shape), ns=types.SimpleNamespace(m=x.max()))
        return {"out": ModelOutput(x + y, (x * y).sum(), {torch.float32: inner}),
                "list": [Frozen(x), None, {2: y}]}
    _check(fn, torch.randn(2, 2), torch.randn(2, 2))


def test_returned_input_and_container_of_inputs():
    _check(lambda x, y: types.SimpleNamespace(x=x, both=[x, y]), torch.randn(2), torch.randn(2))


def test_no_proxy_reaches_the_caller_on_the_compiling_call():
    jf = fjit.jit(lambda x: ModelOutput(x, x.sum(), {"k": x * 2}))
    out = jf(torch.randn(3))
    for v in (out.logits, out.loss, out.extra["k"]):
        assert type(v) is torch.Tensor


def test_constant_object_without_tensors_is_returned_as_eager_returns_it():
    config = types.MappingProxyType({"a": 1})

    def fn(x):
        return types.SimpleNamespace(y=x + 1, config=config)
    out = _check(fn, torch.randn(2))
    assert out(torch.randn(2)).config is config


def test_printed_trace_is_runnable_and_rebuilds():
    jf = fjit.jit(lambda x: ModelOutput(x + 1, x.sum(), {"n": 1}))
    x = torch.randn(3)
    jf(x)
    for trace in fjit.last_traces(jf):
        assert "rebuilds ModelOutput" in str(trace)
        _same(trace.python_callable()(x), ModelOutput(x + 1, x.sum(), {"n": 1}))
    plain = fjit.jit(lambda x: (x + 1, {"a": x}))    # plain containers still print as themselves
    plain(x)
    assert "rebuild" not in str(fjit.last_traces(plain)[-1])


def _lines_of(fn, marker):
    import inspect
    src, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(src) if marker in line)


class Holder:
    def __init__(self, t):
        self.t = t


def test_generator_output_is_fj201_with_the_return_line():
    def fn(x):
        y = x + 1
        return (y * i for i in range(3))   # RETURN-GEN
    with pytest.raises(fjit.UnsupportedInputError, match="FJ201") as info:
        fjit.jit(fn)(torch.randn(2))
    msg = str(info.value)
    assert f"test_outputs.py:{_lines_of(fn, 'RETURN-GEN')}:" in msg, msg
    assert "generator" in msg and "Fix:" in msg


def test_generator_without_tensors_is_also_fj201():
    # a compiled call would hand back the same, already consumed generator
    with pytest.raises(fjit.UnsupportedInputError, match="FJ201"):
        fjit.jit(lambda x: (x + 1, iter(range(3))))(torch.randn(2))


def test_object_of_a_plain_class_holding_tensors_is_rebuilt_per_call():
    """What transformers returns as `past_key_values` (a DynamicCache of layer objects holding
    key and value tensors): an object of an ordinary class, rebuilt attribute by attribute into
    a new object on every call, as eager builds a new one."""
    class Layer:
        def __init__(self, k, v):
            self.keys, self.values, self.is_initialized = k, v, True

    class Cache:
        def __init__(self):
            self.layers = []

    def fn(x):
        cache = Cache()
        cache.layers.append(Layer(x * 2, x + 1))
        return x.sum(), cache
    jf = _check(fn, torch.randn(3))
    a, b = jf(torch.randn(3))[1], jf(torch.randn(3))[1]
    assert a is not b and a.layers[0] is not b.layers[0]


def test_object_holding_a_tensor_deep_inside_is_rebuilt():
    _check(lambda x: {"h": [Holder({"deep": (1, Holder(x))})]}, torch.randn(2))


def test_object_that_refers_back_to_itself_is_fj201_with_the_return_line():
    def fn(x):
        h = Holder(x * 2)
        h.me = h
        return h   # RETURN-CYCLE
    with pytest.raises(fjit.UnsupportedInputError, match="FJ201") as info:
        fjit.jit(fn)(torch.randn(2))
    msg = str(info.value)
    assert "Holder" in msg and "refers back to itself" in msg
    assert f"test_outputs.py:{_lines_of(fn, 'RETURN-CYCLE')}:" in msg, msg


def test_lambda_closing_over_a_tensor_is_fj201():
    def fn(x):
        y = x * 3
        return x, lambda: y
    with pytest.raises(fjit.UnsupportedInputError, match="FJ201"):
        fjit.jit(fn)(torch.randn(2))


def test_dict_subclass_holding_a_tensor_is_fj201():
    class MyDict(dict):
        pass
    with pytest.raises(fjit.UnsupportedInputError, match="FJ201"):
        fjit.jit(lambda x: MyDict(a=x + 1))(torch.randn(2))


def test_check_mode_runs_every_stage_of_a_rebuilt_output(monkeypatch):
    monkeypatch.setenv("FJIT_CHECK", "1")
    _check(lambda x: ModelOutput(x.sin() * 2, x.sum(), {}), torch.randn(3))
