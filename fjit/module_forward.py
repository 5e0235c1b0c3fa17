"""The function `fjit.jit(module)` compiles: the module's forward with its parameters and buffers
as inputs, and what the call changed as outputs (fjit/module.py wraps it as an nn.Module).

    forward(*parameters, *buffers, training_flags, *args, **kwargs)
        -> (module(*args, **kwargs) run with the tensors swapped in,
            {buffer: new value}, {buffer: replacing tensor}, [state objects' new state])

Buffers are the one kind of input the forward may write: torch's own layers update them in training
(BatchNorm's `num_batches_tracked.add_(1)` in Python, its running statistics inside
`F.batch_norm`, which frontend/stateful_ops.py splits into a pure op and traced updates).  A write
to a buffer is functionalized like a write to a local; the traced function returns each written
buffer's final value, and the wrapper copies it into the module's buffer after the call, so the
module ends as eager leaves it and the trace shows the write-back (its return value names each
buffer).  A registered buffer assigned anew in forward (`self.buf = t`: timm's ConViT caches its
relative indices so) is returned likewise and put in the buffer's slot, as eager's setattr leaves
it.  A write to a parameter is FJ102; `self.x = ...` of anything else in forward is FJ104 (the
observer sees a module attribute change).  State objects among the arguments (a generation cache)
arrive described and leave as their new state (fjit/state_objects.py).

What the forward leaves on the module is checked after the call: a proxy stored in a module
attribute is put back (and reported where it depends on an input), and a configuration change is
FJ104 at the line that stores it.
"""
from __future__ import annotations

import dis
import inspect

import torch

import fjit.state_objects as state_objects
from fjit.core.ir import NumberVar, TensorVar, flatten_values
from fjit.frontend.context import current
from fjit.frontend.leaks import holds_proxy, proxies_in, undo_proxy_writes
from fjit.frontend.proxies import TensorProxy
from fjit.module_layout import Layout, changed_config, forward_hooks, forward_signature, state_swapped, structure_key
from fjit.strict.bindings import module_tensor_origins
from fjit.strict.reach import snapshot, user_class


class LayoutChanged(Exception):
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
            raise LayoutChanged
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
