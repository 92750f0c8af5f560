"""Graph knobs: the layout blocks AlterOpLayout gives convolutions, as a tuning space
(kiln.schedule.knobs.graph_knob, kiln.tune.graph_tuning)."""

import numpy as np
import pytest

import kiln
from kiln import cli
from kiln.build import lower_graph
from kiln.codegen.executable import build_executable
from kiln.schedule.knobs import graph_knob, graph_knobs
from kiln.target import Target
from kiln.testing import models
from kiln.tune.database import Record, TuningDatabase, graph_key, target_key
from kiln.tune.graph_tuning import extract_graph_tasks, tune_graph
from kiln.tune.tasks import extract_tasks


def _model():
    # 16 channels: on AVX2 (8 lanes) blocks of 4, 8 and 16 output channels; on AVX-512 8, 16, 32
    return models.resnet_block_cnn(batch=1, channels=16, size=12, blocks=1)


def test_graph_knob_outside_and_inside_a_lookup():
    assert graph_knob("k", "blocks", (8, 16), 8) == 8  # no active lookup: the default
    with graph_knobs(lambda key: {"blocks": 16} if key == "k" else None) as state:
        assert graph_knob("k", "blocks", (8, 16), 8) == 16
        assert graph_knob("k", "blocks", (8, 16), 8) == 16  # asked again: the same, counted
        assert graph_knob("other", "blocks", (8, 16), 8) == 8
    assert state.asked["k"]["blocks"] == ((8, 16), 8, 16)
    assert state.calls == {"k": 2, "other": 1}
    # a value outside the domain (another kiln version's record) falls back to the default
    with graph_knobs(lambda key: {"blocks": 32}):
        assert graph_knob("k", "blocks", (8, 16), 8) == 8
    with pytest.raises(ValueError, match="not in its domain"):
        graph_knob("k", "blocks", (8, 16), 4)


def test_every_layout_decision_builds_and_matches_the_reference():
    model = _model()
    tasks = extract_graph_tasks(model.mod, "c")
    # the stem (3 input channels) and the block's 16 -> 16 convs (two of one key)
    assert len(tasks) == 2 and sorted(t.calls for t in tasks) == [1, 2]
    assert all("conv2d_blocks" in t.space and len(t.space["conv2d_blocks"]) >= 2 for t in tasks)
    want = model.reference(*model.inputs)
    seen = set()
    for task in tasks:
        for cand in task.candidates():
            with graph_knobs(lambda key, t=task, c=cand: c if key == t.key else None) as st:
                exe = build_executable(lower_graph(model.mod, "c"), Target.create("c"))
            assert st.asked[task.key]["conv2d_blocks"][2] == cand["conv2d_blocks"]
            got = exe(*model.inputs)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)
            seen.add(cand["conv2d_blocks"])
    assert len(seen) >= 3


def test_tune_graph_records_resumes_and_build_uses_the_best(tmp_path):
    model = _model()
    db = TuningDatabase(tmp_path / "t.sqlite")
    result = tune_graph(model.mod, db, "c")
    tasks = extract_graph_tasks(model.mod, "c")
    n_cand = sum(len(t.candidates()) for t in tasks)
    assert result.trials == n_cand and result.bad == 0
    tkey = target_key("c")
    for t in tasks:
        recs = db.records(t.record_key, tkey)
        assert len(recs) == len(t.candidates()) + 1  # and the default's, ratio 1
        assert [r.ratio for r in recs if r.knobs == t.default] == [1.0]
        assert all(r.ok and r.ratio > 0 for r in recs)
        assert db.workload(t.record_key, tkey).name == t.key
    # again: everything is measured, nothing new
    assert tune_graph(model.mod, db, "c").trials == 0

    # a record that is best for the block convs: kiln.build and the task extraction take it
    block = next(t for t in tasks if t.calls == 2)
    pick = block.candidates()[0]
    db.add_records([Record(graph_key(block.key), tkey, pick, "", [1e-6], ratio=0.01)])
    assert db.graph_knobs_for(block.key, "c") == pick
    with graph_knobs(lambda key: db.graph_knobs_for(key, "c")) as st:
        lower_graph(model.mod, "c")
    assert st.asked[block.key]["conv2d_blocks"][2] == pick["conv2d_blocks"]
    default_kernels = {t.key for t in extract_tasks(model.mod, "c")}
    tuned_kernels = {t.key for t in extract_tasks(model.mod, "c", db=db)}
    assert default_kernels != tuned_kernels  # the convolutions are other kernels now
    exe = kiln.build(model.mod, "c", tuning_db=db)
    np.testing.assert_allclose(np.asarray(exe(*model.inputs)), model.reference(*model.inputs),
                               rtol=1e-4, atol=1e-4)


def test_kiln_tune_tunes_layouts_first(tmp_path, capsys):
    src = models.model_script(tmp_path, "resnet_block_cnn(batch=1, channels=16, size=12, blocks=1)")
    db_path = tmp_path / "t.sqlite"
    assert cli.main(["tune", str(src), "--db", str(db_path), "--budget", "10m",
                     "--trials", "2", "--batch", "2"]) == 0
    out, err = capsys.readouterr()
    assert "[layout] nn.conv2d float32[1x16x12x12]" in err
    assert "layouts: " in out and "candidates measured (0 bad)" in out
    assert "estimated speed-up of the tuned kernels' time per run" in out
    db = TuningDatabase(db_path)
    graph = [w for w in db.workloads() if w.op_name == "graph"]
    assert len(graph) == 2
    assert cli.main(["tune", "--report", "--db", str(db_path)]) == 0
    assert "nn.conv2d float32[1x3x12x12]" in capsys.readouterr().out
