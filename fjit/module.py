"""`fjit.jit(module)`: an `nn.Module` whose call runs a compiled forward (the design contract's
section 7, ../shared/DESIGN.md outside the repository; how it works: docs/design.md, "Modules").

The wrapper is built on a `JittedFunction` of one traced function,

    forward(*parameters, *buffers, training_flags, *args, **kwargs)
        -> module(*args, **kwargs) run with {name: tensor} swapped in, {buffer: new value}

so parameters and buffers are ordinary tensor inputs of a jitted function: read at every call,
keyed by metadata (shape, strides, dtype, device, requires_grad) and never by identity, and whatever
the function path does for inputs that require grad applies to them (today: torch autograd runs
through the program's torch calls; with a compiled backward, that).  The layout (which tensors,
the training bits, the bound configuration) is module_layout.py's.

Buffers are the one kind of input the forward may write: torch's own layers update them in training
(BatchNorm's `num_batches_tracked.add_(1)` in Python, its running statistics inside
`F.batch_norm`, which frontend/stateful_ops.py splits into a pure op and traced updates).  A write
to a buffer is functionalized like a write to a local; the traced function returns each written
buffer's final value, and the wrapper copies it into the module's buffer after the call, so the
module ends as eager leaves it and the trace shows the write-back (its return value names each
buffer).  A registered buffer assigned anew in forward (`self.buf = t`: timm's ConViT caches its
relative indices so) is returned likewise and put in the buffer's slot, as eager's setattr leaves
it.  A write to a parameter is FJ102; `self.x = ...` of anything else in forward is FJ104 (the
observer sees a module attribute change).
"""
from __future__ import annotations

import dis
import functools
import inspect
import weakref

import torch
from torch.nn.parallel import DistributedDataParallel

import fjit.state_objects as state_objects
from fjit.capture import captured
from fjit.core.ir import NumberVar, TensorVar, flatten_values
from fjit.errors import FjitError, UnsupportedInputError, UnsupportedOpError, located, user_traceback
from fjit.frontend.context import current
from fjit.frontend.leaks import holds_proxy, proxies_in, undo_proxy_writes
from fjit.frontend.proxies import TensorProxy
from fjit.module_layout import (GLOBAL_FORWARD_HOOKS, Layout, backward_hook_owner, changed_config,
                                config_bindings, forward_hooks, forward_signature,
                                keyword_positions, replace_tensor, state_swapped, structure_key)
from fjit.strict.bindings import module_tensor_origins
from fjit.strict.locate import user_location
from fjit.strict.reach import snapshot, user_class


# (structure key, jit options) -> the ProgramCache that wrappers of equal modules share.  Weak:
# a cache lives as long as a wrapper uses it.
_SHARED_CACHES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class _LayoutChanged(Exception):
    """Raised while tracing when the module's configuration changed since its layout was made:
    the program must not be filed in the cache of modules configured as it was."""


def traced_forward(self: torch.nn.Module, layout: Layout):
    """The function `fjit.jit(self)` compiles (see the module docstring).  The module is named
    `self` here because the observer names a mutated closure variable: `self.x = ...` in forward
    reads as FJ104 "mutation of 'self'"."""
    names = layout.param_names + layout.buffer_names
    n_params, n_state = len(layout.param_names), layout.n_state
    buffer_names = layout.buffer_names
    # Read by the observer (a closure variable): what the hooks mutate is FJ104.
    hooks = forward_hooks(self)
    # The observer snapshots objects of the user's classes (and reports a change at its line);
    # torch's layers it does not, so their configuration is compared after the call.
    user_classes = frozenset(n for n, m in self.named_modules() if user_class(type(m)))

    def forward(*inputs, **kwargs):
        state, args = inputs[:n_state], inputs[n_state + 1:]
        buffers = state[n_params:]
        ctx = current()
        if ctx is None or not all(isinstance(t, TensorProxy) for t in state):
            # Called inside another function's trace (JittedFunction inlines): the state is real
            # tensors, which that trace reports as FJ101 (they are not its inputs).
            with state_swapped(self, names, state):
                return self(*args, **kwargs), {}, {}, []
        # state objects (a generation cache) come described: stand-ins are rebuilt around the
        # proxies (fjit/state_objects.py)
        objects, object_inputs = [], {}

        def standin(x):
            if state_objects.is_description(x):
                objects.append(state_objects.rebuild(x, object_inputs))
                return objects[-1]
            return x
        args = tuple(standin(a) for a in args)
        kwargs = {k: standin(v) for k, v in kwargs.items()}
        if structure_key(self) != layout.key:
            raise _LayoutChanged
        # A tensor of the module that is not passed in (a plain attribute) is FJ101 named as the
        # module's, not as a closure variable of this function.
        ctx.tensor_origins.update(module_tensor_origins(self, f"module '{type(self).__qualname__}'"))
        for i, (name, t) in enumerate(zip(names, state)):
            ctx.input_labels[id(t)] = f"{'parameter' if i < n_params else 'buffer'} '{name}'"
        for b in buffers:
            b._fj_is_input = False      # writes functionalize, as on a local; written back below
        before = [b.ir for b in buffers]
        _ = hooks     # a closure variable, so the observer's snapshot reaches the hooks
        snapshots = [(o, m, a, snapshot(o)) for o, m, a in _module_state(self)]
        try:
            with state_swapped(self, names, state) as assigned:
                out = self(*args, **kwargs)
                replaced = assigned()
        finally:
            # A value stored on a module (a cache filled in forward) must not outlive the trace
            # holding a proxy: the module goes back to the caller as it came in.
            from_state = _state_derived(ctx, {id(t.ir) for t in state} | {id(v) for v in before})
            leaked = [(m, a or k) for o, m, a, was in snapshots for k in _undo_leaks(o, was, from_state)]
        change = changed_config(layout.key, structure_key(self), user_classes)
        if leaked:
            holder, attr = leaked[0]
            ctx.sharp_edge("FJ104_mutate_global_object",
                           f"the forward of '{type(holder).__qualname__}' stores a traced tensor in "
                           f"'self.{attr}' (a cache filled in forward), which outlives the call and "
                           f"would be filled once, while tracing (compute it in __init__ as a buffer "
                           f"with persistent=False, or run the model with torch.compile(model, "
                           f"backend=\"fjit\"))", _store_line(type(holder), attr))
        if change is not None:
            what, name, attr = change      # located at the line of the submodule's class storing it
            where = _store_line(type(self.get_submodule(name)), attr) if attr is not None else None
            ctx.sharp_edge("FJ104_mutate_global_object",
                           f"the forward of '{type(self).__qualname__}' changed the module "
                           f"({what}); it happens once, while tracing, and never in compiled calls", where)
        written = {n: b for n, b, v in zip(buffer_names, buffers, before) if b.ir is not v}
        if objects:
            after = [state_objects.described_after(o, object_inputs) for o in objects]
            return state_objects.marked(out, objects), written, replaced, after
        return out, written, replaced, []

    forward.__signature__ = forward_signature(self, layout.input_names())
    forward.__name__ = forward.__qualname__ = f"{type(self).__qualname__}.forward"
    forward.__module__ = type(self).__module__
    return forward


def _module_state(root: torch.nn.Module) -> list:
    """(object, owning module, attribute) for what a forward could leave a proxy in: every
    submodule (its attributes) and the lists, dicts and sets among those attributes."""
    out = []
    for m in root.modules():
        out.append((m, m, None))
        out += [(v, m, k) for k, v in vars(m).items()
                if isinstance(v, (list, dict, set)) and k not in _TORCH_TABLES]
    return out


_TORCH_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def _undo_leaks(obj, before, from_state) -> list[str]:
    """Names of the attributes of `obj` (or ["items"] for a container) put back because they held
    a proxy computed from the call's inputs.

    A value computed from the module's parameters and buffers alone is a cache eager fills once
    and reuses (timm's `attention_bias_cache` in eval mode, LSTM's `_flat_weights`): the compiled
    program computes it on every call instead, which gives the same values, so it is put back
    without a report (functionalized).  One that depends on an input (an activation cached on
    `self`) is a side effect no compiled call can repeat: reported."""
    now = snapshot(obj)
    changed = {k: v for k, v in now.items() if v is not before.get(k)} \
        if isinstance(obj, torch.nn.Module) else {"items": now}
    computed = not from_state([p for v in changed.values() for p in proxies_in(v)])
    if not undo_proxy_writes(obj, before) or not computed:
        return []
    return [k for k, v in changed.items() if holds_proxy(v)]


def _state_derived(ctx, state_vars: set):
    """A test of proxies: whether they were computed from the module's state (`state_vars`: ids of
    the parameters' and buffers' variables), never from a call input."""
    producers = {id(o): b for b in ctx.scopes[0] for o in b.outputs()}
    inputs = {id(v) for v in ctx.inputs}

    def test(proxies) -> bool:
        stack, seen, reached_state = [p.ir for p in proxies], set(), False
        while stack:
            v = stack.pop()
            if id(v) in seen:
                continue
            seen.add(id(v))
            if id(v) in state_vars:
                reached_state = True
                continue
            if id(v) in inputs:
                return False
            b = producers.get(id(v))
            if b is not None:
                stack += [a for a in flatten_values((b.args, b.kwargs)) if isinstance(a, (TensorVar, NumberVar))]
        # Constants alone (torch.arange(x.shape[0])) may encode the call's shapes, which eager's
        # cache would keep stale on the next call: not functionalized.
        return reached_state
    return test


_MUTATING_CALLS = frozenset({"append", "extend", "insert", "update", "setdefault", "add"})


def _store_line(cls, attr: str) -> tuple[str, int] | None:
    """The line of `cls`'s methods (forward first, __init__ never) that stores `self.<attr>`, an
    item of it, or calls a mutating method on it."""
    methods = [fn for klass in cls.__mro__ for name, fn in vars(klass).items()
               if name != "__init__" and callable(fn)]
    methods.sort(key=lambda fn: getattr(fn, "__name__", "") != "forward")
    for fn in methods:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        if code is None:
            continue
        lines: dict[int, list] = {}
        for ins in dis.get_instructions(code):
            if ins.positions.lineno is not None:
                lines.setdefault(ins.positions.lineno, []).append(ins)
        for line, instructions in lines.items():
            ops = [(i.opname, i.argval) for i in instructions]
            if ("STORE_ATTR", attr) in ops or ("LOAD_ATTR", attr) in ops and (
                    any(o == "STORE_SUBSCR" for o, _ in ops) or
                    any(v in _MUTATING_CALLS for o, v in ops if o in ("LOAD_ATTR", "LOAD_METHOD"))):
                return code.co_filename, line
    return None


class FjitModule(torch.nn.Module):
    """What `fjit.jit(module)` returns: `jm(x)` equals `module(x)`; `train()`, `eval()`, `to()`,
    `state_dict()`, `parameters()` act on the wrapped module (the wrapper adds no state of its
    own); attributes not found on the wrapper are the wrapped module's."""

    def __init__(self, module: torch.nn.Module, jit_class, options: dict):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"FjitModule wraps an nn.Module, got {type(module).__qualname__}")
        super().__init__()
        self._fj_module = module            # a submodule: train(), to(), apply() recurse into it
        # The wrapped module's own tensors are the wrapper's too (the same tables), so what sets
        # `jm.weight` by name (torch.func.functional_call, which writes the tables) sets the
        # module's, as eager's `m.weight` would be.
        self.__dict__["_parameters"] = module._parameters
        self.__dict__["_buffers"] = module._buffers
        self.training = module.training
        self.__dict__["_fj_options"] = (jit_class, dict(options))
        self._fj_bind()

    def _fj_compiled_module(self) -> torch.nn.Module:
        """The module whose forward is compiled: the wrapped module, or the one a
        DistributedDataParallel wraps (see _fj_through_ddp)."""
        module = self._modules["_fj_module"]
        return module.module if isinstance(module, DistributedDataParallel) else module

    def _fj_bind(self) -> None:
        """A new layout and jitted function for the module as it is now."""
        module = self._fj_compiled_module()
        jit_class, options = self.__dict__["_fj_options"]
        owner = backward_hook_owner(module)
        if owner is not None:
            raise UnsupportedOpError(located(
                "FJ202", f"fjit.jit({type(module).__qualname__}): module {owner} has a backward "
                         f"hook (register_full_backward_hook / _pre_hook), which fjit cannot "
                         f"trace", *user_location(),
                "register a hook on the output tensor instead (y.register_hook(fn)), or run the "
                "module without fjit.jit"))
        sharded = next((n for n, p in module.named_parameters() if _distributed_tensor(p)), None)
        if sharded is not None:
            raise UnsupportedInputError(located(
                "FJ201", f"fjit.jit({type(module).__qualname__}): parameter {sharded!r} is a DTensor "
                         f"(the module is sharded: FSDP2's fully_shard, or tensor parallelism), whose "
                         f"shards and collectives a compiled program cannot take", *user_location(),
                "shard the compiled module instead: fully_shard(fjit.jit(m)) keeps FSDP's "
                "all-gathers and reduce-scatters around the compiled forward"))
        layout = Layout(module)
        jitted = jit_class(traced_forward(module, layout), **options)
        # share programs with every wrapper of an equal module
        jitted.share_programs(_SHARED_CACHES, (layout.key, tuple(sorted(options.items()))))
        self.__dict__["_fj_layout"] = layout
        self.__dict__["_fj_jitted"] = jitted
        self.__dict__["_fj_positions"] = {}     # (positional count, keyword names) -> plan

    def _fj_positional(self, module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The call with its keyword arguments passed by position where module_layout's
        keyword_positions allows (the layout's read, done first, rebinds the wrapper when a hook
        is added, which empties the plans; a global hook is checked per call)."""
        names = tuple(kwargs)
        plans = self.__dict__["_fj_positions"]
        plan = plans.get((len(args), names), False)
        if plan is False:
            plan = plans[len(args), names] = keyword_positions(module, len(args), names)
        if plan is None or any(GLOBAL_FORWARD_HOOKS):
            return args, kwargs
        return (*args, *[kwargs[name] if given else name for given, name in plan]), {}

    def forward(self, *args, **kwargs):
        module = self._modules["_fj_module"]
        if captured():       # torch.compile, torch.export or torch.jit.trace records the ops
            return module(*args, **kwargs)
        try:
            if isinstance(module, DistributedDataParallel):
                return self._fj_through_ddp(module, args, kwargs)
            return self._fj_call(module, args, kwargs)
        except FjitError as e:       # its traceback as the user's (FJIT_VERBOSE=1 keeps fjit's)
            raise e.with_traceback(user_traceback(e.__traceback__))

    def _fj_through_ddp(self, ddp: DistributedDataParallel, args: tuple, kwargs: dict):
        """fjit.jit(DDP(m)): DDP's own forward runs eagerly around the compiled forward of m, as
        torch.compile keeps it, since its per-call work is a side effect on its C++ reducer that a
        traced call would run once (`prepare_for_backward`: compiled whole, the gradients stopped
        being all-reduced after the first step).  For the call, DDP's `module` is a stand-in whose
        forward is the compiled one; its parameters are m's, so the reducer's hooks see their
        gradients as eager's."""
        inner = ddp._modules["module"]
        standin = self.__dict__.get("_fj_standin")
        if standin is None or standin.inner is not inner:
            standin = self.__dict__["_fj_standin"] = _CompiledForward(self, inner)
        ddp._modules["module"] = standin
        try:
            return ddp(*args, **kwargs)
        finally:
            ddp._modules["module"] = inner

    def _fj_call(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        """The compiled forward of `module` (the compiled module, _fj_compiled_module) on a call."""
        objects = state_objects.find(args, kwargs)
        if objects:       # a generation cache: described, its updates written back after the call
            owner: dict = {}

            def describe(x, where):
                if not state_objects.is_state(x):
                    return x
                d = state_objects.describe(x, where)
                owner[id(d)] = x
                return d
            args = tuple(describe(a, f"argument {i}") for i, a in enumerate(args))
            kwargs = {k: describe(v, f"argument {k!r}") for k, v in kwargs.items()}
        read = self._fj_layout.read(module)
        if kwargs and read is not None:
            args, kwargs = self._fj_positional(module, args, kwargs)
        if objects:       # in the order the traced forward rebuilds them
            objects = [owner[id(x)] for x in (*args, *kwargs.values()) if id(x) in owner]
        routed = module.__dict__.get("_compiled_call_impl")
        if routed is not None:        # tracing calls module(...) itself: not routed back here
            module.__dict__["_compiled_call_impl"] = None
        try:
            return self._fj_run(module, read, objects, args, kwargs)
        finally:
            if routed is not None:
                module.__dict__["_compiled_call_impl"] = routed

    def _fj_run(self, module: torch.nn.Module, read, objects: list, args: tuple, kwargs: dict):
        """The jitted call (bound again where the layout changed), then what it wrote: the state
        objects' updates, the buffers' new values, replaced buffers."""
        for attempt in range(2):
            if read is None:          # a submodule replaced, a hook added or removed, ...
                self._fj_bind()
                read = self._fj_layout.read(module)
                if read is None:
                    raise FjitError(f"fjit.jit({type(module).__qualname__}): the module's "
                                    f"parameters and submodules cannot be read as laid out")
            state, flags = read
            try:
                out, written, replaced, after = self._fj_jitted(*state, flags, *args, **kwargs)
                break
            except _LayoutChanged:
                read = None
        else:
            raise FjitError(f"fjit.jit({type(module).__qualname__}): the module's configuration "
                            f"changes while it is traced")
        if objects:
            for obj, description in zip(objects, after):
                state_objects.write_back(obj, description)
            out = state_objects.unmarked(out, objects)
        if written:
            # one foreach call for every buffer (a ResNet's batch norms write three each)
            position = self._fj_layout.buffer_position
            with torch.no_grad():
                torch._foreach_copy_([state[position[name]] for name in written], list(written.values()))
        for name, value in replaced.items():    # the next call reads the new buffer (and keys on it)
            replace_tensor(module, state[self._fj_layout.buffer_position[name]], value)
        return out

    # -- what a jitted function answers ------------------------------------------------------------
    def cache_info(self):
        """(hits, misses, entries) of the forward's program cache, which wrappers of modules laid
        out alike share (their programs are the same)."""
        return self._fj_jitted.cache_info()

    def cache_clear(self) -> None:
        """Forget the forward's compiled programs (those of the wrappers sharing them too) and
        reset the statistics; the next call compiles."""
        self._fj_jitted.cache_clear()

    # -- the wrapped module's state and submodules, under their own names --------------------------
    def state_dict(self, *args, **kwargs):
        return self._modules["_fj_module"].state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        return self._modules["_fj_module"].load_state_dict(state_dict, strict=strict, assign=assign)

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._modules["_fj_module"].named_parameters(prefix, recurse, remove_duplicate)

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._modules["_fj_module"].named_buffers(prefix, recurse, remove_duplicate)

    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """This wrapper in the wrapped module's place (they share its parameter and buffer
        tables), then the wrapped module's submodules under their own names, so a module's and a
        tensor's names agree (torch.export looks up the parameters its capture found by these)."""
        inner = self._modules["_fj_module"]
        memo = set() if memo is None else memo
        if remove_duplicate:
            if self in memo:
                return
            memo.add(self)
        yield prefix, self
        for name, m in inner.named_modules(memo, prefix, remove_duplicate):
            if m is not inner:
                yield name, m

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            module = self.__dict__.get("_modules", {}).get("_fj_module")
            if module is None:
                raise
            value = getattr(module, name)
            if inspect.ismethod(value) and value.__self__ is self._fj_compiled_module() and \
                    name not in _MODULE_METHODS:
                return self._fj_routed(value)
            return value

    def _fj_routed(self, method):
        """The wrapped module's own method (`generate`, a user's `sample()`), run with the module's
        calls, `self(...)`, going to the compiled forward: through the `_compiled_call_impl` slot
        that nn.Module's __call__ reads (the one torch.compile's module.compile() fills)."""
        module = method.__self__

        def compiled_call(*args, **kwargs):
            return self._fj_call(module, args, kwargs)

        @functools.wraps(method)
        def run(*args, **kwargs):
            previous = module.__dict__.get("_compiled_call_impl")
            module.__dict__["_compiled_call_impl"] = compiled_call
            try:
                return method(*args, **kwargs)
            finally:
                module.__dict__["_compiled_call_impl"] = previous
        return run

    def __prepare_scriptable__(self):
        """torch.jit.script(jm) scripts the wrapped module: TorchScript compiles Python source,
        and the wrapper's forward is fjit's program, not TorchScript's language."""
        return self._modules["_fj_module"]

    # -- pickling: the module and the options; programs are compiled again after loading -----------
    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_fj_layout", None)
        state.pop("_fj_jitted", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._fj_bind()

    def __repr__(self):
        return f"fjit.jit({self._modules['_fj_module']!r})"


# nn.Module's own methods (train, to, parameters, ...): they do not call the module.
_MODULE_METHODS = frozenset(dir(torch.nn.Module))


def _distributed_tensor(t: torch.Tensor) -> bool:
    """A torch.distributed DTensor (told by its class, so a process that never used
    torch.distributed does not import it)."""
    return type(t).__name__ == "DTensor" and type(t).__module__.startswith("torch.distributed")


class _CompiledForward(torch.nn.Module):
    """What DDP's forward calls as its module under fjit.jit(DDP(m)): the wrapper's compiled
    forward of m (held outside the module tree, so DDP sees no new parameters)."""

    def __init__(self, wrapper: FjitModule, inner: torch.nn.Module):
        super().__init__()
        self.__dict__["wrapper"], self.__dict__["inner"] = wrapper, inner

    def forward(self, *args, **kwargs):
        return self.wrapper._fj_call(self.inner, args, kwargs)


def diagnosis_call(module: torch.nn.Module, args: tuple):
    """(function, arguments, configuration bindings) for `fjit.diagnose(module, *args)`: the traced
    forward and its flat inputs, as a call of the jitted function would pass them."""
    if isinstance(module, FjitModule):
        module = module._fj_compiled_module()
    elif isinstance(module, DistributedDataParallel):
        module = module.module
    layout = Layout(module)
    state, flags = layout.read(module)
    return traced_forward(module, layout), (*state, flags, *args), config_bindings(module)


def jitted_of(module: FjitModule):
    """The JittedFunction that runs `module`'s forward (for last_traces, cache_info, explain)."""
    return module._fj_jitted
