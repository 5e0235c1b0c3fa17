"""The C executor's package: its registration (the executor module, imported when a program first
asks for it) and its kernel language, which registers with the prim blocks' coverage."""
from fjit.executors import register
from fjit.executors.c import language  # noqa: F401  (registers C's parts with coverage)

register("c", "fjit.executors.c.executor")
