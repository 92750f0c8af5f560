"""`kiln tune`: live progress, a summary, resuming where it stopped, `--report`, errors."""

import math
import re

from kiln import cli
from kiln.testing import models
from kiln.tune.database import TuningDatabase
from kiln.tune.tasks import extract_tasks


def test_tune_prints_progress_resumes_and_reports(tmp_path, capsys):
    db_path = tmp_path / "tuning.sqlite"
    model = models.model_script(tmp_path, "mlp(batch=2, sizes=(32, 64, 8))")
    args = ["tune", str(model), "--db", str(db_path), "--budget", "5m", "--batch", "2"]
    assert cli.main(args + ["--trials", "3"]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\[\d+/\d+\] \S+: 3 trials \(\d+ bad\), best [\d.]+ ms = [\d.]+x default "
                     r"\| model [\d.]+x \| ETA \d+:\d\d", err)
    assert "estimated speed-up of the tuned kernels' time per run" in out
    db = TuningDatabase(db_path)
    first = {r.id: r for r in db.records()}
    spaces = {t.key: math.prod(len(d) for d in t.tunable.values())
              for t in extract_tasks(models.mlp(batch=2, sizes=(32, 64, 8)).mod, "c")}
    tasks = len(db.workloads())
    assert tasks == len(spaces) >= 2
    assert len(first) == sum(min(3, n) for n in spaces.values())

    # again, with more trials: continues from the records (none measured twice)
    assert cli.main(args + ["--trials", "5"]) == 0
    capsys.readouterr()
    again = db.records()
    assert set(first) <= {r.id for r in again}
    assert len(again) == sum(min(5, n) for n in spaces.values())
    for w in db.workloads():
        decisions = [repr(sorted(r.knobs.items())) for r in db.records(w.kernel, w.target)]
        assert len(decisions) == len(set(decisions)), w.name

    assert cli.main(["tune", "--report", "--db", str(db_path)]) == 0
    out, _ = capsys.readouterr()
    assert f"{tasks} kernels, {len(again)} measured candidates" in out
    assert all(w.name[:44] in out for w in db.workloads())


def test_tune_usage_errors(tmp_path, capsys):
    db = str(tmp_path / "t.sqlite")
    assert cli.main(["tune", "--db", db]) == 2
    assert "name the model to tune" in capsys.readouterr().err
    assert cli.main(["tune", "demo:mlp", "--db", db, "--budget", "soon"]) == 2
    assert "--budget" in capsys.readouterr().err
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"garbage" * 100)
    assert cli.main(["tune", "--report", "--db", str(broken)]) == 1
    assert "not a usable kiln tuning database" in capsys.readouterr().err
