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

*Graph knobs* are the tunable decisions of graph passes, made before there is a kernel to
schedule: the block sizes AlterOpLayout gives a convolution (``NCHW8c`` or ``NCHW16c``...)
change the kernels and the layout transforms between them, so they are keyed by the op call
they decide for (its op, shapes and attributes: :func:`graph_knob`), not by a kernel. Outside
tuning they are the defaults; under :func:`graph_knobs` they come from a lookup (the tuning
database's best record of that key, or the tuner's candidate), and every one asked is noted
with its domain (how the tuner finds a model's graph search space).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tir.schedule import Schedule

__all__ = ["GraphKnobs", "active_schedule", "graph_knob", "graph_knobs", "knob"]

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


#: What a graph knob lookup returns for a key: knob name -> value (None or a missing name:
#: the default).
GraphLookup = Callable[[str], "Mapping[str, Any] | None"]


@dataclass
class GraphKnobs:
    """The graph knobs of one run of the graph passes: ``lookup`` answers them (None: every
    knob its default); ``asked`` notes each knob asked, ``key -> name -> (domain, default,
    decision)``, and ``calls`` how many op calls asked each key."""

    lookup: GraphLookup | None = None
    asked: dict[str, dict[str, tuple[tuple[Any, ...], Any, Any]]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)


_GRAPH: contextvars.ContextVar[GraphKnobs | None] = contextvars.ContextVar(
    "kiln_graph_knobs", default=None)


@contextlib.contextmanager
def graph_knobs(lookup: GraphLookup | None = None) -> Iterator[GraphKnobs]:
    """Answer the graph knobs asked in the ``with`` body from ``lookup`` and note them in the
    :class:`GraphKnobs` this yields."""
    state = GraphKnobs(lookup)
    token = _GRAPH.set(state)
    try:
        yield state
    finally:
        _GRAPH.reset(token)


def graph_knob(key: str, name: str, domain: Sequence[Any], default: Any) -> Any:
    """The value of a graph pass's tunable decision ``name`` for the op call identified by
    ``key`` (equal for calls that compute the same thing: op, shapes, dtypes, attributes), one
    of ``domain``; ``default`` outside :func:`graph_knobs` and where the lookup has no value.
    A looked-up value outside the domain (a database written by another kiln version) is
    ignored: the decision must stay one the pass can carry out."""
    domain = tuple(domain)
    if default not in domain:
        raise ValueError(f"graph knob {name!r} of {key!r}: default {default!r} is not in its "
                         f"domain {domain!r}")
    state = _GRAPH.get()
    if state is None:
        return default
    known = state.asked.setdefault(key, {})
    if name in known:
        decision = known[name][2]
    else:
        values = state.lookup(key) if state.lookup is not None else None
        decision = values.get(name, default) if values else default
        if decision not in domain:
            decision = default
        known[name] = (domain, default, decision)
    state.calls[key] = state.calls.get(key, 0) + 1
    return decision
