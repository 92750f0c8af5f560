"""CPU schedule of the row-wise multi-stage ops: ``nn.softmax``, ``nn.log_softmax``,
``nn.layer_norm`` (several reductions and element-wise passes over the same rows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import tir
from ...ir.errors import ScheduleError
from ...op.nn.softmax import ROW_AXES
from ..knobs import knob
from ..registry import register_schedule
from .generic import PARALLEL_MIN_WORK, schedule_reduction
from .loops import block_work, loop_extent, schedule_epilogue, vector_factor, vectorize_inner


def schedule_rows(sch: Any, target: Any, out_name: str, reduced_axes: Sequence[int]) -> None:
    """CPU schedule of a multi-stage row-wise op (softmax, log_softmax, layer_norm).

    When the reduced axes are the trailing ones, each row is independent: the output's outer
    loops are fused and run in parallel, every producer stage is computed at that loop (so a
    row's max/sum/exp are made right before its outputs), the element-wise stages are
    vectorized along the contiguous axis, and the row max/sum accumulate vector partial results
    (``rfactor``, see :func:`_row_reduction`). Otherwise every stage gets the generic
    reduction or injective schedule.
    """
    out = sch.get_block(out_name)
    loops = sch.get_loops(out)
    ndim = len(loops)
    n_outer = ndim - len(reduced_axes)
    trailing = sorted(reduced_axes) == list(range(n_outer, ndim))
    if not trailing or n_outer == 0:
        schedule_reduction(sch, target)
        return
    blocks = sch.get_child_blocks(sch.get_block("root"))
    names = [sch.get(b).name_hint for b in blocks]
    producers = blocks[: names.index(out_name)]
    rest = names[names.index(out_name) + 1:]
    outer = sch.fuse(*loops[:n_outer]) if n_outer > 1 else loops[0]
    for b in reversed(producers):
        sch.compute_at(b, outer)
    _vectorize_row(sch, target, out, outer)
    for b in producers:
        blk = sch.get(b)
        if any(iv.iter_type == tir.IterType.COMM_REDUCE for iv in blk.iter_vars):
            _row_reduction(sch, target, b, outer)
        else:
            _vectorize_row(sch, target, b, outer)
    work = block_work(sch, out)
    if loop_extent(sch, outer) != 1 and getattr(target, "num_threads", 0) != 1 and (
        work is None or work >= PARALLEL_MIN_WORK
    ):
        sch.parallel(outer)
    schedule_epilogue(sch, target, rest, outer)


def _vectorize_row(sch: Any, target: Any, block: Any, outer: Any) -> None:
    """Vectorize ``block``'s loop along the row; a row of one element has none left under
    ``outer`` (compute_at drops unit loops), and ``outer`` itself runs over rows."""
    if _loops_below(sch, block, outer):
        vectorize_inner(sch, target, block)


def _row_reduction(sch: Any, target: Any, block: Any, outer: Any) -> None:
    """Schedule a row's max/sum computed under ``outer``.

    A scalar accumulator is a chain of dependent adds (one per 4 cycles); when the row's
    innermost reduced extent is a known multiple of a vector width, the reduction is split
    ``k -> (ko, ki)`` and ``ki`` rfactored into a vector of partial results (a few registers
    after buffer compaction), then combined by a short scalar loop. Otherwise (symbolic or odd
    lengths, or a refused transformation) the init is just hoisted.
    """
    trial = sch.copy()
    try:
        vectorized = _rfactor_row(trial, target, block, outer)
    except ScheduleError:
        vectorized = False
    if vectorized:
        _rfactor_row(sch, target, block, outer)
    else:
        _hoist_init(sch, block, outer)


#: Vector accumulators of a row's max/sum (independent dependency chains), when the row splits
#: into that many vectors: with one, each step waits for the last (a 3-cycle add, a 4-step
#: NaN-propagating max). Paired calls, softmax 64 x 1024 (2 threads, Zen 3): 0.89 of the time
#: with 2 for the max and the sum. The knob ``<block>.row_chains`` (1, 2, 4) per reduction.
ROW_REDUCTION_CHAINS = 2


def _rfactor_row(sch: Any, target: Any, block: Any, outer: Any) -> bool:
    """The rfactor schedule of :func:`_row_reduction`; False when it does not apply."""
    below = _loops_below(sch, block, outer)
    if not below:
        return False
    extent = loop_extent(sch, below[-1])
    lanes = vector_factor(target, sch.get(block).writes[0].buffer.dtype, extent)
    if lanes is None or extent is None or extent < 2 * lanes:
        return False
    name = sch.get(block).name_hint
    chains = knob(f"{name}.row_chains", (1, 2, 4), ROW_REDUCTION_CHAINS)
    chains = chains if extent % (chains * lanes) == 0 else 1
    _, ki = sch.split(below[-1], factors=[None, chains * lanes])
    rf = sch.rfactor(ki, len(sch.get(block).writes[0].buffer.shape))
    # the init's copies of these loops (made next) are unrolled and vectorized too
    if chains > 1:
        kc, ki = sch.split(ki, factors=[chains, lanes])
        sch.unroll(kc)
    sch.vectorize(ki)
    sch.decompose_reduction(rf, _loops_below(sch, rf, outer)[0])
    _hoist_init(sch, block, outer)
    return True


def _loops_below(sch: Any, block: Any, outer: Any) -> list[Any]:
    """The loops of ``block`` inside ``outer``."""
    loops = sch.get_loops(block)
    outer_var = sch.get(outer).loop_var
    pos = [k for k, lp in enumerate(loops) if sch.get(lp).loop_var is outer_var]
    return loops[pos[0] + 1:] if pos else []


def _hoist_init(sch: Any, block: Any, outer: Any) -> None:
    """Give a reduction computed under ``outer`` its init before its own (reduction) loops."""
    below = _loops_below(sch, block, outer)
    if below:
        sch.decompose_reduction(block, below[0])


def _schedule_row_op(out_name: str):
    def schedule(sch: Any, target: Any) -> None:
        block = sch.get(sch.get_block(out_name))
        axes = block.annotations.get(ROW_AXES, (len(block.iter_vars) - 1,))
        schedule_rows(sch, target, out_name, tuple(axes))

    return schedule


register_schedule("nn.softmax", "c")(_schedule_row_op("softmax"))
register_schedule("nn.log_softmax", "c")(_schedule_row_op("log_softmax"))
register_schedule("nn.layer_norm", "c")(_schedule_row_op("layer_norm"))
