"""Floor division and modulo of a linear form by a positive constant.

The rules, for ``c > 0`` and a form ``L = c*Q + R`` (``Q`` collects the terms whose coefficient
``c`` divides, plus ``const // c``):

* ``L // c = Q + R // c`` and ``L % c = R % c`` (exact algebra, always valid);
* if the bounds of ``R`` stay inside one multiple of ``c``, ``R // c`` is that constant;
* if ``R = g*A + B`` with ``g | c`` and ``0 <= B < g``: ``R // c = A // (c/g)`` and
  ``R % c = g*(A % (c/g)) + B`` (this is what turns ``(i*8 + j) // 16`` into ``i // 2``);
* otherwise the gcd of ``R`` and ``c`` is divided out.

These are written against a small protocol (``bound``, ``parse``, ``finish``, ``keys``) so
that they stay independent of the rest of the simplifier.
"""

from __future__ import annotations

from math import gcd

from ..ir.dtype import DataType
from ..tir import expr as E
from .canonical import Linear, LinearRewriter, build, imm
from .const_int_bound import NEG_INF, POS_INF


def _split(lin: Linear, c: int) -> tuple[Linear, Linear]:
    """``lin = c*Q + R`` with every term of ``R`` having a coefficient ``c`` does not divide."""
    q, r = Linear(lin.dtype), Linear(lin.dtype)
    for k, (t, coef) in lin.terms.items():
        if coef % c == 0:
            q.terms[k] = (t, coef // c)
        else:
            r.terms[k] = (t, coef)
    q.const, r.const = divmod(lin.const, c)
    return q, r


def _candidate_gcds(r: Linear, c: int) -> list[int]:
    gs = {gcd(coef, c) for _, coef in r.terms.values()}
    return sorted((g for g in gs if 1 < g < c), reverse=True)


def _gsplit(s: LinearRewriter, r: Linear, g: int) -> tuple[Linear, Linear] | None:
    """``r = g*A + B`` with ``0 <= B < g`` provable, or None."""
    a, b = Linear(r.dtype), Linear(r.dtype)
    for k, (t, coef) in r.terms.items():
        if coef % g == 0:
            a.terms[k] = (t, coef // g)
        else:
            b.terms[k] = (t, coef)
    if not a.terms:
        return None
    b.const = r.const
    lo, hi = s.lin_bound(b)
    if lo >= 0 and hi < g:
        return a, b
    return None


def _content(r: Linear, c: int) -> int:
    g = c
    for _, coef in r.terms.values():
        g = gcd(g, coef)
    return gcd(g, r.const)


def floordiv_const(s: LinearRewriter, lin: Linear, c: int) -> E.PrimExpr:
    """Simplified ``lin // c`` (floor semantics) for a constant ``c > 0``."""
    dt: DataType = lin.dtype
    if c == 1:
        return s.finish(lin)
    q, r = _split(lin, c)
    if not r.terms:
        return s.finish(q)  # r.const // c == 0
    lo, hi = s.lin_bound(r)
    if lo != NEG_INF and hi != POS_INF and lo // c == hi // c:
        q.const += lo // c
        return s.finish(q)
    st = r.single_term()
    if st is not None and st[1] == 1:
        t = st[0]
        if type(t) is E.FloorDiv and type(t.b) is E.IntImm and t.b.value > 0:
            # (x // c1) // c == x // (c1*c)
            inner = floordiv_const(s, s.parse(t.a, dt), t.b.value * c)
            return s.finish(q.iadd(s.parse(inner, dt)))
    for g in _candidate_gcds(r, c):
        split = _gsplit(s, r, g)
        if split is not None:
            inner = floordiv_const(s, split[0], c // g)
            return s.finish(q.iadd(s.parse(inner, dt)))
    g = _content(r, c)
    if g > 1:
        r, c = _divide(r, g), c // g
        if c == 1:
            return s.finish(q.iadd(r))
    term = E.FloorDiv(build(r), imm(dt, c))
    q.add_term(s.keys.key(term), term, 1)
    return s.finish(q)


def _divide(r: Linear, g: int) -> Linear:
    return Linear(r.dtype, {k: (t, coef // g) for k, (t, coef) in r.terms.items()}, r.const // g)


def floormod_const(s: LinearRewriter, lin: Linear, c: int) -> E.PrimExpr:
    """Simplified ``lin % c`` (floor semantics, result in ``[0, c)``) for a constant ``c > 0``."""
    dt: DataType = lin.dtype
    if c == 1:
        return imm(dt, 0)
    r = Linear(dt)
    for k, (t, coef) in lin.terms.items():
        # Terms that are multiples of c vanish. Other coefficients are kept as they are (not
        # reduced mod c) so that x % c stays recognisable next to x // c in a sum.
        if coef % c:
            r.terms[k] = (t, coef)
    r.const = lin.const % c
    if not r.terms:
        return imm(dt, r.const)
    lo, hi = s.lin_bound(r)
    if lo != NEG_INF and hi != POS_INF and lo // c == hi // c:
        r.const -= (lo // c) * c
        return s.finish(r)
    st = r.single_term()
    if st is not None and st[1] == 1:
        t = st[0]
        if (
            type(t) is E.FloorMod
            and type(t.b) is E.IntImm
            and t.b.value > 0
            and t.b.value % c == 0
        ):
            # (x % c1) % c == x % c when c divides c1
            return floormod_const(s, s.parse(t.a, dt), c)
    for g in _candidate_gcds(r, c):
        split = _gsplit(s, r, g)
        if split is not None:
            a, b = split
            inner = floormod_const(s, a, c // g)
            return s.finish(s.parse(inner, dt).scaled(g).iadd(b))
    g = _content(r, c)
    if g > 1:
        inner = floormod_const(s, _divide(r, g), c // g)
        return s.finish(s.parse(inner, dt).scaled(g))
    out = Linear(dt)
    term = E.FloorMod(build(r), imm(dt, c))
    out.add_term(s.keys.key(term), term, 1)
    return s.finish(out)
