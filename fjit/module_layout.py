"""What fjit reads from an `nn.Module` for `fjit.jit(module)`: its layout.

A module's call depends on three kinds of things, and each is treated as the contract says:

- **Parameters and buffers** are runtime inputs, read at every call by a reader generated for the
  module's layout (a few attribute and dict reads per tensor), so an optimizer step or a
  `load_state_dict` is seen by the next call without a recompile.  Only their metadata is in the
  cache key, never their identity.
- **`training` of every submodule** is read at every call too and passed as an int constant (one bit
  per submodule), so it is part of the key: `train()`/`eval()` never reuse a stale program.
- **Configuration** (attributes such as `in_features`, `eps`, `p`, the class and place of every
  submodule, the names of its parameters and buffers, its forward hooks) is bound when a program is
  compiled, as globals are.  All of it, by value, is the module's *structure key*; wrappers of
  modules with equal structure keys share one program cache, so N identical blocks compile once.
  Objects fjit cannot compare by value (a plain tensor attribute, an arbitrary object) enter the key
  by identity: such modules do not share programs, which is never wrong.

The reader also checks, cheaply, that the submodule objects and hook tables are those it was made
for (a replaced submodule, a hook registered after the first call); if not, the wrapper makes a
new layout: parameters are never read from a submodule that is no longer in the model, and a new
hook is never skipped.
"""
from __future__ import annotations

import contextlib
import enum
import inspect
import keyword
import types
import typing
import weakref

import torch
from torch.nn.modules import module as _torch_module

from fjit.core.ir import Binding
from fjit.core.generated import compile_function

# Per-module hook tables that change what a forward call does (the *_with_kwargs and
# *_always_called tables are keyed by the same handle ids as these).
_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_GLOBAL_HOOK_TABLES = tuple(getattr(_torch_module, f"_global{n}") for n in _HOOK_TABLES)
GLOBAL_FORWARD_HOOKS = _GLOBAL_HOOK_TABLES[:2]      # torch's global forward (pre-)hook tables
# Module attributes that are not configuration: state read per call, or hook tables keyed above.
_NOT_CONFIG = {"training", "_parameters", "_buffers", "_modules", *_HOOK_TABLES,
               "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks_with_kwargs", "_is_full_backward_hook", "_state_dict_hooks",
               "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
               "_load_state_dict_post_hooks"}
_SCALARS = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
            torch.layout, torch.memory_format, enum.Enum)
_BY_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, type,
                types.ModuleType, torch._C._TensorMeta)


class _Identity:
    """A key part that compares by object identity (and keeps the object alive while keyed)."""

    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return type(other) is _Identity and other.obj is self.obj


def value_key(v, depth: int = 0):
    """A hashable key equal for values a forward cannot tell apart."""
    if isinstance(v, _SCALARS):
        return (type(v), v)
    if isinstance(v, _BY_IDENTITY):
        return v
    if isinstance(v, weakref.ref):      # a cache (LSTM's _flat_weight_refs), not configuration
        return weakref.ref
    if depth < 4:
        if isinstance(v, (tuple, list)):
            return (type(v), tuple(value_key(x, depth + 1) for x in v))
        if isinstance(v, dict):
            return (type(v), tuple((value_key(k, depth + 1), value_key(x, depth + 1))
                                   for k, x in v.items()))
        if isinstance(v, (set, frozenset)):
            try:
                return (type(v), frozenset(value_key(x, depth + 1) for x in v))
            except TypeError:
                pass
        if isinstance(v, torch.Size):
            return (torch.Size, tuple(v))
    return _Identity(v)   # tensors, arbitrary objects: never shared between instances


def _hook_ids(m: torch.nn.Module) -> tuple:
    return tuple(tuple(getattr(m, t, ())) for t in _HOOK_TABLES)


def _hook_functions(tables) -> tuple:
    return tuple(value_key(tuple(t.values())) for t in tables)


def structure_key(root: torch.nn.Module) -> tuple:
    """Everything a compiled forward of `root` binds: classes, configuration, names, hooks."""
    parts: list = [_hook_functions(_GLOBAL_HOOK_TABLES)]
    for name, m in root.named_modules(remove_duplicate=False):
        config = tuple((k, value_key(v)) for k, v in vars(m).items() if k not in _NOT_CONFIG)
        parts.append((name, type(m), config, _hook_functions(getattr(m, t, {}) for t in _HOOK_TABLES),
                      tuple(m._parameters), tuple(m._buffers)))
    # Tied weights: the deduplicated names are the inputs, the full list says who shares what.
    parts.append(tuple(n for n, _ in root.named_parameters()))
    parts.append(tuple(n for n, _ in root.named_buffers()))
    return tuple(parts)


@contextlib.contextmanager
def state_swapped(root: torch.nn.Module, names: list[str], tensors) -> typing.Iterator[typing.Callable]:
    """Run `root` with `tensors` in place of its parameters and buffers named `names`, and give
    the module back exactly as it was, whatever its module graph.  Yields a function returning
    {name: tensor} for the buffers the run assigned anew (`self.name = t` on a registered buffer:
    timm's ConViT caches its relative indices so), read before the slots are put back.

    Every slot (a module's `_parameters` or `_buffers` entry) holding one of the named tensors is
    swapped, found by the tensor's identity: a submodule shared between blocks, or registered under
    two names, is one module with one slot, swapped once; a weight tied into two modules is two
    slots, both swapped.  The slots are put back in reverse order.  (`torch.func.functional_call`
    swaps by name: a shared submodule's second name saves the first name's replacement as the
    "original" and restores it, leaving a tracing proxy in the user's model.)"""
    replacement = {id(_named_tensor(root, n)): t for n, t in zip(names, tensors)}
    name_of = {id(t): n for n, t in zip(names, tensors)}
    swapped = []

    def assigned() -> dict:
        return {name_of[id(new)]: table[k] for table, k, _, new, buffer in swapped
                if buffer and table[k] is not new and isinstance(table[k], torch.Tensor)}
    try:
        for m in root.modules():                  # each module once, however often it is shared
            for table in (m._parameters, m._buffers):
                for k, old in table.items():
                    if old is not None and id(old) in replacement:
                        swapped.append((table, k, old, replacement[id(old)], table is m._buffers))
                        table[k] = replacement[id(old)]
        yield assigned
    finally:
        for table, k, old, _, _ in reversed(swapped):
            table[k] = old


def replace_tensor(root: torch.nn.Module, old: torch.Tensor, new: torch.Tensor) -> None:
    """Put `new` in every buffer slot of `root`'s modules that holds `old` (what eager's
    `self.name = new` in forward leaves; a buffer shared by modules is one tensor in each)."""
    for m in root.modules():
        for k, t in m._buffers.items():
            if t is old:
                m._buffers[k] = new


def _named_tensor(root: torch.nn.Module, name: str) -> torch.Tensor:
    prefix, _, leaf = name.rpartition(".")
    m = root.get_submodule(prefix) if prefix else root
    return m._parameters[leaf] if leaf in m._parameters else m._buffers[leaf]


def forward_hooks(root: torch.nn.Module) -> list:
    """Every forward hook that a call of `root` runs (the module's and the global ones), so the
    observer, which snapshots what the traced function can reach, sees what they mutate."""
    tables = [getattr(m, t, {}) for _, m in root.named_modules() for t in _HOOK_TABLES[:2]]
    return [h for t in tables + list(_GLOBAL_HOOK_TABLES[:2]) for h in t.values()]


def backward_hook_owner(root: torch.nn.Module) -> str | None:
    """The name of a module with a backward hook (or 'global'), which fjit cannot trace: torch's
    BackwardHook wraps the module's inputs and outputs in an autograd.Function and reads their
    grad_fn, which a traced value does not have."""
    if any(_GLOBAL_HOOK_TABLES[2:]):
        return "global (register_module_full_backward_hook)"
    for name, m in root.named_modules():
        if any(getattr(m, t, None) for t in _HOOK_TABLES[2:]):
            return repr(name or type(m).__qualname__)
    return None


def changed_config(before: tuple, after: tuple, skip: frozenset = frozenset()) -> tuple | None:
    """(what differs between two structure keys of one module, for a message; the submodule's name;
    the attribute set, or None where a submodule was added); None if nothing differs (or only in
    the submodules named in `skip`)."""
    if before == after:
        return None
    old = {part[0]: part for part in before[1:-2]}
    for part in after[1:-2]:
        name, _, config = part[:3]
        if name in skip:
            continue
        if name not in old:
            return f"submodule '{name}' was added", name, None
        if old[name][2] != config:
            was = dict(old[name][2])
            for k, v in config:      # a private attribute is the layer's own cache
                if not k.startswith("_") and (k not in was or was[k] != v):
                    return f"attribute '{name + '.' if name else ''}{k}' was set", name, k
    return None


def config_bindings(root: torch.nn.Module) -> list[Binding]:
    """The configuration a compiled forward binds, as `fjit.diagnose` lists it: every submodule
    (its class), every public attribute of a plain type (with its value), every forward hook."""
    out = []
    for name, m in root.named_modules():
        where = name or "(module)"
        out.append(Binding(where, "submodule", type(m).__qualname__))
        for k, v in vars(m).items():
            if k in _NOT_CONFIG or k.startswith("_"):
                continue
            shown = repr(v) if isinstance(v, _SCALARS) or isinstance(v, (tuple, list)) else None
            text = type(v).__qualname__ + (f" = {shown}" if shown and len(shown) <= 60 else "")
            out.append(Binding(f"{name}.{k}" if name else k, "config", text))
        for table in _HOOK_TABLES:
            for hook in getattr(m, table, {}).values():
                out.append(Binding(where, table.strip("_")[:-1].replace("_", " "),
                                   getattr(hook, "__qualname__", type(hook).__qualname__)))
    return out


class Layout:
    """One module's layout: its state names, the generated per-call reader, its structure key."""

    def __init__(self, root: torch.nn.Module):
        modules = list(root.named_modules())
        index = {id(m): i for i, (_, m) in enumerate(modules)}
        self.param_names, self.buffer_names, slots = [], [], []
        for names, kind in ((self.param_names, "_parameters"), (self.buffer_names, "_buffers")):
            seen = set()
            for i, (prefix, m) in enumerate(modules):
                for n, t in getattr(m, kind).items():
                    if t is None or id(t) in seen:
                        continue    # tied: functional_call ties the other name to this one
                    seen.add(id(t))
                    names.append(f"{prefix}.{n}" if prefix else n)
                    slots.append((i, kind, n))
        self.n_state = len(slots)
        # buffer name -> its position in the state the reader returns (for the write-back)
        first = self.n_state - len(self.buffer_names)
        self.buffer_position = {n: first + k for k, n in enumerate(self.buffer_names)}
        self.key = structure_key(root)
        self.read = _generate_reader(root, modules, index, slots)

    def input_names(self) -> list[str]:
        """Parameter names for the traced function's signature (identifiers, unique)."""
        used: set = set()
        names = []
        for n in self.param_names + self.buffer_names:
            name = "".join(c if c.isalnum() or c == "_" else "_" for c in n)
            if not name.isidentifier() or keyword.iskeyword(name):
                name = f"p_{name}"
            while name in used:
                name += "_"
            used.add(name)
            names.append(name)
        return names


def _generate_reader(root, modules, index, slots):
    """`read(root) -> (state tensors, training bits)`, or None when the module is no longer laid
    out as it was (a submodule replaced, a hook added or removed): straight-line code, because it
    runs on every call."""
    lines, env = ["def read(m0):"], {"_GLOBAL": _GLOBAL_HOOK_TABLES, "_hook_ids": _hook_ids}
    for i, (name, m) in enumerate(modules[1:], start=1):
        parent_name, _, child = name.rpartition(".")
        parent = index[id(root.get_submodule(parent_name))] if parent_name else 0
        lines.append(f"    m{i} = m{parent}._modules.get({child!r})")
    checks = [f"m{i} is not e{i}" for i in range(1, len(modules))]
    for i, (_, m) in enumerate(modules):
        env[f"e{i}"] = m
        ids = _hook_ids(m)
        if any(ids):
            env[f"h{i}"] = ids
            checks.append(f"_hook_ids(m{i}) != h{i}")
        else:
            checks += [f"m{i}.{t}" for t in _HOOK_TABLES]
    env["g"] = tuple(tuple(t) for t in _GLOBAL_HOOK_TABLES)
    checks.append("tuple(tuple(t) for t in _GLOBAL) != g" if any(env["g"]) else "any(_GLOBAL)")
    lines.append("    if " + " or ".join(checks) + ":")
    lines.append("        return None")
    state = [f"m{i}.{kind}[{n!r}]" for i, kind, n in slots]
    bits = " + ".join(f"{1 << i} * m{i}.training" for i in range(len(modules)))
    lines.append(f"    return ({''.join(s + ', ' for s in state)}), {bits}")
    read, _ = compile_function("\n".join(lines), "read", env, f"<fjit module reader of {type(root).__qualname__}>")

    def safe_read(m):
        try:
            return read(m)
        except (KeyError, AttributeError):   # a parameter deleted or set to None since
            return None
    return safe_read


def forward_signature(module: torch.nn.Module, state_names: list[str]) -> inspect.Signature:
    """The traced function's signature: one name per state tensor (so the trace reads `fc1_weight`),
    the training bits, then the module forward's own positional parameters."""
    P = inspect.Parameter
    params = [P(n, P.POSITIONAL_ONLY) for n in state_names]
    params.append(P("training_flags", P.POSITIONAL_ONLY))
    used = set(state_names) | {"training_flags"}
    try:
        forward_params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        forward_params = ()
    for p in forward_params:
        if p.kind not in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD):
            break
        name = p.name
        while name in used:
            name += "_"
        used.add(name)
        params.append(P(name, P.POSITIONAL_ONLY))
    for name, kind in (("args", P.VAR_POSITIONAL), ("kwargs", P.VAR_KEYWORD)):
        while name in used:
            name += "_"
        used.add(name)
        params.append(P(name, kind))
    return inspect.Signature(params)


def keyword_positions(module: torch.nn.Module, n_args: int, names: tuple) -> tuple | None:
    """How a call of `module` with `n_args` positional arguments and the keyword arguments `names`
    is made one of positional arguments alone, which the jitted function's fast path serves (a
    transformers model is called `model(input_ids=..., labels=...)`): for each position after
    the given ones, (True, keyword name) or (False, its default).  None where the call cannot be
    so: a name that is not a positional parameter, a parameter in between without a default of
    None (a default of another value is not passed as the caller left it), or a forward hook of
    the module, which sees the call's arguments as they were made (a global one, which can come
    and go between calls, is the caller's to check per call: GLOBAL_FORWARD_HOOKS)."""
    if module._forward_pre_hooks or module._forward_hooks:
        return None
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    P = inspect.Parameter
    positional = [p for p in params if p.kind in (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD)]
    given = set(names)
    index = {p.name: i for i, p in enumerate(positional)}
    if any(index.get(n, -1) < n_args or positional[index[n]].kind is P.POSITIONAL_ONLY
           for n in names):
        return None
    plan = []
    for p in positional[n_args:max(index[n] for n in names) + 1]:
        if p.name in given:
            plan.append((True, p.name))
        elif p.default is None:
            plan.append((False, None))
        else:
            return None
    return tuple(plan)
