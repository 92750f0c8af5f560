"""Loop pre-pass: a store's index-only ``select``, ``min`` and ``max`` become ``if`` branches.

A TE compute expresses a window by value, not by control flow: a constant pad writes
``select(1 <= i and i < 4, A[i - 1], 0.0)``, an edge pad reads ``A[max(min(i - 1, 2), 0)]``.
Neither is an ``if``, so the loop partition (``partition_at_branches``, which splits a loop
where an ``if`` condition on its variable changes value) sees nothing to split, and the nest
stays one store whose value is no instruction: a select between a load and a constant, an
index that is no affine function of the loops. This pass rewrites the store as branches: a
``select(c, a, b)`` whose condition reads no buffer (it depends on loop and other index
variables only) becomes ``if c: store[.. a ..] else: store[.. b ..]``; a ``min(a, b)`` /
``max(a, b)`` of such integer expressions becomes the branch on ``a <= b`` / ``a >= b``. The
partition then cuts the loops where the conditions change, ``simplify`` folds each piece's
now-constant conditions, and each piece is a plain copy (``A[i - 1]``, ``A[0]``) or a
constant fill.

Innermost first: a ``min`` inside a ``max`` is branched on first, so each condition is a
comparison of affine expressions, what the partition reads. A select whose condition loads
from a buffer (``where``'s mask) is data and stays a select (the vector unit's ``vsel``).

Refuses (leaves the store) when the branches would give more than :data:`MAX_LEAVES` stores:
each select doubles them, and a padded tensor of many axes would copy the store beyond use.
"""

from __future__ import annotations

from ..expr import GE, LE, BufferLoad, Call, Max, Min, PrimExpr, Select
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit
from ..stmt import BufferStore, IfThenElse, Stmt

__all__ = ["MAX_LEAVES", "select_to_branch"]

#: Most stores one store is branched into.
MAX_LEAVES = 64


def _pure(e: PrimExpr) -> bool:
    """Whether ``e`` reads no buffer, calls nothing and holds no select, min or max (its value
    is a plain function of the index variables: innermost branch points come first)."""
    found = [False]

    def visit(n: object) -> None:
        if isinstance(n, (BufferLoad, Call, Select, Min, Max)):
            found[0] = True

    post_order_visit(e, visit)
    return not found[0]


def _index_only(*es: PrimExpr) -> bool:
    """Whether ``es`` are :func:`_pure` and use some variable (not all constants)."""
    return all(_pure(e) for e in es) and any(collect_vars(e) for e in es)


def _branch_point(store: BufferStore) -> tuple[PrimExpr, PrimExpr, PrimExpr, PrimExpr] | None:
    """``(node, condition, value if true, value if false)`` of the innermost index-only select,
    min or max of ``store`` (its indices first, then its value); None when it has none."""
    found: list[tuple[PrimExpr, PrimExpr, PrimExpr, PrimExpr]] = []

    def visit(n: object) -> None:
        if found:
            return
        if isinstance(n, Select) and _index_only(n.condition):
            found.append((n, n.condition, n.true_value, n.false_value))
        elif isinstance(n, (Min, Max)) and n.dtype.is_int and n.dtype.lanes == 1 and \
                _index_only(n.a, n.b):
            cond = LE(n.a, n.b) if isinstance(n, Min) else GE(n.a, n.b)
            found.append((n, cond, n.a, n.b))

    for e in (*store.indices, store.value):
        post_order_visit(e, visit)
        if found:
            return found[0]
    return None


class _Replace(Mutator):
    def __init__(self, node: PrimExpr, by: PrimExpr) -> None:
        self.node, self.by = node, by

    def visit(self, x):  # noqa: ANN001, ANN201 - the Mutator's signature
        if x is self.node:
            return self.by
        return super().visit(x)


def _branches(store: BufferStore, budget: list[int]) -> Stmt:
    point = _branch_point(store)
    if point is None:
        budget[0] -= 1
        return store
    node, cond, a, b = point
    then = _branches(_Replace(node, a).visit(store), budget)
    other = _branches(_Replace(node, b).visit(store), budget)
    return IfThenElse(cond, then, other)


class _Brancher(Mutator):
    def __init__(self) -> None:
        self.changed = False

    def visit_BufferStore(self, store: BufferStore) -> Stmt:
        if _branch_point(store) is None:
            return store
        budget = [MAX_LEAVES]
        out = _branches(store, budget)
        if budget[0] < 0:
            return store
        self.changed = True
        return out


def select_to_branch(func: PrimFunc) -> PrimFunc:
    """``func`` with each store's index-only selects, mins and maxes turned into branches (see
    the module docstring); ``func`` itself when it has none."""
    b = _Brancher()
    body = b.visit(func.body)
    return func.with_body(body) if b.changed else func
