"""Small expression helpers shared by the simplifier's rule modules."""

from __future__ import annotations

from typing import Any

from ..ir.dtype import DataType
from ..tir import expr as E
from .canonical import imm
from .const_int_bound import ConstIntBound

BOOL = DataType("bool")
ARITH = (E.Add, E.Sub, E.Mul, E.Div, E.Mod, E.FloorDiv, E.FloorMod, E.Min, E.Max)
CMP = (E.EQ, E.NE, E.LT, E.LE, E.GT, E.GE)
NEGATE = {E.LT: E.GE, E.LE: E.GT, E.GT: E.LE, E.GE: E.LT, E.EQ: E.NE, E.NE: E.EQ}


def true(n: int = 1) -> E.PrimExpr:
    v = imm(BOOL, 1)
    return v if n == 1 else E.Broadcast(v, n)


def false(n: int = 1) -> E.PrimExpr:
    v = imm(BOOL, 0)
    return v if n == 1 else E.Broadcast(v, n)


def const_int(e: E.PrimExpr) -> int | None:
    """The value of an IntImm or of a Broadcast of one."""
    if type(e) is E.IntImm:
        return e.value
    if type(e) is E.Broadcast and type(e.value) is E.IntImm:
        return e.value.value
    return None


def const_float(e: E.PrimExpr) -> float | None:
    if type(e) is E.FloatImm:
        return e.value
    if type(e) is E.Broadcast and type(e.value) is E.FloatImm:
        return e.value.value
    return None


def fits_within(inner: DataType, outer: DataType) -> bool:
    """Every value of integer type ``inner`` is representable in integer type ``outer``."""
    return outer.min_value() <= inner.min_value() and inner.max_value() <= outer.max_value()


_SAME_BINARY = frozenset(ARITH + CMP + E.BIT_OPS + (E.And, E.Or))


def same(a: Any, b: Any) -> bool:
    """Structurally identical arithmetic trees (leaves by identity, immediates by value)."""
    if a is b:
        return True
    t = type(a)
    if t is not type(b):
        return False
    if t is E.IntImm:
        return a.value == b.value and a.dtype == b.dtype
    if t in _SAME_BINARY:
        return same(a.a, b.a) and same(a.b, b.b) and a.dtype == b.dtype
    if t is E.Cast:
        return a.dtype == b.dtype and same(a.value, b.value)
    return False


def identity(e: E.PrimExpr) -> E.PrimExpr:
    return e


def node(cls: type, a: E.PrimExpr, b: E.PrimExpr, orig: Any) -> E.PrimExpr:
    if orig is not None and orig.a is a and orig.b is b:
        return orig
    return cls(a, b)


def cmp_by_bounds(cls: type, x: ConstIntBound, y: ConstIntBound) -> bool | None:
    """Decide ``x <cls> y`` from the operands' bounds alone."""
    if cls is E.LT:
        if x.max_value < y.min_value:
            return True
        if x.min_value >= y.max_value:
            return False
    elif cls is E.LE:
        if x.max_value <= y.min_value:
            return True
        if x.min_value > y.max_value:
            return False
    elif cls is E.GT:
        return cmp_by_bounds(E.LT, y, x)
    elif cls is E.GE:
        return cmp_by_bounds(E.LE, y, x)
    elif cls is E.EQ or cls is E.NE:
        if x.min_value == x.max_value == y.min_value == y.max_value:
            return cls is E.EQ
        if x.max_value < y.min_value or y.max_value < x.min_value:
            return cls is E.NE
    return None
