"""Special functions of the gamma family (lgamma, digamma, polygamma, mvlgamma's lgamma), the
Bessel, error-function and normal-distribution families, and small real-valued ops (ldexp,
angle, frexp), composed from kiln's element-wise ops; the Bessel J/Y/K, Airy, zeta,
incomplete gamma and orthogonal polynomial functions and nextafter map onto the native
special-function ops of :mod:`kiln.op.special` (loops in float64 helper functions that
element-wise ops cannot express).

The gamma-family functions are evaluated in float64 and rounded once to the result dtype, the
way kiln evaluates other transcendental closed forms (``in_float64``): the argument is shifted
up by a fixed number of steps with the functions' recurrences (so the asymptotic series is
accurate to float64 precision at the shifted point), negative arguments go through the
reflection formulas, and the poles give torch's values (inf for lgamma, NaN or +-inf for the
psi functions).
"""

from __future__ import annotations

import math
from typing import Any

from .... import op
from ..registry import converter
from .common import as_tensor, cast, dtype_of, scalar

F64 = "float64"


def _c(v: float) -> Any:
    return scalar(v, F64)


def _add(*xs: Any) -> Any:
    out = xs[0]
    for x in xs[1:]:
        out = op.add(out, x)
    return out


def _is_nonpositive_integer(x: Any) -> Any:
    return op.logical_and(op.less_equal(x, _c(0.0)), op.equal(op.floor(x), x))


#: the Stirling series' coefficients B_2k / (2k (2k-1)) for k = 1..5
_STIRLING = (1 / 12, -1 / 360, 1 / 1260, -1 / 1680, 1 / 1188)


def _lgamma_positive(x: Any, shift: int = 8) -> Any:
    """log|Gamma(x)| for x > 0: the Stirling series at z = x + shift (z >= 8: error < 1e-15)
    minus the logs of the ``shift`` factors ``x + k`` the recurrence divides out."""
    z = op.add(x, _c(float(shift)))
    series = _c(0.0)
    zi = op.divide(_c(1.0), z)
    z2 = op.multiply(zi, zi)
    power = zi
    for coef in _STIRLING:
        series = op.add(series, op.multiply(_c(coef), power))
        power = op.multiply(power, z2)
    stirling = _add(op.multiply(op.subtract(z, _c(0.5)), op.log(z)), op.negative(z),
                    _c(0.5 * math.log(2 * math.pi)), series)
    factors = op.log(op.abs(_product(x, shift)))
    return op.subtract(stirling, factors)


def _product(x: Any, n: int) -> Any:
    out = x
    for k in range(1, n):
        out = op.multiply(out, op.add(x, _c(float(k))))
    return out


def _sin_pi(x: Any) -> Any:
    """sin(pi * x) with the argument reduced to [-1, 1] first (exact zeros at integers)."""
    r = op.subtract(x, op.multiply(_c(2.0), op.round(op.multiply(x, _c(0.5)))))
    return op.sin(op.multiply(r, _c(math.pi)))


def lgamma64(x: Any) -> Any:
    """log|Gamma(x)| of a float64 tensor: x < 0.5 by reflection,
    ``log(pi / |sin(pi x)|) - lgamma(1 - x)``; +inf at 0 and the negative integers."""
    neg = op.less(x, _c(0.5))
    pos = op.where(neg, op.subtract(_c(1.0), x), x)
    lg = _lgamma_positive(pos)
    refl = op.subtract(op.log(op.divide(_c(math.pi), op.abs(_sin_pi(x)))), lg)
    out = op.where(neg, refl, lg)
    return op.where(_is_nonpositive_integer(x), _c(math.inf), out)


#: digamma's asymptotic series: B_2k / (2k) for k = 1..6
_PSI = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760)


def digamma64(x: Any, shift: int = 10) -> Any:
    """psi(x) of a float64 tensor: ``psi(x + shift) - sum 1/(x + k)``, the asymptotic series
    at x + shift; x < 0.5 by reflection ``psi(1 - x) - pi / tan(pi x)``. As torch: -inf*sign
    at 0 (``psi(+-0) = -+inf``), NaN at the negative integers."""
    neg = op.less(x, _c(0.5))
    pos = op.where(neg, op.subtract(_c(1.0), x), x)
    z = op.add(pos, _c(float(shift)))
    zi2 = op.divide(_c(1.0), op.multiply(z, z))
    series = _c(0.0)
    power = zi2
    for coef in _PSI:
        series = op.add(series, op.multiply(_c(coef), power))
        power = op.multiply(power, zi2)
    psi = _add(op.log(z), op.negative(op.divide(_c(0.5), z)), op.negative(series))
    for k in range(shift):
        psi = op.subtract(psi, op.divide(_c(1.0), op.add(pos, _c(float(k)))))
    sin = _sin_pi(x)
    cos = op.cos(op.multiply(op.subtract(x, op.multiply(_c(2.0), op.round(
        op.multiply(x, _c(0.5))))), _c(math.pi)))
    refl = op.subtract(psi, op.divide(op.multiply(_c(math.pi), cos), sin))
    out = op.where(neg, refl, psi)
    zero = op.equal(x, _c(0.0))
    out = op.where(_is_nonpositive_integer(x), _c(math.nan), out)
    # psi(+0) = -inf, psi(-0) = +inf: the sign of 1/x tells the zeros apart
    signed_inf = op.where(op.less(op.divide(_c(1.0), x), _c(0.0)), _c(math.inf), _c(-math.inf))
    return op.where(zero, signed_inf, out)


#: Euler-Maclaurin's coefficients (2k)! / B_2k for the Hurwitz zeta tail
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)


def hurwitz_zeta64(s: float, q: Any, terms: int = 20) -> Any:
    """zeta(s, q) = sum_k (q + k)^-s for an integer order s >= 2 and a float64 tensor q: the
    first ``terms`` summands, then Euler-Maclaurin's tail at w = q + terms. Poles (q a
    non-positive integer) give +inf as in torch."""
    neg_s = _c(-s)
    total = _c(0.0)
    for k in range(terms):
        total = op.add(total, op.power(op.add(q, _c(float(k))), neg_s))
    w = op.add(q, _c(float(terms)))
    b = op.power(w, neg_s)
    total = _add(total, op.divide(op.multiply(b, w), _c(s - 1.0)), op.multiply(_c(0.5), b))
    a, k = 1.0, 0.0
    wi = op.divide(_c(1.0), w)
    for coef in _ZETA_A:
        a *= s + k
        b = op.multiply(b, wi)
        total = op.add(total, op.multiply(_c(a / coef), b))
        k += 1.0
        a *= s + k
        b = op.multiply(b, wi)
        k += 1.0
    return op.where(_is_nonpositive_integer(q), _c(math.inf), total)


def _float64_unary(ctx: Any, node: Any, fn: Any) -> Any:
    dt = node.out_dtype
    return op.cast(fn(cast(cast(node.arg(0), dt), F64)), dt)


def _float64_converter(fn: Any) -> Any:
    """A converter applying ``fn`` (a float64 closed form) to the node's one input."""
    return lambda ctx, node: _float64_unary(ctx, node, fn)


@converter("aten.lgamma.default")
def lgamma(ctx: Any, node: Any) -> Any:
    return _float64_unary(ctx, node, lgamma64)


@converter("aten.digamma.default")
def digamma(ctx: Any, node: Any) -> Any:
    return _float64_unary(ctx, node, digamma64)


@converter("aten.polygamma.default")
def polygamma(ctx: Any, node: Any) -> Any:
    """psi^(n)(x) = (-1)^(n+1) n! zeta(n + 1, x) for n >= 1, digamma for n = 0."""
    n = int(node.arg(0))
    dt = node.out_dtype
    x = cast(cast(node.arg(1), dt), F64)
    if n < 0:
        raise node.error(f"polygamma of negative order {n}")
    if n == 0:
        return op.cast(digamma64(x), dt)
    sign = -1.0 if n % 2 == 0 else 1.0
    return op.cast(op.multiply(_c(sign * math.factorial(n)), hurwitz_zeta64(n + 1.0, x)), dt)


@converter("aten.ldexp.Tensor")
def ldexp(ctx: Any, node: Any) -> Any:
    """x * 2^other, computed in the result dtype (float)."""
    dt = node.out_dtype
    x, e = cast(node.arg(0), dt), cast(node.arg(1), dt)
    return op.multiply(x, op.power(scalar(2.0, dt), e))


@converter("aten.angle.default")
def angle(ctx: Any, node: Any) -> Any:
    """The angle of a real number: pi for negatives, 0 otherwise, NaN kept."""
    dt = node.out_dtype
    x = cast(node.arg(0), dt)
    out = op.where(op.less(x, as_tensor(0, dtype_of(x))), scalar(math.pi, dt), scalar(0.0, dt))
    return op.where(op.not_equal(x, x), x, out)


# ---- modified Bessel functions I0, I1 -------------------------------------------------------
def _bessel_i_scaled(nu: int, x: Any, switch: float = 15.0, series_terms: int = 50,
                     asym_terms: int = 14) -> Any:
    """exp(-|x|) * I_nu(|x|) for nu in (0, 1) of a float64 tensor: the power series
    ``(x/2)^nu * sum_k q^k / (k! (k+nu)!)`` (q = x^2/4) below ``switch``, the asymptotic
    expansion ``1/sqrt(2 pi x) * sum_k (-1)^k a_k(nu) / x^k`` above it (both accurate to
    ~1e-12 there). Both sums are Horner chains (each value used once: fused kernels stay
    linear in the number of terms)."""
    a = op.abs(x)
    small = op.less(a, _c(switch))
    xs = op.where(small, a, _c(1.0))
    half = op.multiply(xs, _c(0.5))
    series_coefs = tuple(1.0 / (math.factorial(k) * math.factorial(k + nu))
                         for k in reversed(range(series_terms)))
    series = _poly(op.multiply(half, half), series_coefs)
    if nu == 1:
        series = op.multiply(series, half)
    series = op.multiply(series, op.exp(op.negative(xs)))
    xl = op.where(small, _c(switch), a)
    mu = 4.0 * nu * nu
    asym_coefs, coef = [1.0], 1.0
    for k in range(1, asym_terms):
        coef *= -(mu - (2 * k - 1) ** 2) / (k * 8.0)
        asym_coefs.append(coef * (-1) ** k)
    asym = _poly(op.divide(_c(1.0), xl), tuple(reversed(asym_coefs)))
    asym = op.divide(asym, op.sqrt(op.multiply(xl, _c(2 * math.pi))))
    return op.where(small, series, asym)


def _bessel(nu: int, scaled: bool) -> Any:
    def fn(x: Any) -> Any:
        out = _bessel_i_scaled(nu, x)
        if not scaled:
            out = op.multiply(out, op.exp(op.abs(x)))
        if nu == 1:  # odd
            out = op.where(op.less(x, _c(0.0)), op.negative(out), out)
        return op.where(op.not_equal(x, x), x, out)

    return fn


for _name, (_nu, _scaled) in {"i0": (0, False), "special_i0e": (0, True),
                              "special_i1": (1, False), "special_i1e": (1, True)}.items():
    converter(f"aten.{_name}.default")(_float64_converter(_bessel(_nu, _scaled)))


# ---- erfcx, log_ndtr, erfinv, ndtri -----------------------------------------------------
def erfcx64(x: Any, switch: float = 3.0, depth: int = 60) -> Any:
    """exp(x^2) erfc(x) of a float64 tensor: directly below ``switch`` (erfc loses no
    precision there in float64), Laplace's continued fraction
    ``1 / (sqrt(pi) (x + (1/2) / (x + 1 / (x + (3/2) / ...))))`` above it."""
    big = op.greater_equal(x, _c(switch))
    xd = op.where(big, _c(0.0), x)
    direct = op.multiply(op.exp(op.multiply(xd, xd)), op.subtract(_c(1.0), op.erf(xd)))
    xc = op.where(big, x, _c(switch))
    t = xc
    for k in range(depth, 0, -1):
        t = op.add(xc, op.divide(_c(k / 2.0), t))
    frac = op.divide(_c(1.0 / math.sqrt(math.pi)), t)
    return op.where(big, frac, direct)


def _log_ndtr64(x: Any) -> Any:
    """log(Phi(x)): log(erfc(-x/sqrt 2) / 2), through erfcx below -3 (where Phi underflows)."""
    low = op.less(x, _c(-3.0))
    xd = op.where(low, _c(0.0), x)
    direct = op.log(op.multiply(_c(0.5), op.subtract(
        _c(1.0), op.erf(op.multiply(xd, _c(-1 / math.sqrt(2)))))))
    xl = op.where(low, x, _c(-3.0))
    z = op.multiply(xl, _c(-1 / math.sqrt(2)))
    tail = op.subtract(op.log(op.multiply(_c(0.5), erfcx64(z))), op.multiply(z, z))
    return op.where(low, tail, direct)


def _poly(w: Any, coefs: tuple[float, ...]) -> Any:
    p = _c(coefs[0])
    for c in coefs[1:]:
        p = op.add(_c(c), op.multiply(p, w))
    return p


#: M. Giles, "Approximating the erfinv function" (GPU Computing Gems): single-precision
#: polynomials in w = -log(1 - x^2), the central (w < 5) and tail branches
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def erfinv64(x: Any, newton: int = 1) -> Any:
    """erf^-1 of a float64 tensor: Giles' polynomial (~1e-7), then a Newton step on erf in
    float64 (the error squares); +-inf at +-1, NaN outside [-1, 1]. Each step uses ``y``
    several times, which fused kernels inline: more steps than needed cost compile time."""
    inside = op.less(op.abs(x), _c(1.0))
    xi = op.where(inside, x, _c(0.0))
    w = op.negative(op.log(op.multiply(op.subtract(_c(1.0), xi), op.add(_c(1.0), xi))))
    central = _poly(op.subtract(w, _c(2.5)), _ERFINV_CENTRAL)
    tail = _poly(op.subtract(op.sqrt(w), _c(3.0)), _ERFINV_TAIL)
    y = op.multiply(op.where(op.less(w, _c(5.0)), central, tail), xi)
    for _ in range(newton):
        slope = op.multiply(_c(2 / math.sqrt(math.pi)), op.exp(op.negative(op.multiply(y, y))))
        y = op.subtract(y, op.divide(op.subtract(op.erf(y), xi), slope))
    edge = op.where(op.equal(x, _c(1.0)), _c(math.inf),
                    op.where(op.equal(x, _c(-1.0)), _c(-math.inf), _c(math.nan)))
    return op.where(inside, y, edge)


def _ndtri64(p: Any) -> Any:
    """Phi^-1(p) = sqrt(2) erfinv(2p - 1), refined by a Newton step on Phi itself (so small p
    keep their relative precision)."""
    y = op.multiply(erfinv64(op.subtract(op.multiply(p, _c(2.0)), _c(1.0)), newton=0),
                    _c(math.sqrt(2)))
    inside = op.logical_and(op.greater(p, _c(0.0)), op.less(p, _c(1.0)))
    y = op.where(inside, y, _c(0.0))
    phi = op.multiply(_c(0.5), op.subtract(_c(1.0), op.erf(
        op.multiply(y, _c(-1 / math.sqrt(2))))))
    dens = op.multiply(_c(1 / math.sqrt(2 * math.pi)),
                       op.exp(op.multiply(op.multiply(y, y), _c(-0.5))))
    y = op.subtract(y, op.divide(op.subtract(phi, p), dens))
    edge = op.where(op.equal(p, _c(0.0)), _c(-math.inf),
                    op.where(op.equal(p, _c(1.0)), _c(math.inf), _c(math.nan)))
    return op.where(inside, y, edge)


for _name, _fn in {"special_erfcx": erfcx64, "special_log_ndtr": _log_ndtr64,
                   "erfinv": erfinv64, "special_ndtri": _ndtri64}.items():
    converter(f"aten.{_name}.default")(_float64_converter(_fn))


@converter("aten.frexp.Tensor")
def frexp(ctx: Any, node: Any) -> Any:
    """(mantissa, exponent) with x = m * 2^e and 0.5 <= |m| < 1: e from log2 in float64, then
    one correction step each way for log2's rounding at powers of two; zeros, infinities and
    NaN give (x, 0)."""
    x = node.arg(0)
    dt = dtype_of(x)
    x64 = ctx.emit(op.cast(x, F64))
    a = op.abs(x64)
    e = op.add(op.floor(op.multiply(op.log(a), _c(1 / math.log(2)))), _c(1.0))
    finite = op.logical_and(op.greater(a, _c(0.0)), op.less(a, _c(math.inf)))
    e = ctx.emit(op.where(finite, e, _c(0.0)))
    m = ctx.emit(op.divide(x64, op.power(_c(2.0), e)))
    up = op.greater_equal(op.abs(m), _c(1.0))
    down = op.logical_and(finite, op.less(op.abs(m), _c(0.5)))
    m2 = op.where(up, op.multiply(m, _c(0.5)), op.where(down, op.multiply(m, _c(2.0)), m))
    e2 = op.where(up, op.add(e, _c(1.0)), op.where(down, op.subtract(e, _c(1.0)), e))
    return [op.cast(op.where(finite, m2, x64), dt), op.cast(e2, "int32")]


# ---- Bessel, Airy, zeta, incomplete gamma, orthogonal polynomials, nextafter -------------------
# native kernels (kiln.op.special): float64 helper functions the code generators emit
_UNARY_SPECIAL = {
    "special_bessel_j0": "bessel_j0", "special_bessel_j1": "bessel_j1",
    "special_bessel_y0": "bessel_y0", "special_bessel_y1": "bessel_y1",
    "special_modified_bessel_i0": "bessel_i0", "special_modified_bessel_i1": "bessel_i1",
    "special_modified_bessel_k0": "bessel_k0", "special_modified_bessel_k1": "bessel_k1",
    "special_scaled_modified_bessel_k0": "bessel_k0e",
    "special_scaled_modified_bessel_k1": "bessel_k1e",
    "special_airy_ai": "airy_ai", "special_spherical_bessel_j0": "spherical_j0",
}


def _special_unary(function: str) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return op.special_function(as_tensor(node.arg(0), node.out_dtype, ctx),
                                   function=function)

    return convert


for _name, _function in _UNARY_SPECIAL.items():
    converter(f"aten.{_name}.default")(_special_unary(_function))


def _operands(ctx: Any, node: Any) -> tuple[Any, Any, str]:
    """The two operands (tensors or Python numbers) in the result's float dtype."""
    dt = node.out_dtype
    return as_tensor(node.arg(0), dt, ctx), as_tensor(node.arg(1), dt, ctx), dt


def _special_binary(function: str) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        a, b, _ = _operands(ctx, node)
        return op.special_function2(a, b, function=function)

    return convert


converter("aten.special_zeta.default", "aten.special_zeta.self_scalar",
          "aten.special_zeta.other_scalar")(_special_binary("zeta"))
converter("aten.igamma.default")(_special_binary("igamma"))
converter("aten.igammac.default")(_special_binary("igammac"))


@converter("aten.nextafter.default")
def nextafter(ctx: Any, node: Any) -> Any:
    a, b, _ = _operands(ctx, node)
    return op.nextafter(a, b)


_POLYNOMIALS = {
    "chebyshev_polynomial_t": "chebyshev_t", "chebyshev_polynomial_u": "chebyshev_u",
    "chebyshev_polynomial_v": "chebyshev_v", "chebyshev_polynomial_w": "chebyshev_w",
    "hermite_polynomial_h": "hermite_h", "hermite_polynomial_he": "hermite_he",
    "laguerre_polynomial_l": "laguerre_l", "legendre_polynomial_p": "legendre_p",
}


def _polynomial(kind: str, shifted: bool) -> Any:
    """P_n(x) with n a tensor or a number; the shifted Chebyshev polynomials are the plain ones
    at 2x - 1, formed in float64 (exact for float32 x) so the argument is not rounded."""

    def convert(ctx: Any, node: Any) -> Any:
        x, n, dt = _operands(ctx, node)
        if shifted:
            x64 = op.subtract(op.multiply(cast(x, F64), _c(2.0)), _c(1.0))
            return op.cast(op.orthogonal_polynomial(x64, cast(n, F64), kind=kind), dt)
        return op.orthogonal_polynomial(x, n, kind=kind)

    return convert


for _name, _kind in _POLYNOMIALS.items():
    _variants = [(_name, False)]
    if _kind.startswith("chebyshev"):
        _variants.append(("shifted_" + _name, True))
    for _full, _shifted in _variants:
        converter(*(f"aten.special_{_full}.{o}" for o in ("default", "x_scalar", "n_scalar")))(
            _polynomial(_kind, _shifted))
