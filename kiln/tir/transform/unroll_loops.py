"""Lowering pass: expand ``ForKind.UNROLLED`` loops of small constant extent into copies.

``#pragma GCC unroll`` asks GCC to unroll late, after its loop-invariant motion ran; an
accumulator tile ``C[i0 + ii, j0 + jv]`` indexed by the unrolled ``ii``/``jv`` then still looks
loop-variant to GCC inside the reduction loop around it, so it stays in memory (a load and a
store per FMA). Writing the copies out makes each accumulator's address invariant in the
reduction loop, so GCC can keep the tile in registers (the kernel's buffer pointers are
``restrict``). Loops whose copies would be large, or whose body declares something (an
allocation, a let) that would be declared twice in one C scope, keep the pragma instead.
"""

from __future__ import annotations

from ..expr import IntImm, add
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..stmt import Allocate, For, ForKind, LetStmt, Stmt, seq

#: Largest number of loop-body copies one unrolled loop may expand into (nested unrolled
#: loops multiply: a 4 x 3 tile is 12 copies).
MAX_COPIES = 64
#: Largest number of statement nodes after expansion.
MAX_NODES = 4096


def tree_size(stmt: Stmt) -> tuple[int, bool]:
    """(number of nodes, whether ``stmt`` declares something) of a statement tree."""
    count, declares = 0, False

    def visit(n: object) -> None:
        nonlocal count, declares
        count += 1
        if isinstance(n, (Allocate, LetStmt)):
            declares = True

    post_order_visit(stmt, visit)
    return count, declares


class _Unroller(Mutator):
    def visit_For(self, s: For) -> Stmt:
        body = self.visit(s.body)
        if (s.kind == ForKind.UNROLLED and isinstance(s.extent, IntImm)
                and isinstance(s.min, IntImm) and 1 <= s.extent.value <= MAX_COPIES):
            nodes, declares = tree_size(body)
            if not declares and nodes * s.extent.value <= MAX_NODES:
                copies = [substitute(body, {s.loop_var: add(s.min, IntImm(s.loop_var.dtype, k))})
                          for k in range(s.extent.value)]
                return seq(*copies)
        return s if body is s.body else s.replace(body=body)


def unroll_loops(func: PrimFunc) -> PrimFunc:
    """``func`` with its small constant-extent unrolled loops written out."""
    body = _Unroller().visit(func.body)
    return func if body is func.body else func.with_body(body)
