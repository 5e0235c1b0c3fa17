"""Proxies: the stand-ins for signature inputs that the traced function runs on.

A `TensorProxy` is a real `torch.Tensor` subclass (a storage-less wrapper, as FakeTensor and
torch.func's wrappers are), so every question a library asks of a tensor gets eager's answer:
`isinstance(x, torch.Tensor)`, `torch.is_tensor(x)`, unbound `torch.Tensor.add(x, y)`,
`hasattr(x, "weight")`, and metadata such as `is_sparse`, `layout`, `itemsize`, `nbytes`.  Every
torch call on it reaches the dispatcher through `__torch_function__` (or the tracer's mode);
anything that gets below that layer (`__torch_dispatch__`) is an error, never a silent result.

A proxy is also a mutable *handle* to an SSA `TensorVar`.  Functionalization works by moving the
handle: `x.add_(1)` records `t1 = add(t0, 1)` and points `x` at `t1`.  A view remembers its root
handle and the chain of view ops that made it; when the root moves (because it or another view of it
was written), the view is recomputed from the new root the next time it is read, so aliases stay
correct without any in-place op in the trace.  Because the handle can move to a value with other
strides or requires_grad, metadata is answered from the current `TensorVar`, never from the
wrapper's own (construction-time) fields; the fjit state lives in `_fj_*` attributes so that
`hasattr(x, name)` answers as eager for every name a library might probe.

A `NumberProxy` stands for a runtime float input.  It is deliberately *not* a float subclass: C code
(math.log, struct, numpy, '%f' formatting) reads a float subclass's value directly and would bake
the trace-time value in; an object that is not a float must be converted through `__float__`, which
specializes the trace on the value (with a guard in the cache key).  `isinstance(s, float)` still
answers True (its `__class__` is float); torch's argument parser accepts it anywhere because it has
`__torch_function__`; Python arithmetic on it is recorded.

An input list or dict is seen as an `InputList` / `InputDict`, whose mutating methods are FJ103.
"""
from __future__ import annotations

import copy
import operator

import torch

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, Tag, TensorVar
from fjit.errors import FjitError, UnsupportedOpError, located
from fjit.core.meta import meta_tensor
from fjit.frontend.context import current
from fjit.strict.locate import user_location


def _dispatch(func, args, kwargs=None):
    ctx = current()
    if ctx is None:
        raise FjitError("fjit internal error: a tracing proxy was used after its trace ended")
    return ctx.dispatch(func, args, kwargs or {})


def _metadata_via_meta(name):
    """A metadata method answered by torch's own implementation on a meta tensor of the value."""
    def method(self, *args, **kwargs):
        with torch._C.DisableTorchFunction():
            return getattr(meta_tensor(self.ir), name)(*args, **kwargs)
    method.__name__ = name
    return method


class TensorProxy(torch.Tensor):
    @staticmethod
    def __new__(cls, var: TensorVar, root: "TensorProxy | None" = None, chain: tuple | None = (),
                is_input: bool = False):
        grad = var.requires_grad and (var.dtype.is_floating_point or var.dtype.is_complex)
        self = torch.Tensor._make_wrapper_subclass(cls, var.shape, strides=var.strides,
                                                   dtype=var.dtype, device=var.device,
                                                   requires_grad=grad)
        self._fj_var = var
        self._fj_root = root        # the handle this is a view of (None: not a view)
        self._fj_chain = chain      # ((func, other_args, kwargs, base_position, output_index), ...)
        self._fj_epoch = 0          # bumped whenever this root handle is written
        self._fj_seen = root._fj_epoch if root is not None else 0
        self._fj_is_input = is_input
        return self

    def __init__(self, *args, **kwargs):
        pass

    # -- the current value ---------------------------------------------------------------------
    @property
    def ir(self) -> TensorVar:
        root = self._fj_root
        if root is not None and self._fj_seen != root._fj_epoch:
            # The root was written since this view was taken: re-derive the view from it.
            self._fj_seen = root._fj_epoch
            if self._fj_chain is None:
                raise UnsupportedOpError(located(
                    "FJ202", "fjit cannot re-derive this view after its base was written",
                    *user_location(), "clone() the tensor before taking the view"))
            value = root
            for func, args, kwargs, pos, index in self._fj_chain:
                value = _dispatch(func, (*args[:pos], value, *args[pos:]), kwargs)
                if index is not None:
                    value = value[index]
            self._fj_var = value.ir
        return self._fj_var

    def _fj_base_input(self) -> "TensorProxy | None":
        """The input handle this aliases (itself or through views), if any."""
        r = self if self._fj_root is None else self._fj_root
        return r if r._fj_is_input else None

    # -- torch's protocols: every call is traced, nothing runs on the (storage-less) wrapper ---
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise UnsupportedOpError(located(
            "FJ202", f"{func} reached fjit's proxy below torch's Python API (through a C++ path "
                     f"that skips __torch_function__), so fjit cannot trace it", *user_location(),
            "call the op through torch's Python API (torch.*, Tensor methods) or outside the "
            "compiled function"))

    # -- metadata: static for a trace, answered from the current value --------------------------
    shape = property(lambda self: torch.Size(self.ir.shape))
    dtype = property(lambda self: self.ir.dtype)
    device = property(lambda self: self.ir.device)
    ndim = property(lambda self: len(self.ir.shape))
    # `t.requires_grad = flag` is `t.requires_grad_(flag)`, as in eager (transformers' Wav2Vec2 sets
    # it on a view of its input for gradient checkpointing)
    requires_grad = property(lambda self: self.ir.requires_grad, lambda self, flag: self.requires_grad_(flag))
    is_cuda = property(lambda self: self.ir.device.type == "cuda")
    is_cpu = property(lambda self: self.ir.device.type == "cpu")
    is_meta = property(lambda self: False)
    is_leaf = property(lambda self: self._fj_is_input or not self.ir.requires_grad)
    layout = property(lambda self: torch.strided)
    itemsize = property(lambda self: self.ir.dtype.itemsize)
    nbytes = property(lambda self: self.ir.numel() * self.ir.dtype.itemsize)

    @property
    def grad(self):
        raise UnsupportedOpError(located(
            "FJ202", ".grad of a tensor inside a compiled function is the gradient of an earlier "
                     "backward, a value fjit would freeze", *user_location(),
            "pass the gradient in as an argument"))

    @grad.setter
    def grad(self, value):
        # a value the function computed has no gradient to clear; an input's is the caller's state
        if value is None and self._fj_base_input() is None:
            return
        raise UnsupportedOpError(located(
            "FJ202", "assigning .grad inside a compiled function changes the state of an earlier "
                     "backward, which a compiled call would not repeat", *user_location(),
            "set or clear .grad outside the compiled function"))

    is_contiguous = _metadata_via_meta("is_contiguous")
    is_floating_point = _metadata_via_meta("is_floating_point")
    is_complex = _metadata_via_meta("is_complex")
    element_size = _metadata_via_meta("element_size")
    is_signed = _metadata_via_meta("is_signed")
    has_names = _metadata_via_meta("has_names")

    # sizes library code asks often, answered from the value itself
    def dim(self):
        return len(self.ir.shape)

    ndimension = dim

    def numel(self):
        return self.ir.numel()

    nelement = numel

    def size(self, dim=None):
        shape = torch.Size(self.ir.shape)
        return shape if dim is None else shape[dim]

    def stride(self, dim=None):
        strides = self.ir.strides
        return strides if dim is None else strides[dim]

    def get_device(self):
        return self.ir.device.index if self.ir.device.type != "cpu" else -1

    def __len__(self):
        if not self.ir.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.ir.shape[0]

    def __iter__(self):
        return iter(_dispatch(torch.Tensor.unbind, (self, 0)))

    def __hash__(self):
        return id(self)

    # An alias that autograd does not see through (writes to it reach the base: FJ102 on inputs).
    @property
    def data(self):
        return _dispatch(torch.Tensor.detach, (self,))

    @data.setter
    def data(self, value):
        _dispatch(set_data, (self, value))


def set_data(x, value):
    """What `x.data = value` does (a marker for the dispatcher, never called)."""
    raise AssertionError("fjit: set_data is traced, never run")


# ----------------------------------------------------------------------------------------------
# Runtime numbers
# ----------------------------------------------------------------------------------------------

def _number_symbol(op) -> Symbol:
    return Symbol(f"operator.{op.__name__}", op, frozenset({Tag.NUMBER}))


def _value_of(x):
    return x.concrete() if isinstance(x, NumberProxy) else x


def _number_op(sym: Symbol, op, *operands):
    ctx = current()
    values = [x._fj_value if type(x) is NumberProxy else x for x in operands]
    result = op(*values)
    if ctx is None or not isinstance(result, float):
        return result
    var = NumberVar(ctx.new_name("n"))
    args = tuple(x.ir if type(x) is NumberProxy else x for x in operands)
    ctx.record(BoundSymbol(sym, args, {}, var))
    sources = frozenset().union(*(x._fj_sources for x in operands if type(x) is NumberProxy))
    return NumberProxy(result, var, sources)


def _number_binary(op, reflected: bool):
    sym = _number_symbol(op)

    def method(self, other):
        if type(other) not in (int, float, bool) and type(other) is not NumberProxy:
            return NotImplemented    # a tensor (its reflected op traces it), or anything else
        a, b = (other, self) if reflected else (self, other)
        return _number_op(sym, op, a, b)
    return method


def _number_unary(op):
    sym = _number_symbol(op)

    def method(self):
        return _number_op(sym, op, self)
    return method


def _number_compare(op):
    def method(self, other):
        if isinstance(other, torch.Tensor):
            return NotImplemented   # `s < x` is x's reflected op, a traced tensor comparison
        # A Python bool decides control flow: the trace specializes on this float.
        return op(self.concrete(), _value_of(other))
    return method


class NumberProxy:
    """A runtime float: its trace-time value plus the input positions it was computed from.

    Whatever takes its value out of the trace (float(), int(), math.*, str(), a comparison, a hash,
    any float method) goes through `concrete()`, which makes the trace depend on the value: the
    positions it came from join the cache key, so a new value recompiles instead of reusing a
    stale one."""

    __slots__ = ("_fj_value", "ir", "_fj_sources")

    def __init__(self, value: float, var: NumberVar, sources: frozenset):
        self._fj_value = float(value)
        self.ir = var
        self._fj_sources = sources

    # isinstance(s, float) and isinstance(s, numbers.Real) answer as for the float it stands for.
    __class__ = property(lambda self: float)

    def concrete(self) -> float:
        """The trace-time value; the trace now depends on it, so it is guarded by the cache key."""
        ctx = current()
        if ctx is not None:
            ctx.specialized |= self._fj_sources
        return self._fj_value

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs)

    def __float__(self):
        return self.concrete()

    def __int__(self):
        return int(self.concrete())

    def __bool__(self):
        return bool(self.concrete())

    def __hash__(self):
        return hash(self.concrete())

    def __repr__(self):
        return repr(self.concrete())

    __str__ = __repr__

    def __format__(self, spec):
        return format(self.concrete(), spec)

    def __round__(self, n=None):
        return round(self.concrete(), n)

    def __complex__(self):
        return complex(self.concrete())

    def __trunc__(self):
        return self.concrete().__trunc__()

    def __floor__(self):
        return self.concrete().__floor__()

    def __ceil__(self):
        return self.concrete().__ceil__()

    def __divmod__(self, other):
        return divmod(self.concrete(), _value_of(other))

    def __rdivmod__(self, other):
        return divmod(_value_of(other), self.concrete())

    def __getattr__(self, name):
        # Every other float attribute (is_integer, as_integer_ratio, hex, real, ...) reads the value.
        if name.startswith("_fj_"):
            raise AttributeError(name)
        return getattr(self.concrete(), name)

    def __reduce__(self):
        return (float, (self.concrete(),))

    # Arithmetic is recorded where its result is a float (see _number_op).
    __add__, __radd__ = _number_binary(operator.add, False), _number_binary(operator.add, True)
    __sub__, __rsub__ = _number_binary(operator.sub, False), _number_binary(operator.sub, True)
    __mul__, __rmul__ = _number_binary(operator.mul, False), _number_binary(operator.mul, True)
    __truediv__ = _number_binary(operator.truediv, False)
    __rtruediv__ = _number_binary(operator.truediv, True)
    __floordiv__ = _number_binary(operator.floordiv, False)
    __rfloordiv__ = _number_binary(operator.floordiv, True)
    __mod__, __rmod__ = _number_binary(operator.mod, False), _number_binary(operator.mod, True)
    __pow__, __rpow__ = _number_binary(operator.pow, False), _number_binary(operator.pow, True)
    __neg__ = _number_unary(operator.neg)
    __pos__ = _number_unary(operator.pos)
    __abs__ = _number_unary(operator.abs)

    __eq__ = _number_compare(operator.eq)
    __ne__ = _number_compare(operator.ne)
    __lt__ = _number_compare(operator.lt)
    __le__ = _number_compare(operator.le)
    __gt__ = _number_compare(operator.gt)
    __ge__ = _number_compare(operator.ge)


# ----------------------------------------------------------------------------------------------
# Read-only input containers (FJ103)
# ----------------------------------------------------------------------------------------------

def _container_edge(kind: str, method: str):
    entry = "FJ103_list_append" if kind == "list" else "FJ103_dict_setitem"

    def mutate(self, *args, **kwargs):
        if not _writes_same_values(self, method, args, kwargs):
            current().sharp_edge(entry, f"{method}() on an input {kind} of '{current().fn_name}'; "
                                        f"compiled code would not see the change on later calls")
        return getattr(list if kind == "list" else dict, method)(self, *args, **kwargs)
    mutate.__name__ = method
    return mutate


def _writes_same_values(container, method: str, args, kwargs) -> bool:
    """A dict write that stores, under every key, the very object already there changes nothing
    (torch.func.functional_call writes its parameter dict back this way): not a mutation."""
    if not isinstance(container, dict) or method not in ("update", "__setitem__"):
        return False
    if method == "__setitem__":
        items = [args]
    elif len(args) == 1 and isinstance(args[0], dict) or not args:
        items = list((args[0] if args else {}).items()) + list(kwargs.items())
    else:
        return False
    return all(k in container and dict.__getitem__(container, k) is v for k, v in items)


# A copy is the function's own container: mutating it touches nothing the caller holds, so
# copy.copy / copy.deepcopy return a plain list/dict (as list.copy() and dict(d) already do), not
# another read-only input.  (Without these, copy's __reduce_ex__ path rebuilds an InputList.)
def _plain_copy(kind):
    def __copy__(self):
        return kind(self)
    return __copy__


def _plain_deepcopy(kind):
    def __deepcopy__(self, memo):
        if kind is list:
            out = memo[id(self)] = []
            out.extend(copy.deepcopy(v, memo) for v in self)
        else:
            out = memo[id(self)] = {}
            out.update((copy.deepcopy(k, memo), copy.deepcopy(v, memo)) for k, v in self.items())
        return out
    return __deepcopy__


class InputList(list):
    """An input list seen by the traced function: mutating it is FJ103.  In the permissive modes the
    mutation applies to this trace-private copy, never to the caller's list."""

    append = _container_edge("list", "append")
    extend = _container_edge("list", "extend")
    insert = _container_edge("list", "insert")
    pop = _container_edge("list", "pop")
    remove = _container_edge("list", "remove")
    clear = _container_edge("list", "clear")
    sort = _container_edge("list", "sort")
    reverse = _container_edge("list", "reverse")
    __setitem__ = _container_edge("list", "__setitem__")
    __delitem__ = _container_edge("list", "__delitem__")
    __iadd__ = _container_edge("list", "__iadd__")
    __imul__ = _container_edge("list", "__imul__")
    __copy__, __deepcopy__ = _plain_copy(list), _plain_deepcopy(list)


class InputDict(dict):
    """An input dict seen by the traced function: mutating it is FJ103 (see InputList)."""

    __setitem__ = _container_edge("dict", "__setitem__")
    __delitem__ = _container_edge("dict", "__delitem__")
    pop = _container_edge("dict", "pop")
    popitem = _container_edge("dict", "popitem")
    clear = _container_edge("dict", "clear")
    update = _container_edge("dict", "update")
    setdefault = _container_edge("dict", "setdefault")
    __ior__ = _container_edge("dict", "__ior__")
    __copy__, __deepcopy__ = _plain_copy(dict), _plain_deepcopy(dict)
