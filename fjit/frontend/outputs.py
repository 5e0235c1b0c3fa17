"""Outputs: what the traced function returned, as the trace's output plus how to rebuild it.

The caller must get what eager returns (the design contract's section 2, "Outputs", in
../shared/DESIGN.md outside the repository): same types, same field values, same keys in the same
order, and never a proxy.  Plain tuples, lists, dicts with literal keys and namedtuples of traced
values print as themselves in the trace's `return`, which stays readable and costs nothing more per
call.  Anything else (dataclasses, SimpleNamespace, OrderedDict,
dicts with dtype or tuple keys, torch.Size, nodes registered with `torch.utils._pytree`) is flattened
to its traced values: the trace returns `rebuild(t3, t5)`, a function generated once per trace that
builds the caller's structure from the flat values, so a cached call pays one Python call for it.

Structure is read with `torch.utils._pytree`'s registry first (the user's registrations win), then
fjit's own rules for dataclasses and SimpleNamespace.  A value fjit cannot rebuild (an arbitrary
object or a closure holding a tensor, an iterator) is FJ201 at compile time, with the line of the
`return`; an object holding no tensor is returned as the constant eager would return.
"""
from __future__ import annotations

import dataclasses
import gc
import operator
import types

import torch
import torch.utils._pytree as pytree

from fjit.core.ir import BoundSymbol, NumberVar, Symbol, Tag, is_structseq, map_values
from fjit.errors import UnsupportedInputError, located
from fjit.frontend.proxies import InputDict, InputList, NumberProxy, TensorProxy
from fjit.frontend.record import capture_outside_tensor

RETURNABLE = ("tensors, numbers, strings, None, dtypes, devices, torch.Size, and tuples, lists, "
              "dicts, namedtuples, OrderedDicts, dataclasses, SimpleNamespaces and "
              "torch.utils._pytree nodes of these, or objects that hold no tensor")

_LITERALS = (type(None), bool, int, str)          # print as themselves in generated source
_PLAIN_KEYS = (str, int, bool, type(None))        # the dict keys TracePrinter prints literally
_PLAIN_LEAVES = (type(None), bool, int, float, str, torch.dtype, torch.device)
# A size of a symbolic trace (x.shape[1], x.numel() // 2, x.shape[0] > 1) is a value of the call,
# as a tensor is: the trace computes it from its symbols, `n3 = operator.index(s0*s1)`, a number
# output like any other (a joint program returns it too).  Returned as a constant, every later call
# got the trace's symbol object in place of its own size.  (operator.pos keeps a float a float.)
# type -> (the op computing it, the Python type of its value)
_SIZE_VALUES = {t: (Symbol(f"operator.{fn.__name__}", fn, frozenset({Tag.NUMBER})), py)
                for t, fn, py in ((torch.SymInt, operator.index, int), (torch.SymFloat, operator.pos, float),
                                  (torch.SymBool, operator.truth, bool))}
_TRACED = (TensorProxy, NumberProxy, torch.Tensor, *_SIZE_VALUES)


def output_structure(ctx, result, where):
    """(the trace's output, rebuild or None).  `where` is the (file, line) of the user's return.

    With rebuild None the output is the caller's structure itself (it prints as Python); otherwise
    it is a flat tuple of traced values and `rebuild(*values)` gives the caller's structure."""
    check_rebuilt_inputs(ctx, where)
    def leaf(x):
        if isinstance(x, (TensorProxy, NumberProxy)):
            return x.ir
        if isinstance(x, torch.Tensor):
            return capture_outside_tensor(ctx, x).ir      # a tensor from outside the signature: FJ101's path
        size_value = _SIZE_VALUES.get(type(x))
        if size_value is not None:
            sym, pytype = size_value
            var = NumberVar(ctx.new_name("n"), pytype)
            ctx.record(BoundSymbol(sym, (x,), {}, var))
            return var
        return x

    if _plain(result):
        return map_values(leaf, _plain_containers(result)), None
    builder = _Builder(where)
    body = builder.expr(result)
    return tuple(leaf(x) for x in builder.leaves), builder.function(body)


def check_rebuilt_inputs(ctx, where) -> None:
    """FJ103 for an input container that the function changed, among those make_proxies rebuilt
    with their pytree unflatten (an OrderedDict, a registered dataclass, ...) and the input lists
    and dicts: eager changes the caller's object, a compiled call would not.  (Input lists and
    dicts report their mutations where they happen, through their methods or the observer; a
    write that bypasses both is seen here.)  Seen at the end of the run, so reported at the
    `return`."""
    for obj, node, children, label in getattr(ctx, "rebuilt_inputs", ()):
        # node None: an input list or dict, whose methods report their own mutations; what
        # reaches here was written around them (dict.__setitem__(d, k, v), unbound)
        now = node.flatten_fn(obj)[0] if node is not None else \
            [y for item in obj.items() for y in item] if isinstance(obj, dict) else list(obj)
        if len(now) != len(children) or any(a is not b for a, b in zip(now, children)):
            kind = "dict" if isinstance(obj, dict) else "list"
            ctx.sharp_edge(f"FJ103_{'dict_setitem' if kind == 'dict' else 'list_append'}",
                           f"input '{label}', a {kind if node is None else type(obj).__qualname__}, was changed by "
                           f"'{ctx.fn_name}'; compiled code would not see the change on later calls",
                           where)


def _plain(x) -> bool:
    t = type(x)
    if isinstance(x, _TRACED):
        return True
    if t in _PLAIN_LEAVES:
        return True
    if t is tuple or t is list or t is InputList or (isinstance(x, tuple) and hasattr(t, "_fields")) \
            or is_structseq(x):
        return all(_plain(y) for y in x)
    if t is dict or t is InputDict:
        return all(type(k) in _PLAIN_KEYS for k in x) and all(_plain(v) for v in x.values())
    return False


def _plain_containers(x):
    if isinstance(x, InputList):
        return [_plain_containers(y) for y in x]
    if isinstance(x, InputDict):
        return {k: _plain_containers(v) for k, v in x.items()}
    if type(x) in (list, tuple):
        return type(x)(_plain_containers(y) for y in x)
    if type(x) is dict:
        return {k: _plain_containers(v) for k, v in x.items()}
    return x


def _restore(cls, attributes: dict):
    """An instance of `cls` with exactly these attributes, as the traced run made it: no __init__
    or __post_init__ runs again (they ran while tracing), and a frozen dataclass is filled too."""
    obj = cls.__new__(cls)
    for name, value in attributes.items():
        if isinstance(getattr(cls, name, None), types.MemberDescriptorType):    # a __slots__ slot
            object.__setattr__(obj, name, value)
        else:
            obj.__dict__[name] = value
    return obj


class _Builder:
    """Walks the returned value once, collecting the traced leaves and writing the Python
    expression that rebuilds the value from them (`l0, l1, ...`)."""

    def __init__(self, where):
        self.where = where
        self.leaves: list = []
        self.ns: dict = {"_restore": _restore}
        self.types: list[str] = []
        self.open: set[int] = set()      # objects being rebuilt: a cycle cannot be

    def name(self, value, prefix: str) -> str:
        n = f"{prefix}{len(self.ns)}"
        self.ns[n] = value
        return n

    def constant(self, x) -> str:
        if type(x) in _LITERALS:
            return repr(x)
        return self.name(x, "_k")

    def expr(self, x) -> str:
        t = type(x)
        if isinstance(x, _TRACED):
            self.leaves.append(x)
            return f"l{len(self.leaves) - 1}"
        if t is tuple:
            inner = ", ".join(self.expr(y) for y in x)
            return f"({inner},)" if len(x) == 1 else f"({inner})"
        if t is list or t is InputList:
            return "[" + ", ".join(self.expr(y) for y in x) + "]"
        if t is dict or t is InputDict:
            return "{" + ", ".join(f"{self.constant(k)}: {self.expr(v)}" for k, v in x.items()) + "}"
        if t is torch.Size:           # pytree's own Size node rebuilds a plain tuple
            self.types.append("Size")
            return f"{self.name(torch.Size, '_t')}([{', '.join(self.expr(y) for y in x)}])"
        node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(x))
        if node is not None:          # the registry first: a user's registration wins
            self.types.append(t.__qualname__)
            children, context = node.flatten_fn(x)
            return (f"{self.name(node.unflatten_fn, '_u')}([{', '.join(self.expr(c) for c in children)}], "
                    f"{self.name(context, '_x')})")
        if (dataclasses.is_dataclass(x) and not isinstance(x, type)) or \
                isinstance(x, types.SimpleNamespace) or (_plain_object(x) and _reaches_tensor(x)):
            # Rebuilt attribute by attribute, a new object per call: dataclasses, namespaces and
            # objects of ordinary classes holding traced values (transformers' DynamicCache)
            if id(x) in self.open:
                raise self.error(x, "an object that refers back to itself, which fjit cannot "
                                    "rebuild", "return the tensors in a dict or dataclass")
            self.open.add(id(x))
            self.types.append(t.__qualname__)
            inner = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in _attributes(x).items())
            self.open.discard(id(x))
            return f"_restore({self.name(t, '_t')}, {{{inner}}})"
        self.check_constant(x)
        return self.constant(x)

    def check_constant(self, x) -> None:
        """A leaf returned as a constant: the same object on every call, as eager would return an
        object it did not build.  Not if it holds a traced value or is an iterator."""
        t = type(x)
        if t in _PLAIN_LEAVES or isinstance(x, (type, types.ModuleType)):
            return
        if hasattr(t, "__next__") or isinstance(x, (types.GeneratorType, types.CoroutineType,
                                                   types.AsyncGeneratorType)):
            raise self.error(x, "an iterator or generator, which a compiled call would return "
                                "once, already consumed, on every call",
                             "return a list or tuple (list(gen)) instead of the generator")
        if _reaches_tensor(x):
            raise self.error(x, "an object that holds a tensor, which fjit cannot rebuild",
                             "return the tensors in a dataclass, SimpleNamespace, namedtuple or "
                             "dict (or register the class with "
                             "torch.utils._pytree.register_pytree_node)")

    def error(self, x, what: str, fix: str) -> UnsupportedInputError:
        t = type(x)
        name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
        return UnsupportedInputError(located(
            "FJ201", f"the function returns a {name}, {what}; fjit returns {RETURNABLE}",
            *self.where, fix))

    def function(self, body: str):
        params = ", ".join(f"l{i}" for i in range(len(self.leaves)))
        source = f"def rebuild({params}):\n    return {body}\n"
        exec(compile(source, "<fjit output rebuild>", "exec"), self.ns)
        fn = self.ns.pop("rebuild")
        fn.__doc__ = ", ".join(dict.fromkeys(self.types)) or "the returned structure"
        return fn


def _plain_object(x) -> bool:
    """An instance of an ordinary Python class whose whole state is its attributes: what
    `_restore` can rebuild.  Not functions, modules, types, iterators, nn.Modules (their tensors
    are parameters, not results) or builtin/C types."""
    t = type(x)
    if t.__module__ == "builtins" or isinstance(x, (type, types.ModuleType, types.FunctionType,
                                                     types.MethodType, torch.nn.Module)):
        return False
    if hasattr(t, "__next__") or not hasattr(x, "__dict__"):
        return False
    # Every base between the class and object must be a Python class (no C state to lose).
    return all(hasattr(b, "__dict__") and b.__flags__ & (1 << 9) for b in t.__mro__[:-1])


def _attributes(x) -> dict:
    """An object's attributes: its __dict__, then any __slots__ that are set."""
    attributes = dict(getattr(x, "__dict__", {}))
    for b in type(x).__mro__:
        for slot in getattr(b, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(x, slot):
                attributes[slot] = getattr(x, slot)
    return attributes


_OPAQUE = (str, bytes, int, float, complex, bool, type(None), type, types.ModuleType,
           types.CodeType, torch.dtype, torch.device, torch.Size)


def _reaches_tensor(x) -> bool:
    """Whether a tensor or proxy is reachable from `x`: a full walk of what it refers to, through
    attributes, items, closure cells and generator frames, but not through a function's globals
    (module state is not what the function returned)."""
    seen: set = set()
    stack = [x]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _OPAQUE):
            continue
        seen.add(id(o))
        if isinstance(o, (TensorProxy, torch.Tensor)):
            return True
        if isinstance(o, types.FunctionType):
            stack.extend(c.cell_contents for c in o.__closure__ or () if _full(c))
            stack.extend(o.__defaults__ or ())
            stack.extend((o.__kwdefaults__ or {}).values())
        elif isinstance(o, types.FrameType):
            stack.extend(o.f_locals.values())
        elif isinstance(o, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
            frame = getattr(o, "gi_frame", None) or getattr(o, "cr_frame", None) or \
                getattr(o, "ag_frame", None)
            if frame is not None:
                stack.extend(frame.f_locals.values())
        elif type(o) is dict and "__builtins__" in o:   # a module's globals
            continue
        else:
            stack.extend(gc.get_referents(o))
    return False


def _full(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True
