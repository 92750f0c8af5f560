"""Measuring candidates (kiln.tune.measure): the local runner isolates each one, so a crash, a
wrong result or a hang marks that candidate bad and the runner -- and the tuner -- go on."""

import re
from dataclasses import replace

import pytest

from kiln.codegen.c.compiler import compile_source
from kiln.ir.errors import CompileError
from kiln.testing import models
from kiln.tune import measure
from kiln.tune.database import TuningDatabase
from kiln.tune.measure import LocalBuilder, LocalMeasurer, LocalRunner, build_candidate
from kiln.tune.tasks import extract_tasks
from kiln.tune.tuner import Tuner

#: C put at the start of the kernel's body to make a candidate misbehave.
FAULTS = {
    "segfault": "*(volatile int*)0 = 1;",
    "wrong": "return 0;",  # leaves the (poisoned) output unwritten
    "hang": "for (volatile int spin = 1; spin;) {}",
}


def sabotage(artifact, fault):
    """``artifact`` with ``FAULTS[fault]`` injected into its kernel, recompiled."""
    sym = artifact.infos[artifact.name].unchecked_symbol
    source, n = re.subn(re.escape(sym) + r"(\([^)]*\)\s*\{)", lambda m: m.group(0) + FAULTS[fault],
                        artifact.source, count=1)
    assert n == 1
    return replace(artifact, lib_path=compile_source(source).lib_path, source=source)


class SabotagingBuilder(LocalBuilder):
    """Builds like the local builder, then breaks the candidates named in ``faults`` (the
    n-th candidate this builder builds -> fault)."""

    def __init__(self, faults):
        super().__init__()
        self.faults, self.count = dict(faults), 0

    def build(self, task, candidates):
        out = super().build(task, candidates)
        for result in out:
            fault = self.faults.get(self.count)
            if fault is not None and result.artifact is not None:
                result.artifact = sabotage(result.artifact, fault)
            self.count += 1
        return out


@pytest.fixture(scope="module")
def task():
    tasks = extract_tasks(models.mlp(batch=4, sizes=(64, 128, 10)).mod, "c")
    return max(tasks, key=lambda t: len(t.tunable))


def test_builder_compiles_candidates_in_parallel_in_their_order(task, monkeypatch):
    values = [dict(task.default)]
    for name, domain in task.tunable.items():
        values += [{**task.default, name: v} for v in domain if v != task.default[name]][:2]
    serial = LocalBuilder(jobs=1).build(task, values)
    # one candidate's compile fails: only that one is marked, the others keep their order
    broken = serial[1].artifact.source
    real = measure.compile_source

    def compile_or_refuse(source, **kw):
        if source == broken:
            raise CompileError("refused by the test")
        return real(source, **kw)

    monkeypatch.setattr(measure, "compile_source", compile_or_refuse)
    parallel = LocalBuilder(jobs=3).build(task, values)
    assert len(parallel) == len(values) >= 3
    for i, (a, b) in enumerate(zip(serial, parallel)):
        assert a.knobs == b.knobs and a.decisions == b.decisions and a.trace == b.trace
        if i == 1 or b.artifact is None:
            assert b.artifact is None and "refused by the test" in b.error
        else:
            assert b.artifact.source == a.artifact.source
            assert b.artifact.lib_path == a.artifact.lib_path


def test_runner_marks_crashes_wrong_results_and_hangs_bad_and_goes_on(task):
    ref = build_candidate(task, task.default).artifact
    runner = LocalRunner(timeout_s=20, repeat=2, min_repeat_s=0.005)
    try:
        results = runner.run(ref, [ref, sabotage(ref, "segfault"), ref, sabotage(ref, "wrong"),
                                   None, ref])
        hang = LocalRunner(timeout_s=8, repeat=1)
        assert hang.run(ref, [ref])[0].ok
        [hung] = hang.run(ref, [sabotage(ref, "hang")])
        assert not hung.ok and hung.error.startswith("timeout")
        assert hang.run(ref, [ref])[0].ok  # a fresh worker after the timeout
        hang.close()
    finally:
        runner.close()
    ok = [r.ok for r in results]
    assert ok == [True, False, True, False, False, True]
    assert "crash" in results[1].error and "SIGSEGV" in results[1].error
    assert "differs from the default schedule's" in results[3].error
    assert results[4].error == "build failed"
    assert all(len(r.times) == 2 and min(r.times) > 0 for r in results if r.ok)
    # timed in alternation with the reference (paired ratios; their spread on a busy machine
    # is too wide for a bound on the default against itself)
    assert all(len(r.ref_times) == 2 and min(r.ref_times) > 0 and r.ratio > 0
               for r in results if r.ok)
    assert results[0].machine["cpus"] >= 1


def test_tuner_records_bad_candidates_and_keeps_tuning(task, tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite")
    # build 0 is the default schedule's measurement, 1-4 the first round: 2 and 4 break
    measurer = LocalMeasurer(SabotagingBuilder({2: "segfault", 4: "wrong"}),
                             LocalRunner(timeout_s=30, repeat=2, min_repeat_s=0.005))
    tuner = Tuner(db, measurer, batch=4)
    try:
        [state] = tuner.tune([task], max_trials=9)
    finally:
        tuner.close()
    records = db.records(task.key, task.target_key)
    bad = [r for r in records if not r.ok]
    assert {("crash" in r.error, "differs" in r.error) for r in bad} == {(True, False),
                                                                        (False, True)}
    assert state.bad == 2 and state.trials == len(records) >= 9
    assert sum(r.ok for r in records) >= 7  # it went on after the bad ones
    best = db.best(task.key, task.target_key)
    # the best time is the best candidate's, or the default's when no candidate beat it (on a
    # busy machine a round of candidates may all time slower than the default)
    assert best.ok and state.best_s == pytest.approx(min(best.ratio, 1.0) * state.default_s)
    assert best.ratio == min(r.ratio for r in records if r.ok)
    assert state.default_s > 0 and state.speedup >= 1.0
