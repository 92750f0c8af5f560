"""Constant folding of immediates, respecting each dtype's semantics.

Integers: ``FloorDiv``/``FloorMod`` use floor semantics, ``Div``/``Mod`` C truncation; a result
that does not fit the dtype is not folded (returns None). Floats are computed in the operand's
own precision (float16/float32/bfloat16 results are rounded like the hardware would), and only
operations that are exact under IEEE rules are folded; division by zero is left alone.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable

import numpy as np

from ..ir.dtype import DataType
from ..tir import expr as E

# ---- integer scalar semantics ----------------------------------------------------------------


def truncdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def truncmod(a: int, b: int) -> int:
    return a - b * truncdiv(a, b)


INT_OPS: dict[type, Callable[[int, int], int]] = {
    E.Add: operator.add,
    E.Sub: operator.sub,
    E.Mul: operator.mul,
    E.FloorDiv: operator.floordiv,
    E.FloorMod: operator.mod,
    E.Div: truncdiv,
    E.Mod: truncmod,
    E.Min: min,
    E.Max: max,
}

CMP_OPS: dict[type, Callable[[object, object], bool]] = {
    E.EQ: operator.eq,
    E.NE: operator.ne,
    E.LT: operator.lt,
    E.LE: operator.le,
    E.GT: operator.gt,
    E.GE: operator.ge,
}

_DIVISIONS = (E.FloorDiv, E.FloorMod, E.Div, E.Mod)


def fits(dt: DataType, v: int) -> bool:
    return dt.is_bool or (dt.is_integer and dt.min_value() <= v <= dt.max_value())


def fold_int(cls: type, dt: DataType, a: int, b: int) -> int | None:
    """``a <cls> b`` in scalar integer type ``dt``; None when not foldable."""
    if cls in _DIVISIONS and b == 0:
        return None
    f = INT_OPS.get(cls)
    if f is None:
        return None
    r = f(a, b)
    if dt.is_uint and cls is E.Sub and r < 0:
        return None
    return r if fits(dt, r) else None


def fold_bits(cls: type, dt: DataType, a: int, b: int) -> int:
    """``a <cls> b`` for the bit operations (:data:`~kiln.tir.expr.BIT_OPS`) on scalar integer
    or bool type ``dt``, with TIR's results for shift amounts outside ``[0, bits)``."""
    if cls is E.BitwiseAnd:
        return a & b  # Python ints are two's complement of unbounded width: in range
    if cls is E.BitwiseOr:
        return a | b
    if cls is E.BitwiseXor:
        return a ^ b
    if not 0 <= b < dt.bits:
        return -1 if cls is E.ShiftRight and a < 0 else 0
    if cls is E.ShiftRight:
        return a >> b
    r = (a << b) & ((1 << dt.bits) - 1)
    return r - (1 << dt.bits) if dt.is_int and r >= 1 << (dt.bits - 1) else r


def fold_reinterpret(dt: DataType, value: E.PrimExpr) -> E.PrimExpr | None:
    """``reinterpret(dt, imm)`` of a scalar immediate, through numpy's view of the bits."""
    if type(value) not in (E.IntImm, E.FloatImm) or dt.bits < 8:
        return None
    src = value.dtype.element.to_numpy()
    with np.errstate(all="ignore"):
        bits = np.array(value.value).astype(src).view(dt.to_numpy()).item()
    if dt.is_float:
        return E.FloatImm(dt, float(bits))
    return E.IntImm(dt, int(bits))


# ---- floats ----------------------------------------------------------------------------------


def _np_type(dt: DataType):
    return dt.element.to_numpy().type


def round_float(dt: DataType, v: float) -> float:
    """``v`` rounded to the precision of float type ``dt``."""
    with np.errstate(all="ignore"):
        return float(_np_type(dt)(v))


def fold_float(cls: type, dt: DataType, a: float, b: float) -> float | None:
    """``a <cls> b`` computed in the precision of ``dt``; None when not foldable."""
    nt = _np_type(dt)
    x, y = nt(a), nt(b)
    with np.errstate(all="ignore"):
        if cls is E.Add:
            r = x + y
        elif cls is E.Sub:
            r = x - y
        elif cls is E.Mul:
            r = x * y
        elif cls is E.Div:
            if b == 0.0:
                return None
            r = x / y
        elif cls is E.Min or cls is E.Max:
            if math.isnan(a) or math.isnan(b):
                return None
            r = min(x, y) if cls is E.Min else max(x, y)
        else:
            return None
    return float(nt(r))


# ---- casts -----------------------------------------------------------------------------------


def fold_cast(dt: DataType, value: E.PrimExpr) -> E.PrimExpr | None:
    """Cast of an immediate to scalar type ``dt``; None when the result is not well defined."""
    if type(value) is E.IntImm:
        v = value.value
        if dt.is_float:
            return E.FloatImm(dt, round_float(dt, float(v)))
        if dt.is_bool:
            return E.IntImm(dt, 1 if v else 0)
        if dt.is_integer:
            bits = dt.bits
            v &= (1 << bits) - 1  # two's complement wrap, as C compilers do
            if dt.is_int and v >= 1 << (bits - 1):
                v -= 1 << bits
            return E.IntImm(dt, v)
        return None
    if type(value) is E.FloatImm:
        f = value.value
        if dt.is_float:
            return E.FloatImm(dt, round_float(dt, f))
        if math.isnan(f) or math.isinf(f):
            return None
        if dt.is_bool:
            return E.IntImm(dt, 1 if f != 0.0 else 0)
        if dt.is_integer:
            iv = int(f)  # C truncates toward zero
            return E.IntImm(dt, iv) if fits(dt, iv) else None
    return None
