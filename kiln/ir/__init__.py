"""Shared by every IR level: data types, node base, structural equality, modules, errors."""

from .dtype import DataType, TypeCode, as_dtype
from .errors import (
    ArgumentError,
    CodegenError,
    CompileError,
    CompilerNotFoundError,
    DTypeError,
    InternalError,
    KilnError,
    LoweringError,
    MemoryLimitError,
    ModelFormatError,
    RuntimeCheckError,
    ScheduleError,
    StructInfoError,
    TargetError,
    UnsupportedOperatorError,
    WellFormedError,
)
from .module import IRModule
from .node import Node, assert_structural_equal, node, structural_equal, structural_hash

__all__ = [
    "ArgumentError", "CodegenError", "CompileError", "CompilerNotFoundError", "DTypeError",
    "DataType", "IRModule", "InternalError", "KilnError", "LoweringError", "MemoryLimitError",
    "ModelFormatError", "Node", "RuntimeCheckError", "ScheduleError", "StructInfoError",
    "TargetError", "TypeCode", "UnsupportedOperatorError", "WellFormedError", "as_dtype",
    "assert_structural_equal", "node", "structural_equal", "structural_hash",
]
