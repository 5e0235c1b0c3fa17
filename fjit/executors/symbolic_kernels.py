"""Kernels of a symbolic program's regions (core/symbolic.py): one generated kernel serves every
set of values of the program's symbols at which the generator decides the same.

`parametric` gives a region at some values of the symbols with every size that is an expression
of them a runtime size (`runtime_sizes.Size`: `sz0, sz1, ...`, each carrying that expression),
the static sizes literals.  Generated inside `runtime_sizes.recording`, the kernel comes with the
decisions the generator took on those sizes, as conditions on the symbols (`condition`): where
they come out the same, generating again would write the same source.  `Variants` keeps a
region's kernels by those conditions, `SymbolicLauncher` launches one per call's sizes, and
`evaluator` computes what a launch needs from the symbols (layouts, a grid).
"""
from __future__ import annotations

import collections
import threading

from fjit import config
from fjit.core.ir import BoundSymbol
from fjit.core.symbolic import hint
from fjit.executors import kernel_bsym
from fjit.executors.runtime_sizes import Size, note, python, recording
from fjit.passes.fusion import Region


# -- regions of symbolic programs --------------------------------------------------------------------

def parametric(instance, values: tuple, hints: tuple, div: str = "/") -> tuple[Region, list[Size]]:
    """A symbolic program's region at the symbols' `values`, every size that is an expression of
    the symbols a parameter (sz0, sz1, ... in order of appearance, one per distinct expression,
    each carrying that expression as `sym` and its value at the symbols' `hints` as `hint`), the
    static sizes literals; and the parameters.  `instance`: the region's
    SymbolicSizes.instantiator.  Called inside `recording`: a float or bool computed from the
    symbols is written into the source as a value, recorded as such."""
    at_hints: dict[int, int] = {}
    instance(hints, lambda index, value, text, size: at_hints.setdefault(index, value))
    params: dict[int, Size] = {}

    def sized(index: int, value, text: str | None, size):
        if text is None:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            note(f"({text} == {value!r})", True)
            return value
        made = params.get(index)
        if made is None:
            made = params[index] = Size(value, f"sz{len(params)}", div, text, at_hints[index])
        return made
    return instance(values, sized), list(params.values())


def condition(decisions: dict, arity: int):
    """The recorded decisions (`recording`) as one compiled check of the symbols' values: whether
    a kernel generated where they were recorded is the kernel of those values."""
    args = ", ".join(f"v{k}" for k in range(arity))
    terms = [c if outcome is True else f"not {c}" if outcome is False else f"({c}) == {outcome!r}"
             for c, outcome in decisions.items()]
    source = f"lambda {args}: " + (" and ".join(terms) if terms else "True")
    check = eval(source, {})     # noqa: S307 - fjit's own text: names v0.., integers and operators
    check.text = source
    return check


def evaluator(x, arity: int):
    """A function of the symbols' values giving `x` (nested tuples, lists and dicts of ints and
    Sizes of a parametric region: layouts, a grid) with every Size evaluated at them."""
    texts: list[str] = []

    def collect(y):
        if isinstance(y, Size):
            texts.append(python(y))
        elif isinstance(y, (tuple, list)):
            for z in y:
                collect(z)
        elif isinstance(y, dict):
            for z in y.values():
                collect(z)
    collect(x)
    args = ", ".join(f"v{k}" for k in range(arity))
    compute = eval(f"lambda {args}: ({''.join(t + ', ' for t in texts)})", {})     # noqa: S307 - fjit's own text

    def rebuild(y, values):
        if isinstance(y, Size):
            return next(values)
        if isinstance(y, (tuple, list)):
            return type(y)(rebuild(z, values) for z in y)
        if isinstance(y, dict):
            return {k: rebuild(z, values) for k, z in y.items()}
        return y
    return lambda symbols: rebuild(x, iter(compute(*symbols)))


class Variants:
    """The kernels of one region of a symbolic program: one per set of recorded decisions.

    `generate(values)` generates the region's kernel at the symbols' `values` (a parametric
    region), returning (kernel, region); it runs inside `recording`, so the kernel comes with the
    conditions under which generating gives the same source.  `prepare(kernel, region)` makes what
    the language needs once per kernel (a launcher, compiled functions).  A set of values is served
    by the first variant whose conditions it passes; a new kernel is generated only where none
    does.  Under FJIT_CHECK=1 each reuse is checked against a fresh generation."""

    def __init__(self, generate, prepare, language: str):
        self.generate, self.prepare, self.language = generate, prepare, language
        self.items: list[tuple] = []      # (condition, kernel, prepared), the first made first

    def __call__(self, values: tuple):
        """(the kernel, its preparation) for the symbols' `values`."""
        _, kernel, prepared = self.item(values)
        return kernel, prepared

    def item(self, values: tuple) -> tuple:
        """(its condition, the kernel, its preparation) of the variant serving `values`."""
        for item in self.items:
            if item[0](*values):
                if config.check_mode():
                    self._check(values, item[1])
                return item
        kernel, decisions, region = self._generated(values)
        # (prepared anew even where the source equals an earlier variant's: what is launched with
        # it -- a Triton grid computed from a size read out of a Size -- may differ; the binary is
        # shared by the source's name)
        item = (condition(decisions, len(values)), kernel, self.prepare(kernel, region))
        self.items.append(item)
        return item

    def _generated(self, values: tuple):
        with recording() as decisions:
            kernel, region = self.generate(values)
        return kernel, decisions, region

    def _check(self, values: tuple, kernel) -> None:
        fresh = self._generated(values)[0]
        if fresh.source != kernel.source:
            raise AssertionError(f"fjit internal error: the {self.language} kernel {kernel.name} serves sizes "
                                 f"{values} by its recorded conditions, but generating for them gives "
                                 f"{fresh.name}: the generator read a size without recording it")


class SymbolicLauncher:
    """The launcher of a symbolic program's region (core/symbolic.py), called with the region's
    inputs and then the values of the symbols its sizes are expressions of (`symbols`, in order).
    Per set of values it keeps the launcher `launched(values)` makes -- (kernel, function of the
    inputs and the values; of the inputs alone where `takes_symbols` is False) -- the least
    recently made first, as many as a function keeps programs (FJIT_CACHE_SIZE).  `kernel` is the
    kernel at the compiling call's sizes; `bsym` makes the program's call of it, named and
    commented by the language (`language`, `name_of`, `comment_of`)."""

    takes_symbols = True
    language = ""

    def __init__(self, region: Region, sizes):
        self.region, self.sizes = region, sizes
        self.symbols = sizes.symbols_of(region)
        self.instance = sizes.instantiator(region, self.symbols)
        self.arity, self.n_symbols = len(region.inputs), len(self.symbols)
        self.hints = tuple(hint(s) for s in self.symbols)
        self.launchers: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def launched(self, values: tuple):
        raise NotImplementedError

    def name_of(self, kernel) -> str:
        """The name the program calls this launcher by, from its kernel's."""
        raise NotImplementedError

    def comment_of(self, kernel) -> str:
        """What the printed program says of the kernel at the compiling call's sizes."""
        raise NotImplementedError

    def start(self) -> None:
        """Make the launcher of the compiling call's sizes (the subclass's state set up first)."""
        self.kernel, self.launchers[self.hints] = self.launched(self.hints)

    def __call__(self, *args):
        launch = self.launchers.get(args[self.arity:])
        if launch is None:
            values = tuple(map(int, args[self.arity:]))
            with self._lock:
                while len(self.launchers) >= config.cache_size():
                    self.launchers.popitem(last=False)
                launch = self.launchers[values] = self.launched(values)[1]
        return launch(*args) if self.takes_symbols else launch(*args[:self.arity])

    def bsym(self) -> BoundSymbol:
        """The program's call of this launcher: the region's inputs, then its symbols."""
        symbols = ", ".join(self.sizes.text(s) for s in self.symbols)
        b = kernel_bsym(self.region, self.name_of(self.kernel), self,
                        f"{self.language} kernel per call's sizes ({symbols}); at this call's, "
                        f"{self.comment_of(self.kernel)}")
        return b.replace(args=b.args + tuple(self.symbols))
