"""Loop-level IR (TensorIR style): expressions, statements, blocks, buffers, PrimFuncs."""

from .buffer import Buffer, BufferRegion, decl_buffer
from .expr import (
    EQ, GE, GT, INTRINSICS, LE, LT, NE, Add, And, BinaryOp, Broadcast, BufferLoad, Call, Cast,
    CmpOp, CommReducer, Div, FloatImm, FloorDiv, FloorMod, IntImm, IterType, IterVar, Let, Max,
    Min, Mod, Mul, Not, Or, PrimExpr, Ramp, Range, Reduce, Select, SizeVar, StringImm, Sub, Var,
    abs, add, all_of, any_of, call_intrin, cast, ceil, const, convert, cos, div, eq, erf, exp,
    exp2, fabs, floor, floordiv, floormod, fmod, ge, gt, if_then_else, isinf, isnan, le, log,
    log1p, log2, logical_and, logical_not, logical_or, lt, make_const, max, min, mul, ne, pow,
    round, rsqrt, select, sigmoid, sin, sqrt, sub, tanh, trunc, truncdiv, truncmod,
)
from .function import PrimFunc
from .functor import (
    ExprMutator, ExprVisitor, Mutator, StmtExprMutator, StmtExprVisitor, StmtMutator,
    StmtVisitor, Visitor, collect_vars, post_order_visit, substitute,
)
from .stmt import (
    Allocate, AssertStmt, Block, BlockRealize, BufferStore, Evaluate, For, ForKind, IfThenElse,
    LetStmt, SeqStmt, Stmt, seq, true_predicate,
)

from .schedule import BlockRV, LoopRV, Schedule, Trace

try:  # the printer registers itself for str()/repr() of TIR nodes
    from . import printer as _printer  # noqa: F401
except ImportError:  # pragma: no cover - during bring-up
    pass
