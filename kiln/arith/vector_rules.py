"""Simplification rules for vector expressions (``Ramp`` / ``Broadcast``).

Vectorized loops are lowered to ``Ramp(base, stride, lanes)`` indices and ``Broadcast``
operands. Arithmetic is pushed into the scalar parts (``ramp + broadcast -> ramp``,
``ramp * broadcast(c) -> ramp``), and ``ramp // c`` / ``ramp % c`` become a Broadcast/Ramp when
no lane crosses a multiple of ``c`` (decided from the bounds of ``base % c``). Comparisons,
min and max are decided for all lanes at once from the lane bounds of the difference.
"""

from __future__ import annotations

from typing import Any

from ..ir.dtype import DataType
from ..tir import expr as E
from .canonical import imm
from .const_int_bound import ConstIntBound
from .expr_utils import cmp_by_bounds, const_float, const_int, false, node, true


class VectorRules:
    """Mixin of :class:`~kiln.arith.rewrite_simplify.Simplifier` for vector operands."""

    def _v_ramp(self, e: E.Ramp) -> E.PrimExpr:
        base, stride = self.visit(e.base), self.visit(e.stride)
        if base is e.base and stride is e.stride and const_int(stride) != 0:
            return e
        return self.ramp(base, stride, e.lanes)

    def ramp(self, base: E.PrimExpr, stride: E.PrimExpr, lanes: int) -> E.PrimExpr:
        if type(stride) is E.IntImm and stride.value == 0:
            return E.Broadcast(base, lanes)
        if stride.dtype != base.dtype:
            stride = self.cast_to(base.dtype, stride)
        return E.Ramp(base, stride, lanes)

    def _v_broadcast(self, e: E.Broadcast) -> E.PrimExpr:
        v = self.visit(e.value)
        return e if v is e.value else E.Broadcast(v, e.lanes)

    def _vector(self, cls: type, dt: DataType, a: E.PrimExpr, b: E.PrimExpr,
                orig: Any) -> E.PrimExpr:
        n = dt.lanes
        ta, tb = type(a), type(b)
        if ta is E.Broadcast and tb is E.Broadcast:
            return E.Broadcast(self.binop(cls, a.value, b.value), n)
        if dt.is_float:
            cb = const_float(b)
            if cb == 1.0 and (cls is E.Mul or cls is E.Div):
                return a
            if const_float(a) == 1.0 and cls is E.Mul:
                return b
            return node(cls, a, b, orig)
        ca, cb = const_int(a), const_int(b)
        if cls is E.Add or cls is E.Sub:
            if cb == 0:
                return a
            if ca == 0 and cls is E.Add:
                return b
            if ta is E.Ramp and tb is E.Ramp:
                return self.ramp(self.binop(cls, a.base, b.base),
                                 self.binop(cls, a.stride, b.stride), n)
            if ta is E.Ramp and tb is E.Broadcast:
                return self.ramp(self.binop(cls, a.base, b.value), a.stride, n)
            if ta is E.Broadcast and tb is E.Ramp:
                stride = b.stride if cls is E.Add else self.binop(
                    E.Sub, imm(b.stride.dtype, 0), b.stride)
                return self.ramp(self.binop(cls, a.value, b.base), stride, n)
        elif cls is E.Mul:
            if ca == 1:
                return b
            if cb == 1:
                return a
            if (ca == 0 or cb == 0) and dt.is_integer:
                return E.Broadcast(imm(dt.element, 0), n)
            if ta is E.Broadcast and tb is E.Ramp:
                a, b, ta, tb = b, a, tb, ta
            if ta is E.Ramp and tb is E.Broadcast:
                return self.ramp(self.binop(E.Mul, a.base, b.value),
                                 self.binop(E.Mul, a.stride, b.value), n)
        elif cls in (E.FloorDiv, E.FloorMod, E.Div, E.Mod):
            if cb == 1:
                return a if cls in (E.FloorDiv, E.Div) else E.Broadcast(imm(dt.element, 0), n)
            if ta is E.Ramp and cb is not None and cb > 0 and dt.is_int:
                floor = cls in (E.FloorDiv, E.FloorMod) or self.bound(a).min_value >= 0
                if floor:
                    r = self._ramp_divmod(cls in (E.FloorDiv, E.Div), a, cb)
                    if r is not None:
                        return r
        elif cls is E.Min or cls is E.Max:
            if dt.is_int:
                d = self.bound(self.binop(E.Sub, a, b))
                if d.max_value <= 0:
                    return a if cls is E.Min else b
                if d.min_value >= 0:
                    return b if cls is E.Min else a
        return node(cls, a, b, orig)

    def _ramp_divmod(self, is_div: bool, ramp: E.Ramp, c: int) -> E.PrimExpr | None:
        """``ramp // c`` or ``ramp % c`` (floor) as a Ramp/Broadcast when lanes allow it."""
        base, stride, n = ramp.base, ramp.stride, ramp.lanes
        if type(stride) is not E.IntImm:
            return None
        s, sdt = stride.value, base.dtype
        cimm = imm(sdt, c)
        if s % c == 0:
            if is_div:
                return self.ramp(self.binop(E.FloorDiv, base, cimm), imm(sdt, s // c), n)
            return E.Broadcast(self.binop(E.FloorMod, base, cimm), n)
        m = self.binop(E.FloorMod, base, cimm)
        mb = self.bound(m)
        span = s * (n - 1)
        if (s > 0 and mb.min_value >= 0 and mb.max_value + span < c) or (
            s < 0 and mb.max_value < c and mb.min_value + span >= 0
        ):
            if is_div:
                return E.Broadcast(self.binop(E.FloorDiv, base, cimm), n)
            return E.Ramp(m, stride, n)
        return None

    def _vector_compare(self, cls: type, a: E.PrimExpr, b: E.PrimExpr, orig: Any) -> E.PrimExpr:
        n = a.dtype.lanes
        if type(a) is E.Broadcast and type(b) is E.Broadcast:
            return E.Broadcast(self._compare(cls, a.value, b.value, None), n)
        if a.dtype.is_int:
            d = self.bound(self.binop(E.Sub, a, b))
            truth = cmp_by_bounds(cls, d, ConstIntBound(0, 0))
            if truth is not None:
                return true(n) if truth else false(n)
        return node(cls, a, b, orig)
