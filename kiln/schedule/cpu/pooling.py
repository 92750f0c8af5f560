"""CPU schedule of the pooling operators (``nn.max_pool2d``, ``nn.avg_pool2d`` and their
adaptive forms)."""

from __future__ import annotations

from typing import Any

from ... import tir
from ...op.nn.pooling import CARRIED_INNER, UNIT_STRIDE_W
from ..registry import register_schedule
from .loops import (
    block_work,
    loop_extent,
    other_blocks,
    parallel_outer,
    schedule_epilogue,
    split_off,
    vector_factor,
)


@register_schedule(("nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d",
                    "nn.adaptive_max_pool2d"), "c")
def _schedule_pool(sch: Any, target: Any) -> None:
    """Parallel over the outer output axes; the window loops inside, accumulating in place.

    When the innermost axis is W and the window reads it contiguously (unit stride, no
    padding guard) — or the innermost axis is a channel axis (NHWC, NCHW8c), always contiguous
    — that axis is vectorized: its vector loop goes under the window loops, so every tap is one
    vector load and one vector max/add. An average's division follows each parallel chunk of
    sums.
    """
    red = next(b for b in sch.get_child_blocks(sch.get_block("root")) if any(
        iv.iter_type == tir.IterType.COMM_REDUCE for iv in sch.get(b).iter_vars))
    rest = other_blocks(sch, {sch.get(red).name_hint})
    loops = sch.get_loops(red)
    spatial, (ry, rx) = list(loops[:-2]), loops[-2:]
    blk = sch.get(red)
    work = block_work(sch, red)
    factor = None
    if blk.annotations.get(UNIT_STRIDE_W, False) or blk.annotations.get(CARRIED_INNER, False):
        factor = vector_factor(target, blk.writes[0].buffer.dtype, loop_extent(sch, spatial[-1]))
    if factor is not None:
        xo, xi = split_off(sch, spatial[-1], factor)
        sch.reorder(xo, ry, rx, xi)
        init = sch.decompose_reduction(red, ry)
        sch.vectorize(xi)
        sch.vectorize(sch.get_loops(init)[-1])
    else:
        sch.decompose_reduction(red, ry)
    outer = parallel_outer(sch, spatial[:3], target, work=work)
    # an average's division (and any fused consumer) follows each parallel chunk of sums
    schedule_epilogue(sch, target, rest, outer)
