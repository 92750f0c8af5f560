"""GPU schedules of 2-D pooling (``nn.max_pool2d``, ``nn.avg_pool2d`` and the adaptive pools,
any layout): one thread per output, or a block of threads per output for a large window.

Pooling reads each input about once per output (no reuse to stage in shared memory): what
matters is coalescing and the number of taps each thread runs. The window's padding (a
separate stage of the op) is computed inside the window loop; then

- a small window (fewer than ``row_threshold`` taps, e.g. 3 x 3 max pooling): the output nest
  fused into one loop over ``blockIdx.x`` x ``threadIdx.x`` (consecutive threads, consecutive
  outputs: coalesced stores, loads a stride apart), the window loops unrolled;
- a large window (global pooling: ``adaptive_avg_pool2d`` to 1 x 1 over a 7 x 7 map, every
  pixel of a channel in one output): a row reduction, the window's taps split over the threads
  of a block and combined across them (warp shuffles on CUDA, a shared-memory tree on OpenCL:
  :func:`kiln.schedule.gpu.rules.schedule_reduction_block`).

The average's division and element-wise consumers fused after it are folded into the
reduction's write where the schedule allows, else get the element-wise rule.
"""

from __future__ import annotations

import math
from typing import Any

from ...ir.errors import ScheduleError
from ...tir.expr import IterType
from ...tir.schedule.analysis import as_int
from ..knobs import knob
from ..registry import register_schedule
from . import rules

#: Threads per block of the one-thread-per-output schedule.
POOL_THREADS = (64, 128, 256)
#: Taps from which a window is reduced by a block of threads (global pooling).
ROW_THRESHOLDS = (16, 32, 64, 128)
#: Largest window whose loops are unrolled.
UNROLL_MAX = 64


def _reduction(sch: Any) -> Any:
    for b in rules.stages(sch):
        if any(iv.iter_type == IterType.COMM_REDUCE for iv in sch.get(b).iter_vars):
            return b
    raise ScheduleError("pooling GPU schedule: no reduction stage")


def schedule_window(sch: Any, target: Any, block: Any) -> None:
    """One output per thread, the window loops unrolled (see the module docstring)."""
    loops = rules.perfect_loops(sch, block)
    if loops is None:
        raise ScheduleError("pooling GPU schedule: not a perfect nest")
    roles = rules.loop_roles(sch, block, loops)
    spatial = [lp for lp, r in zip(loops, roles) if r == "spatial"]
    window = [lp for lp, r in zip(loops, roles) if r in ("reduce", "unused")]
    if loops != spatial + window or not spatial:
        raise ScheduleError("pooling GPU schedule: expected the output loops, then the window")
    threads = knob("gpu_pool_threads", POOL_THREADS,
                   min(POOL_THREADS[-1], target.gpu.max_threads_per_block))
    fused = sch.fuse(*spatial) if len(spatial) > 1 else spatial[0]
    rules.bind_flat(sch, target, fused, most=threads)
    taps = [as_int(sch.get(lp).extent) for lp in window]
    if all(t is not None for t in taps) and math.prod(taps) <= UNROLL_MAX:  # type: ignore
        for lp in window:
            sch.unroll(lp)


def _window_taps(sch: Any, block: Any) -> int | None:
    extents = [as_int(iv.dom.extent) for iv in sch.get(block).iter_vars
               if iv.iter_type == IterType.COMM_REDUCE]
    return None if any(e is None for e in extents) else math.prod(extents)  # type: ignore


@register_schedule(("nn.max_pool2d", "nn.avg_pool2d", "nn.adaptive_avg_pool2d",
                    "nn.adaptive_max_pool2d"), "gpu")
def schedule_pool(sch: Any, target: Any) -> None:
    """Pooling on the GPU (see the module docstring)."""
    rules.inline_stages(sch)
    block = _reduction(sch)
    taps = _window_taps(sch, block)
    row_min = knob("gpu_pool_row_threshold", ROW_THRESHOLDS, rules.ROW_MIN)
    if taps is None or taps >= row_min:
        if not rules.schedule_reduction_block(sch, target, block):
            raise ScheduleError("pooling GPU schedule: the window is not a row reduction")
    else:
        schedule_window(sch, target, block)
    for b in rules.stages(sch):
        if b == block or sch.get(b).name_hint == sch.get(block).name_hint:
            continue
        loops = sch.get_loops(b)
        if loops and sch.get(loops[0]).kind.name == "THREAD_BINDING":
            continue
        if not rules.schedule_injective_block(sch, target, b):
            raise ScheduleError(f"pooling GPU schedule: stage {sch.get(b).name_hint!r} left")
