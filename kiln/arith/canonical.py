"""Canonical linear form of integer index expressions.

An integer expression is viewed as ``sum(coef_i * term_i) + const`` where each term is a
non-linear sub-expression (a variable, a floordiv, a product of two non-constants, a load...).
Terms are identified by an interned structural key (variables by identity), so like terms
collect: ``(i*8 + j) - i*8`` becomes ``{j: 1}`` and ``x*2 + x*3`` becomes ``{x: 5}``.

Widening casts between signed integer types are transparent (``cast(int64, i*8 + j)`` has terms
``i`` and ``j``): index arithmetic is assumed not to overflow, so the widened value is the same
number. When the form is turned back into an expression, terms narrower than the form's dtype
are wrapped in a ``Cast``, so the result never mixes operand dtypes.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..ir.dtype import DataType
from ..ir.node import Node, field_names_of
from ..tir import expr as E
from .const_int_bound import dtype_bound
from .fold import fits


class Unrepresentable(Exception):
    """A folded constant does not fit its dtype; the caller keeps the unfolded expression."""


_IMM_CACHE: dict[tuple[DataType, int], E.IntImm] = {}


def imm(dt: DataType, v: int) -> E.IntImm:
    """An IntImm of scalar type ``dt`` (shared instances; IR is immutable)."""
    k = (dt, v)
    r = _IMM_CACHE.get(k)
    if r is None:
        lo, hi = dtype_bound(dt)
        if not dt.is_bool and not (lo <= v <= hi) and not (dt.is_integer and dt.bits == 64
                                                          and fits(dt, v)):
            raise Unrepresentable(f"{v} does not fit {dt}")
        r = E.IntImm(dt, v)
        if len(_IMM_CACHE) > 65536:
            _IMM_CACHE.clear()
        _IMM_CACHE[k] = r
    return r


def is_signed_scalar(dt: DataType) -> bool:
    return dt.lanes == 1 and dt.is_int


class KeyTable:
    """Interns expressions by structure: equal keys <=> same expression (vars by identity).

    Keys are small ints, so like-term lookup is O(1) once a node has been keyed. Nodes are kept
    alive by the memo so that ``id()`` values cannot be reused while they are cached.
    """

    def __init__(self) -> None:
        self._intern: dict[tuple[Any, ...], int] = {}
        self._memo: dict[int, tuple[Any, int]] = {}
        # linear forms of expressions built from them (saves re-parsing long sums)
        self.lin_cache: dict[int, tuple[Any, Linear]] = {}

    def size(self) -> int:
        return len(self._memo)

    def clear(self) -> None:
        self._intern.clear()
        self._memo.clear()
        self.lin_cache.clear()

    def key(self, e: Any) -> int:
        m = self._memo.get(id(e))
        if m is not None:
            return m[1]
        parts = self._parts(e)
        k = self._intern.get(parts)
        if k is None:
            k = self._intern[parts] = len(self._intern)
        self._memo[id(e)] = (e, k)
        return k

    def lookup(self, parts: tuple[Any, ...]) -> int | None:
        """The key of an expression with these parts, if one was ever interned."""
        return self._intern.get(parts)

    def parts_of(self, cls: type, *fields: Any) -> tuple[Any, ...]:
        """Key parts for a node of ``cls`` whose fields are ``fields`` (in declaration order)."""
        return (cls,) + tuple(self._part(v) for v in fields)

    def _parts(self, e: Any) -> tuple[Any, ...]:
        t = type(e)
        if isinstance(e, E.Var) or getattr(e, "_is_var", False):
            return ("var", id(e))
        if t is E.IntImm:
            return ("int", e.dtype, e.value)
        if t is E.FloatImm:
            # repr distinguishes -0.0 from 0.0; NaN never equals itself (never merged)
            return ("float", e.dtype, repr(e.value))
        return (t,) + tuple(self._part(getattr(e, f)) for f in field_names_of(t))

    def _part(self, v: Any) -> Any:
        if isinstance(v, Node):
            return self.key(v)
        if isinstance(v, (tuple, list)):
            return tuple(self._part(x) for x in v)
        return v


class Linear:
    """``sum(coef * term) + const`` over terms keyed by :class:`KeyTable` keys."""

    __slots__ = ("dtype", "terms", "const")

    def __init__(self, dtype: DataType, terms: dict[int, tuple[E.PrimExpr, int]] | None = None,
                 const: int = 0):
        self.dtype = dtype
        self.terms: dict[int, tuple[E.PrimExpr, int]] = {} if terms is None else terms
        self.const = const

    def copy(self) -> Linear:
        return Linear(self.dtype, dict(self.terms), self.const)

    @property
    def is_const(self) -> bool:
        return not self.terms

    def add_term(self, k: int, t: E.PrimExpr, c: int) -> None:
        cur = self.terms.get(k)
        if cur is None:
            if c:
                self.terms[k] = (t, c)
            return
        nc = cur[1] + c
        if nc:
            self.terms[k] = (cur[0], nc)
        else:
            del self.terms[k]

    def iadd(self, other: Linear, scale: int = 1) -> Linear:
        """In place ``self += scale * other``; returns self."""
        if scale:
            for k, (t, c) in other.terms.items():
                self.add_term(k, t, c * scale)
            self.const += other.const * scale
        return self

    def plus(self, other: Linear, scale: int = 1) -> Linear:
        return self.copy().iadd(other, scale)

    def scaled(self, s: int) -> Linear:
        if s == 0:
            return Linear(self.dtype)
        return Linear(
            self.dtype, {k: (t, c * s) for k, (t, c) in self.terms.items()}, self.const * s
        )

    def coef(self, k: int) -> int:
        cur = self.terms.get(k)
        return 0 if cur is None else cur[1]

    def single_term(self) -> tuple[E.PrimExpr, int] | None:
        """``(term, coef)`` when the form is exactly ``coef * term``."""
        if self.const == 0 and len(self.terms) == 1:
            return next(iter(self.terms.values()))
        return None


class LinearParser:
    """Turns (already simplified) signed-integer expressions into :class:`Linear` forms."""

    def __init__(self, keys: KeyTable):
        self.keys = keys

    def parse(self, e: E.PrimExpr, dt: DataType | None = None) -> Linear:
        lin = Linear(e.dtype if dt is None else dt)
        self._acc(lin, e, 1)
        return lin

    def remember(self, e: E.PrimExpr, lin: Linear) -> None:
        """Record that ``e`` was built from ``lin`` (which must not be mutated afterwards)."""
        cache = self.keys.lin_cache
        if len(cache) > 50000:
            cache.clear()
        cache[id(e)] = (e, lin)

    def _acc(self, lin: Linear, e: E.PrimExpr, coef: int) -> None:
        t = type(e)
        if t is E.IntImm:
            lin.const += coef * e.value
            return
        if t is E.Add or t is E.Sub or t is E.Mul:
            cached = self.keys.lin_cache.get(id(e))
            if cached is not None:
                lin.iadd(cached[1], coef)
                return
        if t is E.Add:
            self._acc(lin, e.a, coef)
            self._acc(lin, e.b, coef)
        elif t is E.Sub:
            self._acc(lin, e.a, coef)
            self._acc(lin, e.b, -coef)
        elif t is E.Mul and type(e.b) is E.IntImm:
            self._acc(lin, e.a, coef * e.b.value)
        elif t is E.Mul and type(e.a) is E.IntImm:
            self._acc(lin, e.b, coef * e.a.value)
        elif (
            t is E.Cast
            and e.dtype.lanes == 1
            and e.dtype.is_int
            and e.value.dtype.is_int
            and e.value.dtype.lanes == 1
            and e.value.dtype.bits <= e.dtype.bits
        ):
            self._acc(lin, e.value, coef)
        elif coef:
            lin.add_term(self.keys.key(e), e, coef)


def _as_dtype_of(dt: DataType, t: E.PrimExpr) -> E.PrimExpr:
    if t.dtype == dt:
        return t
    if type(t) is E.IntImm:
        return imm(dt, t.value)
    return E.Cast(dt, t)


def _scaled_term(dt: DataType, t: E.PrimExpr, c: int) -> E.PrimExpr:
    t = _as_dtype_of(dt, t)
    return t if c == 1 else E.Mul(t, imm(dt, c))


def build(lin: Linear) -> E.PrimExpr:
    """The expression of a linear form: positive terms first (in order), then the negative
    ones subtracted, then the constant. Raises :class:`Unrepresentable` on constant overflow."""
    dt = lin.dtype
    items = list(lin.terms.values())
    if not items:
        return imm(dt, lin.const)
    out: E.PrimExpr | None = None
    for t, c in items:
        if c > 0:
            term = _scaled_term(dt, t, c)
            out = term if out is None else E.Add(out, term)
    const = lin.const
    for t, c in items:
        if c < 0:
            if out is None:
                if const > 0:
                    out = imm(dt, const)
                    const = 0
                else:
                    out = E.Mul(_as_dtype_of(dt, t), imm(dt, c))
                    continue
            out = E.Sub(out, _scaled_term(dt, t, -c))
    assert out is not None
    if const > 0:
        out = E.Add(out, imm(dt, const))
    elif const < 0:
        out = E.Sub(out, imm(dt, -const))
    return out


class LinearRewriter(Protocol):
    """What the rules written over linear forms (:mod:`.divmod`, :mod:`.recombine`) use of the
    simplifier that calls them (:class:`~kiln.arith.rewrite_simplify.Simplifier`)."""

    keys: KeyTable

    def parse(self, e: E.PrimExpr, dt: DataType | None = None) -> Linear:
        """``e`` as a linear form (its atoms keyed in :attr:`keys`)."""

    def finish(self, lin: Linear) -> E.PrimExpr:
        """The simplified expression of a linear form."""

    def lin_bound(self, lin: Linear) -> tuple[int, int]:
        """The constant bounds of a linear form."""
