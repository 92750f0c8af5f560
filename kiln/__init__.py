"""kiln: a deep-learning compiler (graph IR -> tensor expressions -> TIR -> native code)."""

from . import graph, ir, op, schedule, te, tir  # noqa: E402
from .build import build  # noqa: E402

# torch.compile(model, backend="kiln"): registered once torch's backend registry is imported
# (this imports no torch)
from .frontend.torch.dynamo import register_on_torch_import  # noqa: E402
from .ir.errors import (  # noqa: E402
    ArgumentError,
    KilnError,
    ModelFormatError,
    TargetError,
    UnsupportedOperatorError,
)
from .runtime.executable import Executable, load  # noqa: E402
from .target import Target  # noqa: E402
from .version import __version__  # noqa: E402, F401 - the package's version

register_on_torch_import()

__all__ = ["ArgumentError", "Executable", "KilnError", "ModelFormatError", "Target",
           "TargetError", "UnsupportedOperatorError", "build", "graph", "ir", "load", "op",
           "schedule", "te", "tir"]
