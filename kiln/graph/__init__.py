"""Graph-level IR (Relax style): StructInfo, expressions, BlockBuilder, functors, printer.

See ``docs/internals.md`` (section kiln.graph) for the contract with the other layers.
"""

from . import shape_utils
from .block_builder import BlockBuilder
from .expr import (
    Binding,
    BindingBlock,
    Call,
    Constant,
    DataflowBlock,
    DataflowVar,
    Expr,
    ExternFunc,
    Function,
    GlobalVar,
    If,
    MatchCast,
    Op,
    PrimValue,
    SeqExpr,
    ShapeExpr,
    StringImm,
    Tuple,
    TupleGetItem,
    Var,
    VarBinding,
    as_expr,
    call_tir,
    const,
    is_call_tir,
    is_leaf,
)
from .functor import (
    ExprMutator,
    ExprVisitor,
    binding_uses,
    bound_vars,
    free_vars,
    post_order_visit,
)
from .printer import script
from .struct_info import (
    FuncStructInfo,
    ObjectStructInfo,
    OptionalStructInfo,
    PrimStructInfo,
    SequenceStructInfo,
    ShapeStructInfo,
    StructInfo,
    TensorStructInfo,
    TupleStructInfo,
    struct_info_lca,
)
from .well_formed import well_formed

__all__ = [
    "well_formed",
    "Binding", "BindingBlock", "BlockBuilder", "Call", "Constant", "DataflowBlock",
    "DataflowVar", "Expr", "ExprMutator", "ExprVisitor", "ExternFunc", "FuncStructInfo",
    "Function", "GlobalVar", "If", "MatchCast", "ObjectStructInfo", "Op", "OptionalStructInfo",
    "PrimStructInfo", "SequenceStructInfo",
    "PrimValue", "SeqExpr", "ShapeExpr", "ShapeStructInfo", "StringImm", "StructInfo",
    "TensorStructInfo", "Tuple", "TupleGetItem", "TupleStructInfo", "Var", "VarBinding",
    "as_expr", "binding_uses", "bound_vars", "call_tir", "const", "free_vars", "is_call_tir",
    "is_leaf",
    "post_order_visit", "script", "shape_utils", "struct_info_lca",
]
