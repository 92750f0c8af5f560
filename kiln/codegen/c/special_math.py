"""C source of the special functions (:data:`kiln.tir.expr.SPECIAL_FUNCTIONS`): Bessel, Airy,
Hurwitz zeta, the incomplete gamma functions and the classical orthogonal polynomials.

Each is a ``static inline double kiln_sf_<name>(double...)`` function written in the subset
of C that C99, CUDA C and OpenCL C share (no pointers, no recursion, no ``long long``, only
math functions all three have), so the C code generator and the GPU renderer emit the same
text (the GPU one with its function qualifier, see :class:`kiln.codegen.gpu.helpers.GpuHelpers`).
Kernels call them in float64 and round once to the tensor's dtype.

The methods are textbook ones, chosen so that loops (which TIR expressions cannot hold) give
the precision: convergent power series summed until the terms stop mattering, Hankel's and
the Airy functions' asymptotic expansions at large arguments, the trapezoidal rule on
``K_nu(x) = int_0^inf exp(-x cosh t) cosh(nu t) dt`` (which converges geometrically in the
step for this analytic integrand), Euler-Maclaurin for zeta, the series / Legendre continued
fraction for the incomplete gamma functions, and the three-term recurrences for the
polynomials (as torch evaluates them, so results agree with its float64 ones to rounding).
Accuracy against scipy.special (``tests/op/test_op_special.py``): I, K, spherical j0 and zeta
to about 1e-13 relative; igamma/igammac 1e-11 relative for moderate ``a``, about 1e-10 for
``a`` near 1e5-1e6 (the prefactor's exponent ``a log x - x - lgamma(a)`` cancels); the
Bessel J/Y and Airy functions switch from series to asymptotics at moderate arguments, where
about 1e-11 absolute remains (the series' cancellation and the asymptotic tail balance
there) -- torch's own float64 J/Y/Ai are single-precision fits, about 1e-6 from scipy. Edge
cases (poles, negative arguments, NaN, infinities, negative polynomial degrees) follow torch.
"""

from __future__ import annotations

#: name -> (C source, helpers it calls)
SPECIAL_C: dict[str, tuple[str, tuple[str, ...]]] = {}


def _define(name: str, code: str, deps: tuple[str, ...] = ()) -> None:
    SPECIAL_C[name] = (code, deps)


_define("hankel", r"""
/* Hankel's asymptotic series of J_nu/Y_nu for x >= 15: P (part 0) or Q (part 1), with
   a_k(nu) = prod_{j<=k} (4 nu^2 - (2j-1)^2) / (k! 8^k), summed until the terms are negligible
   or start to grow (the series is asymptotic). */
static inline double kiln_sf_hankel(double nu, double x, int part) {
  double mu = 4.0 * nu * nu, t = 1.0, p = 1.0, q = 0.0;
  for (int k = 1; k < 200; ++k) {
    double odd = 2.0 * k - 1.0;
    double next = t * (mu - odd * odd) / (k * 8.0 * x);
    if (fabs(next) > fabs(t) && k > 2) break;
    t = next;
    int r = k % 4;  /* sign (-1)^(k/2) on P's even terms, (-1)^((k-1)/2) on Q's odd ones */
    if (r == 0) p += t; else if (r == 1) q += t; else if (r == 2) p -= t; else q -= t;
    if (fabs(t) < 1e-17) break;
  }
  return part == 0 ? p : q;
}
""")

_define("bessel_jy", r"""
/* J_n (kind 0) or Y_n (kind 1), n = 0 or 1, for x > 0. Below 15 the power series (Y with its
   logarithm and harmonic-number sums), above it Hankel's expansion; cos(x - (n/2 + 1/4) pi)
   is built from cos x and sin x, whose argument reduction is exact. */
static inline double kiln_sf_bessel_jy(int n, int kind, double x) {
  const double pi = 3.14159265358979323846, euler = 0.57721566490153286061;
  if (x >= 15.0) {
    double p = kiln_sf_hankel((double)n, x, 0), q = kiln_sf_hankel((double)n, x, 1);
    double c = cos(x), s = sin(x);
    /* chi = x - pi/4 (n = 0) or x - 3 pi/4 (n = 1) */
    double cc = n == 0 ? (c + s) : (s - c), sc = n == 0 ? (s - c) : (-c - s);
    cc *= 0.70710678118654752440;
    sc *= 0.70710678118654752440;
    double amp = sqrt(2.0 / (pi * x));
    return kind == 0 ? amp * (p * cc - q * sc) : amp * (p * sc + q * cc);
  }
  double h = 0.5 * x, w = -h * h;
  double t = n == 0 ? 1.0 : h;  /* (-w)^k (x/2)^n / (k! (k+n)!) with its sign */
  double j = t, extra = 0.0, harm = 0.0;
  if (kind == 1 && n == 1) extra = 2.0 * (-euler) * t + t;  /* (psi(1) + psi(2)) t */
  for (int k = 1; k < 120; ++k) {
    t *= w / (k * (double)(k + n));
    j += t;
    harm += 1.0 / k;
    if (kind == 1) {
      /* n = 0: H_k t_k; n = 1: (psi(k+1) + psi(k+2)) t_k, psi(m+1) = H_m - euler */
      extra += n == 0 ? harm * t : (2.0 * harm + 1.0 / (k + 1.0) - 2.0 * euler) * t;
    }
    if (fabs(t) < 1e-17 * fabs(j) && k > 2) break;
  }
  if (kind == 0) return j;
  if (n == 0) return (2.0 / pi) * ((log(h) + euler) * j - extra);
  return (2.0 / pi) * log(h) * j - 2.0 / (pi * x) - extra / pi;
}
""", ("hankel",))

_define("bessel_j0", r"""
static inline double kiln_sf_bessel_j0(double x) {
  if (isnan(x) || isinf(x)) return (double)NAN;  /* torch: NaN at +-inf */
  return kiln_sf_bessel_jy(0, 0, fabs(x));
}
""", ("bessel_jy",))

_define("bessel_j1", r"""
static inline double kiln_sf_bessel_j1(double x) {
  if (isnan(x) || isinf(x)) return (double)NAN;
  double r = kiln_sf_bessel_jy(1, 0, fabs(x));
  return x < 0.0 ? -r : r;
}
""", ("bessel_jy",))

_define("bessel_y0", r"""
static inline double kiln_sf_bessel_y0(double x) {
  if (isnan(x) || isinf(x) || x < 0.0) return (double)NAN;
  if (x == 0.0) return -(double)INFINITY;
  return kiln_sf_bessel_jy(0, 1, x);
}
""", ("bessel_jy",))

_define("bessel_y1", r"""
static inline double kiln_sf_bessel_y1(double x) {
  if (isnan(x) || isinf(x) || x < 0.0) return (double)NAN;
  if (x == 0.0) return -(double)INFINITY;
  return kiln_sf_bessel_jy(1, 1, x);
}
""", ("bessel_jy",))

_define("bessel_i", r"""
/* exp(-x) I_n(x), n = 0 or 1, x >= 0: the power series (positive terms) below 30, the
   asymptotic expansion sum_k (-1)^k a_k(n) / x^k / sqrt(2 pi x) above. */
static inline double kiln_sf_bessel_i(int n, double x) {
  if (x >= 30.0) {
    double mu = 4.0 * n * n, t = 1.0, s = 1.0;
    for (int k = 1; k < 60; ++k) {
      double odd = 2.0 * k - 1.0;
      t *= -(mu - odd * odd) / (k * 8.0 * x);
      s += t;
      if (fabs(t) < 1e-17) break;
    }
    return s / sqrt(2.0 * 3.14159265358979323846 * x);
  }
  double h = 0.5 * x, w = h * h, t = n == 0 ? 1.0 : h, s = t;
  for (int k = 1; k < 500; ++k) {
    t *= w / (k * (double)(k + n));
    s += t;
    if (t < 1e-17 * s) break;
  }
  return s * exp(-x);
}
""")

_define("bessel_i0", r"""
static inline double kiln_sf_bessel_i0(double x) {
  if (isnan(x) || isinf(x)) return (double)NAN;  /* torch: NaN at +-inf */
  double a = fabs(x), e = exp(0.5 * a);  /* exp(a) in two halves: no early overflow */
  return kiln_sf_bessel_i(0, a) * e * e;
}
""", ("bessel_i",))

_define("bessel_i1", r"""
static inline double kiln_sf_bessel_i1(double x) {
  if (isnan(x) || isinf(x)) return (double)NAN;
  double a = fabs(x), e = exp(0.5 * a);
  double r = kiln_sf_bessel_i(1, a) * e * e;
  return x < 0.0 ? -r : r;
}
""", ("bessel_i",))

_define("bessel_k_scaled", r"""
/* exp(x) K_nu(x) for x > 0 (nu = 0, 1 or 1/3). Above 2 the trapezoidal rule on
   int_0^inf exp(-x (cosh t - 1)) cosh(nu t) dt: the integrand is analytic in a strip, so the
   error falls like exp(-2 pi d / h); the step shrinks as 1/sqrt(x) with the integrand's width
   (error below 1e-16 for every x). At or below 2 (nu = 0, 1) the series
   K_0 = -(log(x/2) + euler) I_0 + sum H_k q^k / (k!)^2,
   K_1 = 1/x + log(x/2) I_1 - (x/4) sum (psi(k+1) + psi(k+2)) q^k / (k! (k+1)!), q = x^2/4. */
static inline double kiln_sf_bessel_k_scaled(double nu, double x) {
  const double euler = 0.57721566490153286061;
  if (x > 2.0 || (nu != 0.0 && nu != 1.0)) {
    double h = 0.6 / sqrt(x);
    if (h > 0.2) h = 0.2;
    double s = 0.5;
    for (int k = 1; k < 2000; ++k) {
      double tk = k * h, f = exp(-x * (cosh(tk) - 1.0)) * cosh(nu * tk);
      s += f;
      if (f < 1e-18 * s) break;
    }
    return s * h;
  }
  double hx = 0.5 * x, q = hx * hx, lg = log(hx);
  double t = 1.0;  /* q^k / (k! (k+nu)!) */
  double i = t, sum = nu == 0.0 ? 0.0 : 1.0 - 2.0 * euler, harm = 0.0;
  for (int k = 1; k < 60; ++k) {
    t *= q / (k * (k + nu));
    harm += 1.0 / k;
    i += t;
    sum += nu == 0.0 ? harm * t : (2.0 * harm + 1.0 / (k + 1.0) - 2.0 * euler) * t;
    if (t < 1e-17 * i) break;
  }
  double k;
  if (nu == 0.0) k = -(lg + euler) * i + sum;
  else k = 1.0 / x + lg * hx * i - 0.5 * hx * sum;
  return k * exp(x);
}
""")

_define("bessel_k0e", r"""
static inline double kiln_sf_bessel_k0e(double x) {
  if (isnan(x) || x < 0.0) return (double)NAN;
  if (x == 0.0) return (double)INFINITY;
  if (isinf(x)) return 0.0;
  return kiln_sf_bessel_k_scaled(0.0, x);
}
""", ("bessel_k_scaled",))

_define("bessel_k1e", r"""
static inline double kiln_sf_bessel_k1e(double x) {
  if (isnan(x) || x < 0.0) return (double)NAN;
  if (x == 0.0) return (double)INFINITY;
  if (isinf(x)) return 0.0;
  return kiln_sf_bessel_k_scaled(1.0, x);
}
""", ("bessel_k_scaled",))

_define("bessel_k0", r"""
static inline double kiln_sf_bessel_k0(double x) {
  double r = kiln_sf_bessel_k0e(x);
  return x > 0.0 && !isinf(r) ? r * exp(-x) : r;
}
""", ("bessel_k0e",))

_define("bessel_k1", r"""
static inline double kiln_sf_bessel_k1(double x) {
  double r = kiln_sf_bessel_k1e(x);
  return x > 0.0 && !isinf(r) ? r * exp(-x) : r;
}
""", ("bessel_k1e",))

_define("airy_ai", r"""
/* Ai(x): (1/pi) sqrt(x/3) K_{1/3}(zeta) above 2 (zeta = 2/3 x^(3/2)); the Maclaurin series
   Ai(0) f(x) + Ai'(0) g(x) on [-7, 2]; below -7 the asymptotic expansion
   pi^(-1/2) z^(-1/4) (cos(zeta - pi/4) sum (-1)^k u_2k / zeta^2k
   + sin(zeta - pi/4) sum (-1)^k u_2k+1 / zeta^(2k+1)), z = -x. As torch: NaN at +-inf. */
static inline double kiln_sf_airy_ai(double x) {
  const double pi = 3.14159265358979323846;
  if (isnan(x) || isinf(x)) return (double)NAN;
  if (x > 2.0) {
    double zeta = (2.0 / 3.0) * x * sqrt(x);
    if (zeta > 745.0) return 0.0;
    return sqrt(x / 3.0) / pi * kiln_sf_bessel_k_scaled(1.0 / 3.0, zeta) * exp(-zeta);
  }
  if (x >= -7.0) {
    double x3 = x * x * x, f = 1.0, g = x, tf = 1.0, tg = x;
    for (int k = 1; k < 200; ++k) {
      tf *= x3 / ((3.0 * k - 1.0) * (3.0 * k));
      tg *= x3 / ((3.0 * k) * (3.0 * k + 1.0));
      f += tf;
      g += tg;
      if (fabs(tf) + fabs(tg) < 1e-18) break;
    }
    return 0.35502805388781723926 * f - 0.25881940379280679840 * g;
  }
  double z = -x, zeta = (2.0 / 3.0) * z * sqrt(z), u = 1.0, even = 1.0, odd = 0.0;
  for (int k = 1; k < 200; ++k) {
    double next = u * (6.0 * k - 5.0) * (6.0 * k - 3.0) * (6.0 * k - 1.0)
                  / ((2.0 * k - 1.0) * 216.0 * k) / zeta;
    if (fabs(next) > fabs(u) && k > 2) break;
    u = next;
    int r = k % 4;
    if (r == 0) even += u; else if (r == 1) odd += u; else if (r == 2) even -= u; else odd -= u;
    if (fabs(u) < 1e-17) break;
  }
  /* cos(zeta - pi/4) and sin(zeta - pi/4) from cos and sin of zeta */
  double c = cos(zeta), s = sin(zeta), h = 0.70710678118654752440;
  return (h * (c + s) * even + h * (s - c) * odd) / (sqrt(pi) * sqrt(sqrt(z)));
}
""", ("bessel_k_scaled",))

_define("spherical_j0", r"""
static inline double kiln_sf_spherical_j0(double x) {
  if (isinf(x)) return 0.0;
  if (fabs(x) < 0.5) {  /* sin(x)/x = sum (-x^2)^k / (2k+1)! */
    double w = -x * x, t = 1.0, s = 1.0;
    for (int k = 1; k < 12; ++k) {
      t *= w / ((2.0 * k) * (2.0 * k + 1.0));
      s += t;
    }
    return s;
  }
  return sin(x) / x;
}
""")

_define("zeta", r"""
/* Hurwitz zeta(x, q) = sum_k (q + k)^-x: at least 9 terms directly (until q + k > 9), then
   Euler-Maclaurin's tail with the coefficients (2j)! / B_2j. As torch: inf at x = 1 and at
   the poles q = 0, -1, ...; NaN for x < 1 and for q < 0 with a non-integer x. */
static inline double kiln_sf_zeta(double x, double q) {
  const double A[12] = {12.0, -720.0, 30240.0, -1209600.0, 47900160.0,
                        -1.8924375803183791606e9, 7.47242496e10, -2.950130727918164224e12,
                        1.1646782814350067249e14, -4.5979787224074726105e15,
                        1.8152105401943546773e17, -7.1661652561756670113e18};
  if (isnan(x) || isnan(q)) return (double)NAN;
  if (x == 1.0) return (double)INFINITY;
  if (x < 1.0) return (double)NAN;
  if (q <= 0.0) {
    if (q == floor(q)) return (double)INFINITY;
    if (x != floor(x)) return (double)NAN;
  }
  double s = pow(q, -x), a = q, b = 0.0;
  int i = 0;
  while (i < 9 || a <= 9.0) {
    i += 1;
    a += 1.0;
    b = pow(a, -x);
    s += b;
    if (fabs(b / s) < 1e-17) return s;
  }
  double w = a, k = 0.0, f = 1.0;
  s += b * w / (x - 1.0) - 0.5 * b;
  for (int j = 0; j < 12; ++j) {
    f *= x + k;
    b /= w;
    double t = f * b / A[j];
    s += t;
    if (fabs(t / s) < 1e-17) break;
    k += 1.0;
    f *= x + k;
    b /= w;
    k += 1.0;
  }
  return s;
}
""")

_define("igamma_parts", r"""
/* The regularized incomplete gamma functions for a > 0, x > 0 finite: P(a, x) by its series
   x^a e^-x / Gamma(a+1) sum_k x^k / ((a+1)...(a+k)) where x < a + 1, else Q(a, x) by
   Legendre's continued fraction (modified Lentz); the other one is the complement.
   upper = 0 gives P, 1 gives Q. */
static inline double kiln_sf_igamma_parts(double a, double x, int upper) {
  double logpre = a * log(x) - x - lgamma(a);
  if (x < a + 1.0) {
    double t = 1.0 / a, s = t;
    for (int k = 1; k < 100000; ++k) {
      t *= x / (a + k);
      s += t;
      if (t < 1e-17 * s) break;
    }
    double p = s * exp(logpre);
    if (p > 1.0) p = 1.0;
    return upper ? 1.0 - p : p;
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, f = d;
  for (int k = 1; k < 100000; ++k) {
    double an = -k * (k - a);
    b += 2.0;
    d = an * d + b;
    if (fabs(d) < tiny) d = tiny;
    c = b + an / c;
    if (fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    double delta = d * c;
    f *= delta;
    if (fabs(delta - 1.0) < 1e-16) break;
  }
  double qv = f * exp(logpre);
  if (qv > 1.0) qv = 1.0;
  return upper ? qv : 1.0 - qv;
}
""")

_define("igamma", r"""
/* P(a, x); torch's conventions at the edges (NaN for negative arguments, 1 at a = 0 < x). */
static inline double kiln_sf_igamma(double a, double x) {
  if (isnan(a) || isnan(x) || a < 0.0 || x < 0.0) return (double)NAN;
  if (a == 0.0) return x > 0.0 ? 1.0 : (double)NAN;
  if (x == 0.0) return 0.0;
  if (isinf(a)) return isinf(x) ? (double)NAN : 0.0;
  if (isinf(x)) return 1.0;
  return kiln_sf_igamma_parts(a, x, 0);
}
""", ("igamma_parts",))

_define("igammac", r"""
/* Q(a, x) = 1 - P(a, x), with torch's edge conventions. */
static inline double kiln_sf_igammac(double a, double x) {
  if (isnan(a) || isnan(x) || a < 0.0 || x < 0.0) return (double)NAN;
  if (a == 0.0) return x > 0.0 ? 0.0 : (double)NAN;
  if (x == 0.0) return 1.0;
  if (isinf(a)) return isinf(x) ? (double)NAN : 1.0;
  if (isinf(x)) return 0.0;
  return kiln_sf_igamma_parts(a, x, 1);
}
""", ("igamma_parts",))

_define("degree", r"""
/* A polynomial degree given as a float, truncated toward zero as torch's int64 cast does;
   -1 (every polynomial is 0 there) for NaN, infinities and values beyond int64 (x86 turns
   those into INT64_MIN, a negative degree). */
static inline int64_t kiln_sf_degree(double n) {
  if (!(fabs(n) < 9.2e18)) return -1;
  return (int64_t)n;
}
""")

_define("chebyshev_recurrence", r"""
/* The Chebyshev recurrence P_{k+1} = 2x P_k - P_{k-1} from P_0 = 1 and P_1 = first (T, U, V and
   W differ only in P_1), for n >= 0. */
static inline double kiln_sf_chebyshev_recurrence(double x, int64_t n, double first) {
  if (n == 0) return 1.0;
  double p = 1.0, q = first;
  for (int64_t k = 1; k < n; ++k) {
    double r = (x + x) * q - p;
    p = q;
    q = r;
  }
  return q;
}
""")

_define("chebyshev_t", r"""
/* T_n(x): cos(n acos x) inside (-1, 1) for n > 6, else the recurrence
   T_{k+1} = 2x T_k - T_{k-1}; +-1 at x = +-1. */
static inline double kiln_sf_chebyshev_t(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (fabs(x) == 1.0) return (x > 0.0 || n % 2 == 0) ? 1.0 : -1.0;
  if (n > 6 && fabs(x) < 1.0) return cos(n * acos(x));
  return kiln_sf_chebyshev_recurrence(x, n, x);
}
""", ("degree", "chebyshev_recurrence"))

_define("chebyshev_u", r"""
/* U_n(x) = sin((n+1) theta) / sin(theta), x = cos(theta), inside (-1, 1) for n > 8, else the
   recurrence from U_0 = 1, U_1 = 2x; +-(n+1) at x = +-1. */
static inline double kiln_sf_chebyshev_u(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (fabs(x) == 1.0) return (x > 0.0 || n % 2 == 0) ? n + 1.0 : -(n + 1.0);
  if (n > 8 && fabs(x) < 1.0) {
    double th = acos(x), s = sin(th);
    if (s != 0.0) return sin((n + 1.0) * th) / s;
    return (n + 1.0) * cos((n + 1.0) * th) / x;
  }
  return kiln_sf_chebyshev_recurrence(x, n, x + x);
}
""", ("degree", "chebyshev_recurrence"))

_define("chebyshev_v", r"""
/* V_n(x) = cos((n + 1/2) theta) / cos(theta / 2) inside (-1, 1) for n > 8, else the
   recurrence from V_0 = 1, V_1 = 2x - 1; V_n(1) = 1, V_n(-1) = (-1)^n (2n + 1). */
static inline double kiln_sf_chebyshev_v(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (fabs(x) == 1.0) {
    if (x > 0.0) return 1.0;
    return n % 2 == 0 ? n + n + 1.0 : -(n + n + 1.0);
  }
  if (n > 8 && fabs(x) < 1.0) {
    double th = acos(x);
    return cos((n + 0.5) * th) / cos(0.5 * th);
  }
  return kiln_sf_chebyshev_recurrence(x, n, x + x - 1.0);
}
""", ("degree", "chebyshev_recurrence"))

_define("chebyshev_w", r"""
/* W_n(x) = sin((n + 1/2) theta) / sin(theta / 2) inside (-1, 1) for n > 8, else the
   recurrence from W_0 = 1, W_1 = 2x + 1; W_n(1) = 2n + 1, W_n(-1) = (-1)^n. */
static inline double kiln_sf_chebyshev_w(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (fabs(x) == 1.0) {
    if (x > 0.0) return n + n + 1.0;
    return n % 2 == 0 ? 1.0 : -1.0;
  }
  if (n > 8 && fabs(x) < 1.0) {
    double th = acos(x);
    return sin((n + 0.5) * th) / sin(0.5 * th);
  }
  return kiln_sf_chebyshev_recurrence(x, n, x + x + 1.0);
}
""", ("degree", "chebyshev_recurrence"))

_define("hermite_h", r"""
/* The physicists' Hermite polynomial: H_{k+1} = 2x H_k - 2k H_{k-1}, H_0 = 1, H_1 = 2x. */
static inline double kiln_sf_hermite_h(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (n == 0) return 1.0;
  double p = 1.0, q = x + x;
  for (int64_t k = 1; k < n; ++k) {
    double r = (x + x) * q - (2.0 * k) * p;
    p = q;
    q = r;
  }
  return q;
}
""", ("degree",))

_define("hermite_he", r"""
/* The probabilists' Hermite polynomial: He_{k+1} = x He_k - k He_{k-1}, He_0 = 1, He_1 = x. */
static inline double kiln_sf_hermite_he(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (n == 0) return 1.0;
  double p = 1.0, q = x;
  for (int64_t k = 1; k < n; ++k) {
    double r = x * q - (double)k * p;
    p = q;
    q = r;
  }
  return q;
}
""", ("degree",))

_define("laguerre_l", r"""
/* L_{k+1} = ((2k + 1 - x) L_k - k L_{k-1}) / (k + 1), L_0 = 1, L_1 = 1 - x; L_n(0) = 1. */
static inline double kiln_sf_laguerre_l(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (x == 0.0 || n == 0) return 1.0;
  double p = 1.0, q = 1.0 - x;
  for (int64_t k = 1; k < n; ++k) {
    double r = ((2.0 * k + 1.0 - x) * q - (double)k * p) / (k + 1.0);
    p = q;
    q = r;
  }
  return q;
}
""", ("degree",))

_define("legendre_p", r"""
/* P_{k+1} = ((2k + 1) x P_k - k P_{k-1}) / (k + 1), P_0 = 1, P_1 = x; P_n(+-1) = (+-1)^n. */
static inline double kiln_sf_legendre_p(double x, double nf) {
  int64_t n = kiln_sf_degree(nf);
  if (n < 0) return 0.0;
  if (fabs(x) == 1.0) return (x > 0.0 || n % 2 == 0) ? 1.0 : -1.0;
  if (n == 0) return 1.0;
  double p = 1.0, q = x;
  for (int64_t k = 1; k < n; ++k) {
    double r = ((2.0 * k + 1.0) * x * q - (double)k * p) / (k + 1.0);
    p = q;
    q = r;
  }
  return q;
}
""", ("degree",))
