"""CPU schedule of ``ngram_count`` (``kiln.op.text``)."""

from __future__ import annotations

from typing import Any

from ...op import text  # noqa: F401 - declare the op registered below
from ...op.common import const_int
from ..registry import register_schedule
from .generic import PARALLEL_MIN_WORK


@register_schedule("ngram_count", "c")
def schedule_ngram_count(sch: Any, target: Any) -> None:
    """The loop over rows parallel when there is enough work (``row_work`` per row)."""
    block = sch.get_block(sch.func.attrs.get("op_name", "ngram_count"))
    loops = sch.get_loops(block)
    if not loops:
        return
    rows = const_int(sch.get(loops[0]).extent)
    work = int(sch.func.attrs.get("row_work", 1))
    if getattr(target, "num_threads", 0) != 1 and (rows is None or (
            rows > 1 and rows * work >= PARALLEL_MIN_WORK)):
        sch.parallel(loops[0])
