"""Inputs through torch.utils._pytree: whatever torch's pytree knows is an input, its structure part
of the cache key; mutating a rebuilt input container is FJ103; what pytree does not know is FJ201,
naming how to register it."""
from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree

import fjit


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    scale: float
    tag: str


pytree.register_dataclass(Batch)


class ModelOutputLike(collections.OrderedDict):
    """What Hugging Face's ModelOutput is: an OrderedDict subclass registered as a pytree node."""


pytree.register_pytree_node(
    ModelOutputLike,
    lambda o: (list(o.values()), list(o.keys())),
    lambda values, keys: ModelOutputLike(zip(keys, values)))


class Unregistered:
    def __init__(self, x):
        self.x = x


Pair = collections.namedtuple("Pair", "a b")


def _same(jf, f, *args, **kwargs):
    torch.testing.assert_close(jf(*args, **kwargs), f(*args, **kwargs))


def test_registered_dataclass_ordereddict_and_modeloutput_inputs():
    def f(batch, od, out, pair):
        return batch.x * batch.scale + od["w"] + out["logits"] * pair.a
    jf = fjit.jit(f)
    x = torch.randn(3)
    args = (Batch(x, 2.0, "a"), collections.OrderedDict(w=torch.randn(3)),
            ModelOutputLike(logits=torch.randn(3)), Pair(torch.randn(3), 1))
    _same(jf, f, *args)
    # floats inside a dataclass are runtime values: no recompile
    _same(jf, f, Batch(torch.randn(3), 3.0, "a"), *args[1:])
    assert jf.cache_info() == (1, 1, 1)
    # a constant field and the key order are part of the key
    _same(jf, f, Batch(x, 2.0, "b"), *args[1:])
    _same(jf, f, args[0], collections.OrderedDict(w=torch.randn(3), v=torch.randn(3)), *args[2:])
    assert jf.cache_info().misses == 3


def test_keyword_container_inputs_and_nested_nodes():
    def f(x, *, extra):
        return x + extra["pair"].a * extra["batch"].scale
    jf = fjit.jit(f)
    extra = {"pair": Pair(torch.randn(2), None), "batch": Batch(torch.randn(2), 0.5, "t")}
    _same(jf, f, torch.randn(2), extra=extra)


def test_dict_keys_of_any_hashable_type_and_their_types_kept_apart():
    jf = fjit.jit(lambda d: d[(1, 2)] * 2 + d[torch.float32])
    d = {(1, 2): torch.randn(2), torch.float32: torch.randn(2)}
    torch.testing.assert_close(jf(d), d[(1, 2)] * 2 + d[torch.float32])
    g = fjit.jit(lambda d: next(iter(d)))
    assert g({1: torch.randn(1)}) == 1 and type(g({True: torch.randn(1)})) is bool
    assert g.cache_info().misses == 2            # 1 and True are different keys to fjit


def test_mutating_a_rebuilt_input_container_is_fj103():
    def setitem(od):
        od["new"] = od["w"] + 1
        return od["new"]

    def setattr_(batch):
        batch.x = batch.x + 1
        return batch.x
    od = collections.OrderedDict(w=torch.randn(2))
    with pytest.raises(fjit.InputMutationError, match="FJ103.*input 'od', a OrderedDict"):
        fjit.jit(setitem)(od)
    assert list(od) == ["w"]                     # the caller's container was not touched
    with pytest.raises(fjit.InputMutationError, match="FJ103.*input 'batch', a Batch"):
        fjit.jit(setattr_)(Batch(torch.randn(2), 1.0, "t"))


def test_reading_a_rebuilt_container_is_not_a_mutation():
    def f(od):
        copy = collections.OrderedDict(od)
        copy["extra"] = od["w"] * 2
        return copy
    od = collections.OrderedDict(w=torch.randn(2))
    out = fjit.jit(f)(od)
    assert list(out) == ["w", "extra"] and type(out) is collections.OrderedDict


def test_what_pytree_does_not_know_is_fj201_naming_registration():
    with pytest.raises(fjit.UnsupportedInputError) as info:
        fjit.jit(lambda o: o.x)(Unregistered(torch.randn(2)))
    message = str(info.value)
    assert "FJ201" in message and "Unregistered" in message
    assert "register_dataclass" in message and "see sharp_edges_catalog/FJ201_object_input.py" in message


def test_pytree_contexts_are_frozen_for_the_key_and_an_unhashable_one_is_fj201():
    class Bag:
        def __init__(self, items):
            self.items = items
    pytree.register_pytree_node(Bag, lambda b: (list(b.items.values()), {"keys": list(b.items)}),
                                lambda v, c: Bag(dict(zip(c["keys"], v))))
    try:
        jf = fjit.jit(lambda b: b.items["a"] + 1)    # a dict context holding a list: frozen
        x = torch.randn(2)
        torch.testing.assert_close(jf(Bag({"a": x})), x + 1)
        jf(Bag({"a": x}))
        assert jf.cache_info() == (1, 1, 1)
    finally:
        pytree._deregister_pytree_node(Bag)
    pytree.register_pytree_node(Bag, lambda b: (list(b.items.values()), set(b.items)),
                                lambda v, c: Bag(dict(zip(sorted(c), v))))
    try:
        with pytest.raises(fjit.UnsupportedInputError, match="pytree context .set. is not hashable"):
            fjit.jit(lambda b: b.items["a"])(Bag({"a": torch.randn(1)}))
    finally:
        pytree._deregister_pytree_node(Bag)
