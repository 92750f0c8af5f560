"""The NPU lowerings of pooling, row reductions and normalizations (registered with
:func:`.lowering.register_lowering`), all on the vector unit in float: max/average pooling
(ceil_mode and uncounted padding through a map of reciprocal window counts), adaptive average
pooling with equal windows, mean over trailing axes, softmax over the last axis, layer_norm
over trailing axes."""

from __future__ import annotations

from typing import Any

import numpy as np

from .emit import DramTensor
from .lowering import LoweringContext, NotSupported, register_lowering
from .vector import (
    NARROW_FLOATS,
    emit_layer_norm,
    emit_row_mean,
    emit_softmax,
    in_float32,
    pool2d_kernel,
)

__all__ = ["FLOAT_DTYPES"]

#: The float dtypes these lowerings compute in (when the vector unit has them).
FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def _float_input(ctx: LoweringContext, op: str, x: Any) -> DramTensor:
    if not isinstance(x, DramTensor):
        raise NotSupported(f"{op} of a constant")
    if not ctx.config.supports_vector_dtype(x.dtype):
        raise NotSupported(f"{op}: the vector unit does not compute in {x.dtype}")
    if x.dtype not in FLOAT_DTYPES:
        raise NotSupported(f"{op}: only on floats")
    return x


@register_lowering(("nn.max_pool2d", "nn.avg_pool2d"))
def lower_pool2d(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    op = call.op.name
    at = call.attrs
    x = _float_input(ctx, op, args[0])
    if at.layout != "NCHW":
        raise NotSupported(f"{op}: layout {at.layout}")
    kind = ("maxnm" if at.ignore_nan else "max") if op == "nn.max_pool2d" else "avg"
    if kind == "avg" and x.dtype in NARROW_FLOATS:  # the window's sum in float32
        return in_float32(ctx, op, x, out, lambda wx, wo: _pool(ctx, op, wx, wo, kind, at))
    _pool(ctx, op, x, out, kind, at)


def _pool(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor, kind: str,
          at: Any) -> None:
    divisor, scale = None, None
    if kind == "avg":
        counts = _window_counts(x.shape[2:], out.shape[2:], at)
        if np.all(counts == counts.flat[0]):
            divisor = float(counts.flat[0])
        else:  # ceil_mode or uncounted padding: windows differ, scaled by a constant map
            scale = ctx.constant((1.0 / counts).astype(x.dtype))
    pool2d_kernel(ctx, op, x, out, kind, tuple(at.pool_size), tuple(at.strides),
                  tuple(at.padding), tuple(at.dilation), divisor, scale=scale)


def _window_counts(size: tuple[int, ...], out_size: tuple[int, ...], at: Any) -> np.ndarray:
    """(OH, OW): how many taps of each average-pooling window count -- those inside the
    padded input with ``count_include_pad``, else inside the input; taps past the padding
    (ceil_mode's last windows) never count."""
    per_dim = []
    for d in range(2):
        k, s, dil = at.pool_size[d], at.strides[d], at.dilation[d]
        lo_pad, hi_pad = at.padding[d], at.padding[d + 2]
        lo, hi = (-lo_pad, size[d] + hi_pad) if at.count_include_pad else (0, size[d])
        pos = np.arange(out_size[d])[:, None] * s - lo_pad + np.arange(k)[None, :] * dil
        per_dim.append(((pos >= lo) & (pos < hi)).sum(axis=1))
    return np.outer(per_dim[0], per_dim[1]).astype(np.float64)


@register_lowering("nn.adaptive_avg_pool2d")
def lower_adaptive_avg_pool2d(ctx: LoweringContext, call: Any, args: list[Any],
                              out: DramTensor) -> None:
    op = call.op.name
    x = _float_input(ctx, op, args[0])
    if call.attrs.layout != "NCHW":
        raise NotSupported(f"{op}: layout {call.attrs.layout}")
    h, w = x.shape[2:]
    oh, ow = out.shape[2:]
    if (oh, ow) == (1, 1):
        return emit_row_mean(ctx, op, x, out, x.shape[0] * x.shape[1])
    if h % oh or w % ow:
        raise NotSupported(f"{op}: {h}x{w} -> {oh}x{ow} has unequal windows")

    def pool(a: DramTensor, o: DramTensor) -> None:
        pool2d_kernel(ctx, op, a, o, "avg", (h // oh, w // ow), (h // oh, w // ow),
                      (0, 0, 0, 0), (1, 1), float(h // oh * (w // ow)))

    if x.dtype in NARROW_FLOATS:  # the window's sum in float32
        return in_float32(ctx, op, x, out, pool)
    pool(x, out)


def trailing_reduction_rows(op: str, shape: tuple[int, ...], axis: Any) -> int:
    """The rows a reduction over ``axis`` of a ``shape`` tensor leaves (the row kernels reduce
    each contiguous row); NotSupported unless the axes are the trailing ones."""
    rank = len(shape)
    axes = list(range(rank)) if axis is None else \
        sorted(a % rank for a in ((axis,) if isinstance(axis, int) else axis))
    if not axes or axes != list(range(rank - len(axes), rank)):
        raise NotSupported(f"{op} over axes {axes} (only trailing axes)")
    return int(np.prod(shape[:rank - len(axes)], dtype=np.int64))


@register_lowering("mean")
def lower_mean(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """A mean over trailing axes (global average pooling as ONNX exports it)."""
    x = _float_input(ctx, "mean", args[0])
    emit_row_mean(ctx, "mean", x, out, trailing_reduction_rows("mean", x.shape, call.attrs.axis))


@register_lowering("nn.softmax")
def lower_softmax(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = _float_input(ctx, "nn.softmax", args[0])
    if call.attrs.axis not in (-1, len(x.shape) - 1) or x.dtype != "float32":
        raise NotSupported("nn.softmax: only over the last axis, in float32")
    emit_softmax(ctx, "nn.softmax", x, out)


@register_lowering("nn.layer_norm")
def lower_layer_norm(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                     ) -> None:
    """Over trailing axes, in float32 (the vector unit's reductions and ``vrsqrt``)."""
    x = _float_input(ctx, "nn.layer_norm", args[0])
    rank = len(x.shape)
    axes = sorted(a % rank for a in call.attrs.axes)
    if axes != list(range(rank - len(axes), rank)) or x.dtype != "float32":
        raise NotSupported(f"nn.layer_norm: over axes {axes} in {x.dtype} (only trailing "
                           "axes, in float32)")
    gamma, beta = (ctx.tensor(a) for a in args[1:3])
    emit_layer_norm(ctx, "nn.layer_norm", x, gamma, beta, out, call.attrs.epsilon)
