"""kiln: a deep-learning compiler (graph IR -> tensor expressions -> TIR -> native code)."""

__version__ = "0.1.0"

from . import graph, ir, op, te, tir  # noqa: E402
from .build import build  # noqa: E402
from .ir.errors import (  # noqa: E402
    ArgumentError,
    KilnError,
    ModelFormatError,
    TargetError,
    UnsupportedOperatorError,
)
from .runtime.executable import Executable, load  # noqa: E402
from .target import Target  # noqa: E402

__all__ = ["ArgumentError", "Executable", "KilnError", "ModelFormatError", "Target",
           "TargetError", "UnsupportedOperatorError", "build", "graph", "ir", "load", "op",
           "te", "tir"]
