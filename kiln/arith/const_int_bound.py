"""Constant integer bounds: the interval ``[min_value, max_value]`` an integer expression lies in.

Bounds are Python ints with two sentinels, :data:`POS_INF` and :data:`NEG_INF`, meaning
"unbounded" on that side; every interval operation saturates to them, so int64 arithmetic that
could exceed the 64-bit range never produces a bogus finite bound. The analysis assumes integer
arithmetic does not overflow (kiln index arithmetic never relies on wraparound).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..ir.dtype import DataType
from ..tir import expr as E

POS_INF: int = 2**63 - 1
NEG_INF: int = -POS_INF


class ConstIntBound(NamedTuple):
    """``min_value <= x <= max_value`` for every value ``x`` can take (sentinels = unbounded)."""

    min_value: int
    max_value: int

    @property
    def is_const(self) -> bool:
        return self.min_value == self.max_value

    @property
    def is_bounded(self) -> bool:
        return self.min_value != NEG_INF and self.max_value != POS_INF


EVERYTHING = ConstIntBound(NEG_INF, POS_INF)
BOOL_BOUND = ConstIntBound(0, 1)


def clamp(v: int) -> int:
    """Saturate a Python int to the sentinel range."""
    if v >= POS_INF:
        return POS_INF
    if v <= NEG_INF:
        return NEG_INF
    return v


_DTYPE_BOUNDS: dict[DataType, ConstIntBound] = {}


def dtype_bound(dt: DataType) -> ConstIntBound:
    """The values a scalar of ``dt`` can hold (floats and handles: everything)."""
    r = _DTYPE_BOUNDS.get(dt)
    if r is None:
        r = _DTYPE_BOUNDS[dt] = _dtype_bound(dt)
    return r


def _dtype_bound(dt: DataType) -> ConstIntBound:
    if dt.is_bool:
        return BOOL_BOUND
    if dt.is_integer:
        return ConstIntBound(clamp(int(dt.min_value())), clamp(int(dt.max_value())))
    return EVERYTHING


def b_add(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    lo = NEG_INF if NEG_INF in (x.min_value, y.min_value) else clamp(x.min_value + y.min_value)
    hi = POS_INF if POS_INF in (x.max_value, y.max_value) else clamp(x.max_value + y.max_value)
    return ConstIntBound(lo, hi)


def b_neg(x: ConstIntBound) -> ConstIntBound:
    return ConstIntBound(-x.max_value, -x.min_value)


def b_sub(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    return b_add(x, b_neg(y))


def _mul1(a: int, b: int) -> int:
    if a == 0 or b == 0:
        return 0
    if a in (POS_INF, NEG_INF) or b in (POS_INF, NEG_INF):
        return POS_INF if (a > 0) == (b > 0) else NEG_INF
    return clamp(a * b)


def b_mul(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    c = (
        _mul1(x.min_value, y.min_value),
        _mul1(x.min_value, y.max_value),
        _mul1(x.max_value, y.min_value),
        _mul1(x.max_value, y.max_value),
    )
    return ConstIntBound(min(c), max(c))


def b_scale(x: ConstIntBound, k: int) -> ConstIntBound:
    """``x * k`` for a constant ``k``."""
    if k >= 0:
        return ConstIntBound(_mul1(x.min_value, k), _mul1(x.max_value, k))
    return ConstIntBound(_mul1(x.max_value, k), _mul1(x.min_value, k))


def _div1(a: int, b: int, floor: bool) -> int:
    """``a / b`` (b finite, non-zero) with a possibly infinite."""
    if a in (POS_INF, NEG_INF):
        return a if b > 0 else -a
    if floor:
        return a // b
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _div(x: ConstIntBound, y: ConstIntBound, floor: bool) -> ConstIntBound:
    if y.min_value > 0 or y.max_value < 0:
        ys = [v for v in (y.min_value, y.max_value) if v not in (POS_INF, NEG_INF)]
        if len(ys) < 2:
            # divisor unbounded in magnitude: the quotient tends to 0 (or -1 for floor)
            ys = ys + [POS_INF if y.min_value > 0 else NEG_INF]
        c = []
        for a in (x.min_value, x.max_value):
            for b in ys:
                if b in (POS_INF, NEG_INF):
                    c.append(0)
                    if floor:
                        c.append(-1)
                else:
                    c.append(_div1(a, b, floor))
        return ConstIntBound(min(c), max(c))
    # the divisor may be zero or change sign: only |quotient| <= |dividend| is known
    m = max(abs(x.min_value), abs(x.max_value))
    return ConstIntBound(clamp(-m), clamp(m))


def b_floordiv(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    return _div(x, y, floor=True)


def b_truncdiv(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    return _div(x, y, floor=False)


def b_floormod(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    if y.min_value > 0:
        if x.min_value >= 0 and x.max_value < y.min_value:
            return x
        hi = y.max_value - 1 if y.max_value != POS_INF else POS_INF
        if x.min_value >= 0:
            hi = min(hi, x.max_value)
        return ConstIntBound(0, hi)
    if y.max_value < 0:
        lo = y.min_value + 1 if y.min_value != NEG_INF else NEG_INF
        if x.max_value <= 0:
            lo = max(lo, x.min_value)
        return ConstIntBound(lo, 0)
    m = max(abs(y.min_value), abs(y.max_value))
    m = m - 1 if m != POS_INF else POS_INF
    return ConstIntBound(-m, m)


def b_truncmod(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    m = max(abs(y.min_value), abs(y.max_value))
    m = m - 1 if m != POS_INF else POS_INF
    if x.min_value >= 0:
        return ConstIntBound(0, min(m, x.max_value))
    if x.max_value <= 0:
        return ConstIntBound(max(-m, x.min_value), 0)
    return ConstIntBound(max(-m, x.min_value), min(m, x.max_value))


def b_union(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    return ConstIntBound(min(x.min_value, y.min_value), max(x.max_value, y.max_value))


def b_intersect(x: ConstIntBound, y: ConstIntBound) -> ConstIntBound:
    lo, hi = max(x.min_value, y.min_value), min(x.max_value, y.max_value)
    if lo > hi:  # contradictory facts (dead code): keep a sound, non-empty answer
        return x
    return ConstIntBound(lo, hi)


class BoundAnalyzer:
    """Computes :class:`ConstIntBound` of expressions; ``var_bound(var)`` supplies leaf bounds.

    Results are memoized by node identity until :meth:`clear` (called whenever the variable
    context changes). Vector expressions get the union over their lanes.
    """

    def __init__(self, var_bound: Callable[[E.Var], ConstIntBound]):
        self._var_bound = var_bound
        self._memo: dict[int, tuple[E.PrimExpr, ConstIntBound]] = {}
        self.let_bounds: dict[E.Var, ConstIntBound] = {}

    def clear(self) -> None:
        self._memo.clear()

    def __call__(self, e: E.PrimExpr) -> ConstIntBound:
        m = self._memo.get(id(e))
        if m is not None:
            return m[1]
        r = self._compute(e)
        if e.dtype.is_integer and type(e) is not E.IntImm:
            # no overflow is assumed, so every value fits the expression's type
            r = b_intersect(r, dtype_bound(e.dtype))
        if len(self._memo) > 50000:
            self._memo.clear()
        self._memo[id(e)] = (e, r)
        return r

    def _compute(self, e: E.PrimExpr) -> ConstIntBound:  # noqa: C901 - one dispatch table
        t = type(e)
        dt = e.dtype
        if dt.is_float or dt.is_handle:
            return EVERYTHING
        if t is E.IntImm:
            return ConstIntBound(e.value, e.value)
        if t is E.Var or t is E.SizeVar:
            lb = self.let_bounds.get(e)
            return lb if lb is not None else self._var_bound(e)
        if t is E.Add:
            return b_add(self(e.a), self(e.b))
        if t is E.Sub:
            return b_sub(self(e.a), self(e.b))
        if t is E.Mul:
            return b_mul(self(e.a), self(e.b))
        if t is E.FloorDiv:
            return b_floordiv(self(e.a), self(e.b))
        if t is E.FloorMod:
            return b_floormod(self(e.a), self(e.b))
        if t is E.Div:
            return b_truncdiv(self(e.a), self(e.b))
        if t is E.Mod:
            return b_truncmod(self(e.a), self(e.b))
        if t is E.Min:
            a, b = self(e.a), self(e.b)
            return ConstIntBound(min(a.min_value, b.min_value), min(a.max_value, b.max_value))
        if t is E.Max:
            a, b = self(e.a), self(e.b)
            return ConstIntBound(max(a.min_value, b.min_value), max(a.max_value, b.max_value))
        if t is E.Select:
            return b_union(self(e.true_value), self(e.false_value))
        if t is E.BitwiseAnd:  # a non-negative operand bounds the result to [0, its max]
            a, b = self(e.a), self(e.b)
            his = [x.max_value for x in (a, b) if x.min_value >= 0]
            if his:
                return ConstIntBound(0, min(his))
        if t is E.ShiftRight:  # moves toward 0 (or -1): within [min(a, 0), max(a, 0)]
            a = self(e.a)
            return ConstIntBound(min(a.min_value, 0), max(a.max_value, 0))
        if t is E.Cast:
            target = dtype_bound(dt)
            if e.value.dtype.is_float:
                return target
            src = self(e.value)
            if target.min_value <= src.min_value and src.max_value <= target.max_value:
                return src
            return target
        if t is E.Broadcast:
            return self(e.value)
        if t is E.Ramp:
            base, stride = self(e.base), self(e.stride)
            span = b_scale(stride, e.lanes - 1)
            return b_add(base, ConstIntBound(min(0, span.min_value), max(0, span.max_value)))
        if t is E.Call and e.op == "check_index":  # an index resolved into [0, n)
            n = self(e.args[2])
            return ConstIntBound(0, max(0, n.max_value - 1) if n.max_value < POS_INF else POS_INF)
        if t is E.Let:
            self.let_bounds[e.var] = self(e.value)
            try:
                return self._compute(e.body)
            finally:
                self.let_bounds.pop(e.var, None)
        return dtype_bound(dt)
