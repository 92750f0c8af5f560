"""CPU schedule of the scans (``cumsum``, ``cumprod``), of ``topk`` and of the matrix
factorizations and solves, whose lines (matrices) are sequential loops inside one block per
line (``kiln.op.scan``, ``kiln.op.sort``, ``kiln.op.matrix``, ``kiln.op.decompose``)."""

from __future__ import annotations

from typing import Any

from ... import tir
from ...op import scan, sort  # noqa: F401 - declare the ops registered below
from ...op.common import const_int
from ...op.decompose import DECOMPOSE_OPS
from ...op.matrix import MATRIX_OPS
from ..registry import register_schedule
from .generic import PARALLEL_MIN_WORK


# topk and the matrix kernels too: their lines are fused into one parallel loop, like a scan
@register_schedule(("cumsum", "cumprod", "topk", *MATRIX_OPS, *DECOMPOSE_OPS), "c")
def schedule_scan(sch: Any, target: Any) -> None:
    """Fuse the loops over the scan lines into one loop, parallel when there is enough work
    (the serial loop along the axis stays inside the block)."""
    block = sch.get_block(sch.func.attrs.get("op_name", "cumsum"))
    loops = sch.get_loops(block)
    if not loops:
        return  # one line (1-D or flattened): inherently sequential
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    lines = const_int(sch.get(fused).extent)
    body = sch.get(block).body  # (init of the accumulator, the loop along the axis)
    along = const_int(body.seq[1].extent) if isinstance(body, tir.SeqStmt) and isinstance(
        body.seq[1], tir.For) else None
    work = None if lines is None or along is None else lines * along
    if getattr(target, "num_threads", 0) != 1 and (lines is None or lines > 1) and (
            work is None or work >= PARALLEL_MIN_WORK):
        sch.parallel(fused)
