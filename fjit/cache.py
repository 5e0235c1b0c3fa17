"""The program cache of one jitted function: cache key -> compiled program, with its statistics,
its fast path and its eviction.

Two ways in.  The fast path is a function generated for the call's signature (type checks, the key
as one flat tuple, one dict lookup, the program); calls it does not cover take `key_and_leaves`,
one walk over the arguments that yields the cache key and the flat runtime values together, and
one dict lookup.  Lookups take no lock; the jitted function compiles under its own.
"""
from __future__ import annotations

import collections

from fjit.frontend.inputs import MISS, call_key, fast_path

CACHE_SIZE = 64
CacheInfo = collections.namedtuple("CacheInfo", ["hits", "misses", "entries"])


def _no_fast_path(*args):
    return MISS


class ProgramCache:
    def __init__(self, keep: bool):
        self.keep = keep                      # False: cache="none", every call retraces
        self.programs: dict = {}
        # Float positions some trace specialized on (their values join the key from then on).
        self.specialized: frozenset = frozenset()
        self.hits = 0
        self.misses = 0
        self.fast_call = _no_fast_path   # read without a lock: one attribute, atomic
        self._fast = None                # (key function, fast cache, arity) of the fast path
        self._fast_declined = None       # an arity whose calls had no fast path

    def key_and_leaves(self, args: tuple, kwargs: dict) -> tuple[tuple, list]:
        return call_key(args, kwargs, self.specialized)

    def get(self, key):
        return self.programs.get(key)

    def store(self, args: tuple, kwargs: dict, key, program, specialized: frozenset) -> None:
        """File `program`, compiled for this call, whose trace specialized on the floats at the
        positions `specialized`."""
        if not self.keep:
            return
        if specialized - self.specialized:
            self.specialized = self.specialized | specialized
            key, _ = call_key(args, kwargs, self.specialized)
            self._drop_fast_path()      # its keys leave out the floats now specialized on
        if len(self.programs) >= CACHE_SIZE:
            self.programs.pop(next(iter(self.programs)))   # evict the oldest entry
        self.programs[key] = program

    def remember_fast(self, args: tuple, program) -> None:
        """File the program in the fast path's cache (generating the fast path on first use)."""
        if not self.keep:
            return
        fast = self._fast
        if fast is None or len(args) != fast[2]:
            if self._fast_declined == len(args):
                return
            made = fast_path(args, self.specialized)
            if made is None:                 # e.g. a container argument: the general path only
                self._fast_declined = len(args)
                return
            call, key_of, cache = made
            fast = self._fast = (key_of, cache, len(args))
            self.fast_call = call
        key_of, cache, _ = fast
        key = key_of(*args)
        if key is None:          # typed differently from the signature the fast path was made for
            return
        if len(cache) >= CACHE_SIZE:
            cache.clear()
        cache[key] = program

    def _drop_fast_path(self) -> None:
        self._fast = None
        self.fast_call = _no_fast_path
        self._fast_declined = None

    def clear(self) -> None:
        """Forget every program (statistics stay)."""
        self.programs.clear()
        self.specialized = frozenset()
        self._drop_fast_path()

    def info(self) -> CacheInfo:
        return CacheInfo(self.hits, self.misses, len(self.programs))
