"""Property-based equivalence: random programs, fjit against eager.

A strategy builds a random straight-line program over random inputs (shapes including 0-d, empty
and non-contiguous ones: transposed, strided, expanded, offset; dtypes float32, float64, bfloat16,
int64 and bool) as Python *source*, one line per step: elementwise unary ops, binary ops with
broadcasting (against another value, a new input, a Python constant or a runtime float argument,
reflected forms included), where, clamp, casts, reductions over random dims with keepdim, views
(reshape/view, permute, transpose, t, unsqueeze, squeeze, expand, flatten, contiguous), cat/stack/
chunk, and indexing (ints, slices with steps, None, Ellipsis, int-tensor and list indices).

Every step is evaluated on meta tensors while the program is built, so only valid programs are
generated (invalid combinations are never drawn).  Each value carries an error class: `None` when
any correct implementation must produce it bit for bit (IEEE-exact ops on exact values), otherwise
the coarsest float dtype whose rounding it has been through; discontinuous ops (comparisons,
floor/round, casts to ints, argmax, ...) only take exact values, so an ulp of difference in a
transcendental can never flip a comparison, and outputs are compared with the tolerances of the
coarsest dtype they depend on.

The failing example prints as a runnable program (the source plus how each input is made).

FJIT_HYPOTHESIS_EXAMPLES (default 150) sets the number of programs of the main property.

The family property (test_family_programs_match_eager, at the end) adds families that once gave
silent wrong results: channels_last inputs, opaque ops with channels_last/transposed/column-major
outputs followed by fused chains, no_grad/enable_grad/set_grad_enabled/autocast regions, .detach(),
math.*/int()/round()/str() of float arguments as operands, branches, indices and sizes (each program
is called with several float values), requires_grad inputs with gradients compared, and output
contiguity.  Which families are drawn is FAMILIES (see ALL_FAMILIES): DEFAULT_FAMILIES, or
FJIT_PROPERTY_FAMILIES="all" / "pymath,grad,...".  FJIT_HYPOTHESIS_FAMILY_EXAMPLES (default 100)
sets its number of programs per executor.  Long hunts that do not stop at the first failure, and
sort the failures into families:

    python tools/hunt_family_failures.py --executors c -n 1000 --shrink 5
"""
from __future__ import annotations

import contextlib
import dataclasses
import linecache
import math
import re
import os

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import fjit
from op_samples import UNARY as UNARY_SAMPLES

EXAMPLES = int(os.environ.get("FJIT_HYPOTHESIS_EXAMPLES", "150"))
SCALAR_EXAMPLES = max(10, EXAMPLES // 3)

# The executor tuples the properties run under.
EXECUTORS = [pytest.param(("torch",), id="torch"),
             pytest.param(("c", "torch"), id="c", marks=pytest.mark.ckernels)]
# The Triton executor's run of the main property, on CPU tensors under TRITON_INTERPRET=1: a kernel
# costs tens of milliseconds there, so it draws fewer programs (FJIT_HYPOTHESIS_TRITON_EXAMPLES).
TRITON_EXAMPLES = int(os.environ.get("FJIT_HYPOTHESIS_TRITON_EXAMPLES", "150"))

# The property families ("no silent wrong results"): each adds what the generator draws and, for
# the *_checks ones, what is compared.  Programs of test_family_programs_match_eager draw from the
# families in FAMILIES only; a family with known failures stays out of DEFAULT_FAMILIES until
# they are fixed.
#   layouts        channels_last / channels_last_3d inputs (4-d and 5-d) besides the older layouts
#   opaque         ops without a decomposition, or with surprising output layouts (conv2d on
#                  channels_last, pools, interpolate, batch/group norm, sdpa on transposed heads,
#                  x.mT @ y, linalg, einsum, sort/flip/cumsum), followed by fusible chains
#   grad           with no_grad / enable_grad / set_grad_enabled(b) regions, .detach()
#   autocast       with torch.autocast("cpu", dtype=torch.bfloat16) regions around matmul/linear
#   pymath         math.* / arithmetic / int() / round / str() of a float argument as a scalar
#                  operand, a branch, an index or a size; called with several float values
#   autograd       float inputs with requires_grad=True; gradients of the outputs' sum compared
#   layout_checks  compare is_contiguous() and is_contiguous(channels_last[_3d]) of each output
# FJIT_PROPERTY_FAMILIES overrides it: "all", or a comma-separated list ("" for none).
ALL_FAMILIES = ("layouts", "opaque", "grad", "autocast", "pymath", "autograd", "layout_checks")
DEFAULT_FAMILIES: frozenset = frozenset(ALL_FAMILIES)   # all on: every family holds
_FAMILIES_ENV = os.environ.get("FJIT_PROPERTY_FAMILIES")
FAMILIES = DEFAULT_FAMILIES if _FAMILIES_ENV is None else frozenset(
    ALL_FAMILIES if _FAMILIES_ENV == "all" else filter(None, _FAMILIES_ENV.split(",")))
assert FAMILIES <= set(ALL_FAMILIES), FAMILIES
# programs per executor of the family property (its Triton run draws a third of them)
FAMILY_EXAMPLES = int(os.environ.get("FJIT_HYPOTHESIS_FAMILY_EXAMPLES", "100"))

F16, F32, F64, BF16 = torch.float16, torch.float32, torch.float64, torch.bfloat16
I32, I64, BOOL = torch.int32, torch.int64, torch.bool
INPUT_DTYPES = (F32, F32, F64, BF16, I64, BOOL)
CAST_DTYPES = (F32, F64, BF16, F16, I64, I32, BOOL)

# coarseness order of rounding error, and the default tolerances of assert_close for each
_COARSE = {F64: 0, F32: 1, F16: 2, BF16: 3}
_TOL = {F64: (1e-7, 1e-7), F32: (1.3e-6, 1e-5), F16: (1e-3, 1e-5), BF16: (1.6e-2, 1e-5)}

# no "explain" phase: it reruns many variations of a failing program, which is slow here
SETTINGS = dict(deadline=None, derandomize=True, database=None,
                phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])


def coarsest(*dtypes):
    ds = [d for d in dtypes if d is not None and d in _COARSE]
    return max(ds, key=_COARSE.__getitem__) if ds else None


def is_float(dtype):
    return dtype.is_floating_point


# --------------------------------------------------------------------------------------------------
# Inputs


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """How to make one input tensor: deterministic from `seed`."""

    name: str
    shape: tuple
    dtype: torch.dtype
    layout: str = "contiguous"    # contiguous | permuted | strided | expanded | offset |
    #                               channels_last (4-d) | channels_last_3d (5-d)
    param: tuple = ()             # permutation / (dim, step) / expanded dims
    values: str = "normal"        # normal | grid | specials | index
    bound: int = 0                # index: values in [-bound, bound)
    seed: int = 0
    requires_grad: bool = False   # a leaf requiring grad (with the layout above)

    def _base_shape(self):
        shape = list(self.shape)
        if self.layout == "permuted":
            return [shape[p] for p in self.param]
        if self.layout == "strided":
            dim, step = self.param
            shape[dim] *= step
        elif self.layout == "expanded":
            for d in self.param:
                shape[d] = 1
        elif self.layout == "offset":
            shape[0] += 1
        return shape

    def _arrange(self, base):
        if self.layout == "permuted":
            inverse = [self.param.index(i) for i in range(len(self.param))]
            return base.permute(inverse)
        if self.layout == "strided":
            dim, step = self.param
            index = [slice(None)] * base.dim()
            index[dim] = slice(None, None, step)
            return base[tuple(index)]
        if self.layout == "expanded":
            return base.expand(self.shape)
        if self.layout == "offset":
            return base[1:]
        if self.layout in _MEMORY_FORMATS:
            return base.contiguous(memory_format=_MEMORY_FORMATS[self.layout])
        return base

    def _leaf(self, t):
        return t.detach().requires_grad_() if self.requires_grad else t

    def meta(self):
        t = self._arrange(torch.empty(self._base_shape(), dtype=self.dtype, device="meta"))
        assert tuple(t.shape) == self.shape
        return self._leaf(t)

    def make(self):
        g = torch.Generator().manual_seed(self.seed)
        shape = self._base_shape()
        if self.values == "index":
            base = torch.randint(-self.bound, self.bound, shape, generator=g, dtype=I64)
        elif self.dtype == BOOL:
            base = torch.randint(0, 2, shape, generator=g).bool()
        elif not is_float(self.dtype):
            base = torch.randint(-5, 6, shape, generator=g).to(self.dtype)
        elif self.values == "grid":
            base = (torch.randint(-8, 9, shape, generator=g) / 2).to(self.dtype)
        else:
            base = torch.randn(shape, generator=g) * 2
            if self.values == "specials":
                specials = torch.tensor([math.nan, math.inf, -math.inf, 0.0, -0.0])
                pick = torch.randint(0, 10, shape, generator=g)
                base = torch.where(pick < 5, specials[pick.clamp(max=4)], base)
            base = base.to(self.dtype)
        t = self._leaf(self._arrange(base))
        assert tuple(t.shape) == self.shape and t.dtype == self.dtype
        return t

    def describe(self):
        extra = f", {self.layout}{list(self.param) if self.param else ''}" \
            if self.layout != "contiguous" else ""
        vals = f", values={self.values}" + (f"[-{self.bound},{self.bound})" if self.bound else "")
        dtype = str(self.dtype).replace("torch.", "")
        grad = ", requires_grad" if self.requires_grad else ""
        return f"{self.name}: {dtype}{list(self.shape)}{extra}{vals}, seed={self.seed}{grad}"


_MEMORY_FORMATS = {"channels_last": torch.channels_last,
                   "channels_last_3d": torch.channels_last_3d}


@dataclasses.dataclass
class Val:
    name: str
    meta: torch.Tensor
    err: torch.dtype | None    # None: bit-exact; else the coarsest rounding it went through
    bounded: bool              # finite and moderate: safe to cast to an integer dtype

    @property
    def dtype(self):
        return self.meta.dtype

    @property
    def shape(self):
        return tuple(self.meta.shape)

    @property
    def exact(self):
        return self.err is None


@dataclasses.dataclass
class Program:
    inputs: list            # InputSpec
    scalars: list           # (name, float value)
    lines: list             # source lines of the body
    outputs: list           # Val
    single: bool            # return one value rather than a tuple

    @property
    def params(self):
        return [s.name for s in self.inputs] + [n for n, _ in self.scalars]

    @property
    def source(self):
        ret = self.outputs[0].name if self.single else \
            "(" + ", ".join(v.name for v in self.outputs) + ",)"
        body = "".join(f"    {line}\n" for line in self.lines)
        return f"def program({', '.join(self.params)}):\n{body}    return {ret}\n"

    def _repr_pretty_(self, printer, cycle):   # hypothesis prints the runnable form
        printer.text(repr(self))

    def __repr__(self):
        ins = "".join(f"#   {s.describe()}\n" for s in self.inputs)
        scs = "".join(f"#   {n} = {v!r}\n" for n, v in self.scalars)
        return f"\n# inputs:\n{ins}{scs}{self.source}"

    def function(self):
        return compile_source(self.source)

    def args(self, scalars=None):
        return [s.make() for s in self.inputs] + list(
            scalars if scalars is not None else [v for _, v in self.scalars])


_SOURCES = 0


def compile_source(source):
    """exec the source under a fake filename registered with linecache, so that inspect and
    tracebacks can show it."""
    global _SOURCES
    _SOURCES += 1
    filename = f"<fjit-property-{_SOURCES}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch, "F": F, "math": math}
    exec(compile(source, filename, "exec"), namespace)
    return namespace["program"]


# --------------------------------------------------------------------------------------------------
# Op tables

# unary: name -> (template, domain, approx, bounded_out, needs_exact), from the shared op table
#   (tests/op_samples.py: its ops with a `Drawn`), each as torch.<name>(x) unless spelled otherwise
#   here, plus torch.nn.functional activations.
#   domain: any | nonbool | float | intbool
#   bounded_out: True (bounded if the input is), False (may produce inf/nan)
_SPELLING = {"neg": "-{}", "expm1": "{}.expm1()", "cos": "{}.cos()", "ceil": "{}.ceil()",
             "isfinite": "{}.isfinite()", "bitwise_not": "~{}"}
UNARY = {name: (_SPELLING.get(name, f"torch.{name}({{}})"), d.domain, d.approx, d.bounded,
                d.needs_exact)
         for name, (_, _, *drawn) in UNARY_SAMPLES.items() for d in drawn}
UNARY.update({
    "neg_fn": ("torch.neg({})", "nonbool", False, True, False),
    "relu": ("F.relu({})", "nonbool", False, True, False),
    "gelu": ("F.gelu({})", "float", True, True, False),
    "gelu_tanh": ("F.gelu({}, approximate='tanh')", "float", True, True, False),
    "silu": ("F.silu({})", "float", True, True, False),
})

# binary: name -> (python symbol or torch function, lhs domain, rhs domain, scalar kinds, reflect,
#                  approx, bounded_out, needs_exact)
#   scalar kinds: subset of "int", "float", "bool"
BINARY = {
    "add": ("+", "nonbool", "nonbool", ("int", "float"), True, False, True, False),
    "add_fn": ("torch.add", "nonbool", "nonbool", ("int", "float"), False, False, True, False),
    "sub": ("-", "nonbool", "nonbool", ("int", "float"), True, False, True, False),
    "mul": ("*", "any", "any", ("int", "float"), True, False, True, False),
    "mul_fn": ("torch.mul", "any", "any", ("int", "float"), False, False, True, False),
    "div": ("/", "any", "any", ("nonzero_int", "nonzero_float"), True, True, False, False),
    "floordiv": ("//", "nonbool", "float", ("nonzero_int", "nonzero_float"), False, False, False,
                 True),
    "mod": ("%", "nonbool", "float", ("nonzero_int", "nonzero_float"), False, False, False, True),
    "fmod": ("torch.fmod", "nonbool", "float", ("nonzero_int", "nonzero_float"), False, False,
             False, True),
    "pow": ("**", "float", "exponent", ("exponent",), True, True, False, True),
    "maximum": ("torch.maximum", "any", "any", (), False, False, True, False),
    "minimum": ("torch.minimum", "any", "any", (), False, False, True, False),
    "atan2": ("torch.atan2", "nonbool", "nonbool", (), False, True, True, False),
    "eq": ("==", "any", "any", ("int", "float"), True, False, True, True),
    "ne": ("!=", "any", "any", ("int", "float"), True, False, True, True),
    "lt": ("<", "any", "any", ("int", "float"), True, False, True, True),
    "le": ("<=", "any", "any", ("int", "float"), True, False, True, True),
    "gt": (">", "any", "any", ("int", "float"), True, False, True, True),
    "ge": ("torch.ge", "any", "any", ("int", "float"), False, False, True, True),
    "logical_and": ("torch.logical_and", "any", "any", (), False, False, True, True),
    "logical_or": ("torch.logical_or", "any", "any", (), False, False, True, True),
    "logical_xor": ("torch.logical_xor", "any", "any", (), False, False, True, True),
    "and": ("&", "intbool", "intbool", ("int",), True, False, True, False),
    "or": ("|", "intbool", "intbool", ("int",), True, False, True, False),
    "xor": ("^", "intbool", "intbool", ("int",), True, False, True, False),
    "lshift": ("<<", "int", "shift", ("shift",), False, False, True, False),
    "rshift": (">>", "int", "shift", ("shift",), False, False, True, False),
}


def in_domain(dtype, domain):
    if domain == "any":
        return True
    if domain == "nonbool":
        return dtype != BOOL
    if domain == "float":
        return is_float(dtype)
    if domain == "intbool":
        return not is_float(dtype)
    if domain == "int":
        return not is_float(dtype) and dtype != BOOL
    if domain == "exponent":      # pow exponent tensors: floats (ints could be negative)
        return is_float(dtype)
    if domain == "shift":
        return False              # shifts only by constants
    raise AssertionError(domain)


def broadcast(*shapes):
    out = []
    for dims in zip(*[((1,) * (6 - len(s)) + tuple(s)) for s in shapes]):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    rank = max(len(s) for s in shapes)
    return tuple(out[6 - rank:]) if rank else ()


# --------------------------------------------------------------------------------------------------
# The program builder


MAX_NUMEL = 2048


class Builder:
    def __init__(self, draw, lowp_approx=False, float_args=False, families=frozenset()):
        self.draw = draw
        self.families = frozenset(families)   # the property families drawn from (FAMILIES)
        self.lowp_approx = lowp_approx      # fused executors may not round half types per op
        self.float_args = float_args
        self.inputs: list[InputSpec] = []
        self.scalars: list = []
        self.lines: list[str] = []
        self.vals: list[Val] = []            # inputs and step results
        self.ns: dict = {"torch": torch, "F": F, "math": math}
        self.seed = 0
        self.ctx: list[str] = []             # the `with` regions the next line is in
        self.sinks: list[Val] = []           # outputs only: their shape depends on a float
        self.kinds = self.KINDS + tuple(k for f in sorted(self.families)
                                        for k in self.FAMILY_KINDS.get(f, ()))

    # ---- inputs ----
    def new_input(self, shape=None, dtype=None, values=None, bound=0, tensor_input=True,
                  layout=None) -> Val:
        d = self.draw
        if shape is None:
            rank = d(st.integers(0, 5 if "layouts" in self.families else 3))
            shape = [d(st.integers(1, 4)) for _ in range(rank)]
            if rank and d(st.integers(0, 9)) == 0:
                shape[d(st.integers(0, rank - 1))] = 0
        shape = tuple(shape)
        dtype = dtype or d(st.sampled_from(INPUT_DTYPES))
        rank = len(shape)
        layouts = ["contiguous"]
        if rank >= 1:
            layouts += ["strided", "offset"]
        if rank >= 2:
            layouts += ["permuted", "permuted"]
        if any(s != 1 for s in shape):
            layouts += ["expanded"]
        if "layouts" in self.families and rank in (4, 5):
            layouts += ["channels_last" if rank == 4 else "channels_last_3d"] * 2
        layout = layout or d(st.sampled_from(layouts))
        param = ()
        if layout == "permuted":
            param = tuple(d(st.permutations(range(rank))))
            if param == tuple(range(rank)):
                param = tuple(reversed(param))
        elif layout == "strided":
            param = (d(st.integers(0, rank - 1)), d(st.integers(2, 3)))
        elif layout == "expanded":
            dims = [i for i, s in enumerate(shape) if s != 1]
            param = tuple(sorted(d(st.sets(st.sampled_from(dims), min_size=1))))
        if values is None:
            values = "normal"
            if is_float(dtype):
                values = d(st.sampled_from(["normal", "normal", "grid", "grid", "specials"]))
        self.seed += 1
        grad = "autograd" in self.families and is_float(dtype) and values != "index" and \
            d(st.booleans())
        spec = InputSpec(f"x{len(self.inputs)}", shape, dtype, layout, param, values, bound,
                         seed=self.seed, requires_grad=grad)
        self.inputs.append(spec)
        val = Val(spec.name, spec.meta(), None, values != "specials")
        self.ns[spec.name] = val.meta
        self.vals.append(val)
        return val

    def float_arg(self) -> str:
        """A runtime float argument (existing or new)."""
        d = self.draw
        if self.scalars and d(st.booleans()):
            return d(st.sampled_from(self.scalars))[0]
        name = f"s{len(self.scalars)}"
        value = d(st.sampled_from([2.5, -0.75, 0.5, 3.0, -2.0, 0.1, 1.0]))
        self.scalars.append((name, value))
        self.ns[name] = value
        return name

    def pick(self, pred=lambda v: True) -> Val | None:
        """An existing value satisfying pred, favouring the latest (shrinks toward it)."""
        cands = [v for v in reversed(self.vals) if pred(v)]
        if not cands:
            return None
        return cands[self.draw(st.integers(0, len(cands) - 1))]

    def partner_shape(self, shape):
        """A shape that broadcasts with `shape`."""
        d = self.draw
        mode = d(st.sampled_from(["same", "sub", "super"]))
        shape = list(shape)
        if mode == "sub":
            shape = shape[d(st.integers(0, len(shape))):]
            shape = [1 if d(st.booleans()) else s for s in shape]
        elif mode == "super":
            lead = d(st.lists(st.integers(1, 3), max_size=2))[:max(0, 6 - len(shape))]   # rank <= 6
            shape = lead + [d(st.integers(1, 3)) if s == 1 and d(st.booleans()) else s
                            for s in shape]
        return tuple(shape)

    # ---- emitting ----
    def emit(self, expr, srcs, approx=False, bounded=None, ill_conditioned=False, real=False,
             sink=False) -> Val | None:
        """Evaluate expr on meta tensors; append it as a step unless it is too large.

        `ill_conditioned`: the op turns a small absolute error of an input into a large relative
        one (1 / x, rsqrt, log, tan near a pole).  An approximate input may carry an error its own
        comparison allowed only through atol, so the result is held to bfloat16's tolerance.

        `real`: evaluate on CPU tensors of zeros instead (eager's own layouts for ops whose meta
        kernels disagree, and autocast, which meta tensors do not see); a step it fails on is
        not drawn.  `sink`: the value is an output only, never an operand of a later step."""
        meta = self.evaluate(expr, real)
        if meta is None:
            return None
        for name, value in self.scalars:
            if re.search(rf"\b{name}\b", expr):
                # a runtime float: in the float-argument property its value changes after the
                # program is built; otherwise one not exact in bfloat16 may round differently
                # (in double or in the tensor dtype) without being wrong
                if self.float_args or float(torch.tensor(value, dtype=BF16)) != value:
                    approx = True
                if self.float_args:
                    bounded = False
        assert isinstance(meta, torch.Tensor), expr
        if meta.numel() > MAX_NUMEL or meta.dim() > 6:
            return None
        out = meta.dtype
        errs = [v.err for v in srcs]
        if self.lowp_approx and out in (BF16, F16) and any(
                is_float(v.dtype) or v.dtype != out for v in srcs):
            approx = True
        err = None
        if approx or any(e is not None for e in errs):
            err = coarsest(*errs, out if is_float(out) else None) or F64
        if ill_conditioned and any(e is not None for e in errs) and is_float(out):
            err = coarsest(err, BF16)
        if bounded is None:
            bounded = True
        bounded = bounded and all(v.bounded for v in srcs)
        name = f"v{len(self.lines)}"
        self.lines.append(f"{'    ' * len(self.ctx)}{name} = {expr}")
        val = Val(name, meta, err, bounded)
        self.ns[name] = meta
        (self.sinks if sink else self.vals).append(val)
        return val

    def evaluate(self, expr, real=False):
        """expr's result on meta tensors (or real ones, see emit), under the open regions."""
        real = real or any("autocast" in c for c in self.ctx)
        ns = self.ns
        if real:
            ns = dict(ns)
            for k, t in ns.items():
                if isinstance(t, torch.Tensor) and t.device.type == "meta":
                    z = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype).zero_()
                    ns[k] = z.requires_grad_() if t.requires_grad else z
        try:
            with contextlib.ExitStack() as stack:
                for c in self.ctx:
                    stack.enter_context(eval(c, ns))  # noqa: S307
                out = eval(expr, ns)  # noqa: S307 - our own generated source
        except (RuntimeError, ValueError, IndexError, TypeError):
            if not real:
                raise
            return None
        if real and isinstance(out, torch.Tensor):
            out = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device="meta") \
                .requires_grad_(out.requires_grad)
        return out

    # ---- step kinds: each returns the new Val, or None when not applicable ----
    def unary(self, v):
        ops = [n for n, (_, dom, _, _, exact) in UNARY.items()
               if in_domain(v.dtype, dom) and (v.exact or not exact)]
        name = self.draw(st.sampled_from(ops))
        template, _, approx, bounded, _ = UNARY[name]
        return self.emit(template.format(v.name), [v], approx, bounded,
                         ill_conditioned=name in self.MAGNIFYING)

    def scalar_for(self, kinds, lhs_dtype):
        """A Python scalar operand (source text): a literal, or a runtime float argument."""
        d = self.draw
        kind = d(st.sampled_from(kinds))
        if kind == "int":
            return repr(d(st.sampled_from([True, 2] if lhs_dtype == BOOL else [2, -1, 0, 3])))
        if kind == "nonzero_int":
            return repr(d(st.sampled_from([2, -3, 1])))
        if kind == "shift":
            return repr(d(st.integers(0, 3)))
        if kind == "exponent":
            return repr(d(st.sampled_from([2, 3, 0.5, -1.0, 2.5, 0])))
        if kind == "float" or (kind == "nonzero_float" and not self.float_args):
            if self.float_args or d(st.booleans()):
                return self.float_arg()          # nonzero in the main property
        return repr(d(st.sampled_from([2.5, -0.5, 1.5, 0.25])))

    def tensor_partner(self, v, dom, exact_needed, shape=None):
        """An existing value or a new input that broadcasts with v (or with `shape`)."""
        d = self.draw
        shape = v.shape if shape is None else shape
        if d(st.booleans()):
            other = self.pick(lambda o: in_domain(o.dtype, dom) and (o.exact or not exact_needed)
                              and broadcast(o.shape, shape) is not None)
            if other is not None:
                return other
        dtypes = [t for t in INPUT_DTYPES if in_domain(t, dom)]
        if not dtypes:
            return None
        return self.new_input(self.partner_shape(shape), d(st.sampled_from(dtypes)))

    DIVISIONS = ("div", "floordiv", "mod", "fmod")
    MAGNIFYING = ("reciprocal", "rsqrt", "log", "log2", "tan")

    def binary(self, v):
        d = self.draw
        ops = [n for n, (_, ldom, _, _, _, _, _, exact) in BINARY.items()
               if in_domain(v.dtype, ldom) and (v.exact or not exact)]
        name = d(st.sampled_from(ops))
        sym, ldom, rdom, kinds, reflect, approx, bounded, needs_exact = BINARY[name]
        tensor_ok = any(in_domain(t, rdom) for t in INPUT_DTYPES)
        use_scalar = bool(kinds) and (not tensor_ok or d(st.booleans()))
        srcs = [v]
        if name == "pow":
            bounded = False
            if use_scalar and d(st.booleans()):              # positive base ** x
                lhs, rhs = d(st.sampled_from(["2", "0.5", "2.5"])), v.name
            elif use_scalar:
                lhs, rhs = v.name, self.scalar_for(kinds, v.dtype)
            else:                                             # x ** y, y an exact float
                partner = self.tensor_partner(v, rdom, True)
                srcs.append(partner)
                lhs, rhs = v.name, partner.name
        elif use_scalar:
            lhs, rhs = v.name, self.scalar_for(kinds, v.dtype)
            if reflect and d(st.booleans()):
                lhs, rhs = rhs, lhs                           # 2 - x, 2.5 * x, 1 / x, ...
        else:
            partner = self.tensor_partner(v, rdom, needs_exact or name in self.DIVISIONS)
            if partner is None:
                return None
            srcs.append(partner)
            lhs, rhs = v.name, partner.name
            swappable = in_domain(partner.dtype, ldom) and in_domain(v.dtype, rdom) and \
                (v.exact or name not in self.DIVISIONS)
            if swappable and d(st.booleans()):
                lhs, rhs = rhs, lhs
        if sym.startswith("torch."):
            if lhs != v.name and use_scalar:                  # torch.fn(tensor, scalar) only
                lhs, rhs = rhs, lhs
            expr = f"{sym}({lhs}, {rhs})"
        else:
            expr = f"({lhs} {sym} {rhs})"
        ill = (name == "div" and rhs == v.name) or (name == "pow" and lhs == v.name)
        return self.emit(expr, srcs, approx, bounded, ill_conditioned=ill)

    def where(self, v):
        d = self.draw
        cond = None
        if v.exact and v.dtype != BOOL and d(st.booleans()):
            cond_expr, cond_shape, cond_srcs = f"({v.name} > 0)", v.shape, []
        else:
            cond = self.pick(lambda o: o.dtype == BOOL and broadcast(o.shape, v.shape) is not None)
            if cond is None or d(st.booleans()):
                cond = self.new_input(self.partner_shape(v.shape), BOOL)
            cond_expr, cond_shape, cond_srcs = cond.name, cond.shape, [cond]
        both = broadcast(cond_shape, v.shape)
        srcs = [v] + cond_srcs
        if d(st.booleans()):
            other = self.scalar_for(("int", "float") if v.dtype != BOOL else ("int",), v.dtype)
            if other is None:
                return None
        else:
            partner = self.pick(lambda o: broadcast(o.shape, both) is not None) \
                if d(st.booleans()) else None
            if partner is None:
                partner = self.new_input(self.partner_shape(both))
            other = partner.name
            srcs.append(partner)
        a, b = (v.name, other) if d(st.booleans()) else (other, v.name)
        form = d(st.sampled_from(["fn", "fn", "method"]))
        if form == "method" and a == v.name:
            expr = f"{a}.where({cond_expr}, {b})"
        else:
            expr = f"torch.where({cond_expr}, {a}, {b})"
        return self.emit(expr, srcs)

    def clamp(self, v):
        d = self.draw
        if v.dtype == BOOL:
            return None
        srcs = [v]

        tensors = d(st.booleans())   # bounds are both numbers or both tensors (or None)

        def bound():
            kinds = ["none", "tensor"] if tensors else ["none", "num", "num", "arg"]
            kind = d(st.sampled_from(kinds))
            if kind == "none":
                return "None"
            if kind == "num":
                return repr(d(st.sampled_from([-1, 0, 2] if not is_float(v.dtype) else
                                              [-1.5, 0.0, 0.5, 2.0])))
            if kind == "arg":
                return self.float_arg()
            other = self.tensor_partner(v, "nonbool", False, broadcast(*[o.shape for o in srcs]))
            srcs.append(other)
            return other.name

        lo, hi = bound(), bound()
        if lo == "None" and hi == "None":
            lo = "0"
        if d(st.booleans()):
            expr = f"torch.clamp({v.name}, min={lo}, max={hi})"
        else:
            expr = f"{v.name}.clamp({lo}, {hi})"
        return self.emit(expr, srcs)

    def cast(self, v):
        d = self.draw
        targets = list(CAST_DTYPES)
        if is_float(v.dtype) and not (v.exact and v.bounded):
            targets = [t for t in targets if is_float(t)]
        target = d(st.sampled_from(targets))
        if is_float(v.dtype) and target == BOOL and not v.exact:
            return None
        methods = {F32: "float", F64: "double", BF16: "bfloat16", F16: "half", I64: "long",
                   I32: "int", BOOL: "bool"}
        if d(st.booleans()):
            expr = f"{v.name}.{methods[target]}()"
        else:
            expr = f"{v.name}.to({target})"
        # rounding an inexact value to a coarser float dtype makes the error that coarse
        return self.emit(expr, [v])

    def reduce(self, v):
        d = self.draw
        dt, shape, rank = v.dtype, v.shape, len(v.shape)
        ops = ["sum", "amax", "amin", "max_dim", "min_dim", "max_all"]
        if is_float(dt):
            ops += ["mean", "var", "std", "prod", "softmax"]
        if dt in (F32, F64):
            # not on half types: torch's kernel rounds log(sum(exp)) to the half type before the
            # subtraction, an absolute error (~0.008 in bfloat16) that later ops scale without
            # bound, where fjit's decomposition stays in float32
            # (tests/executors/test_c_executor.py)
            ops.append("log_softmax")
        if v.exact:
            ops += ["any", "all"]
            if dt != BOOL:
                ops += ["argmax", "argmin"]
        name = d(st.sampled_from(ops))
        dims_all = list(range(rank)) or [0]

        def draw_dim(allow_none, allow_tuple):
            choices = ["int"] + (["none"] if allow_none else []) + \
                (["tuple"] if allow_tuple and rank >= 1 else [])
            kind = d(st.sampled_from(choices))
            if kind == "none":
                return None
            if kind == "int":
                dim = d(st.sampled_from(dims_all))
                return dim - max(rank, 1) if d(st.booleans()) else dim
            return tuple(d(st.sets(st.sampled_from(dims_all), min_size=1)))

        def reduced_count(dim):
            if dim is None or rank == 0:
                return math.prod(shape)
            dims = dim if isinstance(dim, tuple) else (dim,)
            return math.prod(shape[x % rank] for x in dims)

        keep = d(st.booleans())
        x = v.name
        approx = False
        if name in ("sum", "mean", "any", "all"):
            dim = draw_dim(True, True)
            extra = ""
            if name == "sum" and d(st.integers(0, 3)) == 0:
                extra = f", dtype={d(st.sampled_from([F64, F32] if is_float(dt) else [I64, F32]))}"
            if dim is None and not keep and d(st.booleans()):
                expr = f"torch.{name}({x}{extra})"
            elif d(st.booleans()):
                expr = f"torch.{name}({x}, dim={dim!r}, keepdim={keep}{extra})"
            else:
                expr = f"{x}.{name}({dim!r}, keepdim={keep}{extra})"
            approx = name in ("sum", "mean") and is_float(dt)
            if name == "mean" and reduced_count(dim) == 0:
                return self.emit(expr, [v], approx, bounded=False)
        elif name in ("amax", "amin"):
            dim = draw_dim(False, True)
            if reduced_count(dim) == 0:
                return None
            expr = f"torch.{name}({x}, dim={dim!r}, keepdim={keep})"
        elif name in ("var", "std"):
            dim = draw_dim(True, True)
            corr = d(st.sampled_from([0, 1]))
            if reduced_count(dim) <= corr or math.prod(shape) == 0:
                return None     # no degrees of freedom: eager warns
            expr = f"torch.{name}({x}, dim={dim!r}, correction={corr}, keepdim={keep})"
            approx = True
        elif name == "prod":
            dim = draw_dim(True, False)
            if dim is None:
                expr = f"torch.prod({x})"
            else:
                expr = f"torch.prod({x}, {dim}, keepdim={keep})"
            approx = True
        elif name in ("softmax", "log_softmax"):
            dim = draw_dim(False, False)
            expr = f"F.{name}({x}, dim={dim})"
            approx = True
        elif name in ("argmax", "argmin"):
            dim = draw_dim(True, False)
            if reduced_count(dim) == 0:
                return None
            expr = f"torch.{name}({x}, dim={dim!r}, keepdim={keep})"
        elif name in ("max_dim", "min_dim"):
            dim = draw_dim(False, False)
            if reduced_count(dim) == 0:
                return None
            fn = name[:3]
            part = ".values" if not v.exact or d(st.booleans()) else ".indices"
            expr = f"torch.{fn}({x}, {dim}, keepdim={keep}){part}"
        else:  # max_all
            if math.prod(shape) == 0:
                return None
            expr = f"{x}.{d(st.sampled_from(['max', 'min']))}()"
        return self.emit(expr, [v], approx)

    def view(self, v):
        d = self.draw
        shape, rank, x = v.shape, len(v.shape), v.name
        kinds = ["reshape", "unsqueeze", "squeeze", "expand", "flatten", "contiguous"]
        if rank >= 1:
            kinds += ["permute", "transpose", "cat", "stack", "chunk"]
        if rank >= 1 and shape[-1] >= 2:
            kinds += ["rotate"]      # a rotary embedding's cat of the halves, computed piecewise
        if rank <= 2:
            kinds += ["t"]
        kind = d(st.sampled_from(kinds))
        srcs = [v]
        if kind == "reshape":
            new = self.draw_reshape(shape)
            if v.meta.is_contiguous() and d(st.booleans()):
                expr = f"{x}.view({new!r})"
            elif d(st.booleans()):
                expr = f"torch.reshape({x}, {new!r})"
            else:
                expr = f"{x}.reshape({', '.join(map(str, new)) or '()'})"
        elif kind == "permute":
            perm = tuple(d(st.permutations(range(rank))))
            expr = f"{x}.permute({', '.join(map(str, perm))})" if d(st.booleans()) \
                else f"torch.permute({x}, {perm!r})"
        elif kind == "transpose":
            a, b = d(st.integers(-rank, rank - 1)), d(st.integers(-rank, rank - 1))
            expr = f"{x}.transpose({a}, {b})" if d(st.booleans()) else \
                f"torch.transpose({x}, {a}, {b})"
        elif kind == "t":
            expr = f"{x}.t()" if d(st.booleans()) else f"{x}.T" if rank == 2 else f"torch.t({x})"
        elif kind == "unsqueeze":
            expr = f"{x}.unsqueeze({d(st.integers(-rank - 1, rank))})"
        elif kind == "squeeze":
            ones = [i for i, s in enumerate(shape) if s == 1]
            choice = d(st.sampled_from(["all", "dim", "tuple"] if ones else ["all", "dim"]))
            if choice == "all":
                expr = f"{x}.squeeze()"
            elif choice == "dim":
                expr = f"torch.squeeze({x}, {d(st.sampled_from(list(range(rank)) or [0]))})"
            else:
                expr = f"{x}.squeeze({tuple(d(st.sets(st.sampled_from(ones), min_size=1)))!r})"
        elif kind == "expand":
            lead = d(st.lists(st.integers(1, 3), max_size=2))
            sizes = [(d(st.sampled_from([1, 2, 3, -1])) if s == 1 else
                      d(st.sampled_from([s, -1]))) for s in shape]
            new = lead + sizes
            expr = f"{x}.expand({new!r})" if d(st.booleans()) else \
                f"{x}.expand({', '.join(map(str, new)) or '()'})"
        elif kind == "flatten":
            if rank == 0:
                expr = f"{x}.flatten()"
            else:
                a = d(st.integers(0, rank - 1))
                b = d(st.integers(a, rank - 1))
                expr = f"torch.flatten({x}, {a}, {b})"
        elif kind == "contiguous":
            expr = f"{x}.contiguous()"
        elif kind in ("cat", "stack"):
            dim = d(st.integers(0, rank - 1))
            other_shape = list(shape)
            if kind == "cat":
                other_shape[dim] = d(st.integers(0, 3))
            dtype = v.dtype if d(st.booleans()) else d(st.sampled_from(INPUT_DTYPES))
            other = self.new_input(tuple(other_shape), dtype)
            srcs.append(other)
            pair = [x, other.name] if d(st.booleans()) else [other.name, x]
            dim = dim - (rank + (kind == "stack")) if d(st.booleans()) else dim
            expr = f"torch.{kind}([{', '.join(pair)}], dim={dim})"
        elif kind == "rotate":
            k = d(st.integers(1, shape[-1] - 1))
            expr = f"torch.cat(({x}[..., {k}:] * 2, {x}[..., :{k}] + 1), dim=-1)"
        else:  # chunk
            dim = d(st.integers(0, rank - 1))
            chunks = d(st.integers(1, 3))
            n = len(torch.chunk(v.meta, chunks, dim))
            if n == 0:
                return None
            expr = f"torch.chunk({x}, {chunks}, {dim})[{d(st.integers(-n, n - 1))}]"
        return self.emit(expr, srcs)

    def draw_reshape(self, shape):
        d = self.draw
        numel = math.prod(shape)
        if numel == 0:
            new = d(st.lists(st.integers(1, 3), max_size=2))
            new.insert(d(st.integers(0, len(new))), 0)
            return tuple(new)
        factors = []
        n, p = numel, 2
        while n > 1:
            while n % p == 0:
                factors.append(p)
                n //= p
            p += 1
        groups = d(st.integers(1, max(1, min(4, len(factors)))))
        new = [1] * groups
        for f in factors:
            new[d(st.integers(0, groups - 1))] *= f
        if d(st.booleans()):
            new.insert(d(st.integers(0, len(new))), 1)
        if d(st.booleans()):
            new[d(st.integers(0, len(new) - 1))] = -1
        return tuple(new)

    def index(self, v):
        d = self.draw
        shape, rank, x = v.shape, len(v.shape), v.name
        kind = d(st.sampled_from(["basic", "basic", "tensor", "list"] if rank else ["basic"]))
        if kind == "basic":
            parts, dim = [], 0
            used_ellipsis = False
            while dim < rank or (not parts and rank == 0):
                choice = d(st.sampled_from(["full", "int", "slice", "slice", "none", "ellipsis",
                                            "stop"]))
                if choice == "stop" or (rank == 0 and choice in ("full", "int", "slice")):
                    break
                if choice == "none":
                    parts.append("None")
                    continue
                if choice == "ellipsis":
                    if used_ellipsis:
                        continue
                    used_ellipsis = True
                    parts.append("...")
                    break
                size = shape[dim]
                if choice == "int":
                    if size == 0:
                        continue
                    parts.append(str(d(st.integers(-size, size - 1))))
                elif choice == "full":
                    parts.append(":")
                else:
                    start = d(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
                    stop = d(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
                    step = d(st.sampled_from([None, 1, 2, 3]))
                    parts.append(f"{'' if start is None else start}:{'' if stop is None else stop}"
                                 + ("" if step is None else f":{step}"))
                dim += 1
            if used_ellipsis and d(st.booleans()) and rank >= 1:
                parts.append(d(st.sampled_from(["None", "0" if shape[-1] else ":", "::2"])))
            if not parts:
                parts = [":"] if rank else ["..."]
            expr = f"{x}[{', '.join(parts)}]"
            return self.emit(expr, [v])
        dim = d(st.integers(0, rank - 1))
        size = shape[dim]
        if size == 0:
            return None
        prefix = ":, " * dim
        if kind == "list":
            idx = d(st.lists(st.integers(-size, size - 1), min_size=1, max_size=3))
            return self.emit(f"{x}[{prefix}{idx!r}]", [v])
        ishape = tuple(d(st.lists(st.integers(0, 3), min_size=1, max_size=2)))
        ival = self.new_input(ishape, I64, values="index", bound=size)
        return self.emit(f"{x}[{prefix}{ival.name}]", [v, ival])

    # ---- the property families (FAMILIES): eager's answers where fjit once gave stale ones ----
    FAMILY_KINDS = {"opaque": ("opaque", "opaque"), "grad": ("detach",),
                    "pymath": ("pymath", "pymath")}
    CHAINS = ("({} * 2 + 1)", "({} * 2 + 1).relu()", "(torch.sigmoid({}) * 3 - 1)",
              "(({} - 0.5).abs() * 2)")

    def float_operand(self, v, rank, dtypes=(F32, F32, F64, BF16)):
        """v if it is a float tensor of `rank` dims, else a new such input (often channels_last)."""
        d = self.draw
        if v is not None and v.dtype in dtypes and len(v.shape) == rank and min(v.shape) >= 1 \
                and d(st.booleans()):
            return v
        shape = [d(st.integers(1, 2)), d(st.integers(1, 3))] + \
            [d(st.integers(2, 5)) for _ in range(rank - 2)]
        layout = {4: "channels_last", 5: "channels_last_3d"}.get(rank)
        if layout is None or d(st.integers(0, 3)) == 0:
            layout = None
        return self.new_input(tuple(shape), d(st.sampled_from(dtypes)), layout=layout)

    def opaque(self, v):
        """An op fjit has no decomposition for (or one whose output layout is not the obvious
        one), whose output is channels_last, transposed or column-major in eager, then an
        elementwise chain over it (what the C and Triton executors fuse)."""
        d = self.draw
        kind = d(st.sampled_from(["conv2d", "conv2d", "pool2d", "pool3d", "interpolate", "norm",
                                  "sdpa", "matmul", "matmul", "linalg", "einsum", "misc"]))
        approx, srcs = True, []
        if kind == "conv2d":
            x = self.float_operand(v, 4)
            n, c, h, w = x.shape
            groups = d(st.sampled_from([g for g in (1, c) if c % g == 0]))
            k = d(st.integers(1, min(h, w, 3)))
            wt = self.new_input((d(st.integers(1, 3)) * groups, c // groups, k, k), x.dtype,
                                values="grid")
            srcs = [x, wt]
            extra = d(st.sampled_from(["", ", padding=1", ", stride=2", ", bias=None"]))
            expr = f"F.conv2d({x.name}, {wt.name}{extra}, groups={groups})"
        elif kind == "pool2d":
            x = self.float_operand(v, 4)
            srcs = [x]
            op = d(st.sampled_from(["max", "avg", "adaptive"]))
            if op == "adaptive":
                expr = f"F.adaptive_avg_pool2d({x.name}, ({d(st.integers(1, 3))}, 2))"
            else:
                approx = op == "avg"
                expr = f"F.{op}_pool2d({x.name}, 2)"
        elif kind == "pool3d":
            x = self.float_operand(v, 5, dtypes=(F32, F64))
            srcs = [x]
            expr = f"F.max_pool3d({x.name}, 2)" if d(st.booleans()) else \
                f"F.avg_pool3d({x.name}, 2)"
            approx = "avg" in expr
        elif kind == "interpolate":
            x = self.float_operand(v, 4)
            srcs = [x]
            mode = d(st.sampled_from(["nearest", "bilinear"]))
            approx = mode != "nearest"
            ac = ", align_corners=False" if mode == "bilinear" else ""
            expr = f"F.interpolate({x.name}, scale_factor=2, mode={mode!r}{ac})"
        elif kind == "norm":
            x = self.float_operand(v, 4, dtypes=(F32, F64))
            srcs = [x]
            if not x.bounded:
                return None
            n, c, h, w = x.shape
            if d(st.booleans()):
                if n * h * w < 2:
                    return None
                expr = f"F.batch_norm({x.name}, None, None, training=True)"
            else:
                g = d(st.sampled_from([g for g in (1, c) if c % g == 0]))
                expr = f"F.group_norm({x.name}, {g})"
        elif kind == "sdpa":
            b, h, ln, e = (d(st.integers(1, 2)), d(st.integers(1, 3)), d(st.integers(1, 4)),
                           d(st.integers(1, 4)))
            dt = d(st.sampled_from([F32, F64]))
            q, k, val = (self.new_input((b, ln, h, e), dt, values="normal") for _ in range(3))
            srcs = [q, k, val]
            expr = f"F.scaled_dot_product_attention({q.name}.transpose(1, 2), " \
                   f"{k.name}.transpose(1, 2), {val.name}.transpose(1, 2))"
        elif kind == "matmul":
            dt = v.dtype if is_float(v.dtype) else d(st.sampled_from([F32, F64, BF16]))
            m, kk, n = d(st.integers(1, 4)), d(st.integers(1, 4)), d(st.integers(1, 4))
            a = self.new_input((kk, m), dt)
            b_ = self.new_input((kk, n), dt)
            srcs = [a, b_]
            expr = d(st.sampled_from([f"({a.name}.mT @ {b_.name})",
                                      f"torch.matmul({a.name}.mT, {b_.name})",
                                      f"F.linear({a.name}.mT, {b_.name}.mT)",
                                      f"({b_.name}.mT @ {a.name}).mT"]))
        elif kind == "linalg":
            n = d(st.integers(1, 4))
            dt = d(st.sampled_from([F32, F64]))
            a = self.new_input((n, n), dt, values="grid")
            b_ = self.new_input((n, d(st.integers(1, 3))), dt, values="grid")
            srcs = [a, b_]
            well = f"(torch.eye({n}, dtype={a.name}.dtype) * 8 + {a.name} * 0.25)"
            expr = d(st.sampled_from([f"torch.linalg.solve({well}, {b_.name})",
                                      f"torch.linalg.inv({well})",
                                      f"torch.linalg.vector_norm({b_.name}, dim=0)",
                                      f"torch.linalg.matrix_norm({a.name})"]))
        elif kind == "einsum":
            dt = d(st.sampled_from([F32, F64]))
            a = self.new_input((d(st.integers(1, 3)), d(st.integers(1, 3))), dt)
            b_ = self.new_input((a.shape[1], d(st.integers(1, 3))), dt)
            srcs = [a, b_]
            expr = d(st.sampled_from([f"torch.einsum('ij,jk->ki', {a.name}, {b_.name})",
                                      f"torch.einsum('ij->ji', {a.name})",
                                      f"torch.einsum('ij,jk->ik', {a.name}, {b_.name})"]))
            approx = "->ji" not in expr
        else:   # misc: sort, cumsum, flip, tril on an existing value
            if v.dtype == BOOL or len(v.shape) == 0:
                return None
            srcs = [v]
            dim = d(st.integers(0, len(v.shape) - 1))
            approx = False
            expr = d(st.sampled_from([f"torch.sort({v.name}, {dim}).values",
                                      f"torch.flip({v.name}, ({dim},))",
                                      f"torch.cumsum({v.name}, {dim})"] +
                                     ([f"torch.tril({v.name})"] if len(v.shape) == 2 else [])))
            approx = "cumsum" in expr and is_float(v.dtype)
            if "sort" in expr and not v.exact:
                return None
        out = self.emit(expr, srcs, approx, real=True)
        if out is None or out.dtype == BOOL or d(st.integers(0, 3)) == 0:
            return out
        chain = d(st.sampled_from(self.CHAINS if is_float(out.dtype) else self.CHAINS[:2]))
        return self.emit(chain.format(out.name), [out], approx="sigmoid" in chain) or out

    REGIONS = {"grad": ("torch.no_grad()", "torch.enable_grad()", "torch.set_grad_enabled(False)",
                        "torch.set_grad_enabled(True)"),
               "autocast": ('torch.autocast("cpu", dtype=torch.bfloat16)',)}

    def region(self):
        """A `with` block of one to three steps under a grad mode or autocast."""
        d = self.draw
        heads = [h for f in sorted(self.families & set(self.REGIONS)) for h in self.REGIONS[f]]
        if len(self.ctx) >= 2 or not heads:
            return self.step()
        head = d(st.sampled_from(heads))
        self.lines.append(f"{'    ' * len(self.ctx)}with {head}:")
        n = len(self.lines)
        self.ctx.append(head)
        try:
            for _ in range(d(st.integers(1, 3))):
                if "autocast" in head and d(st.booleans()):
                    self.opaque_matmul()
                elif d(st.integers(0, 9)) == 0:
                    self.region()
                else:
                    self.step()
            if len(self.lines) == n:
                self.lines.append(f"{'    ' * len(self.ctx)}pass")
        finally:
            self.ctx.pop()

    def opaque_matmul(self):
        """A step autocast changes the dtype of: matmul, linear, conv2d."""
        d = self.draw
        v = self.pick(lambda o: is_float(o.dtype) and len(o.shape) == 2 and min(o.shape) >= 1)
        if v is None or d(st.booleans()):
            v = self.new_input((d(st.integers(1, 4)), d(st.integers(1, 4))), d(st.sampled_from(
                [F32, F32, F64, BF16])))
        w = self.new_input((d(st.integers(1, 4)), v.shape[1]), d(st.sampled_from([F32, v.dtype])))
        expr = d(st.sampled_from([f"({v.name} @ {w.name}.mT)", f"F.linear({v.name}, {w.name})",
                                  f"torch.mm({v.name}, {w.name}.t())"]))
        return self.emit(expr, [v, w], approx=True)

    def detach(self, v):
        if not v.meta.requires_grad:
            return None
        return self.emit(f"{v.name}.detach()", [v])

    PYMATH_SCALARS = ("math.log(abs({s}) + 1.5)", "math.sqrt(abs({s}))", "({s} * 2 + 1)",
                      "round({s}, 2)", "float({s})", "math.floor({s})", "int({s} * 4)",
                      "math.exp(min({s}, 3.0))", "max({s}, 0.5)", "abs({s}) ** 0.5",
                      "len(str({s}))", "math.cos({s})", "({s} if {s} > 0.5 else -{s})")

    def pymath(self, v):
        """Python arithmetic and `math` on a runtime float, feeding a scalar operand, a branch,
        an index or a size: its value changes between calls, so a value baked in is caught."""
        d = self.draw
        if v.dtype == BOOL:
            return None
        s = self.float_arg()
        x = v.name
        kind = d(st.sampled_from(["scalar", "scalar", "scalar", "branch", "index", "size"]))
        if kind == "scalar":
            scalar = d(st.sampled_from(self.PYMATH_SCALARS)).format(s=s)
            expr = f"({x} * {scalar})" if d(st.booleans()) else f"({x} + {scalar})"
            return self.emit(expr, [v], approx=True)
        if kind == "branch":
            cond = d(st.sampled_from([f"{s} > 0.5", f"str({s}).startswith('-')",
                                      f"math.isclose({s}, 1.0)", f"int({s}) % 2 == 0"]))
            return self.emit(f"({x} * 2 if {cond} else {x} - 1)", [v])
        numel = math.prod(v.shape)
        if kind == "index":
            if numel == 0:
                return None
            return self.emit(f"{x}.reshape(-1)[int(abs({s}) * 7) % {numel}]", [v])
        size = d(st.sampled_from([f"{x}.reshape(-1)[: int(abs({s}) * 4)]",
                                  f"(torch.zeros(int(abs({s})) % 5 + 1) + {s})",
                                  f"torch.arange(int(abs({s}) * 2) % 6 + 1) * {x}.sum()"]))
        if "sum()" in size and not is_float(v.dtype):
            return None
        return self.emit(size, [v], approx=True, real=True, sink=True)

    KINDS = ("unary", "unary", "binary", "binary", "binary", "where", "clamp", "cast", "reduce",
             "reduce", "view", "view", "index", "index")

    def step(self):
        v = self.pick()
        for kind in self.draw(st.permutations(self.kinds)):
            if getattr(self, kind)(v) is not None:
                return


@st.composite
def programs(draw, lowp_approx=False, float_args=False, max_steps=6, families=frozenset()):
    b = Builder(draw, lowp_approx=lowp_approx, float_args=float_args, families=families)
    b.new_input()
    if draw(st.booleans()):
        b.new_input()
    for _ in range(draw(st.integers(1, max_steps))):
        if b.families & {"grad", "autocast"} and draw(st.integers(0, 3)) == 0:
            b.region()
        else:
            b.step()
    if float_args:
        while not b.scalars:   # make sure a runtime float is used
            v = b.pick(lambda o: o.dtype != BOOL) or b.new_input(dtype=F32)
            b.emit(f"({v.name} * {b.float_arg()})", [v])
    outs = [b.vals[-1]]
    extra = draw(st.lists(st.integers(0, len(b.vals) - 1), max_size=2))
    for i in extra:
        if b.vals[i] not in outs:
            outs.append(b.vals[i])
    outs += b.sinks
    single = len(outs) == 1 and draw(st.booleans())
    return Program(b.inputs, b.scalars, b.lines, outs, single)


# --------------------------------------------------------------------------------------------------
# Comparing


def assert_matches(actual, expected, program):
    sa, se = pytree.tree_structure(actual), pytree.tree_structure(expected)
    assert sa == se, f"output structure differs: fjit {sa} vs eager {se}"
    outs = program.outputs
    for a, e, v in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), outs):
        assert isinstance(a, torch.Tensor), type(a)
        assert (a.dtype, tuple(a.shape)) == (e.dtype, tuple(e.shape)), \
            f"{v.name}: fjit {a.dtype}{list(a.shape)} vs eager {e.dtype}{list(e.shape)}"
        kw = {}
        if is_float(e.dtype):
            rtol, atol = _TOL[coarsest(e.dtype, v.err)]
            kw = dict(rtol=rtol, atol=atol)
        torch.testing.assert_close(a, e, equal_nan=True, **kw, msg=lambda m, n=v.name: f"{n}: {m}")


def run_eager(fn, args):
    try:
        return fn(*args)
    except (RuntimeError, IndexError, TypeError, ValueError, OverflowError, ZeroDivisionError):
        # Programs are valid by construction (each step ran on meta tensors); real data only adds
        # failures the generator should have ruled out.  Keep this rare.
        assume(False)


# --------------------------------------------------------------------------------------------------
# The properties


@pytest.mark.parametrize("executors", EXECUTORS)
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_random_programs_match_eager(executors, data):
    _check_random_program(executors, data)


@pytest.mark.triton
@settings(max_examples=TRITON_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_random_programs_match_eager_with_triton(data):
    old = os.environ.get("FJIT_TRITON_CPU")
    os.environ["FJIT_TRITON_CPU"] = "1"      # let the Triton executor claim CPU tensors
    try:
        _check_random_program(("triton", "torch"), data)
    finally:
        os.environ["FJIT_TRITON_CPU"] = old if old is not None else "0"


@pytest.mark.ckernels
@settings(max_examples=max(10, EXAMPLES // 3), **SETTINGS)
@given(data=st.data())
def test_random_programs_match_eager_with_runtime_size_kernels(data):
    """Every C kernel with its sizes as parameters (FJIT_KERNEL_SIZES=runtime: what a later sequence
    length or batch size runs, fjit/executors/runtime_sizes.py)."""
    previous = os.environ.get("FJIT_KERNEL_SIZES")
    os.environ["FJIT_KERNEL_SIZES"] = "runtime"
    try:
        _check_random_program(("c", "torch"), data)
    finally:
        if previous is None:
            del os.environ["FJIT_KERNEL_SIZES"]
        else:
            os.environ["FJIT_KERNEL_SIZES"] = previous


def _check_random_program(executors, data):
    program = data.draw(programs(lowp_approx="triton" in executors), label="program")
    fn = program.function()
    args = program.args()
    expected = run_eager(fn, args)
    jf = fjit.jit(fn, executors=executors)
    actual = jf(*args)
    assert_matches(actual, expected, program)
    # a second call with fresh inputs of the same metadata reuses the compiled program
    args2 = program.args()
    assert_matches(jf(*args2), fn(*args2), program)
    info = fjit.cache_info(jf)
    assert (info.hits, info.misses) == (1, 1), info


_FLOATS = st.one_of(
    st.sampled_from([0.0, -0.0, 1.0, 2.0, -1.0, 0.5, 1e-3, 3.0, 1e6, float("inf")]),
    st.floats(-100, 100, allow_nan=False, width=32),
)


@pytest.mark.parametrize("executors", EXECUTORS)
@settings(max_examples=SCALAR_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_float_scalars_do_not_recompile(executors, data):
    """Python floats are runtime values: new values reuse the one compiled program."""
    program = data.draw(programs(lowp_approx="triton" in executors, float_args=True, max_steps=4),
                        label="program")
    fn = program.function()
    jf = fjit.jit(fn, executors=executors)
    calls = [[v for _, v in program.scalars]] + [
        data.draw(st.lists(_FLOATS, min_size=len(program.scalars), max_size=len(program.scalars)),
                  label="floats") for _ in range(3)]
    for scalars in calls:
        args = program.args(scalars)
        expected = run_eager(fn, args)
        assert_matches(jf(*args), expected, program)
    info = fjit.cache_info(jf)
    assert info.misses == 1, f"{info}: float arguments {calls} recompiled"
    assert info.hits == len(calls) - 1, info


# --------------------------------------------------------------------------------------------------
# The family property: grad mode, autocast, layouts of opaque ops' outputs, Python math on floats


# floats for the later calls: finite (int() and str() of them must work), signs and zeros included
_PYFLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1.0, 0.5, -1.5, 2.25, 7.0, -3.75, 0.1]),
                      st.floats(-10, 10, allow_nan=False, width=32))


def assert_layouts_match(actual, expected, program):
    for a, e, v in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), program.outputs):
        if not isinstance(e, torch.Tensor) or e.numel() <= 1:
            continue
        formats = [torch.contiguous_format] + \
            {4: [torch.channels_last], 5: [torch.channels_last_3d]}.get(e.dim(), [])
        for fmt in formats:
            assert a.is_contiguous(memory_format=fmt) == e.is_contiguous(memory_format=fmt), \
                f"{v.name}: is_contiguous({fmt}) fjit {a.is_contiguous(memory_format=fmt)} vs " \
                f"eager {e.is_contiguous(memory_format=fmt)} (strides fjit {a.stride()}, " \
                f"eager {e.stride()})"


def assert_grads_match(actual, expected, program, args_a, args_e):
    """requires_grad of every output, and d(sum of outputs)/d(inputs requiring grad): `actual`
    was computed from args_a, `expected` from args_e (separate leaves, equal values)."""
    outs = list(zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected), program.outputs))
    for a, e, v in outs:
        if isinstance(e, torch.Tensor):
            assert a.requires_grad == e.requires_grad, \
                f"{v.name}: requires_grad fjit {a.requires_grad} vs eager {e.requires_grad}"
    wrt_a = [t for t, s in zip(args_a, program.inputs) if s.requires_grad]
    wrt_e = [t for t, s in zip(args_e, program.inputs) if s.requires_grad]
    differentiable = [(a, e) for a, e, _ in outs if isinstance(e, torch.Tensor) and e.requires_grad]
    if not wrt_e or not differentiable:
        return
    try:
        ge = torch.autograd.grad(sum(e.sum().double() for _, e in differentiable), wrt_e,
                                 allow_unused=True)
    except RuntimeError:
        # torch's own backward can refuse a program it ran forward (clamp's backward, with a
        # tensor bound of higher rank than the result's operand, writes a broadcast grad into
        # the operand's shape): there is no eager gradient to compare with.  fjit's torch calls
        # refuse it alike; its compiled backward reduces the broadcast grad as for any operand.
        return
    ga = torch.autograd.grad(sum(a.sum().double() for a, _ in differentiable), wrt_a,
                             allow_unused=True)
    err = coarsest(*[v.err for v in program.outputs], *[s.dtype for s in program.inputs
                                                       if s.requires_grad])
    rtol, atol = _TOL[coarsest(err, F32)]
    for i, (a, e) in enumerate(zip(ga, ge)):
        name = [s.name for s in program.inputs if s.requires_grad][i]
        assert (a is None) == (e is None), \
            f"grad of {name}: fjit {'None' if a is None else 'a tensor'} vs eager " \
            f"{'None' if e is None else 'a tensor'}"
        if e is not None:
            torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m, n=name: f"grad of {n}: {m}")


def check_family_program(executors, data, families=None, max_steps=6):
    """One program of the property families: every call (the build-time floats, then two new
    ones) agrees with eager in values, dtypes, shapes, requires_grad and gradients, and (with
    layout_checks) in the contiguity eager's outputs have."""
    families = FAMILIES if families is None else families
    program = data.draw(programs(lowp_approx="triton" in executors, float_args=True,
                                 max_steps=max_steps, families=families), label="program")
    fn = program.function()
    jf = fjit.jit(fn, executors=executors)
    n = len(program.scalars)
    first = [v for _, v in program.scalars]
    calls = [first] + [data.draw(st.lists(_PYFLOATS, min_size=n, max_size=n), label="floats")
                       for _ in range(2 if n else 1)]
    for scalars in calls:
        args_e, args_a = program.args(scalars), program.args(scalars)
        expected = run_eager(fn, args_e)
        actual = jf(*args_a)
        assert_matches(actual, expected, program)
        assert_grads_match(actual, expected, program, args_a, args_e)
        if "layout_checks" in families:
            assert_layouts_match(actual, expected, program)


@pytest.mark.parametrize("executors", EXECUTORS)
@settings(max_examples=FAMILY_EXAMPLES, **SETTINGS)
@given(data=st.data())
def test_family_programs_match_eager(executors, data):
    check_family_program(executors, data)


@pytest.mark.triton
@settings(max_examples=max(5, FAMILY_EXAMPLES // 3), **SETTINGS)
@given(data=st.data())
def test_family_programs_match_eager_with_triton(data):
    with _env("FJIT_TRITON_CPU", "1"):      # let the Triton executor claim CPU tensors
        check_family_program(("triton", "torch"), data)


@pytest.mark.ckernels
@settings(max_examples=20, **SETTINGS)
@given(data=st.data())
def test_check_mode_random_programs(data):
    """FJIT_CHECK=1 on random programs: every stage agrees with the first, and every torch
    fallback's real output metadata is the recorded one (tests/api/test_check_mode.py)."""
    with _env("FJIT_CHECK", "1"):
        check_family_program(("c", "torch"), data, max_steps=4)


@contextlib.contextmanager
def _env(name, value):
    """os.environ[name] = value for the block (hypothesis tests cannot take monkeypatch)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
