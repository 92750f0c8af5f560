"""Data movement on the NPU: transpose, strided_slice and concat as strided DMAs.

Each is a copy kernel of :func:`.vector.emit_elementwise` (a ``vmov`` between the DMA-in and
DMA-out of the double-buffered pipeline) whose source or destination is a
:class:`~.emit.DramView`: a transpose reads its operand with permuted strides, a slice with
its start as an offset and its steps as strides, and each input of a concatenation is written
to its place in the result (one kernel per input). The DMA engine does the index arithmetic;
adjacent dims that stay contiguous are merged, so a transpose that keeps the innermost axis
moves whole rows per transfer.
"""

from __future__ import annotations

from typing import Any

from .emit import DramTensor, DramView
from .lowering import LoweringContext, NotSupported, register_lowering
from .vector import VecStep, emit_elementwise

__all__ = ["copy_kernel"]

_MOVE = [VecStep("vmov", (("in", 0),))]


def copy_kernel(ctx: LoweringContext, op: str, dst: DramTensor | DramView,
                src: DramTensor | DramView) -> None:
    """``dst = src`` element by element (both of one shape and dtype), by strided DMAs."""
    if not ctx.config.supports_vector_dtype(src.dtype):
        raise NotSupported(f"{op}: the vector unit does not move {src.dtype}")
    limit = ctx.config.encoding.max_stride
    for t in (dst, src):
        if any(abs(s) > limit for s in t.strides):
            raise NotSupported(f"{op}: a stride of {t.strides} exceeds the encoding's "
                               f"{limit}")
    emit_elementwise(ctx, op, dst, [src], _MOVE)


@register_lowering("transpose")
def lower_transpose(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = ctx.tensor(args[0])
    rank = len(x.shape)
    axes = call.attrs.axes
    perm = tuple(range(rank - 1, -1, -1)) if axes is None else tuple(a % rank for a in axes)
    view = DramView(x, 0, out.shape, tuple(x.strides[a] for a in perm))
    copy_kernel(ctx, "transpose", out, view)


@register_lowering("strided_slice")
def lower_strided_slice(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                        ) -> None:
    """``x[begin:end:step]`` per axis: the first element's offset and the steps as strides
    (negative steps read backwards)."""
    x = ctx.tensor(args[0])
    at = call.attrs
    rank = len(x.shape)
    axes = at.axes if at.axes is not None else tuple(range(len(at.begin)))
    steps = at.strides or (1,) * len(at.begin)
    offset = 0
    strides = list(x.strides)
    for a, b, e, s in zip(axes, at.begin, at.end, steps):
        a %= rank
        start, _, _ = slice(b, e if e is None or abs(e) < 2 ** 31 - 1 else None, s).indices(
            x.shape[a])
        offset += start * x.strides[a]
        strides[a] *= s
    copy_kernel(ctx, "strided_slice", out, DramView(x, offset, out.shape, tuple(strides)))


@register_lowering("concat")
def lower_concat(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """One copy kernel per input into its slice of the result (a constant input is uploaded
    to DRAM first)."""
    parts = args[0]
    rank = len(out.shape)
    axis = call.attrs.axis % rank
    if any(p.dtype != out.dtype for p in parts if isinstance(p, DramTensor)):
        raise NotSupported("concat: inputs of different dtypes")
    offset = 0
    for p in parts:
        t = ctx.tensor(p)
        if t.shape[axis]:
            copy_kernel(ctx, "concat", DramView(out, offset * out.strides[axis], t.shape,
                                                out.strides), t)
        offset += t.shape[axis]
