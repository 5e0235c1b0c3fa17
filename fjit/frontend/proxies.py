"""Proxies: the stand-ins for signature inputs that the traced function runs on.

A `TensorProxy` is a mutable *handle* to an SSA `TensorVar`.  Functionalization works by moving the
handle: `x.add_(1)` records `t1 = add(t0, 1)` and points `x` at `t1`.  A view remembers its root
handle and the chain of view ops that made it; when the root moves (because it or another view of it
was written), the view is recomputed from the new root the next time it is read, so aliases stay
correct without any in-place op in the trace.

A `NumberProxy` is a float subclass (so torch's argument parser accepts it) standing for a runtime
float input; Python arithmetic on it is recorded, and using it for control flow specializes the trace
on its value.
"""
from __future__ import annotations

import copy
import operator

import torch

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, Tag, TensorVar
from fjit.errors import UnsupportedOpError
from fjit.frontend.context import current
from fjit.frontend.meta import meta_tensor

# Metadata that is static for a trace: answered from the proxy, never recorded.
_STATIC_METHODS = {"size", "dim", "ndimension", "numel", "nelement", "stride", "is_contiguous",
                   "is_floating_point", "is_complex", "element_size", "get_device", "is_signed",
                   "has_names", "is_sparse", "is_quantized", "is_meta"}


class TensorProxy:
    __slots__ = ("_var", "root", "chain", "seen_epoch", "epoch", "is_input", "__weakref__")

    def __init__(self, var: TensorVar, root: "TensorProxy | None" = None, chain: tuple = (),
                 is_input: bool = False):
        self._var = var
        self.root = root            # the handle this is a view of (None: not a view)
        self.chain = chain          # ((func, other_args, kwargs, base_position, output_index), ...)
        self.epoch = 0              # bumped whenever this root handle is written
        self.seen_epoch = root.epoch if root is not None else 0
        self.is_input = is_input

    # -- the current value ---------------------------------------------------------------------
    @property
    def ir(self) -> TensorVar:
        root = self.root
        if root is not None and self.seen_epoch != root.epoch:
            # The root was written since this view was taken: re-derive the view from it.
            self.seen_epoch = root.epoch
            if self.chain is None:
                raise UnsupportedOpError(
                    "fjit cannot re-derive this view after its base was written; clone() the "
                    "tensor before taking the view")
            value = root
            for func, args, kwargs, pos, index in self.chain:
                value = current().dispatch(func, (*args[:pos], value, *args[pos:]), kwargs)
                if index is not None:
                    value = value[index]
            self._var = value.ir
        return self._var

    def base_input(self) -> "TensorProxy | None":
        """The input handle this aliases (itself or through views), if any."""
        r = self if self.root is None else self.root
        return r if r.is_input else None

    # -- static metadata -----------------------------------------------------------------------
    shape = property(lambda self: torch.Size(self.ir.shape))
    dtype = property(lambda self: self.ir.dtype)
    device = property(lambda self: self.ir.device)
    ndim = property(lambda self: len(self.ir.shape))
    requires_grad = property(lambda self: self.ir.requires_grad)
    is_cuda = property(lambda self: self.ir.device.type == "cuda")
    is_cpu = property(lambda self: self.ir.device.type == "cpu")
    layout = property(lambda self: torch.strided)
    is_leaf = property(lambda self: True)
    grad = property(lambda self: None)

    def __len__(self):
        if not self.ir.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.ir.shape[0]

    def __iter__(self):
        return iter(self.unbind(0))

    def __hash__(self):
        return id(self)

    def __repr__(self):
        v = self.ir
        return f"TensorProxy({v.name}: {v.type_string()})"

    __str__ = __repr__

    def __format__(self, spec):
        return repr(self)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return current().dispatch(func, args, kwargs or {})

    def __getattr__(self, name):
        attr = getattr(torch.Tensor, name, None)
        if name in _STATIC_METHODS:
            return _static_method(self, name)
        if attr is None or not callable(attr):
            raise UnsupportedOpError(
                f"fjit cannot trace tensor attribute {name!r}; compute it from the tensor's "
                f"shape/dtype or pass it in")
        dispatch = current().dispatch
        return lambda *args, **kwargs: dispatch(attr, (self, *args), kwargs)

    # Data-dependent conversions (FJ106) are caught in the dispatcher; these route there.
    def __bool__(self):
        return current().dispatch(torch.Tensor.__bool__, (self,), {})

    def __int__(self):
        return current().dispatch(torch.Tensor.__int__, (self,), {})

    def __float__(self):
        return current().dispatch(torch.Tensor.__float__, (self,), {})

    def __index__(self):
        return current().dispatch(torch.Tensor.__index__, (self,), {})

    def __complex__(self):
        return current().dispatch(torch.Tensor.__complex__, (self,), {})

    def __array__(self, *args, **kwargs):
        return current().dispatch(torch.Tensor.numpy, (self,), {})

    # Properties that are ops.
    T = property(lambda self: current().dispatch(torch.Tensor.T.__get__, (self,), {}))
    mT = property(lambda self: current().dispatch(torch.Tensor.mT.__get__, (self,), {}))
    real = property(lambda self: current().dispatch(torch.Tensor.real.__get__, (self,), {}))
    imag = property(lambda self: current().dispatch(torch.Tensor.imag.__get__, (self,), {}))
    data = property(lambda self: self)   # shares storage: writes through .data are writes to self


def _static_method(proxy: TensorProxy, name: str):
    def static(*args, **kwargs):
        v = proxy.ir
        if name == "get_device":
            return v.device.index if v.device.type != "cpu" else -1
        with torch._C.DisableTorchFunction():
            return getattr(meta_tensor(v), name)(*args, **kwargs)
    return static


def _tensor_dunder(name):
    func = getattr(torch.Tensor, name)

    def method(self, *args):
        return current().dispatch(func, (self, *args), {})
    method.__name__ = name
    return method


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
              "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
              "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__",
              "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__",
              "__neg__", "__pos__", "__abs__", "__invert__", "__eq__", "__ne__", "__lt__", "__le__",
              "__gt__", "__ge__", "__getitem__", "__setitem__", "__iadd__", "__isub__", "__imul__",
              "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__",
              "__ixor__", "__ilshift__", "__irshift__"):
    if hasattr(torch.Tensor, _name):
        setattr(TensorProxy, _name, _tensor_dunder(_name))
TensorProxy.__imatmul__ = lambda self, other: current().dispatch(torch.Tensor.__matmul__, (self, other), {})


# ----------------------------------------------------------------------------------------------
# Runtime numbers
# ----------------------------------------------------------------------------------------------

def _number_symbol(op) -> Symbol:
    return Symbol(f"operator.{op.__name__}", op, frozenset({Tag.NUMBER}))


class NumberProxy(float):
    """A runtime float: its trace-time value plus the input positions it was computed from."""

    __slots__ = ("ir", "sources")

    def __new__(cls, value: float, var: NumberVar, sources: frozenset):
        self = float.__new__(cls, value)
        self.ir = var
        self.sources = sources
        return self

    def concrete(self) -> float:
        """The trace-time value; the trace now depends on it, so it is guarded by the cache key."""
        ctx = current()
        if ctx is not None:
            ctx.specialized |= self.sources
        return float.__float__(self)

    def __repr__(self):
        return f"NumberProxy({self.ir.name}={float.__repr__(self)})"

    def __bool__(self):
        return bool(self.concrete())

    def __float__(self):
        return self.concrete()

    def __int__(self):
        return int(self.concrete())

    def __hash__(self):
        return hash(self.concrete())

    def __round__(self, n=None):
        return round(self.concrete(), n)

    def __format__(self, spec):
        return format(self.concrete(), spec)

    __str__ = __repr__
    __trunc__ = lambda self: int(self.concrete())   # noqa: E731


def _number_binary(op, reflected: bool):
    sym = _number_symbol(op)

    def method(self, other):
        if isinstance(other, TensorProxy):
            return NotImplemented
        if type(other) not in (int, float, bool) and not isinstance(other, NumberProxy):
            return NotImplemented
        a, b = (other, self) if reflected else (self, other)
        return _number_op(sym, op, a, b)
    return method


def _number_op(sym: Symbol, op, *operands):
    ctx = current()
    values = [float.__float__(x) if isinstance(x, NumberProxy) else x for x in operands]
    result = op(*values)
    if ctx is None or not isinstance(result, float):
        return result
    var = NumberVar(ctx.new_name("n"))
    args = tuple(x.ir if isinstance(x, NumberProxy) else x for x in operands)
    ctx.record(BoundSymbol(sym, args, {}, var))
    sources = frozenset().union(*(x.sources for x in operands if isinstance(x, NumberProxy)))
    return NumberProxy(result, var, sources)


for _op, _names in ((operator.add, ("__add__", "__radd__")), (operator.sub, ("__sub__", "__rsub__")),
                    (operator.mul, ("__mul__", "__rmul__")),
                    (operator.truediv, ("__truediv__", "__rtruediv__")),
                    (operator.floordiv, ("__floordiv__", "__rfloordiv__")),
                    (operator.mod, ("__mod__", "__rmod__")), (operator.pow, ("__pow__", "__rpow__"))):
    setattr(NumberProxy, _names[0], _number_binary(_op, False))
    setattr(NumberProxy, _names[1], _number_binary(_op, True))
for _op, _name in ((operator.neg, "__neg__"), (operator.pos, "__pos__"), (operator.abs, "__abs__")):
    setattr(NumberProxy, _name, (lambda op, sym: lambda self: _number_op(sym, op, self))(_op, _number_symbol(_op)))


def _number_compare(name: str):
    def method(self, other):
        if isinstance(other, TensorProxy):
            return NotImplemented   # `s < x` is x's reflected op, a traced tensor comparison
        # A Python bool decides control flow: the trace specializes on this float.
        return getattr(float, name)(self.concrete(),
                                    float(other) if isinstance(other, NumberProxy) else other)
    return method


for _name in ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"):
    setattr(NumberProxy, _name, _number_compare(_name))


# ----------------------------------------------------------------------------------------------
# Read-only input containers (FJ103)
# ----------------------------------------------------------------------------------------------

def _container_edge(kind: str, method: str):
    entry = "FJ103_list_append" if kind == "list" else "FJ103_dict_setitem"

    def mutate(self, *args, **kwargs):
        current().sharp_edge(entry, f"{method}() on an input {kind} of '{current().fn_name}'; "
                                    f"compiled code would not see the change on later calls")
        return getattr(list if kind == "list" else dict, method)(self, *args, **kwargs)
    mutate.__name__ = method
    return mutate


class InputList(list):
    """An input list seen by the traced function: mutating it is FJ103.  In the permissive modes the
    mutation applies to this trace-private copy, never to the caller's list."""


class InputDict(dict):
    """An input dict seen by the traced function: mutating it is FJ103 (see InputList)."""


for _m in ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse", "__setitem__",
           "__delitem__", "__iadd__", "__imul__"):
    setattr(InputList, _m, _container_edge("list", _m))
for _m in ("__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault", "__ior__"):
    setattr(InputDict, _m, _container_edge("dict", _m))


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


InputList.__copy__, InputList.__deepcopy__ = _plain_copy(list), _plain_deepcopy(list)
InputDict.__copy__, InputDict.__deepcopy__ = _plain_copy(dict), _plain_deepcopy(dict)
