"""Fast approximations of transcendental functions (used by the FastMath pass).

``fast_exp``, ``fast_tanh``, ``fast_erf`` and ``fast_sigmoid`` are element-wise ops whose tensor
expressions use only arithmetic, ``floor``, comparisons and (for ``fast_exp``) ``exp2`` of an
integer, instead of libm's correctly rounded ``exp``/``tanh``/``erf``. They are accurate to
float32 working precision, not correctly rounded (float16/bfloat16 inputs are evaluated in
float32; float64 inputs get float32-level accuracy, so FastMath does not use them there):

- ``fast_exp``: relative error below 1e-6 on [-87, 88]. Range reduction
  ``x = n ln2 + r`` with ``n = round(x log2(e))`` and ``|r| <= ln2 / 2`` (Cody-Waite: ln2
  split in a part with few mantissa bits, so ``n * LN2_HI`` is exact, and the rest), a degree-6
  polynomial for ``e^r``, then the scaling by ``2^n`` (exact). Out of range the result
  overflows to inf / underflows to 0 like ``exp``; NaN propagates.
- ``fast_tanh``: absolute error below 1e-6. ``tanh(x) = x P(x^2) / Q(x^2)`` (degrees 5 and 3 in
  ``x^2``) on ``|x| <= 9``, x clamped beyond (tanh(9) = 1 - 3e-8).
- ``fast_erf``: absolute error below 1e-6. ``erf(x) = x P(x^2) / Q(x^2)`` (degrees 5 and 5) on
  ``|x| <= 4``, x clamped beyond (erf(4) = 1 - 2e-8).
- ``fast_sigmoid``: ``1/2 + tanh(x/2)/2`` with ``fast_tanh``: absolute error below 1e-6 (the
  relative error of tiny results, ``sigmoid(-30)``, is large: the tail is not resolved).

The rational coefficients are near-minimax fits of the absolute error made for kiln (iterated
reweighted least squares of ``x P - f Q`` on Chebyshev points, Lawson weights, ``P(0)`` fixed to
the function's slope at 0 so that tiny inputs are exact), checked in
``tests/op/test_op_fast_math.py`` on a dense grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .elementwise import _unary, _with_float32
from .registry import NON_DIFFERENTIABLE

__all__ = ["fast_erf", "fast_exp", "fast_sigmoid", "fast_tanh"]

_LOG2E = 1.0 / math.log(2.0)
#: ln 2 = LN2_HI + LN2_LO; LN2_HI = 355/512 has 9 significant bits, so n * LN2_HI is exact for
#: every |n| < 2**15 in float32.
_LN2_HI = 0.693359375
_LN2_LO = math.log(2.0) - _LN2_HI
#: e^r ~ 1 + r + r^2 (c2 + c3 r + ... + c6 r^4) on [-ln2/2, ln2/2] (relative error 3e-9).
_EXP_POLY = (0.4999999345, 0.1666652069, 0.04166838812, 0.008368709526, 0.001381455494)
#: Inputs are clamped to this range first: the result is 0 below and inf above (exp2 of n).
_EXP_MIN, _EXP_MAX = -104.0, 89.0
#: Added before truncating x log2(e) to an integer so that truncation is rounding down.
_ROUND_SHIFT = 256.0

_TANH_CLAMP = 9.0
_TANH_P = (1.0, 0.1291858081, 0.0029200723, 9.261470276e-06, -1.276422731e-08,
           1.821834041e-11)
_TANH_Q = (1.0, 0.4625187007, 0.02376031744, 0.0002280069659)

_ERF_CLAMP = 4.0
_ERF_P = (1.128379167, 0.1945697434, 0.05324063755, 0.003928249984, 0.0002857170109,
          1.980717599e-06)
_ERF_Q = (1.0, 0.5057653756, 0.1157765449, 0.01529704053, 0.00119672568, 3.741763808e-05)


def _c(x: PrimExpr, v: float) -> PrimExpr:
    return tx.const(x.dtype, v)


def _let(name: str, value: PrimExpr, body: Callable[[PrimExpr], PrimExpr]) -> PrimExpr:
    """``body(v)`` with ``v`` bound to ``value`` once. Every formula below reads its input
    through lets, so the input appears once in the expression: inlining a chain of these ops
    into one fused kernel stays linear in size instead of multiplying the input's uses."""
    var = tx.Var(name, value.dtype)
    return tx.Let(var, value, body(var))


def _horner(x: PrimExpr, coeffs: Sequence[float]) -> PrimExpr:
    """``coeffs[0] + coeffs[1] x + ...`` evaluated by Horner's rule."""
    acc = _c(x, coeffs[-1])
    for a in coeffs[-2::-1]:
        acc = acc * x + _c(x, a)
    return acc


def _clamp(x: PrimExpr, lo: float, hi: float) -> PrimExpr:
    """x limited to [lo, hi]; NaN stays NaN (kiln's min/max return a NaN first operand), so
    NaN propagates through every function here without a separate test."""
    return tx.min(tx.max(x, _c(x, lo)), _c(x, hi))


def _fast_exp(x: PrimExpr) -> PrimExpr:
    def with_n(xc: PrimExpr, n: PrimExpr) -> PrimExpr:
        return _let("r", (xc - n * _c(x, _LN2_HI)) - n * _c(x, _LN2_LO), lambda r: (
            (_c(x, 1.0) + r + r * r * _horner(r, _EXP_POLY)) * tx.exp2(n)))

    def with_xc(xc: PrimExpr) -> PrimExpr:
        # n = round(x log2 e) = floor(t + 1/2), as a truncating int32 conversion of a positive
        # number (t >= -150 after the clamp): no floor() call and no branch, so it vectorizes
        t = xc * _c(x, _LOG2E)
        shifted = tx.cast("int32", t + _c(x, _ROUND_SHIFT + 0.5))
        n = tx.cast(x.dtype, shifted) - _c(x, _ROUND_SHIFT)
        return _let("n", n, lambda nv: with_n(xc, nv))

    return _let("xc", _clamp(x, _EXP_MIN, _EXP_MAX), with_xc)


def _odd_rational(x: PrimExpr, clamp: float, p: Sequence[float], q: Sequence[float]
                  ) -> PrimExpr:
    return _let("xc", _clamp(x, -clamp, clamp), lambda xc: _let(
        "s", xc * xc, lambda s: xc * _horner(s, p) / _horner(s, q)))


def _fast_tanh(x: PrimExpr) -> PrimExpr:
    return _odd_rational(x, _TANH_CLAMP, _TANH_P, _TANH_Q)


def _fast_erf(x: PrimExpr) -> PrimExpr:
    return _odd_rational(x, _ERF_CLAMP, _ERF_P, _ERF_Q)


def _fast_sigmoid(x: PrimExpr) -> PrimExpr:
    half = _c(x, 0.5)
    return half + half * _fast_tanh(half * x)


# Inference-time approximations (inserted by FastMath, opt level 4): they declare no gradient of
# their own; differentiate the exact ops, then approximate.
_ND = NON_DIFFERENTIABLE

fast_exp = _unary("fast_exp", _with_float32(_fast_exp), gradient=_ND,
                  doc="Approximate ``e ** x`` (relative error < 1e-6; see kiln.op.fast_math).")
fast_tanh = _unary("fast_tanh", _with_float32(_fast_tanh), gradient=_ND,
                   doc="Approximate tanh (absolute error < 1e-6; see kiln.op.fast_math).")
fast_erf = _unary("fast_erf", _with_float32(_fast_erf), gradient=_ND,
                  doc="Approximate erf (absolute error < 1e-6; see kiln.op.fast_math).")
fast_sigmoid = _unary("fast_sigmoid", _with_float32(_fast_sigmoid), gradient=_ND,
                      doc="Approximate sigmoid (absolute error < 1e-6; see kiln.op.fast_math).")
