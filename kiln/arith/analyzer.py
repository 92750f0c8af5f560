"""The Analyzer: one object holding what is known about variables, and the queries on it.

What is known: variable ranges (``bind(i, Range(0, n))``), variables equal to expressions
(``bind(x, expr)``), and conditions assumed inside a ``constraint_scope`` (a loop body, an if
branch). Queries: ``simplify``, ``const_int_bound``, ``can_prove``, ``can_prove_equal``.

Facts are kept as linear forms ``L <= 0``. A goal ``G <= 0`` follows from a fact ``F <= 0`` when
the bounds of ``G - r*F`` (``r > 0``) are ``<= 0``; this is how symbolic ranges are used:
``i`` bound to ``[0, n)`` gives the fact ``i - n + 1 <= 0``, which proves ``i < n`` and
``i*4 + j < n*4`` for ``j`` in ``[0, 4)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..ir.dtype import DataType
from ..ir.errors import KilnError
from ..tir import expr as E
from .canonical import KeyTable, Linear, is_signed_scalar
from .const_int_bound import (
    NEG_INF,
    POS_INF,
    BoundAnalyzer,
    ConstIntBound,
    b_add,
    b_intersect,
    dtype_bound,
)
from .rewrite_simplify import Simplifier

_INT64 = DataType("int64")
_KEY_TABLE_LIMIT = 100_000


class Analyzer:
    """Integer simplifier and bound analysis in a context of known facts.

    >>> ana = Analyzer()
    >>> ana.bind(i, Range(0, 16))
    >>> ana.can_prove(i < 16)
    True
    """

    def __init__(self) -> None:
        self._keys = KeyTable()
        self._var_bounds: dict[E.Var, ConstIntBound] = {}
        self._var_subst: dict[E.Var, E.PrimExpr] = {}
        self._facts: list[Linear] = []
        self._bind_facts: dict[E.Var, list[Linear]] = {}
        self._atoms: list[tuple[E.PrimExpr, bool]] = []
        self._atom_keys: dict[int, bool] | None = None
        self._bound = BoundAnalyzer(self._var_bound)
        self._simp = Simplifier(self)

    # ---- context ----------------------------------------------------------------------------
    def bind(self, var: E.Var, value: E.Range | E.PrimExpr | int, allow_override: bool = True
             ) -> None:
        """Declare ``var``'s range (a :class:`~kiln.tir.Range`) or its value (an expression).

        Re-binding a variable replaces what was known about it (``allow_override=False`` makes
        that an error instead).
        """
        if not isinstance(var, E.Var):
            raise KilnError(f"Analyzer.bind expects a tir.Var, got {type(var).__name__}")
        if not allow_override and (var in self._var_bounds or var in self._var_subst):
            raise KilnError(f"variable {var.name} is already bound in this Analyzer")
        self._var_subst.pop(var, None)
        self._var_bounds.pop(var, None)
        stale = self._bind_facts.pop(var, None)
        if stale:  # facts from the variable's previous range no longer hold
            drop = {id(f) for f in stale}
            self._facts = [f for f in self._facts if id(f) not in drop]
        self._invalidate()
        if isinstance(value, E.Range):
            self._bind_range(var, value)
        else:
            v = E.convert(value)
            if type(v) is E.IntImm and v.dtype != var.dtype and var.dtype.is_integer:
                v = E.make_const(var.dtype, v.value)
            self._var_subst[var] = self._simp.visit(v)
        self._invalidate()

    def _bind_range(self, var: E.Var, rng: E.Range) -> None:
        lo_e = self._simp.visit(rng.min)
        ext_e = self._simp.visit(rng.extent)
        bmin, bext = self._bound(lo_e), self._bound(ext_e)
        lo = bmin.min_value
        hi = b_add(ConstIntBound(bmin.max_value, bmin.max_value),
                   ConstIntBound(bext.max_value, bext.max_value)).max_value
        if hi != POS_INF:
            hi -= 1
        if isinstance(var, E.SizeVar):
            lo = max(lo, 0)
        self._var_bounds[var] = ConstIntBound(lo, max(hi, lo))
        if not var.dtype.is_int or var.dtype.lanes != 1:
            return
        parse = self._simp.parser.parse
        lo_lin, ext_lin = parse(lo_e, _INT64), parse(ext_e, _INT64)
        v_lin = parse(var, _INT64)
        facts = []
        if not lo_lin.is_const:  # min <= var
            facts.append(lo_lin.plus(v_lin, -1))
        if not (lo_lin.is_const and ext_lin.is_const):  # var <= min + extent - 1
            f = v_lin.plus(lo_lin, -1).iadd(ext_lin, -1)
            f.const += 1
            facts.append(f)
        if facts:
            self._facts.extend(facts)
            self._bind_facts[var] = facts

    @contextmanager
    def constraint_scope(self, cond: E.PrimExpr) -> Iterator[None]:
        """Assume ``cond`` holds inside the ``with`` block (loop bodies, if branches)."""
        undo = self._assume(cond)
        try:
            yield
        finally:
            self._undo(undo)

    def _assume(self, cond: Any) -> tuple[dict, dict, list, list]:
        c = self.simplify(E.convert(cond))
        saved: dict[E.Var, ConstIntBound | None] = {}
        facts: list[Linear] = []
        atoms: list[tuple[E.PrimExpr, bool]] = []
        first = [a for a in _conjuncts(c) if type(a) is not E.IntImm]
        self._add_atoms(first, saved, facts, atoms)
        if saved:
            # Tighter variable bounds may simplify the atoms further (a select whose condition
            # became decidable): assume the new forms too, so that they are recognised later.
            # A new form's facts may tighten the bounds again (``max(x, 0) % 7`` became
            # ``max(x, 0)``, whose fact then gave ``x <= 0`` and the form ``0``): a few rounds.
            keys = {self._keys.key(a) for a in first}
            pending = first
            for _ in range(ASSUME_ROUNDS):
                self._invalidate()
                again = [s for a in pending for s in _conjuncts(self._simp.visit(a))
                         if type(s) is not E.IntImm and self._keys.key(s) not in keys]
                if not again:
                    break
                keys.update(self._keys.key(a) for a in again)
                self._add_atoms(again, saved, facts, atoms)
                pending = again
        self._invalidate()
        tight = {v: self._var_bounds.get(v) for v in saved}
        return saved, tight, facts, atoms

    def _add_atoms(self, conds: list[E.PrimExpr], saved: dict[E.Var, ConstIntBound | None],
                   facts: list[Linear], atoms: list[tuple[E.PrimExpr, bool]]) -> None:
        for atom in conds:
            new_atoms = [(atom, True)]
            if type(atom) is E.Not:
                new_atoms.append((atom.a, False))
            atoms.extend(new_atoms)
            self._atoms.extend(new_atoms)
            for f in self._linear_facts(atom):
                facts.append(f)
                self._facts.append(f)
                self._tighten(f, saved)
        self._atom_keys = None

    def _undo(self, undo: tuple[dict, dict, list, list]) -> None:
        saved, tight, facts, atoms = undo
        for var, old in saved.items():
            if self._var_bounds.get(var) is not tight[var]:
                continue  # re-bound inside the scope: the new binding stands
            if old is None:
                self._var_bounds.pop(var, None)
            else:
                self._var_bounds[var] = old
        drop = {id(f) for f in facts}
        self._facts = [f for f in self._facts if id(f) not in drop]
        drop = {id(a) for a in atoms}
        self._atoms = [a for a in self._atoms if id(a) not in drop]
        self._atom_keys = None
        self._invalidate()

    def _linear_facts(self, atom: E.PrimExpr) -> list[Linear]:
        """``atom`` as facts ``L <= 0`` (integer comparisons only)."""
        t = type(atom)
        if t not in (E.LT, E.LE, E.GT, E.GE, E.EQ) or not is_signed_scalar(atom.a.dtype):
            return []
        parse = self._simp.parser.parse
        d = parse(atom.a, _INT64).iadd(parse(atom.b, _INT64), -1)
        if t is E.LT:
            d.const += 1
            return [d]
        if t is E.LE:
            return [d]
        nd = d.scaled(-1)
        if t is E.GT:
            nd.const += 1
            return [nd]
        if t is E.GE:
            return [nd]
        return [d, nd]

    def _tighten(self, f: Linear, saved: dict[E.Var, ConstIntBound | None]) -> None:
        """Narrow the constant bounds of the variables of a fact ``f <= 0``."""
        for k, (t, c) in f.terms.items():
            if not isinstance(t, E.Var) or t in self._var_subst:
                continue
            rest = f.copy()
            del rest.terms[k]
            lo = self._simp.lin_bound(rest)[0]
            if lo == NEG_INF:
                continue
            cur = self._var_bound(t)
            if c > 0:  # c*t <= -rest  =>  t <= floor(-lo / c)
                new = ConstIntBound(cur.min_value, min(cur.max_value, (-lo) // c))
            else:  # |c|*t >= rest  =>  t >= ceil(lo / |c|)
                new = ConstIntBound(max(cur.min_value, -((-lo) // (-c))), cur.max_value)
            if new != cur:
                if t not in saved:
                    saved[t] = self._var_bounds.get(t)
                self._var_bounds[t] = b_intersect(cur, new)
                self._bound.clear()

    def _invalidate(self) -> None:
        self._simp.clear()
        self._bound.clear()

    def _var_bound(self, v: E.Var) -> ConstIntBound:
        b = self._var_bounds.get(v)
        if b is not None:
            return b
        s = self._var_subst.get(v)
        if s is not None:
            return self._bound(s)
        d = dtype_bound(v.dtype)
        if isinstance(v, E.SizeVar):
            d = ConstIntBound(max(0, d.min_value), d.max_value)
        return d

    def _prove_by_facts(self, goal: Linear) -> bool:
        """``goal <= 0`` follows from one fact ``F <= 0``: ``goal - r*F <= 0`` by bounds."""
        lin_bound = self._simp.lin_bound
        for f in self._facts:
            # scale the fact so that its first term shared with the goal cancels; a fact that
            # shares no term with the goal cannot help beyond the goal's own bounds
            r = 0
            for k, (_, fc) in f.terms.items():
                gc = goal.coef(k)
                if gc:
                    r = gc // fc if gc % fc == 0 else 0
                    break
            if r <= 0:
                continue
            if lin_bound(goal.plus(f, -r))[1] <= 0:
                return True
        return False

    def _atom_truth(self, e: E.PrimExpr) -> bool | None:
        if self._atom_keys is None:
            self._atom_keys = {self._keys.key(a): t for a, t in self._atoms}
        return self._atom_keys.get(self._keys.key(e))

    # ---- queries ----------------------------------------------------------------------------
    def simplify(self, expr: E.PrimExpr | int | float) -> E.PrimExpr:
        """An equivalent, simpler expression (canonical linear form for index arithmetic)."""
        e = E.convert(expr)
        if not isinstance(e, E.PrimExpr):
            raise KilnError(f"Analyzer.simplify expects a PrimExpr, got {type(expr).__name__}")
        if self._keys.size() > _KEY_TABLE_LIMIT:
            self._rekey()
        try:
            return self._simp.visit(e)
        except RecursionError:
            # a pathologically deep tree (thousands of nested operators): simplification is an
            # optimization, so hand the expression back unchanged
            self._invalidate()
            return e

    def _rekey(self) -> None:
        """Empty the key table (it grows with every new expression) and re-key the facts."""
        self._keys.clear()
        self._simp.clear()
        for f in self._facts:  # in place: scopes remember their facts by identity
            terms = list(f.terms.values())
            f.terms = {}
            for t, c in terms:
                f.add_term(self._keys.key(t), t, c)
        self._atom_keys = None

    def const_int_bound(self, expr: E.PrimExpr | int) -> ConstIntBound:
        """Constant bounds of an integer expression (``POS_INF``/``NEG_INF`` when unbounded)."""
        e = E.convert(expr)
        raw = self._bound(e)
        if e.dtype.is_float:
            return raw
        return b_intersect(raw, self._bound(self.simplify(e)))

    def can_prove(self, cond: E.PrimExpr | bool) -> bool:
        """True only when ``cond`` holds for every value of the variables in this context."""
        c = self.simplify(cond)
        v = c.value if type(c) is E.IntImm else None
        if type(c) is E.Broadcast and type(c.value) is E.IntImm:
            v = c.value.value
        return bool(v)

    def can_prove_equal(self, a: E.PrimExpr | int, b: E.PrimExpr | int) -> bool:
        """True only when ``a == b`` for every value of the variables in this context."""
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        if _is_int(a) and _is_int(b):
            r = self.simplify(E.sub(a, b))
            if type(r) is E.Broadcast:
                r = r.value
            return type(r) is E.IntImm and r.value == 0
        sa, sb = self.simplify(E.convert(a)), self.simplify(E.convert(b))
        return self._keys.key(sa) == self._keys.key(sb)


#: Rounds of re-simplifying an assumption under the bounds it implies (``constraint_scope``).
ASSUME_ROUNDS = 4


def _is_int(x: Any) -> bool:
    if isinstance(x, int) and not isinstance(x, bool):
        return True
    return isinstance(x, E.PrimExpr) and x.dtype.is_integer


def _conjuncts(c: E.PrimExpr) -> Iterator[E.PrimExpr]:
    if type(c) is E.And:
        yield from _conjuncts(c.a)
        yield from _conjuncts(c.b)
    else:
        yield c


def simplify(expr: E.PrimExpr | int | float) -> E.PrimExpr:
    """Simplify ``expr`` with no knowledge about its variables (a fresh :class:`Analyzer`)."""
    return Analyzer().simplify(expr)
