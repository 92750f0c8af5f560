"""The PyTorch frontend: ``torch.export`` programs and the ``torch.compile`` backend.

``from_exported_program(ep) -> (IRModule, params)`` imports an ExportedProgram (its core ATen
graph, one converter per ATen overload in ``kiln.frontend.torch.converters``, registered with
``@converter("aten.add.Tensor", ...)``); ``kiln.frontend.torch.dynamo`` is the
``torch.compile(model, backend="kiln")`` backend. PyTorch is imported only when these are used,
so ``import kiln`` works without it.
"""

from . import converters  # noqa: F401 - registers every converter
from .importer import NodeView, ProgramContext, from_exported_program
from .registry import converter, lookup_converter, supported_ops

__all__ = ["NodeView", "ProgramContext", "converter", "from_exported_program",
           "lookup_converter", "supported_ops"]
