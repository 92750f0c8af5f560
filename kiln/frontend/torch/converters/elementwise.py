"""Element-wise ATen ops: arithmetic with torch's type promotion, math functions, activations,
comparisons, logic, casts and copies.

Operands are brought to the dtype torch computes in (``result_dtype``: the promoted dtype of
the tensors and Python numbers, 0-d tensors counting as numbers) before the kiln op; the node's
own example value gives the result dtype where it differs (true division of integers).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .... import op
from ..registry import converter
from .common import as_tensor, cast, dtype_of, is_float, result_dtype, scalar, shape_of
from .onnx_reuse import onnx_op


def in_float64(x: Any, fn: Any) -> Any:
    """``fn(x)`` computed in float64 and rounded back once to ``x``'s dtype (closed forms such
    as ``log(x) / log(10)`` that round twice in float32)."""
    dt = dtype_of(x)
    if dt == "float64":
        return fn(x)
    return op.cast(fn(op.cast(x, "float64")), dt)


def _operands(node: Any, dtype: str, *keys: Any) -> list[Any]:
    return [as_tensor(node.arg(k), dtype, node.ctx) for k in keys]


# ---- arithmetic ---------------------------------------------------------------------------
def _scaled(node: Any, y: Any, dtype: str) -> Any:
    alpha = node.arg("alpha", 1)
    return y if alpha == 1 else op.multiply(y, as_tensor(alpha, dtype))


@converter("aten.add.Tensor", "aten.add.Scalar")
def add(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    a, b = _operands(node, dt, 0, 1)
    if dt == "bool":
        return op.logical_or(a, b)
    return op.add(a, _scaled(node, b, dt))


@converter("aten.sub.Tensor", "aten.sub.Scalar")
def sub(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    a, b = _operands(node, dt, 0, 1)
    return op.subtract(a, _scaled(node, b, dt))


@converter("aten.rsub.Scalar", "aten.rsub.Tensor")
def rsub(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    a, b = _operands(node, dt, 0, 1)
    return op.subtract(b, _scaled(node, a, dt))


@converter("aten.mul.Tensor", "aten.mul.Scalar")
def mul(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    a, b = _operands(node, dt, 0, 1)
    return op.logical_and(a, b) if dt == "bool" else op.multiply(a, b)


def _trunc(x: Any) -> Any:
    return op.where(op.less(x, scalar(0, dtype_of(x))), op.ceil(x), op.floor(x))


@converter("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode",
           "aten.div.Scalar_mode")
def div(ctx: Any, node: Any) -> Any:
    mode = node.arg("rounding_mode")
    dt = node.out_dtype
    if mode is None:
        a, b = _operands(node, dt, 0, 1)
        return op.divide(a, b)
    a, b = _operands(node, dt, 0, 1)
    if mode == "floor":
        return op.floor_divide(a, b)
    if not is_float(dt):  # integer division truncating toward zero
        zero = scalar(0, dt)
        q = op.floor_divide(op.abs(a), op.abs(b))
        return op.where(op.not_equal(op.less(a, zero), op.less(b, zero)), op.negative(q), q)
    return _trunc(op.divide(a, b))


@converter("aten.floor_divide.default", "aten.floor_divide.Scalar")
def floor_divide(ctx: Any, node: Any) -> Any:
    a, b = _operands(node, node.out_dtype, 0, 1)
    return op.floor_divide(a, b)


@converter("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.remainder.Scalar_Tensor")
def remainder(ctx: Any, node: Any) -> Any:
    a, b = _operands(node, node.out_dtype, 0, 1)
    return op.mod(a, b)


@converter("aten.fmod.Tensor", "aten.fmod.Scalar")
def fmod(ctx: Any, node: Any) -> Any:
    a, b = _operands(node, node.out_dtype, 0, 1)
    return onnx_op(ctx, node, "Mod", [a, b], {"fmod": 1})


@converter("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar")
def pow_(ctx: Any, node: Any) -> Any:
    a, b = _operands(node, node.out_dtype, 0, 1)
    return op.power(a, b)


def _nan_aware(fn: Any, nan_wins: bool) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        dt = result_dtype(node, 0, 1)
        a, b = _operands(node, dt, 0, 1)
        out = fn(a, b)
        if not is_float(dt):
            return out
        # torch's maximum/minimum propagate NaN; fmax/fmin take the other operand
        if nan_wins:
            return op.where(op.not_equal(a, a), a, op.where(op.not_equal(b, b), b, out))
        return op.where(op.not_equal(a, a), b, op.where(op.not_equal(b, b), a, out))

    return convert


converter("aten.maximum.default")(_nan_aware(op.maximum, True))
converter("aten.minimum.default")(_nan_aware(op.minimum, True))
converter("aten.fmax.default")(_nan_aware(op.maximum, False))
converter("aten.fmin.default")(_nan_aware(op.minimum, False))


@converter("aten.atan2.default")
def atan2(ctx: Any, node: Any) -> Any:
    """``atan(y / x)`` corrected by quadrant (float64), ``+-pi/2`` on the y axis."""
    dt = node.out_dtype
    y, x = (ctx.emit(op.cast(v, "float64")) for v in _operands(node, dt, 0, 1))
    zero = scalar(0.0, "float64")
    t = ctx.emit(onnx_op(ctx, node, "Atan", [ctx.emit(op.divide(y, x))]))
    pi = scalar(math.pi, "float64")
    neg_y = op.less(y, zero)
    left = op.where(neg_y, op.subtract(t, pi), op.add(t, pi))
    axis = op.where(op.greater(y, zero), scalar(math.pi / 2, "float64"),
                    op.where(neg_y, scalar(-math.pi / 2, "float64"), y))
    out = op.where(op.greater(x, zero), t, op.where(op.less(x, zero), left, axis))
    return op.cast(out, dt)


@converter("aten.hypot.default")
def hypot(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    a, b = _operands(node, dt, 0, 1)
    return in_float64(a, lambda a64: op.sqrt(op.add(op.multiply(a64, a64), op.multiply(
        op.cast(b, "float64"), op.cast(b, "float64")))))


@converter("aten.copysign.Tensor", "aten.copysign.Scalar")
def copysign(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    a, b = _operands(node, dt, 0, 1)
    neg = op.less(op.reinterpret(b, "int32"), scalar(0, "int32")) if dt == "float32" else \
        op.less(b, scalar(0, dt))
    return op.where(neg, op.negative(op.abs(a)), op.abs(a))


# ---- unary math -------------------------------------------------------------------------
_UNARY = {
    "abs": op.abs, "neg": op.negative, "exp": op.exp, "log": op.log, "sqrt": op.sqrt,
    "rsqrt": op.rsqrt, "sin": op.sin, "cos": op.cos, "tanh": op.tanh, "sigmoid": op.sigmoid,
    "erf": op.erf, "floor": op.floor, "ceil": op.ceil, "relu": op.relu, "silu": op.silu,
}


def _unary(fn: Any, float_only: bool) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.arg(0)
        dt = node.out_dtype
        if float_only and dtype_of(x) != dt:
            x = op.cast(x, dt)  # integer inputs of float functions (torch.sin(int) is float)
        return fn(x)

    return convert


for _name, _fn in _UNARY.items():
    converter(f"aten.{_name}.default")(_unary(_fn, _name not in ("abs", "neg", "relu")))


def _float64_math(onnx_type: str) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = cast(node.arg(0), node.out_dtype)
        return onnx_op(ctx, node, onnx_type, [x])

    return convert


for _name, _onnx in {"tan": "Tan", "atan": "Atan", "asin": "Asin", "acos": "Acos",
                     "sinh": "Sinh", "cosh": "Cosh", "asinh": "Asinh", "acosh": "Acosh",
                     "atanh": "Atanh"}.items():
    converter(f"aten.{_name}.default")(_float64_math(_onnx))


def _float64_fn(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return in_float64(cast(node.arg(0), node.out_dtype), fn)

    return convert


_F64 = {
    "expm1": lambda x: op.subtract(op.exp(x), scalar(1.0, "float64")),
    "log1p": lambda x: op.log(op.add(x, scalar(1.0, "float64"))),
    "log2": lambda x: op.multiply(op.log(x), scalar(1 / math.log(2), "float64")),
    "log10": lambda x: op.multiply(op.log(x), scalar(1 / math.log(10), "float64")),
    "exp2": lambda x: op.exp(op.multiply(x, scalar(math.log(2), "float64"))),
    "erfc": lambda x: op.subtract(scalar(1.0, "float64"), op.erf(x)),
    "reciprocal": lambda x: op.divide(scalar(1.0, "float64"), x),
}
for _name, _fn in _F64.items():
    converter(f"aten.{_name}.default")(_float64_fn(_fn))


@converter("aten.trunc.default", "aten.fix.default")
def trunc(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return _trunc(x) if is_float(dtype_of(x)) else x


@converter("aten.frac.default")
def frac(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return op.subtract(x, _trunc(x))


@converter("aten.round.default")
def round_(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return op.round(x) if is_float(dtype_of(x)) else x


@converter("aten.round.decimals")
def round_decimals(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    k = int(node.arg("decimals", 0))
    if k == 0:
        return op.round(x)
    return in_float64(x, lambda v: op.divide(op.round(op.multiply(v, scalar(10.0 ** k,
                                                                              "float64"))),
                                             scalar(10.0 ** k, "float64")))


@converter("aten.sign.default", "aten.sgn.default")
def sign(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    if dtype_of(x) == "bool":
        return x
    return onnx_op(ctx, node, "Sign", [x])


@converter("aten.signbit.default")
def signbit(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    if dt == "float32":
        return op.less(op.reinterpret(x, "int32"), scalar(0, "int32"))
    if dt == "float64":
        return op.less(op.reinterpret(x, "int64"), scalar(0, "int64"))
    return op.less(x, scalar(0, dt))


@converter("aten.isnan.default")
def isnan(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return op.not_equal(x, x)


@converter("aten.isinf.default")
def isinf(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    if not is_float(dtype_of(x)):
        return op.not_equal(op.cast(x, "bool"), op.cast(x, "bool"))
    return op.equal(op.abs(x), scalar(np.inf, dtype_of(x)))


@converter("aten.isfinite.default")
def isfinite(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    if not is_float(dtype_of(x)):
        return op.equal(op.cast(x, "bool"), op.cast(x, "bool"))
    return op.less(op.abs(x), scalar(np.inf, dtype_of(x)))


@converter("aten.nan_to_num.default")
def nan_to_num(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    if not is_float(dt):
        return x
    info = np.finfo(np.dtype(dt) if dt != "bfloat16" else np.float32)
    nan = node.arg("nan") or 0.0
    pos = node.arg("posinf")
    neg = node.arg("neginf")
    pos = float(info.max) if pos is None else pos
    neg = float(info.min) if neg is None else neg
    inf = scalar(np.inf, dt)
    y = op.where(op.equal(x, inf), scalar(pos, dt), x)
    y = op.where(op.equal(x, op.negative(inf)), scalar(neg, dt), y)
    return op.where(op.not_equal(x, x), scalar(nan, dt), y)


# ---- activations --------------------------------------------------------------------------
@converter("aten.gelu.default")
def gelu(ctx: Any, node: Any) -> Any:
    return op.gelu(node.arg(0), approximate=node.arg("approximate", "none"))


@converter("aten.hardtanh.default", "aten.clamp.default")
def clamp(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = node.out_dtype
    x = cast(x, dt)
    lo, hi = node.arg(1), node.arg(2)
    if node.op_name.startswith("aten.hardtanh"):
        lo, hi = node.arg("min_val", -1.0), node.arg("max_val", 1.0)
    if lo is not None:
        x = op.maximum(x, as_tensor(lo, dt))
    if hi is not None:
        x = op.minimum(x, as_tensor(hi, dt))
    return x


@converter("aten.clamp.Tensor")
def clamp_tensor(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    x = cast(node.arg(0), dt)
    if node.has(1):
        x = op.maximum(x, as_tensor(node.arg(1), dt))
    if node.has(2):
        x = op.minimum(x, as_tensor(node.arg(2), dt))
    return x


@converter("aten.clamp_min.default", "aten.clamp_min.Tensor")
def clamp_min(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    return op.maximum(cast(node.arg(0), dt), as_tensor(node.arg(1), dt))


@converter("aten.clamp_max.default", "aten.clamp_max.Tensor")
def clamp_max(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    return op.minimum(cast(node.arg(0), dt), as_tensor(node.arg(1), dt))


@converter("aten.leaky_relu.default")
def leaky_relu(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    slope = scalar(node.arg("negative_slope", 0.01), dt)
    return op.where(op.greater(x, scalar(0, dt)), x, op.multiply(x, slope))


@converter("aten.elu.default")
def elu(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    alpha, scale, in_scale = (float(node.arg(k)) for k in ("alpha", "scale", "input_scale"))
    neg = op.multiply(scalar(alpha * scale, dt),
                      in_float64(op.multiply(x, scalar(in_scale, dt)),
                                 lambda v: op.subtract(op.exp(v), scalar(1.0, "float64"))))
    return op.where(op.greater(x, scalar(0, dt)), op.multiply(x, scalar(scale, dt)), neg)


@converter("aten.softplus.default")
def softplus(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    beta, threshold = float(node.arg("beta", 1.0)), float(node.arg("threshold", 20.0))
    bx = op.multiply(x, scalar(beta, dt))
    soft = op.divide(in_float64(bx, lambda v: op.log(op.add(op.exp(v), scalar(1.0, "float64")))),
                     scalar(beta, dt))
    return op.where(op.greater(bx, scalar(threshold, dt)), x, soft)


@converter("aten.hardsigmoid.default")
def hardsigmoid(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    return op.clip(op.add(op.divide(x, scalar(6.0, dt)), scalar(0.5, dt)), 0.0, 1.0)


@converter("aten.hardswish.default")
def hardswish(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dt = dtype_of(x)
    return op.divide(op.multiply(x, op.clip(op.add(x, scalar(3.0, dt)), 0.0, 6.0)),
                     scalar(6.0, dt))


@converter("aten.mish.default")
def mish(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return op.multiply(x, op.tanh(in_float64(x, lambda v: op.log(op.add(
        op.exp(v), scalar(1.0, "float64"))))))


@converter("aten.logit.default")
def logit(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    eps = node.arg("eps")
    if eps is not None:
        x = op.clip(x, float(eps), 1.0 - float(eps))
    return in_float64(x, lambda v: op.log(op.divide(v, op.subtract(scalar(1.0, "float64"), v))))


# ---- comparisons and logic ----------------------------------------------------------------
_COMPARE = {"eq": op.equal, "ne": op.not_equal, "lt": op.less, "le": op.less_equal,
            "gt": op.greater, "ge": op.greater_equal}


def _compare(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        a, b = _operands(node, result_dtype(node, 0, 1), 0, 1)
        return fn(a, b)

    return convert


for _name, _fn in _COMPARE.items():
    converter(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare(_fn))


def _logical(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        a, b = (cast(node.arg(k), "bool") for k in (0, 1))
        return fn(a, b)

    return convert


converter("aten.logical_and.default")(_logical(op.logical_and))
converter("aten.logical_or.default")(_logical(op.logical_or))
converter("aten.logical_xor.default")(_logical(op.not_equal))


@converter("aten.logical_not.default")
def logical_not(ctx: Any, node: Any) -> Any:
    return op.logical_not(cast(node.arg(0), "bool"))


def _bitwise(fn: Any, bool_fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        dt = node.out_dtype
        a, b = _operands(node, dt, 0, 1)
        return bool_fn(a, b) if dt == "bool" else fn(a, b)

    return convert


for _name, _fn, _bfn in (("bitwise_and", op.bitwise_and, op.logical_and),
                         ("bitwise_or", op.bitwise_or, op.logical_or),
                         ("bitwise_xor", op.bitwise_xor, op.not_equal)):
    converter(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_bitwise(_fn, _bfn))


@converter("aten.bitwise_not.default")
def bitwise_not(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return op.logical_not(x) if dtype_of(x) == "bool" else op.bitwise_not(x)


@converter("aten.bitwise_left_shift.Tensor", "aten.bitwise_left_shift.Tensor_Scalar")
def left_shift(ctx: Any, node: Any) -> Any:
    a, b = _operands(node, node.out_dtype, 0, 1)
    return op.left_shift(a, b)


@converter("aten.bitwise_right_shift.Tensor", "aten.bitwise_right_shift.Tensor_Scalar")
def right_shift(ctx: Any, node: Any) -> Any:
    a, b = _operands(node, node.out_dtype, 0, 1)
    return op.right_shift(a, b)


@converter("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther",
           "aten.where.Scalar")
def where(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    cond = cast(node.arg(0), "bool")
    a, b = _operands(node, dt, 1, 2)
    return op.where(cond, a, b)


# ---- casts and copies ---------------------------------------------------------------------
@converter("aten._to_copy.default", "aten.clone.default", "aten.alias.default",
           "aten.lift_fresh_copy.default", "aten.detach.default",
           "aten._conj.default", "aten.conj_physical.default", "aten._conj_physical.default",
           "aten.positive.default",
           "aten.resolve_conj.default", "aten.resolve_neg.default")
def to_copy(ctx: Any, node: Any) -> Any:
    return cast(node.arg(0), node.out_dtype)


@converter("aten.copy.default")
def copy(ctx: Any, node: Any) -> Any:
    """``dst.copy_(src)`` made functional: ``src`` in ``dst``'s dtype, broadcast to its shape."""
    dst, src = node.arg(0), node.arg(1)
    out = cast(src, dtype_of(dst))
    if shape_of(out) != shape_of(dst):
        out = op.broadcast_to(out, shape_of(dst))
    return out
