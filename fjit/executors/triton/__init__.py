"""The Triton executor's package: its registration (the executor module, imported only where it
could fuse: a CUDA device, or its interpreter on the CPU, so a CPU-only program imports no Triton)
and its kernel language, which registers with the prim blocks' coverage (light: no `import
triton`)."""
import torch

from fjit.config import triton_on_cpu
from fjit.executors import register
from fjit.executors.triton import language  # noqa: F401  (registers Triton's parts with coverage)

register("triton", "fjit.executors.triton.executor",
         may_fuse=lambda: triton_on_cpu() or torch.cuda.is_available())
