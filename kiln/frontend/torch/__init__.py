"""The PyTorch frontend: ``torch.export`` programs and the ``torch.compile`` backend.

``from_exported_program(ep) -> (IRModule, params)`` imports an ExportedProgram (its core ATen
graph, one converter per ATen overload in ``kiln.frontend.torch.converters``, registered with
``@converter("aten.add.Tensor", ...)``); ``from_pt2(path)`` a saved one;
``kiln.frontend.torch.dynamo`` is the ``torch.compile(model, backend="kiln")`` backend.

PyTorch is imported only when these are used, and this package loads its converters on first
use of its API, so ``import kiln`` (which installs the backend's registration hook from
``dynamo``) stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_API = {"from_exported_program": "importer", "from_pt2": "importer", "NodeView": "importer",
        "ProgramContext": "importer", "converter": "registry",
        "lookup_converter": "registry", "supported_ops": "registry"}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    importlib.import_module(f"{__name__}.converters")  # registers every converter
    return getattr(importlib.import_module(f"{__name__}.{_API[name]}"), name)
