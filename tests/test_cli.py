"""The ``kiln`` command: every stage prints, executables can be inspected and run; as a user
runs it (a subprocess), every mistake is one line with the right exit status."""

import os
import re
import subprocess
import sys
from pathlib import Path

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
    assert capsys.readouterr().err.startswith("kiln: error: ")


DEMO_ONNX = str(Path(__file__).parents[1] / "examples" / "models" / "demo_resnet.onnx")


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
    assert "output logits: shape (2, 10) dtype float32" in out and "latency: median" in out
    ref = ReferenceEvaluator(onnx.load(DEMO_ONNX)).run(None, {"image": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, rtol=1e-4, atol=1e-4)
    # random inputs; the symbolic batch takes --dim
    assert cli.main(["run", path, "--dim", "batch=3", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "input image: random float32 (3, 3, 32, 32)" in out
    assert "output logits: shape (3, 10)" in out
    # a wrong input name is a clear error
    assert cli.main(["run", path, "--input", f"nope={tmp_path / 'x.npy'}"]) == 2
    assert "the model has no input 'nope' (its inputs: image)" in capsys.readouterr().err


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
    assert all(k in str(exe.profile(model.inputs[0], repeat=1)) for k in kernels)
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


# ---- the command as a user runs it: subprocesses, exit status, one-line errors -------------
ROOT = Path(__file__).parents[1]


def kiln_cmd(*args, cwd=None, env=None, check_rc=None):
    """Run ``python -m kiln.cli ARGS`` in a fresh process: (exit status, stdout, stderr)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    res = subprocess.run([sys.executable, "-m", "kiln.cli", *map(str, args)], cwd=cwd or ROOT,
                         env=full_env, capture_output=True, text=True, timeout=600)
    if check_rc is not None:
        assert res.returncode == check_rc, res.stderr + res.stdout
    return res.returncode, res.stdout, res.stderr


def assert_one_line_error(result, rc, *needles):
    code, out, err = result
    assert code == rc, (code, out, err)
    assert "Traceback" not in err and err.count("\n") == 1 and err.startswith("kiln: error: "), err
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="module")
def demo_kiln(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "demo.kiln"
    kiln_cmd("compile", DEMO_ONNX, "-o", path, check_rc=0)
    return path


def test_compile_usage_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_text("not a model")
    cases = [
        (["compile", tmp_path / "missing.onnx"], "model '", "does not exist"),
        (["compile", bad], "not a valid ONNX model"),
        (["compile", DEMO_ONNX, "-O", "9"], "invalid choice: 9 (choose from 0, 1, 2, 3)"),
        (["compile", DEMO_ONNX, "--shape", "imgae=1,3,32,32"],
         "no input 'imgae' (its inputs: image) (did you mean 'image'?)"),
        (["compile", DEMO_ONNX, "--shape", "image=1.5,3,32,32"], "'1.5' is not a dimension"),
        (["compile", DEMO_ONNX, "--shape", "image=1,3,32"], "has rank 4"),
        (["compile", DEMO_ONNX, "--shape", "image"], "expected NAME=D0,D1"),
        (["compile", DEMO_ONNX, "--shpae", "image=1,3,32,32"], "(did you mean --shape?)"),
        (["compile", DEMO_ONNX, "-o", tmp_path / "no" / "m.kiln"], "does not exist"),
        (["compile", DEMO_ONNX, "--target", "znver99"], "unknown target CPU 'znver99'",
         "x86-64-v3"),
        (["compil", DEMO_ONNX], "invalid choice: 'compil'", "'compile'"),
        ([], "required: COMMAND"),
    ]
    for args, *needles in cases:
        assert_one_line_error(kiln_cmd(*args), 2, *needles)
    assert not (tmp_path / "no").exists()


def test_compile_for_an_npu_needs_static_shapes_then_saves(tmp_path):
    """The NPU lays DRAM out at compile time: a symbolic batch is a one-line error, and with
    --shape the executable is saved, inspected and run on the simulator."""
    assert_one_line_error(kiln_cmd("compile", DEMO_ONNX, "--target", "npu", "-o",
                                   tmp_path / "m.kiln"), 1, "static shape")
    code, stdout, _ = kiln_cmd("compile", DEMO_ONNX, "--target", "npu -hw=edge", "--shape",
                               "image=2,3,32,32", "-o", tmp_path / "m.kiln", check_rc=0)
    assert "NPU kernels for target 'npu -hw=edge'" in stdout
    code, stdout, _ = kiln_cmd("run", tmp_path / "m.kiln", check_rc=0)
    assert "input image: random float32 (2, 3, 32, 32)" in stdout and "NPU cycles" in stdout


def test_compile_verbose_progress_and_target(tmp_path):
    out = tmp_path / "m.kiln"
    # the progress lines are those of a real build: not one the executable cache answers
    code, stdout, err = kiln_cmd("compile", DEMO_ONNX, "-o", out, "--target", "x86-64-v3",
                                 "--verbose", check_rc=0, env={"KILN_EXECUTABLE_CACHE": "0"})
    assert "compiled 12 kernels for target 'c -mcpu=x86-64-v3'" in stdout
    assert "inputs:  image: float32[batch, 3, 32, 32]" in stdout
    assert "outputs: logits: float32[batch, 10]" in stdout
    lines = err.splitlines()
    assert all(ln.startswith("kiln: [") for ln in lines), err
    assert any("importing" in ln and "29 nodes" in ln for ln in lines)
    assert any(re.search(r"scheduling kernels: (\d+)/\1 done", ln) for ln in lines)
    assert any(re.search(r"lowering kernels and generating C: (\d+)/\1 done", ln) for ln in lines)
    assert any("C compile" in ln for ln in lines)
    # (FoldConstant's own little builds stay quiet)
    assert sum("scheduling kernels" in ln and "done" in ln for ln in lines) == 1
    code, stdout, _ = kiln_cmd("inspect", out, check_rc=0)
    assert "for target 'c -mcpu=x86-64-v3'" in stdout and "avx2" in stdout
    assert "avx512f" not in stdout.split("needs CPU features:")[1].splitlines()[0]


def test_run_usage_errors_are_one_line(demo_kiln, tmp_path):
    np.save(tmp_path / "x64.npy", np.zeros((1, 3, 32, 32)))
    np.save(tmp_path / "x.npy", np.zeros((1, 3, 32, 32), np.float32))
    (tmp_path / "junk.npy").write_text("junk")
    cases = [
        (["--dim", "Batch=2"], "no symbolic dimension 'Batch'", "(did you mean 'batch'?)"),
        (["--dim", "batch=x"], "expected an integer, got 'x'"),
        (["--dim", "batch=0"], ">= 1"),
        (["--input", "imgae=x.npy"], "no input 'imgae'", "(did you mean 'image'?)"),
        ([tmp_path / "x.npy", tmp_path / "x.npy"], "2 input files given", "1 input(s): image"),
        ([tmp_path / "missing.npy"], "does not exist"),
        ([tmp_path / "junk.npy"], "is not a .npy file"),
        ([tmp_path / "x64.npy"], "expected dtype float32 but got float64"),
        (["-o", tmp_path / "no" / "out"], "does not exist"),
        (["--threads", "0"], "--threads: expected an integer >= 1"),
        (["--repeat", "many"], "--repeat: expected an integer"),
        (["--trace", tmp_path / "no" / "t.json"], "does not exist"),
        (["--input", f"image={tmp_path / 'x.npy'}", tmp_path / "x.npy"], "given twice"),
    ]
    for args, *needles in cases:
        assert_one_line_error(kiln_cmd("run", demo_kiln, *args, cwd=tmp_path), 2, *needles)
    not_kiln = tmp_path / "x.npy"
    assert_one_line_error(kiln_cmd("run", not_kiln), 2, "is not a kiln executable")
    assert_one_line_error(kiln_cmd("inspect", tmp_path / "nope.kiln"), 2, "does not exist")


def test_run_writes_outputs_by_name_and_profiles(demo_kiln, tmp_path):
    import json

    x = np.random.default_rng(0).standard_normal((2, 3, 32, 32), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    code, out, err = kiln_cmd("run", demo_kiln, "--input", f"image={tmp_path / 'x.npy'}",
                              "-o", tmp_path / "outs", "--repeat", "2", "--profile", "--trace",
                              tmp_path / "t.json", "--threads", "1", check_rc=0)
    assert err == ""
    assert f"-> {tmp_path / 'outs' / 'logits.npy'}" in out and "(1 threads)" in out
    ref = kiln.load(str(demo_kiln))(image=x)
    np.testing.assert_allclose(np.load(tmp_path / "outs" / "logits.npy"), ref, rtol=1e-6)
    table = out[out.index("kernel"):]
    assert "Conv node 'stem.conv'" in table and "Gemm node 'fc'" in table and "2x3x32x32" in table
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert sum(e.get("cat") == "kernel" for e in events) == 2 * 12
    # one output: a file name works too
    kiln_cmd("run", demo_kiln, "--repeat", "0", "-o", tmp_path / "y.npy", check_rc=0)
    assert np.load(tmp_path / "y.npy").shape == (1, 10)


def test_broken_pipe_is_quiet():
    # (the demo model's C is ~170 KB: more than a pipe holds, so the write meets the close)
    proc = subprocess.Popen([sys.executable, "-m", "kiln.cli", "show", DEMO_ONNX, "--stage",
                             "c"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141 and err == "", err


def test_help_has_examples():
    code, out, _ = kiln_cmd("--help", check_rc=0)
    assert "examples:" in out and "kiln compile model.onnx" in out and "exit status" in out
    for command in ("compile", "run", "inspect", "show", "cache"):
        code, out, _ = kiln_cmd(command, "--help", check_rc=0)
        assert "examples:" in out and f"kiln {command}" in out, command


def test_cache_info_and_clear(tmp_path):
    env = {"KILN_CACHE_DIR": str(tmp_path / "cache"), "KILN_CACHE_MAX_SIZE": "300M"}
    kiln_cmd("show", "demo:mlp", "--stage", "c", env=env, check_rc=0)  # generates only
    code, out, _ = kiln_cmd("cache", "info", env=env, check_rc=0)
    assert f"directory: {tmp_path / 'cache'}" in out and "entries:   0" in out
    assert "size cap:  300.0 MiB" in out
    model = tmp_path / "m.kiln"
    kiln_cmd("compile", DEMO_ONNX, "-o", model, env=env, check_rc=0)
    code, out, _ = kiln_cmd("cache", "info", env=env, check_rc=0)
    assert re.search(r"entries:   [1-9]\d* \(", out) and "last used:" in out
    code, out, _ = kiln_cmd("cache", "clear", env=env, check_rc=0)
    assert re.match(r"removed [1-9]\d* files", out)
    assert "entries:   0" in kiln_cmd("cache", "info", env=env)[1]
    assert_one_line_error(kiln_cmd("cache", "show"), 2, "invalid choice: 'show'",
                          "'info', 'clear'")
    assert_one_line_error(kiln_cmd("cache", "info", env={"KILN_CACHE_MAX_SIZE": "lots"}), 1,
                          "KILN_CACHE_MAX_SIZE='lots' is not a size")


def test_external_data_model_compiles_from_another_directory(tmp_path):
    import onnx

    folder = tmp_path / "model"
    folder.mkdir()
    onnx.save_model(onnx.load(DEMO_ONNX), str(folder / "m.onnx"), save_as_external_data=True,
                    location="m.weights", size_threshold=0)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    kiln_cmd("compile", folder / "m.onnx", "-o", tmp_path / "m.kiln", cwd=elsewhere,
             check_rc=0)
    x = np.random.default_rng(1).standard_normal((1, 3, 32, 32), dtype=np.float32)
    from onnx.reference import ReferenceEvaluator

    ref = ReferenceEvaluator(onnx.load(DEMO_ONNX)).run(None, {"image": x})[0]
    np.testing.assert_allclose(kiln.load(str(tmp_path / "m.kiln"))(x), ref, rtol=1e-4,
                               atol=1e-4)


def test_import_failure_names_the_node(tmp_path):
    """A shape given with --shape that a node cannot take (3 channels into a convolution whose
    weight expects 5): one line naming the ONNX node. (A dynamic length added to a fixed
    position table used to fail here; it now imports, with the broadcast checked at run time.)"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "c", 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 5, 3, 3), np.float32), "w")])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    assert_one_line_error(kiln_cmd("compile", path, "--shape", "x=1,3,8,8"), 1,
                          "Conv node 'conv'", "3 channels but weight expects 5")


def test_unexpected_errors_are_one_line_too(tmp_path):
    model = tmp_path / "broken.py"
    model.write_text("def module():\n    return None + 1\n")
    assert_one_line_error(kiln_cmd("show", model), 1, "internal error: TypeError")
    code, _, err = kiln_cmd("show", model, "--traceback")
    assert code == 1 and "Traceback" in err and "internal error" in err.splitlines()[-1]


def _rank_if_model():
    """c = sum(x) > 0 at run time; y = If(c): Unsqueeze(2 x, 0) (rank 3) else Relu(x) (rank
    2); then Add, Softmax and a product with tanh(x): the output's rank follows the branch."""
    from onnx import helper, numpy_helper

    from kiln.testing.onnx_graphs import onnx_model, value_info

    def branch(nodes, out):
        return helper.make_graph(nodes, f"g_{out}", [], [value_info(out, None)])

    then_b = branch([helper.make_node("Mul", ["x", "two"], ["m"]),
                     helper.make_node("Unsqueeze", ["m", "ax0"], ["t"])], "t")
    else_b = branch([helper.make_node("Relu", ["x"], ["e"])], "e")
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["c"]),
        helper.make_node("If", ["c"], ["y"], then_branch=then_b, else_branch=else_b,
                         name="rank_if"),
        helper.make_node("Add", ["y", "bias"], ["yb"]),
        helper.make_node("Softmax", ["yb"], ["p"], axis=-1),
        helper.make_node("Tanh", ["x"], ["h"]),
        helper.make_node("Mul", ["p", "h"], ["out"]),
    ]
    inits = [numpy_helper.from_array(np.asarray(v), n) for n, v in (
        ("zero", np.float32(0)), ("two", np.float32(2)), ("ax0", np.array([0], np.int64)),
        ("bias", np.array([0.5, -1.0, 0.25], np.float32)))]
    return onnx_model(nodes, [value_info("x", [2, 3])], [value_info("out", None)], inits)


def test_run_onnx_model_with_rank_changing_if(tmp_path, capsys):
    """``kiln run model.onnx`` compiles in memory with guarded specialization: a model whose
    If branches differ in rank runs for both condition values (vs onnxruntime); ``kiln
    compile`` cannot save it and says to use ``kiln run``."""
    import onnx

    ort = pytest.importorskip("onnxruntime")
    model = _rank_if_model()
    path = str(tmp_path / "rank_if.onnx")
    onnx.save(model, path)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    base = np.random.default_rng(3).standard_normal((2, 3)).astype(np.float32)
    for sign, rank in ((1.0, 3), (-1.0, 2)):
        x = (np.abs(base) * sign).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        out = tmp_path / f"out{rank}.npy"
        assert cli.main(["run", path, str(tmp_path / "x.npy"), "--repeat", "2", "--threads", "1",
                         "-o", str(out)]) == 0
        text = capsys.readouterr().out
        assert f"output out: shape {(1, 2, 3) if rank == 3 else (2, 3)}" in text
        assert "latency: median" in text
        (ref,) = sess.run(None, {"x": x})
        got = np.load(out)
        assert got.shape == ref.shape and got.ndim == rank
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    assert cli.main(["run", path, "--profile"]) == 2
    assert "--profile and --trace do not apply" in capsys.readouterr().err
    assert cli.main(["compile", path, "-o", str(tmp_path / "m.kiln")]) == 1
    err = capsys.readouterr().err
    assert "rank_if" in err and f"kiln run {path}" in err
    assert not (tmp_path / "m.kiln").exists()


def test_run_onnx_model_without_guard(tmp_path, capsys):
    """``kiln run model.onnx`` of an ordinary model: compiled in memory, run like a .kiln."""
    import onnx
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(1).standard_normal((2, 3, 32, 32), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert cli.main(["run", DEMO_ONNX, "--input", f"image={tmp_path / 'x.npy'}", "--repeat",
                     "1", "-o", str(tmp_path / "y.npy"), "--profile"]) == 0
    assert "output logits: shape (2, 10) dtype float32" in capsys.readouterr().out
    ref = ReferenceEvaluator(onnx.load(DEMO_ONNX)).run(None, {"image": x})[0]
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ref, rtol=1e-4, atol=1e-4)
