"""CPU schedule of ``tree_ensemble`` (``kiln.op.tree``)."""

from __future__ import annotations

from typing import Any

from ...op import tree  # noqa: F401 - declare the op registered below
from ...op.common import const_int
from ..registry import register_schedule
from .generic import PARALLEL_MIN_WORK


@register_schedule("tree_ensemble", "c")
def schedule_tree_ensemble(sch: Any, target: Any) -> None:
    """The loop over rows parallel when there is enough work (each row walks every tree:
    ``tree_steps`` per row)."""
    block = sch.get_block(sch.func.attrs.get("op_name", "tree_ensemble"))
    loops = sch.get_loops(block)
    if not loops:
        return
    rows = const_int(sch.get(loops[0]).extent)
    steps = int(sch.func.attrs.get("tree_steps", 1))  # trees * (depth + 1) per row
    if getattr(target, "num_threads", 0) != 1 and (rows is None or (
            rows > 1 and rows * steps >= PARALLEL_MIN_WORK)):
        sch.parallel(loops[0])
