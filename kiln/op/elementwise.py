"""Element-wise operators: arithmetic, math, comparisons, logic, activations, cast, where.

Every operator here is one :func:`~kiln.op.registry.register_op` declaration made through a small
factory (:func:`declare_unary`, :func:`_binary`), so adding a unary math function is one line
plus its scalar expression. Semantics follow numpy, with these deliberate choices:

- Binary operators broadcast like numpy (dimensions are right-aligned; a dimension of 1
  stretches). Both operands must have the same dtype: kiln never promotes implicitly, frontends
  insert ``cast`` where the source framework would promote.
- ``divide`` is true division for floats. For integers it is *floor* division (numpy ``//``),
  the same as ``floor_divide``; ``mod`` is the floor modulo (sign of the divisor, numpy
  ``np.mod``). Integer division or modulo by zero gives 0 instead of trapping, and
  ``INT_MIN // -1`` wraps like numpy.
- ``round`` rounds half to even (numpy, ONNX). Math functions on float16/bfloat16 are evaluated
  in float32 and rounded back once.
- Comparisons and logical operators return ``bool``; logical operators take ``bool`` inputs.

The inference helpers every family uses (``tensor_arg``, ``broadcast_shape``,
``tensor_sinfo``...) are in :mod:`kiln.op.common`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes

from .. import te
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    arg_ndim,
    arg_shape,
    broadcast_assumptions,
    broadcast_load,
    broadcast_sinfo,
    scalar,
    te_broadcast_shape,
    tensor_arg,
    tensor_sinfo,
)
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpDef, OpPattern, register_op
from .shape import unbroadcast

__all__ = [
    # binary arithmetic
    "add", "subtract", "multiply", "divide", "floor_divide", "mod", "maximum", "minimum", "power",
    # comparisons and logic
    "equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
    "logical_and", "logical_or", "logical_not",
    # unary math
    "negative", "abs", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "floor", "ceil",
    "round", "sin", "cos",
    # activations and others
    "relu", "gelu", "silu", "clip", "cast", "where",
    # bitwise
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "left_shift", "right_shift",
    "reinterpret",
]


# =============================================================================================
# checks and te helpers of the element-wise ops
# =============================================================================================
def _same_dtype(op: str, infos: Sequence[Any], names: Sequence[str]) -> DataType:
    first = as_dtype(infos[0].dtype)
    for s, n in zip(infos[1:], names[1:]):
        if as_dtype(s.dtype) != first:
            raise StructInfoError(
                f"{op}: {names[0]} has dtype {first} but {n} has dtype {s.dtype}; "
                "insert a cast to make them agree"
            )
    return first


def with_float32(fn: Callable[[PrimExpr], PrimExpr]) -> Callable[[PrimExpr], PrimExpr]:
    """Evaluate ``fn`` in float32 for float16/bfloat16 inputs (one rounding at the end)."""

    def wrapped(x: PrimExpr) -> PrimExpr:
        if x.dtype.is_float and x.dtype.bits < 32:
            return tx.cast(x.dtype, fn(tx.cast("float32", x)))
        return fn(x)

    return wrapped


# =============================================================================================
# factories
# =============================================================================================
_KINDS = {
    "any": (lambda d: not d.is_handle, "a tensor"),
    "numeric": (lambda d: d.is_float or d.is_integer, "a numeric (float or integer) tensor"),
    "float": (lambda d: d.is_float, "a float tensor"),
    "bool": (lambda d: d.is_bool, "a bool tensor"),
    "bits": (lambda d: d.is_integer or d.is_bool, "an integer or bool tensor"),
    "int": (lambda d: d.is_integer, "an integer tensor"),
}


def _check_kind(op: str, arg: str, sinfo: Any, kind: str) -> None:
    ok, what = _KINDS[kind]
    if not ok(as_dtype(sinfo.dtype)):
        raise StructInfoError(f"{op}: {arg} must be {what}, got dtype {sinfo.dtype}")


def declare_unary(
    name: str,
    scalar: Callable[..., PrimExpr],
    *,
    kind: str = "float",
    out_dtype: str | Callable[[Any], str] | None = None,
    attrs: type | None = None,
    mixed_precision: MixedPrecision = MixedPrecision.FOLLOW,
    gradient: Any = None,
    doc: str,
) -> OpDef:
    """Declare a one-input element-wise op whose value is ``scalar(x_elem[, attrs])``."""

    def infer(call: Any) -> Any:
        x = tensor_arg(call, 0, name, "x")
        _check_kind(name, "x", x, kind)
        shape = arg_shape(x)
        dtype = out_dtype(call.attrs) if callable(out_dtype) else out_dtype or x.dtype
        return tensor_sinfo(shape, dtype, ndim=arg_ndim(x))

    def compute(x: te.Tensor, attrs: Any = None) -> te.Tensor:
        if attrs is None:
            return te.compute(x.shape, lambda *i: scalar(x(*i)), name=name)
        return te.compute(x.shape, lambda *i: scalar(x(*i), attrs), name=name)

    return register_op(
        name,
        inputs=("x",),
        infer=infer,
        pattern=OpPattern.ELEMWISE,
        attrs=attrs,
        compute=compute,
        mixed_precision=mixed_precision,
        gradient=gradient,
        doc=doc,
    )


def _binary(
    name: str,
    scalar: Callable[[PrimExpr, PrimExpr], PrimExpr],
    *,
    kind: str = "numeric",
    out_dtype: str | None = None,
    attrs: type | None = None,
    mixed_precision: MixedPrecision = MixedPrecision.FOLLOW,
    gradient: Any = None,
    doc: str,
) -> OpDef:
    """Declare a two-input broadcasting op whose value is ``scalar(lhs_elem, rhs_elem)``
    (``scalar(lhs_elem, rhs_elem, attrs)`` for an op with ``attrs``)."""
    names = ("lhs", "rhs")

    def infer(call: Any) -> Any:
        infos = [tensor_arg(call, i, name, n) for i, n in enumerate(names)]
        for s, n in zip(infos, names):
            _check_kind(name, n, s, kind)
        dtype = _same_dtype(name, infos, names)
        return broadcast_sinfo(call, name, names, out_dtype or dtype)

    def compute(lhs: te.Tensor, rhs: te.Tensor, attrs: Any = None) -> te.Tensor:
        shape = te_broadcast_shape(name, (lhs, rhs))
        extra = () if attrs is None else (attrs,)
        return te.compute(
            shape,
            lambda *i: scalar(broadcast_load(lhs, i, shape), broadcast_load(rhs, i, shape),
                              *extra),
            name=name,
            attrs=broadcast_assumptions(name, (lhs.shape, rhs.shape), names, shape),
        )

    return register_op(
        name,
        inputs=names,
        infer=infer,
        pattern=OpPattern.BROADCAST,
        attrs=attrs,
        compute=compute,
        mixed_precision=mixed_precision,
        gradient=gradient,
        doc=doc,
    )


#: the two-input factory, for op families declared in other modules (kiln.op.special)
declare_binary = _binary


# =============================================================================================
# scalar semantics
# =============================================================================================
def _safe_int_divisor(b: PrimExpr) -> tuple[PrimExpr, PrimExpr]:
    """(divisor that never traps, the condition b == 0).

    x86 traps on division by zero and on INT_MIN / -1; both are replaced by a divisor of 1 and
    the caller patches the result (0 for b == 0, -a for b == -1).
    """
    is_zero = tx.eq(b, 0)
    bad = tx.logical_or(is_zero, tx.eq(b, -1)) if b.dtype.is_int else is_zero
    return tx.select(bad, tx.const(b.dtype, 1), b), is_zero


def _floor_div_scalar(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if a.dtype.is_float:
        if a.dtype.bits < 32:
            return tx.cast(a.dtype, tx.floor(a.astype("float32") / b.astype("float32")))
        return tx.floor(a / b)
    safe, is_zero = _safe_int_divisor(b)
    q = tx.floordiv(a, safe)
    if a.dtype.is_int:  # a // -1 == -a, wrapping at INT_MIN like numpy
        q = tx.select(tx.eq(b, -1), tx.const(a.dtype, 0) - a, q)
    return tx.select(is_zero, tx.const(a.dtype, 0), q)


def _divide_scalar(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if a.dtype.is_float:
        return a / b
    return _floor_div_scalar(a, b)


def _float_floor_mod(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """numpy's float ``np.mod``: C ``fmod`` (exact) moved into the divisor's sign. Unlike
    ``a - floor(a / b) * b`` it is exact and keeps numpy's corners: ``-3 mod inf == inf``,
    ``3 mod inf == 3``, ``x mod 0``/``inf mod x`` are NaN."""
    r = tx.fmod(a, b)
    zero = tx.const(a.dtype, 0)
    fix = tx.logical_and(tx.ne(r, zero), tx.ne(tx.lt(r, zero), tx.lt(b, zero)))
    return tx.select(fix, r + b, r)


def _mod_scalar(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if a.dtype.is_float:
        if a.dtype.bits < 32:
            return tx.cast(a.dtype, _float_floor_mod(a.astype("float32"), b.astype("float32")))
        return _float_floor_mod(a, b)
    safe, _ = _safe_int_divisor(b)
    return tx.floormod(a, safe)  # x % 1 == 0 also covers b == 0 and b == -1 (numpy gives 0)


def _bitwise_scalar(kind: str) -> Callable[[PrimExpr, PrimExpr], PrimExpr]:
    """Bitwise AND / OR / XOR of two integers (bool: the logical ones): one TIR bit node, one
    instruction once compiled (and one vector instruction in vectorized loops)."""
    return {"and": tx.bitwise_and, "or": tx.bitwise_or, "xor": tx.bitwise_xor}[kind]


def _power_scalar(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if a.dtype.is_float:
        if a.dtype.bits < 32:
            return tx.cast(a.dtype, tx.pow(a.astype("float32"), b.astype("float32")))
        return tx.pow(a, b)
    # integers: exact through float64 for results below 2**53; negative exponents give 0
    # (numpy raises), matching integer truncation of the real result for |a| > 1.
    r = tx.round(tx.pow(a.astype("float64"), b.astype("float64")))
    return tx.cast(a.dtype, r)


def round_half_even(x: PrimExpr) -> PrimExpr:
    """``x`` (a float) rounded to the nearest integer, ties to even (numpy ``rint``)."""
    f = tx.floor(x)
    d = x - f
    half = tx.const(x.dtype, 0.5)
    one = tx.const(x.dtype, 1.0)
    two = tx.const(x.dtype, 2.0)
    f_is_odd = tx.ne(f - two * tx.floor(f / two), tx.const(x.dtype, 0.0))
    up = tx.logical_or(d > half, tx.logical_and(tx.eq(d, half), f_is_odd))
    return tx.select(up, f + one, f)


def _negative(x: PrimExpr) -> PrimExpr:
    return tx.const(x.dtype, 0) - x


def _relu(x: PrimExpr) -> PrimExpr:
    return tx.max(x, tx.const(x.dtype, 0))


def _sigmoid(x: PrimExpr) -> PrimExpr:
    return tx.sigmoid(x)


_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


@dataclass(frozen=True)
class GeluAttrs:
    """``approximate``: "none" (exact, with erf) or "tanh" (the tanh approximation)."""

    approximate: str = "none"

    def __post_init__(self):
        if self.approximate not in ("none", "tanh"):
            raise KilnError(
                f"gelu: approximate must be 'none' or 'tanh', got {self.approximate!r}"
            )


def _gelu(x: PrimExpr, attrs: GeluAttrs) -> PrimExpr:
    def f(v: PrimExpr) -> PrimExpr:
        c = lambda value: tx.const(v.dtype, value)  # noqa: E731
        if attrs.approximate == "tanh":
            inner = c(_SQRT_2_OVER_PI) * (v + c(0.044715) * v * v * v)
            return c(0.5) * v * (c(1.0) + tx.tanh(inner))
        return c(0.5) * v * (c(1.0) + tx.erf(v * c(_SQRT_HALF)))

    return with_float32(f)(x)


def _silu(x: PrimExpr) -> PrimExpr:
    return with_float32(lambda v: v * tx.sigmoid(v))(x)


@dataclass(frozen=True)
class ClipAttrs:
    """Bounds of ``clip``; ``None`` leaves that side open."""

    min: float | None = None
    max: float | None = None

    def __post_init__(self):
        for n in ("min", "max"):
            v = getattr(self, n)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise KilnError(f"clip: {n} must be a number or None, got {v!r}")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise KilnError(f"clip: min {self.min} is greater than max {self.max}")


def _clip_bound(dtype: DataType, value: float, lower: bool) -> PrimExpr:
    if dtype.is_float:
        return tx.const(dtype, value)
    # integer tensors: the tightest integer bound, saturated to the dtype's range
    v = math.ceil(value) if lower else math.floor(value)
    v = min(max(v, dtype.min_value()), dtype.max_value())
    return tx.const(dtype, v)


def _clip(x: PrimExpr, attrs: ClipAttrs) -> PrimExpr:
    if attrs.max is not None:
        x = tx.min(x, _clip_bound(x.dtype, attrs.max, lower=False))
    if attrs.min is not None:
        x = tx.max(x, _clip_bound(x.dtype, attrs.min, lower=True))
    return x


@dataclass(frozen=True)
class CastAttrs:
    """``dtype``: the target data type (normalized to its string form).

    For float8/float6/float4 targets (ONNX Cast-19+): ``saturate`` makes out-of-range values
    and +-Inf the largest finite value (default False: ``ml_dtypes``' conversion, where they
    become Inf or NaN as the format allows); ``round_mode`` ("nearest", "up", "down"; None:
    ``ml_dtypes``' conversion) applies to ``float8_e8m0fnu`` only, which then follows ONNX
    (the sign is ignored, 0 -> 2^-127).
    """

    dtype: str
    saturate: bool = False
    round_mode: str | None = None

    def __post_init__(self):
        try:
            dt = as_dtype(self.dtype)
        except (DTypeError, TypeError, ValueError) as err:
            raise KilnError(f"cast: bad dtype {self.dtype!r}: {err}") from err
        if dt.lanes != 1 or dt.is_handle:
            raise KilnError(f"cast: dtype must be a scalar tensor type, got {dt}")
        if self.round_mode not in (None, "nearest", "up", "down"):
            raise KilnError(f"cast: round_mode must be nearest, up or down, got "
                            f"{self.round_mode!r}")
        object.__setattr__(self, "dtype", str(dt))
        object.__setattr__(self, "saturate", bool(self.saturate))


def _minifloat_limit(dt: DataType) -> float:
    """The largest finite value of a float8/float6/float4 type."""
    return float(ml_dtypes.finfo(dt.to_numpy()).max)


def _cast_e8m0(x: PrimExpr, attrs: CastAttrs) -> PrimExpr:
    """ONNX's cast to float8_e8m0fnu (a power of two): from the nearest power of two that the
    plain conversion gives, one step down or up where it is above/below ``|x|``."""
    dt, f32 = as_dtype(attrs.dtype), DataType("float32")
    a = tx.call_intrin("fabs", tx.cast(f32, x))
    if attrs.saturate or attrs.round_mode == "down":  # finite values stop at 2^127; Inf: NaN
        a = tx.select(tx.call_intrin("isinf", a), a, tx.min(a, tx.const(f32, 2.0**127)))
    p = tx.cast(f32, tx.cast(dt, a))
    if attrs.round_mode == "up":
        p = tx.select(tx.lt(p, a), p * tx.const(f32, 2.0), p)
    elif attrs.round_mode == "down":
        p = tx.select(tx.gt(p, a), p * tx.const(f32, 0.5), p)
    p = tx.select(tx.eq(a, tx.const(f32, 0.0)), tx.const(f32, 2.0**-127), p)
    return tx.cast(dt, p)


def _cast(x: PrimExpr, attrs: CastAttrs) -> PrimExpr:
    dt = as_dtype(attrs.dtype)
    if dt.is_bool and not x.dtype.is_bool:
        return tx.ne(x, tx.const(x.dtype, 0))
    if dt.is_minifloat and dt.minifloat.kind == "fnu" and attrs.round_mode is not None:
        return _cast_e8m0(x, attrs)
    if dt.is_minifloat and attrs.saturate and x.dtype != dt:
        if not x.dtype.is_float or x.dtype.is_minifloat:  # the limit is exact in float32
            x = tx.cast(DataType("float32"), x)
        limit = _minifloat_limit(dt)  # min/max keep NaN (see kiln.codegen.c.expr)
        x = tx.max(tx.min(x, tx.const(x.dtype, limit)), tx.const(x.dtype, -limit))
    return tx.cast(dt, x)


# =============================================================================================
# gradient rules (signature in kiln.op.registry). ``call`` inside a returned expression means
# the forward result; non-float inputs get no gradient.
# =============================================================================================
def _is_float(x: Any) -> bool:
    return as_dtype(x.struct_info.dtype).is_float


def _k(value: float, like: Any) -> Any:
    """A 0-d constant of ``like``'s dtype."""
    return scalar(value, like.struct_info.dtype)


def _unary_grad(fn: Callable[[Any, Any, Any], Any]) -> Callable[..., list[Any]]:
    """A rule from ``fn(call, x, g) -> adjoint of x`` (None: no gradient)."""

    def rule(call: Any, output_grad: Any, bb: Any) -> list[Any]:
        x = call.args[0]
        return [fn(call, x, output_grad) if _is_float(x) else None]

    rule.__doc__ = fn.__doc__
    return rule


def _binary_grad(fn: Callable[[Any, Any, Any, Any], tuple[Any, Any]]) -> Callable[..., list]:
    """A rule from ``fn(call, lhs, rhs, g) -> (d lhs, d rhs)`` shaped like the result; each is
    summed down to its input's shape where that input was broadcast."""

    def rule(call: Any, output_grad: Any, bb: Any) -> list[Any]:
        a, b = call.args
        grads = fn(call, a, b, output_grad)
        return [None if d is None or not _is_float(x) else unbroadcast(d, call.struct_info, x)
                for x, d in zip((a, b), grads)]

    rule.__doc__ = fn.__doc__
    return rule


def _masked_grad(cond: Any, g: Any) -> Any:
    """``g`` where ``cond`` holds, else 0."""
    return where(cond, g, _k(0, g))


_add_grad = _binary_grad(lambda c, a, b, g: (g, g))
_subtract_grad = _binary_grad(lambda c, a, b, g: (g, negative(g)))
_multiply_grad = _binary_grad(lambda c, a, b, g: (multiply(g, b), multiply(g, a)))
# d(a/b)/db = -a/b^2 = -(a/b)/b
_divide_grad = _binary_grad(
    lambda c, a, b, g: (divide(g, b), negative(multiply(g, divide(c, b)))))
# a mod b = a - floor(a/b) b; floor is piecewise constant
_mod_grad = _binary_grad(lambda c, a, b, g: (g, negative(multiply(g, floor_divide(a, b)))))
_floor_divide_grad = _binary_grad(lambda c, a, b, g: (None, None))
# ties go to lhs (as in max(a, b) = a when a >= b)
_maximum_grad = _binary_grad(lambda c, a, b, g: (
    _masked_grad(greater_equal(a, b), g), _masked_grad(less(a, b), g)))
_minimum_grad = _binary_grad(lambda c, a, b, g: (
    _masked_grad(less_equal(a, b), g), _masked_grad(greater(a, b), g)))
# d(a^b)/da = b a^(b-1); d(a^b)/db = a^b log(a)
_power_grad = _binary_grad(lambda c, a, b, g: (
    multiply(g, multiply(b, power(a, subtract(b, _k(1, b))))),
    multiply(g, multiply(c, log(a)))))


def _where_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    cond, x, y = call.args
    zero = _k(0, output_grad)
    dx = unbroadcast(where(cond, output_grad, zero), call.struct_info, x)
    dy = unbroadcast(where(cond, zero, output_grad), call.struct_info, y)
    return [None, dx if _is_float(x) else None, dy if _is_float(y) else None]


def _gelu_grad_fn(call: Any, x: Any, g: Any) -> Any:
    """Exact: Phi(x) + x phi(x); tanh form: 0.5 (1 + t) + 0.5 x (1 - t^2) u'(x)."""
    approx = (call.attrs or GeluAttrs()).approximate
    if approx == "tanh":
        x2 = multiply(x, x)
        u = multiply(_k(_SQRT_2_OVER_PI, x), add(x, multiply(_k(0.044715, x), multiply(x2, x))))
        t = tanh(u)
        du = multiply(_k(_SQRT_2_OVER_PI, x), add(_k(1, x), multiply(_k(3 * 0.044715, x), x2)))
        d = add(multiply(_k(0.5, x), add(_k(1, x), t)),
                multiply(multiply(_k(0.5, x), x),
                         multiply(subtract(_k(1, x), multiply(t, t)), du)))
        return multiply(g, d)
    cdf = multiply(_k(0.5, x), add(_k(1, x), erf(multiply(x, _k(_SQRT_HALF, x)))))
    pdf = multiply(_k(1 / math.sqrt(2 * math.pi), x),
                   exp(multiply(_k(-0.5, x), multiply(x, x))))
    return multiply(g, add(cdf, multiply(x, pdf)))


def _silu_grad_fn(call: Any, x: Any, g: Any) -> Any:
    """s (1 + x (1 - s)) with s = sigmoid(x)."""
    s = sigmoid(x)
    return multiply(g, multiply(s, add(_k(1, x), multiply(x, subtract(_k(1, x), s)))))


def _clip_grad_fn(call: Any, x: Any, g: Any) -> Any:
    """g inside [min, max] (bounds included), else 0."""
    attrs = call.attrs
    conds = []
    if attrs.min is not None:
        conds.append(greater_equal(x, _k(attrs.min, x)))
    if attrs.max is not None:
        conds.append(less_equal(x, _k(attrs.max, x)))
    if not conds:
        return g
    cond = conds[0] if len(conds) == 1 else logical_and(conds[0], conds[1])
    return _masked_grad(cond, g)


def _cast_grad_fn(call: Any, x: Any, g: Any) -> Any:
    """The gradient cast back to the input's (float) dtype; none through a non-float result."""
    if not as_dtype(call.attrs.dtype).is_float:
        return None
    return cast_to(g, x.struct_info.dtype, call.attrs.dtype)


_negative_grad = _unary_grad(lambda c, x, g: negative(g))
_abs_grad = _unary_grad(lambda c, x, g: where(less(x, _k(0, x)), negative(g), g))
_exp_grad = _unary_grad(lambda c, x, g: multiply(g, c))
_log_grad = _unary_grad(lambda c, x, g: divide(g, x))
_sqrt_grad = _unary_grad(lambda c, x, g: divide(g, multiply(c, _k(2, x))))
# d x^(-1/2) = -x^(-3/2) / 2 = -rsqrt(x) / (2 x)
_rsqrt_grad = _unary_grad(lambda c, x, g: multiply(g, multiply(_k(-0.5, x), divide(c, x))))
_tanh_grad = _unary_grad(lambda c, x, g: multiply(g, subtract(_k(1, x), multiply(c, c))))
_sigmoid_grad = _unary_grad(
    lambda c, x, g: multiply(g, multiply(c, subtract(_k(1, x), c))))
_erf_grad = _unary_grad(lambda c, x, g: multiply(
    g, multiply(_k(2 / math.sqrt(math.pi), x), exp(negative(multiply(x, x))))))
_sin_grad = _unary_grad(lambda c, x, g: multiply(g, cos(x)))
_cos_grad = _unary_grad(lambda c, x, g: negative(multiply(g, sin(x))))
# piecewise constant: the derivative is 0 almost everywhere (no gradient flows)
_step_grad = _unary_grad(lambda c, x, g: None)
_relu_grad = _unary_grad(lambda c, x, g: _masked_grad(greater(x, _k(0, x)), g))
_gelu_grad = _unary_grad(_gelu_grad_fn)
_silu_grad = _unary_grad(_silu_grad_fn)
_clip_grad = _unary_grad(_clip_grad_fn)
_cast_grad = _unary_grad(_cast_grad_fn)


# =============================================================================================
# declarations
# =============================================================================================
_F = MixedPrecision.FOLLOW
_N = MixedPrecision.NEVER
_ND = NON_DIFFERENTIABLE

# ---- binary arithmetic (pattern BROADCAST, mixed precision FOLLOW) --------------------------
add = _binary("add", lambda a, b: a + b, gradient=_add_grad,
              doc="Element-wise ``lhs + rhs`` with broadcasting.")
subtract = _binary("subtract", lambda a, b: a - b, gradient=_subtract_grad,
                   doc="Element-wise ``lhs - rhs``.")
multiply = _binary("multiply", lambda a, b: a * b, gradient=_multiply_grad,
                   doc="Element-wise ``lhs * rhs``.")
divide = _binary(
    "divide",
    _divide_scalar,
    gradient=_divide_grad,
    doc="``lhs / rhs``: true division for floats; floor division (numpy ``//``) for "
    "integers, with x / 0 == 0.",
)
floor_divide = _binary(
    "floor_divide", _floor_div_scalar, gradient=_floor_divide_grad,
    doc="``floor(lhs / rhs)`` (numpy ``//``); integer x // 0 == 0.",
)
mod = _binary(
    "mod", _mod_scalar, gradient=_mod_grad,
    doc="Floor modulo (numpy ``np.mod``: the result has the sign of rhs); integer x % 0 == 0.",
)
maximum = _binary("maximum", tx.max, gradient=_maximum_grad, doc="Element-wise maximum.")
minimum = _binary("minimum", tx.min, gradient=_minimum_grad, doc="Element-wise minimum.")
power = _binary(
    "power", _power_scalar, gradient=_power_grad,
    doc="``lhs ** rhs``. Integer powers are exact up to 2**53; negative integer exponents give 0.",
)

# ---- comparisons (bool output; never computed in low precision; no gradient) ---------------
equal = _binary("equal", tx.eq, kind="any", out_dtype="bool", mixed_precision=_N, gradient=_ND,
                doc="``lhs == rhs`` (bool).")
not_equal = _binary("not_equal", tx.ne, kind="any", out_dtype="bool", mixed_precision=_N,
                    gradient=_ND, doc="``lhs != rhs`` (bool).")
less = _binary("less", tx.lt, out_dtype="bool", mixed_precision=_N, gradient=_ND,
               doc="``lhs < rhs`` (bool).")
less_equal = _binary("less_equal", tx.le, out_dtype="bool", mixed_precision=_N, gradient=_ND,
                     doc="``lhs <= rhs`` (bool).")
greater = _binary("greater", tx.gt, out_dtype="bool", mixed_precision=_N, gradient=_ND,
                  doc="``lhs > rhs`` (bool).")
greater_equal = _binary("greater_equal", tx.ge, out_dtype="bool", mixed_precision=_N,
                        gradient=_ND, doc="``lhs >= rhs`` (bool).")
logical_and = _binary("logical_and", tx.logical_and, kind="bool", mixed_precision=_N,
                      gradient=_ND, doc="Element-wise AND of bool tensors.")
logical_or = _binary("logical_or", tx.logical_or, kind="bool", mixed_precision=_N,
                     gradient=_ND, doc="Element-wise OR of bool tensors.")
logical_not = declare_unary("logical_not", tx.logical_not, kind="bool", mixed_precision=_N,
                     gradient=_ND, doc="Element-wise NOT of a bool tensor.")

# ---- bitwise (integer and bool tensors; no gradient) ----------------------------------------
bitwise_and = _binary("bitwise_and", _bitwise_scalar("and"), kind="bits", mixed_precision=_N,
                      gradient=_ND, doc="Bitwise AND of integer (or bool) tensors.")
bitwise_or = _binary("bitwise_or", _bitwise_scalar("or"), kind="bits", mixed_precision=_N,
                     gradient=_ND, doc="Bitwise OR of integer (or bool) tensors.")
bitwise_xor = _binary("bitwise_xor", _bitwise_scalar("xor"), kind="bits", mixed_precision=_N,
                      gradient=_ND, doc="Bitwise XOR of integer (or bool) tensors.")


@dataclass(frozen=True)
class ReinterpretAttrs:
    """``dtype``: the type whose bits are read (same width as the input, not bool)."""

    dtype: str

    def __post_init__(self):
        try:
            dt = as_dtype(self.dtype)
        except (DTypeError, TypeError, ValueError) as err:
            raise KilnError(f"reinterpret: bad dtype {self.dtype!r}: {err}") from err
        if dt.lanes != 1 or dt.is_handle or dt.is_bool:
            raise KilnError(f"reinterpret: dtype must be a scalar non-bool type, got {dt}")
        object.__setattr__(self, "dtype", str(dt))


def _reinterpret_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "reinterpret", "x")
    src, dst = as_dtype(x.dtype), as_dtype(call.attrs.dtype)
    if src.is_bool or src.bits != dst.bits:
        raise StructInfoError(f"reinterpret: x ({src}) must be a non-bool type of {dst.bits} "
                              f"bits to be read as {dst}")
    return tensor_sinfo(arg_shape(x), dst, ndim=arg_ndim(x))


reinterpret = register_op(
    "reinterpret",
    inputs=("x",),
    infer=_reinterpret_infer,
    pattern=OpPattern.ELEMWISE,
    attrs=ReinterpretAttrs,
    compute=lambda x, attrs: te.compute(
        x.shape, lambda *i: tx.reinterpret(attrs.dtype, x(*i)), name="reinterpret"),
    mixed_precision=_N,
    gradient=_ND,
    doc="The bits of each element read as ``dtype`` (same width; numpy ``view``).",
)
bitwise_not = declare_unary("bitwise_not", tx.bitwise_not, kind="bits", mixed_precision=_N,
                     gradient=_ND, doc="Bitwise NOT of an integer tensor (bool: logical NOT).")
left_shift = _binary("left_shift", tx.shift_left, kind="int", mixed_precision=_N, gradient=_ND,
                     doc="``lhs << rhs`` (modular); shifts outside [0, bits) give 0 (numpy).")
right_shift = _binary("right_shift", tx.shift_right, kind="int", mixed_precision=_N,
                      gradient=_ND, doc="``lhs >> rhs``: arithmetic for signed, logical for "
                      "unsigned; shifts outside [0, bits) give the sign fill (numpy).")

# ---- unary math (pattern ELEMWISE, mixed precision FOLLOW) ----------------------------------
negative = declare_unary("negative", _negative, kind="numeric", gradient=_negative_grad,
                         doc="``-x``.")
abs = declare_unary("abs", tx.abs, kind="numeric", gradient=_abs_grad, doc="``|x|``.")  # noqa: A001
exp = declare_unary("exp", with_float32(tx.exp), gradient=_exp_grad, doc="``e ** x``.")
log = declare_unary("log", with_float32(tx.log), gradient=_log_grad, doc="Natural logarithm.")
sqrt = declare_unary("sqrt", with_float32(tx.sqrt), gradient=_sqrt_grad, doc="Square root.")
rsqrt = declare_unary("rsqrt", with_float32(tx.rsqrt), gradient=_rsqrt_grad,
               doc="``1 / sqrt(x)``.")
tanh = declare_unary("tanh", with_float32(tx.tanh), gradient=_tanh_grad, doc="Hyperbolic tangent.")
sigmoid = declare_unary("sigmoid", with_float32(_sigmoid), gradient=_sigmoid_grad,
                 doc="``1 / (1 + exp(-x))``.")
erf = declare_unary("erf", with_float32(tx.erf), gradient=_erf_grad, doc="The error function.")
sin = declare_unary("sin", with_float32(tx.sin), gradient=_sin_grad, doc="Sine.")
cos = declare_unary("cos", with_float32(tx.cos), gradient=_cos_grad, doc="Cosine.")
floor = declare_unary("floor", with_float32(tx.floor), gradient=_step_grad,
               doc="Largest integer <= x (float).")
ceil = declare_unary("ceil", with_float32(tx.ceil), gradient=_step_grad,
              doc="Smallest integer >= x (float).")
round = declare_unary(  # noqa: A001
    "round", with_float32(round_half_even), gradient=_step_grad,
    doc="Round to nearest, ties to even (numpy/ONNX)."
)

# ---- activations and friends ------------------------------------------------------------------
relu = declare_unary("relu", _relu, kind="numeric", gradient=_relu_grad, doc="``max(x, 0)``.")
gelu = declare_unary(
    "gelu", _gelu, attrs=GeluAttrs, gradient=_gelu_grad,
    doc="GELU: ``0.5 x (1 + erf(x / sqrt 2))``; approximate='tanh' uses the tanh form.",
)
silu = declare_unary("silu", _silu, gradient=_silu_grad, doc="SiLU / swish: ``x * sigmoid(x)``.")
clip = declare_unary(
    "clip", _clip, kind="numeric", attrs=ClipAttrs, gradient=_clip_grad,
    doc="Clamp to ``[min, max]`` (either may be None). Integer tensors use integer bounds.",
)
cast = declare_unary(
    "cast", _cast, kind="any", attrs=CastAttrs, mixed_precision=_N, gradient=_cast_grad,
    out_dtype=lambda attrs: attrs.dtype,
    doc="Convert to ``dtype`` (numpy ``astype``: float -> int truncates; -> bool is x != 0).",
)


# ---- where -------------------------------------------------------------------------------------
def _where_infer(call: Any) -> Any:
    names = ("condition", "x", "y")
    infos = [tensor_arg(call, i, "where", n) for i, n in enumerate(names)]
    _check_kind("where", "condition", infos[0], "bool")
    dtype = _same_dtype("where", infos[1:], names[1:])
    return broadcast_sinfo(call, "where", names, dtype)


def _where_compute(cond: te.Tensor, x: te.Tensor, y: te.Tensor, attrs: Any = None) -> te.Tensor:
    shape = te_broadcast_shape("where", (cond, x, y))
    return te.compute(
        shape,
        lambda *i: tx.select(
            broadcast_load(cond, i, shape), broadcast_load(x, i, shape),
            broadcast_load(y, i, shape)
        ),
        name="where",
        attrs=broadcast_assumptions("where", (cond.shape, x.shape, y.shape),
                                    ("condition", "x", "y"), shape),
    )


where = register_op(
    "where",
    inputs=("condition", "x", "y"),
    infer=_where_infer,
    pattern=OpPattern.BROADCAST,
    compute=_where_compute,
    mixed_precision=_F,
    gradient=_where_grad,
    doc="``x`` where ``condition`` holds, else ``y`` (all three broadcast).",
)


def cast_to(expr: Any, dtype: Any, current: Any) -> Any:
    """``expr`` (of dtype ``current``) cast to ``dtype`` when they differ."""
    return expr if as_dtype(current) == as_dtype(dtype) else cast(expr, str(as_dtype(dtype)))
