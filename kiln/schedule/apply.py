"""Applying schedules: a PrimFunc of the build gets the schedule of the op that made it.

``schedule_prim_func(func, target)`` is what ``kiln.build`` runs on every PrimFunc: the
declaring op's schedule for the target (see :mod:`kiln.schedule.registry`), or for a fused
PrimFunc (made by FuseTIR) :func:`schedule_fused_prim_func`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..ir.errors import ScheduleError
from ..target import Target
from ..tir.expr import BufferLoad, IterType
from ..tir.function import PrimFunc
from ..tir.functor import post_order_visit
from ..tir.schedule import Schedule
from .knobs import active_schedule
from .registry import lookup_epilogue, lookup_fallback, lookup_schedule

__all__ = ["INLINE_MAX_NODES", "inline_is_cheap", "schedule_fused_prim_func", "schedule_prim_func",
           "schedule_with_trace"]


def schedule_prim_func(func: PrimFunc, target: Target,
                       knobs: Mapping[str, Any] | None = None) -> PrimFunc:
    """Apply the default schedule of the op that produced ``func`` (if it declares one).

    A fused PrimFunc (made by FuseTIR) gets :func:`schedule_fused_prim_func`. ``knobs`` are
    values for the schedule's tunable decisions (:mod:`kiln.schedule.knobs`; a tuning
    record's), the defaults where absent.
    """
    return schedule_with_trace(func, target, knobs)[0]


def schedule_with_trace(func: PrimFunc, target: Target, knobs: Mapping[str, Any] | None = None
                        ) -> tuple[PrimFunc, Schedule | None]:
    """:func:`schedule_prim_func`, also returning the schedule that made the result (its
    trace holds the knobs taken, :meth:`Schedule.knob_decisions`); None when ``func`` was
    left as it is (already scheduled, or its op has no schedule)."""
    if func.attrs.get("scheduled"):
        return func, None
    if func.attrs.get("fused_ops"):
        return _schedule_fused(func, target, knobs or {})
    op_name = func.attrs.get("op_name")
    if op_name is None:
        return func, None
    sched = lookup_schedule(op_name, target)
    if sched is None:
        return func, None
    sch = _knobbed(func, knobs or {})
    with active_schedule(sch):
        sched(sch, target)
    return sch.func.with_attr("scheduled", True), sch


def _knobbed(func: PrimFunc, knobs: Mapping[str, Any]) -> Schedule:
    sch = Schedule(func)
    sch.knob_values = dict(knobs)
    return sch


def _writes_output(sch: Any, block: Any) -> bool:
    outs = {id(b) for b in sch.func.buffer_map.values()}
    return any(id(w.buffer) in outs for w in sch.get(block).writes)


def _is_reduction(sch: Any, block: Any) -> bool:
    return any(iv.iter_type == IterType.COMM_REDUCE for iv in sch.get(block).iter_vars)


def _others(sch: Any, anchor_blocks: set[str]) -> list[Any]:
    root = sch.get_block("root")
    return [b for b in sch.get_child_blocks(root) if sch.get(b).name_hint not in anchor_blocks]


def _inline_members(sch: Any, anchor_blocks: set[str]) -> None:
    """Inline every element-wise member stage that writes an intermediate into its consumers
    (producers of a reduction anchor, the inner links of an epilogue chain)."""
    for b in _others(sch, anchor_blocks):
        if _writes_output(sch, b) or _is_reduction(sch, b) or not inline_is_cheap(sch, b):
            continue
        try:
            sch.compute_inline(b)
        except ScheduleError:
            pass


def _loop_signature(sch: Any, block: Any) -> tuple[tuple[int, Any], ...]:
    """Identity of a block's loop nest: which loop variables, of which kinds."""
    return tuple((id(sch.get(lp).loop_var), sch.get(lp).kind) for lp in sch.get_loops(block))


def _block_or_none(sch: Any, name: str) -> Any:
    try:
        return sch.get_block(name)
    except ScheduleError:
        return None  # inlined by the anchor's schedule


def schedule_fused_prim_func(func: PrimFunc, target: Target,
                             knobs: Mapping[str, Any] | None = None) -> PrimFunc:
    """Schedule a fused PrimFunc (made by FuseTIR).

    1. Inline the element-wise member stages that write intermediates into their consumers, so
       producers of a reduction anchor vanish into it and an epilogue chain becomes one block.
    2. Fold an epilogue into an anchor stage that is a plain element-wise store (e.g. the
       division of an average pool) with ``reverse_compute_inline``.
    3. Apply the anchor op's schedule: its blocks kept their names through FuseTIR, and op
       schedules handle the fused blocks they find next to their own (the CPU schedules of
       dense, matmul, conv2d and pooling compute them under their parallel loop).
    4. An epilogue the anchor's schedule left untouched goes where the target family's epilogue
       hook puts it (:func:`~kiln.schedule.registry.register_epilogue`; on CPUs under the
       anchor's outermost loop, or failing that in its own injective loop nest).

    If the anchor's schedule cannot handle the fused function (a ScheduleError), the function
    gets the family's fallback schedule instead (on CPUs the generic injective/reduction
    one): slower, never wrong. ``knobs`` as in :func:`schedule_prim_func`.
    """
    return _schedule_fused(func, target, knobs or {})[0]


def _schedule_fused(func: PrimFunc, target: Target, knobs: Mapping[str, Any]
                    ) -> tuple[PrimFunc, Schedule]:
    anchor_blocks = set(func.attrs.get("kiln.anchor_blocks", ()))
    op_name = func.attrs.get("op_name")
    sched = lookup_schedule(op_name, target) if op_name else None
    attach = lookup_epilogue(target)
    fallback = lookup_fallback(target)
    sch = _knobbed(func, knobs)
    _inline_members(sch, anchor_blocks)
    for b in _others(sch, anchor_blocks):
        try:
            sch.reverse_compute_inline(b)
        except ScheduleError:
            pass
    epilogues = {sch.get(b).name_hint: _loop_signature(sch, b)
                 for b in _others(sch, anchor_blocks)}
    try:
        with active_schedule(sch):
            if sched is not None:
                sched(sch, target)
            for name, before in epilogues.items():
                b = _block_or_none(sch, name)
                if b is not None and _loop_signature(sch, b) == before and attach is not None:
                    attach(sch, target, b, anchor_blocks)
    except ScheduleError:
        if fallback is None:
            raise
        sch = _knobbed(func, knobs)
        with active_schedule(sch):
            fallback(sch, target)
    return sch.func.with_attr("scheduled", True), sch


# Inlining substitutes a producer's whole expression for every load of its buffer, so a chain of
# stages that each read their input several times (polynomial approximations, for instance)
# grows exponentially. Past this many expression nodes a stage stays materialized.
INLINE_MAX_NODES = 512


def _expr_size(expr: Any) -> int:
    count = 0

    def visit(_: Any) -> None:
        nonlocal count
        count += 1

    post_order_visit(expr, visit)
    return count


def inline_is_cheap(sch: Any, block: Any, max_nodes: int = INLINE_MAX_NODES) -> bool:
    """Whether ``compute_inline(block)`` keeps the consumers' expressions small.

    The cost is the producer's expression size times the number of places its buffer is read
    in the consumers; a stage read once is always cheap to inline.
    """
    blk = sch.get(block)
    value = getattr(blk.body, "value", None)
    if value is None or len(blk.writes) != 1:
        return False
    buf = blk.writes[0].buffer
    loads = 0

    def count(node: Any) -> None:
        nonlocal loads
        if isinstance(node, BufferLoad) and node.buffer is buf:
            loads += 1

    for consumer in sch.get_consumers(block):
        post_order_visit(sch.get(consumer).body, count)
    return loads <= 1 or _expr_size(value) * loads <= max_nodes
