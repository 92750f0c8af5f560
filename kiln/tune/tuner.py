"""The tuning loop: a model's tasks, a time budget, a database.

:func:`tune` measures each task's default schedule first (the reference every candidate's
output is checked against, and the time speed-ups are counted from), then spends the budget in
rounds: each round goes to the task with the largest *expected gain* -- its share of the
model's time (calls x the best time so far) times the improvement still expected of it, which
starts at one half and shrinks with the rounds the task got (``1 / (2 sqrt(1 + rounds))``), plus
the relative improvement its last round found (a task still improving keeps its turn). A round
proposes a batch (:class:`~kiln.tune.search.TaskSearch`), measures it
(:class:`~kiln.tune.measure.LocalMeasurer`, or the Ray one), stores every result in the
database (bad ones too, with the reason: they are not tried again) and refits the cost model.
Candidates are compared by their time paired with the default's (the default's time x the
median ratio of alternating measurements), which a busy machine disturbs far less than
times measured minutes apart.

Tuning resumes: the records of a task already in the database are its measured set (not
measured again) and the cost model's first training data.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import progress
from .cost_model import CostModel
from .database import Record, TuningDatabase, Workload
from .measure import LocalMeasurer, Measurer
from .search import TaskSearch
from .tasks import Task

__all__ = ["TaskProgress", "Tuner", "tune"]


@dataclass
class TaskProgress:
    """Where the tuning of one task stands (what the progress display shows)."""

    task: Task
    default_s: float | None = None
    best_s: float | None = None
    trials: int = 0
    bad: int = 0
    rounds: int = 0
    last_gain: float = 0.0
    done: bool = False
    error: str = ""
    history: list[float] = field(default_factory=list)

    @property
    def speedup(self) -> float | None:
        if self.default_s and self.best_s:
            return self.default_s / self.best_s
        return None

    def effective(self, ratio: float | None, mean_s: float | None) -> float | None:
        """A candidate's time as the tuner compares it: the default's time times the paired
        ratio (see :mod:`kiln.tune.worker`), or the plain mean where there is no ratio."""
        if mean_s is None:
            return None
        if ratio is not None and self.default_s:
            return self.default_s * ratio
        return mean_s

    def expected_gain(self) -> float:
        """Seconds per model run this task's next round may save (see the module docstring)."""
        if self.done or self.best_s is None:
            return 0.0
        hope = 0.5 / math.sqrt(1 + self.rounds) + self.last_gain
        return self.task.weight * self.best_s * hope


class Tuner:
    """Tunes tasks into ``db`` (see the module docstring). ``batch``: candidates per round."""

    def __init__(self, db: TuningDatabase, measurer: Measurer | None = None,
                 model: CostModel | None = None, batch: int = 8, seed: int = 0,
                 on_round: Callable[[TaskProgress, list[TaskProgress], float], None] | None = None):
        self.db = db
        self.measurer = measurer or LocalMeasurer()
        self.model = model or CostModel(seed=seed)
        self.batch, self.seed = batch, seed
        self.on_round = on_round
        self.searches: dict[str, TaskSearch] = {}
        self.progress: dict[str, TaskProgress] = {}

    # -- one task --------------------------------------------------------------------------
    def _start(self, task: Task) -> TaskProgress:
        state = TaskProgress(task)
        search = self.searches[task.key] = TaskSearch(task, self.model,
                                                      seed=self.seed + len(self.searches))
        self.progress[task.key] = state
        [m] = self.measurer.measure(task, [task.default])
        if not m.run.ok:
            state.done, state.error = True, f"default schedule: {m.run.error}"
            return state
        state.default_s = state.best_s = m.run.mean_s
        self.db.add_workload(Workload(task.key, task.target_key, task.name, task.op_name,
                                      state.default_s))
        # resume: what the database knows of this task is measured already
        features, times = [], []
        for rec in self.db.records(task.key, task.target_key):
            seconds = state.effective(rec.ratio, rec.mean_s)
            search.add(rec.knobs, seconds)
            state.trials += 1
            state.bad += not rec.ok
            if seconds is not None:
                got = search.features(rec.knobs)
                if got is not None:
                    features.append(got[1])
                    times.append(seconds)
        if features:
            self.model.update(features, times, state.default_s)
        if not search.measured:
            self._store(task, [m], state, reference=True)
            search.add(m.build.decisions or task.default, state.default_s)
            state.trials += 1
        found = search.best()
        if found is not None:
            state.best_s = min(state.best_s, found[1])
        return state

    def _store(self, task: Task, measured: Sequence[Any], state: TaskProgress,
               reference: bool = False) -> None:
        """Record ``measured`` in the database. ``reference``: the default schedule's own
        measurement, whose ratio to the default is 1 by definition (timed against itself it
        comes out 0.87 or 1.1 on a busy machine: stored so, the database's best could be the
        default by noise while the tuner counts it as 1)."""
        self.db.add_records([
            Record(task.key, task.target_key, m.build.decisions or dict(m.build.knobs),
                   m.build.trace, list(m.run.times), m.run.ok,
                   m.run.error or m.build.error, m.run.machine,
                   ratio=1.0 if reference and m.run.ok else m.run.ratio)
            for m in measured])

    def _confirm(self, task: Task, candidates: Sequence[Any], measured: Sequence[Any],
                 state: TaskProgress) -> None:
        """Measure once more every candidate that beats the best so far, and judge it on all
        its paired timings: among tens of candidates timed on a busy machine the fastest
        single measurement is biased low (the tuner then keeps lucky candidates)."""
        for cand, m in zip(candidates, measured):
            seconds = state.effective(m.run.ratio, m.run.mean_s)
            if seconds is None or state.best_s is None or seconds >= state.best_s:
                continue
            [again] = self.measurer.measure(task, [cand])
            if again.run.ok:
                m.run.times += again.run.times
                m.run.ref_times += again.run.ref_times
            else:
                m.run.ok, m.run.error = False, f"failed when measured again: {again.run.error}"

    def round(self, state: TaskProgress) -> None:
        """Propose, measure, record, learn: one round of one task."""
        task, search = state.task, self.searches[state.task.key]
        state.rounds += 1
        candidates = search.propose(self.batch)
        if not candidates:
            state.done = True
            return
        measured = self.measurer.measure(task, candidates)
        self._confirm(task, candidates, measured, state)
        self._store(task, measured, state)
        before = state.best_s
        features, times = [], []
        for cand, m in zip(candidates, measured):
            decisions = m.build.decisions or cand
            seconds = state.effective(m.run.ratio, m.run.mean_s)
            search.add(decisions, seconds)
            state.trials += 1
            if seconds is None:
                state.bad += 1
                continue
            state.best_s = min(state.best_s, seconds)
            got = search.features(cand)
            if got is not None:
                features.append(got[1])
                times.append(seconds)
        if features:
            self.model.update(features, times, state.default_s)
        state.last_gain = (before - state.best_s) / before if before else 0.0
        state.history.append(state.best_s)
        state.done = search.exhausted()

    # -- all tasks -------------------------------------------------------------------------
    def tune(self, tasks: Sequence[Task], budget_s: float | None = None,
             max_trials: int | None = None) -> list[TaskProgress]:
        """Tune ``tasks`` until ``budget_s`` seconds have passed, every task has had
        ``max_trials`` candidates measured, or every space is exhausted (at least one of the
        limits must be given). Tasks whose default is not measured when the budget ends are
        left out (the heaviest, calls x operations, are started first)."""
        if budget_s is None and max_trials is None:
            raise ValueError("tune: give budget_s or max_trials")
        start = time.monotonic()
        deadline = start + budget_s if budget_s is not None else math.inf
        states = []
        # the heaviest first: a short budget may end before every default is measured
        for task in sorted(tasks, key=lambda t: -t.weight * t.flops):
            if time.monotonic() >= deadline:
                break
            if task.key in self.progress:  # tuned before by this tuner: go on
                states.append(self.progress[task.key])
                continue
            states.append(self._start(task))
            progress.info("tune: %s: default %s", task.name, _ms(states[-1].default_s))
        while time.monotonic() < deadline:
            live = [s for s in states if not s.done
                    and (max_trials is None or s.trials < max_trials)]
            if not live:
                break
            state = max(live, key=TaskProgress.expected_gain)
            self.round(state)
            if self.on_round is not None:
                self.on_round(state, states, deadline - time.monotonic())
        return states

    def close(self) -> None:
        self.measurer.close()


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.4f} ms"


def tune(tasks: Sequence[Task], db: TuningDatabase, budget_s: float | None = None,
         max_trials: int | None = None, measurer: Measurer | None = None, **kwargs: Any
         ) -> list[TaskProgress]:
    """Tune ``tasks`` into ``db`` (see :class:`Tuner`); closes the measurer at the end."""
    tuner = Tuner(db, measurer, **kwargs)
    try:
        return tuner.tune(tasks, budget_s, max_trials)
    finally:
        tuner.close()
