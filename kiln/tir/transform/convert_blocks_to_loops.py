"""Lowering pass: replace TensorIR blocks by the plain statements they stand for.

Schedules work on blocks (iteration variables, read/write regions, ``init``); code generation
wants loops and stores only. For every ``BlockRealize`` this pass

- substitutes the block's iteration variables by their bound ``iter_values``;
- turns ``init`` into a store guarded by "every reduction iteration variable is at the start of
  its domain" (the bindings of the block's COMM_REDUCE variables equal their ``dom.min``). The
  guard is on the *bindings*, not on loop variables, so it stays right after ``split``,
  ``reorder`` or ``decompose_reduction`` changed which loops feed the reduction;
- wraps the block's body in one ``Allocate`` per entry of ``alloc_buffers`` (codegen decides
  stack or heap storage from the buffer's scope and size);
- emits a non-trivial ``predicate`` as an ``IfThenElse`` around all of it.

Read/write regions and block annotations carry no run-time meaning and are dropped, except
:data:`SUBSTITUTE_BINDINGS`: with ``let_bindings`` (GPU lowering), the bindings of a block so
annotated are substituted even where they divide, so that its indices simplify against the
loops (an im2col gather's divisions of ``k`` by the channel count fold into the reduction
step's tap: one value per step instead of a division per element).
"""

from __future__ import annotations

from ...ir.errors import LoweringError
from ..expr import Div, FloorDiv, FloorMod, IntImm, IterType, Mod, PrimExpr, all_of, eq
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..stmt import Allocate, Block, BlockRealize, IfThenElse, LetStmt, Stmt, seq

#: Block annotation: substitute the block's bindings, never let-bind them (module docstring).
SUBSTITUTE_BINDINGS = "kiln.substitute_bindings"


def _is_const_true(expr: PrimExpr) -> bool:
    return isinstance(expr, IntImm) and expr.dtype.is_bool and expr.value == 1


def _has_division(e: PrimExpr) -> bool:
    """Whether ``e`` divides (what ``fuse`` leaves in the bindings of a fused nest)."""
    found = [False]

    def visit(n: object) -> None:
        if isinstance(n, (FloorDiv, FloorMod, Div, Mod)):
            found[0] = True

    post_order_visit(e, visit)
    return found[0]


def _lower_block(block: Block, iter_values: tuple[PrimExpr, ...], predicate: PrimExpr,
                 visit, let_bindings: bool = False) -> Stmt:
    if len(iter_values) != len(block.iter_vars):
        raise LoweringError(
            f"block {block.name_hint!r} has {len(block.iter_vars)} iteration variables but its "
            f"realize binds {len(iter_values)} values"
        )
    lets = [(iv.var, value) for iv, value in zip(block.iter_vars, iter_values)
            if let_bindings and _has_division(value)
            and not block.annotations.get(SUBSTITUTE_BINDINGS)]
    let_vars = {v for v, _ in lets}
    vmap = {iv.var: value for iv, value in zip(block.iter_vars, iter_values)
            if iv.var not in let_vars}
    # Children first: nested blocks see this block's iter vars, which substitution replaces.
    body = substitute(visit(block.body), vmap)
    if block.init is not None:
        init = substitute(visit(block.init), vmap)
        first = [
            eq(value, iv.dom.min)
            for iv, value in zip(block.iter_vars, iter_values)
            if iv.iter_type == IterType.COMM_REDUCE
        ]
        if first:
            init = IfThenElse(all_of(first), init)
        body = seq(init, body)
    for buf in reversed(block.alloc_buffers):
        body = Allocate(buf, body)
    if not _is_const_true(predicate):
        body = IfThenElse(substitute(predicate, vmap), body)
    for var, value in reversed(lets):
        body = LetStmt(var, value, body)
    return body


class _BlockToLoop(Mutator):
    def __init__(self, let_bindings: bool = False):
        self.let_bindings = let_bindings

    def visit_BlockRealize(self, realize: BlockRealize) -> Stmt:
        return _lower_block(realize.block, realize.iter_values, realize.predicate, self.visit,
                            self.let_bindings)

    def visit_Block(self, block: Block) -> Stmt:
        # A bare block (no realize) only makes sense without iteration variables.
        return _lower_block(block, (), IntImm("bool", 1), self.visit)


def convert_blocks_to_loops(func: PrimFunc, let_bindings: bool = False) -> PrimFunc:
    """Return ``func`` with every Block/BlockRealize replaced by loops, ifs and allocations.

    ``let_bindings``: an iteration variable bound to an expression that divides (``fused //
    24 % 2`` after ``fuse``) is defined once by a ``LetStmt`` instead of being substituted into
    every use (GPU lowering: a fused nest's large body would repeat the division at each
    use); affine bindings are substituted as always, so index arithmetic still simplifies."""
    body = _BlockToLoop(let_bindings).visit(func.body)
    return func if body is func.body else func.with_body(body)
