"""Lowering pass: move heap allocations out of the serial loops around them.

Buffer compaction (``compact_buffers``) allocates a stage's scratch inside the lowest loop
using it, shrunk to one iteration's region. A small constant-size scratch becomes a stack array
(free, and what lets the C compiler keep a register tile in registers); a larger one is a heap
allocation, and inside a loop that is one ``malloc``/``free`` pair per iteration. glibc returns
the freed top of the heap to the system once it exceeds its trim threshold, so every iteration
then page-faults the buffer in again: a K-blocked GEMM packing a 72 KiB block of ``a`` per
reduction block ran at a third of its speed. This pass hoists such an ``Allocate`` out of each
enclosing serial (or unrolled/vectorized) loop whose variable its size does not use (out of a
statement sequence first, widening its scope to the whole sequence); it stops at a parallel
loop, whose iterations run on different threads -- C code generation gives each thread one
buffer for all its iterations.
Hoisting only widens the buffer's lifetime: every iteration still writes what it reads.
"""

from __future__ import annotations

from ..buffer import Buffer
from ..expr import IntImm, PrimExpr, Var
from ..function import PrimFunc
from ..functor import Mutator, collect_vars
from ..stmt import Allocate, For, ForKind, SeqStmt, Stmt
from .flatten_buffers import flat_size

#: Largest constant-size buffer (bytes) that C code generation puts on the stack.
STACK_LIMIT = 64 * 1024


def alloc_size(buffer: Buffer) -> PrimExpr:
    """Number of elements an ``Allocate`` of ``buffer`` reserves."""
    return flat_size(buffer) if len(buffer.shape) != 1 else buffer.shape[0]


def on_stack(buffer: Buffer) -> bool:
    """Whether C code generation puts ``buffer`` on the stack (constant size up to
    :data:`STACK_LIMIT` bytes) rather than allocating it on the heap."""
    size = alloc_size(buffer)
    itemsize = max(1, buffer.dtype.element.itemsize)
    return isinstance(size, IntImm) and 0 < size.value * itemsize <= STACK_LIMIT


def _heap_chain(stmt: Stmt, var: Var | None = None) -> tuple[list[Allocate], Stmt]:
    """The chain of heap allocations at the top of ``stmt`` (those whose sizes do not use
    ``var``, when given) and the statement inside them."""
    found: list[Allocate] = []
    while isinstance(stmt, Allocate) and not on_stack(stmt.buffer) and not (
            var is not None and any(v is var for v in collect_vars(tuple(stmt.buffer.shape)))):
        found.append(stmt)
        stmt = stmt.body
    return found, stmt


def invariant_heap_allocations(loop: For) -> tuple[list[Allocate], Stmt]:
    """The heap allocations at the top of ``loop``'s body whose sizes do not use its variable
    (one buffer can serve every iteration), and the statement inside them. C code generation
    uses it too: such an allocation at the top of a parallel loop becomes one buffer per
    thread."""
    return _heap_chain(loop.body, loop.loop_var)


class _Hoist(Mutator):
    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        if loop.kind == ForKind.PARALLEL:
            return loop
        hoisted, body = invariant_heap_allocations(loop)
        out: Stmt = loop if body is loop.body else loop.replace(body=body)
        for alloc in reversed(hoisted):
            out = alloc.replace(body=out)
        return out

    def visit_SeqStmt(self, seq: SeqStmt) -> Stmt:
        """``a; alloc X { b }; c`` -> ``alloc X { a; b; c }`` for heap buffers, so that the
        allocation reaches the top of the loop body it is in and can leave the loop."""
        seq = self.generic_visit(seq)
        lifted: list[Allocate] = []
        items: list[Stmt] = []
        for item in seq.seq:
            allocs, inner = _heap_chain(item)
            lifted += allocs
            items.append(inner)
        if not lifted:
            return seq
        out: Stmt = SeqStmt(tuple(items))
        for alloc in reversed(lifted):
            out = alloc.replace(body=out)
        return out


def hoist_allocations(func: PrimFunc) -> PrimFunc:
    """Return ``func`` (loop form, after buffer flattening) with heap allocations hoisted out
    of the serial loops whose variables their sizes do not use (see the module docstring)."""
    body = _Hoist().visit(func.body)
    return func if body is func.body else func.replace(body=body)
