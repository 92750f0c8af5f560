"""Special functions as element-wise ops: Bessel and Airy functions, Hurwitz zeta, the
regularized incomplete gamma functions, the classical orthogonal polynomials, and nextafter.

Three families, each one declaration with an attribute naming the function:

- ``special_function(x, function=...)``: one-argument functions (``bessel_j0``, ``bessel_j1``,
  ``bessel_y0``, ``bessel_y1``, ``bessel_i0``, ``bessel_i1``, ``bessel_k0``, ``bessel_k1``,
  ``bessel_k0e``, ``bessel_k1e`` (``exp(x) K``), ``airy_ai``, ``spherical_j0``).
- ``special_function2(a, b, function=...)``: broadcasting two-argument functions (``zeta(x,
  q)``, ``igamma(a, x)`` = P, ``igammac(a, x)`` = Q).
- ``orthogonal_polynomial(x, n, kind=...)``: ``chebyshev_t/u/v/w``, ``hermite_h``,
  ``hermite_he``, ``laguerre_l``, ``legendre_p`` of degree ``n`` given per element (a float
  tensor, truncated toward zero; negative degrees give 0), evaluated by each polynomial's
  recurrence in a per-element loop (trigonometric forms inside (-1, 1) for Chebyshev's).

They run as native code on every target: each call is a TIR intrinsic
(:func:`kiln.tir.expr.special`) that the C and GPU code generators emit as a call of a float64
helper function (:mod:`kiln.codegen.c.special_math`, where the methods and their accuracy are
described); float32 and lower inputs are widened to float64 and rounded once. Edge cases
follow torch (``torch.special``). None of them declares a gradient.

``nextafter(x, y)`` is the next representable value after ``x`` toward ``y`` in the tensor's
own float type (bit arithmetic on the value, so float16 and bfloat16 step by their own ulp).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.dtype import DataType
from ..ir.errors import KilnError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .elementwise import declare_binary, declare_unary
from .registry import NON_DIFFERENTIABLE

__all__ = ["nextafter", "orthogonal_polynomial", "special_function", "special_function2"]

UNARY_FUNCTIONS = ("bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "bessel_i0",
                   "bessel_i1", "bessel_k0", "bessel_k1", "bessel_k0e", "bessel_k1e",
                   "airy_ai", "spherical_j0")
BINARY_FUNCTIONS = ("zeta", "igamma", "igammac")
POLYNOMIALS = ("chebyshev_t", "chebyshev_u", "chebyshev_v", "chebyshev_w", "hermite_h",
               "hermite_he", "laguerre_l", "legendre_p")


def _check_choice(op: str, what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise KilnError(f"{op}: {what} must be one of {', '.join(choices)}; got {value!r}")


@dataclass(frozen=True)
class SpecialFunctionAttrs:
    """``function``: which one-argument special function (see the module docstring)."""

    function: str = "bessel_j0"

    def __post_init__(self) -> None:
        _check_choice("special_function", "function", self.function, UNARY_FUNCTIONS)


@dataclass(frozen=True)
class SpecialFunction2Attrs:
    """``function``: ``zeta``, ``igamma`` or ``igammac``."""

    function: str = "zeta"

    def __post_init__(self) -> None:
        _check_choice("special_function2", "function", self.function, BINARY_FUNCTIONS)


@dataclass(frozen=True)
class PolynomialAttrs:
    """``kind``: which polynomial family (see the module docstring)."""

    kind: str = "chebyshev_t"

    def __post_init__(self) -> None:
        _check_choice("orthogonal_polynomial", "kind", self.kind, POLYNOMIALS)


_ND = NON_DIFFERENTIABLE

special_function = declare_unary(
    "special_function", lambda x, attrs: tx.special(attrs.function, x),
    attrs=SpecialFunctionAttrs, gradient=_ND,
    doc="A one-argument special function of a float tensor (``function``: bessel_j0, ..., "
        "airy_ai, spherical_j0; see kiln.op.special).")

special_function2 = declare_binary(
    "special_function2", lambda a, b, attrs: tx.special(attrs.function, a, b),
    kind="float", attrs=SpecialFunction2Attrs, gradient=_ND,
    doc="A two-argument special function (``function``: zeta(x, q), igamma(a, x), "
        "igammac(a, x)) of float tensors, broadcasting.")

orthogonal_polynomial = declare_binary(
    "orthogonal_polynomial", lambda x, n, attrs: tx.special(attrs.kind, x, n),
    kind="float", attrs=PolynomialAttrs, gradient=_ND,
    doc="The orthogonal polynomial ``kind`` of degree n (a float tensor, truncated; < 0 gives "
        "0) at x, broadcasting.")


def _nextafter(x: PrimExpr, y: PrimExpr) -> PrimExpr:
    """One step of the bit pattern: away from zero when moving outward, toward it otherwise;
    from zero to the smallest subnormal with y's sign; NaN if either is NaN; y if x == y."""
    dt = x.dtype
    it = DataType(f"int{dt.bits}").with_lanes(dt.lanes)
    zero = tx.const(dt, 0.0)
    bits = tx.reinterpret(it, x)
    one = tx.const(it, 1)
    outward = tx.logical_and(tx.ne(x, zero), tx.eq(tx.lt(x, y), tx.gt(x, zero)))
    step = tx.reinterpret(dt, tx.select(outward, bits + one, bits - one))
    tiny = tx.reinterpret(dt, one)
    from_zero = tx.select(tx.lt(y, zero), zero - tiny, tiny)
    out = tx.select(tx.eq(x, zero), from_zero, step)
    out = tx.select(tx.eq(x, y), y, out)
    return tx.select(tx.logical_or(tx.isnan(x), tx.isnan(y)), x + y, out)


nextafter = declare_binary(
    "nextafter", _nextafter, kind="float", gradient=_ND,
    doc="The next float after x toward y, in the tensor's float type (C's nextafter).")
