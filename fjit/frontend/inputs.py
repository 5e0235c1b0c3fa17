"""Signature inputs: validation (FJ201), the cache key, and the proxies a trace runs on.

One walk over the call's arguments yields both the cache key (the metadata that a compiled program
depends on) and the flat list of runtime values (tensors and floats) that the program takes.
Containers are walked with `torch.utils._pytree`'s registry: whatever torch's pytree can flatten
(tuples, lists, dicts, namedtuples, OrderedDicts, defaultdicts, deques, torch.return_types and
every node a user registers: dataclasses, Hugging Face ModelOutput, ...) is an input, its type and
pytree context part of the key.  Plain tuples, lists and dicts take a shortcut that gives the
registry's answer without calling it.  A generated fast path (`fast_path`) stands in front of this
walk for the common flat signature, so a cached call does not walk at all.
"""
from __future__ import annotations

import collections
import keyword
import re

import torch
import torch.autograd.forward_ad as _forward_ad
import torch.utils._pytree as pytree

from fjit.core.ir import NumberVar, TensorVar
from fjit.core.symbolic import active
from fjit.core.generated import compile_function
from fjit.errors import UnsupportedInputError, catalog_fix, catalog_ref, hint_for, located
from fjit.frontend.context import autocast_key
from fjit.frontend.proxies import InputDict, InputList, NumberProxy, TensorProxy
from fjit.strict.locate import user_location

ACCEPTED = ("torch.Tensor, int, float, bool, str, None, torch.dtype, torch.device, slice, Ellipsis, "
            "torch.Size, and tuples, lists, dicts, namedtuples, OrderedDicts and other "
            "torch.utils._pytree nodes of these")

_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)
_CONSTANT_TYPES = (int, bool, str, type(None), torch.dtype, torch.device, torch.Size,
                   type(Ellipsis))

# A torch.func transform (vmap, grad, jvp, ...) hands its function tensors wrapped in its own
# (BatchedTensor, GradTrackingTensor), whose type is still torch.Tensor and whose metadata is the
# unbatched value's; forward-mode AD gives a tensor a tangent.  A program's kernels can read
# neither, and a program would compute one example or drop the tangent: JittedFunction runs its
# program's torch form on them instead (api.JittedFunction._call_transformed), and the key never
# sees one (checked only while a transform or a dual level is active).
_interpreter_stack = torch._C._functorch.peek_interpreter_stack
_functorch_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


def transformed() -> bool:
    """Whether a torch.func transform or a forward-mode AD dual level is active in this thread."""
    return _interpreter_stack() is not None or _forward_ad._current_level >= 0


def transform_tensor(x: torch.Tensor) -> bool:
    """Whether `x` is a torch.func transform's wrapper or a dual tensor carrying a tangent."""
    return _functorch_wrapped(x) or (_forward_ad._current_level >= 0 and
                                     _forward_ad.unpack_dual(x).tangent is not None)


# What a compiled program depends on in a tensor, as attribute expressions: the general path's key
# function and the generated fast path are both made from this one list.  The conjugate and
# negative bits (x.conj(), x.conj().imag) are there because the trace answers is_conj() and
# resolve_conj() from them, and kernels read raw data, which does not hold them.
_TENSOR_KEY = ("shape", "stride()", "dtype", "device", "requires_grad", "is_conj()", "is_neg()")
TENSOR_KEY_FIELDS = ("shape", "stride", "dtype", "device", "requires_grad", "conjugate bit", "negative bit")
_tensor_key = eval("lambda x: (" + ", ".join(f"x.{f}" for f in _TENSOR_KEY) + ")")  # noqa: S307


def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")


def call_key(args: tuple, kwargs: dict, specialized: frozenset) -> tuple[tuple, list]:
    """(cache key, flat runtime values).  Floats are runtime values unless a trace specialized on
    the one at that position, in which case its value is part of the key."""
    parts: list = [torch.is_grad_enabled(), autocast_key()]
    leaves: list = []
    for a in args:
        t = type(a)
        if t is torch.Tensor and a.layout is torch.strided:
            parts.append(_tensor_key(a))
            leaves.append(a)
        else:
            _walk(a, parts, leaves, specialized, "argument")
    if kwargs:
        for k, v in kwargs.items():
            parts.append(k)
            _walk(v, parts, leaves, specialized, f"argument {k!r}")
    if transformed():
        _refuse_transformed(leaves)
    return tuple(parts), leaves


def _refuse_transformed(leaves: list) -> None:
    """FJ201 for the first tensor wrapped by a torch.func transform or carrying a forward-mode
    tangent, where a key is asked of one directly (fjit.diagnose under a transform): a call of a
    jitted function never gets here with one (see transform_tensor)."""
    for x in leaves:
        if isinstance(x, torch.Tensor) and transform_tensor(x):
            raise UnsupportedInputError(located(
                "FJ201", "an argument is a tensor of a torch.func transform or a dual tensor of "
                         "forward-mode AD, which fjit cannot trace", *user_location(),
                "diagnose the function outside the transform, on plain tensors"))


# The fast path: for calls whose arguments are all positional tensors, floats and scalar constants
# (the common case), a function generated for that signature checks the argument types, builds the
# key as one flat tuple and calls the program; any other call takes call_key and the general cache.
MISS = object()
_FAST_CONSTANTS = (int, bool, str, type(None))


def fast_path(args: tuple, specialized: frozenset, last: list, programs):
    """(call, key, guards, cache) generated for calls typed like `args`, or None if they do not
    qualify.  `call(*args)` looks the program up in `cache` (a dict of its own, so one
    generation's keys never meet another's programs) and returns its result, or MISS (other arity,
    other types, or no program yet); `key(*args)` is the key to store a program under, or None for
    arguments typed differently; `guards(*args)` is what `cache` files beside the program.
    `cache` and `programs` (the ProgramCache's own table) are least-recently-used ordered: a hit
    moves its entry in both to the end (`cache`'s entries are (program, guards, key in `programs`)).

    The program found last is checked first on the next call, its tensors by one C call
    (`_TensorGuards`: type, dispatch keys (autocast's, the conjugate and negative bits among
    them), dtype, device, sizes, strides, requires_grad), with grad mode and the constants, before
    any key is built: where every argument is a tensor the caller checks it, from `last[0]` =
    (arity, grad mode, guards, program); otherwise this function, from a slot of its own."""
    checks, key, leaves = [], ["_grad()", "_autocast()"], []
    for i, a in enumerate(args):
        t = type(a)
        name = f"a{i}"
        if t is torch.Tensor or t is torch.nn.Parameter:   # a module's parameters come as these
            checks.append(f"type({name}) is not _c{i} or {name}.layout is not _strided")
            key += [f"{name}.{f}" for f in _TENSOR_KEY]
            leaves.append(name)
        elif t is float:
            checks.append(f"type({name}) is not float")
            if len(leaves) in specialized:
                key.append(f"{name}.hex()")      # as call_key: -0.0 is not 0.0 here
            leaves.append(name)
        elif t in _FAST_CONSTANTS:
            checks.append(f"type({name}) is not _c{i}")
            key.append(name)
        else:
            return None
    tensors = [f"a{i}" for i, a in enumerate(args) if type(a) in _TENSOR_TYPES]
    consts = [f"a{i}" for i, a in enumerate(args) if type(a) in _FAST_CONSTANTS]
    # guarded: the tensors by one C call, the constants by equality, floats (runtime values) by
    # type; not where a float is part of the key
    guarded = _TensorGuards is not None and bool(tensors) and \
        not any(type(a) is float and k in specialized for k, a in enumerate(
            x for x in args if type(x) in _TENSOR_TYPES or type(x) is float))
    only_tensors = guarded and len(tensors) == len(args)
    params = ", ".join(f"a{i}" for i in range(len(args)))
    guard = " or ".join(checks) or "False"
    source = (f"def call(*args):\n"
              f"    if len(args) != {len(args)}:\n"
              f"        return MISS\n"
              f"    {params}{',' if len(args) == 1 else ''} = args\n" if args else
              "def call(*args):\n"
              "    if args:\n"
              "        return MISS\n")
    const_tuple = f"({', '.join(consts)},)" if consts else "()"
    if guarded and not only_tensors:      # the caller checks an all-tensor signature itself
        types = " and ".join(f"type(a{i}) is {'float' if type(a) is float else f'_c{i}'}"
                             for i, a in enumerate(args) if type(a) not in _TENSOR_TYPES)
        source += (f"    m = mixed[0]\n"
                   f"    if m is not None and m[0] is _grad() and {types} and {const_tuple} == m[1] "
                   f"and m[2].check({', '.join(tensors)}) and _forward_ad._current_level < 0:\n"
                   f"        return m[3]({', '.join(leaves)})\n")
    remember = (f"        last[0] = ({len(args)}, k[0], hit[1], hit[0])\n" if only_tensors else
                f"        mixed[0] = (k[0], {const_tuple}, hit[1], hit[0])\n")
    # the guards of an entry are made at its first hit, not when it is filed: a shape met once
    # (a ragged batch) never pays for them
    made_at_hit = (f"    if hit[1] is _LATER:\n"
                   f"        hit = (hit[0], _guards({', '.join(tensors)}), hit[2])\n"
                   f"        if k in cache:\n"
                   f"            cache[k] = hit\n") if guarded else ""
    same_args = " and ".join(f"m[0][{i}] is a{i}" for i in range(len(args))) or "True"
    # transformed(), inlined: a call per cached call would cost more than the check
    source += (f"    if {guard} or _interpreter_stack() is not None or _forward_ad._current_level >= 0:\n"
              f"        return MISS\n"
              f"    k = ({', '.join(key)},)\n"
              f"    hit = cache.get(k)\n"
              f"    if hit is None:\n"
              f"        missed[0] = (args, k)\n"
              f"        return MISS\n"
              f"    try:\n"             # least recently used first, here and in the cache
              f"        cache.move_to_end(k)\n"   # (cache.py); another thread may have evicted
              f"        programs.move_to_end(hit[2])\n"   # it meanwhile
              f"    except KeyError:\n"
              f"        pass\n"
              + made_at_hit +
              "    if hit[1] is not None and k[1] is False:\n" + remember +
              f"    return hit[0]({', '.join(leaves)})\n"
              f"def key({params}):\n"
              # the key the call's miss just built, for the same arguments (dropped once read: it
              # holds them)
              f"    m, missed[0] = missed[0], None\n"
              f"    if m is not None and len(m[0]) == {len(args)} and {same_args}:\n"
              f"        return m[1]\n"
              f"    if {guard}:\n"
              f"        return None\n"
              f"    return ({', '.join(key)},)\n"
              f"def guards({params}):\n"
              f"    return {'_LATER' if guarded else 'None'}\n")
    cache: collections.OrderedDict = collections.OrderedDict()
    namespace = {"_strided": torch.strided, "_grad": torch.is_grad_enabled,
                 "_autocast": autocast_key, "MISS": MISS, "cache": cache, "last": last,
                 "programs": programs,
                 "mixed": [None], "missed": [None], "_guards": _tensor_guards, "_LATER": _LATER,
                 "_interpreter_stack": _interpreter_stack, "_forward_ad": _forward_ad}
    namespace.update({f"_c{i}": type(a) for i, a in enumerate(args)
                      if type(a) in _FAST_CONSTANTS or type(a) in _TENSOR_TYPES})
    # the call may run in a resumable frame (a big module's); the key and guards run on misses only
    call, _ = compile_function(source, "call", namespace, "<fjit fast path>")
    return call, namespace["key"], namespace["guards"], cache


def symbolic_hit(args: tuple, dynamic: dict[int, frozenset], specialized: frozenset, guards):
    """A check that a call typed like `args` is one a symbolic program compiled for it serves, or
    None where the signature does not qualify (a container, a keyword, a float the key holds).
    `hit(*args)` returns the call's flat runtime values where: every constant equals this call's
    (same type), every float is a float, and one C call (`_TensorGuards`) finds each tensor's
    type, dispatch keys, dtype, device and requires_grad this call's, with the sizes of the dims
    in `dynamic` (flat positions) and every stride of a tensor with such dims left free (the
    program's guards require it contiguous), the other sizes and strides equal; then the
    program's own `guards` on the sizes.  None otherwise.  What this checks is what the cache key
    with the dynamic dims masked (ProgramCache.family_key) compares, so a new length is served
    without building a key: the key's walk over a module's parameters costs more than the call."""
    if _TensorGuards is None:
        return None
    checks, tensors, leaves, namespace = [], [], [], {}
    sizes, strides = [], []
    for i, a in enumerate(args):
        t, name = type(a), f"a{i}"
        if t in _TENSOR_TYPES:
            dims = dynamic.get(len(leaves), ())
            sizes.append([None if d in dims else n for d, n in enumerate(a.shape)])
            strides.append([None] * a.dim() if dims else list(a.stride()))
            tensors.append(name)
            leaves.append(name)
        elif t is float:
            if len(leaves) in specialized:
                return None
            checks.append(f"type({name}) is not float")
            leaves.append(name)
        elif t in _FAST_CONSTANTS:
            # the value compared as bound in the namespace, never written into the source
            checks.append(f"type({name}) is not _t{i} or {name} != _v{i}")
            namespace[f"_t{i}"], namespace[f"_v{i}"] = t, a
        else:
            return None
    if not tensors:
        return None
    namespace.update(_tg=_TensorGuards(*(a for a in args if type(a) in _TENSOR_TYPES),
                                       dynamic_dims_sizes=sizes, dynamic_dims_strides=strides),
                     _guards=guards)
    unpack = f"    {', '.join(f'a{i}' for i in range(len(args)))}{',' if len(args) == 1 else ''} = args\n"
    source = (f"def hit(*args):\n"
              f"    if len(args) != {len(args)}:\n"
              f"        return None\n" + unpack +
              (f"    if {' or '.join(checks)}:\n"
               f"        return None\n" if checks else "") +
              f"    if not _tg.check({', '.join(tensors)}):\n"
              f"        return None\n"
              f"    L = ({', '.join(leaves)},)\n"
              f"    return L if _guards(L) else None\n")
    hit, _ = compile_function(source, "hit", namespace, "<fjit symbolic hit>")
    return hit


try:     # torch's C++ check of a tensor's metadata (what Dynamo's guards are made of)
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:     # pragma: no cover - a torch without it keeps the key path
    _TensorGuards = None


_LATER = object()     # a fast-path entry's guards, to be made at its first hit


def _tensor_guards(*tensors):
    return _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                         dynamic_dims_strides=[list(t.stride()) for t in tensors])


def _walk(x, parts, leaves, specialized, where):
    t = type(x)
    if t in _TENSOR_TYPES:
        if x.layout is not torch.strided:
            raise _unsupported(x, where, f"a {x.layout} tensor")
        parts.append(_tensor_key(x))
        leaves.append(x)
    elif t is float:
        # by bit pattern, not ==: str(-0.0) != str(0.0), and a NaN must equal itself
        parts.append(("f", x.hex()) if len(leaves) in specialized else float)
        leaves.append(x)
    elif t in _CONSTANT_TYPES:
        parts.append((t, x))
    elif t is slice:
        parts.append((slice, x.start, x.stop, x.step))
    elif t is tuple or t is list:                     # what pytree's own tuple/list nodes give
        parts.append((t, len(x)))
        for y in x:
            _walk(y, parts, leaves, specialized, where)
    elif t is dict:
        parts.append((dict, _keys(x)))
        for y in x.values():
            _walk(y, parts, leaves, specialized, where)
    else:
        node = _node(x, where)
        children, context = node.flatten_fn(x)
        parts.append((t, _frozen(context, x, where), len(children)))
        for y in children:
            _walk(y, parts, leaves, specialized, where)


def _keys(d) -> tuple:
    # 1, 1.0 and True are equal dict keys but different programs' constants: keep their types
    return tuple((type(k), k) for k in d)


def _node(x, where):
    """torch's pytree node for `x` (its flatten and unflatten functions), or FJ201."""
    if isinstance(x, torch.Tensor):
        raise _unsupported(x, where)        # a tensor subclass: not a container either
    node = pytree.SUPPORTED_NODES.get(pytree._get_node_type(x))
    if node is None:
        raise _unsupported(x, where)
    return node


def _frozen(context, x, where):
    """A node's pytree context as a hashable key part (dict-like nodes have key lists)."""
    t = type(context)
    if t is list or t is tuple:
        frozen = tuple(_frozen(c, x, where) for c in context)
    elif t is dict:
        frozen = tuple((k, _frozen(v, x, where)) for k, v in context.items())
    else:
        frozen = (t, context)
    try:
        hash(frozen)
    except TypeError:
        raise _unsupported(x, where, f"a {type(x).__qualname__} whose pytree context "
                                     f"({type(context).__qualname__}) is not hashable") from None
    return frozen


def key_labels(args: tuple, kwargs: dict, names: list[str]) -> list[tuple[str, str]]:
    """What each part of call_key's key is, as (where, kind), for explaining a cache miss:
    kind is "tensor" (its TENSOR_KEY_FIELDS), "float", "value", "structure", "names" or "mode".
    The walk mirrors call_key's; only a miss pays for it."""
    labels = [("grad mode", "mode"), ("autocast state", "mode")]
    for i, a in enumerate(args):
        _label(a, f"argument '{names[i]}' (position {i})" if i < len(names) else
               f"argument {i}", labels)
    for k, v in kwargs.items():
        labels.append(("keyword argument names", "names"))
        _label(v, f"argument '{k}'", labels)
    return labels


def _label(x, where: str, labels: list) -> None:
    t = type(x)
    if t in _TENSOR_TYPES:
        labels.append((where, "tensor"))
    elif t is float:
        labels.append((where, "float"))
    elif t in _CONSTANT_TYPES or t is slice:
        labels.append((where, "value"))
    elif t is tuple or t is list:
        labels.append((where, "structure"))
        for j, y in enumerate(x):
            _label(y, f"{where}[{j}]", labels)
    elif t is dict:
        labels.append((where, "structure"))
        for k, y in x.items():
            _label(y, f"{where}[{k!r}]", labels)
    else:
        children, _ = _node(x, where).flatten_fn(x)
        labels.append((where, "structure"))
        for j, y in enumerate(children):
            _label(y, f"{where}.<{j}>", labels)


def _unsupported(x, where: str, what: str | None = None) -> UnsupportedInputError:
    t = type(x)
    name = f"{t.__module__}.{t.__qualname__}" if t.__module__ != "builtins" else t.__qualname__
    if isinstance(x, torch.nn.Module):
        fix = ("compile the module itself, fjit.jit(module), or pass dict(module.named_parameters()) "
               "and call torch.func.functional_call inside "
               f"({catalog_ref('FJ201_object_input')})")
    elif what is not None and isinstance(x, torch.Tensor):   # a layout other than strided
        fix = "pass a dense tensor (x.to_dense()), and convert back after the call if you need to"
    elif what is not None:
        fix = "make the node's flatten function return a hashable context (a tuple, not a list)"
    elif isinstance(x, torch.nn.parameter.UninitializedTensorMixin):     # nn.LazyLinear's before its first call
        fix = "call the module once eagerly first (with torch.no_grad(): model(example)) to give it its parameters"
    elif isinstance(x, torch.Tensor):
        fix = catalog_fix("FJ201_tensor_subclass")
    else:
        fix = (f"{hint_for('FJ201_object_input')}; or register the class with "
               f"torch.utils._pytree (register_dataclass, register_pytree_node) "
               f"({catalog_ref('FJ201_object_input')})")
    described = f"{where}, {what}," if what else f"{where} of type {name}"
    return UnsupportedInputError(located("FJ201", f"{described} cannot be proxied; fjit accepts "
                                                  f"{ACCEPTED} (tensors of strided layout)",
                                         *user_location(), fix))


# ----------------------------------------------------------------------------------------------
# Proxies for a trace
# ----------------------------------------------------------------------------------------------

_RESERVED = {"torch", "operator", "prims", "fjit_ops", "inf", "nan", "computation"}
_GENERATED = re.compile(r"^([tng]\d+|_c\d+_*)$")


def _var_name(label: str, used: set) -> str:
    name = re.sub(r"\W", "_", label)
    if not name.isidentifier() or keyword.iskeyword(name) or name in _RESERVED or \
            _GENERATED.match(name):
        name = f"in_{name}" if name.isidentifier() else "in_"
    while name in used:
        name += "_"
    used.add(name)
    return name


def make_proxies(ctx, params: list[tuple[str, object]], leaves: list, concrete_floats=False):
    """Proxied values for the named parameters; fills ctx.inputs, ctx.real_inputs, input labels.
    With `concrete_floats`, float inputs stay real floats (still program inputs, but the trace
    specializes on their values)."""
    used: set = set()
    counter = iter(range(len(leaves)))
    sizes = active()      # symbolic sizes: the dims they ask for are symbols

    def build(x, label):
        t = type(x)
        if t in _TENSOR_TYPES:
            i = next(counter)
            name = _var_name(label, used)
            shape, strides = (x.shape, x.stride()) if sizes is None else sizes.shape_of(x, i, name)
            var = TensorVar(name, shape, x.dtype, x.device, strides,
                            x.requires_grad, x.is_conj(), x.is_neg())
            ctx.inputs.append(var)
            p = TensorProxy(var, is_input=True)
            ctx.input_labels[id(p)] = f"'{label}'"
            return p
        if t is float:
            i = next(counter)
            var = NumberVar(_var_name(label, used))
            ctx.inputs.append(var)
            if concrete_floats:
                ctx.specialized.add(i)
                return x
            return NumberProxy(x, var, frozenset({i}))
        if t is list:
            built = InputList(build(y, f"{label}_{j}") for j, y in enumerate(x))
            rebuilt_nodes.append((built, None, list(built), label))
            return built
        if t is dict:
            built = InputDict((k, build(v, f"{label}_{j}")) for j, (k, v) in enumerate(x.items()))
            rebuilt_nodes.append((built, None, [y for item in built.items() for y in item], label))
            return built
        if t is tuple:
            return tuple(build(y, f"{label}_{j}") for j, y in enumerate(x))
        if _is_namedtuple(x):
            return t(*(build(y, f"{label}_{f}") for f, y in zip(x._fields, x)))
        if t in _CONSTANT_TYPES or t is slice:
            return x
        # any other pytree node (OrderedDict, a registered dataclass, ModelOutput, ...): rebuilt
        # by its own unflatten around proxies, and checked after the run for mutations
        node = pytree.SUPPORTED_NODES[pytree._get_node_type(x)]
        children, context = node.flatten_fn(x)
        built = [build(y, f"{label}_{j}") for j, y in enumerate(children)]
        rebuilt = node.unflatten_fn(built, context)
        rebuilt_nodes.append((rebuilt, node, built, label))
        return rebuilt

    ctx.real_inputs = list(leaves)
    rebuilt_nodes: list = []
    ctx.rebuilt_inputs = rebuilt_nodes     # read by outputs.check_rebuilt_inputs after the run
    return [build(v, name) for name, v in params]
