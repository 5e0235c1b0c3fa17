"""Symbolic sizes: a trace whose input dims are symbols, so that one program serves every value.

A compilation that makes some input dims symbolic (fjit/cache.py decides which: the dims whose
value changed between calls that would otherwise share a program) traces under a `SymbolicSizes`:
torch's own `ShapeEnv` holds the symbols, each with the value of the compiling call as its hint,
and meta runs become fake-tensor runs in that environment, so torch's shape rules compute the
outputs' sizes as expressions of the symbols.  Every decision taken on a symbolic size -- a
comparison in the user's code, in a shape rule or in one of fjit's passes, `int()` of one -- is
decided by its hint and recorded by the environment as a guard.  The program is valid exactly
where the guards hold: a call checks them on its inputs' sizes (`Guards`), and one that fails
them compiles again.

Sizes 0 and 1 are specialized (as torch.compile does): a broadcast against a dim of size 1 is
another program.  One exception: a dim that an earlier call had at size 1 (a batch of one before
a batch of two) may be made a symbol whose value may be 1 (`ones`).  Its compile takes torch's
size-oblivious rules (`backed_size_oblivious`, as torch.export does): where a rule would branch
on the size being 1 (broadcasting, contiguity, a view's strides), it takes the general branch and
guards what that branch needs; user code's comparisons are guarded as ever.  What such rules cannot
guard is a layout that torch computes otherwise at size 1 (a reshape that copies at 2 is a view at
1), so the program serves a call with such a dim at 1 only once its forward and backward have been
replayed at that call's sizes on meta tensors and every torch op's output layout came out as the
program recorded it (`at_one`, checked once per pattern of ones).  The printed program binds each
symbol from the input dim it stands for (`s0 = x.shape[1]`) and computes every size from them.

sympy and torch's symbolic_shapes (0.4 s) are imported on first use, inside the functions that
need them: `import fjit` does not load them.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import time
import weakref
from typing import Callable

import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode

from fjit.core.guards import GUARD_NAMES, Guards
from fjit.core.ir import BoundSymbol, TensorVar, flatten_values, map_values

_ACTIVE = threading.local()
_BY_ENV: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # ShapeEnv -> ref to its SymbolicSizes


class SymbolicUnsupported(Exception):
    """A symbolic size reached something that cannot compute with it: the call is compiled with
    specialized sizes instead, this as the reason."""


class SymbolicTooSlow(SymbolicUnsupported):
    """The symbolic compile ran past its time budget (SymbolicSizes.deadline): the expressions of
    its sizes grew too large for the shape environment to reason about quickly (a window
    attention's padding, (H//4 + (7 - H//4 % 7) % 7)//7, over a symbolic image height)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a symbol's value comes from: dim `dim` of the flat input at `position`, named `name`
    in the program."""
    position: int
    name: str
    dim: int


class SymbolicSizes:
    """The symbols of one compilation, where they come from, and the guards taken on them."""

    def __init__(self, dynamic: dict[int, frozenset], ones: dict[int, frozenset] | None = None,
                 budget: float | None = None):
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
        self.dynamic = dynamic          # flat input position -> the dims made symbolic
        self.ones = ones or {}          # of those, the dims whose symbol may be 1
        # No duck sizing: two dims equal at this call are two symbols until something equates them
        # (a guard then says so); 0 and 1 are specialized.
        self.env = ShapeEnv(duck_shape=False)
        # time.perf_counter() past which the shape environment's next question raises
        # SymbolicTooSlow (None: no limit; the compile sets it to None when it is done, as a
        # program asks the environment again at a call with a symbol at 1)
        self.budget = budget
        self.deadline: float | None = None if budget is None else time.perf_counter() + budget
        self.env.evaluate_expr = self._timed(self.env.evaluate_expr)
        self.env.get_implications = _implications(self.env.get_implications)
        self.fake = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        if self.ones:      # its cache rebuilds each output through set_(), which guards s != 1
            self.fake.cache_enabled = False
        self.sources: dict = {}        # the environment's symbol -> its Source
        self.names: dict = {}          # the environment's symbol -> s0, s1, ... (sympy symbols)
        self.specialized: list[tuple[Source, int]] = []       # dims asked for that are 0 or 1
        self._inputs: dict[int, tuple] = {}     # flat position -> (shape, strides) made for it
        self.symints: dict = {}                  # the environment's symbol -> its SymInt
        _BY_ENV[self.env] = weakref.ref(self)     # not the object: a value must not hold its key

    def _timed(self, evaluate):
        """The environment's evaluate_expr (every guard goes through it), raising SymbolicTooSlow
        once the deadline has passed: from the outermost call only, as torch logs an error that
        passes through one."""
        depth = [0]

        def asked(*args, **kwargs):
            if not depth[0] and self.deadline is not None and time.perf_counter() > self.deadline:
                raise SymbolicTooSlow(f"the symbolic compile took over its budget of {self.budget:.0f} s")
            depth[0] += 1
            try:
                return evaluate(*args, **kwargs)
            finally:
                depth[0] -= 1
        return asked

    @contextlib.contextmanager
    def shape_rules(self):
        """Where meta runs take torch's symbolic shape rules: fake tensors of this environment, with
        the Python dispatcher on (as Dynamo runs them), so that an op whose C++ meta kernel wants
        concrete sizes (F.pad's constant_pad_nd) takes its Python decomposition, which computes with
        the symbols, instead of pinning them."""
        # The sharp-edge observer's profile hook (strict/observer.py) watches user code; torch's
        # Python shape rules and sympy run no user code and make ~10^6 calls per model: unwatched.
        hook = sys.getprofile()
        sys.setprofile(None)
        try:
            with self.fake, enable_python_dispatcher(), self.oblivious():
                yield
        finally:
            sys.setprofile(hook)

    def oblivious(self):
        """torch's size-oblivious rules where a symbol may be 1 (see the module's docstring): in
        its shape rules, and around the whole compile (fjit's passes and autodiff ask torch's
        broadcasting and layout helpers too)."""
        if not self.ones:
            return contextlib.nullcontext()
        from torch.fx.experimental import _config
        return _config.patch(backed_size_oblivious=True)

    def shape_of(self, x: torch.Tensor, position: int, name: str) -> tuple[tuple, tuple]:
        """(shape, strides) of the input `x` at flat `position`: its dynamic dims symbolic, its
        strides the contiguous ones of that shape (an input with dynamic dims is contiguous)."""
        dims = self.dynamic.get(position)
        if not dims:
            return tuple(x.shape), x.stride()
        made = self._inputs.get(position)
        if made is not None:         # a retrace of the same call: the same symbols
            return made
        if not x.is_contiguous():
            raise SymbolicUnsupported(f"input {name} is not contiguous")
        shape = tuple(self.size(n, position, name, d) if d in dims else n for d, n in enumerate(x.shape))
        strides, step = [], 1
        for n in reversed(shape):      # as torch lays out a contiguous tensor (a 0-size dim as 1)
            strides.append(step)
            step = step * (n if isinstance(n, torch.SymInt) else max(n, 1))
        made = self._inputs[position] = (shape, tuple(reversed(strides)))
        return made

    def size(self, hint: int, position: int, name: str, dim: int):
        """A symbolic size for dim `dim` of input `name` (flat position `position`) whose value at
        this call is `hint` (a plain int where the environment specializes it: 0 or 1)."""
        from torch._dynamo.source import ConstantSource    # torch._dynamo: 0.7 s, not on `import fjit`
        from torch.fx.experimental.symbolic_shapes import DimDynamic
        import sympy
        may_be_one = dim in self.ones.get(position, ())
        symbol = self.env.create_symbol(hint, ConstantSource(f"{name}.shape[{dim}]"),
                                        dynamic_dim=DimDynamic.DYNAMIC, do_not_specialize_zero_one=may_be_one)
        if may_be_one and isinstance(symbol, sympy.Symbol):
            self.env._constrain_range_for_size(symbol, min=1)     # 1 and up; 0 stays specialized
        if not isinstance(symbol, sympy.Symbol):
            self.specialized.append((Source(position, name, dim), hint))
            return hint
        self.sources[symbol] = Source(position, name, dim)
        self.names[symbol] = sympy.Symbol(f"s{len(self.names)}", integer=True, positive=True)
        made = self.symints[symbol] = self.env.create_symintnode(symbol, hint=hint)
        return made

    # -- kernels of symbolic regions -------------------------------------------------------------
    def symbols_of(self, x) -> list:
        """The symbols (as SymInts, in the order they were made) that the sizes in `x` (any nesting
        of values, variables, bound symbols and dataclasses of them) are expressions of."""
        found: set = set()
        _walk_sizes(x, lambda v: found.update(self.env.simplify(v.node.expr).free_symbols))
        return [self.symints[s] for s in self.sources if s in found]

    def instantiator(self, x, symbols: list) -> Callable:
        """A function `instance(values, sized=None)` of values of the symbols `symbols` (SymInts)
        giving `x` (as symbols_of takes it) with every size evaluated at them: a region of a
        symbolic program instantiated for one call's sizes (what a kernel is generated from).
        The sizes' expressions are compiled once, into one Python function of the symbols (sympy
        costs ~30 us an expression; a region holds hundreds of sizes, and a new length
        instantiates every region).

        `sized(index, value, text, size)`, where given, makes what each symbolic int (`size`)
        becomes instead of its value: `index` numbers its distinct expression, `text` is that
        expression in Python of v0, v1, ... (the values of `symbols`, in order), None where it is
        a constant."""
        import sympy
        nodes: dict[int, int] = {}          # id(SymNode) -> its expression's index
        exprs: dict = {}                    # simplified expression -> index

        def visit(v):
            if id(v.node) not in nodes:
                expr = self.env.simplify(v.node.expr)
                nodes[id(v.node)] = exprs.setdefault(expr, len(exprs))
        _walk_sizes(x, visit)
        params = [str(self.names[s.node.expr]) for s in symbols]
        names = {s.node.expr: self.names[s.node.expr] for s in symbols}
        if not all(e.free_symbols <= set(names) for e in exprs):
            raise SymbolicUnsupported("a size of symbols the region is not given")
        body = "".join(f"{_printer().doprint(e.xreplace(names))}, " for e in exprs)
        evaluate = eval(f"lambda {', '.join(params)}: ({body})", dict(GUARD_NAMES))  # noqa: S307
        positions = {s.node.expr: sympy.Symbol(f"v{k}") for k, s in enumerate(symbols)}
        texts = [None if e.is_number else _printer().doprint(e.xreplace(positions)) for e in exprs]

        def instance(values: tuple, sized: Callable | None = None):
            results = evaluate(*values)

            def size(v):
                index = nodes[id(v.node)]
                value = results[index]
                value = int(value) if isinstance(v, torch.SymInt) else float(value) \
                    if isinstance(v, torch.SymFloat) else bool(value)
                return value if sized is None else sized(index, value, texts[index], v)
            return _concrete(x, size, {})
        return instance

    # -- printing ------------------------------------------------------------------------------
    def text(self, value) -> str:
        """A symbolic int as a Python expression of the program's size names (s0, s1, ...)."""
        expr = self.env.simplify(value.node.expr)
        if not expr.free_symbols <= set(self.names):
            raise SymbolicUnsupported(f"a size {expr} of no input dim")
        return _printer().doprint(expr.xreplace(self.names))

    def bindings(self, inputs: list, used) -> list[str]:
        """The program's lines binding each size name that `used` (the program's ops and output)
        refers to: from the input dim it stands for, else (a compiled backward, whose inputs are
        saved values and cotangents) solved from a dim of an input that is linear in it, given
        the names bound already (`t.shape[0] // s0` for a dim `s0*s2`)."""
        needed = [s for s in self.sources if s in {x.node.expr for x in self.symbols_of(used)}]
        names = {v.name for v in inputs}
        numbers = {v.name for v in inputs if not isinstance(v, TensorVar)}
        clash = names & {str(n) for n in self.names.values()} - numbers
        if clash:
            raise SymbolicUnsupported(f"an input is named as a size ({', '.join(sorted(clash))})")
        lines, bound = [], set()
        for symbol in needed:
            source = self.sources[symbol]
            if str(self.names[symbol]) in numbers:      # passed in (a compiled backward)
                bound.add(symbol)
            elif source.name in names:
                lines.append(f"{self.names[symbol]} = {source.name}.shape[{source.dim}]")
                bound.add(symbol)
        progress = True
        while progress and len(bound) < len(needed):
            progress = False
            for symbol in needed:
                if symbol not in bound:
                    line = self._solved(symbol, bound, inputs)
                    if line is not None:
                        lines.append(line)
                        bound.add(symbol)
                        progress = True
        missing = [str(self.names[s]) for s in needed if s not in bound]
        if missing:
            raise SymbolicUnsupported(f"size{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                                      f"of no input of this program")
        return lines

    def _solved(self, symbol, bound: set, inputs: list) -> str | None:
        """`name = ...` computing `symbol` from a dim of one of `inputs` that is `a*symbol + b`,
        a and b expressions of the symbols `bound` (a dim of a compiled backward's saved value),
        or None."""
        import sympy
        for v in inputs:
            if not isinstance(v, TensorVar):
                continue
            for d, n in enumerate(v.shape):
                if not isinstance(n, torch.SymInt):
                    continue
                expr = self.env.simplify(n.node.expr)
                if symbol not in expr.free_symbols or not expr.free_symbols <= bound | {symbol}:
                    continue
                expanded = sympy.expand(expr)
                a, b = expanded.coeff(symbol, 1), expanded.coeff(symbol, 0)
                if a == 0 or symbol in a.free_symbols or symbol in b.free_symbols or \
                        sympy.expand(a * symbol + b - expanded) != 0:
                    continue
                dim = f"{v.name}.shape[{d}]"
                rest = "" if b == 0 else f" - ({_printer().doprint(b.xreplace(self.names))})"
                value = f"({dim}{rest})" if rest else dim
                divisor = "" if a == 1 else f" // ({_printer().doprint(a.xreplace(self.names))})"
                return f"{self.names[symbol]} = {value}{divisor}"
        return None

    def described(self) -> str:
        """'s0 = x.shape[1], s1 = y.shape[0]' (what the symbols stand for)."""
        return ", ".join(f"{self.names[s]} = {src.name}.shape[{src.dim}]" for s, src in self.sources.items())

    # -- guards --------------------------------------------------------------------------------
    def guards(self) -> Guards:
        """The conditions under which the compiled program is valid, as a check on a call's flat
        inputs."""
        import sympy
        conditions: list[str] = []
        shown: list[str] = []
        for source, value in self.specialized:
            conditions.append(f"L[{source.position}].shape[{source.dim}] == {value}")
            shown.append(f"{source.name}.shape[{source.dim}] == {value}")
        # the program computes an input's strides from its sizes as contiguous ones (shape_of)
        for position in sorted({src.position for src in self.sources.values()}):
            name = next(src.name for src in self.sources.values() if src.position == position)
            conditions.append(f"L[{position}].is_contiguous()")
            shown.append(f"{name} is contiguous")
        by_source = {s: sympy.Symbol(f"L[{src.position}].shape[{src.dim}]") for s, src in self.sources.items()}
        for symbol, source in self.sources.items():
            bounds = self.env.var_to_range.get(symbol)
            lower = int(bounds.lower) if bounds is not None and bounds.lower.is_Integer else 2
            conditions.append(f"L[{source.position}].shape[{source.dim}] >= {lower}")
            shown.append(f"{self.names[symbol]} >= {lower}")
            if bounds is not None and bounds.upper.is_Integer:
                conditions.append(f"L[{source.position}].shape[{source.dim}] <= {int(bounds.upper)}")
                shown.append(f"{self.names[symbol]} <= {int(bounds.upper)}")
        for guard in self.env.guards:
            expr = guard.expr
            if expr in (sympy.true, True):
                continue
            if not expr.free_symbols <= set(self.sources):
                raise SymbolicUnsupported(f"a guard {expr} on a size of no input dim")
            conditions.append(_printer().doprint(expr.xreplace(by_source)))
            shown.append(_printer().doprint(expr.xreplace(self.names)))
        ones = [(src.position, src.dim, str(self.names[s])) for s, src in self.sources.items()
                if (b := self.env.var_to_range.get(s)) is not None and b.lower == 1]
        specialized = [self.names[s] for s in self.sources if self._constant(s)]
        if specialized and len(specialized) == len(self.sources):
            raise SymbolicUnsupported(f"size{'s' if len(specialized) > 1 else ''} "
                                      f"{', '.join(map(str, specialized))} ended up specialized "
                                      f"(something read its value): no gain over one program per shape")
        return Guards(conditions, shown, ones)

    def _constant(self, symbol) -> bool:
        """Whether the guards pin `symbol` to one value (an int() of it, an equality with a constant)."""
        replaced = self.env.replacements.get(symbol)
        if replaced is not None and replaced.is_number:
            return True
        bounds = self.env.var_to_range.get(symbol)
        return bounds is not None and bounds.lower == bounds.upper

    def concrete(self, leaves: list) -> Callable:
        """A function giving any symbolic int (or a plain one) its value at the call with flat
        inputs `leaves`, taking no guard."""
        values = {s: int(leaves[src.position].shape[src.dim]) for s, src in self.sources.items()}

        def value(x):
            if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                v = self.env.simplify(x.node.expr).xreplace(values)
                return int(v) if isinstance(x, torch.SymInt) else float(v) if isinstance(x, torch.SymFloat) else bool(v)
            return x
        return value


def _walk_sizes(x, visit) -> None:
    """Call `visit` on every symbolic int inside `x` (see SymbolicSizes.symbols_of): the leaves of
    its nested containers (ir.flatten_values), into variables, bound symbols, sets and
    dataclasses (a fusion region)."""
    for leaf in flatten_values(x):
        if isinstance(leaf, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            visit(leaf)
        elif isinstance(leaf, TensorVar):
            for s in (*leaf.shape, *leaf.strides):
                if isinstance(s, torch.SymInt):
                    visit(s)
        elif isinstance(leaf, BoundSymbol):
            _walk_sizes((leaf.args, leaf.kwargs, leaf.output, leaf.subsymbols), visit)
        elif isinstance(leaf, (set, frozenset)):
            _walk_sizes(tuple(leaf), visit)
        elif dataclasses.is_dataclass(leaf) and not isinstance(leaf, type):
            _walk_sizes(tuple(getattr(leaf, f.name) for f in dataclasses.fields(leaf)), visit)


def _concrete(x, size, memo: dict):
    """`x` rebuilt (ir.map_values) with every symbolic int replaced by size(it), through the same
    values _walk_sizes reaches (variables made once per name: `memo`)."""
    def leaf(y):
        if isinstance(y, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return size(y)
        if isinstance(y, TensorVar):
            made = memo.get(y.name)
            if made is None:
                dims = lambda sizes: tuple(size(s) if isinstance(s, torch.SymInt) else s for s in sizes)  # noqa: E731
                made = memo[y.name] = y.replaced(shape=dims(y.shape), strides=dims(y.strides))
            return made
        if isinstance(y, BoundSymbol):
            return y.replace(args=_concrete(y.args, size, memo), kwargs=_concrete(y.kwargs, size, memo),
                             output=_concrete(y.output, size, memo),
                             subsymbols=_concrete(y.subsymbols, size, memo))
        if isinstance(y, (set, frozenset)):
            return type(y)(_concrete(z, size, memo) for z in y)
        if dataclasses.is_dataclass(y) and not isinstance(y, type):
            return dataclasses.replace(y, **{f.name: _concrete(getattr(y, f.name), size, memo)
                                             for f in dataclasses.fields(y) if f.init})
        return y
    return map_values(leaf, x)


@functools.cache
def _printer():
    """torch's Python printer of sympy expressions, made on first use (sympy's printers are not
    imported with fjit)."""
    from torch.utils._sympy.printers import PythonPrinter
    return PythonPrinter()


def _implications(implied):
    """The shape environment's get_implications (the facts a guard adds to its axioms, to decide
    later questions without guarding), except for a conjunction, disjunction or negation, which
    adds none: torch brings those to conjunctive normal form first, which can take exponential
    time (a view's stride check over a window attention's padded sizes, And/Or of Mod and
    FloorDiv terms, ran for minutes in sympy's distribution).  Fewer axioms decide fewer questions
    statically; each such question is then guarded, which is never wrong."""
    import sympy

    def implications(e):
        if isinstance(e, (sympy.And, sympy.Or, sympy.Not)):
            return ()
        return implied(e)
    return implications


def active() -> SymbolicSizes | None:
    """The symbolic sizes of the compilation this thread is tracing, if any."""
    return getattr(_ACTIVE, "sizes", None)


@contextlib.contextmanager
def symbolic(sizes: SymbolicSizes | None):
    """Trace and compile under `sizes` (None: sizes stay concrete)."""
    old = active()
    _ACTIVE.sizes = sizes
    try:
        yield sizes
    finally:
        _ACTIVE.sizes = old


def is_symbolic(x) -> bool:
    """Whether `x` (a size, or a tuple of them) holds a symbolic int."""
    if isinstance(x, (tuple, list, torch.Size)):
        return any(isinstance(s, torch.SymInt) for s in x)
    return isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool))


def known(condition) -> bool:
    """Whether `condition` (a bool, or a comparison of symbolic sizes) holds at every size,
    taking no guard: for optional rewrites whose "no" is always right, which a guard would only
    split into programs per size class."""
    if isinstance(condition, torch.SymBool):
        from torch.fx.experimental.symbolic_shapes import statically_known_true
        return statically_known_true(condition)
    return bool(condition)


def at_hint(condition) -> bool:
    """`condition` (a bool, or a comparison of symbolic sizes) at the compiling call's sizes,
    taking no guard: for a choice made for speed alone, where either answer computes the same
    values (a crossover between two ways of computing an op, a thread split worth starting).  A
    guard there would split a symbolic program into one per size class, and a batch that crosses
    the line compiles again for nothing; the program keeps the choice that suits the sizes it was
    compiled at (as Inductor's heuristics read size hints)."""
    if isinstance(condition, torch.SymBool):
        node = condition.node
        if node.has_hint():
            return bool(node.hint)
        return bool(node.shape_env.size_hint(node.expr))
    return bool(condition)


def is_one(n) -> bool:
    """Whether the size `n` is 1, a symbolic one decided size-obliviously, taking no guard: a
    symbol that may be 1 (SymbolicSizes.ones) was never broadcast in the trace (torch's shape rules
    took the general branch for it, guarding what that needs), so it counts as not 1, as for
    every other symbol."""
    if isinstance(n, torch.SymInt):
        return n.node.shape_env.evaluate_expr((n == 1).node.expr, size_oblivious=True)
    return n == 1


def hint(x):
    """A size's value at the compiling call (a plain int as itself), taking no guard: for questions
    whose answer the caller has made hold at every size by guards of its own."""
    if isinstance(x, torch.SymInt):
        return int(x.node.shape_env.optimization_hint(x.node.expr))
    return x


def same(a, b) -> bool:
    """`a == b` (sizes, or tuples of them, or any values) decided without taking a guard: a
    symbolic size is the same as another only where their expressions are identical.  For the
    choices of passes that are optional (reuse a buffer, drop a view that changes nothing), whose
    "no" is always right: a guard there would make the program one of fewer sizes for nothing."""
    if isinstance(a, (tuple, list, torch.Size)) and isinstance(b, (tuple, list, torch.Size)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    symbolic_a, symbolic_b = is_symbolic(a), is_symbolic(b)
    if not symbolic_a and not symbolic_b:
        return a == b
    ea = a.node.expr if symbolic_a else a
    eb = b.node.expr if symbolic_b else b
    sizes = sizes_of(a if symbolic_a else b)
    if sizes is not None:
        ea, eb = sizes.env.simplify(ea) if symbolic_a else ea, sizes.env.simplify(eb) if symbolic_b else eb
    return bool(ea == eb) if not (isinstance(ea, int) and isinstance(eb, int)) else ea == eb


def shape_rules_for(*values):
    """The shape rules (SymbolicSizes.shape_rules) of the symbolic sizes among `values` (sizes,
    and variables' shapes and strides), else a context that changes nothing: where meta tensors
    of a symbolic program's values are made, to replay a view or a reshape on them."""
    for v in values:
        for n in (*v.shape, *v.strides) if isinstance(v, TensorVar) else (v,):
            sizes = sizes_of(n)
            if sizes is not None:
                return sizes.shape_rules()
    return contextlib.nullcontext()


def sizes_of(x) -> SymbolicSizes | None:
    """The SymbolicSizes a symbolic int belongs to (None for a plain one)."""
    node = getattr(x, "node", None)
    ref = None if node is None else _BY_ENV.get(node.shape_env)
    return None if ref is None else ref()


def size_text(s) -> str:
    """A size as printed: its value, or a symbolic one's expression of the size names."""
    sizes = sizes_of(s)
    if sizes is not None:
        try:
            return sizes.text(s)
        except SymbolicUnsupported:
            pass
    return str(s)
