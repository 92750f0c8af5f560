"""The ``kiln`` command: every stage prints, executables can be inspected and run."""

import numpy as np
import pytest

import kiln
from kiln import cli
from kiln.testing import models


@pytest.mark.parametrize("stage,needle", [
    ("graph", "def main"), ("optimized", "call_tir"), ("tir", "with block(\"root\")"),
    ("scheduled", "parallel"), ("lowered", "for "), ("c", "kiln_last_error"),
])
def test_show_every_stage(capsys, stage, needle):
    assert cli.main(["show", "demo:mlp", "--stage", stage]) == 0
    assert needle in capsys.readouterr().out


def test_inspect_and_run(tmp_path, capsys):
    model = models.mlp(batch=2, sizes=(8, 4))
    path = str(tmp_path / "m.kiln")
    kiln.build(model.mod).save(path)
    assert cli.main(["inspect", path]) == 0
    assert "main(x: float32[2, 8])" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", model.inputs[0])
    assert cli.main(["run", path, str(tmp_path / "x.npy"), "-o", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model.reference(*model.inputs),
                               rtol=1e-5, atol=1e-6)


def test_errors_are_reported_not_raised(tmp_path, capsys):
    bad = tmp_path / "bad.kiln"
    bad.write_bytes(b"nope")
    assert cli.main(["inspect", str(bad)]) == 2
    assert "kiln: error" in capsys.readouterr().err
