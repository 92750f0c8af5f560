"""CPU schedule of ``non_max_suppression`` (``kiln.op.detection``)."""

from __future__ import annotations

from typing import Any

from ...op.common import const_int
from ...op.detection import non_max_suppression
from ..registry import register_schedule

_OP = non_max_suppression.name


@register_schedule(_OP, "c")
def schedule_nms(sch: Any, target: Any) -> None:
    """Fuse the (batch, class) loops into one loop, parallel when there are several lines (each
    line's selection is serial; lines are independent)."""
    block = sch.get_block(_OP)
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    lines = const_int(sch.get(fused).extent)
    if getattr(target, "num_threads", 0) != 1 and (lines is None or lines > 1):
        sch.parallel(fused)
