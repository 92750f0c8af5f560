"""The SQLite tuning database (kiln.tune.database): records, best lookups, kiln.build with
tuning_db=, concurrent writers, refusing corrupt and foreign files without touching them."""

import multiprocessing
import os
import sqlite3
import subprocess
import sys

import numpy as np
import pytest

import kiln
from kiln.build import lower_graph
from kiln.testing import models
from kiln.tir.function import PrimFunc
from kiln.tune.database import (
    SCHEMA_VERSION,
    Record,
    TuningDatabase,
    TuningDatabaseError,
    Workload,
    kernel_key,
    target_key,
)
from kiln.tune.tasks import extract_tasks

TARGET = "c"


def _record(kernel="k1", knobs=None, times=(1e-3,), ok=True):
    return Record(kernel, target_key(TARGET), knobs or {"tile": 4}, "sch.knob(...)",
                  list(times), ok, "" if ok else "crashed")


def test_records_round_trip_and_best_is_the_fastest_good_one(tmp_path):
    db = TuningDatabase(tmp_path / "t.sqlite")
    db.add_workload(Workload("k1", target_key(TARGET), "fused_conv", "nn.conv2d", 2e-3))
    db.add_records([_record(times=(3e-3, 3e-3)), _record(knobs={"tile": (8, 2)}, times=(1e-3,)),
                    _record(knobs={"tile": 16}, times=(), ok=False),
                    _record(kernel="k2", times=(1e-4,))])
    best = db.best("k1", target_key(TARGET))
    assert best.knobs == {"tile": (8, 2)}  # a tuple knob value comes back a tuple
    assert best.mean_s == pytest.approx(1e-3)
    assert best.machine["cpus"] == os.cpu_count()
    assert db.count("k1", target_key(TARGET)) == 3
    bad = db.records("k1", ok=False)
    assert len(bad) == 1 and bad[0].error == "crashed" and bad[0].mean_s is None
    assert db.workload("k1", target_key(TARGET)).default_s == 2e-3
    assert db.best("k3", target_key(TARGET)) is None


def test_withdraw_marks_a_records_knobs_bad_and_best_moves_on(tmp_path):
    """A record contradicted by a later measurement is withdrawn: every good record of its
    knobs turns bad with the reason, best() (and graph_knobs_for) no longer returns it;
    another kernel's record of the same knobs is untouched."""
    db = TuningDatabase(tmp_path / "t.sqlite")
    tk = target_key(TARGET)
    db.add_records([_record(knobs={"tile": (8, 2)}, times=(1e-3,)),
                    _record(knobs={"tile": (8, 2)}, times=(2e-3,)),
                    _record(knobs={"tile": 4}, times=(3e-3,)),
                    _record(kernel="k2", knobs={"tile": (8, 2)}, times=(1e-4,))])
    assert db.best("k1", tk).knobs == {"tile": (8, 2)}
    assert db.withdraw("k1", tk, {"tile": (8, 2)}, "slower in the model") == 2
    assert db.best("k1", tk).knobs == {"tile": 4}
    gone = db.records("k1", tk, ok=False)
    assert len(gone) == 2 and all(r.error == "slower in the model" and r.mean_s is None
                                  for r in gone)
    assert db.best("k2", tk).knobs == {"tile": (8, 2)}
    assert db.withdraw("k1", tk, {"tile": (8, 2)}, "again") == 0  # nothing good left of it


def test_kernel_key_is_the_same_in_every_process_and_ignores_the_kernel_name():
    mod = lower_graph(models.small_cnn().mod, TARGET)
    name, func = next((n, f) for n, f in mod.items() if isinstance(f, PrimFunc)
                      and "conv" in n)
    key = kernel_key(func)
    renamed = func.with_attr("global_symbol", "another_name")
    assert kernel_key(renamed) == key
    code = ("from kiln.build import lower_graph; from kiln.testing import models; "
            "from kiln.tune.database import kernel_key; "
            f"print(kernel_key(lower_graph(models.small_cnn().mod, 'c')[{name!r}]))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=True)
        assert out.stdout.strip() == key


def _writer(path, worker, n):
    db = TuningDatabase(path)
    for i in range(n):
        db.add_records([_record(kernel=f"k{i % 3}", knobs={"w": worker, "i": i},
                                times=(1e-3 * (worker + 1),))])


def test_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "shared.sqlite"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 40)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    db = TuningDatabase(path)
    recs = db.records()
    assert len(recs) == 160
    assert {(r.knobs["w"], r.knobs["i"]) for r in recs} == {(w, i) for w in range(4)
                                                            for i in range(40)}
    assert db.best("k0", target_key(TARGET)).knobs["w"] == 0
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


@pytest.mark.parametrize("content", [b"this is not a database at all" * 100,
                                     b"SQLite format 3\x00" + b"\xff" * 4000])
def test_a_corrupt_file_is_refused_and_left_as_it_is(tmp_path, content):
    path = tmp_path / "broken.sqlite"
    path.write_bytes(content)
    with pytest.raises(TuningDatabaseError, match="broken.sqlite.*left as it is"):
        TuningDatabase(path)
    assert path.read_bytes() == content


def test_a_foreign_sqlite_file_and_an_old_schema_are_refused_unchanged(tmp_path):
    foreign = tmp_path / "foreign.sqlite"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE photos (id INTEGER)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(TuningDatabaseError, match="not a kiln tuning database.*photos"):
        TuningDatabase(foreign)
    assert foreign.read_bytes() == before

    old = tmp_path / "old.sqlite"
    TuningDatabase(old).add_records([_record()])
    conn = sqlite3.connect(old)
    conn.execute("UPDATE meta SET value = '0' WHERE key = 'version'")
    conn.commit()
    conn.close()
    with pytest.raises(TuningDatabaseError, match=f"schema version 0, this kiln reads version "
                                                  f"{SCHEMA_VERSION}"):
        TuningDatabase(old)
    conn = sqlite3.connect(old)
    assert conn.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 1


def test_build_applies_the_best_record_per_kernel_and_falls_back_to_the_default(tmp_path):
    model = models.resnet_block_cnn()
    tasks = extract_tasks(model.mod, TARGET)
    db = TuningDatabase(tmp_path / "t.sqlite")
    tuned = tasks[0]
    name, domain = next(iter(tuned.tunable.items()))
    other = next(v for v in domain if v != tuned.default[name])
    db.add_records([Record(tuned.key, tuned.target_key, {name: other}, "", [1e-6]),
                    Record(tuned.key, tuned.target_key, dict(tuned.default), "", [1e-3])])
    plain = kiln.build(model.mod, TARGET)
    with_db = kiln.build(model.mod, TARGET, tuning_db=db.path)
    assert with_db.module.source != plain.module.source
    out = with_db(*model.inputs)
    np.testing.assert_allclose(out.numpy() if hasattr(out, "numpy") else out,
                               model.reference(*model.inputs), rtol=1e-4, atol=1e-4)
    # a database without records of this model's kernels builds the default
    empty = TuningDatabase(tmp_path / "empty.sqlite")
    assert kiln.build(model.mod, TARGET, tuning_db=empty).module.source == plain.module.source


def test_build_refuses_a_missing_database_file(tmp_path):
    with pytest.raises(TuningDatabaseError, match="no tuning database at"):
        kiln.build(models.mlp(batch=2, sizes=(8, 8)).mod, TARGET,
                   tuning_db=tmp_path / "nope.sqlite")
    assert not (tmp_path / "nope.sqlite").exists()
