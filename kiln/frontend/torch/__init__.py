"""The PyTorch frontend: ``torch.export`` programs and the ``torch.compile`` backend.

``from_exported_program(ep) -> (IRModule, params)`` imports an ExportedProgram (its core ATen
graph, one converter per ATen overload in ``kiln.frontend.torch.converters``, registered with
``@converter("aten.add.Tensor", ...)``); ``from_pt2(path)`` a saved one;
``kiln.frontend.torch.dynamo`` is the ``torch.compile(model, backend="kiln")`` backend.

PyTorch is imported only when these are used (it is an optional dependency): ``import kiln``
loads this package's converters (about 0.07 s) and installs the backend's registration hook
from ``dynamo``, and imports no torch.
"""

from __future__ import annotations

from . import converters  # noqa: F401 - registers every converter
from .importer import NodeView, ProgramContext, from_exported_program, from_pt2
from .registry import converter, lookup_converter, supported_ops

__all__ = ["NodeView", "ProgramContext", "converter", "from_exported_program", "from_pt2",
           "lookup_converter", "supported_ops"]
