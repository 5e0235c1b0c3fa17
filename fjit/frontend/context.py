"""The state of tracing: the thread's TraceContext (names, the scope being recorded into, the
sharp edges found, the grad mode and autocast state the recorded ops run under) and ProcessPatch,
the process-wide patches every tracing thread shares.

A `TraceContext` is installed thread-locally for the duration of a trace; proxies reach the dispatcher
through it, which keeps proxies free of an import of the dispatcher.  The caller's autocast state
(`autocast_state`, and `autocast_key`, its part of the cache key) is read here because a
TraceContext starts from it; frontend/modes.py, which records its changes, imports this module.
"""
from __future__ import annotations

import sys
import threading
import warnings

import torch

from fjit.config import TraceMode
from fjit.core.ir import BoundSymbol
from fjit.core.trace import AMP_DEVICES
from fjit.errors import SharpEdge, SharpEdgeWarning, error_for
from fjit.strict.jitted_callable import names
from fjit.strict.locate import user_location


# What to do with a sharp edge: the internal mode (the `sharp_edges=` option plus diagnose's own),
# defined with every other option in fjit.config.
Mode = TraceMode


_LOCAL = threading.local()


def current() -> "TraceContext | None":
    return getattr(_LOCAL, "ctx", None)


class ProcessPatch:
    """Process-wide names replaced while any thread traces (torch.Generator, Function.apply,
    torch.vmap): installed by the first trace to start, restored by the last to end.  Other
    threads see the replacements too, so each must fall through to the original outside a trace."""

    def __init__(self, install, restore):
        self._install, self._restore = install, restore
        self._lock = threading.Lock()
        self._depth = 0

    def __enter__(self):
        with self._lock:
            if self._depth == 0:
                self._install()
            self._depth += 1

    def __exit__(self, *exc):
        with self._lock:
            self._depth -= 1
            if self._depth == 0:
                self._restore()




def autocast_state() -> tuple:
    """(enabled, dtype) of autocast per device type."""
    return tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in AMP_DEVICES)


def autocast_key():
    """Autocast's part of the cache key: False when it is off everywhere (one C call)."""
    return torch._C._is_any_autocast_enabled() and autocast_state()


_top_saved_tensors_hooks = torch._C._autograd._top_saved_tensors_default_hooks
_CHECKPOINT_PACK_HOOK = "_checkpoint_hook.__init__.<locals>.pack_hook"


class TraceContext:
    def __init__(self, fn, mode: Mode, dispatch, namespace: dict):
        self.fn = fn
        self.fn_name = names(fn)[1]
        self.mode = mode
        self.dispatch = dispatch          # dispatch(func, args, kwargs) -> proxies
        self.namespace = namespace        # names traces refer to (prims, fjit_ops)
        self.scopes: list[list[BoundSymbol]] = [[]]
        self.counter = 0
        self.edges: list[SharpEdge] = []
        self.consts: dict = {}            # name -> captured value (permissive FJ101)
        self.inputs: list = []            # flat runtime input Vars
        self.real_inputs: list = []       # the call's flat runtime values, for permissive replays
        self.specialized: set[int] = set()  # float input positions whose value the trace depends on
        self.tensor_origins: dict[int, tuple[str, str]] = {}  # id(tensor) -> (entry, description)
        self.input_labels: dict[int, str] = {}  # id(input handle) -> how the user names it
        self.raised: SharpEdge | None = None
        # An op output's layout key: (op, how many times the op was recorded before, output
        # position), which names the same value on a retrace of this call where var names do not
        # (a layout-dependent decomposition records more or fewer prims before it).
        self.layout_keys: dict[str, tuple] = {}        # var name -> its layout key
        self.op_counts: dict[str, int] = {}            # op -> how many times it was recorded
        self.observed_strides: dict[tuple, tuple] = {}  # layout key -> (shape, real strides)
        self.channels_last_convs = False   # 2-D convolutions take channels-last inputs (dispatch.py)
        # The grad mode and autocast state the ops recorded so far run under (the caller's at
        # first); the dispatcher records a mode change when the traced code enters a region.
        self.grad_mode = torch.is_grad_enabled()
        self.autocast = autocast_state()
        # Under autocast each op is traced as the casts autocast makes of its operands, then the
        # op without autocast (frontend/modes.py); `autocast_seen`: autocast was on for some op, so
        # the program runs with autocast off (Trace.autocast_off); `autocast_explicit` counts the
        # nesting of ops being traced so, whose casts and inner ops autocast must not see again.
        self.autocast_seen = any(on for on, _ in self.autocast)
        self.autocast_explicit = 0
        # values copied so that a reshape lays out alike at every size (record._record_prim): an
        # op whose decomposition copies one is recorded as its prims, not as the torch call,
        # whose own result at a size of 1 is a view laid out otherwise
        self.pinned_copies: set[str] = set()
        self.return_location: tuple[str, int] | None = None   # the user's outermost `return` seen
        # Values made inside a non-reentrant torch.utils.checkpoint region: name -> the region's
        # number (Trace.checkpointed).  `_region` is (the region's pack hook, its number).
        self.checkpointed: dict[str, int] = {}
        self._region: tuple = (None, -1)
        # The running reentrant checkpoint's region marker, while library_calls traces its
        # function inline (a reentrant checkpoint has no saved-tensor hook to tell it by).
        self.reentrant_checkpoint: object | None = None

    # -- names and recording -------------------------------------------------------------------
    def new_name(self, prefix: str = "t") -> str:
        name = f"{prefix}{self.counter}"
        self.counter += 1
        return name

    def record(self, bsym: BoundSymbol) -> None:
        self.scopes[-1].append(bsym)
        region = self._checkpoint_region()
        if region is not None:
            stack = [bsym]
            while stack:
                b = stack.pop()
                self.checkpointed.update((v.name, region) for v in b.outputs())
                stack.extend(b.subsymbols)

    def _checkpoint_region(self) -> int | None:
        """The number of the torch.utils.checkpoint region the traced code is in, or None.  A
        reentrant one is marked by library_calls while it traces the region's function; a
        non-reentrant checkpoint runs its function under saved-tensor hooks of its own
        (torch.utils.checkpoint._checkpoint_hook): a region is the stretch of ops recorded under
        one such pack hook, however the model called checkpoint (a module global bound at import,
        functools.partial in transformers' gradient_checkpointing_enable, timm's checkpoint_seq)."""
        owner = self.reentrant_checkpoint
        if owner is None:
            hooks = _top_saved_tensors_hooks(True)
            if hooks is None or getattr(hooks[0], "__qualname__", "") != _CHECKPOINT_PACK_HOOK:
                return None
            owner = hooks[0]
        if self._region[0] is not owner:
            self._region = (owner, self._region[1] + 1)
        return self._region[1]

    def push_scope(self) -> None:
        self.scopes.append([])

    def pop_scope(self) -> list[BoundSymbol]:
        return self.scopes.pop()

    # -- sharp edges ---------------------------------------------------------------------------
    def sharp_edge(self, entry: str, message: str, location: tuple[str, int] | None = None) -> None:
        """Report a sharp edge: raise it in error mode; otherwise note it and let tracing go on
        with the permissive behaviour the caller implements right after this returns."""
        filename, lineno = location or user_location(sys._getframe(1))
        edge = SharpEdge.of(entry, message, filename, lineno)
        if self.mode is Mode.ERROR:
            self.raised = edge   # re-raised after the run if the user's own `except` swallows it
            raise error_for(edge)
        if any(e.entry == edge.entry and e.lineno == lineno and e.filename == filename
               for e in self.edges):
            return  # one report per place, however often a loop runs it
        self.edges.append(edge)
        if self.mode is Mode.WARN:
            warnings.warn_explicit(SharpEdgeWarning(edge), SharpEdgeWarning, filename, lineno)

    def __enter__(self):
        if current() is not None:
            raise RuntimeError("fjit: a jitted function was called while tracing another one")
        _LOCAL.ctx = self
        return self

    def __exit__(self, *exc):
        _LOCAL.ctx = None
        self.real_inputs = []   # never keep the caller's tensors alive
