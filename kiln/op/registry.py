"""The operator registry as operator families use it (``register_op``, ``OpPattern``...).

The registry itself is :mod:`kiln.graph.op_registry`: the graph IR infers StructInfo through
it, so it sits below the operator families; its module docstring describes a declaration.
"""

from ..graph.op_registry import (
    NON_DIFFERENTIABLE,
    MixedPrecision,
    OpDef,
    OpPattern,
    get_op_def,
    infer_struct_info,
    list_ops,
    register_op,
)

__all__ = [
    "NON_DIFFERENTIABLE", "MixedPrecision", "OpDef", "OpPattern", "get_op_def",
    "infer_struct_info", "list_ops", "register_op",
]
