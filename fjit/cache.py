"""The program cache of one jitted function: cache key -> compiled program, with its statistics,
its fast path and its eviction: the least recently used program goes first, once a function has
`config.cache_size()` of them (FJIT_CACHE_SIZE, 64 by default).  A generation that grows its cache
by a token a step compiles a program per length; a second generation of the same prompt finds
them while they fit, where first-in-first-out eviction evicted exactly the next one needed.

Two ways in.  The fast path is a function generated for the call's signature (type checks, the key
as one flat tuple, one dict lookup, the program); calls it does not cover take `key_and_leaves`,
one walk over the arguments that yields the cache key and the flat runtime values together, and
one dict lookup.  Lookups take no lock; the jitted function compiles under its own.

On a miss, `explain_miss` says why: the cached entry nearest to the call's key (fewest differing
fields) and each field that differs, with both values; fjit.logs logs and remembers it.
"""
from __future__ import annotations

import collections

import torch
from torch._prims_common import make_contiguous_strides_for

from fjit import config
from fjit.frontend.inputs import MISS, TENSOR_KEY_FIELDS, call_key, fast_path, symbolic_hit, transformed
from fjit.logs import Change, Compilation

# Symbolic compiles that may fall back to specialized ones before a function stops trying: one that
# failed because a new size met a static one (a length equal to the head size, so a shape rule
# equated them) may well work at the next size; one that failed for what the function does fails
# again, at the cost of a trace.
SYMBOLIC_TRIES = 2
CacheInfo = collections.namedtuple("CacheInfo", ["hits", "misses", "entries"])
# The fast path generated for one arity of all-tensor calls (cache.fast_path): its key and guard
# functions, and its cache of programs by key.
FastPath = collections.namedtuple("FastPath", ["key_of", "guards_of", "programs", "arity"])


def _no_fast_path(*args):
    return MISS


class ProgramCache:
    def __init__(self, keep: bool, sizes: str = "auto"):
        self.keep = keep                      # False: cache="none", every call retraces
        # Symbolic sizes: "auto" (a dim whose value changes between calls becomes a symbol on the
        # next compile), "symbolic" (every dim of size 2 or more, from the first call) or "static".
        self.sizes = sizes
        self.varying: set[int] = set()     # flat input positions whose sizes varied between calls
        self.ones: dict[int, frozenset] = {}   # of their symbolic dims, those seen at size 1
        # family key (the call key with its symbolic dims masked) -> [(guards, program)], newest
        # last; the sets of symbolic dims the families were compiled with
        self.families: dict[tuple, list] = {}
        self.family_dims: list[dict] = []
        # [(grad mode, hit, program)] of the symbolic programs compiled on flat calls, newest
        # first: `symbolic_call` serves a call of a new shape through them (inputs.symbolic_hit)
        self.symbolic_hits: list[tuple] = []
        self.served_symbolic = False      # whether the last call was served that way
        self.symbolic_declines = 0    # symbolic compiles that fell back: after SYMBOLIC_TRIES, no more
        self.narrow = False           # a symbolic compile ran past its budget: changed dims only
        self.slowest_compile = 0.0    # seconds, of the specialized compiles
        self.programs: collections.OrderedDict = collections.OrderedDict()   # oldest use first
        # Float positions some trace specialized on (their values join the key from then on).
        self.specialized: frozenset = frozenset()
        self.hits = 0
        self.misses = 0
        self.fast_call = _no_fast_path   # read without a lock: one attribute, atomic
        # [(arity, grad mode, tensor guards, program)] of the all-tensor call the fast path served
        # last: JittedFunction.__call__ checks it before anything else.  A list the fast path
        # writes into, not a method of this cache: that would be a reference cycle, and a cache
        # shared between module wrappers lives exactly as long as they do (a weak registry).
        self.last: list = [None]
        # (forward stages, backward stages) of the last compilation filed here
        self.last_compiled: tuple[list, list] = ([], [])
        self._fast: FastPath | None = None
        self._fast_declined = None       # an arity whose calls had no fast path

    def key_and_leaves(self, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        return call_key(args, kwargs, self.specialized)

    def get(self, key):
        program = self.programs.get(key)
        if program is not None:
            try:
                self.programs.move_to_end(key)
            except KeyError:             # evicted by another thread meanwhile: still a program
                pass
        return program

    # -- symbolic programs (core/symbolic.py) ----------------------------------------------------
    @staticmethod
    def family_key(key: tuple, dynamic: dict[int, frozenset]) -> tuple:
        """`key` with the sizes and strides of the dims in `dynamic` masked: the key every call a
        program compiled with those dims symbolic may serve shares (its guards decide)."""
        parts, position = [], 0
        for part in key:
            if _is_tensor(part):
                dims = dynamic.get(position)
                if dims:
                    shape = tuple(None if d in dims else n for d, n in enumerate(part[0]))
                    part = (shape, None) + part[2:]
                position += 1
            elif _is_float(part):
                position += 1
            parts.append(part)
        return tuple(parts)

    def _candidates(self, key: tuple) -> list:
        """[(guards, program)] of the symbolic programs whose family this call's key is in, the
        newest first."""
        found = []
        for dynamic in self.family_dims:
            found += reversed(self.families.get(self.family_key(key, dynamic), ()))
        return found

    def symbolic_program(self, key: tuple, leaves: list):
        """The symbolic program whose guards this call meets, or None."""
        if not self.families:
            return None
        for guards, program in self._candidates(key):
            if guards(leaves):
                return program
        return None

    def symbolic_call(self, args: tuple):
        """The result of the symbolic program that serves this flat call (a new length of a
        ragged batch), or MISS: no key is built and nothing is filed, so the first call of a
        shape costs what a cached one does.  Not under autocast (its state is in the key, not
        in a tensor's metadata) or a transform (the general path runs those)."""
        if self.symbolic_hits and not torch._C._is_any_autocast_enabled() and not transformed():
            grad = torch.is_grad_enabled()
            for mode, hit, program in self.symbolic_hits:
                if mode is grad:
                    leaves = hit(*args)
                    if leaves is not None:
                        self.hits += 1
                        self.served_symbolic = True
                        return program(*leaves)
        self.served_symbolic = False
        return MISS

    def dims_to_make_symbolic(self, key: tuple, leaves: list) -> dict[int, frozenset]:
        """The dims this call's compile makes symbolic: with cache="symbolic", every dim of 2 or
        more of a contiguous tensor input but a parameter.  Automatically: every dim of 2 or more
        of each input that has had another size than this call's in a cached program whose key is
        otherwise this call's, or in an earlier symbolic compile -- the whole input, not only the
        dims that changed so far, so that a batch size and a length that both vary take one
        symbolic compile, not one per dim.  A dim at 0 or 1 in this call stays specialized (one
        seen at 1 before may be 1 in the symbolic program: dims_seen_at_one).  Once a symbolic
        compile ran past its budget (`narrow`), only the dims that changed: an image's batch,
        not its height and width, whose window arithmetic had outgrown the shape environment.
        Empty: the compile specializes every size."""
        if not self.keep or self.sizes == "static" or self.symbolic_declines >= SYMBOLIC_TRIES:
            return {}
        changed: dict[int, set] = {}      # the dims that differ from a cached program's
        if self.sizes == "symbolic":      # not a module's parameters, whose sizes never vary
            varying = {i for i, x in enumerate(leaves)
                       if isinstance(x, torch.Tensor) and not isinstance(x, torch.nn.Parameter)}
        else:
            varying = set(self.varying)
            for cached in self.programs:
                for position, dims in (_changed_dims(cached, key, leaves) or {}).items():
                    varying.add(position)
                    changed.setdefault(position, set()).update(dims)
        dynamic = {}
        for i in sorted(varying):
            x = leaves[i] if i < len(leaves) else None
            if isinstance(x, torch.Tensor) and x.is_contiguous():
                dims = frozenset(d for d, n in enumerate(x.shape)
                                 if n >= 2 and (not self.narrow or d in changed.get(i, ())))
                if dims:
                    dynamic[i] = dims
        return dynamic

    def symbolic_budget(self) -> float:
        """Seconds a symbolic compile may take: 10 times the slowest specialized compile of this
        function, at least 120; 300 where none ran yet (cache="symbolic").  A safety net, not a
        schedule: a symbolic compile costs 3-16 times a specialized one (the shape environment's
        reasoning: GPT-2's training step 20 s against 2.2 s, BERT's inference 7 s against 0.45 s,
        on a loaded 2-core machine), and only one whose expressions outgrow the environment
        (Twins' window padding over a symbolic image size: over 10 minutes) should reach it."""
        return max(120.0, 10 * self.slowest_compile) if self.slowest_compile else 300.0

    def dims_seen_at_one(self, key: tuple, leaves: list, dynamic: dict[int, frozenset]) -> dict[int, frozenset]:
        """Of the dims `dynamic` makes symbolic, those a cached program for an otherwise equal key
        (or an earlier symbolic compile) had at size 1: a batch of one, then of two.  Their
        symbols may be 1 (core/symbolic.py), so that batch 1 shares the symbolic program where its
        layouts agree, as a batch of two and three do."""
        ones = {p: set(d for d in self.ones.get(p, ()) if d in dims) for p, dims in dynamic.items()}
        for cached in self.programs:
            changed = _changed_dims(cached, key, leaves)
            if not changed:
                continue
            shapes = _tensor_shapes(cached)
            for position, dims in changed.items():
                ones.setdefault(position, set()).update(
                    d for d in dims if shapes[position][d] == 1 and d in dynamic.get(position, ()))
        return {p: frozenset(d) for p, d in ones.items() if d}

    def store_symbolic(self, key: tuple, dynamic: dict[int, frozenset], guards, program,
                       ones: dict[int, frozenset] | None = None, args: tuple | None = None) -> None:
        """File a program compiled with the dims `dynamic` symbolic, valid where `guards` hold;
        `args`: the compiling call's positional arguments, where it had no keywords."""
        if not self.keep:
            return
        hit = symbolic_hit(args, dynamic, self.specialized, guards) if args is not None else None
        if hit is not None:
            self.symbolic_hits = [(key[0], hit, program), *self.symbolic_hits]
        self.varying.update(dynamic)
        for position, dims in (ones or {}).items():
            self.ones[position] = self.ones.get(position, frozenset()) | dims
        if dynamic not in self.family_dims:
            self.family_dims.append(dynamic)
        entries = self.families.setdefault(self.family_key(key, dynamic), [])
        entries.append((guards, program))
        while len(entries) > config.cache_size():
            _, evicted = entries.pop(0)
            self.symbolic_hits = [entry for entry in self.symbolic_hits if entry[2] is not evicted]

    def store(self, args: tuple, kwargs: dict, key, program, specialized: frozenset) -> None:
        """File `program`, compiled for this call, whose trace specialized on the floats at the
        positions `specialized`."""
        if not self.keep:
            return
        if specialized - self.specialized:
            self.specialized = self.specialized | specialized
            key, _ = call_key(args, kwargs, self.specialized)
            self._drop_fast_path()      # its keys leave out the floats now specialized on
        size = config.cache_size()
        while len(self.programs) >= size:
            _, evicted = self.programs.popitem(last=False)      # the least recently used
            self._forget_fast(evicted)
        self.programs[key] = program

    def remember_fast(self, args: tuple, program) -> None:
        """File the program in the fast path's cache (generating the fast path on first use)."""
        if not self.keep:
            return
        fast = self._fast
        if fast is None or len(args) != fast.arity:
            if self._fast_declined == len(args):
                return
            made = fast_path(args, self.specialized, self.last, self.programs)
            if made is None:                 # e.g. a container argument: the general path only
                self._fast_declined = len(args)
                return
            call, key_of, guards_of, cache = made
            fast = self._fast = FastPath(key_of, guards_of, cache, len(args))
            self.fast_call = call
        key = fast.key_of(*args)
        if key is None:          # typed differently from the signature the fast path was made for
            return
        size = config.cache_size()
        while len(fast.programs) >= size:
            fast.programs.popitem(last=False)      # the least recently used
            self.last[0] = None
        # a hit on the fast path marks the program used in this cache too (by its key here), so
        # that both evict the same program
        key_here = next((k for k, p in reversed(self.programs.items()) if p is program), None)
        fast.programs[key] = (program, fast.guards_of(*args), key_here)

    def _forget_fast(self, program) -> None:
        """Drop the fast path's entries for a program this cache evicted."""
        fast = self._fast
        if fast is not None:
            for key in [k for k, hit in fast.programs.items() if hit[0] is program]:
                del fast.programs[key]
        if self.last[0] is not None and self.last[0][3] is program:
            self.last[0] = None

    def _drop_fast_path(self) -> None:
        self.last[0] = None
        self._fast = None
        self.fast_call = _no_fast_path
        self._fast_declined = None

    def clear(self, statistics: bool = False) -> None:
        """Forget every program (and with `statistics`, the hit and miss counts too)."""
        self.programs.clear()
        self.families.clear()
        self.family_dims = []
        self.symbolic_hits = []
        self.served_symbolic = False
        self.varying = set()
        self.ones = {}
        self.symbolic_declines = 0
        self.narrow, self.slowest_compile = False, 0.0
        self.last_compiled = ([], [])
        self.specialized = frozenset()
        self._drop_fast_path()
        if statistics:
            self.hits = self.misses = 0

    def info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, len(self.programs) + sum(map(len, self.families.values())))

    def failed_guard(self, key: tuple, leaves: list) -> str | None:
        """The guard of the newest symbolic program for this call's family that the call fails, as
        printed, or None where there is none."""
        entries = self._candidates(key) if self.families else None
        return entries[0][0].failed(leaves) if entries else None

    def explain_miss(self, key: tuple, labels: list, call: int) -> Compilation:
        """Why `key` missed: its differences from the nearest cached key.  `labels` says what each
        key part is (inputs.key_labels)."""
        if not self.programs:
            return Compilation(call, "first call" if call == 1 else "cache empty")
        best = None
        for cached in self.programs:
            if len(cached) != len(key):
                continue
            changes = [c for i, (old, new) in enumerate(zip(cached, key)) if old != new
                       for c in _changes(labels[i], old, new)]
            if best is None or len(changes) < len(best):
                best = changes
        n = len(self.programs)
        if best is None:
            return Compilation(call, f"the inputs' structure differs from all {n} cached "
                                     f"entr{'y' if n == 1 else 'ies'}")
        return Compilation(call, f"{len(best)} key field{'s' if len(best) != 1 else ''} changed "
                                 f"from the nearest of {n} cached entr{'y' if n == 1 else 'ies'}",
                           tuple(best))


def _changes(label: tuple[str, str], old, new) -> list[Change]:
    """What differs between two key parts at one position.  The parts say what they are (the
    label says where, and what the new call has there)."""
    where, kind = label
    if _is_tensor(old) and _is_tensor(new):
        return [Change(where, field, _shown(a), _shown(b))
                for field, a, b in zip(TENSOR_KEY_FIELDS, old, new) if a != b]
    if _is_float(old) and _is_float(new):    # a float the trace specialized on: ("f", its hex)
        return [Change(where, "specialized float value",
                       float.fromhex(old[1]) if isinstance(old, tuple) else "any",
                       float.fromhex(new[1]))]
    if kind == "mode":
        return [Change(where, "value", old, new)]
    if _is_constant(old) and _is_constant(new) and old[0] is new[0]:
        return [Change(where, "value", old[1], new[1])]
    what = "keyword names" if kind == "names" else "container structure" \
        if kind == "structure" else "type"
    return [Change(where, what, _described(old), _described(new))]


def _changed_dims(cached: tuple, key: tuple, leaves: list) -> dict[int, set] | None:
    """{flat input position: dims} where `key` differs from the cached key `cached` only in the
    sizes (and so the contiguous strides) of tensors of the same rank, each such new size 2 or
    more; None where they differ otherwise (or not at all)."""
    if len(cached) != len(key):
        return None
    changed: dict[int, set] = {}
    position = 0
    for old, new in zip(cached, key):
        if _is_tensor(new):
            if not _is_tensor(old):
                return None
            if old != new:
                shape_old, shape_new = old[0], new[0]
                if old[2:] != new[2:] or len(shape_old) != len(shape_new) or \
                        not leaves[position].is_contiguous():
                    return None
                if old[1] is not None and tuple(old[1]) != tuple(make_contiguous_strides_for(shape_old)):
                    return None
                dims = {d for d, (a, b) in enumerate(zip(shape_old, shape_new)) if a != b}
                if any(shape_new[d] < 2 for d in dims):
                    return None
                changed[position] = dims
            position += 1
        elif _is_float(new):
            if old != new and not (old is float and new is float):
                return None
            position += 1
        elif old != new:
            return None
    return changed or None


def _tensor_shapes(key: tuple) -> dict[int, tuple]:
    """{flat input position: shape} of the tensors in a cache key."""
    shapes, position = {}, 0
    for part in key:
        if _is_tensor(part):
            shapes[position] = part[0]
            position += 1
        elif _is_float(part):
            position += 1
    return shapes


def _is_tensor(part) -> bool:
    return type(part) is tuple and len(part) == len(TENSOR_KEY_FIELDS) and \
        isinstance(part[2], torch.dtype)


def _is_float(part) -> bool:
    return part is float or type(part) is tuple and len(part) == 2 and part[0] == "f"


def _is_constant(part) -> bool:
    return type(part) is tuple and len(part) == 2 and isinstance(part[0], type)


def _described(part):
    if _is_tensor(part):
        return "a tensor"
    if _is_float(part):
        return "a float"
    if _is_constant(part):
        return f"{part[0].__name__} {part[1]!r}"
    return part


def _shown(value):
    return tuple(value) if isinstance(value, torch.Size) else value
