"""Quantization operators of kiln's own int8 scheme (``kiln.quantize``), and why ONNX's need none.

The ONNX quantization operators (QuantizeLinear, DequantizeLinear, QLinearMatMul, MatMulInteger,
ConvInteger, QLinearConv, DynamicQuantizeLinear) are exact compositions of existing kiln ops --
divide, round (half to even), clip, cast, and ``matmul``/``nn.conv2d`` on int32 -- so the frontend
decomposes them (``kiln/frontend/onnx/converters/quantize.py``).

The three ``qnn.*`` operators below are what :class:`kiln.quantize.QuantizeGraph` emits. Each is
one instruction sequence of an integer accelerator's vector unit (the NPU lowers them in
``kiln/schedule/npu/quantize.py``), so their arithmetic is specified exactly here -- every
target computes the same bits, and ``kiln.testing.quant_reference`` models them in numpy:

- ``qnn.quantize(x, scale)``: ``sat_int8(rint(float32(x) * float32(1 / scale)))`` -- the product
  is rounded to float32, then rounded to the nearest integer with ties to even, then clamped to
  [-128, 127] (symmetric: zero point 0).
- ``qnn.dequantize(q, scale)``: ``float32(q) * float32(scale)`` (one float32 rounding each).
- ``qnn.requantize(acc, bias, multiplier, shift, axis, out_min, out_max)``: for the channel ``c``
  of ``acc`` along ``axis`` (``bias``/``multiplier`` have one element per channel, or one for
  all): ``a = sat_int32(acc + bias[c])``; ``r = (a * multiplier[c] + 2**(shift - 1)) >>
  shift`` on the exact (64-bit) product with an arithmetic shift (so the real product
  ``a * multiplier / 2**shift`` is rounded to nearest with ties toward +inf); the int8 result is
  ``clamp(r, out_min, out_max)`` (a fused ReLU is ``out_min = 0``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import te
from ..ir.dtype import DataType
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import arg_ndim, arg_shape, tensor_arg, tensor_sinfo
from .elementwise import declare_unary, round_half_even
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["qnn_dequantize", "qnn_quantize", "qnn_requantize"]

_I64 = DataType("int64")
_F32 = DataType("float32")


def _check_scale(op: str, scale: Any) -> float:
    try:
        value = float(scale)
    except (TypeError, ValueError):
        raise KilnError(f"{op}: scale must be a number, got {scale!r}") from None
    if not value > 0 or value == float("inf"):
        raise KilnError(f"{op}: scale must be positive and finite, got {value}")
    return value


@dataclass(frozen=True)
class QuantizeAttrs:
    """``scale``: the real value of one step of the int8 result (zero point 0)."""

    scale: float

    def __post_init__(self):
        object.__setattr__(self, "scale", _check_scale("qnn.quantize", self.scale))

    @property
    def inv_scale(self) -> float:
        """``float32(1 / scale)``: what ``x`` is multiplied by."""
        return float(np.float32(1.0 / self.scale))


@dataclass(frozen=True)
class DequantizeAttrs:
    """``scale``: the real value of one step of the integer input."""

    scale: float

    def __post_init__(self):
        object.__setattr__(self, "scale", _check_scale("qnn.dequantize", self.scale))


def _quantize(x: PrimExpr, attrs: QuantizeAttrs) -> PrimExpr:
    y = tx.rounded(tx.cast(_F32, x) * tx.const(_F32, attrs.inv_scale))
    y = tx.max(tx.min(round_half_even(y), tx.const(_F32, 127.0)), tx.const(_F32, -128.0))
    return tx.cast(DataType("int8"), y)


def _dequantize(q: PrimExpr, attrs: DequantizeAttrs) -> PrimExpr:
    return tx.cast(_F32, q) * tx.const(_F32, attrs.scale)


qnn_quantize = declare_unary(
    "qnn.quantize", _quantize, kind="float", attrs=QuantizeAttrs, out_dtype="int8",
    mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="float -> int8: ``sat_int8(rint(float32(x) * float32(1/scale)))`` (ties to even).",
)
qnn_dequantize = declare_unary(
    "qnn.dequantize", _dequantize, kind="int", attrs=DequantizeAttrs, out_dtype="float32",
    mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="integer -> float32: ``float32(q) * float32(scale)``.",
)


@dataclass(frozen=True)
class RequantizeAttrs:
    """``shift`` (1..62): the fixed-point multiplier's fraction bits; ``axis``: the channel axis
    of the accumulator that ``bias`` and ``multiplier`` index; ``out_min``/``out_max``: the
    int8 result's clamp (a fused ReLU or ReLU6 in the quantized domain)."""

    shift: int
    axis: int = 1
    out_min: int = -128
    out_max: int = 127

    def __post_init__(self):
        for name in ("shift", "axis", "out_min", "out_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise KilnError(f"qnn.requantize: {name} must be an int, got {v!r}")
        if not 1 <= self.shift <= 62:
            raise KilnError(f"qnn.requantize: shift must be in 1..62, got {self.shift}")
        if not -128 <= self.out_min <= self.out_max <= 127:
            raise KilnError(f"qnn.requantize: need -128 <= out_min <= out_max <= 127, got "
                            f"{self.out_min}, {self.out_max}")


def _requantize_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "qnn.requantize", "acc")
    if str(x.dtype) != "int32":
        raise StructInfoError(f"qnn.requantize: acc must be int32, got {x.dtype}")
    shape = arg_shape(x)
    ndim = arg_ndim(x)
    axis = call.attrs.axis
    if ndim >= 0 and not -ndim <= axis < ndim:
        raise StructInfoError(f"qnn.requantize: axis {axis} out of range for {ndim} dims")
    for i, name in ((1, "bias"), (2, "multiplier")):
        p = tensor_arg(call, i, "qnn.requantize", name)
        pshape = arg_shape(p)
        if str(p.dtype) != "int32" or pshape is None or len(pshape) != 1:
            raise StructInfoError(f"qnn.requantize: {name} must be a 1-D int32 tensor, got "
                                  f"{p}")
        n = getattr(pshape[0], "value", None)
        c = getattr(shape[axis], "value", None) if shape is not None else None
        if n is not None and c is not None and n not in (1, c):
            raise StructInfoError(f"qnn.requantize: {name} has {n} elements; the acc has {c} "
                                  f"channels along axis {axis}")
    return tensor_sinfo(shape, "int8", ndim=ndim)


def _requantize_compute(acc: te.Tensor, bias: te.Tensor, mult: te.Tensor,
                        attrs: RequantizeAttrs) -> te.Tensor:
    axis = attrs.axis % len(acc.shape)

    def per_channel(t: te.Tensor, i: tuple[Any, ...]) -> PrimExpr:
        if isinstance(getattr(t.shape[0], "value", None), int) and t.shape[0].value == 1:
            return tx.cast(_I64, t(0))
        return tx.cast(_I64, t(i[axis]))

    def f(*i: Any) -> PrimExpr:
        a = tx.cast(_I64, acc(*i)) + per_channel(bias, i)
        a = tx.max(tx.min(a, tx.const(_I64, 2 ** 31 - 1)), tx.const(_I64, -(2 ** 31)))
        r = tx.shift_right(a * per_channel(mult, i) + tx.const(_I64, 1 << (attrs.shift - 1)),
                           tx.const(_I64, attrs.shift))
        r = tx.max(tx.min(r, tx.const(_I64, attrs.out_max)), tx.const(_I64, attrs.out_min))
        return tx.cast(DataType("int8"), r)

    return te.compute(acc.shape, f, name="requantize")


qnn_requantize = register_op(
    "qnn.requantize",
    inputs=("acc", "bias", "multiplier"),
    infer=_requantize_infer,
    pattern=OpPattern.BROADCAST,
    attrs=RequantizeAttrs,
    compute=_requantize_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="int32 accumulator -> int8: bias, fixed-point multiplier, rounding shift, clamp "
        "(exact definition in kiln.op.quantize).",
)
