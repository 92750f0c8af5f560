"""``nn.softmax`` and ``nn.log_softmax``, and what the row-wise normalizations share.

Both are OPAQUE: several reductions and element-wise passes over the same rows, which the
fuser's single-anchor groups cannot describe. Their computes annotate the output block with
:data:`ROW_AXES` (the reduced axes) for the schedules; half-precision inputs are normalized in
float32 and rounded once (:func:`row_compute_dtype`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import te, tir
from ...graph.shape_utils import normalize_axis
from ...graph.struct_info import TensorStructInfo
from ...ir.dtype import DataType
from ...ir.errors import KilnError, StructInfoError
from ..elementwise import exp, multiply, subtract
from ..linalg import tensor_arg
from ..reduce import sum as reduce_sum
from ..registry import MixedPrecision, OpPattern, register_op

# Block annotations (compute ``attrs``) that tell an op's schedule a fact about its compute.
#: The axes a row-wise op (softmax, layer_norm) reduces over.
ROW_AXES = "kiln.row_axes"


@dataclass(frozen=True)
class SoftmaxAttrs:
    """``axis``: the axis normalized over (negative counts from the end)."""

    axis: int = -1

    def __post_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise KilnError(f"softmax: axis must be an int, got {self.axis!r}")


def _float_like_infer(op: str):
    def infer(call: Any) -> Any:
        x = tensor_arg(call, 0, op, "data")
        if not x.dtype.is_float:
            raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
        if x.ndim >= 0:
            if x.ndim == 0:
                raise StructInfoError(f"{op}: data must have at least one dimension")
            normalize_axis(call.attrs.axis, x.ndim, op)
        return TensorStructInfo(x.shape, x.dtype, x.ndim)

    return infer


def row_compute_dtype(dtype: DataType) -> DataType:
    """Half-precision inputs are normalized in float32 (one rounding at the end)."""
    return DataType("float32") if dtype.bits < 32 else dtype


def drop_axes(idx: Sequence[Any], axes: Sequence[int]) -> tuple:
    return tuple(v for d, v in enumerate(idx) if d not in axes)


def _put(idx: Sequence[Any], axis: int, value: Any) -> tuple:
    return tuple(idx[:axis]) + (value,) + tuple(idx[axis:])


def _row_max(x: Any, axis: int, ct: DataType, name: str) -> Any:
    red_shape = drop_axes(x.shape, [axis])
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    return te.compute(
        red_shape, lambda *i: te.max(tir.cast(ct, x[_put(i, axis, k)]), axis=k), name=name
    )


def _softmax_compute(x: Any, *, attrs: SoftmaxAttrs) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: four stages (max, exp, sum, div)."""
    axis = attrs.axis % x.ndim
    ct = row_compute_dtype(x.dtype)
    mx = _row_max(x, axis, ct, "softmax_max")
    ex = te.compute(
        x.shape, lambda *i: tir.exp(tir.cast(ct, x[i]) - mx[drop_axes(i, [axis])]),
        name="softmax_exp",
    )
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    sm = te.compute(
        drop_axes(x.shape, [axis]), lambda *i: te.sum(ex[_put(i, axis, k)], axis=k),
        name="softmax_sum",
    )
    return te.compute(
        x.shape, lambda *i: tir.cast(x.dtype, ex[i] / sm[drop_axes(i, [axis])]), name="softmax",
        attrs={ROW_AXES: (axis,)},
    )


def _log_softmax_compute(x: Any, *, attrs: SoftmaxAttrs) -> Any:
    """``x - max - log(sum(exp(x - max)))`` along ``axis`` (three stages)."""
    axis = attrs.axis % x.ndim
    ct = row_compute_dtype(x.dtype)
    mx = _row_max(x, axis, ct, "log_softmax_max")
    k = te.reduce_axis((0, x.shape[axis]), name="k")

    def sum_body(*i):
        return te.sum(tir.exp(tir.cast(ct, x[_put(i, axis, k)]) - mx[i]), axis=k)

    sm = te.compute(drop_axes(x.shape, [axis]), sum_body, name="log_softmax_sum")

    def body(*i):
        r = drop_axes(i, [axis])
        return tir.cast(x.dtype, tir.cast(ct, x[i]) - mx[r] - tir.log(sm[r]))

    return te.compute(x.shape, body, name="log_softmax", attrs={ROW_AXES: (axis,)})


def _softmax_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``y (g - sum(g y))`` along the axis, ``y`` the forward result."""
    g, y = output_grad, call
    return [multiply(y, subtract(g, reduce_sum(multiply(g, y), call.attrs.axis, True)))]


softmax = register_op(
    "nn.softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_softmax_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=_softmax_grad,
    doc="Softmax along ``axis`` (max-subtracted for stability).",
)


def _log_softmax_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``g - exp(y) sum(g)`` along the axis, ``y`` the forward result."""
    g = output_grad
    return [subtract(g, multiply(exp(call), reduce_sum(g, call.attrs.axis, True)))]


log_softmax = register_op(
    "nn.log_softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.log_softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_log_softmax_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=_log_softmax_grad,
    doc="Logarithm of the softmax along ``axis``, computed as ``x - max - log(sum(exp(x - "
    "max)))``.",
)
