"""Tuning the NPU's product tilings on the simulator, in the model (kiln.tune.npu_tuning): the
planner's knob and its context key, every candidate's numbers, records, resuming, bad
candidates, the check of the tuned model, the build and the CLI."""

import json
import sqlite3

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kiln
from kiln import cli, op
from kiln import graph as g
from kiln.build import npu_pipeline
from kiln.schedule.knobs import graph_knobs
from kiln.schedule.npu import gemm
from kiln.schedule.npu.gemm import (
    TILING_CANDIDATES,
    TILING_KNOB,
    GemmShape,
    feasible_tilings,
    plan_candidates,
    plan_gemm,
    tiling_knob_key,
    tiling_value,
)
from kiln.schedule.npu.ops import GEMM_OPS
from kiln.schedule.npu.region import FUSE_EPILOGUE_KEY
from kiln.target.npu import load_config
from kiln.testing import models
from kiln.transform import PassContext
from kiln.tune import npu_tuning
from kiln.tune.database import Record, TuningDatabase, graph_key, target_key
from kiln.tune.npu_tuning import (
    extract_npu_tasks,
    kernel_cycles,
    run_model,
    tune_npu,
)

RNG = np.random.default_rng(25)
NPU = kiln.Target("npu")


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.2).astype("float32")


W3B = _w(16, 16, 3, 3)
WEIGHTS = [_w(16, 8, 3, 3), W3B, W3B * 0.5, _w(24, 16, 1, 1), _w(32, 24, 1, 1),
           _w(32, 16, 3, 3), _w(40, 32 * 6 * 6)]


def _model():
    """3x3 conv + relu, the same 3x3 conv + relu again (one key, two calls, a fused epilogue
    each), a strided 1x1 conv, a pointwise conv, a grouped conv, then a dense layer: every
    product form of the NPU, with and without an epilogue."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((1, 8, 12, 12), "float32"))
    w1, w2, w3, w4, w5, w6, w7 = (g.const(w) for w in WEIGHTS)
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(op.nn.conv2d(x, w1, padding=(1, 1))))
            h = bb.emit(op.nn.relu(op.nn.conv2d(h, w2, padding=(1, 1))))
            h = bb.emit(op.nn.relu(op.nn.conv2d(h, w3, padding=(1, 1))))
            h = bb.emit(op.nn.conv2d(h, w4, strides=(2, 2)))
            h = bb.emit(op.nn.conv2d(h, w5))
            h = bb.emit(op.nn.conv2d(h, w6, padding=(1, 1), groups=2))
            h = bb.emit(op.reshape(h, (1, 32 * 6 * 6)))
            out = bb.emit_output(op.dense(h, w7))
        bb.emit_func_output(out)
    return bb.get()


def _reference(x):
    """``_model`` in torch, float32."""
    w = [torch.from_numpy(a) for a in WEIGHTS]
    h = F.relu(F.conv2d(torch.from_numpy(x), w[0], padding=1))
    h = F.relu(F.conv2d(h, w[1], padding=1))
    h = F.relu(F.conv2d(h, w[2], padding=1))
    h = F.conv2d(F.conv2d(h, w[3], stride=2), w[4])
    h = F.conv2d(h, w[5], padding=1, groups=2).reshape(1, -1)
    return (h @ w[6].T).numpy()


def _close(out, ref):
    """Float16 operands on the tensor unit, float32 accumulation: 2% of the largest value."""
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.max(np.abs(ref)))


W8 = RNG.integers(-127, 128, (40, 96)).astype("int8")


def _int8_dense():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((24, 96), "int8"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, g.const(W8), out_dtype="int32"))
        bb.emit_func_output(out)
    return bb.get()


def _partitioned(mod):
    return npu_pipeline(target=NPU)(mod)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The model tuned into a fresh database (every candidate of every key)."""
    db = TuningDatabase(tmp_path_factory.mktemp("npu") / "tuning.sqlite")
    mod = _model()
    return mod, db, tune_npu(mod, db, NPU)


def test_plan_gemm_default_and_knob():
    """plan_gemm's default is the cost model's cheapest tiling, the knob's domain its best
    TILING_CANDIDATES; under graph_knobs the looked-up tiling is built, a value outside the
    domain is ignored; a context (a fused epilogue) is another key."""
    cfg = load_config("default")
    shape = GemmShape(1, 200, 1, 96, 160, 1, "float16")
    ranked = feasible_tilings(cfg, shape, 2)
    assert [t.estimate for t in ranked] == sorted(t.estimate for t in ranked)
    assert len(ranked) > TILING_CANDIDATES
    assert plan_gemm(cfg, shape, 2) == ranked[0]
    key = tiling_knob_key(cfg, shape, 2)
    pick = ranked[3]
    with graph_knobs(lambda k: {TILING_KNOB: tiling_value(pick)} if k == key else None
                     ) as asked:
        assert plan_gemm(cfg, shape, 2) == pick
        assert plan_gemm(cfg, shape, 2).knob == key
        assert plan_gemm(cfg, shape, 2, hold=False) == feasible_tilings(cfg, shape, 2, False)[0]
        # the same product with a fused epilogue: its own key, not this decision
        ctx_key = tiling_knob_key(cfg, shape, 2, context="epilogue=relu")
        assert ctx_key != key and ctx_key.startswith(key)
        got = plan_candidates(cfg, shape, 2, context="epilogue=relu")
        assert got[0] == ranked[0] and all(t.knob == ctx_key for t in got)
    domain, default, decision = asked.asked[key][TILING_KNOB]
    assert len(domain) == TILING_CANDIDATES and default == domain[0]
    assert decision == tiling_value(pick) == (pick.m_units, pick.n, pick.k_units, pick.balance)
    assert asked.asked[ctx_key][TILING_KNOB][2] == domain[0]
    with graph_knobs(lambda k: {TILING_KNOB: (999, 1, 1)}):
        assert plan_gemm(cfg, shape, 2) == ranked[0]
    assert tiling_knob_key(load_config("edge"), shape, 2) != key


def test_tasks_are_the_model_products_in_context():
    """One task per key of the built model's product kernels: a conv with its fused relu is
    keyed with the epilogue; without fusion the same convs ask other keys (a record of one
    context is not used in the other)."""
    tasks = extract_npu_tasks(_model(), NPU)
    ops = sorted(op for t in tasks for op in t.ops)
    assert ops == ["matmul", *["nn.conv2d"] * 7]  # dense: W^T folded; grouped: 2 kernels
    assert tasks[0].calls == 2 and all(t.calls <= 2 for t in tasks)
    fused = [t for t in tasks if "epilogue=relu (vrelu)" in t.key]
    assert len(fused) == 2 and sum(t.calls for t in fused) == 3  # the repeated conv: one key
    assert all("+relu" in label for t in fused for label in t.kernels)
    assert all(t.default == t.domain[0] and len(t.domain) >= 2 for t in tasks)
    with PassContext(config={FUSE_EPILOGUE_KEY: False}):
        plain = extract_npu_tasks(_model(), NPU)
    assert not any("epilogue=" in t.key for t in plain)
    assert {t.key for t in plain} & {t.key for t in fused} == set()
    assert {t.key for t in plain} >= {t.key for t in tasks if t not in fused}
    with pytest.raises(kiln.KilnError, match="not an NPU target"):
        extract_npu_tasks(_model(), "c")


def test_int8_candidates_are_exact():
    mod = _int8_dense()
    [task] = extract_npu_tasks(mod, NPU)
    part = _partitioned(mod)
    x = np.random.default_rng(3).integers(-128, 128, (24, 96)).astype("int8")
    want = x.astype("int64") @ W8.astype("int64").T
    for tiling in task.domain:
        run = run_model(part, NPU, {task.key: tiling}, [x])
        assert run.asked[task.key][TILING_KNOB][2] == tiling
        assert run.key_cycles(task.key) > 0
        assert np.array_equal(run.output, want), tiling


def test_tuned_model_is_no_slower_and_build_applies_it(tuned):
    """Every candidate measured in the model; the tuned build (fused epilogues, residency:
    as built by default) is no slower than the default build, per tuned key and in all, and
    computes the model (torch reference)."""
    mod, db, res = tuned
    assert res.bad == 0
    assert res.trials == sum(len(t.domain) for t in res.tasks)
    tkey = target_key(NPU)
    for t in res.tasks:
        recs = db.records(graph_key(t.key), tkey)
        assert sorted(r.knobs[TILING_KNOB] for r in recs) == sorted(t.domain)
        default = next(r for r in recs if r.knobs[TILING_KNOB] == t.default)
        assert default.ratio == 1.0
        assert res.best_cycles[t.key] <= res.default_cycles[t.key]
        assert db.graph_knobs_for(t.key, NPU) == {TILING_KNOB: res.best_tiling[t.key]}
    before, after = res.model_cycles()
    assert after <= before
    assert res.model_tuned <= res.model_default
    base = kiln.build(mod, NPU)
    best = kiln.build(mod, NPU, tuning_db=db)
    x = RNG.standard_normal((1, 8, 12, 12)).astype("float32")
    out_b, out_t = base(x), best(x)
    _close(out_b, _reference(x))
    _close(out_t, _reference(x))
    assert best.last_cycles <= base.last_cycles

    def products(exe):
        phases = kernel_cycles(exe)
        per_key = {}
        for k in exe.kernels:
            if k.op in GEMM_OPS:
                per_key[k.knob] = per_key.get(k.knob, 0.0) + phases[k.label]
        return per_key

    # the keys at another tiling than their default are each no slower (the check); a key
    # at its default may move a few cycles with its neighbours' buffers, the sum may not
    p_b, p_t = products(base), products(best)
    assert p_b.keys() == p_t.keys()
    moved = [t.key for t in res.tasks if res.best_tiling[t.key] != t.default]
    assert all(p_t[k] <= p_b[k] for k in moved), (p_b, p_t)
    assert sum(p_t.values()) <= sum(p_b.values())


def test_resume_measures_only_what_is_missing(tuned, tmp_path):
    mod, db, res = tuned
    again = tune_npu(mod, db, NPU)
    assert again.trials == 0
    assert again.best_tiling == res.best_tiling
    # a copy of the database missing two candidates of the first key: only those are measured
    path = tmp_path / "partial.sqlite"
    src = sqlite3.connect(db.path)
    dst = sqlite3.connect(path)
    src.backup(dst)
    task = res.tasks[0]
    gone = [json.dumps({TILING_KNOB: list(v)}, sort_keys=True) for v in task.domain[-2:]]
    for knobs in gone:
        assert dst.execute("DELETE FROM records WHERE kernel = ? AND knobs = ?",
                           (graph_key(task.key), knobs)).rowcount == 1
    dst.commit()
    dst.close()
    src.close()
    seen = []
    part = tune_npu(mod, TuningDatabase(path), NPU, on_trial=lambda t, c, d: seen.append(
        (t.key, c.tiling)))
    assert seen == [(task.key, v) for v in task.domain[-2:]]
    assert part.trials == 2 and part.model_tuned <= part.model_default


def test_the_check_withdraws_a_record_slower_in_the_model(tuned, tmp_path):
    """A record that claims a tiling is fastest while it is slower in the model (measured in
    another context: here a forged one) is withdrawn by the check of the tuned model, and the
    build then takes the key's next best."""
    mod, db, res = tuned
    path = tmp_path / "forged.sqlite"
    src, dst = sqlite3.connect(db.path), sqlite3.connect(path)
    src.backup(dst)
    src.close()
    dst.close()
    forged = TuningDatabase(path)
    tkey = target_key(NPU)
    task, worst = next((t, r) for t in res.tasks for r in
                       [max((r for r in db.records(graph_key(t.key), tkey) if r.ok),
                            key=lambda r: r.ratio)] if r.ratio > 1.0)
    forged.add_records([Record(graph_key(task.key), tkey, worst.knobs, "forged",
                               [1e-9], True, ratio=1e-3)])
    assert forged.graph_knobs_for(task.key, NPU) == worst.knobs
    again = tune_npu(mod, forged, NPU)
    assert again.trials == 0
    assert (task.key, worst.knobs[TILING_KNOB]) in again.withdrawn
    assert forged.graph_knobs_for(task.key, NPU) != worst.knobs
    assert all(not r.ok and "in the tuned model" in r.error
               for r in forged.records(graph_key(task.key), tkey)
               if r.knobs == worst.knobs)
    assert again.model_tuned <= again.model_default


def _break_run(monkeypatch, fails, message):
    """Make the tuner's model runs raise ``message`` where ``fails(key, tiling)`` holds for a
    key's tiling of the run."""
    real = npu_tuning.run_model

    def run(part, target, tilings, inputs):
        if any(fails(k, t) for k, t in tilings.items()):
            raise RuntimeError(message)
        return real(part, target, tilings, inputs)

    monkeypatch.setattr(npu_tuning, "run_model", run)


def test_a_failing_candidate_is_found_and_recorded_bad(tmp_path, monkeypatch):
    """A round that fails is split until the candidate at fault: only it is recorded bad."""
    monkeypatch.setattr(gemm, "TILING_CANDIDATES", 2)  # one round: every key's second
    mod = _model()
    tasks = extract_npu_tasks(mod, NPU)
    assert len(tasks) >= 4 and all(len(t.domain) == 2 for t in tasks)
    broken_key, broken = tasks[2].key, tasks[2].domain[1]
    _break_run(monkeypatch, lambda key, tiling: key == broken_key and tiling == broken,
               "simulator crashed")
    db = TuningDatabase(tmp_path / "t.sqlite")
    res = tune_npu(mod, db, NPU)
    assert res.trials == 2 * len(tasks) and res.bad == 1
    bad = [r for t in tasks for r in db.records(graph_key(t.key), target_key(NPU))
           if not r.ok]
    assert [r.knobs[TILING_KNOB] for r in bad] == [broken]
    assert "simulator crashed" in bad[0].error
    assert db.graph_knobs_for(broken_key, NPU)[TILING_KNOB] != broken


def test_cli_tunes_npu_and_compile_uses_it(tmp_path, capsys):
    model = models.model_script(tmp_path, "small_cnn(batch=1, channels=8, size=16)")
    db = tmp_path / "t.sqlite"
    args = ["tune", str(model), "--target", "npu -hw=edge", "--db", str(db)]
    assert cli.main(args) == 0
    out, err = capsys.readouterr()
    assert "[npu] nn.conv2d" in err and "of the default's" in err
    assert "NPU tilings:" in out and "products' cycles per model run" in out
    assert "cost model vs simulator" in out
    assert "--target 'npu -hw=edge' --tuning-db" in out
    assert cli.main(args) == 0  # again: nothing left to measure
    out, err = capsys.readouterr()
    assert "[npu]" not in err and "0 candidates simulated" in out
    m = models.small_cnn(batch=1, channels=8, size=16)
    edge = kiln.Target("npu", hw="edge")
    x = m.inputs[0]
    # as built by default: fused epilogues, residency -- the context the tuner measured in
    tuned, base = kiln.build(m.mod, edge, tuning_db=str(db)), kiln.build(m.mod, edge)
    out, _ = tuned(x), base(x)
    assert tuned.last_cycles <= base.last_cycles
    ref = m.reference(x)
    np.testing.assert_allclose(out, ref, rtol=2e-2, atol=2e-2 * np.max(np.abs(ref)))
    assert cli.main(args + ["--trials", "3"]) == 2
    assert "--ray and --trials are for CPU tuning" in capsys.readouterr().err
