"""Default GPU schedules (family ``"gpu"``: CUDA and OpenCL): per-op schedules first, generic
rules for the rest.

:func:`schedule_prim_func` gives every PrimFunc a valid GPU schedule and returns it *lowered*
for the target (lowering checks what a schedule cannot: thread and shared-memory limits,
barrier placement). The order of attempts:

1. the op's own GPU schedule, when one is registered (``@register_schedule(op, "gpu")`` of
   :mod:`kiln.schedule.registry`, in a module of this package); GEMM, convolution, softmax...
   schedules go there;
2. the generic rules of :mod:`kiln.schedule.gpu.rules`, chosen per stage of the function
   (:func:`rule_for_pattern` names the rule an op pattern gets first); they are registered as
   the family's rules for every pattern (:func:`schedule_generic_op`), so the registry audit
   sees every op scheduled on the GPU;
3. the rules without binding opaque stages (what fails to lower with them runs unbound);
4. no binding at all: every stage a kernel of one thread.

The first attempt that schedules *and* lowers wins; its name is recorded in the function's
``kiln.gpu_schedule`` attribute ("op", "rules", "rules-no-outer", "single-thread"), so tests
and tools can see which operators fell back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from ...graph.op_registry import OpPattern
from ...ir.errors import KilnError, LoweringError, ScheduleError
from ...op import host
from ...op.registry import get_op_def
from ...tir.function import PrimFunc
from ...tir.functor import post_order_visit
from ...tir.gpu import KernelLaunch
from ...tir.schedule import Schedule
from ...tir.stmt import ForKind
from ...tir.transform.lower import lower
from ..knobs import active_schedule
from ..registry import register_no_schedule, register_rule, target_family
from . import linalg, rules  # noqa: F401 - linalg registers its schedules

__all__ = ["GPU_KINDS", "SCHEDULE_ATTR", "own_schedule", "rule_for_pattern",
           "schedule_and_lower", "schedule_generic", "schedule_generic_op", "schedule_prim_func"]

GPU_KINDS = ("cuda", "opencl")
#: Logs, per function, the attempt that scheduled it (INFO; DEBUG: the attempts that failed).
logger = logging.getLogger(__name__)
#: Attribute naming the attempt that scheduled a GPU function (see the module docstring).
SCHEDULE_ATTR = "kiln.gpu_schedule"


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


def schedule_generic_op(pattern: OpPattern) -> Callable[[Schedule, Any], None]:
    """The generic rules as the registry's ``schedule(sch, target)`` for ops of ``pattern``
    (``sch`` takes over the result of :func:`schedule_generic`)."""
    def schedule(sch: Schedule, target: Any) -> None:
        sch.adopt(schedule_generic(sch, target, pattern))

    schedule.__name__ = f"schedule_generic_{pattern.name.lower()}"
    return schedule


for _pattern_group in ((OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE),
                       (OpPattern.COMM_REDUCE, OpPattern.OUT_EWISE_FUSABLE),
                       (OpPattern.TUPLE, OpPattern.OPAQUE)):
    register_rule(set(_pattern_group), "gpu", name="generic GPU rules")(
        schedule_generic_op(_pattern_group[0]))
register_no_schedule("image_decode", "gpu",
                     "a host function (Pillow): it never becomes a kernel")
register_no_schedule(host.HOST_OPS, "gpu", "a host function (sequences, optionals, strings): "
                     "it never becomes a kernel")


def own_schedule(op_name: str | None, target: Any) -> Callable[[Schedule, Any], None] | None:
    """The op's own GPU schedule (registered for the ``"gpu"`` family), if any."""
    if not op_name:
        return None
    try:
        opdef = get_op_def(str(op_name))
    except KilnError:
        return None  # a PrimFunc named after no registered op
    return opdef.schedules.get(target_family(target))


def kernel_shapes(lowered: PrimFunc) -> str:
    """``grid x block`` of each kernel of a lowered function (``1x1`` marks a one-thread
    kernel: a stage no rule parallelized)."""
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


def schedule_prim_func(func: PrimFunc, target: Any, knobs: Mapping[str, Any] | None = None
                       ) -> PrimFunc:
    """Schedule ``func`` for the GPU ``target`` and lower it (see the module docstring);
    ``knobs`` as in :func:`schedule_and_lower`."""
    return schedule_and_lower(func, target, knobs)[1]


def schedule_and_lower(func: PrimFunc, target: Any, knobs: Mapping[str, Any] | None = None
                       ) -> tuple[PrimFunc, PrimFunc]:
    """(scheduled, lowered) ``func`` for the GPU ``target`` (see the module docstring);
    ``knobs`` are values for the op schedule's tunable decisions (:mod:`kiln.schedule.knobs`,
    the defaults where not given)."""
    op_name = func.attrs.get("op_name")
    op_sched = own_schedule(op_name, target)
    pattern = _pattern(func)

    def by_op(sch: Schedule) -> Schedule:
        if op_sched is None:
            raise ScheduleError("no GPU schedule registered for the op")
        sch.knob_values = dict(knobs or {})
        with active_schedule(sch):
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
