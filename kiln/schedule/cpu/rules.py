"""The CPU's generic schedules: rules by fusion pattern, and what fused functions get.

Most operators need no schedule of their own on a CPU: every element-wise, broadcast and
injective op gets :func:`~kiln.schedule.cpu.generic.schedule_injective` (parallel outer loops, a
SIMD-wide inner loop), every reduction and every op whose output loop takes element-wise
consumers :func:`~kiln.schedule.cpu.generic.schedule_reduction`. Opaque ops are scheduled one by
one: the ones whose loops those two fit are listed here; the others have their own schedule in
this room, next to their family's other schedules.

A fused PrimFunc whose anchor schedule refuses it gets the generic schedule
(:func:`register_fallback`), and an element-wise consumer the anchor's schedule left alone is
computed under the anchor's outermost loop (:func:`_attach_epilogue`).
"""

from __future__ import annotations

from typing import Any

from ...ir.errors import ScheduleError
from ...op import dynamic, host, random  # noqa: F401 - declare the ops registered below
from ...op.registry import OpPattern
from ..registry import (
    register_epilogue,
    register_fallback,
    register_no_schedule,
    register_rule,
    register_schedule,
)
from .generic import schedule_default, schedule_injective, schedule_reduction
from .loops import loop_extent, vector_factor

register_rule({OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE}, "c",
              name="injective")(schedule_injective)
register_rule({OpPattern.COMM_REDUCE, OpPattern.OUT_EWISE_FUSABLE}, "c",
              name="reduction")(schedule_reduction)
register_fallback("c")(schedule_default)

# opaque ops whose loops the generic schedules fit
register_schedule(("random_seed", "categorical_sample"), "c")(schedule_injective)
register_schedule("dynamic_col2im", "c")(schedule_reduction)
register_no_schedule("image_decode", "c", "a host function (Pillow): it never becomes a kernel")
register_no_schedule(host.HOST_OPS, "c", "a host function (sequences, optionals, strings): it "
                     "never becomes a kernel")


@register_epilogue("c")
def _attach_epilogue(sch: Any, target: Any, block: Any, anchor_blocks: set[str]) -> None:
    """Schedule an epilogue block the anchor's schedule left alone: compute it under the
    outermost loop of the anchor block it reads (one chunk of anchor results, still in cache),
    else give it its own injective loop nest."""
    producers = [p for p in sch.get_producers(block) if sch.get(p).name_hint in anchor_blocks]
    if producers:
        outer = sch.get_loops(producers[-1])
        if outer:
            try:
                sch.reverse_compute_at(block, outer[0])
            except ScheduleError:
                pass
            else:
                _vectorize_innermost(sch, target, block, skip=1)
                return
    schedule_injective(sch, target, block)


def _vectorize_innermost(sch: Any, target: Any, block: Any, skip: int = 0) -> None:
    """Vectorize the block's innermost loop when a vector length divides it; the outer
    ``skip`` loops (shared with the anchor) are left alone."""
    loops = sch.get_loops(block)[skip:]
    if not loops:
        return
    inner = loops[-1]
    dtype = sch.get(block).writes[0].buffer.dtype
    factor = vector_factor(target, dtype, loop_extent(sch, inner))
    if factor is None:
        return
    if factor == loop_extent(sch, inner):
        sch.vectorize(inner)
    else:
        _, vi = sch.split(inner, factors=[None, factor])
        sch.vectorize(vi)
