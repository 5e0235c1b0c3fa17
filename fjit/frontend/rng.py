"""Random numbers: a compiled program draws from torch's generators what eager would draw.

* Compiling draws nothing.  Random ops run on meta tensors while tracing (`record.trace_call`
  sends factories such as `torch.randn(4, 5)` there too), and what does run real ops at compile
  time (permissive replays in `concrete_value`, check mode) runs under `rng_preserved`, which
  rewinds the global generators and every generator the trace draws from.
* Random ops keep their program order: no pass reorders, merges, folds or drops them (dce keeps an
  unused draw, since eager's draw moves the generator for the ops after it).
* A `torch.Generator` created inside the traced function is re-created by the program on every
  call from its recorded seed or state, as eager's call creates it:
  `gen3 = fjit_ops.generator(torch.device('cpu'), seed=0)`.  To tell those from generators that
  existed before the call, `torch.Generator` is `TracedGenerator` while tracing.  A generator from
  outside (a global, a closure) is bound by reference and advances on every call, as in eager;
  reseeding it inside the function is FJ104 (strict/observer.py), and `g.seed()` on one created
  inside is FJ105 (its seed would be frozen).
"""
from __future__ import annotations

import contextlib

import torch

from fjit.core.ir import BoundSymbol, GeneratorVar, Symbol, Tag, flatten_values, map_values
from fjit.errors import UnsupportedOpError, located
from fjit.frontend.context import ProcessPatch, current
from fjit.frontend.record import capture_outside_tensor
from fjit.runtime import generator
from fjit.strict.locate import user_location

_REAL = torch._C.Generator


# RANDOM: never merged by CSE or folded (two generators seeded alike are two streams).
GENERATOR = Symbol("fjit_ops.generator", generator, frozenset({Tag.RANDOM}))


class _GeneratorType(type(_REAL)):
    """`isinstance(g, torch.Generator)` stays true of generators made before tracing."""

    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _REAL)


class TracedGenerator(_REAL, metaclass=_GeneratorType):
    """`torch.Generator` while a function is traced: remembers how it was seeded, so the program
    can create it again on every call."""

    def __init__(self, *args, **kwargs):
        self._fjit_ctx = current()
        self._fjit_origin = None     # {"seed": n} or {"state": tensor}; None: the default seed
        self._fjit_var = None        # the GeneratorVar standing for it since its last (re)seeding

    def _mine(self) -> bool:
        return self._fjit_ctx is not None and self._fjit_ctx is current()

    def manual_seed(self, seed):
        super().manual_seed(seed)
        self._fjit_origin, self._fjit_var = {"seed": int(seed)}, None
        return self

    def seed(self):
        s = super().seed()
        ctx = current()
        if self._mine():
            ctx.sharp_edge("FJ105_random", f"torch.Generator.seed() in '{ctx.fn_name}' draws a "
                                           f"nondeterministic seed that would be frozen into the "
                                           f"compiled code (seed it with g.manual_seed(n))",
                           user_location())
        self._fjit_origin, self._fjit_var = {"seed": s}, None
        return s

    def set_state(self, state):
        ctx = current()
        if self._mine() and isinstance(state, torch.Tensor):
            if type(state) is not torch.Tensor:     # a traced value: its data is not known here
                raise UnsupportedOpError(located(
                    "FJ202", "torch.Generator.set_state() of a traced tensor cannot be traced",
                    *user_location(), "seed the generator with g.manual_seed(n), or pass the "
                                      "generator in"))
            if id(state) in ctx.tensor_origins:     # a global tensor, read once: FJ101
                capture_outside_tensor(ctx, state)
        super().set_state(state)
        self._fjit_origin, self._fjit_var = {"state": super().get_state()}, None   # a copy
        return self

    def set_offset(self, offset):
        super().set_offset(offset)
        self._fjit_origin, self._fjit_var = {"state": super().get_state()}, None
        return self

    def get_state(self):
        if self._mine() and self._fjit_var is not None:
            raise UnsupportedOpError(located(
                "FJ202", "get_state() of a torch.Generator the traced function has drawn from "
                         "cannot be traced: while tracing, no numbers are drawn",
                *user_location(), "read the state before drawing, or outside the compiled function"))
        return super().get_state()


def bind_generators(ctx, args, kwargs):
    """Generators created inside the function become GeneratorVars the program creates; others
    (from outside) stay bound by reference."""
    if not any(isinstance(x, _REAL) for x in flatten_values((args, kwargs))):
        return args, kwargs
    return map_values(lambda x: _bind(ctx, x) if isinstance(x, _REAL) else x, (args, kwargs))


def _bind(ctx, g):
    if getattr(g, "_fjit_ctx", None) is not ctx:
        return g
    if g._fjit_var is None:
        var = GeneratorVar(ctx.new_name("gen"), g.device)
        origin = g._fjit_origin or {"seed": g.initial_seed()}
        ctx.scopes[0].append(BoundSymbol(GENERATOR, (g.device,), dict(origin), var))
        g._fjit_var = var
    return g._fjit_var


def _set_generator_class(cls):
    torch.Generator = cls


# `torch.Generator` is TracedGenerator while any thread traces.
generators_traced = ProcessPatch(lambda: _set_generator_class(TracedGenerator),
                                 lambda: _set_generator_class(_REAL))


def outside_generators(bsyms) -> list:
    """The generators from outside that `bsyms` draw from (bound by reference)."""
    found, stack = {}, list(bsyms)
    while stack:
        b = stack.pop()
        stack.extend(b.subsymbols)
        for x in flatten_values((b.args, b.kwargs)):
            if isinstance(x, _REAL):
                found[id(x)] = x
    return list(found.values())


def rng_snapshot(bsyms=()):
    """A function that puts the global CPU (and CUDA) generators and the outside generators
    `bsyms` draw from back where they are now."""
    generators = outside_generators(bsyms)
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    saved = [(g, g.get_state()) for g in generators]

    def rewind():
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
        for g, state in saved:
            _REAL.set_state(g, state)
    return rewind


@contextlib.contextmanager
def rng_preserved(bsyms=()):
    """Run real ops without consuming random numbers: yields `rewind()` (see rng_snapshot); it
    runs again on exit."""
    rewind = rng_snapshot(bsyms)
    try:
        yield rewind
    finally:
        rewind()
