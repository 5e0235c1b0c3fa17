"""`fjit.jit(module)`: an `nn.Module` whose call runs a compiled forward (the design contract's
section 7, ../shared/DESIGN.md outside the repository; how it works: docs/design.md, "Modules").

The wrapper is built on a `JittedFunction` (fjit/jitted.py) of one traced function,

    forward(*parameters, *buffers, training_flags, *args, **kwargs)
        -> module(*args, **kwargs) run with {name: tensor} swapped in, {buffer: new value}

so parameters and buffers are ordinary tensor inputs of a jitted function: read at every call,
keyed by metadata (shape, strides, dtype, device, requires_grad) and never by identity, and whatever
the function path does for inputs that require grad applies to them (today: torch autograd runs
through the program's torch calls; with a compiled backward, that).  The layout (which tensors,
the training bits, the bound configuration) is module_layout.py's.

The traced function, and how a forward's writes to buffers and state objects come back, are
module_forward.py's; this module is the wrapper: the call, the write-back after it, the routes
to the wrapped module (its other methods, DDP around it, PyTorch's capture systems), and its state
under the module's own names.
"""
from __future__ import annotations

import functools
import inspect
import weakref

import torch
from torch.nn.parallel import DistributedDataParallel

import fjit.state_objects as state_objects
from fjit.capture import captured
from fjit.errors import FjitError, UnsupportedInputError, UnsupportedOpError, located, user_traceback
from fjit.jitted import JittedFunction
from fjit.module_forward import LayoutChanged, traced_forward
from fjit.module_layout import (GLOBAL_FORWARD_HOOKS, Layout, backward_hook_owner, config_bindings,
                                keyword_positions, replace_tensor)
from fjit.strict.locate import user_location


# (structure key, jit options) -> the ProgramCache that wrappers of equal modules share.  Weak:
# a cache lives as long as a wrapper uses it.
_SHARED_CACHES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


class FjitModule(torch.nn.Module):
    """What `fjit.jit(module)` returns: `jm(x)` equals `module(x)`; `train()`, `eval()`, `to()`,
    `state_dict()`, `parameters()` act on the wrapped module (the wrapper adds no state of its
    own); attributes not found on the wrapper are the wrapped module's."""

    def __init__(self, module: torch.nn.Module, options: dict):
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
        self.__dict__["_fj_options"] = dict(options)      # fjit.jit's options, for each bind
        self._fj_bind()

    def _fj_compiled_module(self) -> torch.nn.Module:
        """The module whose forward is compiled: the wrapped module, or the one a
        DistributedDataParallel wraps (see _fj_through_ddp)."""
        module = self._modules["_fj_module"]
        return module.module if isinstance(module, DistributedDataParallel) else module

    def _fj_bind(self) -> None:
        """A new layout and jitted function for the module as it is now."""
        module = self._fj_compiled_module()
        options = self.__dict__["_fj_options"]
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
        jitted = JittedFunction(traced_forward(module, layout), **options)
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
            except LayoutChanged:
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
