"""CPU schedules of the scatters (``kiln.op.index``) and of ``take_backward``
(``kiln.op.grad``): independent lines in parallel, the updates inside a line in order."""

from __future__ import annotations

from typing import Any

from ...op.common import const_int
from ...op.index import scatter_elements, scatter_nd, take_backward
from ..registry import register_schedule
from .generic import PARALLEL_MIN_WORK, schedule_injective


@register_schedule((scatter_elements.name, scatter_nd.name), "c")
def _schedule_scatter(sch: Any, target: Any) -> None:
    """The copy is injective (parallel, vectorized). Update lines are independent: their loops
    are fused into one, parallel when there is enough work; inside a line the updates stay
    sequential (indices may repeat, and the order decides which repeated write wins)."""
    name = sch.func.attrs.get("op_name", "scatter_elements")
    schedule_injective(sch, target, block=sch.get_block(f"{name}_copy"))
    loops = sch.get_loops(sch.get_block(name))
    if not loops or getattr(target, "num_threads", 0) == 1:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    n_lines = const_int(sch.get(fused).extent)
    updates = sch.func.buffer_map[sch.func.params[2]]
    work: int | None = 1
    for d in updates.shape:
        work = None if work is None or const_int(d) is None else work * const_int(d)
    if (n_lines is None or n_lines > 1) and (work is None or work >= PARALLEL_MIN_WORK):
        sch.parallel(fused)


@register_schedule(take_backward.name, "c")
def _schedule_take_backward(sch: Any, target: Any) -> None:
    """Lines of the output are independent: fuse their loops into one parallel loop when
    there is enough work (the scatter inside a line stays serial: indices may repeat)."""
    block = sch.get_block("take_backward")
    loops = sch.get_loops(block)
    if not loops or getattr(target, "num_threads", 0) == 1:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    lines = const_int(sch.get(fused).extent)
    grad = sch.func.buffer_map[sch.func.params[0]]
    work = 1
    for d in grad.shape:
        work = None if work is None or const_int(d) is None else work * const_int(d)
    if (lines is None or lines > 1) and (work is None or work >= PARALLEL_MIN_WORK):
        sch.parallel(fused)
