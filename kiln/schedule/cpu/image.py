"""CPU schedule of ``image.resize_axis`` (``kiln.op.image``)."""

from __future__ import annotations

from typing import Any

from ...ir.errors import ScheduleError
from ...op import image  # noqa: F401 - declare the op registered below
from ..registry import register_schedule


@register_schedule("image.resize_axis", "c")
def schedule_resize_axis(sch: Any, target: Any, block: Any = None) -> None:
    """CPU schedule of ``image.resize_axis``: the small coordinate / weight stages stay
    materialized (computed once per output position of the axis, not per element) and the
    output block is parallel over its outer loops."""
    if block is not None:
        blocks = [block]
    else:
        outputs = {id(b) for b in sch.func.buffer_map.values()}
        blocks = [b for b in sch.get_child_blocks(sch.get_block("root"))
                  if any(id(w.buffer) in outputs for w in sch.get(b).writes)]
    for b in blocks:
        try:
            _outer_parallel(sch.copy(), b)
        except ScheduleError:
            continue
        _outer_parallel(sch, b)


def _outer_parallel(sch: Any, block: Any) -> None:
    """Fuse and parallelize all loops of ``block`` but the innermost, which stays a plain
    counted loop: with symbolic lengths the default injective schedule fuses every loop, and
    each element then pays a chain of 64-bit div/mods by run-time lengths."""
    loops = list(sch.get_loops(block))
    if len(loops) != len(sch.get(block).iter_vars) or not loops:
        return  # already transformed
    outer = sch.fuse(*loops[:-1]) if len(loops) > 2 else loops[0]
    sch.parallel(outer)
