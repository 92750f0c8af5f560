"""Tuning the graph knobs of a model: the layout blocks AlterOpLayout gives each convolution.

A graph knob (:func:`kiln.schedule.knobs.graph_knob`) decides before there are kernels: a
convolution in ``NCHW16c`` instead of ``NCHW8c`` is another kernel, and changes the layout
transforms around it, so its effect is only seen on the whole model. Like TVM's graph tuner
(which picks each convolution's layout from the kernels' measured times plus the transforms'
costs) the decision is made per convolution call; kiln measures it directly: the whole model
built with the candidate decision, timed in alternation with the same model built with that
call's default decision (every other call at its best decision so far), in the measuring child
process (:meth:`kiln.tune.measure.LocalRunner.run_models`: a crash or a wrong output marks the
candidate bad). Calls are visited heaviest first (how often the key occurs, then the
convolution's work), every value of each domain once: coordinate descent, which the small
domains (a few block sizes) make affordable. Records go to the tuning database under
:func:`~kiln.tune.database.graph_key` (the default decision's record has ratio 1), so a run
again skips what is measured, and ``kiln.build(mod, tuning_db=...)`` uses the best.

Kernel tuning (:mod:`kiln.tune.tuner`) comes after: its tasks are extracted from the graph
lowered with the database's graph decisions (:func:`kiln.tune.tasks.extract_tasks` with
``db=``), the kernels ``kiln.build`` will then compile.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import progress
from ..build import lower_graph
from ..codegen.executable import build_executable
from ..ir.module import IRModule
from ..schedule.knobs import graph_knobs
from ..target import Target
from ..transform.bind_params import BindParams
from .database import Record, TuningDatabase, Workload, graph_key, target_key
from .measure import LocalRunner

__all__ = ["GraphTask", "GraphTuneResult", "extract_graph_tasks", "tune_graph"]


@dataclass
class GraphTask:
    """The graph knobs of the op calls sharing one key: ``space`` knob name -> domain,
    ``default`` the pass's own decisions, ``calls`` how many calls of the model have the key."""

    key: str
    space: dict[str, tuple[Any, ...]]
    default: dict[str, Any]
    calls: int = 1

    @property
    def record_key(self) -> str:
        return graph_key(self.key)

    def candidates(self) -> list[dict[str, Any]]:
        """Every decision but the default, one knob changed at a time."""
        return [{**self.default, name: value} for name, domain in self.space.items()
                for value in domain if value != self.default[name]]


@dataclass
class GraphTuneResult:
    """What :func:`tune_graph` did: per key the measured ratios (decision -> time / the
    default's), and the model's time with every key at its best against all defaults."""

    ratios: dict[str, dict[str, float | None]] = field(default_factory=dict)
    trials: int = 0
    bad: int = 0
    seconds: float = 0.0


def _bound(mod: IRModule, params: Mapping[str, Any] | None) -> IRModule:
    return BindParams("main", params)(mod) if params else mod


def extract_graph_tasks(mod: IRModule, target: Target | str = "c",
                        params: Mapping[str, Any] | None = None) -> list[GraphTask]:
    """The graph knobs a model's graph passes ask (for ``target``), one task per key with a
    choice, heaviest first (calls, then the key's convolution size as the pass saw it)."""
    tgt = Target.create(target)
    with graph_knobs() as asked:
        lower_graph(_bound(mod, params), tgt)
    tasks = []
    for key, knobs in asked.asked.items():
        space = {n: dom for n, (dom, _, _) in knobs.items()}
        if all(len(d) < 2 for d in space.values()):
            continue
        tasks.append(GraphTask(key, space, {n: d for n, (_, d, _) in knobs.items()},
                               asked.calls.get(key, 1)))
    return sorted(tasks, key=lambda t: -t.calls)


class _ModelBuilder:
    """Builds the model with given graph decisions into .kiln files in a scratch directory
    (a decision set is built once)."""

    def __init__(self, mod: IRModule, target: Target, directory: str):
        self.mod, self.target, self.directory = mod, target, directory
        self.paths: dict[str, str | None] = {}
        self.errors: dict[str, str] = {}

    @staticmethod
    def _name(decisions: Mapping[str, Mapping[str, Any]]) -> str:
        return repr(sorted((k, sorted(v.items())) for k, v in decisions.items()))

    def error_of(self, decisions: Mapping[str, Mapping[str, Any]]) -> str:
        """Why the build of ``decisions`` failed ('' if it did not)."""
        return self.errors.get(self._name(decisions), "")

    def build(self, decisions: Mapping[str, Mapping[str, Any]]) -> str | None:
        name = self._name(decisions)
        if name in self.paths:
            return self.paths[name]
        path = os.path.join(self.directory, f"model{len(self.paths)}.kiln")
        try:
            with graph_knobs(lambda key: decisions.get(key)):
                lowered = lower_graph(self.mod, self.target)
            build_executable(lowered, self.target).save(path)
        except Exception as err:  # noqa: BLE001 - a decision that does not build is bad
            self.errors[name] = f"{type(err).__name__}: {err}"
            path = None
        self.paths[name] = path
        return path


def _best_decisions(db: TuningDatabase, tasks: list[GraphTask], tkey: str
                    ) -> dict[str, dict[str, Any]]:
    out = {}
    for t in tasks:
        rec = db.best(t.record_key, tkey)
        out[t.key] = {**t.default, **(rec.knobs if rec is not None else {})}
    return out


def tune_graph(mod: IRModule, db: TuningDatabase, target: Target | str = "c",
               params: Mapping[str, Any] | None = None, budget_s: float | None = None,
               runner: LocalRunner | None = None,
               on_trial: Callable[[GraphTask, dict[str, Any], float | None], None] | None = None
               ) -> GraphTuneResult:
    """Tune the graph knobs of ``mod`` into ``db`` for at most ``budget_s`` seconds (None:
    every candidate once); see the module docstring. ``on_trial(task, decision, ratio)``
    reports each measured candidate (ratio None: bad)."""
    tgt = Target.create(target)
    tkey = target_key(tgt)
    mod = _bound(mod, params)
    tasks = extract_graph_tasks(mod, tgt)
    result = GraphTuneResult()
    if not tasks:
        return result
    start = time.monotonic()
    deadline = start + budget_s if budget_s is not None else math.inf
    own_runner = runner is None
    runner = runner or LocalRunner(timeout_s=120.0)
    try:
        with tempfile.TemporaryDirectory(prefix="kiln-graph-tune-") as tmp:
            builder = _ModelBuilder(mod, tgt, tmp)
            best = _best_decisions(db, tasks, tkey)
            for task in tasks:
                done = {repr(sorted(r.knobs.items())) for r in db.records(task.record_key, tkey)}
                todo = [c for c in task.candidates() if repr(sorted(c.items())) not in done]
                ratios = result.ratios.setdefault(task.key, {})
                if not todo or time.monotonic() >= deadline:
                    continue
                db.add_workload(Workload(task.record_key, tkey, task.key, "graph", None))
                reference = builder.build({**best, task.key: task.default})
                if reference is None:
                    continue
                default_stored = repr(sorted(task.default.items())) in done
                for cand in todo:
                    if time.monotonic() >= deadline:
                        break
                    path = builder.build({**best, task.key: cand})
                    [run] = runner.run_models(reference, [path])
                    if path is None:
                        run.error = "build failed: " + builder.error_of({**best, task.key: cand})
                    if run.ok and run.ratio is not None and run.ratio < 1.0:
                        # a win is measured again and judged on all its pairs (one block of
                        # paired runs on a busy machine can favour either side)
                        [again] = runner.run_models(reference, [path])
                        run.times += again.times
                        run.ref_times += again.ref_times
                        run.ok, run.error = again.ok, again.error
                    ratio = run.ratio if run.ok else None
                    if run.ok and not default_stored:
                        # the default's own record: ratio 1 by definition, its times measured
                        db.add_records([Record(task.record_key, tkey, dict(task.default),
                                               "default", list(run.ref_times), ratio=1.0)])
                        default_stored = True
                    db.add_records([Record(task.record_key, tkey, cand, "", list(run.times),
                                           run.ok, run.error, run.machine, ratio=ratio)])
                    result.trials += 1
                    result.bad += not run.ok
                    ratios[repr(cand)] = ratio
                    if on_trial is not None:
                        on_trial(task, cand, ratio)
                    progress.info("tune graph: %s %s: %s", task.key, cand,
                                  "bad: " + run.error if ratio is None else f"{ratio:.3f}")
                best = _best_decisions(db, tasks, tkey)
    finally:
        if own_runner:
            runner.close()
    result.seconds = time.monotonic() - start
    return result
