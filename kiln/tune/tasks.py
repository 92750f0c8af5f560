"""Tuning tasks: the distinct kernels of a model, each with its search space.

A model's graph passes (``kiln.build.lower_graph``) leave graph functions calling PrimFuncs
(fused kernels). Each distinct kernel (by :func:`~kiln.tune.database.kernel_key`: the same
convolution twice in a ResNet is one task) becomes a :class:`Task` weighted by how often the
model calls it; the tuner multiplies that by the default schedule's measured time to know
where the time goes.

A task's search space is the knobs (:mod:`kiln.schedule.knobs`) its schedule asks, each with
its domain, as the default schedule's trace records them; a candidate that takes another path
through the schedule may ask knobs the default did not, which :meth:`Task.learn_knobs` adds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..build import lower_graph
from ..graph import expr as g
from ..graph.functor import post_order_visit
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..schedule.apply import schedule_with_trace
from ..schedule.knobs import graph_knobs
from ..target import Target
from ..tir.expr import IntImm
from ..tir.function import PrimFunc
from ..tir.schedule import Schedule
from ..transform.bind_params import BindParams
from .database import TuningDatabase, kernel_key, target_key
from .features import FEATURE_NAMES, extract_features

__all__ = ["Task", "extract_tasks", "knob_domains", "make_task"]


def knob_domains(sch: Schedule) -> dict[str, tuple[Any, ...]]:
    """The knobs a schedule's trace asked (name -> domain), in order."""
    out: dict[str, tuple[Any, ...]] = {}
    for inst in sch.trace:
        if inst.kind == "knob":
            a = dict(inst.args)
            out.setdefault(a["name"], tuple(a["domain"]))
    return out


@dataclass
class Task:
    """One kernel to tune: ``func`` unscheduled, called ``weight`` times per model run."""

    name: str
    func: PrimFunc
    target: Target
    weight: int = 1
    key: str = ""
    target_key: str = ""
    #: knob name -> domain, every knob seen so far (see :meth:`learn_knobs`)
    space: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: the default schedule's knob values
    default: dict[str, Any] = field(default_factory=dict)
    #: arithmetic operations per call (from the default schedule's features): what orders
    #: the tasks before their default times are measured
    flops: float = 0.0

    @property
    def op_name(self) -> str | None:
        return self.func.attrs.get("op_name")

    @property
    def tunable(self) -> dict[str, tuple[Any, ...]]:
        """The knobs with a choice (a domain of more than one value)."""
        return {k: d for k, d in self.space.items() if len(d) > 1}

    def learn_knobs(self, sch: Schedule) -> None:
        """Add the knobs a candidate's schedule asked that the space lacked."""
        for name, domain in knob_domains(sch).items():
            self.space.setdefault(name, domain)

    def full(self, knobs: Mapping[str, Any]) -> dict[str, Any]:
        """``knobs`` with the default of every knob it does not name."""
        return {**self.default, **knobs}


def _static(func: PrimFunc) -> bool:
    return all(isinstance(d, IntImm) for b in func.buffers for d in b.shape)


def make_task(name: str, func: PrimFunc, target: Target | str, weight: int = 1) -> Task | None:
    """The task of one unscheduled kernel; None when there is nothing to tune (no knobs with a
    choice, or shapes only known at run time, which a measurement cannot pick)."""
    tgt = Target.create(target)
    if tgt.kind != "c":
        raise KilnError(f"kiln.tune: tuning targets the CPU ('c'), not {tgt.kind!r}")
    if not _static(func):
        return None
    scheduled, sch = schedule_with_trace(func, tgt)
    if sch is None:
        return None
    flops = 2.0 ** float(extract_features(scheduled)[FEATURE_NAMES.index("log_flops")])
    task = Task(name, func, tgt, weight, kernel_key(func), target_key(tgt),
                knob_domains(sch), sch.knob_decisions(), flops)
    return task if task.tunable else None


def _call_counts(mod: IRModule) -> dict[str, int]:
    counts: dict[str, int] = {}

    def visit(e: Any) -> None:
        if isinstance(e, g.Call) and isinstance(e.op, g.Op) and e.op.name == "call_tir":
            name = e.args[0].name_hint
            counts[name] = counts.get(name, 0) + 1

    for _, f in mod.items():
        if isinstance(f, g.Function) and not f.attrs.get("Primitive"):
            post_order_visit(f, visit)
    return counts


def extract_tasks(mod: IRModule, target: Target | str = "c",
                  params: Mapping[str, Any] | None = None, db: TuningDatabase | None = None
                  ) -> list[Task]:
    """The tasks of a model: its graph passes as ``kiln.build`` runs them, then one task per
    distinct tunable kernel, its weight the number of calls of all kernels equal to it.
    ``db``: the graph passes take that database's graph knobs (layout blocks) as
    ``kiln.build(mod, tuning_db=db)`` will, so the tasks are the kernels that build has."""
    tgt = Target.create(target)
    if params:
        mod = BindParams("main", params)(mod)
    with graph_knobs(None if db is None else lambda key: db.graph_knobs_for(key, tgt)):
        lowered = lower_graph(mod, tgt)
    counts = _call_counts(lowered)
    tasks: dict[str, Task] = {}
    for name, func in lowered.items():
        if not isinstance(func, PrimFunc):
            continue
        key = kernel_key(func)
        if key in tasks:
            tasks[key].weight += counts.get(name, 1)
            continue
        task = make_task(name, func, tgt, counts.get(name, 1))
        if task is not None:
            tasks[key] = task
    return list(tasks.values())
