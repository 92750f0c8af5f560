"""Lowering pass: split a loop whose tail iterations are guarded into full iterations and a tail.

A register tile that does not divide its axis (6-pixel tiles on a 56-pixel row, 6-row tiles of
1024 rows) leaves guards like ``if (x_0 * 6 < 54)`` around the tile's stores -- inside the
innermost reduction loop, once per accumulator. They are false only in the last iteration of
the tile loop, yet they sit among the FMAs as compare-and-branch pairs, and GCC, keeping them,
runs short of registers and spills accumulators. This pass (TVM's LoopPartition, for the case
that matters here) finds, for a serial loop ``v`` of constant bounds, the guards that depend on
``v`` alone and become false past some iteration (``a * v + b < c`` with ``a > 0``), and splits
the loop at the first iteration where one fails: ``for v in [0, v0)`` -- where the following
``simplify`` proves every such guard true and drops it -- and a tail ``for v' in [v0, n)``
keeping them. A body larger than :data:`MAX_NODES` is left alone (it would be copied).
"""

from __future__ import annotations

from ...arith import Analyzer
from ...arith.expr_utils import const_int
from ..expr import LE, LT, And, IntImm, PrimExpr, Var
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit, substitute
from ..stmt import For, ForKind, IfThenElse, Stmt, seq
from .unroll_loops import tree_size

#: Largest loop body (statement and expression nodes) that may be copied into a tail.
MAX_NODES = 16384


def _conjuncts(cond: PrimExpr) -> list[PrimExpr]:
    if isinstance(cond, And):
        return _conjuncts(cond.a) + _conjuncts(cond.b)
    return [cond]


def _first_failure(atom: PrimExpr, v: Var, lo: int, ana: Analyzer) -> int | None:
    """The least ``v >= lo`` from which ``atom`` (``lhs < rhs`` or ``lhs <= rhs``, affine in
    ``v`` with a positive slope) is false; None when ``atom`` is not of that form."""
    if not isinstance(atom, (LT, LE)) or atom.a.dtype.lanes != 1:
        return None
    diff = atom.a - atom.b
    f0 = const_int(ana.simplify(substitute(diff, {v: IntImm(v.dtype, lo)})))
    f1 = const_int(ana.simplify(substitute(diff, {v: IntImm(v.dtype, lo + 1)})))
    if f0 is None or f1 is None or f1 <= f0:
        return None
    slope = f1 - f0
    # f(v) = f0 + slope * (v - lo); LT holds while f < 0, LE while f <= 0
    steps = -(f0 // slope) if isinstance(atom, LT) else (-f0) // slope + 1
    first = lo + max(steps, 0)
    # affine check at the failure point and just before it (guards built from div/mod are not)
    for k in (first - 1, first):
        if k < lo:
            continue
        holds = const_int(ana.simplify(substitute(atom, {v: IntImm(v.dtype, k)})))
        if holds is None or bool(holds) != (k < first):
            return None
    return first


def _guards_on(body: Stmt, v: Var) -> list[PrimExpr]:
    """Conjuncts of the ``if`` conditions in ``body`` whose only variable is ``v``."""
    out: list[PrimExpr] = []

    def visit(n: object) -> None:
        if isinstance(n, IfThenElse):
            for atom in _conjuncts(n.condition):
                names = collect_vars(atom)
                if names and all(x is v for x in names):
                    out.append(atom)

    post_order_visit(body, visit)
    return out


class _Partitioner(Mutator):
    def __init__(self) -> None:
        self.ana = Analyzer()
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        lo, n = const_int(loop.min), const_int(loop.extent)
        if loop.kind != ForKind.SERIAL or lo is None or n is None or n < 2:
            return loop
        guards = _guards_on(loop.body, loop.loop_var)
        if not guards or tree_size(loop.body)[0] > MAX_NODES:
            return loop
        firsts = [_first_failure(g, loop.loop_var, lo, self.ana) for g in guards]
        known = [f for f in firsts if f is not None]
        if not known:
            return loop
        split = min(known)
        if split <= lo or split >= lo + n:
            return loop
        self.changed = True
        dt = loop.loop_var.dtype
        tail_var = Var(f"{loop.loop_var.name}_t", dt)
        main = loop.replace(extent=IntImm(dt, split - lo))
        tail = loop.replace(loop_var=tail_var, min=IntImm(dt, split),
                            extent=IntImm(dt, lo + n - split),
                            body=substitute(loop.body, {loop.loop_var: tail_var}))
        return seq(main, tail)


def partition_loops(func: PrimFunc) -> PrimFunc:
    """``func`` (loop form) with guarded tail iterations split off (see the module docstring).
    Run ``simplify`` afterwards: it drops the guards the full-iteration loops make true."""
    p = _Partitioner()
    body = p.visit(func.body)
    return func.with_body(body) if p.changed else func
