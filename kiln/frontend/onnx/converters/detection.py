"""ONNX NonMaxSuppression: greedy selection, then count and fill (data-dependent rows).

Two steps, all kernels of the compiled model (nothing is specialized to the values of
``max_output_boxes_per_class``, ``iou_threshold`` or ``score_threshold``, which may be graph
inputs: the selection kernel reads them at run time):

1. ``non_max_suppression`` (``kiln/op/detection.py``) visits each (batch, class) line's boxes
   best first (a heap inside the kernel: no full sort) and writes the selected box indices,
   packed at the front of a (B, C, N) tensor, then -1;
2. as for NonZero (``converters/dynamic.py``): the count of the non-negative entries binds the
   number of rows with a host shape function, and ``dynamic_nonzero`` finds each row's
   (batch, class, slot); the box index is read at that slot. Row-major order of the packed
   slots is ONNX's output order (batch, then class, then selection order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from .common import dtype_of, reshape, shape_of, static_int
from .dynamic import runtime_shape


def _scalar_input(node: Any, i: int, what: str, dtype: str, default: Any) -> Any:
    """Input ``i`` (a 1-element tensor; absent: ``default``) as a 0-d tensor of ``dtype``."""
    x = node.input(i)
    if x is None:
        return g.const(np.array(default, dtype=dtype))
    dims = [static_int(d) for d in shape_of(x)] if x.struct_info.shape is not None else [None]
    if None in dims or int(np.prod(dims)) != 1:
        raise node.error(f"{what} must hold one value, got {x.struct_info}")
    if dtype_of(x) != dtype:
        x = op.cast(x, dtype)
    return reshape(x, ())


@converter("NonMaxSuppression", since=10)
def non_max_suppression(ctx: Any, node: Any) -> Any:
    boxes, scores = node.input(0), node.input(1)
    dt = dtype_of(boxes)
    if dtype_of(scores) != dt or not np.issubdtype(np.dtype(dt), np.floating):
        raise node.error(f"boxes and scores must be float tensors of one dtype, got "
                         f"{boxes.struct_info} and {scores.struct_info}")
    if len(shape_of(boxes)) != 3 or len(shape_of(scores)) != 3:
        raise node.error(f"boxes must be (B, N, 4) and scores (B, C, N), got "
                         f"{boxes.struct_info} and {scores.struct_info}")
    if static_int(shape_of(boxes)[2]) != 4:
        raise node.error(f"boxes must have 4 coordinates per box, got {boxes.struct_info}")
    center = int(node.attr("center_point_box", 0))
    if center not in (0, 1):
        raise node.error(f"center_point_box must be 0 or 1, got {center}")
    max_out = _scalar_input(node, 2, "max_output_boxes_per_class", "int64", 0)
    iou = _scalar_input(node, 3, "iou_threshold", dt, 0)
    score_thr = _scalar_input(node, 4, "score_threshold", dt, 0)
    # 1. greedy selection: (B, C, N) box indices packed at the front of each line, then -1
    sel = ctx.emit(op.non_max_suppression(
        boxes, scores, max_out, iou, score_thr, center_point_box=bool(center),
        use_score_threshold=node.has_input(4)), f"{node.name}_selected")
    # 2. count, then fill (batch, class, slot) rows in row-major order
    mask = ctx.emit(op.cast(op.greater_equal(sel, g.const(np.array(0, np.int64))), "int64"),
                    f"{node.name}_mask")
    counts = ctx.emit(op.cumsum(mask), f"{node.name}_counts")
    total = ctx.emit(op.sum(mask), f"{node.name}_count")
    (k,) = runtime_shape(ctx, node, "values", [total], [None], "count")
    slots = ctx.emit(op.transpose(op.dynamic_nonzero(mask, counts, (3, k)), (1, 0)),
                     f"{node.name}_slots")
    box = op.expand_dims(op.gather_nd(sel, slots), 1)
    return op.concat([op.strided_slice(slots, (0,), (2,), axes=(1,)), box], axis=1)
