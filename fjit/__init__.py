"""fjit, a strict, purely functional tracing JIT for PyTorch: its public names (from api.py,
errors.py, module.py, and the IR's Trace and Binding), and fjit.backend, the torch.compile backend,
loaded on first use."""
import fjit.logs as logs
from fjit.api import (CacheInfo, JittedFunction, Report, cache_info, clear_caches, diagnose, explain,
                      jit, last_backward_traces, last_traces)
from fjit.core.ir import Binding
from fjit.core.trace import Trace
from fjit.errors import (DataDependentError, FjitError, InputMutationError, NondeterminismError,
                         SharpEdge, SharpEdgeError, SharpEdgeWarning, SideEffectError,
                         UnproxiedTensorError, UnsupportedInputError, UnsupportedOpError)
from fjit.module import FjitModule

fjit = jit

__all__ = ["jit", "fjit", "last_traces", "last_backward_traces", "cache_info", "diagnose", "explain",
           "clear_caches", "CacheInfo", "JittedFunction", "Report", "Trace", "Binding", "FjitError",
           "SharpEdgeError", "UnproxiedTensorError", "InputMutationError", "SideEffectError",
           "NondeterminismError", "DataDependentError", "UnsupportedInputError",
           "UnsupportedOpError", "SharpEdgeWarning", "SharpEdge", "FjitModule"]
__version__ = "0.1.0"

logs.enable_from_environment()      # FJIT_LOGS


def __getattr__(name):
    # fjit.backend, the torch.compile backend, is loaded on first use: it keeps fjit.dynamo (its
    # aten table, built at import) off `import fjit`.  (fjit.dynamo imports no torch._dynamo
    # either way: the backend imports it only when Dynamo calls it.)
    if name == "backend":
        from fjit.dynamo import backend
        return backend
    raise AttributeError(f"module 'fjit' has no attribute {name!r}")
