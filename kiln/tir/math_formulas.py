"""Branch-free TIR formulas of math intrinsics, for code that must stay vectorized.

A vectorized loop cannot call libm, and the C library's vector variants (glibc's libmvec, which
GCC calls from ``#pragma omp simd`` loops) run a scalar fallback for every lane out of their fast
range: the vector ``expf`` leaves its fast path for inputs below about -87, so a softmax over
attention scores masked with -10000 took 6x the time of the same softmax on unmasked scores
(1x12x128x128 float32, two threads: 1.02 ms against 0.16 ms). The formulas here use only
arithmetic, comparisons and bit reinterpretation, so they vectorize like any other expression,
with the same cost for every input. :mod:`kiln.tir.transform.vectorize_loops` expands a call of
an intrinsic listed in :data:`EXPANSIONS` into its formula when it vectorizes the call's loop;
scalar code keeps calling libm.

- ``exp`` (float32; float16/bfloat16 evaluated in float32 and rounded once): range reduction
  ``x = n ln2 + r`` with ``n = round(x log2 e)`` and ``|r| <= ln2 / 2`` (Cody-Waite: ln 2 split
  into a part with 9 significant bits, so ``n * LN2_HI`` is exact, and the rest), a degree-6
  polynomial for ``e^r`` evaluated as ``1 + (r + r^2 P(r))``, then a scaling by ``2^n`` built from
  the exponent bits. The scaling is done in two exact halves, ``2^(n - n//2) * 2^(n//2)``, so
  results in the subnormal range are rounded once instead of flushed to zero; below the range
  (``x < -104``, where ``e^x`` rounds to 0) the second half is 0 instead, so masked scores do not
  underflow a product (an underflow takes a microcode assist: 1.4x the time). Error within 1 ulp
  of the exact result on the whole float32 range, 91% correctly rounded (checked against
  float64 in ``tests/tir/test_tir_math_formulas.py``; libmvec's ``expf`` is within 2.5 ulp);
  overflow gives inf, underflow 0, NaN propagates. About 30 vector instructions for 8 values.
- ``sigmoid``: ``1 / (1 + e^-x)`` as ``1 / (1 + e)`` or ``e / (1 + e)`` with ``e = exp(-|x|)``
  by that ``exp`` (no overflow for large negative x; the scalar C helper computes the same).
  Within about 2.5 ulp.

float64 has no formula here: its calls stay in scalar (``#pragma omp simd``) loops.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..ir.dtype import DataType
from . import expr as tx
from .expr import Call, PrimExpr

__all__ = ["EXPANSIONS", "exp_float32", "expand_call", "sigmoid_float32"]

F32 = DataType("float32")
I32 = DataType("int32")

_LOG2E = 1.0 / math.log(2.0)
#: ln 2 = LN2_HI + LN2_LO; LN2_HI = 355/512 has 9 significant bits, so n * LN2_HI is exact for
#: every |n| < 2**15 in float32.
_LN2_HI = 0.693359375
_LN2_LO = math.log(2.0) - _LN2_HI
#: e^r ~ 1 + r + r^2 (c2 + c3 r + ... + c6 r^4) on [-ln2/2, ln2/2] (relative error 3e-9).
_EXP_POLY = (0.4999999345, 0.1666652069, 0.04166838812, 0.008368709526, 0.001381455494)
#: Inputs are clamped to this range first: below it e^x rounds to 0, above it to inf.
_EXP_MIN, _EXP_MAX = -104.0, 89.0
#: 1.5 * 2^23: adding it to a float32 of magnitude < 2^22 rounds that value to an integer held
#: in the sum's low mantissa bits (the float32 round-to-nearest, no conversion instruction).
_ROUND_MAGIC = 12582912.0
_ROUND_MAGIC_BITS = 0x4B400000


def _c(dtype: DataType, v: float) -> PrimExpr:
    return tx.const(dtype, v)


def let(name: str, value: PrimExpr, body: Callable[[PrimExpr], PrimExpr]) -> PrimExpr:
    """``body(v)`` with ``v`` bound to ``value`` once. Every formula reads its input through
    lets, so the input appears once in the expression: inlining a chain of these into one fused
    kernel stays linear in size instead of multiplying the input's uses."""
    var = tx.Var(name, value.dtype)
    return tx.Let(var, value, body(var))


def horner(x: PrimExpr, coeffs: Sequence[float]) -> PrimExpr:
    """``coeffs[0] + coeffs[1] x + ...`` evaluated by Horner's rule."""
    acc = _c(x.dtype, coeffs[-1])
    for a in coeffs[-2::-1]:
        acc = acc * x + _c(x.dtype, a)
    return acc


def clamp(x: PrimExpr, lo: float, hi: float) -> PrimExpr:
    """x limited to [lo, hi]; NaN stays NaN (both comparisons are false), so NaN propagates
    through a formula without a separate test. Two selects rather than ``min``/``max``, whose
    NaN handling for either operand costs two more vector instructions each."""
    lo_c, hi_c = _c(x.dtype, lo), _c(x.dtype, hi)
    return let("x", x, lambda v: let(
        "xl", tx.select(v < lo_c, lo_c, v), lambda xl: tx.select(xl > hi_c, hi_c, xl)))


def _pow2(n: PrimExpr) -> PrimExpr:
    """``2^n`` for an int32 ``n`` in [-126, 127], from its exponent bits."""
    return tx.reinterpret(F32, tx.shift_left(n + tx.const(I32, 127), tx.const(I32, 23)))


def exp_float32(x: PrimExpr) -> PrimExpr:
    """``e^x`` of a float32 expression (see the module docstring for the method and error)."""
    if x.dtype != F32:
        raise TypeError(f"exp_float32 takes float32, not {x.dtype}")

    def with_t(xc: PrimExpr, t: PrimExpr) -> PrimExpr:
        return let("nf", t - _c(F32, _ROUND_MAGIC), lambda nf: with_nf(xc, t, nf))

    def with_nf(xc: PrimExpr, t: PrimExpr, nf: PrimExpr) -> PrimExpr:
        # nf = round(x log2 e), exactly; r = x - nf ln 2, with nf LN2_HI exact
        r = (xc - nf * _c(F32, _LN2_HI)) - nf * _c(F32, _LN2_LO)
        n = tx.reinterpret(I32, t) - tx.const(I32, _ROUND_MAGIC_BITS)
        # below the range the second factor is 0 rather than 2^-75: a product that underflows
        # takes a microcode assist (masked softmax scores, -10000, took 1.4x the time)
        return let("r", r, lambda rv: let("n", n, lambda nv: let(
            "nh", tx.shift_right(nv, tx.const(I32, 1)), lambda nh: (
                (_c(F32, 1.0) + (rv + rv * rv * horner(rv, _EXP_POLY))) * _pow2(nv - nh)
                * tx.select(xc > _c(F32, _EXP_MIN), _pow2(nh), _c(F32, 0.0))))))

    return let("xc", clamp(x, _EXP_MIN, _EXP_MAX), lambda xc: let(
        "t", xc * _c(F32, _LOG2E) + _c(F32, _ROUND_MAGIC), lambda t: with_t(xc, t)))


def sigmoid_float32(x: PrimExpr) -> PrimExpr:
    """``1 / (1 + e^-x)`` of a float32 expression, as ``num / (1 + e)`` with ``e = e^-|x|`` and
    ``num`` 1 for ``x >= 0``, ``e`` below: ``e`` never overflows, so results below 1e-38 keep
    their digits instead of becoming ``1 / inf = 0`` (the C helper of scalar code computes the
    same)."""
    one = _c(F32, 1.0)
    return let("x", x, lambda v: let("e", exp_float32(-tx.abs(v)), lambda e: (
        tx.select(v >= _c(F32, 0.0), one, e) / (one + e))))


def _in_float32(fn: Callable[[PrimExpr], PrimExpr]) -> Callable[[PrimExpr], PrimExpr | None]:
    """``fn`` for float32, float16 and bfloat16 (evaluated in float32, rounded once); None for
    other types (float64 needs more polynomial terms than these formulas have)."""

    def expand(x: PrimExpr) -> PrimExpr | None:
        el = x.dtype.element
        if el == F32:
            return fn(x)
        if el.is_float and el.bits == 16:
            return tx.cast(el, fn(tx.cast(F32, x)))
        return None

    return expand


#: Intrinsic -> its formula for one scalar argument (None where the type has no formula).
EXPANSIONS: dict[str, Callable[[PrimExpr], PrimExpr | None]] = {
    "exp": _in_float32(exp_float32),
    "sigmoid": _in_float32(sigmoid_float32),
}


def expand_call(call: Call) -> PrimExpr | None:
    """The formula of a scalar intrinsic call, or None when it has none for its dtype."""
    fn = EXPANSIONS.get(call.op)
    if fn is None or call.dtype.lanes != 1 or len(call.args) != 1:
        return None
    return fn(call.args[0])
