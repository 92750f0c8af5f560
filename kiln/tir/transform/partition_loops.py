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

A loop over a symbolic range (a dynamic batch: ``for i_0 in [0, (n + 5) / 6)`` with guards
``i_0 * 6 + 5 < n``) is split the same way at a symbolic point, the least over its guards of
the first iteration where the guard fails (``n / 6`` here); the guards may use variables bound
outside the loop. No simplifier proves those guards from the split, so the pass itself
replaces them by ``true`` in the full-iteration copy: they hold there by construction. The
tail (with a dynamic batch of 1, the only tile) gets one copy per number of guards that hold,
chosen by an if-chain, so its FMAs carry no guards either.
"""

from __future__ import annotations

from ...arith import Analyzer
from ...arith.expr_utils import const_int
from ..expr import EQ, GE, GT, LE, LT, NE, And, IntImm, Not, Or, PrimExpr, Var, floordiv
from ..expr import max as tmax
from ..expr import min as tmin
from ..function import PrimFunc
from ..functor import Mutator, collect_vars, post_order_visit, substitute
from ..stmt import For, ForKind, IfThenElse, LetStmt, Stmt, seq
from .unroll_loops import tree_size

#: Largest loop body (statement and expression nodes) that may be copied into a tail.
MAX_NODES = 16384
#: Largest total size of the per-row-count copies of a symbolic tail (see ``_specialise``).
MAX_SPECIALISED_NODES = 4 * MAX_NODES


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

    post_order_visit(body, visit, exprs=False)
    return out


def _symbolic_failure(atom: PrimExpr, v: Var, lo: int, ana: Analyzer,
                      inner: dict[int, tuple[Var, int, int]] | None = None) -> PrimExpr | None:
    """The least ``v >= lo`` from which ``atom`` (``lhs < rhs`` or ``lhs <= rhs``, affine in
    ``v`` with a constant positive slope, any other terms invariant) is false, as an
    expression; None when ``atom`` is not of that form. Variables of loops inside ``v``'s
    body (``inner``: id -> (var, min, max)) are taken at the end of their range where the
    guard is strictest, so that it holds for all of them before that point."""
    form = _affine_form(atom, v, lo, ana, inner)
    if form is None:
        return None
    d0, slope = form
    # f(k) = d0 + slope * k (k = v - lo); LT holds while f < 0, LE while f <= 0
    steps = (floordiv(slope - 1 - d0, slope) if isinstance(atom, LT)
             else floordiv(0 - d0, slope) + 1)
    return steps + lo


def _affine_form(atom: PrimExpr, v: Var, lo: int, ana: Analyzer,
                 inner: dict[int, tuple[Var, int, int]] | None = None
                 ) -> tuple[PrimExpr, int] | None:
    """``(d0, slope)`` with ``lhs - rhs == d0 + slope * (v - lo)`` for a comparison ``atom``
    (see :func:`_symbolic_failure`), or None."""
    if not isinstance(atom, (LT, LE)) or atom.a.dtype.lanes != 1:
        return None
    dt = v.dtype
    diff = atom.a - atom.b
    for x in collect_vars(atom):
        if inner is None or id(x) not in inner:
            continue
        w, w_lo, w_hi = inner[id(x)]
        at_lo = substitute(diff, {w: IntImm(w.dtype, w_lo)})
        at_hi = substitute(diff, {w: IntImm(w.dtype, w_hi)})
        step = const_int(ana.simplify(substitute(diff, {w: IntImm(w.dtype, w_lo + 1)}) - at_lo))
        # affine in w (so monotone): the strictest value is at one end of the range
        if step is None or const_int(ana.simplify(diff - (at_lo + (w - w_lo) * step))) != 0:
            return None
        diff = at_hi if step >= 0 else at_lo
    d0 = ana.simplify(substitute(diff, {v: IntImm(dt, lo)}))
    d1 = ana.simplify(substitute(diff, {v: IntImm(dt, lo + 1)}))
    slope = const_int(ana.simplify(d1 - d0))
    if slope is None or slope <= 0:
        return None
    # affine in v: diff == d0 + slope * (v - lo) must simplify to an identity
    if const_int(ana.simplify(diff - (d0 + (v - lo) * slope))) != 0:
        return None
    return d0, slope


def _bound_inside(body: Stmt) -> tuple[set[int], dict[int, tuple[Var, int, int]]]:
    """Ids of the variables bound inside ``body`` (loop and let variables), and of those the
    loops of constant range: id -> (variable, first value, last value)."""
    out: set[int] = set()
    ranges: dict[int, tuple[Var, int, int]] = {}

    def visit(n: object) -> None:
        if isinstance(n, For):
            out.add(id(n.loop_var))
            lo, ext = const_int(n.min), const_int(n.extent)
            if lo is not None and ext is not None and ext > 0:
                ranges[id(n.loop_var)] = (n.loop_var, lo, lo + ext - 1)
        elif isinstance(n, LetStmt):
            out.add(id(n.var))

    post_order_visit(body, visit, exprs=False)
    return out, ranges


class _Assume(Mutator):
    """Replaces the given expression nodes (by identity) with constants: ``values`` maps
    ``id(node)`` to the truth value."""

    def __init__(self, values: dict[int, bool]):
        self.values = values

    def visit(self, x: object) -> object:
        if id(x) in self.values:
            return IntImm("bool", int(self.values[id(x)]))
        return super().visit(x)


def _symbolic_guards(body: Stmt, v: Var) -> tuple[list[PrimExpr], dict[int, tuple[Var, int, int]]]:
    """Conjuncts of the ``if`` conditions in ``body`` that use ``v`` and otherwise only
    variables bound outside ``body`` or by its loops of constant range (returned too)."""
    inner, ranges = _bound_inside(body)
    out: list[PrimExpr] = []

    def visit(n: object) -> None:
        if isinstance(n, IfThenElse):
            for atom in _conjuncts(n.condition):
                names = collect_vars(atom)
                if any(x is v for x in names) and all(
                        id(x) not in inner or id(x) in ranges for x in names):
                    out.append(atom)

    post_order_visit(body, visit, exprs=False)
    return out, ranges


class _Partitioner(Mutator):
    def __init__(self) -> None:
        self.ana = Analyzer()
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        lo, n = const_int(loop.min), const_int(loop.extent)
        if loop.kind != ForKind.SERIAL or lo is None:
            return loop
        if n is None:
            return self._partition_symbolic(loop, lo)
        if n < 2:
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


    def _partition_symbolic(self, loop: For, lo: int) -> Stmt:
        """Split a loop of symbolic extent at the first iteration where one of its guards
        fails (see the module docstring)."""
        v = loop.loop_var
        guards, ranges = _symbolic_guards(loop.body, v)
        if not guards or tree_size(loop.body)[0] > MAX_NODES:
            return loop
        found = [(g, f) for g in guards
                 if (f := _symbolic_failure(g, v, lo, self.ana, ranges)) is not None]
        if not found:
            return loop
        split = found[0][1]
        for _, f in found[1:]:
            split = tmin(split, f)
        dt = v.dtype
        end = loop.extent + lo
        split = self.ana.simplify(tmax(IntImm(dt, lo), tmin(split, end)))
        self.changed = True
        tail_var = Var(f"{v.name}_t", dt)
        main = loop.replace(extent=self.ana.simplify(split - lo),
                            body=_Assume({id(g): True for g, _ in found}).visit(loop.body))
        tail_body = substitute(loop.body, {v: tail_var})
        tail = loop.replace(loop_var=tail_var, min=split,
                            extent=self.ana.simplify(end - split),
                            body=self._specialise(tail_body, tail_var, lo) or tail_body)
        return seq(main, tail)

    def _specialise(self, body: Stmt, v: Var, lo: int) -> Stmt | None:
        """``body`` with its guards on ``v`` alone (and invariant terms) resolved per case of
        how many of them hold: in a tail tile (``6 * v + r < n``, r = 0..5) they differ only
        by a constant, so they hold for ``r < R``, ``R = n - 6 * v``, and an if-chain on ``R``
        leads to a copy of the body without guards for each row count. None when the guards
        are not of that form or the copies would be too large."""
        guards, _ = _symbolic_guards(body, v)
        inner, _ = _bound_inside(body)
        forms = []
        for g in guards:
            if any(id(x) in inner for x in collect_vars(g)):
                continue  # depends on an inner loop: stays a run-time guard
            form = _affine_form(g, v, lo, self.ana)
            if form is not None:
                forms.append((g, *form))
        if not forms:
            return None
        _, d_ref, slope = forms[0]
        thresholds: dict[int, int] = {}
        for g, d0, sl in forms:
            c = const_int(self.ana.simplify(d0 - d_ref))
            if sl != slope or c is None:
                return None
            # g holds iff c < R (LT) or c <= R (LE), R = -(d_ref + slope * (v - lo))
            thresholds[id(g)] = c if isinstance(g, LT) else c - 1
        cuts = sorted(set(thresholds.values()))
        if tree_size(body)[0] * (len(cuts) + 1) > MAX_SPECIALISED_NODES:
            return None
        rest = self.ana.simplify(0 - (d_ref + (v - lo) * slope))
        stmt: Stmt = _Assume({k: False for k in thresholds}).visit(body)
        for t in cuts:
            case = _Assume({k: th <= t for k, th in thresholds.items()}).visit(body)
            stmt = IfThenElse(rest > t, case, stmt)
        return stmt


def partition_loops(func: PrimFunc) -> PrimFunc:
    """``func`` (loop form) with guarded tail iterations split off (see the module docstring).
    Run ``simplify`` afterwards: it drops the guards the full-iteration loops make true."""
    p = _Partitioner()
    body = p.visit(func.body)
    return func.with_body(body) if p.changed else func


# ---- every change point (the NPU's pre-pass) --------------------------------------------------
#: Most pieces one loop is split into by :func:`partition_at_branches`.
MAX_PIECES = 16

_COMPARISONS = (LT, LE, GT, GE, EQ, NE)


def _all_atoms_on(body: Stmt, v: Var) -> list[PrimExpr]:
    """Comparisons among the conjuncts and disjuncts of ``body``'s ``if`` conditions whose only
    variable is ``v``."""
    out: list[PrimExpr] = []

    def split(c: PrimExpr) -> list[PrimExpr]:
        if isinstance(c, (And, Or)):
            return split(c.a) + split(c.b)
        if isinstance(c, Not):
            return split(c.a)
        return [c]

    def visit(n: object) -> None:
        if isinstance(n, IfThenElse):
            for atom in split(n.condition):
                names = collect_vars(atom)
                if (isinstance(atom, _COMPARISONS) and atom.a.dtype.lanes == 1 and names
                        and all(x is v for x in names)):
                    out.append(atom)

    post_order_visit(body, visit, exprs=False)
    return out


def change_points(atom: PrimExpr, v: Var, lo: int, n: int, ana: Analyzer) -> list[int] | None:
    """The iterations ``k`` in ``(lo, lo + n)`` where comparison ``atom`` (its two sides affine
    in ``v``, the only variable) takes another value than at ``k - 1``; None when ``atom`` is
    not affine in ``v`` (checked at both ends of the range). An inequality changes at most
    once, ``==``/``!=`` at most twice (entering and leaving the root)."""
    diff = atom.a - atom.b

    def at(k: int) -> int | None:
        return const_int(ana.simplify(substitute(diff, {v: IntImm(v.dtype, k)})))

    d0, d1, dn = at(lo), at(lo + 1), at(lo + n - 1)
    if d0 is None or d1 is None or dn is None:
        return None
    slope = d1 - d0
    if dn != d0 + slope * (n - 1):
        return None
    if slope == 0:
        return []

    def truth(k: int) -> bool:
        d = d0 + slope * (k - lo)
        return {LT: d < 0, LE: d <= 0, GT: d > 0, GE: d >= 0, EQ: d == 0,
                NE: d != 0}[type(atom)]

    # the value at k is monotone in k for an inequality, and for ==/!= piecewise with the root
    # (where d == 0, if integral) as the one point of the other value: candidates are the
    # iterations around where d crosses zero
    root = -d0 / slope + lo
    cands = {int(root) + off for off in (-1, 0, 1, 2)}
    return sorted(k for k in cands if lo < k < lo + n and truth(k) != truth(k - 1))


class _BranchPartitioner(Mutator):
    def __init__(self) -> None:
        self.ana = Analyzer()
        self.changed = False

    def visit_For(self, loop: For) -> Stmt:
        loop = self.generic_visit(loop)
        lo, n = const_int(loop.min), const_int(loop.extent)
        if loop.kind != ForKind.SERIAL or lo is None or n is None or n < 2:
            return loop
        v = loop.loop_var
        atoms = _all_atoms_on(loop.body, v)
        cuts: set[int] = set()
        for atom in atoms:
            pts = change_points(atom, v, lo, n, self.ana)
            if pts is not None:
                cuts.update(pts)
        if not cuts or len(cuts) + 1 > MAX_PIECES:
            return loop
        if tree_size(loop.body)[0] * (len(cuts) + 1) > MAX_SPECIALISED_NODES:
            return loop
        self.changed = True
        bounds = [lo, *sorted(cuts), lo + n]
        dt = v.dtype
        pieces = []
        for start, stop in zip(bounds, bounds[1:]):
            # every atom holds the value it has at the piece's first iteration throughout it
            known = {}
            for atom in atoms:
                val = const_int(self.ana.simplify(substitute(atom, {v: IntImm(dt, start)})))
                if val is not None and change_points(atom, v, start, stop - start,
                                                     self.ana) == []:
                    known[id(atom)] = bool(val)
            pv = Var(v.name, dt)
            body = substitute(_Assume(known).visit(loop.body), {v: pv})
            pieces.append(loop.replace(loop_var=pv, min=IntImm(dt, start),
                                       extent=IntImm(dt, stop - start), body=body))
        return seq(*pieces)


def partition_at_branches(func: PrimFunc) -> PrimFunc:
    """``func`` (loop form) with every serial loop of constant bounds split at *each* iteration
    where an ``if`` condition on its variable alone changes value -- both ends of a window,
    ``0 <= i - 1 < H`` over ``i in [0, H + 2)`` gives three pieces, ``i == 0`` two -- and the
    conditions replaced by their constant value in each piece (``simplify`` then removes the
    branches). :func:`partition_loops` splits only at the first failure of an increasing
    guard, what a tile's tail needs on the CPU; this is the NPU pre-pass's general case, whose
    instruction selector matches branch-free nests only.

    Refuses (leaves the loop) when: the loop is not serial or its bounds are not constants;
    no condition is a comparison whose only variable is the loop's, affine in it; the split
    would give more than :data:`MAX_PIECES` pieces or copies larger than
    :data:`MAX_SPECIALISED_NODES` nodes in all."""
    p = _BranchPartitioner()
    body = p.visit(func.body)
    return func.with_body(body) if p.changed else func
