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

Read/write regions and block annotations carry no run-time meaning and are dropped.
"""

from __future__ import annotations

from ...ir.errors import LoweringError
from ..expr import IntImm, IterType, PrimExpr, all_of, eq
from ..function import PrimFunc
from ..functor import Mutator, substitute
from ..stmt import Allocate, Block, BlockRealize, IfThenElse, Stmt, seq


def _is_const_true(expr: PrimExpr) -> bool:
    return isinstance(expr, IntImm) and expr.dtype.is_bool and expr.value == 1


def _lower_block(block: Block, iter_values: tuple[PrimExpr, ...], predicate: PrimExpr,
                 visit) -> Stmt:
    if len(iter_values) != len(block.iter_vars):
        raise LoweringError(
            f"block {block.name_hint!r} has {len(block.iter_vars)} iteration variables but its "
            f"realize binds {len(iter_values)} values"
        )
    vmap = {iv.var: value for iv, value in zip(block.iter_vars, iter_values)}
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
    return body


class _BlockToLoop(Mutator):
    def visit_BlockRealize(self, realize: BlockRealize) -> Stmt:
        return _lower_block(realize.block, realize.iter_values, realize.predicate, self.visit)

    def visit_Block(self, block: Block) -> Stmt:
        # A bare block (no realize) only makes sense without iteration variables.
        return _lower_block(block, (), IntImm("bool", 1), self.visit)


def convert_blocks_to_loops(func: PrimFunc) -> PrimFunc:
    """Return ``func`` with every Block/BlockRealize replaced by loops, ifs and allocations."""
    body = _BlockToLoop().visit(func.body)
    return func if body is func.body else func.with_body(body)
