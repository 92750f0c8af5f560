"""kiln: a deep-learning compiler (graph IR -> tensor expressions -> TIR -> native code)."""

__version__ = "0.1.0"

from . import graph, ir, op, schedule, te, tir  # noqa: E402
from .build import build  # noqa: E402
from .runtime.executable import Executable, load  # noqa: E402
from .target import Target  # noqa: E402

__all__ = ["Executable", "Target", "build", "graph", "ir", "load", "op", "schedule", "te", "tir"]
