"""The ONNX importer: ``from_onnx(model) -> (IRModule, params)``.

One converter per ONNX operator (``kiln.frontend.onnx.converters``), registered with the
``@converter(op_type, since=N)`` decorator and picked by the model's opset; see ``importer``.
"""

from . import converters  # noqa: F401 - registers every converter
from .importer import GraphContext, NodeView, from_onnx
from .registry import converter, lookup_converter, supported_ops
from .specialize import GuardedExecutable, compile_onnx

__all__ = ["GraphContext", "GuardedExecutable", "NodeView", "compile_onnx", "converter",
           "from_onnx", "lookup_converter", "supported_ops"]
