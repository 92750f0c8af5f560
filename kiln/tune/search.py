"""Evolutionary search over a task's knob values, guided by the cost model.

Each round of a task (:meth:`TaskSearch.propose`) breeds candidates from the fastest ones
measured so far (and the default): mutations that change one or two knobs to another value of
their domain, crossovers of two parents, and random points of the space. The cost model scores
them from their scheduled TIR's features; the best scored become the parents of a second,
model-only generation; of everything bred the top-scored are measured, plus a few random ones
(exploration keeps the model honest where it has seen nothing). Candidates are compared by the
decisions their schedule took (:meth:`Schedule.knob_decisions`): two knob assignments that
schedule alike are measured once.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..ir.errors import KilnError
from ..schedule.apply import schedule_with_trace
from .cost_model import CostModel
from .features import extract_features
from .tasks import Task

__all__ = ["TaskSearch", "decision_key"]


def decision_key(decisions: Mapping[str, Any]) -> str:
    """A canonical text of knob decisions (the identity of a candidate)."""
    return repr(sorted(decisions.items()))


class TaskSearch:
    """The search state of one task: what was measured and what to measure next."""

    #: Candidates bred per generation, and model-only generations per round.
    POOL = 32
    GENERATIONS = 2
    #: Share of a round's measurements picked at random rather than by the model.
    EXPLORE = 0.25

    def __init__(self, task: Task, model: CostModel, seed: int = 0):
        self.task, self.model = task, model
        self.rng = random.Random(seed)
        #: decision key -> (knob decisions, seconds or None for a bad candidate)
        self.measured: dict[str, tuple[dict[str, Any], float | None]] = {}
        self._features: dict[str, tuple[dict[str, Any], np.ndarray] | None] = {}
        self.rounds = 0

    # -- the space -------------------------------------------------------------------------
    def space_size(self) -> int:
        return math.prod(len(d) for d in self.task.tunable.values())

    def exhausted(self) -> bool:
        """Whether (about) every point of the space has been measured."""
        return len(self.measured) >= self.space_size()

    def best(self) -> tuple[dict[str, Any], float] | None:
        good = [(t, k) for k, t in self.measured.values() if t is not None]
        if not good:
            return None
        t, k = min(good, key=lambda x: x[0])
        return k, t

    def add(self, decisions: Mapping[str, Any], seconds: float | None) -> None:
        self.measured[decision_key(decisions)] = (dict(decisions), seconds)

    # -- breeding --------------------------------------------------------------------------
    def _random(self) -> dict[str, Any]:
        return {k: self.rng.choice(d) for k, d in self.task.tunable.items()}

    def _mutate(self, parent: Mapping[str, Any]) -> dict[str, Any]:
        child = dict(parent)
        names = list(self.task.tunable)
        for name in self.rng.sample(names, min(len(names), self.rng.choice((1, 1, 2)))):
            child[name] = self.rng.choice(self.task.tunable[name])
        return child

    def _crossover(self, a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
        return {k: (a if self.rng.random() < 0.5 else b).get(k, self.task.default.get(k))
                for k in self.task.tunable}

    def _parents(self, k: int = 5) -> list[dict[str, Any]]:
        good = sorted(((t, d) for d, t in self.measured.values() if t is not None),
                      key=lambda x: x[0])
        return [d for _, d in good[:k]] or [dict(self.task.default)]

    def features(self, knobs: Mapping[str, Any]) -> tuple[dict[str, Any], np.ndarray] | None:
        """(decisions, features) of the schedule ``knobs`` give; None when the schedule
        refuses them."""
        key = decision_key(self.task.full(knobs))
        if key not in self._features:
            try:
                func, sch = schedule_with_trace(self.task.func, self.task.target,
                                                self.task.full(knobs))
            except KilnError:
                self._features[key] = None
            else:
                decisions = sch.knob_decisions() if sch is not None else dict(knobs)
                self.task.learn_knobs(sch)
                self._features[key] = (decisions, extract_features(func))
        return self._features[key]

    def _breed(self, parents: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for _ in range(self.POOL):
            r = self.rng.random()
            if r < 0.6:
                out.append(self._mutate(self.rng.choice(parents)))
            elif r < 0.8 and len(parents) > 1:
                out.append(self._crossover(*self.rng.sample(parents, 2)))
            else:
                out.append(self._random())
        return out

    def random_candidates(self, n: int, tries: int = 200
                          ) -> list[tuple[dict[str, Any], np.ndarray]]:
        """Up to ``n`` distinct unmeasured random points with their features (held-out
        candidates to check the cost model on)."""
        out: dict[str, tuple[dict[str, Any], np.ndarray]] = {}
        for _ in range(tries):
            if len(out) >= n:
                break
            got = self.features(self._random())
            if got is not None and decision_key(got[0]) not in self.measured:
                out.setdefault(decision_key(got[0]), got)
        return list(out.values())

    def propose(self, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` unmeasured candidates (knob decisions) to measure next."""
        self.rounds += 1
        scored: dict[str, tuple[dict[str, Any], np.ndarray]] = {}
        parents = self._parents()
        for _ in range(self.GENERATIONS):
            for knobs in self._breed(parents):
                got = self.features(knobs)
                if got is None:
                    continue
                key = decision_key(got[0])
                if key not in self.measured:
                    scored.setdefault(key, got)
            if not scored:
                break
            keys = list(scored)
            pred = self.model.predict([scored[k][1] for k in keys])
            ranked = [keys[i] for i in np.argsort(-pred, kind="stable")]
            parents = [scored[k][0] for k in ranked[:8]] + self._parents(3)
        if not scored:
            return []
        keys = list(scored)
        pred = self.model.predict([scored[k][1] for k in keys])
        ranked = [keys[i] for i in np.argsort(-pred, kind="stable")]
        explore = max(1, round(n * self.EXPLORE)) if self.model.samples else n
        chosen = ranked[:max(0, n - explore)]
        rest = [k for k in ranked if k not in chosen]
        chosen += self.rng.sample(rest, min(len(rest), n - len(chosen)))
        return [scored[k][0] for k in chosen]
