"""Default GPU schedules (CUDA and OpenCL): per-op schedules first, generic rules for the rest.

:func:`schedule_prim_func` gives every PrimFunc a valid GPU schedule and returns it *lowered*
for the target (lowering checks what a schedule cannot: thread and shared-memory limits,
barrier placement). The order of attempts:

1. the op's own GPU schedule, when one is registered (``register_gpu_schedule``: it sets
   ``get_op_def(name).schedules["cuda"]`` / ``["opencl"]``); phase 2's GEMM, convolution,
   softmax... schedules go there;
2. the generic rules of :mod:`kiln.schedule.gpu.rules`, chosen per stage of the function
   (:func:`rule_for_pattern` names the rule an op pattern gets first);
3. the rules without binding opaque stages (what fails to lower with them runs unbound);
4. no binding at all: every stage a kernel of one thread.

The first attempt that schedules *and* lowers wins; its name is recorded in the function's
``kiln.gpu_schedule`` attribute ("op", "rules", "rules-no-outer", "single-thread"), so tests
and tools can see which operators fell back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...ir.errors import LoweringError, ScheduleError
from ...op.registry import OpPattern, get_op_def
from ...tir.function import PrimFunc
from ...tir.schedule import Schedule
from ...tir.transform.lower import lower
from . import rules

__all__ = ["GPU_KINDS", "SCHEDULE_ATTR", "register_gpu_schedule", "rule_for_pattern",
           "schedule_and_lower", "schedule_generic", "schedule_prim_func"]

GPU_KINDS = ("cuda", "opencl")
#: Logs, per function, the attempt that scheduled it (INFO; DEBUG: the attempts that failed).
logger = logging.getLogger(__name__)
#: Attribute naming the attempt that scheduled a GPU function (see the module docstring).
SCHEDULE_ATTR = "kiln.gpu_schedule"


def register_gpu_schedule(op_name: str, schedule: Callable[[Schedule, Any], None],
                          kinds: tuple[str, ...] = GPU_KINDS) -> None:
    """Make ``schedule(sch, target)`` the GPU schedule of ``op_name`` (for fused functions:
    of those it anchors) on the given target kinds."""
    opdef = get_op_def(op_name)
    for kind in kinds:
        opdef.schedules[kind] = schedule


def rule_for_pattern(pattern: OpPattern | None) -> Callable[[Any, Any, Any], bool]:
    """The generic rule tried first on the stages of an op of ``pattern``."""
    if pattern in (OpPattern.COMM_REDUCE, OpPattern.OUT_EWISE_FUSABLE):
        return rules.schedule_reduction_block
    if pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE):
        return rules.schedule_injective_block
    return rules.schedule_reduction_block  # opaque ops: their stages decide


def schedule_generic(sch: Schedule, target: Any, pattern: OpPattern | None = None,
                     outer: bool = True) -> Schedule:
    """``sch`` with the generic rules applied to every stage (``outer``: also bind the
    outermost data-parallel loop of stages no other rule takes). A rule that refuses a stage
    leaves it as it was (each is tried on a copy of the schedule)."""
    from ...tir.stmt import ForKind

    rules.inline_stages(sch)
    first = rule_for_pattern(pattern)
    order = [first] + [r for r in (rules.schedule_injective_block,
                                   rules.schedule_reduction_block) if r is not first]
    if outer:
        order.append(rules.schedule_outer_parallel)
    else:
        order = [r for r in order if r is not rules.schedule_outer_parallel]
    for block in rules.stages(sch):
        loops = sch.get_loops(block)
        if loops and sch.get(loops[0]).kind == ForKind.THREAD_BINDING:
            continue  # shares its nest with a stage scheduled before
        for rule in order:
            trial = sch.copy()
            try:
                if rule(trial, target, block):
                    sch = trial
                    break
            except ScheduleError:
                continue
    return sch


def kernel_shapes(lowered: PrimFunc) -> str:
    """``grid x block`` of each kernel of a lowered function (``1x1`` marks a one-thread
    kernel: a stage no rule parallelized)."""
    from ...tir.functor import post_order_visit
    from ...tir.gpu import KernelLaunch

    shapes: list[str] = []

    def visit(n: Any) -> None:
        if isinstance(n, KernelLaunch):
            grid = "*".join(str(g) for g in n.grid)
            shapes.append(f"{grid}x{n.threads_per_block}")

    post_order_visit(lowered.body, visit)
    return " ".join(shapes)


def _pattern(func: PrimFunc) -> OpPattern | None:
    value = func.attrs.get("op_pattern")
    try:
        return OpPattern(int(value)) if value is not None else None
    except ValueError:
        return None


def schedule_prim_func(func: PrimFunc, target: Any) -> PrimFunc:
    """Schedule ``func`` for the GPU ``target`` and lower it (see the module docstring)."""
    return schedule_and_lower(func, target)[1]


def schedule_and_lower(func: PrimFunc, target: Any) -> tuple[PrimFunc, PrimFunc]:
    """(scheduled, lowered) ``func`` for the GPU ``target`` (see the module docstring)."""
    op_name = func.attrs.get("op_name")
    op_sched = None
    if op_name:
        try:
            op_sched = get_op_def(str(op_name)).schedules.get(target.kind)
        except Exception:  # noqa: BLE001 - a PrimFunc named after no registered op
            op_sched = None
    pattern = _pattern(func)

    def by_op(sch: Schedule) -> Schedule:
        if op_sched is None:
            raise ScheduleError("no GPU schedule registered for the op")
        op_sched(sch, target)
        return sch

    attempts: list[tuple[str, Callable[[Schedule], Schedule]]] = [
        ("op", by_op),
        ("rules", lambda sch: schedule_generic(sch, target, pattern)),
        ("rules-no-outer", lambda sch: schedule_generic(sch, target, pattern, outer=False)),
        ("single-thread", lambda sch: sch),
    ]
    errors: list[str] = []
    for name, attempt in attempts:
        if name == "op" and op_sched is None:
            continue
        try:
            sch = attempt(Schedule(func))
            scheduled = sch.func.with_attr("scheduled", True).with_attr(SCHEDULE_ATTR, name)
            lowered = lower(scheduled, target)
            if logger.isEnabledFor(logging.INFO):
                logger.info("%s (%s): %s, %s", op_name, func.attrs.get("global_symbol"), name,
                            kernel_shapes(lowered))
            return scheduled, lowered
        except (ScheduleError, LoweringError) as err:
            logger.debug("%s: attempt %s failed: %s", op_name, name, err)
            errors.append(f"{name}: {err}")
    raise LoweringError(f"{func.attrs.get('global_symbol', op_name)}: no GPU schedule lowers "
                        "(" + "; ".join(errors) + ")")
