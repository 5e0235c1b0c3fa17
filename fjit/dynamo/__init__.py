"""The torch.compile backend (../shared/DESIGN.md section 7, outside the repository): `torch.compile(model, backend="fjit")`.

`backend` is the object the `torch_dynamo_backends` entry point names and `fjit.backend` returns.
Importing this package does not import torch._dynamo: the backend imports it when Dynamo calls it.
"""
from fjit.dynamo.compiler import Backend, SubgraphInfo
from fjit.dynamo.split import SplitReason

backend = Backend()


def make_backend(**options) -> Backend:
    """A backend with its own options (executors=..., split_executor="torch" | "inductor") and its
    own subgraph_infos."""
    return Backend(**options)


__all__ = ["Backend", "SubgraphInfo", "SplitReason", "backend", "make_backend"]
