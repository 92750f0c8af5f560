"""Loop pre-pass: hoist conditions that do not depend on a loop out of it (loop unswitching).

An ``if`` whose condition is the same in every iteration of a loop -- a flag on an outer
loop's variable (``if k == 0`` inside the loops under ``k``, the first step of a reduction),
a symbolic size -- blocks the loop from being matched as one instruction: the selector sees a
branch among its statements. This pass moves the branch outside:
``for i: if c: S`` becomes ``if c: for i: S`` (with an ``else``, ``for i: E`` in the other
branch), and a loop whose body holds such an ``if`` among other statements is *unswitched*:
``if c: for i: body[if -> then] else: for i: body[if -> else]``. Each copy then has no branch
on ``c``; repeated (innermost loops first) a condition climbs as far as it is invariant.

Refuses (leaves the loop) when no ``if`` in the loop's body has a condition that is invariant:
one using the loop's variable, a variable bound inside the loop (an inner loop's, a let's), or
loading from a buffer that the loop stores to (its value may change between iterations); and
when the body is larger than :data:`MAX_NODES` (unswitching copies it). ``if`` statements
below an ``Allocate`` inside the loop are hoisted as well (the allocation is copied with its
branch). Loops bound to GPU threads are left alone.
"""

from __future__ import annotations

from ..expr import BufferLoad, PrimExpr
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit
from ..stmt import BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, Stmt
from .unroll_loops import tree_size

#: Largest loop body (statement and expression nodes) that is copied to unswitch a loop.
MAX_NODES = 16384


def _bound_and_stored(body: Stmt) -> tuple[set[int], set[int]]:
    """Ids of the variables bound inside ``body`` and of the data vars of buffers it stores to."""
    bound: set[int] = set()
    stored: set[int] = set()

    def visit(n: object) -> None:
        if isinstance(n, For):
            bound.add(id(n.loop_var))
        elif isinstance(n, LetStmt):
            bound.add(id(n.var))
        elif isinstance(n, BufferStore):
            stored.add(id(n.buffer.data))

    post_order_visit(body, visit, exprs=False)
    return bound, stored


def _invariant(cond: PrimExpr, loop: For, bound: set[int], stored: set[int]) -> bool:
    if any(x is loop.loop_var or id(x) in bound for x in collect_vars(cond)):
        return False
    loads: list[BufferLoad] = []
    post_order_visit(cond, lambda n: loads.append(n) if isinstance(n, BufferLoad) else None)
    return not any(id(ld.buffer.data) in stored for ld in loads)


def _first_invariant_if(loop: For) -> IfThenElse | None:
    bound, stored = _bound_and_stored(loop.body)
    found: list[IfThenElse] = []

    def visit(n: object) -> None:
        if isinstance(n, IfThenElse) and _invariant(n.condition, loop, bound, stored):
            found.append(n)

    post_order_visit(loop.body, visit, exprs=False)
    # post-order lists inner ifs first; hoist the outermost one (its branches carry the rest)
    return found[-1] if found else None


class _Replace(Mutator):
    """Replaces one statement (by identity) with another."""

    def __init__(self, target: Stmt, by: Stmt):
        self.target, self.by = target, by

    def visit(self, x: object) -> object:
        if x is self.target:
            return self.by
        return super().visit(x)


def _noop() -> Stmt:
    return Evaluate(0)


class _Promoter(Mutator):
    def __init__(self) -> None:
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        if loop.kind == ForKind.THREAD_BINDING:
            return loop
        branch = _first_invariant_if(loop)
        if branch is None or tree_size(loop.body)[0] > MAX_NODES:
            return loop
        self.changed = True
        then_loop = loop.replace(body=_Replace(branch, branch.then_case).visit(loop.body))
        other = branch.else_case if branch.else_case is not None else _noop()
        else_loop = loop.replace(body=_Replace(branch, other).visit(loop.body))
        # each copy may hold further invariant branches: promote them too
        then_loop = self.visit_For(then_loop)
        else_loop = self.visit_For(else_loop)
        if loop.body is branch and branch.else_case is None:
            return IfThenElse(branch.condition, then_loop, None)
        return IfThenElse(branch.condition, then_loop, else_loop)


def if_promotion(func: PrimFunc) -> PrimFunc:
    """``func`` with loop-invariant ``if`` conditions hoisted out of their loops (see the module
    docstring); ``func`` itself when there are none. Run ``simplify`` afterwards to drop loops
    left with empty bodies."""
    p = _Promoter()
    body = p.visit(func.body)
    return func.with_body(body) if p.changed else func
