"""kiln: a deep-learning compiler (graph IR -> tensor expressions -> TIR -> native code)."""

__version__ = "0.1.0"

from . import graph, ir, op, schedule, te, tir  # noqa: E402
from .build import build  # noqa: E402

# torch.compile(model, backend="kiln"): registered once torch's backend registry is imported
# (this imports neither torch nor the frontend's converters)
from .frontend.torch.dynamo import register_on_torch_import  # noqa: E402
from .runtime.executable import Executable, load  # noqa: E402
from .target import Target  # noqa: E402

register_on_torch_import()

__all__ = ["Executable", "Target", "build", "graph", "ir", "load", "op", "schedule", "te", "tir"]
