"""The expression simplifier: bottom-up rewriting with a canonical linear form for integers.

Each node's children are simplified first; then the node is rewritten by the handler of its
class. Signed integer ``+ - *`` go through :class:`~kiln.arith.canonical.Linear` (collecting
like terms and recombining ``(x // c)*c + x % c``); ``//`` and ``%`` by positive constants use
:mod:`kiln.arith.divmod`; comparisons, min and max are decided by the bounds of the difference
of their operands (and by the facts of the enclosing :class:`~kiln.arith.Analyzer` scopes);
vector expressions push arithmetic into ``Ramp``/``Broadcast`` parts. Floats are only folded
when both operands are immediates (``x + 0.0`` is not ``x`` for ``x = -0.0``).

The simplifier never builds a node whose operands have different dtypes: an operand of the
wrong width (malformed input) is cast to the node's dtype.
"""

from __future__ import annotations

import dataclasses
from math import gcd
from typing import Any, Protocol

from ..ir.dtype import DataType
from ..ir.node import field_names_of
from ..tir import expr as E
from . import divmod as dm
from .canonical import (
    KeyTable,
    Linear,
    LinearParser,
    Unrepresentable,
    build,
    imm,
    is_signed_scalar,
)
from .const_int_bound import NEG_INF, POS_INF, BoundAnalyzer, ConstIntBound, b_add, b_scale
from .expr_utils import (
    ARITH,
    BOOL,
    CMP,
    NEGATE,
    cmp_by_bounds,
    const_int,
    false,
    fits_within,
    identity,
    node,
    same,
    true,
)
from .fold import CMP_OPS, fold_bits, fold_cast, fold_float, fold_int, fold_reinterpret
from .recombine import recombine
from .vector_rules import VectorRules


class AnalyzerState(Protocol):
    """What a :class:`Simplifier` reads of the :class:`~kiln.arith.Analyzer` it works for: the
    atoms' key table, the bound analysis, the variable bindings, and the facts (linear forms
    known ``<= 0`` and boolean atoms) of the enclosing constraint scopes."""

    _keys: KeyTable
    _bound: BoundAnalyzer
    _var_subst: dict[E.Var, E.PrimExpr]
    _facts: list[Linear]
    _atoms: list[tuple[E.PrimExpr, bool]]

    def _prove_by_facts(self, goal: Linear) -> bool: ...

    def _atom_truth(self, e: E.PrimExpr) -> bool | None: ...


class Simplifier(VectorRules):
    """Simplifies PrimExprs in the context (bounds, bindings, facts) of an Analyzer."""

    def __init__(self, ana: AnalyzerState):
        self.ana = ana
        self.keys = ana._keys
        self.parser = LinearParser(self.keys)
        self.bound = ana._bound
        self._memo: dict[int, tuple[E.PrimExpr, E.PrimExpr]] = {}
        h: dict[type, Any] = {c: self._v_binary for c in ARITH + CMP}
        h.update({
            E.IntImm: identity, E.FloatImm: identity, E.StringImm: identity,
            E.Var: self._v_var, E.SizeVar: self._v_var,
            E.And: self._v_logic, E.Or: self._v_logic, E.Not: self._v_not,
            E.Select: self._v_select, E.Cast: self._v_cast,
            E.Ramp: self._v_ramp, E.Broadcast: self._v_broadcast, E.Let: self._v_let,
            E.Call: self._v_call,
        })
        h.update({c: self._v_bits for c in E.BIT_OPS})
        self._handlers = h

    # ---- driver -----------------------------------------------------------------------------
    def clear(self) -> None:
        self._memo.clear()

    def visit(self, e: E.PrimExpr) -> E.PrimExpr:
        m = self._memo.get(id(e))
        if m is not None:
            return m[1]
        h = self._handlers.get(type(e))
        if h is None:
            out = self._generic(e)
        else:
            try:
                out = h(e)
            except Unrepresentable:
                out = self._generic(e)
        if out is not e and type(out) is type(e) and same(out, e):
            # rebuilt into the very same expression: keep the original node (identity is what
            # mutators use to know that nothing changed)
            cached = self.keys.lin_cache.get(id(out))
            if cached is not None:
                self.parser.remember(e, cached[1])
            out = e
        memo = self._memo
        if len(memo) > 50000:
            memo.clear()
        memo[id(e)] = (e, out)
        if out is not e:
            memo[id(out)] = (out, out)
        return out

    def _generic(self, e: Any) -> Any:
        """Simplify every PrimExpr field of a node we have no rule for."""
        t = type(e)
        changes = {}
        for name in field_names_of(t):
            v = getattr(e, name)
            if isinstance(v, E.PrimExpr):
                nv = self.visit(v)
            elif type(v) is tuple and v and all(isinstance(x, E.PrimExpr) for x in v):
                nv = tuple(self.visit(x) for x in v)
                if all(a is b for a, b in zip(nv, v)):
                    nv = v
            else:
                continue
            if nv is not v:
                changes[name] = nv
        return dataclasses.replace(e, **changes) if changes else e

    # ---- helpers used by divmod -------------------------------------------------------------
    def parse(self, e: E.PrimExpr, dt: DataType | None = None) -> Linear:
        return self.parser.parse(e, dt)

    def lin_bound(self, lin: Linear) -> tuple[int, int]:
        b = ConstIntBound(lin.const, lin.const)
        bound = self.bound
        for t, c in lin.terms.values():
            b = b_add(b, b_scale(bound(t), c))
            if b.min_value == NEG_INF and b.max_value == POS_INF:
                break
        return b.min_value, b.max_value

    def finish(self, lin: Linear) -> E.PrimExpr:
        """Recombine div/mod pairs and build the expression of a linear form."""
        lin = recombine(self, lin)
        out = build(lin)
        if len(lin.terms) > 1:
            self.parser.remember(out, lin)
        return out

    def le0(self, lin: Linear, hi: int | None = None) -> bool:
        """Provably ``lin <= 0`` (by bounds, then by the analyzer's facts)."""
        if hi is None:
            hi = self.lin_bound(lin)[1]
        if hi <= 0:
            return True
        return self.ana._prove_by_facts(lin)

    def cast_to(self, dt: DataType, v: E.PrimExpr) -> E.PrimExpr:
        return v if v.dtype == dt else self.cast(dt, v, None)

    # ---- leaves -----------------------------------------------------------------------------
    def _v_var(self, e: E.Var) -> E.PrimExpr:
        s = self.ana._var_subst.get(e)
        if s is not None:
            return s
        if e.dtype.is_bool and self.ana._atoms:
            truth = self.ana._atom_truth(e)
            if truth is not None:
                return imm(BOOL, int(truth))
        return e

    def _v_let(self, e: E.Let) -> E.PrimExpr:
        value = self.visit(e.value)
        self.bound.let_bounds[e.var] = self.bound(value)
        try:
            body = self.visit(e.body)
        finally:
            self.bound.let_bounds.pop(e.var, None)
        if value is e.value and body is e.body:
            return e
        return E.Let(e.var, value, body)

    # ---- binary operators -------------------------------------------------------------------
    def _v_binary(self, e: Any) -> E.PrimExpr:
        a, b = self.visit(e.a), self.visit(e.b)
        return self.binop(type(e), a, b, e)

    def binop(self, cls: type, a: E.PrimExpr, b: E.PrimExpr, orig: Any = None) -> E.PrimExpr:
        """Simplified ``cls(a, b)`` for simplified operands ``a`` and ``b``."""
        if cls in CMP:
            return self._compare(cls, a, b, orig)
        dt = orig.dtype if orig is not None else a.dtype
        if a.dtype != dt:
            a = self.cast_to(dt, a)
        if b.dtype != dt:
            b = self.cast_to(dt, b)
        if dt.lanes > 1:
            return self._vector(cls, dt, a, b, orig)
        ta, tb = type(a), type(b)
        if dt.is_float:
            return self._float_binop(cls, dt, a, b, orig)
        if ta is E.IntImm and tb is E.IntImm:
            r = fold_int(cls, dt, a.value, b.value)
            if r is not None:
                return imm(dt, r)
            return node(cls, a, b, orig)
        if dt.is_int:
            if cls is E.Add or cls is E.Sub or cls is E.Mul:
                return self._linear_arith(cls, dt, a, b)
            if cls is E.FloorDiv or cls is E.Div:
                return self._div(cls, dt, a, b, orig)
            if cls is E.FloorMod or cls is E.Mod:
                return self._mod(cls, dt, a, b, orig)
            return self._minmax(cls, dt, a, b, orig)
        return self._plain_int(cls, dt, a, b, orig)

    def _linear_arith(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr) -> E.PrimExpr:
        la, lb = self.parse(a, dt), self.parse(b, dt)
        if cls is E.Add:
            lin = la.iadd(lb)
        elif cls is E.Sub:
            lin = la.iadd(lb, -1)
        elif lb.is_const:
            lin = la.scaled(lb.const)
        elif la.is_const:
            lin = lb.scaled(la.const)
        else:
            sa, sb = la.single_term(), lb.single_term()
            ka, fa = (sa[1], sa[0]) if sa is not None else (1, a)
            kb, fb = (sb[1], sb[0]) if sb is not None else (1, b)
            term = E.Mul(self.cast_to(dt, fa), self.cast_to(dt, fb))
            lin = Linear(dt)
            lin.add_term(self.keys.key(term), term, ka * kb)
        return self.finish(lin)

    def _div(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr, orig: Any) -> E.PrimExpr:
        if type(b) is E.IntImm:
            c = b.value
            if c == 1:
                return a
            if c > 0 and (cls is E.FloorDiv or self.bound(a).min_value >= 0):
                return dm.floordiv_const(self, self.parse(a, dt), c)
        elif type(a) is E.IntImm and a.value == 0:
            return a
        elif self._nonneg_below(a, b):
            return imm(dt, 0)
        return node(cls, a, b, orig)

    def _mod(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr, orig: Any) -> E.PrimExpr:
        if type(b) is E.IntImm:
            c = b.value
            if c in (1, -1):
                return imm(dt, 0)
            if c > 0 and (cls is E.FloorMod or self.bound(a).min_value >= 0):
                return dm.floormod_const(self, self.parse(a, dt), c)
        elif type(a) is E.IntImm and a.value == 0:
            return a
        elif self._nonneg_below(a, b):
            return a
        return node(cls, a, b, orig)

    def _nonneg_below(self, a: E.PrimExpr, b: E.PrimExpr) -> bool:
        """``0 <= a < b`` provable (so ``a // b == 0`` and ``a % b == a``)."""
        if self.bound(a).min_value < 0:
            return False
        d = self.parse(a).iadd(self.parse(b), -1)
        d.const += 1
        return self.le0(d)

    def _minmax(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr,
                orig: Any) -> E.PrimExpr:
        if type(a) is E.IntImm and type(b) is not E.IntImm:
            a, b, orig = b, a, None  # constants to the right
        if same(a, b):
            return a
        la, lb = self.parse(a, dt), self.parse(b, dt)
        d = la.plus(lb, -1)
        lo, hi = self.lin_bound(d)
        a_le_b = hi <= 0 or (lo <= 0 and self.le0(d, hi))
        if a_le_b:
            return a if cls is E.Min else b
        if lo >= 0 or self.le0(d.scaled(-1), -lo):
            return b if cls is E.Min else a
        common = Linear(dt)
        for k, (t, c) in la.terms.items():
            if lb.coef(k) == c:
                common.terms[k] = (t, c)
        if common.terms:
            ra = build(la.plus(common, -1))
            rb = build(lb.plus(common, -1))
            inner = self._minmax(cls, dt, ra, rb, None)
            return self.finish(common.iadd(self.parse(inner, dt)))
        if type(b) is E.IntImm and type(a) is cls and type(a.b) is E.IntImm:
            # min(min(x, c1), c2) -> min(x, min(c1, c2))
            v = min(a.b.value, b.value) if cls is E.Min else max(a.b.value, b.value)
            return cls(a.a, imm(dt, v))
        return node(cls, a, b, orig)

    def _plain_int(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr,
                   orig: Any) -> E.PrimExpr:
        """Unsigned / bool arithmetic: identities and bound-decided min/max only."""
        ca, cb = const_int(a), const_int(b)
        if cls is E.Add:
            if ca == 0:
                return b
            if cb == 0:
                return a
        elif cls is E.Sub and (cb == 0 or same(a, b)):
            return a if cb == 0 else imm(dt, 0)
        elif cls is E.Mul:
            if ca == 1:
                return b
            if cb == 1:
                return a
            if ca == 0 or cb == 0:
                return imm(dt, 0)
        elif cls in (E.FloorDiv, E.Div) and cb == 1:
            return a
        elif cls in (E.FloorMod, E.Mod) and cb == 1:
            return imm(dt, 0)
        elif cls is E.Min or cls is E.Max:
            ba, bb = self.bound(a), self.bound(b)
            if ba.max_value <= bb.min_value:
                return a if cls is E.Min else b
            if bb.max_value <= ba.min_value:
                return b if cls is E.Min else a
        return node(cls, a, b, orig)

    def _float_binop(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr,
                     orig: Any) -> E.PrimExpr:
        ta, tb = type(a), type(b)
        if ta is E.FloatImm and tb is E.FloatImm:
            r = fold_float(cls, dt, a.value, b.value)
            if r is not None:
                return E.FloatImm(dt, r)
        elif tb is E.FloatImm and b.value == 1.0 and (cls is E.Mul or cls is E.Div):
            return a  # exact for every x, including -0.0, inf and nan
        elif ta is E.FloatImm and a.value == 1.0 and cls is E.Mul:
            return b
        return node(cls, a, b, orig)

    # ---- comparisons ------------------------------------------------------------------------
    def _compare(self, cls: type, a: E.PrimExpr, b: E.PrimExpr, orig: Any) -> E.PrimExpr:
        if a.dtype != b.dtype:
            a, b = self._unify(a, b)
            orig = None
        lanes = a.dtype.lanes
        ta, tb = type(a), type(b)
        if (ta is E.IntImm and tb is E.IntImm) or (ta is E.FloatImm and tb is E.FloatImm):
            return imm(BOOL, int(CMP_OPS[cls](a.value, b.value)))
        if lanes > 1:
            return self._vector_compare(cls, a, b, orig)
        dt = a.dtype
        if dt.is_int:
            la, lb = self.parse(a, dt), self.parse(b, dt)
            d = la.plus(lb, -1)
            truth = self._cmp_truth(cls, d)
            if truth is not None:
                return imm(BOOL, int(truth))
            shared = any(k in lb.terms for k in la.terms) or (la.const and lb.const)
            if shared:
                out = self._cmp_from_diff(cls, d)
            else:
                out = node(cls, a, b, orig)
        elif dt.is_integer or dt.is_bool:
            ba, bb = self.bound(a), self.bound(b)
            truth = cmp_by_bounds(cls, ba, bb)
            if truth is not None:
                return imm(BOOL, int(truth))
            out = node(cls, a, b, orig)
        else:
            if cls in (E.EQ, E.NE) and a is b and not dt.is_float:
                return imm(BOOL, int(cls is E.EQ))
            out = node(cls, a, b, orig)
        if self.ana._atoms:
            t = self.ana._atom_truth(out)
            if t is not None:
                return imm(BOOL, int(t))
        return out

    def _unify(self, a: E.PrimExpr, b: E.PrimExpr) -> tuple[E.PrimExpr, E.PrimExpr]:
        """Bring mismatched comparison operands to the wider type."""
        da, db = a.dtype, b.dtype
        if da.lanes != db.lanes:
            if da.lanes == 1:
                a = E.Broadcast(a, db.lanes)
            else:
                b = E.Broadcast(b, da.lanes)
            da, db = a.dtype, b.dtype
        if da == db:
            return a, b
        if db.is_float and not da.is_float or (db.bits > da.bits and da.is_float == db.is_float):
            return self.cast_to(db, a), b
        return a, self.cast_to(da, b)

    def _cmp_truth(self, cls: type, d: Linear) -> bool | None:
        """Decide ``cls(d, 0)`` for a difference form, or None."""
        lo, hi = self.lin_bound(d)
        if cls is E.EQ or cls is E.NE:
            if lo == hi == 0:
                return cls is E.EQ
            if lo > 0 or hi < 0:
                return cls is E.NE
            g = 0
            for _, c in d.terms.values():
                g = gcd(g, c)
            if g > 1 and d.const % g:
                return cls is E.NE
            if self.ana._facts and (self._le0_shift(d, 1, lo, hi)
                                    or self._le0_shift(d.scaled(-1), 1, -hi, -lo)):
                return cls is E.NE
            if self.ana._facts and self.le0(d, hi) and self.le0(d.scaled(-1), -lo):
                return cls is E.EQ
            return None
        if cls is E.GT or cls is E.GE:
            d, lo, hi = d.scaled(-1), -hi, -lo
            cls = E.LT if cls is E.GT else E.LE
        # now d < 0 (LT) or d <= 0 (LE)
        strict = 1 if cls is E.LT else 0
        if hi + strict <= 0:
            return True
        if lo + strict > 0:  # d >= 0 (LT false) / d >= 1 (LE false)
            return False
        if self.ana._facts:
            if self._le0_shift(d, strict, lo, hi):
                return True
            if self._le0_shift(d.scaled(-1), 1 - strict, -hi, -lo):
                return False
            if self._floordiv_le0(d, strict):
                return True
        return None

    def _floordiv_le0(self, d: Linear, k: int) -> bool:
        """Provably ``d + k <= 0`` where ``d`` is ``x // c + rest`` (``c > 0`` constant): the
        same as ``x + c*(rest + k) - c + 1 <= 0``, free of the division. A loop fused over a
        symbolic batch, ``for i in range(batch * 28)``, guards its batch index with
        ``i // 28 < batch``, which the facts prove only in that form."""
        for key, (t, coef) in d.terms.items():
            if coef != 1 or type(t) is not E.FloorDiv or type(t.b) is not E.IntImm:
                continue
            c = t.b.value
            if c <= 0:
                continue
            rest = d.copy()
            del rest.terms[key]
            rest.const += k
            free = self.parse(t.a, d.dtype).plus(rest, c)
            free.const += 1 - c
            lo, hi = self.lin_bound(free)
            return self._le0_shift(free, 0, lo, hi)
        return False

    def _le0_shift(self, d: Linear, k: int, lo: int, hi: int) -> bool:
        """Provably ``d + k <= 0``."""
        if hi != POS_INF and hi + k <= 0:
            return True
        s = d.copy()
        s.const += k
        return self.ana._prove_by_facts(s)

    def _cmp_from_diff(self, cls: type, d: Linear) -> E.PrimExpr:
        """``cls(d, 0)`` rebuilt as ``positive part <cls> negative part``."""
        lhs, rhs = Linear(d.dtype), Linear(d.dtype)
        for k, (t, c) in d.terms.items():
            if c > 0:
                lhs.terms[k] = (t, c)
            else:
                rhs.terms[k] = (t, -c)
        if d.const > 0:
            lhs.const = d.const
        else:
            rhs.const = -d.const
        return cls(build(lhs), build(rhs))

    # ---- logic ------------------------------------------------------------------------------
    def _v_logic(self, e: Any) -> E.PrimExpr:
        a, b = self.visit(e.a), self.visit(e.b)
        return self.logic(type(e), a, b, e)

    def logic(self, cls: type, a: E.PrimExpr, b: E.PrimExpr, orig: Any = None) -> E.PrimExpr:
        lanes = a.dtype.lanes
        ca, cb = const_int(a), const_int(b)
        is_and = cls is E.And
        for c, other in ((ca, b), (cb, a)):
            if c is not None:
                if bool(c) == is_and:
                    return other  # True && x, False || x
                return true(lanes) if not is_and else false(lanes)
        if type(a) is E.Broadcast and type(b) is E.Broadcast:
            return E.Broadcast(self.logic(cls, a.value, b.value), lanes)
        if same(a, b):
            return a
        ta, tb = type(a), type(b)
        if (ta is E.Not and same(a.a, b)) or (tb is E.Not and same(b.a, a)) or (
            NEGATE.get(ta) is tb and same(a.a, b.a) and same(a.b, b.b)
            and (ta in (E.EQ, E.NE) or not a.a.dtype.is_float)
        ):
            return false(lanes) if is_and else true(lanes)  # x && !x, x || !x
        return node(cls, a, b, orig)

    def _v_not(self, e: E.Not) -> E.PrimExpr:
        a = self.visit(e.a)
        return self.logical_not(a, e)

    def logical_not(self, a: E.PrimExpr, orig: Any = None) -> E.PrimExpr:
        ta = type(a)
        c = const_int(a)
        if c is not None:
            return false(a.dtype.lanes) if c else true(a.dtype.lanes)
        if ta is E.Not:
            return a.a
        if ta is E.Broadcast:
            return E.Broadcast(self.logical_not(a.value), a.lanes)
        if ta in NEGATE and (not a.a.dtype.is_float or ta in (E.EQ, E.NE)):
            return NEGATE[ta](a.a, a.b)
        out = orig if orig is not None and orig.a is a else E.Not(a)
        if self.ana._atoms:
            t = self.ana._atom_truth(out)
            if t is not None:
                return imm(BOOL, int(t))
        return out

    # ---- bit operations ---------------------------------------------------------------------
    def _v_bits(self, e: Any) -> E.PrimExpr:
        a, b = self.visit(e.a), self.visit(e.b)
        return self.bits(type(e), a, b, e)

    def bits(self, cls: type, a: E.PrimExpr, b: E.PrimExpr, orig: Any = None) -> E.PrimExpr:
        """Simplified bit operation: immediates fold, identities (``x & 0``, ``x | 0``,
        ``x ^ 0``, ``x & -1``, shifts by 0) drop, broadcasts combine lane-free."""
        dt = orig.dtype if orig is not None else a.dtype
        if dt.lanes > 1 and type(a) is E.Broadcast and type(b) is E.Broadcast:
            return E.Broadcast(self.bits(cls, a.value, b.value), dt.lanes)
        ca, cb = const_int(a), const_int(b)
        if dt.lanes == 1 and ca is not None and cb is not None:
            return imm(dt, fold_bits(cls, dt, ca, cb))
        ones = 1 if dt.is_bool else dt.element.max_value() if dt.is_uint else -1
        if cb == 0 and cls is not E.BitwiseAnd:
            return a  # x | 0, x ^ 0, x << 0, x >> 0
        if cls in (E.BitwiseAnd, E.BitwiseOr, E.BitwiseXor):
            if ca == 0 and cls is not E.BitwiseAnd:
                return b
            if (cb == 0 or ca == 0) and cls is E.BitwiseAnd:
                return a if ca == 0 else b
            if cb == ones and cls is E.BitwiseAnd:
                return a
            if ca == ones and cls is E.BitwiseAnd:
                return b
        elif ca == 0:
            return a  # 0 << n, 0 >> n
        return node(cls, a, b, orig)

    def _v_call(self, e: E.Call) -> E.PrimExpr:
        out = self._generic(e)
        if out.op == "rounded" and not isinstance(out.args[0], E.Mul):
            return out.args[0]  # only a product can be contracted (see tir.rounded)
        if out.op == "reinterpret":
            (v,) = out.args
            if out.dtype.lanes > 1 and type(v) is E.Broadcast:
                return E.Broadcast(self._v_call(E.Call(out.dtype.element, out.op, (v.value,))),
                                   out.dtype.lanes)
            folded = fold_reinterpret(out.dtype, v)
            if folded is not None:
                return folded
        return out

    # ---- select / cast ----------------------------------------------------------------------
    def _v_select(self, e: E.Select) -> E.PrimExpr:
        cond = self.visit(e.condition)
        c = const_int(cond)
        if c is not None:
            return self.visit(e.true_value if c else e.false_value)
        t, f = self.visit(e.true_value), self.visit(e.false_value)
        if self.keys.key(t) == self.keys.key(f):
            return t
        if cond is e.condition and t is e.true_value and f is e.false_value:
            return e
        return E.Select(cond, t, f)

    def _v_cast(self, e: E.Cast) -> E.PrimExpr:
        return self.cast(e.dtype, self.visit(e.value), e)

    def cast(self, dt: DataType, v: E.PrimExpr, orig: Any = None) -> E.PrimExpr:
        """Simplified ``Cast(dt, v)`` for a simplified ``v``."""
        vd = v.dtype
        if vd == dt:
            return v
        tv = type(v)
        if dt.lanes > 1:
            if tv is E.Broadcast:
                return E.Broadcast(self.cast(dt.element, v.value), dt.lanes)
            if tv is E.Ramp and dt.is_int and vd.is_int and dt.bits >= vd.bits:
                return self.ramp(self.cast(dt.element, v.base), self.cast(dt.element, v.stride),
                                 v.lanes)
            return orig if orig is not None and orig.value is v else E.Cast(dt, v)
        folded = fold_cast(dt, v)
        if folded is not None:
            return folded
        if tv is E.Cast and dt.is_integer and vd.is_integer and v.value.dtype.is_integer:
            inner = v.value
            if fits_within(inner.dtype, vd):
                return self.cast(dt, inner)  # the middle cast lost nothing
        if is_signed_scalar(dt) and is_signed_scalar(vd) and vd.bits < dt.bits and tv in (
            E.Add, E.Sub, E.Mul
        ):
            return self.finish(self.parse(v, dt))  # widen at the leaves
        return orig if orig is not None and orig.value is v else E.Cast(dt, v)


__all__ = ["Simplifier"]
