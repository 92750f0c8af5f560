"""Fast approximations of transcendental functions (used by the FastMath pass).

``fast_exp``, ``fast_tanh``, ``fast_erf`` and ``fast_sigmoid`` are element-wise ops whose tensor
expressions use only arithmetic, comparisons and bit reinterpretation instead of libm's correctly
rounded ``exp``/``tanh``/``erf``, so they vectorize without calling the C library. They are
accurate to float32 working precision, not correctly rounded (float16/bfloat16 inputs are
evaluated in float32; float64 inputs get float32-level accuracy, so FastMath does not use them
there):

- ``fast_exp``: :func:`kiln.tir.math_formulas.exp_float32`, within about 1 ulp -- the formula
  that vectorized loops already use for the exact ``exp`` (so FastMath only changes scalar
  code, and it does not replace ``exp`` by default).
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

from collections.abc import Sequence

from ..tir import expr as tx
from ..tir.expr import PrimExpr
from ..tir.math_formulas import clamp, exp_float32, horner, let
from .elementwise import declare_unary, with_float32
from .registry import NON_DIFFERENTIABLE

__all__ = ["fast_erf", "fast_exp", "fast_sigmoid", "fast_tanh"]

_TANH_CLAMP = 9.0
_TANH_P = (1.0, 0.1291858081, 0.0029200723, 9.261470276e-06, -1.276422731e-08,
           1.821834041e-11)
_TANH_Q = (1.0, 0.4625187007, 0.02376031744, 0.0002280069659)

_ERF_CLAMP = 4.0
_ERF_P = (1.128379167, 0.1945697434, 0.05324063755, 0.003928249984, 0.0002857170109,
          1.980717599e-06)
_ERF_Q = (1.0, 0.5057653756, 0.1157765449, 0.01529704053, 0.00119672568, 3.741763808e-05)


def _fast_exp(x: PrimExpr) -> PrimExpr:
    if x.dtype.bits == 64:  # float32-level accuracy, like the other approximations
        return tx.cast(x.dtype, exp_float32(tx.cast(x.dtype.with_bits(32), x)))
    return exp_float32(x)


def _odd_rational(x: PrimExpr, bound: float, p: Sequence[float], q: Sequence[float]
                  ) -> PrimExpr:
    return let("xc", clamp(x, -bound, bound), lambda xc: let(
        "s", xc * xc, lambda s: xc * horner(s, p) / horner(s, q)))


def _fast_tanh(x: PrimExpr) -> PrimExpr:
    return _odd_rational(x, _TANH_CLAMP, _TANH_P, _TANH_Q)


def _fast_erf(x: PrimExpr) -> PrimExpr:
    return _odd_rational(x, _ERF_CLAMP, _ERF_P, _ERF_Q)


def _fast_sigmoid(x: PrimExpr) -> PrimExpr:
    half = tx.const(x.dtype, 0.5)
    return half + half * _fast_tanh(half * x)


# Inference-time approximations (inserted by FastMath, opt level 4): they declare no gradient of
# their own; differentiate the exact ops, then approximate.
_ND = NON_DIFFERENTIABLE

fast_exp = declare_unary("fast_exp", with_float32(_fast_exp), gradient=_ND,
                  doc="Approximate ``e ** x`` (within about 1 ulp; see kiln.op.fast_math).")
fast_tanh = declare_unary("fast_tanh", with_float32(_fast_tanh), gradient=_ND,
                   doc="Approximate tanh (absolute error < 1e-6; see kiln.op.fast_math).")
fast_erf = declare_unary("fast_erf", with_float32(_fast_erf), gradient=_ND,
                  doc="Approximate erf (absolute error < 1e-6; see kiln.op.fast_math).")
fast_sigmoid = declare_unary("fast_sigmoid", with_float32(_fast_sigmoid), gradient=_ND,
                      doc="Approximate sigmoid (absolute error < 1e-6; see kiln.op.fast_math).")
