"""fjit: a strict, purely functional tracing JIT for PyTorch."""
from fjit.api import (CacheInfo, Report, cache_info, diagnose, jit, last_backward_traces,
                      last_traces)
from fjit.core.ir import Binding, Trace
from fjit.errors import (DataDependentError, FjitError, InputMutationError, NondeterminismError,
                         SharpEdge, SharpEdgeError, SharpEdgeWarning, SideEffectError,
                         UnproxiedTensorError, UnsupportedInputError, UnsupportedOpError)

fjit = jit

__all__ = ["jit", "fjit", "last_traces", "last_backward_traces", "cache_info", "diagnose", "CacheInfo", "Report", "Trace",
           "Binding", "FjitError", "SharpEdgeError", "UnproxiedTensorError", "InputMutationError",
           "SideEffectError", "NondeterminismError", "DataDependentError", "UnsupportedInputError",
           "UnsupportedOpError", "SharpEdgeWarning", "SharpEdge"]
__version__ = "0.1.0"
