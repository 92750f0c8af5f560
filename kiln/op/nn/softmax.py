"""``nn.softmax`` and ``nn.log_softmax``, and what the row-wise normalizations share.

Both are OPAQUE: several reductions and element-wise passes over the same rows, which the
fuser's single-anchor groups cannot describe. Their computes annotate the output block with
:data:`ROW_AXES` (the reduced axes) for the schedules; half-precision inputs are normalized in
float32 and rounded once (:func:`row_compute_dtype`), unless ``nn.softmax`` is asked to compute
in the input's own dtype (``in_dtype=True``: ONNX Attention's softmax precision, see
:func:`_softmax_in_dtype`).
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
    """``axis``: the axis normalized over (negative counts from the end). ``in_dtype``
    (``nn.softmax`` only): compute a float16/bfloat16 softmax in that dtype, every step rounded
    to it and the row sum accumulated in it, instead of in float32 with one rounding at the end
    (the default, more accurate); no effect on float32/float64 inputs."""

    axis: int = -1
    in_dtype: bool = False

    def __post_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise KilnError(f"softmax: axis must be an int, got {self.axis!r}")
        if not isinstance(self.in_dtype, bool):
            raise KilnError(f"softmax: in_dtype must be a bool, got {self.in_dtype!r}")


def _float_like_infer(op: str):
    def infer(call: Any) -> Any:
        x = tensor_arg(call, 0, op, "data")
        if not x.dtype.is_float:
            raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
        if call.attrs.in_dtype and op != "nn.softmax":
            raise StructInfoError(f"{op}: in_dtype is an attribute of nn.softmax only")
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


#: The accumulator of ``in_dtype`` softmax row sums: bfloat16 sums accumulate in bfloat16
#: (every add rounded), float16 sums in float32, rounded once; see :func:`_softmax_in_dtype`.
IN_DTYPE_SUM_ACCUMULATOR = {"bfloat16": "bfloat16", "float16": "float32"}


def _softmax_in_dtype(x: Any, axis: int) -> Any:
    """The half-precision softmax of ``in_dtype=True``: the same four stages, each step's
    result rounded to ``x``'s dtype (``x - max``, ``exp``, the row sum, the quotient), as ONNX's
    Softmax function body computes them in its tensor type. The arithmetic is written in
    float32 with explicit casts because a half-precision expression inside a kernel is
    evaluated in float32 and only rounded when stored or cast.

    ONNX leaves the precision of the row sum's accumulation open; kiln accumulates as the ONNX
    reference (numpy) does, which the conformance data encode: a bfloat16 sum in a bfloat16
    accumulator (every add rounded; the schedules keep a short row's sum sequential in index
    order and give a long one vector partial sums), a float16 sum in float32, rounded once. A
    bfloat16 running sum loses the terms below half its ulp (at 4096 keys numpy's is off by
    more than 100%; kiln's partial sums keep it to a few percent), which is why this is not
    the default."""
    dt, wide = x.dtype, DataType("float32")
    acc = DataType(IN_DTYPE_SUM_ACCUMULATOR[str(dt)])
    mx = _row_max(x, axis, dt, "softmax_max")

    def exp_body(*i: Any) -> Any:
        shifted = tir.cast(dt, tir.cast(wide, x[i]) - tir.cast(wide, mx[drop_axes(i, [axis])]))
        return tir.cast(dt, tir.exp(tir.cast(wide, shifted)))

    ex = te.compute(x.shape, exp_body, name="softmax_exp")
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    sm = te.compute(
        drop_axes(x.shape, [axis]),
        lambda *i: te.sum(tir.cast(acc, ex[_put(i, axis, k)]), axis=k), name="softmax_sum",
    )

    def div_body(*i: Any) -> Any:
        total = tir.cast(wide, tir.cast(dt, sm[drop_axes(i, [axis])]))
        return tir.cast(dt, tir.cast(wide, ex[i]) / total)

    return te.compute(x.shape, div_body, name="softmax", attrs={ROW_AXES: (axis,)})


def _softmax_compute(x: Any, *, attrs: SoftmaxAttrs) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: four stages (max, exp, sum, div)."""
    axis = attrs.axis % x.ndim
    ct = row_compute_dtype(x.dtype)
    if attrs.in_dtype and ct != x.dtype:
        return _softmax_in_dtype(x, axis)
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
