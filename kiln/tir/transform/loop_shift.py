"""Loop pre-pass: normalize every loop to start at 0.

An instruction selector (the NPU's nest analysis) matches a nest by its loops' extents and the
per-loop steps of its accesses; a loop ``for i in [a, b)`` -- what ``partition_loops`` leaves
for the pieces after the first, or a schedule's offset window -- makes every index carry the
offset ``a`` through the loop variable, so the same access looks different per piece. This pass
rewrites ``for i in [a, a + n)`` into ``for i' in [0, n)`` with ``i = i' + a`` substituted in
the body: the offset moves into the indices' constant part, where a DMA's base address takes it.

Refuses (leaves the loop as it is) a loop whose ``min`` is already the constant 0, and a
``ForKind.THREAD_BINDING`` loop (its range is the launch shape's, not the program's). A loop of
symbolic ``min`` is shifted too: ``i' + a`` is exact for any ``a``.
"""

from __future__ import annotations

from ...arith.expr_utils import const_int
from ..expr import IntImm, Var
from ..function import PrimFunc
from ..functor import Mutator, substitute
from ..stmt import For, ForKind, Stmt


class _Shifter(Mutator):
    def __init__(self) -> None:
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        if const_int(loop.min) == 0 or loop.kind == ForKind.THREAD_BINDING:
            return loop
        self.changed = True
        v = loop.loop_var
        shifted = Var(v.name, v.dtype)
        body = substitute(loop.body, {v: shifted + loop.min})
        return loop.replace(loop_var=shifted, min=IntImm(v.dtype, 0), body=body)


def shift_loop(loop: For) -> For:
    """``loop`` (and the loops inside it) starting at 0 (see the module docstring)."""
    return _Shifter().visit(loop)


def loop_shift(func: PrimFunc) -> PrimFunc:
    """``func`` with every loop normalized to start at 0; ``func`` itself when all do."""
    s = _Shifter()
    body = s.visit(func.body)
    return func.with_body(body) if s.changed else func
