"""Knobs: the tunable decisions of the default schedules, named, with their domains.

A default schedule is one point of a search space. Where it picks a number or a choice that a
measurement could pick better (a tile size, how many loops go into the parallel loop, a vector
width, an unroll depth), it asks :func:`knob` instead of using a constant::

    rows = knob("gemm_rows", (1, 2, 4, 6, 8), GEMM_ROWS)

Outside tuning this returns the default, so the schedule is unchanged. While
:func:`kiln.schedule.apply.schedule_prim_func` runs a schedule it makes that schedule the
*active* one (:func:`active_schedule`): the knob is then
:meth:`kiln.tir.schedule.Schedule.knob`, which returns the tuner's value when one was given
(``Schedule.knob_values``) and records name, domain and decision in the schedule's trace.
The tuner (:mod:`kiln.tune`) reads the knobs of the default schedule from its trace and
searches over their values; a tuning record is the knob decisions plus the trace they gave.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from typing import Any

from ..tir.schedule import Schedule

__all__ = ["active_schedule", "knob"]

_ACTIVE: contextvars.ContextVar[Schedule | None] = contextvars.ContextVar(
    "kiln_active_schedule", default=None)


@contextlib.contextmanager
def active_schedule(sch: Schedule) -> Iterator[Schedule]:
    """Make ``sch`` the schedule whose knobs :func:`knob` answers, for the ``with`` body."""
    token = _ACTIVE.set(sch)
    try:
        yield sch
    finally:
        _ACTIVE.reset(token)


def knob(name: str, domain: Sequence[Any], default: Any) -> Any:
    """The value of the tunable decision ``name`` (one of ``domain``; ``default`` when not
    tuned or when no schedule is active). See the module docstring."""
    sch = _ACTIVE.get()
    if sch is None:
        return default
    return sch.knob(name, domain, default)
