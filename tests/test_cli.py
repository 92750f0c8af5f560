"""The ``kiln`` command: every stage prints, executables can be inspected and run."""

import numpy as np
import pytest

import kiln
from kiln import cli
from kiln.ir.errors import KilnError
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


DEMO_ONNX = str(__import__("pathlib").Path(__file__).parents[1] / "examples" / "models"
                / "demo_resnet.onnx")


def test_compile_onnx_and_run_by_name(tmp_path, capsys):
    """``kiln compile model.onnx -o m.kiln`` then ``kiln run m.kiln --input name=file.npy``."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    path = str(tmp_path / "demo.kiln")
    assert cli.main(["compile", DEMO_ONNX, "-o", path]) == 0
    assert "kernels" in capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert cli.main(["run", path, "--input", f"image={tmp_path / 'x.npy'}", "--repeat", "2",
                     "-o", str(tmp_path / "y.npy")]) == 0
    out = capsys.readouterr().out
    assert "output 0: shape (2, 10) dtype float32" in out and "latency: median" in out
    ref = ReferenceEvaluator(onnx.load(DEMO_ONNX)).run(None, {"image": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, rtol=1e-4, atol=1e-4)
    # random inputs; the symbolic batch takes --dim
    assert cli.main(["run", path, "--dim", "batch=3", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "input image: random float32 (3, 3, 32, 32)" in out
    assert "output 0: shape (3, 10)" in out
    # a wrong input name is a clear error
    with pytest.raises(SystemExit, match="one of \\['image'\\]"):
        cli.main(["run", path, "--input", f"nope={tmp_path / 'x.npy'}"])


def test_show_onnx_model(capsys):
    assert cli.main(["show", DEMO_ONNX, "--stage", "optimized"]) == 0
    assert "call_tir" in capsys.readouterr().out


def test_run_profile_lists_every_kernel(tmp_path, capsys):
    model = models.mlp(batch=2, sizes=(8, 4))
    exe = kiln.build(model.mod)
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    assert cli.main(["run", path, "--repeat", "2", "--profile"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("kernel"):]
    kernels = {c.func for c in exe.plans["main"].calls if c.is_kernel}
    assert kernels and all(k in table for k in kernels)
    assert "total" in table and "%" in table
    # the API: same kernels, inputs by name; the result of a profiled run is not affected
    assert all(k in exe.profile(model.inputs[0], repeat=1) for k in kernels)
    with pytest.raises(KilnError, match="repeat"):
        exe.profile(model.inputs[0], repeat=0)


@pytest.mark.parametrize("argv,needles", [
    (["--stage", "cuda"], ['extern "C" __global__', "__launch_bounds__"]),
    (["--stage", "opencl"], ["__kernel", "get_group_id(0)"]),
    (["--stage", "lowered", "--target", "opencl"], ['kernel "', 'env("threadIdx.x")']),
    (["--stage", "scheduled", "--target", "cuda"], ['thread="threadIdx.x"']),
])
def test_show_gpu_stages(capsys, argv, needles):
    assert cli.main(["show", "demo:mlp", *argv]) == 0
    out = capsys.readouterr().out
    for needle in needles:
        assert needle in out
