"""Loop pre-pass: a store's index-only ``select``, ``min`` and ``max`` become ``if`` branches.

A TE compute expresses a window by value, not by control flow: a constant pad writes
``select(1 <= i and i < 4, A[i - 1], 0.0)``, an edge pad reads ``A[max(min(i - 1, 2), 0)]``.
Neither is an ``if``, so the loop partition (``partition_at_branches``, which splits a loop
where an ``if`` condition on its variable changes value) sees nothing to split, and the nest
stays one store whose value is no instruction: a select between a load and a constant, an
index that is no affine function of the loops. This pass rewrites the store as branches: a
``select(c, a, b)`` whose condition reads no buffer (it depends on loop and other index
variables only) becomes ``if c: store[.. a ..] else: store[.. b ..]``; a ``min(a, b)`` /
``max(a, b)`` of such integer expressions becomes the branch on ``a <= b`` / ``a >= b``; a
``a % p`` or ``a // p`` (``p`` a positive constant) whose dividend spans a few multiples of
``p`` over the loops' ranges (a reflect pad's folded index) becomes the branches on which
window ``a`` is in, where it is ``a - p q`` (``q``). The
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

from ...arith import Analyzer
from ...arith.expr_utils import const_int
from ...ir.node import structural_equal
from ..expr import (
    GE,
    LE,
    LT,
    BufferLoad,
    Call,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    PrimExpr,
    Range,
    Select,
)
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit
from ..stmt import BufferStore, For, IfThenElse, Stmt

__all__ = ["MAX_LEAVES", "select_to_branch"]

#: Most stores one store is branched into.
MAX_LEAVES = 64
#: Most windows of ``a % p`` / ``a // p`` branched on (a reflect pad's index folds at most
#: twice when each pad is shorter than the axis).
MAX_WINDOWS = 4


def _pure(e: PrimExpr) -> bool:
    """Whether ``e`` reads no buffer, calls nothing and holds no select, min, max, floor-modulo
    or floor-division (its value is a plain function of the index variables: innermost branch
    points come first)."""
    found = [False]

    def visit(n: object) -> None:
        if isinstance(n, (BufferLoad, Call, Select, Min, Max, FloorMod, FloorDiv)):
            found[0] = True

    post_order_visit(e, visit)
    return not found[0]


def _index_only(*es: PrimExpr) -> bool:
    """Whether ``es`` are :func:`_pure` and use some variable (not all constants)."""
    return all(_pure(e) for e in es) and any(collect_vars(e) for e in es)


def _windows(n: FloorMod | FloorDiv, ana: Analyzer) -> tuple[PrimExpr, PrimExpr, PrimExpr] | None:
    """``(condition, value if true, value if false)`` of ``a % p`` / ``a // p`` (``p`` a
    positive constant, ``a`` index arithmetic whose range over the loops spans 2 to
    :data:`MAX_WINDOWS` multiples of ``p``): the first window ``a < p (q + 1)`` gives
    ``a - p q`` (``q``), the rest a select chain over the next windows."""
    p = const_int(n.b)
    if p is None or p <= 0 or not n.dtype.is_int or not _index_only(n.a):
        return None
    b = ana.const_int_bound(n.a)
    q0, q1 = b.min_value // p, b.max_value // p
    if not 0 < q1 - q0 < MAX_WINDOWS:
        return None
    dt = n.dtype

    def value(q: int) -> PrimExpr:
        return n.a - IntImm(dt, p * q) if isinstance(n, FloorMod) else IntImm(dt, q)

    rest = value(q1)
    for q in range(q1 - 1, q0, -1):
        rest = Select(LT(n.a, IntImm(dt, p * (q + 1))), value(q), rest)
    return LT(n.a, IntImm(dt, p * (q0 + 1))), value(q0), rest


def _branch_point(store: BufferStore, ana: Analyzer
                  ) -> tuple[PrimExpr, PrimExpr, PrimExpr, PrimExpr] | None:
    """``(node, condition, value if true, value if false)`` of the innermost index-only select,
    min, max, floor-modulo or floor-division of ``store`` (its indices first, then its value);
    None when it has none."""
    found: list[tuple[PrimExpr, PrimExpr, PrimExpr, PrimExpr]] = []

    def visit(n: object) -> None:
        if found:
            return
        if isinstance(n, (FloorMod, FloorDiv)):
            w = _windows(n, ana)
            if w is not None:
                found.append((n, *w))
        elif isinstance(n, Select) and _index_only(n.condition):
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
    """Every occurrence of ``node`` (structurally: a pad repeats its index expression in the
    select's condition and arms) replaced by ``by``."""

    def __init__(self, node: PrimExpr, by: PrimExpr) -> None:
        self.node, self.by = node, by

    def visit(self, x):  # noqa: ANN001, ANN201 - the Mutator's signature
        if x is self.node or (type(x) is type(self.node) and
                              structural_equal(x, self.node, map_free_vars=False)):
            return self.by
        return super().visit(x)


def _branches(store: BufferStore, budget: list[int], ana: Analyzer) -> Stmt:
    point = _branch_point(store, ana)
    if point is None or budget[0] < 0:
        budget[0] -= 1
        return store
    node, cond, a, b = point
    then = _branches(_Replace(node, a).visit(store), budget, ana)
    other = _branches(_Replace(node, b).visit(store), budget, ana)
    return IfThenElse(cond, then, other)


class _Brancher(Mutator):
    def __init__(self) -> None:
        self.changed = False
        self.ana = Analyzer()

    def visit_For(self, loop: For) -> Stmt:
        lo, n = const_int(loop.min), const_int(loop.extent)
        if lo is not None and n is not None and n > 0:
            self.ana.bind(loop.loop_var, Range(loop.min, loop.extent))
        return self.generic_visit(loop)

    def visit_BufferStore(self, store: BufferStore) -> Stmt:
        if _branch_point(store, self.ana) is None:
            return store
        budget = [MAX_LEAVES]
        out = _branches(store, budget, self.ana)
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
