"""The per-call work of a Triton kernel: allocate the outputs (and a split reduction's workspaces),
order the arguments, launch each stage.  Everything that can be decided at compile time is.

On a GPU each stage is compiled once (`triton.compile` of the kernel's own signature, constexprs and
16-byte pointer alignment, the same compile the sm_90 test tier checks) and called through a
launcher bound to it: `run(grid..., stream, function, metadata, ..., *args)`, the call
`kernel[grid](...)` ends in after its argument binding, specialization and cache lookup (a few
microseconds each launch).  `kernel[grid]` stays the fallback: under the interpreter, where an
input is not 16-byte aligned, where launch hooks (profilers) are set, and where Triton's compiled-
kernel API is not the one this was written for, and on machines with several GPUs (a compiled binary
is loaded on one device).
"""
from __future__ import annotations

import torch

from fjit.logs import kernels as log


def argument_order(params: list) -> list[tuple[str, int]]:
    """Kernel parameters as (kind, index): ("in", region input), ("lit", literal),
    ("out", region output), ("ws", workspace).  Runtime sizes sz<k> are literals after the
    kernel's own k<j> (the launcher's literals are the kernel's scalar_args, then its sizes)."""
    order = []
    n_literals = sum(1 for p in params if p[0] == "k")
    for p in params:
        if p.startswith("sz"):
            order.append(("lit", n_literals + int(p[2:])))
        elif p.startswith("ws"):
            order.append(("ws", int(p[2:])))
        elif p.startswith("in"):
            order.append(("in", int(p[2:])))
        elif p.startswith("s"):
            order.append(("in", int(p[1:])))
        elif p.startswith("k"):
            order.append(("lit", int(p[1:])))
        else:
            order.append(("out", int(p[3:])))
    return order


def bind_compiled(compiled, grid: tuple, constexprs: tuple, stream_of, device_index: int):
    """`launch(*args)` of a compiled kernel with its grid, metadata and constexprs bound: per call,
    the current stream and one call of Triton's launcher."""
    run, function, packed = compiled.run, compiled.function, compiled.packed_metadata
    gx, gy, gz = (tuple(grid) + (1, 1))[:3]

    def launch(*args):
        run(gx, gy, gz, stream_of(device_index), function, packed, None, None, None, *args, *constexprs)
    return launch


def compile_for_device(fn, kernel, device: torch.device):
    """A stage compiled once for `device`'s GPU, its pointers assumed 16-byte aligned, and bound to
    its grid; None where Triton's API differs from the one this was written for (the caller falls
    back)."""
    compiled = compile_stage(fn, kernel, device)
    return None if compiled is None else bind_stage(compiled, kernel, device)


def compile_stage(fn, kernel, device: torch.device):
    """`compile_for_device` without the grid: what a symbolic program's kernel compiles once and
    binds per set of sizes (`bind_stage`)."""
    try:
        import triton       # optional, and imported by the first compile, not with this module
        from triton.compiler import ASTSource
        from triton.runtime.driver import driver
        if triton.knobs.runtime.launch_enter_hook is not None or triton.knobs.runtime.launch_exit_hook is not None:
            return None
        if torch.cuda.device_count() != 1:   # the binary is loaded on one device; kernel[grid] follows the current one
            return None
        names = list(kernel.signature)
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if kernel.signature[n].startswith("*")}
        src = ASTSource(fn, kernel.signature, kernel.constexprs, attrs)
        return triton.compile(src, target=driver.active.get_current_target(),
                              options={"num_warps": kernel.num_warps})
    except Exception as exc:  # noqa: BLE001 - the launch falls back to kernel[grid]
        log.debug("Triton kernel %s: no compiled launcher (%s); kernel[grid] is used", kernel.name, exc)
        return None


def bind_stage(compiled, kernel, device: torch.device):
    """The compiled stage bound to `kernel`'s grid and constexprs on `device`."""
    from triton.runtime.driver import driver      # triton is optional: imported on use
    index = device.index if device.index is not None else torch.cuda.current_device()
    return bind_compiled(compiled, kernel.grid, tuple(kernel.constexprs.values()),
                         driver.active.get_current_stream, index)


class Stage:
    """One kernel launch: its argument order, its launch through kernel[grid], and, on a GPU, its
    pre-bound compiled launch (`fast`) used while every pointer argument is 16-byte aligned."""

    def __init__(self, kernel, fn, fast=None):
        self.order = argument_order(kernel.params)
        self.slow = fn[kernel.grid]
        self.options = dict(kernel.constexprs, num_warps=kernel.num_warps)
        self.fast = fast
        self.checked = [i for (kind, i), p in zip(self.order, kernel.params)
                        if kind == "in" and p.startswith("in")]   # inputs whose alignment varies

    def args(self, inputs, literals, outs, workspaces) -> list:
        pick = {"in": inputs, "lit": literals, "out": outs, "ws": workspaces}
        return [pick[kind][i] for kind, i in self.order]


def make_launcher(outputs: list, stages: list, literals: list, workspaces: list, device):
    """`run(*inputs)`: allocate, launch every stage, return the output (or a tuple of them).
    `outputs` are (shape, strides, dtype) and `workspaces` (numel, dtype) on `device`."""
    n_out = len(outputs)
    if len(stages) == 1 and not workspaces:     # the common case, kept short
        stage = stages[0]
        order, fast, slow, options, checked = stage.order, stage.fast, stage.slow, stage.options, stage.checked
        pick_in = [(kind == "in", kind == "lit", i) for kind, i in order]

        def run(*inputs):
            outs = [torch.empty_strided(s, st, dtype=dt, device=device) for s, st, dt in outputs]
            args = [inputs[i] if is_in else literals[i] if is_lit else outs[i] for is_in, is_lit, i in pick_in]
            if fast is not None and not any(inputs[i].data_ptr() & 15 for i in checked):
                fast(*args)
            else:
                slow(*args, **options)
            return outs[0] if n_out == 1 else tuple(outs)
        return run

    def run_staged(*inputs):
        outs = [torch.empty_strided(s, st, dtype=dt, device=device) for s, st, dt in outputs]
        ws = [torch.empty(n, dtype=dt, device=device) for n, dt in workspaces]
        for stage in stages:
            args = stage.args(inputs, literals, outs, ws)
            if stage.fast is not None and not any(inputs[i].data_ptr() & 15 for i in stage.checked):
                stage.fast(*args)
            else:
                stage.slow(*args, **stage.options)
        return outs[0] if n_out == 1 else tuple(outs)
    return run_staged
