"""Lowering pass: unroll-and-jam the tail tiles of a loop of independent rows.

A register tile that does not divide its row (6-pixel tiles on a 14-pixel row, 5 on 7) leaves,
after :mod:`.partition_loops`, a tail tile of a few pixels at the end of every row: 2 pixels x 2
output channel blocks is 4 vector accumulators. An FMA takes 4 cycles and two can start per
cycle, so 4 independent accumulators run at half the machine's speed: on ResNet-18's 7 x 7 x
512 convolution the 2-pixel tail (2/7 of the work) took 44% of the time, on the 14 x 14 x 256
one 25%. The rows are independent, so the tails of ``k`` consecutive rows can share one
reduction: the same loop nest, each FMA statement once per row, ``k`` times the accumulators
(and each weight vector loaded once for the ``k`` rows).

A loop annotated ``JAM_TAILS = k`` (set by a schedule that knows its iterations write disjoint
outputs and read nothing another iteration writes) is rewritten as

    for y in [0, n): A(y); T(y)        ->    for y in [0, n): A(y)
                                              for y' in [0, n // k): jam(T(k*y'), ..., T(k*y'+k-1))
                                              T(n - n % k) ... T(n - 1)

where ``T`` is the last statement of the body (the partitioned tail), or the whole body when it
is a single statement (a GEMM tile of one row, 2 accumulators per panel: the panels of a loop
run ``k`` at a time). ``jam`` merges copies of
a statement node by node: loops of equal range become one loop over the jammed bodies, the
copies' stack arrays become distinct arrays, sequences of equal length are jammed element by
element, and anything else runs one copy after the other -- an interleaving of the iterations
that keeps each one's own order, which independence makes equivalent.
"""

from __future__ import annotations

from ...arith.expr_utils import const_int
from ...ir.node import structural_equal
from ..buffer import Buffer
from ..expr import IntImm, Var
from ..function import PrimFunc
from ..functor import Mutator, substitute
from ..stmt import JAM_TAILS, Allocate, For, ForKind, SeqStmt, Stmt, seq


class _Rename(Mutator):
    """Gives every array the statement allocates a fresh data variable (a second copy of a
    tile next to the first needs its own accumulators)."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.buffers: dict[int, Buffer] = {}

    def visit_Allocate(self, s: Allocate) -> Stmt:
        b = s.buffer
        fresh = b.replace(name=f"{b.name}{self.suffix}",
                          data=Var(f"{b.data.name}{self.suffix}", b.data.dtype))
        self.buffers[id(b)] = fresh
        return Allocate(fresh, self.visit(s.body))

    def visit_Buffer(self, b: Buffer) -> Buffer:
        return self.buffers.get(id(b), b)


def _jam(copies: list[Stmt]) -> Stmt:
    first = copies[0]
    if all(isinstance(c, Allocate) for c in copies):
        body = _jam([c.body for c in copies])
        for c in reversed(copies):
            body = Allocate(c.buffer, body)
        return body
    if all(isinstance(c, For) for c in copies) and all(
            c.kind == first.kind and c.annotations == first.annotations
            and structural_equal(c.min, first.min, map_free_vars=False)
            and structural_equal(c.extent, first.extent, map_free_vars=False)
            for c in copies[1:]):
        v = first.loop_var
        bodies = [first.body] + [substitute(c.body, {c.loop_var: v}) for c in copies[1:]]
        return first.replace(body=_jam(bodies))
    if all(isinstance(c, SeqStmt) and len(c.seq) == len(first.seq) for c in copies):
        return seq(*(_jam([c.seq[i] for c in copies]) for i in range(len(first.seq))))
    return seq(*copies)


class _JamTails(Mutator):
    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        k = int(loop.annotations.get(JAM_TAILS, 0))
        lo, n = const_int(loop.min), const_int(loop.extent)
        if k < 2 or loop.kind != ForKind.SERIAL or lo is None or n is None or n < k:
            return loop
        *head, tail = loop.body.seq if isinstance(loop.body, SeqStmt) else (loop.body,)
        v, dt = loop.loop_var, loop.loop_var.dtype
        ann = {a: b for a, b in loop.annotations.items() if a != JAM_TAILS}
        rows = loop.replace(body=seq(*head), annotations=ann) if head else None
        j = Var(f"{v.name}_j", dt)
        copies = [_Rename(f"_j{i}").visit(substitute(tail, {v: j * k + (lo + i)}))
                  if i else substitute(tail, {v: j * k + lo}) for i in range(k)]
        jammed = For(j, IntImm(dt, 0), IntImm(dt, n // k), ForKind.SERIAL, _jam(copies))
        rest = [substitute(tail, {v: IntImm(dt, lo + r)}) for r in range(n - n % k, n)]
        return seq(rows, jammed, *rest)


def jam_tails(func: PrimFunc) -> PrimFunc:
    """Unroll-and-jam the last statement of every loop annotated :data:`JAM_TAILS` (see the
    module docstring)."""
    body = _JamTails().visit(func.body)
    return func if body is func.body else func.replace(body=body)
