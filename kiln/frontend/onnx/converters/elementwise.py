"""Elementwise ONNX operators: arithmetic, math functions, activations, comparisons, logic."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....ir.dtype import as_dtype
from ....op.matrix import determinant
from ..importer import onnx_dtype
from ..registry import converter
from . import shape_values as sv
from .common import dtype_of, iota, ndim_of, scalar, shape_of, static_int
from .strings import string_cast

_BINARY = {
    "Add": op.add, "Sub": op.subtract, "Mul": op.multiply,
    "Equal": op.equal, "Less": op.less, "Greater": op.greater,
    "LessOrEqual": op.less_equal, "GreaterOrEqual": op.greater_equal,
    "And": op.logical_and, "Or": op.logical_or,
}

_UNARY = {
    "Neg": op.negative, "Abs": op.abs, "Exp": op.exp, "Log": op.log, "Sqrt": op.sqrt,
    "Tanh": op.tanh, "Sigmoid": op.sigmoid, "Erf": op.erf, "Relu": op.relu, "Floor": op.floor,
    "Ceil": op.ceil, "Round": op.round, "Sin": op.sin, "Cos": op.cos, "Not": op.logical_not,
}


def _binary(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return fn(node.input(0), node.input(1))

    return convert


def _unary(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return fn(node.input(0))

    return convert


for _name, _fn in _BINARY.items():
    converter(_name, since=1)(_binary(_fn))
for _name, _fn in _UNARY.items():
    converter(_name, since=1)(_unary(_fn))


@converter("Div")
def div(ctx: Any, node: Any) -> Any:
    a, b = node.input(0), node.input(1)
    dt = dtype_of(a)
    if not dt.startswith(("int", "uint")):
        return op.divide(a, b)
    if dt.startswith("uint"):
        return op.floor_divide(a, b)
    # ONNX integer division truncates toward zero: the floor quotient, plus one where the
    # division is inexact and the operands' signs differ (exact at INT_MIN, whose absolute
    # value overflows; INT_MIN / -1 wraps as in numpy and onnxruntime, x / 0 is 0)
    zero = scalar(0, dt)
    q = op.floor_divide(a, b)
    inexact = op.not_equal(op.mod(a, b), zero)
    fix = op.logical_and(inexact, op.not_equal(op.less(a, zero), op.less(b, zero)))
    return op.where(fix, op.add(q, scalar(1, dt)), q)


@converter("Identity")
def identity(ctx: Any, node: Any) -> Any:
    sv.forward(ctx, node)
    return node.input(0)


@converter("Pow")
def pow_(ctx: Any, node: Any) -> Any:
    x, y = node.input(0), node.input(1)
    xt, yt = dtype_of(x), dtype_of(y)
    if yt != xt and not as_dtype(xt).is_float and as_dtype(yt).is_float:
        # an integer base to a float exponent: computed in float64 and truncated, as
        # onnxruntime and numpy do (3 ** 2.5 is 15, not 3 ** 2)
        wide = op.power(op.cast(x, "float64"), op.cast(y, "float64"))
        return op.cast(wide, xt)
    if yt != xt:
        y = op.cast(y, xt)
    return op.power(x, y)


@converter("Reciprocal")
def reciprocal(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.divide(scalar(1.0, dtype_of(x)), x)


def _fold(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        xs = [x for x in node.inputs() if x is not None]
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out

    return convert


converter("Max")(_fold(op.maximum))
converter("Min")(_fold(op.minimum))
converter("Sum")(_fold(op.add))


@converter("Mean")
def mean(ctx: Any, node: Any) -> Any:
    xs = [x for x in node.inputs() if x is not None]
    total = _fold(op.add)(ctx, node)
    return op.divide(total, scalar(len(xs), dtype_of(xs[0])))


@converter("LeakyRelu")
def leaky_relu(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    alpha = scalar(node.attr("alpha", 0.01), dtype_of(x))
    return op.where(op.less(x, scalar(0, dtype_of(x))), op.multiply(x, alpha), x)


#: 16-bit float dtypes whose composite activations (one ONNX node, several kiln ops) are
#: computed in float32 and rounded once: the node's output is of its type, its intermediates
#: are not (a 16-bit ``exp(x) - 1`` loses the small values Elu/Celu return near 0).
HALF_FLOATS = ("float16", "bfloat16")


def rounded_once(x: Any, build: Any) -> Any:
    """``build(x, dtype)`` for one ONNX node; for a 16-bit ``x`` computed on ``x`` cast to
    float32 (``dtype``: the dtype it computes in) and rounded back once."""
    dt = dtype_of(x)
    if dt not in HALF_FLOATS:
        return build(x, dt)
    return op.cast(build(op.cast(x, "float32"), "float32"), dt)


def expm1(x: Any, dt: str) -> Any:
    """``e ** x - 1`` of float ``x`` to within a few ulps where ``exp(x) - 1`` cancels (Kahan's
    formula: ``(u - 1) x / log(u)`` for ``u = exp(x)``, exactly ``x`` where ``u`` rounds to 1,
    -1 where ``u - 1`` does, inf where ``u`` overflows): Celu with a large ``alpha`` is
    ``alpha * expm1(x / alpha)``, whose argument is tiny -- ``exp - 1`` gave 0 where the value
    is ``x``."""
    one = scalar(1, dt)
    u = op.exp(x)
    um1 = op.subtract(u, one)
    kahan = op.where(op.equal(u, scalar(float("inf"), dt)), u,  # inf / inf would be NaN
                     op.divide(op.multiply(um1, x), op.log(u)))
    return op.where(op.equal(u, one), x,
                    op.where(op.equal(um1, scalar(-1, dt)), scalar(-1, dt), kahan))


def _elu(x: Any, alpha: float, dt: str) -> Any:
    neg = op.multiply(scalar(alpha, dt), expm1(x, dt))
    return op.where(op.greater(x, scalar(0, dt)), x, neg)


@converter("Elu")
def elu(ctx: Any, node: Any) -> Any:
    alpha = node.attr("alpha", 1.0)
    return rounded_once(node.input(0), lambda x, dt: _elu(x, alpha, dt))


@converter("Selu")
def selu(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    alpha = node.attr("alpha", 1.67326319217681884765625)
    return rounded_once(x, lambda v, dt: op.multiply(scalar(gamma, dt), _elu(v, alpha, dt)))


def _hard_sigmoid(x: Any, alpha: float, beta: float, dt: str) -> Any:
    lin = op.add(op.multiply(x, scalar(alpha, dt)), scalar(beta, dt))
    return op.clip(lin, 0.0, 1.0)


@converter("HardSigmoid")
def hard_sigmoid(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return _hard_sigmoid(x, node.attr("alpha", 0.2), node.attr("beta", 0.5), dtype_of(x))


@converter("HardSwish", since=14)
def hard_swish(ctx: Any, node: Any) -> Any:
    return rounded_once(node.input(0),
                        lambda x, dt: op.multiply(x, _hard_sigmoid(x, 1.0 / 6.0, 0.5, dt)))


@converter("Gelu", since=20)
def gelu(ctx: Any, node: Any) -> Any:
    return op.gelu(node.input(0), approximate=node.attr("approximate", "none"))


def log1p_small(e: Any, dt: str) -> Any:
    """``log(1 + e)`` for finite ``e >= 0`` to within a few ulps where ``1 + e`` rounds
    (Kahan's formula: ``log(u) e / (u - 1)`` for ``u = 1 + e``, exactly ``e`` where ``u`` rounds
    to 1)."""
    one = scalar(1, dt)
    u = op.add(e, one)
    return op.where(op.equal(u, one), e,
                    op.divide(op.multiply(op.log(u), e), op.subtract(u, one)))


def softplus_of(x: Any, dt: str) -> Any:
    """``log(1 + exp(x))`` as ``max(x, 0) + log1p(exp(-|x|))``: the same value, but ``exp``
    never overflows -- the plain form gave inf for every float32 x above 88.7 where the
    value is x (fuzz 3037945) -- nor does ``1 + exp(x)`` round away a small value (x = -20:
    2.1e-9, not 0). NaN stays NaN."""
    tail = log1p_small(op.exp(op.negative(op.abs(x))), dt)
    return op.add(op.maximum(x, scalar(0, dt)), tail)


@converter("Softplus")
def softplus(ctx: Any, node: Any) -> Any:
    return rounded_once(node.input(0), softplus_of)


def _bound(node: Any, i: int, dtype: str) -> Any:
    """Clip's bound ``i`` as a 0-d Expr of x's dtype (a constant when known at import, else the
    run-time input), or None when absent."""
    if not node.has_input(i):
        return None
    v = node.const_value(i)
    if v is not None:
        return g.const(np.asarray(v).reshape(()).astype(dtype))
    return op.reshape(node.input(i), ())


@converter("Clip", since=1)
def clip_v1(ctx: Any, node: Any) -> Any:
    return op.clip(node.input(0), node.attr("min", None), node.attr("max", None))


@converter("Clip", since=11)
def clip_v11(ctx: Any, node: Any) -> Any:
    # min(max(x, lo), hi): ONNX sets every value to ``max`` when min > max
    x = node.input(0)
    lo, hi = _bound(node, 1, dtype_of(x)), _bound(node, 2, dtype_of(x))
    out = x
    if lo is not None:
        out = op.maximum(out, lo)
    if hi is not None:
        out = op.minimum(out, hi)
    return out


def _onnx_cast(node: Any, dtype: str) -> Any:
    """Input 0 of a Cast/CastLike node converted to ``dtype``. float8/float4 targets follow
    ``saturate`` (default 1: out of range -> largest finite value) and, for float8e8m0,
    ``round_mode`` (default "up"); they are never folded with numpy, whose conversion (that of
    ml_dtypes) does not saturate, but converted by kiln's cast."""
    dt = as_dtype(dtype)
    if dt.is_string or dtype_of(node.input(0)) == "string":
        return string_cast(node, dtype)
    value = node.const_value(0)
    if not dt.is_minifloat:
        return value.astype(dtype) if value is not None else op.cast(node.input(0), dtype)
    saturate = int(node.attr("saturate", 1))
    if saturate not in (0, 1):
        raise node.error(f"saturate must be 0 or 1, got {saturate}")
    round_mode = str(node.attr("round_mode", "up")) if dt.minifloat.kind == "fnu" else None
    if round_mode not in (None, "nearest", "up", "down"):
        raise node.error(f"round_mode must be nearest, up or down, got {round_mode!r}")
    return op.cast(node.input(0), dtype, saturate=bool(saturate), round_mode=round_mode)


@converter("Cast")
def cast(ctx: Any, node: Any) -> Any:
    dtype = onnx_dtype(node.attr("to"), str(node))
    if dtype in ("int64", "int32"):
        sv.forward(ctx, node)
    return _onnx_cast(node, dtype)


@converter("CastLike", since=15)
def cast_like(ctx: Any, node: Any) -> Any:
    """Cast input 0 to the dtype of input 1 (``saturate`` only matters for float8 targets)."""
    dtype = dtype_of(node.input(1))
    x = node.input(0)
    if node.const_value(0) is None and dtype_of(x) == dtype:
        return x
    return _onnx_cast(node, dtype)


@converter("Mod", since=10)
def mod(ctx: Any, node: Any) -> Any:
    """``fmod=0``: floor modulo (sign of the divisor, like Python); ``fmod=1``: C ``fmod``
    (sign of the dividend). Floats: ``fmod(a, b) = sign(a) * mod(|a|, |b|)`` (exact: the floor
    modulo of non-negative operands is the truncated one). Integers: from the floor modulo
    ``r``, where a non-zero ``r`` has not the dividend's sign the truncated one is ``r - b``
    (exact, and safe for INT_MIN)."""
    a, b = node.input(0), node.input(1)
    dt = dtype_of(a)
    fmod = int(node.attr("fmod", 0))
    if fmod not in (0, 1):
        raise node.error(f"fmod must be 0 or 1, got {fmod}")
    if fmod == 0 or dt.startswith("uint"):
        return op.mod(a, b)
    zero = scalar(0, dt)
    if not dt.startswith("int"):
        m = op.mod(op.abs(a), op.abs(b))
        return op.where(op.less(a, zero), op.negative(m), m)
    r = op.mod(a, b)
    wrong_sign = op.logical_and(op.not_equal(r, zero),
                                op.not_equal(op.less(r, zero), op.less(a, zero)))
    return op.where(wrong_sign, op.subtract(r, b), r)


@converter("Where", since=9)
def where(ctx: Any, node: Any) -> Any:
    return op.where(node.input(0), node.input(1), node.input(2))


# =============================================================================================
# activations and math functions, decomposed into kiln ops (exact, fused into one kernel, and
# differentiable through the ops' own gradient rules)
# =============================================================================================
def _in_float64(ctx: Any, x: Any, fn: Any) -> Any:
    """``fn(ctx, x)`` evaluated in float64 and rounded back once: the closed forms below (asin
    via atan, sinh via exp, ...) cancel or round near some inputs, which float64 hides for every
    narrower float type. float64 inputs are computed as they are."""
    dt = dtype_of(x)
    if dt == "float64":
        return fn(ctx, x)
    return op.cast(fn(ctx, ctx.emit(op.cast(x, "float64"))), dt)


def _k64(value: float) -> Any:
    return scalar(value, "float64")


def _atan64(ctx: Any, x: Any) -> Any:
    """atan of a float64 tensor: ``|x| > 1`` maps to ``pi/2 - atan(1/|x|)``, then ``t >
    tan(pi/12)`` to ``pi/6 + atan((sqrt3 t - 1) / (sqrt3 + t))``, leaving ``|u| <= 0.268``
    where 13 terms of the Taylor series are exact to about 1e-16. Values used twice are
    emitted (a nested expression is a tree: sharing it unemitted would copy it)."""
    em = ctx.emit
    t = em(op.abs(x))
    inv = em(op.greater(t, _k64(1.0)))
    t = em(op.where(inv, op.divide(_k64(1.0), t), t))
    sqrt3 = math.sqrt(3.0)
    big = em(op.greater(t, _k64(2.0 - sqrt3)))  # tan(pi/12)
    u = em(op.where(big, op.divide(op.subtract(op.multiply(t, _k64(sqrt3)), _k64(1.0)),
                                   op.add(t, _k64(sqrt3))), t))
    u2 = em(op.multiply(u, u))
    poly = _k64(1.0 / 25.0)  # atan(u) = u sum_n (-1)^n u^2n / (2n + 1), n <= 12 (Horner)
    for n in range(11, -1, -1):
        poly = op.add(op.multiply(poly, u2), _k64((-1.0) ** n / (2 * n + 1)))
    r = em(op.multiply(u, poly))
    r = em(op.where(big, op.add(r, _k64(math.pi / 6)), r))
    r = em(op.where(inv, op.subtract(_k64(math.pi / 2), r), r))
    return op.where(op.less(x, _k64(0.0)), op.negative(r), r)


def _asin64(ctx: Any, x: Any) -> Any:
    q = ctx.emit(op.divide(x, op.sqrt(op.subtract(_k64(1.0), op.multiply(x, x)))))
    return _atan64(ctx, q)


def _acos64(ctx: Any, x: Any) -> Any:
    one = _k64(1.0)
    q = ctx.emit(op.sqrt(op.divide(op.subtract(one, x), op.add(one, x))))
    return op.multiply(_k64(2.0), _atan64(ctx, q))


def _sinh64(ctx: Any, x: Any) -> Any:
    return op.multiply(_k64(0.5), op.subtract(op.exp(x), op.exp(op.negative(x))))


def _cosh64(ctx: Any, x: Any) -> Any:
    return op.multiply(_k64(0.5), op.add(op.exp(x), op.exp(op.negative(x))))


def _asinh64(ctx: Any, x: Any) -> Any:
    # odd, evaluated on |x| so that log(t + sqrt(t^2 + 1)) does not cancel for negative x
    t = ctx.emit(op.abs(x))
    r = ctx.emit(op.log(op.add(t, op.sqrt(op.add(op.multiply(t, t), _k64(1.0))))))
    return op.where(op.less(x, _k64(0.0)), op.negative(r), r)


def _acosh64(ctx: Any, x: Any) -> Any:
    return op.log(op.add(x, op.sqrt(op.subtract(op.multiply(x, x), _k64(1.0)))))


def _atanh64(ctx: Any, x: Any) -> Any:
    one = _k64(1.0)
    return op.multiply(_k64(0.5), op.log(op.divide(op.add(one, x), op.subtract(one, x))))


def _tan64(ctx: Any, x: Any) -> Any:
    return op.divide(op.sin(x), op.cos(x))


_FLOAT64_MATH = {
    "Tan": _tan64, "Atan": _atan64, "Asin": _asin64, "Acos": _acos64, "Sinh": _sinh64,
    "Cosh": _cosh64, "Asinh": _asinh64, "Acosh": _acosh64, "Atanh": _atanh64,
}


def _math(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        if not dtype_of(x).startswith(("float", "bfloat")):
            raise node.error(f"expects a float tensor, got {dtype_of(x)}")
        return _in_float64(ctx, x, fn)

    return convert


for _name, _fn in _FLOAT64_MATH.items():
    converter(_name, since=7 if _name in ("Tan", "Atan", "Asin", "Acos") else 9)(_math(_fn))


@converter("Sign", since=9)
def sign(ctx: Any, node: Any) -> Any:
    """1 / -1 / the input itself (0, -0 or NaN, as numpy ``sign``)."""
    x = node.input(0)
    dt = dtype_of(x)
    zero, one = scalar(0, dt), scalar(1, dt)
    pos = op.where(op.greater(x, zero), one, x)
    if dt.startswith(("uint", "bool")):
        return pos
    return op.where(op.less(x, zero), scalar(-1, dt), pos)


@converter("Softsign")
def softsign(ctx: Any, node: Any) -> Any:
    return rounded_once(node.input(0),
                        lambda x, dt: op.divide(x, op.add(scalar(1, dt), op.abs(x))))


@converter("ThresholdedRelu", since=10)
def thresholded_relu(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    dt = dtype_of(x)
    return op.where(op.greater(x, scalar(node.attr("alpha", 1.0), dt)), x, scalar(0, dt))


@converter("Celu", since=12)
def celu(ctx: Any, node: Any) -> Any:
    """``max(0, x) + min(0, alpha (exp(x / alpha) - 1))``."""
    x = node.input(0)
    alpha = node.attr("alpha", 1.0)
    if alpha == 0:
        raise node.error("alpha must not be 0")
    return rounded_once(x, lambda v, dt: _celu(v, alpha, dt))


def _celu(x: Any, alpha: float, dt: str) -> Any:
    zero = scalar(0, dt)
    neg = op.multiply(scalar(alpha, dt), expm1(op.divide(x, scalar(alpha, dt)), dt))
    return op.add(op.maximum(x, zero), op.minimum(neg, zero))


@converter("Shrink", since=9)
def shrink(ctx: Any, node: Any) -> Any:
    """``x + bias`` below ``-lambd``, ``x - bias`` above ``lambd``, else 0. Integer inputs
    compare against the tightest integer bounds (``x < -0.5`` is ``x < 0``)."""
    x = node.input(0)
    dt = dtype_of(x)
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
    if dt.startswith(("int", "uint")):
        if bias != int(bias):
            raise node.error(f"bias {bias} is not an integer for a {dt} input")
        lo, hi, bias_c = math.ceil(-lambd), math.floor(lambd), scalar(int(bias), dt)
        below = op.less(x, scalar(lo, dt)) if lo > 0 or not dt.startswith("uint") else None
    else:
        lo, hi, bias_c = -lambd, lambd, scalar(bias, dt)
        below = op.less(x, scalar(lo, dt))
    zero = scalar(0, dt)
    out = op.where(op.greater(x, scalar(hi, dt)), op.subtract(x, bias_c), zero)
    if below is not None:
        out = op.where(below, op.add(x, bias_c), out)
    return out


def _swish(x: Any, alpha: float) -> Any:
    if alpha == 1.0:
        return op.silu(x)
    return op.multiply(x, op.sigmoid(op.multiply(x, scalar(alpha, dtype_of(x)))))


@converter("Swish", since=24)
def swish(ctx: Any, node: Any) -> Any:
    return _swish(node.input(0), float(node.attr("alpha", 1.0)))


@converter("SwiGLU", since=28)
def swiglu(ctx: Any, node: Any) -> Any:
    """``Swish_alpha(A) * B`` (A and B have the same shape; no broadcasting in ONNX)."""
    return op.multiply(_swish(node.input(0), float(node.attr("alpha", 1.0))), node.input(1))


@converter("Mish", since=18)
def mish(ctx: Any, node: Any) -> Any:
    """``x tanh(softplus(x))`` (:func:`softplus_of`: a small softplus of a negative x is
    kept, not rounded to 0)."""
    def build(x: Any, dt: str) -> Any:
        return op.multiply(x, op.tanh(softplus_of(x, dt)))

    return rounded_once(node.input(0), build)


@converter("PRelu", since=7)
def prelu(ctx: Any, node: Any) -> Any:
    x, slope = node.input(0), node.input(1)
    dt = dtype_of(x)
    return op.where(op.less(x, scalar(0, dt)), op.multiply(x, slope), x)


@converter("PRelu", since=1)
def prelu_v1(ctx: Any, node: Any) -> Any:
    """Before opset 7 a 1-d slope of length C applies per channel (axis 1), not along the
    last axis as numpy broadcasting would have it."""
    x, slope = node.input(0), node.input(1)
    xs, ss = shape_of(x), shape_of(slope)
    if len(ss) == 1 and len(xs) > 2 and static_int(ss[0]) not in (None, 1):
        slope = op.reshape(slope, (ss[0],) + (1,) * (len(xs) - 2))
    dt = dtype_of(x)
    return op.where(op.less(x, scalar(0, dt)), op.multiply(x, slope), x)


@converter("Xor")
def xor(ctx: Any, node: Any) -> Any:
    return op.not_equal(node.input(0), node.input(1))


@converter("IsNaN", since=9)
def isnan(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.not_equal(x, x)  # the IEEE definition (kiln never compiles with -ffast-math)


@converter("IsInf", since=10)
def isinf(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    dt = dtype_of(x)
    pos, neg = int(node.attr("detect_positive", 1)), int(node.attr("detect_negative", 1))
    inf = scalar(np.inf, dt)
    if pos and neg:
        return op.equal(op.abs(x), inf)
    if pos:
        return op.equal(x, inf)
    if neg:
        return op.equal(x, op.negative(inf))
    return op.less(op.abs(x), scalar(-1, dt))  # detects nothing: all False


# =============================================================================================
# integer bit operations
# =============================================================================================
_BITWISE = {"BitwiseAnd": op.bitwise_and, "BitwiseOr": op.bitwise_or,
            "BitwiseXor": op.bitwise_xor}
for _name, _fn in _BITWISE.items():
    converter(_name, since=18)(_binary(_fn))


@converter("BitwiseNot", since=18)
def bitwise_not(ctx: Any, node: Any) -> Any:
    """``~x`` (bool: logical NOT)."""
    x = node.input(0)
    dt = dtype_of(x)
    if dt != "bool" and not dt.startswith(("int", "uint")):
        raise node.error(f"expects an integer tensor, got {dt}")
    return op.bitwise_not(x)


@converter("BitShift", since=11)
def bit_shift(ctx: Any, node: Any) -> Any:
    """``x << y`` / ``x >> y`` with kiln's shift ops, whose results for amounts outside
    ``[0, bits)`` are ONNX's (numpy's): 0, or the sign fill (-1 for a right shift of a negative
    value). Right shifts of signed types are arithmetic. ONNX lists unsigned types only; the
    signed ones are accepted with numpy's semantics."""
    x, y = node.input(0), node.input(1)
    dt = dtype_of(x)
    if not dt.startswith(("int", "uint")) or dtype_of(y) != dt:
        raise node.error(f"expects two tensors of one integer dtype, got {dt} and {dtype_of(y)}")
    direction = node.attr("direction", "")
    if direction not in ("LEFT", "RIGHT"):
        raise node.error(f"direction must be 'LEFT' or 'RIGHT', got {direction!r}")
    return (op.left_shift if direction == "LEFT" else op.right_shift)(x, y)


# =============================================================================================
# matrices built from indices
# =============================================================================================
def _static_dims(node: Any, x: Any, what: str) -> list[int]:
    dims = [static_int(d) for d in shape_of(x)]
    if any(d is None for d in dims):
        raise node.error(f"{what} needs static dimensions, got shape {shape_of(x)}")
    return [int(d) for d in dims]


@converter("Trilu", since=14)
def trilu(ctx: Any, node: Any) -> Any:
    """Keep ``j - i >= k`` (upper) or ``j - i <= k`` (lower) of the last two axes, zero the
    rest: ``where(mask, x, 0)`` with the diagonal index ``j - i`` made from two small constant
    ranges (fused, never materialized). ``k`` may be a run-time 0-d tensor."""
    x = node.input(0)
    if ndim_of(x) < 2:
        raise node.error(f"expects a tensor of rank >= 2, got rank {ndim_of(x)}")
    n, m = _static_dims(node, x, "Trilu")[-2:]
    # iota: a declared 2**31-long axis is a run-time range, not a 16 GiB constant (fuzz 3038811)
    diag = op.subtract(op.reshape(iota(m, "int64"), (1, m)),
                       op.reshape(iota(n, "int64"), (n, 1)))
    k_const = node.const_value(1)
    if k_const is not None:
        k = scalar(int(np.asarray(k_const).reshape(())), "int64")
    elif node.has_input(1):
        k = node.input(1)
        k = op.reshape(k if dtype_of(k) == "int64" else op.cast(k, "int64"), ())
    else:
        k = scalar(0, "int64")
    keep = op.greater_equal(diag, k) if int(node.attr("upper", 1)) else op.less_equal(diag, k)
    return op.where(keep, x, scalar(0, dtype_of(x)))


@converter("EyeLike", since=9)
def eye_like(ctx: Any, node: Any) -> Any:
    """Ones on diagonal ``k`` of a 2-D tensor shaped like the input: a constant."""
    x = node.input(0)
    if ndim_of(x) != 2:
        raise node.error(f"expects a 2-D tensor, got rank {ndim_of(x)}")
    n, m = _static_dims(node, x, "EyeLike")
    dt = onnx_dtype(node.attr("dtype"), str(node)) if "dtype" in node.attrs else dtype_of(x)
    return np.eye(n, m, k=int(node.attr("k", 0)), dtype=dt)


@converter("Binarizer", domain="ai.onnx.ml")
def binarizer(ctx: Any, node: Any) -> Any:
    """1 where ``x > threshold``, else 0, in the input dtype."""
    x = node.input(0)
    dt = dtype_of(x)
    cond = op.greater(x, scalar(node.attr("threshold", 0.0), dt))
    return op.where(cond, scalar(1, dt), scalar(0, dt))


#: Up to this order a determinant is the Leibniz formula; above, an LU factorization.
_DET_MAX = 4


@converter("Det", since=11)
def det(ctx: Any, node: Any) -> Any:
    """Determinants of the trailing ``n x n`` matrices: by the Leibniz formula (``n! `` products
    of ``n`` entries, each entry gathered once) for the small matrices models use (exact and
    fused), else from an LU factorization with partial pivoting (``kiln.op.matrix``)."""
    x = node.input(0)
    if ndim_of(x) < 2:
        raise node.error(f"expects a tensor of rank >= 2, got rank {ndim_of(x)}")
    n, m = [static_int(d) for d in shape_of(x)[-2:]]
    if n is None or n != m:
        raise node.error(f"expects square trailing matrices, got shape {shape_of(x)}")
    if n > _DET_MAX:
        return determinant(ctx.emit, x, n)
    if n == 0:
        return op.add(op.multiply(op.sum(x, axis=(-2, -1)), scalar(0, dtype_of(x))),
                      scalar(1, dtype_of(x)))
    flat = ctx.emit(op.reshape(x, (*shape_of(x)[:-2], n * n)))
    entry = {(i, j): ctx.emit(op.take(flat, g.const(np.array(i * n + j, "int64")), axis=-1))
             for i in range(n) for j in range(n)}
    total = None
    for perm in itertools.permutations(range(n)):
        inversions = sum(perm[a] > perm[b] for a in range(n) for b in range(a + 1, n))
        term = entry[0, perm[0]]
        for i in range(1, n):
            term = op.multiply(term, entry[i, perm[i]])
        if total is None:
            total = term if inversions % 2 == 0 else op.negative(term)
        else:
            total = op.add(total, term) if inversions % 2 == 0 else op.subtract(total, term)
    return total


@converter("BitCast", since=26)
def bit_cast(ctx: Any, node: Any) -> Any:
    """Reinterpret the bits as another type of the same width (numpy ``view``). Between
    integer (and bool) types this is a modular ``cast`` (two's complement, and fuses like any
    cast); float bits go through kiln's ``reinterpret`` op (constants fold at import)."""
    x = node.input(0)
    src, dst = dtype_of(x), onnx_dtype(node.attr("to"), str(node))
    if np.dtype(src).itemsize != np.dtype(dst).itemsize:
        raise node.error(f"{src} and {dst} differ in width")
    value = node.const_value(0)
    if value is not None:
        return np.ascontiguousarray(value).view(dst)
    if src == dst:
        return x
    if all(np.dtype(t).kind in "biu" for t in (src, dst)):
        return op.cast(x, dst)
    if "bool" in (src, dst):  # a float's bits as bool have no defined value
        raise node.error(f"reinterpreting {src} as {dst} is not defined")
    return op.reinterpret(x, dst)
