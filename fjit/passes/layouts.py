"""Real layouts: a trace run op by op with torch to observe the strides its ops really give
(`run_observing_layouts`, where some op's recorded layout is a meta kernel's guess,
`has_opaque_ops`), a symbolic trace replayed on meta tensors at one call's sizes to see that torch
lays its values out as recorded there (`layout_differing_at`: sizes of 1), and the passes that
make a program's recorded layouts hold when torch runs it: a prim left to torch copied into its
recorded layout (`conform_prim_layouts`, RESTRIDE), and a chain of views read as one
reinterpretation of its start (`reinterpret_views`, REINTERPRET).
"""
from __future__ import annotations

import contextlib

import torch

from fjit.core.ir import BoundSymbol, Symbol, Tag, TensorVar, Var, flatten_values, map_values
from fjit.core.meta import meta_tensor, run_meta, same_layout
from fjit.core.prims import Kind, of_kind, prim_of
from fjit.core.symbolic import same, shape_rules_for
from fjit.core.trace import AMP_DEVICES, Trace, autocast_off
from fjit.runtime import reinterpret, restride


def run_observing_layouts(trace: Trace, leaves: list) -> tuple[object, dict]:
    """See _run_observing_layouts; with autocast off where the trace holds its casts."""
    with autocast_off() if trace.autocast_off else contextlib.nullcontext():
        return _run_observing_layouts(trace, leaves)


def _run_observing_layouts(trace: Trace, leaves: list) -> tuple[object, dict]:
    """Run `trace` op by op with torch (which reads any layout), and return its result with the
    strides of every op's output that differ from the recorded ones (name -> strides).

    An opaque op's recorded strides come from its meta kernel, which can disagree with the real
    kernel (CPU conv2d and group_norm on channels_last, SDPA on transposed heads); a generated
    kernel that assumed them would read the data wrongly.  The compile runs the program this way
    once; where a layout differs, it retraces with the observed one."""
    env = dict(trace.consts)
    env.update((v.name, x) for v, x in zip(trace.inputs, leaves))
    # a symbolic trace's sizes, as this call's values (no guard taken)
    size = trace.sizes.concrete(leaves) if trace.sizes is not None else lambda x: x
    last_use: dict[str, int] = {}
    for i, b in enumerate(trace.bsyms):
        for v in b.inputs():
            last_use[v.name] = i
    keep = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    value = lambda x: env[x.name] if isinstance(x, Var) else size(x)  # noqa: E731
    wrong: dict = {}
    for i, b in enumerate(trace.bsyms):
        args, kwargs = map_values(value, (b.args, b.kwargs))
        out = b.sym.fn(*args, **kwargs)
        if b.output is None:
            continue
        names = flatten_values(b.output)
        outs = [out] if isinstance(b.output, Var) else flatten_values(out)
        for var, real in zip(names, outs):
            if isinstance(var, Var):
                env[var.name] = real
                if isinstance(var, TensorVar) and isinstance(real, torch.Tensor) and \
                        _strides_differ(real, tuple(map(size, var.strides)), trace.sizes is not None):
                    wrong[var.name] = (tuple(real.shape), real.stride())
        for v in b.inputs():       # free what nothing later reads (a first call's peak memory)
            if last_use.get(v.name) == i and v.name not in keep and v.name not in trace.consts:
                env.pop(v.name, None)
    out = map_values(value, trace.output)
    return (out if trace.rebuild is None else trace.rebuild(*out)), wrong


def _strides_differ(real: torch.Tensor, recorded: tuple, symbolic: bool) -> bool:
    """Whether a value's real strides are not the recorded ones.  In a symbolic program, a dim of
    size 1 at the compiling call is a static 1 (a symbol's dim is 2 or more there), whose stride
    no kernel and no later layout reads: a real stride differing only there is the same layout.
    (GQA's expanded heads at batch 1 come out of reshape with stride 0 on the batch dim, where the
    meta kernel says heads x length x width: counted as differing, the batch-1 compile of Gemma
    and Falcon was declined, and each length of a batch of one compiled a program of its own.)
    A specialized program keeps eager's strides exactly, size-1 dims included."""
    if symbolic:
        return not same_layout(tuple(real.shape), recorded, real.stride())
    return real.stride() != recorded


def layout_differing_at(trace: Trace, inputs: list | None, size, numbers: dict) -> str | None:
    """Replay `trace` op by op on meta tensors at one call's sizes and return the first value
    whose layout torch gives otherwise than the trace recorded (a message naming it), else None.

    `inputs` are the call's values of `trace.inputs` (real tensors, numbers), or None to make each
    input from its recorded metadata and each number input from `numbers` (name -> value: a
    compiled backward's sizes; another number, whose value lays nothing out, as 1); `size` gives
    a symbolic int its value at the call.  A symbolic program whose symbol may be 1
    (core/symbolic.py) was traced at 2 or more, where a reshape that copies is a view at 1 with
    other strides, a layout a kernel would misread.  An op that cannot run on meta tensors differs
    (nothing says its layout), but for a random draw, whose output is new and laid out as
    recorded."""
    def meta(shape, strides, dtype):
        return torch.empty_strided(shape, strides, dtype=dtype, device="meta")

    def of_var(v):
        if isinstance(v, TensorVar):
            return meta(tuple(map(size, v.shape)), tuple(map(size, v.strides)), v.dtype)
        return numbers.get(v.name, 1)

    def of_real(x):
        return meta(tuple(x.shape), x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x
    env = {k: of_real(c) for k, c in trace.consts.items()}
    for k, v in enumerate(trace.inputs):
        env[v.name] = of_real(inputs[k]) if inputs is not None else of_var(v)
    value = lambda x: env[x.name] if isinstance(x, Var) else size(x)  # noqa: E731
    # the trace's own mode switches may be left half done by an early return: no_grad's exit
    # restores grad mode, and autocast is restored below
    amp = [(d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AMP_DEVICES]
    try:
        with torch.no_grad(), autocast_off() if trace.autocast_off else contextlib.nullcontext():
            for b in trace.bsyms:
                names = flatten_values(b.output) if b.output is not None else []
                try:
                    args, kwargs = map_values(value, (b.args, b.kwargs))
                    out = b.sym.fn(*args, **kwargs)
                except Exception:      # noqa: BLE001 -- an op meta tensors cannot run
                    if not b.sym.has(Tag.RANDOM):
                        return f"{b.sym.name} does not run on meta tensors"
                    out = [of_var(v) for v in names]
                    out = out[0] if isinstance(b.output, Var) else out
                outs = [out] if isinstance(b.output, Var) else flatten_values(out)
                for var, real in zip(names, outs):
                    if not isinstance(var, Var):
                        continue
                    env[var.name] = real
                    if isinstance(var, TensorVar) and isinstance(real, torch.Tensor):
                        shape = tuple(map(size, var.shape))
                        if tuple(real.shape) != shape or real.numel() and \
                                not same_layout(shape, tuple(map(size, var.strides)), real.stride()):
                            return f"{var.name} ({b.sym.name}) is laid out {real.stride()}, not as recorded"
    finally:
        for device, on, dtype in amp:
            torch.set_autocast_enabled(device, on)
            torch.set_autocast_dtype(device, dtype)
    return None


RESTRIDE = Symbol("fjit_ops.restride", restride, frozenset())


def conform_prim_layouts(trace: Trace) -> Trace:
    """A decomposition's last prim records its op's layout (trace_call: kernels write the layout
    recorded); left to run as a torch call, it gets the layout torch's rule gives its operands,
    which can differ (softmax over dim 0 of a permuted [2, 2, 1, 1] input: ATen's result is
    contiguous, a division of the permuted exponentials is not).  Such a prim is followed by a copy
    into the recorded layout, which what reads it assumes."""
    out = []
    for b in trace.bsyms:
        v = b.output
        if prim_of(b) is None or b.subsymbols or not isinstance(v, TensorVar) or not (
                b.sym.has(Tag.ELEMENTWISE) or b.sym.has(Tag.REDUCTION)):
            out.append(b)
            continue
        try:
            args, kwargs = map_values(lambda a: meta_tensor(a) if isinstance(a, TensorVar) else a,
                                      (b.args, b.kwargs))
            natural = tuple(run_meta(b.sym.fn, args, kwargs).stride())
        except Exception:       # noqa: BLE001 -- no meta result: the recorded layout stands
            natural = v.strides
        if same_layout(v.shape, natural, v.strides):
            out.append(b)
            continue
        made = v.replaced(name=f"{v.name}_torch", strides=natural)
        out.append(b.replace(output=made))
        out.append(BoundSymbol(RESTRIDE, (made, v.strides), {}, v,
                               comment=f"{v.name} in its recorded layout"))
    return trace.with_stage(trace.stage, out)


REINTERPRET = Symbol("fjit_ops.reinterpret", reinterpret, frozenset({Tag.VIEW}))


def reinterpret_views(trace: Trace) -> Trace:
    """Each view op (a view prim, or a torch-level one: `view`, `transpose`, basic indexing, ...)
    whose result is an intermediate becomes one `reinterpret` of the value its chain of views
    starts from, with the recorded shape and strides and the offset the chain adds.  A chain of
    views costs one call of 0.6 us instead of 1-3 us per link, and the links between become dead
    (a transformer's backward has ~90: a matmul's rule reshapes and transposes its operands).

    Only for a program autograd does not record (the joint forward and backward, or one with no
    value requiring grad): the result is not a view to autograd.  The offset and the check that
    the op is a view of its chain's start come from replaying the chain on meta tensors; an op
    that copies (a reshape of a transposed value), whose meta result disagrees with the recorded
    layout, or whose conjugate or negative bit differs from its start's (`z.conj()`, `z.H`: a
    reinterpretation keeps its source's bits, so it would read the data unconjugated), stays as
    it is.  Outputs stay real views of what they view.  The links left unread are for dce to
    drop."""
    if any(b.sym.has(Tag.MODE) for b in trace.bsyms):
        return trace
    keep = {v.name for v in flatten_values(trace.output) if isinstance(v, Var)}
    chains: dict = {}        # name -> (the value its chain starts from, its meta root, its meta)
    out = []
    for b in trace.bsyms:
        x = b.args[0] if b.args else None
        # one view, or several (split, chunk, unbind: each output a view of the operand)
        results = b.output if isinstance(b.output, (tuple, list)) else (b.output,)
        if not ((b.sym.has(Tag.SHAPE) or b.sym.has(Tag.VIEW)) and isinstance(x, TensorVar) and results
                and all(isinstance(v, TensorVar) and x.device == v.device and x.dtype == v.dtype
                        for v in results)
                and not any(isinstance(a, Var) for a in flatten_values((b.args[1:], b.kwargs)))):
            out.append(b)
            continue
        if x.name not in chains:
            root = meta_tensor(x.replaced(requires_grad=False))
            chains[x.name] = (x, root, root)
        start, root, meta = chains[x.name]
        try:
            # (its results too: a static value sliced to a symbolic length is replayed by the
            # symbolic rules, not by a plain meta tensor's, which would pin the length by a guard)
            with shape_rules_for(x, *results):
                made = b.sym.fn(meta, *b.args[1:], **b.kwargs)
        except Exception:       # noqa: BLE001 -- not replayable on meta: it stays as it is
            made = None
        made = made if isinstance(b.output, (tuple, list)) else (made,)
        if not (isinstance(made, (tuple, list)) and len(made) == len(results) and
                all(_reinterprets(m, meta, root, v) for m, v in zip(made, results))):
            out.append(b)
            continue
        for m, v in zip(made, results):
            chains[v.name] = (start, root, m)
        if any(v.name in keep for v in results):
            out.append(b)
            continue
        out += [BoundSymbol(REINTERPRET, (start, tuple(v.shape), v.strides, m.storage_offset()), {}, v,
                            comment=f"{v.name} = {b.sym.qualname}({x.name}, ...), a view")
                for m, v in zip(made, results)]
    return trace.with_stage(trace.stage, out)


def _reinterprets(made, meta, root, v: TensorVar) -> bool:
    """Whether `made`, a view op's meta result replayed on `meta` (a view of `root`), is the
    recorded `v` as a view of root: the same layout and the same conjugate and negative bits."""
    return (isinstance(made, torch.Tensor) and made is not meta and made._base is root and
            same((tuple(made.shape), tuple(made.stride())), (tuple(v.shape), v.strides)) and
            (made.is_conj(), made.is_neg()) == (root.is_conj(), root.is_neg()))


# Prims whose strides come from a meta kernel that may not be the real kernel's: the opaque ones,
# which torch's own kernel runs (the others are TensorIterator's or view arithmetic, the same code
# for meta and real tensors).
_OPAQUE_PRIMS = of_kind(Kind.OPAQUE)


def has_opaque_ops(trace: Trace) -> bool:
    """Whether some op's output layout is a meta kernel's guess (see run_observing_layouts)."""
    return any(b.outputs() and (b.sym.has(Tag.FALLBACK) or
                                any(prim_of(s) in _OPAQUE_PRIMS for s in b.subsymbols))
               for b in trace.bsyms)
