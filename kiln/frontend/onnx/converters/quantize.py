"""Quantization ONNX operators, decomposed into element-wise kiln ops and integer matmul/conv.

- QuantizeLinear: ``saturate(round_half_even(x / scale) + zero_point)`` to the integer type of
  the zero point (or ``output_dtype``, default uint8). The rounding is done in x's precision
  (as the ONNX reference divides); adding the zero point and clipping are exact in float32
  (every in-range value is an integer below 2**24), then one cast.
- DequantizeLinear: ``(x - zero_point) * scale``, the difference taken in int32 (exact) and
  converted to float32 before scaling, the result in the scale's dtype (or ``output_dtype``).
- Scales and zero points are per tensor (size 1), per axis (1-D along ``axis``) or blocked
  (``block_size`` > 0: each entry covers ``block_size`` consecutive elements along ``axis``,
  expanded with a constant-index ``take``).
- MatMulInteger / ConvInteger: zero points subtracted in int32, then kiln's int32 matmul/conv2d
  (subtracting before the convolution makes the zero padding equal the zero point, as ONNX
  requires).
- QLinearMatMul / QLinearConv: the int32 product requantized in float64 (the ONNX reference
  multiplies the int32 accumulator by a float scale in numpy, which promotes to float64).
- DynamicQuantizeLinear: uint8 scale and zero point from the range of x (including 0).

The narrow types follow the ONNX reference too: int4/uint4/int2/uint2 like the 8-bit integers;
float8 targets are ``cast(clip(x / scale, -max, max))`` with ``saturate`` (else a plain cast:
out-of-range values become Inf/NaN) and take no zero point; a float4 target adds the zero point
before the (saturating) cast; dequantizing a float8/float4 input ignores the zero point.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .... import graph as g
from .... import op
from ....ir.dtype import as_dtype
from ..importer import onnx_dtype
from ..registry import converter
from .common import dtype_of, ndim_of, norm_axis, scalar, shape_of, static_int, static_kernel
from .nn import lift_1d, pair_attr, window_pads

# The integer types kiln quantizes to, with their ranges.
QUANT_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
    "uint4": (0, 15), "int4": (-8, 7), "uint2": (0, 3), "int2": (-2, 1),
}


def _onnx_dtype_name(node: Any, elem_type: int) -> str:
    return onnx_dtype(elem_type, str(node))


def _quant_type(node: Any, dtype: str, what: str) -> tuple[int, int]:
    if dtype not in QUANT_RANGES:
        raise node.error(f"{what} type {dtype} is not supported (kiln quantizes to "
                         f"{', '.join(QUANT_RANGES)} and the float8/float4 types)")
    return QUANT_RANGES[dtype]


def _is_minifloat(dtype: str) -> bool:
    return as_dtype(dtype).is_minifloat


def _float_target(node: Any, value: Any, zero_point: Any, dtype: str) -> Any:
    """``value`` (x / scale) quantized to a float8/float4 type, as the ONNX reference does."""
    if as_dtype(dtype).minifloat.bits == 4:  # float4: zero point added, the cast saturates
        if zero_point is not None:
            value = op.add(op.cast(value, "float32"), op.cast(zero_point, "float32"))
        return op.cast(value, dtype)
    if node.attr("saturate", 1):
        top = float(ml_dtypes.finfo(as_dtype(dtype).to_numpy()).max)
        value = op.clip(op.cast(value, "float32"), -top, top)
    return op.cast(value, dtype)


def _leaf(ctx: Any, e: Any) -> Any:
    """``e`` as a variable or constant (emitted if it is a call), so its StructInfo is known."""
    return e if isinstance(e, (g.Var, g.Constant)) else ctx.emit(e)


def _is_single(v: Any) -> bool:
    dims = [static_int(d) for d in shape_of(v)]
    return all(d == 1 for d in dims)


def _expand_param(ctx: Any, node: Any, v: Any, x: Any, axis: int, block_size: int) -> Any:
    """Scale or zero point ``v`` made broadcastable against ``x`` (see the module doc)."""
    if v is None or ndim_of(v) == 0:
        return v
    if _is_single(v):
        return ctx.emit(op.reshape(v, ()))
    nd = ndim_of(x)
    axis = norm_axis(axis, nd)
    if not 0 <= axis < nd:
        raise node.error(f"axis {axis} is out of range for an input of rank {nd}")
    if block_size <= 0:
        if ndim_of(v) != 1:
            raise node.error(f"a per-axis scale/zero point must be 1-D, got shape "
                             f"{shape_of(v)} (blocked quantization needs block_size)")
        shape = [1] * nd
        shape[axis] = -1
        return ctx.emit(op.reshape(v, tuple(shape)))
    n = static_int(shape_of(x)[axis])
    if n is None or ndim_of(v) != nd:
        raise node.error("blocked quantization needs a static axis and a scale of the input's "
                         "rank")
    blocks = g.const(np.arange(n, dtype=np.int64) // int(block_size))
    return ctx.emit(op.take(v, blocks, axis=axis))


def _saturate(ctx: Any, value: Any, zero_point: Any, dtype: str, node: Any) -> Any:
    """``cast(clip(value + zero_point, qmin, qmax), dtype)`` for an integer-valued float
    ``value``; the sum and clip run in float32 (exact for every in-range result)."""
    lo, hi = _quant_type(node, dtype, "quantized output")
    value = _leaf(ctx, value)
    value = value if dtype_of(value) == "float32" else op.cast(value, "float32")
    if zero_point is not None:
        value = op.add(value, op.cast(zero_point, "float32"))
    return op.cast(op.clip(value, float(lo), float(hi)), dtype)


@converter("QuantizeLinear", since=10)
def quantize_linear(ctx: Any, node: Any) -> Any:
    x, scale, zp = node.input(0), node.input(1), node.input(2)
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    out_attr = int(node.attr("output_dtype", 0))
    if zp is not None:
        out = dtype_of(zp)
    elif out_attr:
        out = _onnx_dtype_name(node, out_attr)
    else:
        out = "uint8"
    if not _is_minifloat(out):
        _quant_type(node, out, "quantized output")
    scale = _expand_param(ctx, node, scale, x, axis, block)
    zp = _expand_param(ctx, node, zp, x, axis, block)
    precision = int(node.attr("precision", 0))
    if precision:
        work = _onnx_dtype_name(node, precision)
    else:  # x's precision; mixed dtypes (a float16 x with a float32 scale) in float32
        work = dtype_of(x) if dtype_of(scale) == dtype_of(x) else "float32"
    scale = scale if dtype_of(scale) == work else op.cast(scale, work)
    xw = x if dtype_of(x) == work else op.cast(x, work)
    if _is_minifloat(out):
        return _float_target(node, op.divide(xw, scale), zp, out)
    return _saturate(ctx, op.round(op.divide(xw, scale)), zp, out, node)


def _minus_zero_point(ctx: Any, x: Any, zp: Any) -> Any:
    """``int32(x) - int32(zero_point)`` (exact for every quantized type)."""
    x, zp = _leaf(ctx, x), None if zp is None else _leaf(ctx, zp)
    xi = x if dtype_of(x) == "int32" else op.cast(x, "int32")
    if zp is None:
        return xi
    return op.subtract(xi, zp if dtype_of(zp) == "int32" else op.cast(zp, "int32"))


@converter("DequantizeLinear", since=10)
def dequantize_linear(ctx: Any, node: Any) -> Any:
    x, scale, zp = node.input(0), node.input(1), node.input(2)
    axis, block = int(node.attr("axis", 1)), int(node.attr("block_size", 0))
    if _is_minifloat(dtype_of(x)):
        zp = None  # float8 zero points must be 0; float4's are ignored (ONNX reference)
    elif dtype_of(x) not in (*QUANT_RANGES, "int32"):
        raise node.error(f"quantized input type {dtype_of(x)} is not supported")
    out_attr = int(node.attr("output_dtype", 0))
    out = _onnx_dtype_name(node, out_attr) if out_attr else dtype_of(scale)
    scale = _expand_param(ctx, node, scale, x, axis, block)
    zp = _expand_param(ctx, node, zp, x, axis, block)
    diff = (op.cast(x, "float32") if _is_minifloat(dtype_of(x))
            else op.cast(_minus_zero_point(ctx, x, zp), "float32"))
    s = scale if dtype_of(scale) == "float32" else op.cast(scale, "float32")
    y = op.multiply(diff, s)
    return y if out == "float32" else op.cast(y, out)


def _matmul_zero_point(ctx: Any, zp: Any, side: str) -> Any:
    """A MatMul zero point: per tensor, per row of A (M,) -> (M, 1), per column of B (N,)."""
    if zp is None or ndim_of(zp) == 0 or _is_single(zp):
        return None if zp is None else ctx.emit(op.reshape(zp, ()))
    if side == "a" and ndim_of(zp) == 1:
        return ctx.emit(op.reshape(zp, (-1, 1)))
    return zp


def _integer_matmul(ctx: Any, a: Any, azp: Any, b: Any, bzp: Any) -> Any:
    a = ctx.emit(_minus_zero_point(ctx, a, _matmul_zero_point(ctx, azp, "a")))
    b = ctx.emit(_minus_zero_point(ctx, b, _matmul_zero_point(ctx, bzp, "b")))
    return op.matmul(a, b)


@converter("MatMulInteger", since=10)
def matmul_integer(ctx: Any, node: Any) -> Any:
    return _integer_matmul(ctx, node.input(0), node.input(2), node.input(1), node.input(3))


def _requantize(ctx: Any, node: Any, acc: Any, multiplier: Any, y_zp: Any, out: str,
                channel_axis: int) -> Any:
    """``saturate(round(acc * multiplier) + y_zero_point)``, evaluated in float64."""
    m = op.cast(multiplier, "float64")
    if not _is_single(multiplier):  # per output channel (1-D)
        if ndim_of(multiplier) != 1:
            raise node.error(f"a per-channel scale must be 1-D, got shape {shape_of(multiplier)}")
        shape = [1] * ndim_of(acc)
        shape[channel_axis] = -1
        m = op.reshape(m, tuple(shape))
    elif ndim_of(multiplier) > 0:
        m = op.reshape(m, ())
    value = op.multiply(op.cast(acc, "float64"), ctx.emit(m))
    if y_zp is not None:
        value = op.add(value, op.cast(op.reshape(y_zp, ()), "float64"))
    lo, hi = _quant_type(node, out, "quantized output")
    return op.cast(op.clip(op.round(value), float(lo), float(hi)), out)


def _scale_ratio(a_scale: Any, b_scale: Any, y_scale: Any) -> Any:
    """``a_scale * b_scale / y_scale`` in the scales' dtype (as the reference computes it)."""
    return op.divide(op.multiply(a_scale, b_scale), y_scale)


@converter("QLinearMatMul", since=10)
def qlinear_matmul(ctx: Any, node: Any) -> Any:
    a, a_s, a_zp, b, b_s, b_zp, y_s, y_zp = (node.input(i) for i in range(8))
    for name, s in (("a_scale", a_s), ("y_scale", y_s)):
        if not _is_single(s):
            raise node.error(f"{name} must be per tensor (per-row scales are not supported)")
    out = dtype_of(y_zp) if y_zp is not None else dtype_of(a)
    acc = ctx.emit(_integer_matmul(ctx, a, a_zp, b, b_zp))
    ratio = ctx.emit(_scale_ratio(op.reshape(a_s, ()), b_s, op.reshape(y_s, ())))
    return _requantize(ctx, node, acc, ratio, y_zp, out, channel_axis=ndim_of(acc) - 1)


def _integer_conv(ctx: Any, node: Any, x: Any, x_zp: Any, w: Any, w_zp: Any
                  ) -> tuple[Any, bool]:
    """Zero points subtracted in int32, then an int32 ``conv2d`` with the node's attributes.

    Returns the 4-D result and whether a 1-D convolution was lifted to 2-D (unit height, as
    the Conv converter does; the caller squeezes axis 2 off the final result).
    """
    lifted = ndim_of(x) == 3
    if lifted:
        x = lift_1d(ctx, node, x)
        w = ctx.emit(op.expand_dims(w, 2))
    if ndim_of(x) != 4:
        raise node.error(f"only 1-D and 2-D convolutions (rank-3/4 input) are supported, got "
                         f"rank {ndim_of(x)}")
    if w_zp is not None and ndim_of(w_zp) == 1 and not _is_single(w_zp):
        w_zp = op.reshape(w_zp, (-1, 1, 1, 1))  # per output channel
    elif w_zp is not None:
        w_zp = op.reshape(w_zp, ())
    x_zp = None if x_zp is None else op.reshape(x_zp, ())
    xi = ctx.emit(_minus_zero_point(ctx, x, x_zp))
    wi = ctx.emit(_minus_zero_point(ctx, w, w_zp))
    kernel = static_kernel(node, w)
    strides, dilations = pair_attr(node, "strides"), pair_attr(node, "dilations")
    pads = window_pads(node, x, kernel, strides, dilations)  # type: ignore[arg-type]
    out = op.nn.conv2d(xi, wi, strides=strides, padding=pads, dilation=dilations,
                       groups=int(node.attr("group", 1)))
    return out, lifted


def _unlift(y: Any, lifted: bool) -> Any:
    return op.squeeze(y, axis=(2,)) if lifted else y


@converter("ConvInteger", since=10)
def conv_integer(ctx: Any, node: Any) -> Any:
    acc, lifted = _integer_conv(ctx, node, node.input(0), node.input(2), node.input(1),
                                node.input(3))
    return _unlift(acc, lifted)


@converter("QLinearConv", since=10)
def qlinear_conv(ctx: Any, node: Any) -> Any:
    x, x_s, x_zp, w, w_s, w_zp, y_s, y_zp, bias = (node.input(i) for i in range(9))
    out = dtype_of(y_zp) if y_zp is not None else dtype_of(x)
    acc, lifted = _integer_conv(ctx, node, x, x_zp, w, w_zp)
    if bias is not None:
        acc = op.add(acc, op.reshape(op.cast(bias, "int32"), (1, -1, 1, 1)))
    acc = ctx.emit(acc)
    ratio = ctx.emit(_scale_ratio(op.reshape(x_s, ()), w_s, op.reshape(y_s, ())))
    return _unlift(_requantize(ctx, node, acc, ratio, y_zp, out, channel_axis=1), lifted)


@converter("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(ctx: Any, node: Any) -> Any:
    """uint8 quantization with ``scale = (max(x, 0) - min(x, 0)) / 255`` (1/255 when x is all
    zero) and ``zero_point = round(clip(-min / scale, 0, 255))``."""
    x = node.input(0)
    dt = dtype_of(x)
    zero = scalar(0, dt)
    hi = ctx.emit(op.maximum(op.max(x), zero))
    lo = ctx.emit(op.minimum(op.min(x), zero))
    span = op.where(op.equal(hi, lo), scalar(1, dt), op.subtract(hi, lo))
    y_scale = ctx.emit(op.divide(span, scalar(255, dt)))
    zp_f = op.round(op.clip(op.subtract(zero, op.divide(lo, y_scale)), 0.0, 255.0))
    zp = ctx.emit(op.cast(zp_f, "uint8"))
    y = _saturate(ctx, op.round(op.divide(x, y_scale)), zp, "uint8", node)
    return [y, y_scale, zp]
