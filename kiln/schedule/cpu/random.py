"""CPU schedule of the random-number operators (``kiln.op.random``)."""

from __future__ import annotations

from typing import Any

from ...op import random  # noqa: F401 - declare the ops registered below
from ...op.common import const_int
from ..registry import register_schedule
from .generic import PARALLEL_MIN_WORK


@register_schedule(("random_uniform", "random_normal", "bernoulli"), "c")
def schedule_random(sch: Any, target: Any, block: Any = None) -> None:
    """Fuse the loops into one loop, parallel when there is enough work, and leave the
    vectorization to the C compiler: it turns Philox's 32x32->64-bit products into
    ``vpmuludq`` lanes, where an explicit vector of uint64 multiplies is emulated with three
    (measured 2.8x slower for random_uniform)."""
    if block is None:
        block = sch.get_block(sch.func.attrs.get("op_name", ""))
    loops = sch.get_loops(block)
    if not loops:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    work = const_int(sch.get(fused).extent)
    if getattr(target, "num_threads", 0) != 1 and (work is None or work >= PARALLEL_MIN_WORK):
        sch.parallel(fused)
