"""Recombination of floordiv/floormod terms inside a linear sum.

After splitting loops (``i -> io*8 + ii``) and fusing them (``f = a*12 + b``), index
expressions contain quotients and remainders of the same dividend. In one sum these recombine:

* ``c*m*(x // m) + c*(x % m) -> c*x``;
* ``c*x - c*m*(x // m) -> c*(x % m)``;
* ``c*(m1/m2)*(x // m1) + c*((x % m1) // m2) -> c*(x // m2)`` when ``m2`` divides ``m1``.

The remainder/quotient is matched in its *simplified* form, so ``(x % 12) % 4`` written as
``x % 4`` still pairs with ``(x % 12) // 4``.
"""

from __future__ import annotations

from typing import Any

from ..tir import expr as E
from . import divmod as dm
from .canonical import Linear, LinearRewriter


def recombine(s: LinearRewriter, lin: Linear) -> Linear:
    """Merge ``x // m`` terms with the matching remainder or dividend in the same sum:
    ``c*m*(x // m) + c*(x % m) -> c*x`` and ``c*x - c*m*(x // m) -> c*(x % m)``."""
    for _ in range(8):
        hit = None
        for t, c in lin.terms.values():
            if type(t) is not E.FloorDiv or type(t.b) is not E.IntImm or t.b.value <= 0 \
                    or len(lin.terms) < 2:
                continue
            if c % t.b.value == 0:
                hit = _with_divisor(s, lin, t, c)
            if hit is None and type(t.a) is E.FloorMod:
                hit = _digits(s, lin, t, c)
            if hit is not None:
                break
        if hit is None:
            return lin
        lin = hit
    return lin


def _with_divisor(s: LinearRewriter, lin: Linear, t: Any, c: int) -> Linear | None:
    m = t.b.value
    dt = lin.dtype
    k = s.keys.key(t)
    q = c // m
    x = s.parse(t.a, dt)
    mod = s.parse(dm.floormod_const(s, x.copy(), m), dt)
    # the remainder x % m (in its simplified form) is present with coefficient q
    if mod.terms and all(lin.coef(mk) == q * mc for mk, (_, mc) in mod.terms.items()):
        out = _replaced(lin, (k,) + tuple(mod.terms), x, q)
        out.const -= q * mod.const
        return out
    # the dividend x is present with coefficient -q
    if x.terms and all(lin.coef(xk) == -q * xc for xk, (_, xc) in x.terms.items()):
        out = _replaced(lin, tuple(x.terms) + (k,), mod, -q)
        out.const += q * x.const
        return out
    return None


def _digits(s: LinearRewriter, lin: Linear, t: Any, c: int) -> Linear | None:
    """``c*(m1/m2)*(x // m1) + c*((x % m1) // m2) -> c*(x // m2)`` when ``m2 | m1``."""
    inner, m2 = t.a, t.b.value
    if type(inner.b) is not E.IntImm or inner.b.value <= 0 or inner.b.value % m2:
        return None
    m1 = inner.b.value
    dt = lin.dtype
    x = s.parse(inner.a, dt)
    hi = s.parse(dm.floordiv_const(s, x.copy(), m1), dt)
    f = c * (m1 // m2)
    if not hi.terms or any(lin.coef(hk) != f * hc for hk, (_, hc) in hi.terms.items()):
        return None
    out = _replaced(lin, (s.keys.key(t),) + tuple(hi.terms),
                    s.parse(dm.floordiv_const(s, x, m2), dt), c)
    out.const -= f * hi.const
    return out


def _replaced(lin: Linear, remove: tuple[int, ...], add: Linear, scale: int) -> Linear:
    """``lin`` without the terms ``remove`` plus ``scale * add``, keeping term order (the new
    terms take the place of the first removed one)."""
    out = Linear(lin.dtype, const=lin.const + scale * add.const)
    inserted = False
    gone = set(remove)
    for k, (t, c) in lin.terms.items():
        if k in gone:
            if not inserted:
                inserted = True
                for ak, (at, ac) in add.terms.items():
                    out.add_term(ak, at, ac * scale)
            continue
        out.add_term(k, t, c)
    if not inserted:
        for ak, (at, ac) in add.terms.items():
            out.add_term(ak, at, ac * scale)
    return out
