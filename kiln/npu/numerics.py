"""The NPU's arithmetic, exactly: what every vector and tensor instruction computes, in numpy.

This module is the specification of the numerics (docs/npu.md, "Numerics"); the simulator
executes it. The numpy model of a quantized graph (:mod:`kiln.testing.quant_reference`) is
written from the graph operators' own specification (``kiln/op/quantize.py``) in plain numpy,
independent of these definitions and of the compiler that maps a graph onto instructions: an
NPU output equal to it shows the instruction sequences compute the operators exactly.

- **Integers** (int8, uint8, int16, int32): ``vadd``/``vsub``/``vmul``/``vmac``/``vneg``/
  ``vabs``/``vshl`` saturate to the destination's range (int8 -> [-128, 127]); ``vshr`` is an
  arithmetic shift, with ``round`` adding half an LSB first (round half up); ``vqmul`` is the
  fixed-point multiply of requantization: ``sat_int32(floor((a * b + 2**(shift-1)) / 2**shift))``
  on the exact 64-bit product. The tensor unit's int32 accumulators wrap modulo 2**32.
- **Floats**: float32 operations are IEEE-754 binary32 with round to nearest even; float16 and
  bfloat16 operands are widened exactly to float32, the operation is done in float32 and the
  result rounded to nearest even in the destination type (correctly rounded for + - * and
  min/max, since binary32 has more than twice their precision plus two bits). ``vexp``, ``vdiv``,
  ``vrsqrt`` and ``verf`` use the approximations below (float32 steps, each rounded), not libm.
- **Casts** (``vcast``): float -> float rounds to nearest even (overflow -> inf); float -> int
  rounds by the mode (``rne``, ``rtz``, ``floor``) and saturates (NaN -> 0); int -> int
  saturates; int -> float rounds to nearest even (int -> bfloat16 through float32).
- **Reductions** (``vred.*``) run left to right along the innermost axis, one rounded
  operation per element, starting from the first element (or from the destination's value with
  ``acc``): a sum is sequential, not pairwise.
- **Scalar functions** (``s.fn``): the register's value, exactly in float32, goes through
  numpy's float64 function (``exp log sqrt sin cos tanh erf``; ``rsqrt`` is ``1 / sqrt`` in
  float64; ``floor ceil`` and ``round`` -- to nearest, ties to even -- are exact), rounded once
  to nearest even in float32 and then in the register's dtype (:func:`scalar_function`). Out
  of the domain: NaN (``log`` of a negative, ``sqrt`` of a negative), ``log(0) = -inf``.
- **Tensor unit, floats**: products of float16/bfloat16 are exact; each instruction's sum over
  its K axis is formed in float64, rounded once to float32 and added (rounded) to the float32
  accumulator. The float64 summation order is unspecified (its effect is below 2**-40 of the
  sum, far under one float32 ulp except on exact ties).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

__all__ = [
    "INT_RANGES", "SCALAR_FUNCTION_REFERENCE", "cast", "div_approx", "erf_approx", "exp_approx",
    "from_f32", "is_float",
    "np_dtype", "qmul", "recip_approx", "rsqrt_approx", "saturate", "scalar_function",
    "shift_right", "to_f32",
]

INT_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
              "int32": (-(2 ** 31), 2 ** 31 - 1), "int64": (-(2 ** 63), 2 ** 63 - 1)}
_NP = {"int8": np.int8, "uint8": np.uint8, "int16": np.int16, "int32": np.int32,
       "int64": np.int64, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16,
       "float32": np.float32}
F32 = np.float32


def np_dtype(dtype: str) -> np.dtype:
    return np.dtype(_NP[dtype])


def is_float(dtype: str) -> bool:
    return dtype in ("float16", "bfloat16", "float32")


def to_f32(x: np.ndarray) -> np.ndarray:
    """Exact widening of a float16/bfloat16/float32 array to float32."""
    return np.asarray(x).astype(F32)


def from_f32(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round a float32 array to ``dtype`` (nearest even; overflow -> inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, dtype=F32).astype(_NP[dtype])


def saturate(x: np.ndarray, dtype: str) -> np.ndarray:
    """Clamp an integer (int64) array to ``dtype``'s range and convert."""
    lo, hi = INT_RANGES[dtype]
    return np.clip(x, lo, hi).astype(_NP[dtype])


def shift_right(x: np.ndarray, s: np.ndarray, rnd: bool) -> np.ndarray:
    """Arithmetic shift right of int64 values (``rnd``: add half an LSB first)."""
    x = x.astype(np.int64)
    s = np.asarray(s, dtype=np.int64)
    if rnd:
        half = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
        x = x + half
    return np.right_shift(x, s)


def qmul(a: np.ndarray, b: np.ndarray, shift: int) -> np.ndarray:
    """``vqmul``: ``sat_int32(floor((a * b + 2**(shift-1)) / 2**shift))`` (exact product).

    int32 x int32 fits int64 except (-2**31)**2, which saturates after the shift anyway: the
    product is formed in Python-exact object arithmetic only for that one value."""
    a64, b64 = np.asarray(a, np.int64), np.asarray(b, np.int64)
    prod = a64 * b64  # |a*b| <= 2**62 unless both are INT32_MIN
    both_min = (a64 == -(2 ** 31)) & (b64 == -(2 ** 31))
    out = shift_right(np.where(both_min, 0, prod), np.int64(shift), shift > 0)
    if both_min.any():
        out = np.where(both_min, (2 ** 62 + (1 << (shift - 1) if shift else 0)) >> shift, out)
    return saturate(out, "int32")


def cast(x: np.ndarray, src: str, dst: str, mode: str = "rne") -> np.ndarray:
    """``vcast`` from ``src`` to ``dst`` (see the module docstring)."""
    x = np.asarray(x)
    if is_float(src):
        f = to_f32(x)
        if is_float(dst):
            return from_f32(f, dst)
        if mode == "rne":
            r = np.rint(f)
        elif mode == "rtz":
            r = np.trunc(f)
        elif mode == "floor":
            r = np.floor(f)
        else:
            raise ValueError(f"unknown cast mode {mode!r}")
        lo, hi = INT_RANGES[dst]
        r = np.where(np.isnan(r), 0, r).astype(np.float64)
        return np.clip(r, lo, hi).astype(_NP[dst])
    if is_float(dst):
        if dst == "bfloat16":
            return x.astype(F32).astype(_NP[dst])
        return x.astype(_NP[dst])
    return saturate(x.astype(np.int64), dst)


# ---------------------------------------------------------------------------------------------
# approximations (float32 arithmetic, every step rounded)
# ---------------------------------------------------------------------------------------------
_LOG2E = F32(1.44269504)
_LN2_HI = F32(0.693359375)  # exactly representable, so n * _LN2_HI is exact for |n| < 2**12
_LN2_LO = F32(-2.12194440e-4)
_EXP_POLY = [F32(1 / 720), F32(1 / 120), F32(1 / 24), F32(1 / 6), F32(0.5), F32(1.0), F32(1.0)]
_EXP_MAX, _EXP_MIN = F32(88.72283), F32(-103.97208)


def exp_approx(x: np.ndarray) -> np.ndarray:
    """``vexp``: e**x as ``2**n * p(r)``, ``n = rint(x * log2(e))``, ``r = x - n*ln2`` (in two
    steps, Cody-Waite), ``p`` the degree-6 Taylor polynomial in Horner form. Above 88.72 -> inf,
    below -103.97 -> 0, NaN -> NaN; within 4 ulp of e**x elsewhere (subnormal results are
    rounded once by the final scaling)."""
    x = to_f32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        nan = np.isnan(x)
        xc = np.clip(np.where(nan, F32(0), x), _EXP_MIN, _EXP_MAX)
        n = np.rint(xc * _LOG2E)
        r = (xc - n * _LN2_HI) - n * _LN2_LO
        p = np.full_like(r, _EXP_POLY[0])
        for c in _EXP_POLY[1:]:
            p = p * r + c
        out = np.ldexp(p, n.astype(np.int32)).astype(F32)
        out = np.where(x > _EXP_MAX, F32(np.inf), out)
        out = np.where(x < _EXP_MIN, F32(0), out)
        return np.where(nan, F32(np.nan), out).astype(F32)


_RECIP_MAGIC = np.uint32(0x7EF311C3)
_RSQRT_MAGIC = np.uint32(0x5F3759DF)
_TINY = F32(2.0 ** -126)
_HUGE = F32(2.0 ** 126)


def recip_approx(b: np.ndarray) -> np.ndarray:
    """1/b: a bit-pattern estimate (``0x7EF311C3 - bits(|b|)``) refined by three Newton steps
    ``y = y * (2 - |b| * y)``; within 2 ulp. |b| < 2**-126 (zero, subnormals) -> +-inf,
    |b| > 2**126 -> +-0, inf -> +-0, NaN -> NaN."""
    b = to_f32(b)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(b)
        safe = np.where((a >= _TINY) & (a <= _HUGE), a, F32(1))
        y = (_RECIP_MAGIC - safe.view(np.uint32)).view(F32)
        two = F32(2)
        for _ in range(3):
            y = y * (two - safe * y)
        y = np.where(a < _TINY, F32(np.inf), y)
        y = np.where(a > _HUGE, F32(0), y)
        y = np.where(np.signbit(b), -y, y)
        return np.where(np.isnan(b), F32(np.nan), y).astype(F32)


def div_approx(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``vdiv``: ``a * recip_approx(b)`` in float32 (0/0, inf/inf -> NaN as IEEE)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return (to_f32(a) * recip_approx(b)).astype(F32)


def rsqrt_approx(x: np.ndarray) -> np.ndarray:
    """``vrsqrt``: 1/sqrt(x), estimate ``0x5F3759DF - (bits >> 1)`` and three Newton steps
    ``y = y * (1.5 - 0.5 * x * y * y)``; within 3 ulp. x < 2**-126 (zero, subnormals) -> inf,
    x < 0 -> NaN, inf -> 0."""
    x = to_f32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        ok = (x >= _TINY) & np.isfinite(x)
        safe = np.where(ok, x, F32(1))
        y = (_RSQRT_MAGIC - (safe.view(np.uint32) >> np.uint32(1))).view(F32)
        half, three_halves = F32(0.5), F32(1.5)
        hx = half * safe
        for _ in range(3):
            y = y * (three_halves - hx * y * y)
        y = np.where((x >= 0) & (x < _TINY), F32(np.inf), y)
        y = np.where(x == F32(np.inf), F32(0), y)
        return np.where((x < 0) | np.isnan(x), F32(np.nan), y).astype(F32)


_ERF_P = F32(0.3275911)
_ERF_A = [F32(1.061405429), F32(-1.453152027), F32(1.421413741), F32(-0.284496736),
          F32(0.254829592)]


def erf_approx(x: np.ndarray) -> np.ndarray:
    """``verf``: Abramowitz & Stegun 7.1.26, ``1 - t*(a1 + t*(a2 + ... a5*t)) * exp(-x*x)``
    with ``t = 1 / (1 + p*|x|)`` (``recip_approx``, ``exp_approx``), sign restored; absolute
    error below 1e-6."""
    x = to_f32(x)
    with np.errstate(invalid="ignore", over="ignore"):
        a = np.abs(x)
        t = recip_approx(F32(1) + _ERF_P * a)
        poly = np.full_like(t, _ERF_A[0])
        for c in _ERF_A[1:]:
            poly = poly * t + c
        y = F32(1) - (poly * t) * exp_approx(-(a * a))
        return np.where(np.signbit(x), -y, y).astype(F32)


def _erf64(x: np.ndarray) -> np.ndarray:
    """erf in float64 (``math.erf``, correctly rounded to within an ulp of float64)."""
    return np.vectorize(math.erf, otypes=[np.float64])(x)


#: ``s.fn`` function -> its float64 reference (applied to the float32 operand)
SCALAR_FUNCTION_REFERENCE = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "sin": np.sin, "cos": np.cos, "tanh": np.tanh, "erf": _erf64, "floor": np.floor,
    "ceil": np.ceil, "round": np.rint,
}


def scalar_function(fn: str, x: np.ndarray, dtype: str) -> np.ndarray:
    """``s.fn``: ``fn`` of ``x`` (values of ``dtype``, a float type) evaluated in float64 on
    the float32 value, rounded to nearest even in float32, then in ``dtype``."""
    x32 = to_f32(np.asarray(x))
    with np.errstate(all="ignore"):
        y = SCALAR_FUNCTION_REFERENCE[fn](x32.astype(np.float64)).astype(F32)
    return from_f32(y, dtype)
