"""Executables built for OpenCL (run by PoCL on the CPU): the executor's memory plan on the
device, numpy in and out, symbolic shapes, host steps, saving and loading, the errors of a
missing runtime."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import graph as g
from kiln import op
from kiln.frontend.onnx import from_onnx
from kiln.ir.errors import ArgumentError, KilnError, ModelFormatError, RuntimeCheckError
from kiln.target import Target
from kiln.testing import models
from kiln.testing.index_checks import check_index_errors
from kiln.testing.onnx_graphs import onnx_model, value_info

DEMO = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "models",
                    "demo_resnet.onnx")


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "resnet_block_cnn"])
def test_models_match_the_cpu_and_numpy(name):
    m = getattr(models, name)()
    exe = kiln.build(m.mod, "opencl")
    out = exe(*m.inputs)
    np.testing.assert_allclose(out, m.reference(*m.inputs), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out, kiln.build(m.mod, "c")(*m.inputs), rtol=1e-5, atol=1e-6)
    report = exe.memory_report()["main"]
    assert report["temps"] > 0 and report["workspace_bytes"] <= report["unshared_bytes"]


def test_dynamic_batch_model_runs_at_several_batch_sizes():
    mod, params = from_onnx(DEMO)
    cpu = kiln.build(mod, "c", params=params)
    gpu = kiln.build(mod, "opencl", params=params)
    rng = np.random.default_rng(0)
    shape = [d if isinstance(d, int) else None for d in cpu.plans["main"].slots[
        cpu.plans["main"].input_slots[0]].shape]
    for batch in (1, 3):
        dims = tuple(batch if d is None else d for d in shape)
        x = rng.standard_normal(dims).astype("float32")
        np.testing.assert_allclose(gpu(x), cpu(x), rtol=1e-4, atol=1e-5)


def _softmax_module():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((4, 50), "float32"))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit_output(op.nn.softmax(op.multiply(x, x), axis=-1))
        bb.emit_func_output(y, params=[x])
    return bb.get()


def test_conditions_on_symbolic_dims_are_checked_before_launch(tmp_path):
    """``[2, N, 3, 4] @ [5, 4, 2]``: N = 1 broadcasts, N = 7 is refused on the host before any
    kernel runs (the kernels' kiln.assume conditions, kept through save and load), naming
    the node, as on the CPU."""
    model = onnx_model([helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")],
                       [value_info("a", [2, "N", 3, 4]), value_info("b", [5, 4, 2])],
                       [value_info("y", None)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, "opencl", params=params)
    exe.save(tmp_path / "mm.kiln")
    rng = np.random.default_rng(3)
    b = rng.standard_normal((5, 4, 2)).astype("float32")
    for run in (exe, kiln.load(tmp_path / "mm.kiln")):
        a = rng.standard_normal((2, 1, 3, 4)).astype("float32")
        np.testing.assert_allclose(run(a, b), a @ b, rtol=1e-5, atol=1e-6)
        with pytest.raises(RuntimeCheckError, match=r"MatMul node 'mm': .*must be 1 or 5.*N = 7"):
            run(rng.standard_normal((2, 7, 3, 4)).astype("float32"), b)


def test_checked_indices_resolve_negative_values_and_raise_out_of_range(tmp_path):
    """Checked indices count from the end when negative; one out of range raises
    RuntimeCheckError naming the node, the index and the range, as on the CPU (the kernels'
    check record, read back after the run), also after save and load."""
    check_index_errors("c", tmp_path)
    check_index_errors("opencl", tmp_path)


def test_save_and_load_without_a_compiler(tmp_path):
    m = models.mlp(batch=2)  # several constants (weights, biases)
    exe = kiln.build(m.mod, "opencl")
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    assert loaded.module.program.kind == "opencl" and len(loaded.plans["main"].constants) > 2
    np.testing.assert_array_equal(loaded(*m.inputs), exe(*m.inputs))
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:-40] + bytes(40))
    with pytest.raises(ModelFormatError, match="checksum"):
        kiln.load(path)


def test_bad_inputs_are_argument_errors():
    exe = kiln.build(_softmax_module(), "opencl")
    with pytest.raises(ArgumentError, match="input 'x' expected shape \\(4, 50\\)"):
        exe(np.zeros((5, 50), "float32"))
    with pytest.raises(ArgumentError, match="expected dtype float32"):
        exe(np.zeros((4, 50), "float64"))


def test_every_kernel_of_a_run_is_enqueued_before_results_are_read():
    exe = kiln.build(_softmax_module(), "opencl")
    device = exe.module.device
    calls = {"sync": 0}
    original = device.synchronize

    def counting() -> None:
        calls["sync"] += 1
        original()

    device.synchronize = counting  # type: ignore[method-assign]
    try:
        exe(np.ones((4, 50), "float32"))
    finally:
        device.synchronize = original  # type: ignore[method-assign]
    assert calls["sync"] == 0  # only the download of the output waits


def test_missing_runtime_names_the_extra(monkeypatch):
    from kiln.runtime.gpu.opencl import OpenCLDevice

    monkeypatch.setitem(sys.modules, "pyopencl", None)
    with pytest.raises(KilnError, match=r'pip install "kiln\[opencl\]"'):
        OpenCLDevice()


def test_cuda_without_a_device_names_the_extra():
    from kiln.runtime.gpu.module import get_device

    try:
        get_device("cuda")
    except KilnError as err:
        assert 'pip install "kiln[cuda]"' in str(err)
    else:
        pytest.skip("a CUDA device is present")


def test_host_steps_run_on_host_copies():
    """A Reshape to a shape given as an input: a shape function runs on the host between
    kernels, on a copy of the tensor it reads."""
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                      helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, Target("opencl"), params=params)
    assert exe.plans["main"].has_host_steps
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(exe(x, np.array([3, 4])), x.reshape(3, 4))
    np.testing.assert_array_equal(exe(x, np.array([4, -1])), x.reshape(4, 3))


def test_sequences_and_strings_stay_on_the_host():
    """Sequence and string values live on the host between device kernels: a split of a
    device tensor into a sequence, a kernel on one element, text mapped to ids that feed a
    kernel; outputs as the CPU executor gives them."""
    n = helper.make_node
    nodes = [n("SplitToSequence", ["x"], ["s"], axis=1),
             n("SequenceAt", ["s", "i"], ["piece"]), n("Relu", ["piece"], ["r"]),
             n("SequenceInsert", ["s", "r"], ["s2"]),
             n("LabelEncoder", ["w"], ["ids"], domain="ai.onnx.ml", keys_strings=["a", "b"],
               values_int64s=[1, 2], default_int64=0),
             n("Cast", ["ids"], ["fids"], to=TensorProto.FLOAT), n("Add", ["fids", "r"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                     helper.make_tensor_value_info("i", TensorProto.INT64, []),
                     helper.make_tensor_value_info("w", TensorProto.STRING, [3, 1])],
        [helper.make_value_info("s2", helper.make_sequence_type_proto(
            helper.make_tensor_type_proto(TensorProto.FLOAT, None))),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("ai.onnx.ml", 2)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, Target("opencl"), params=params)
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    seq, y = exe(x, np.array(2), np.array([["a"], ["c"], ["b"]]))
    assert isinstance(seq, list) and len(seq) == 5
    np.testing.assert_array_equal(seq[4], np.maximum(x[:, 2:3], 0))
    np.testing.assert_allclose(y, np.array([[1], [0], [2]]) + np.maximum(x[:, 2:3], 0))


def test_cli_runs_a_model_for_a_gpu_target(tmp_path, capsys):
    """``kiln run model.onnx --target opencl`` compiles for OpenCL and runs: the CPU's
    result; a saved CPU executable asked to run ``--target opencl`` is a usage error."""
    from kiln import cli

    x = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    assert cli.main(["run", DEMO, "--target", "opencl", "--input", f"image={tmp_path / 'x.npy'}",
                     "--repeat", "1", "-o", str(tmp_path / "y.npy")]) == 0
    assert "output logits: shape (2, 10)" in capsys.readouterr().out
    mod, params = from_onnx(DEMO)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), kiln.build(mod, "c", params=params)(x),
                               rtol=1e-4, atol=1e-5)
    saved = tmp_path / "demo.kiln"
    assert cli.main(["compile", DEMO, "--target", "c", "-o", str(saved)]) == 0
    assert cli.main(["run", str(saved), "--target", "opencl"]) == 2
    assert "was compiled for 'c'" in capsys.readouterr().err


def test_cli_run_without_the_runtime_names_the_extra(capsys):
    """Without CUDA (no device or no cuda-bindings here), ``kiln run --target cuda`` is a
    one-line error naming the extra to install; with it, the model runs."""
    from kiln import cli
    from kiln.runtime.gpu.module import get_device

    try:
        get_device("cuda")
        available = True
    except KilnError:
        available = False
    rc = cli.main(["run", DEMO, "--target", "cuda", "--repeat", "1"])
    err = capsys.readouterr().err
    if available:
        assert rc == 0, err
    else:
        assert rc == 1 and 'pip install "kiln[cuda]"' in err, err


# The models of the check on OpenCL (PoCL), in the default run: the real architectures
# at sizes that keep each test to seconds on PoCL (2 cores): ResNet-18 and MobileNetV2 at
# 64 x 64 (every layer kind of the 224 x 224 models, 2 x 2 at the end instead of 7 x 7), the
# MLP as it is, the BERT-style encoder with 2 layers of width 128 (4 heads) over 32 tokens;
# the demo CNN is test_dynamic_batch_model_runs_at_several_batch_sizes.
GPU_MODELS = {
    "resnet18": lambda tm: (tm.resnet18(), ["input"], [("float32", (1, 3, 64, 64))]),
    "mobilenet_v2": lambda tm: (tm.mobilenet_v2(), ["input"], [("float32", (1, 3, 64, 64))]),
    "mlp": lambda tm: (tm.mlp(), ["input"], [("float32", (4, 784))]),
    "bert_encoder": lambda tm: (tm.bert_encoder(layers=2, hidden=128, heads=4, ffn=512),
                                ["input_ids", "attention_mask"],
                                [("int64", (2, 32)), ("int64", (2, 32))]),
}


def _model_inputs(specs: list, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = []
    for dtype, shape in specs:
        if dtype == "int64" and not arrays:
            arrays.append(rng.integers(0, 30522, size=shape, dtype=np.int64))
        elif dtype == "int64":  # the attention mask: a padded tail
            mask = np.ones(shape, np.int64)
            mask[:, shape[1] * 3 // 4:] = 0
            arrays.append(mask)
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


@pytest.mark.parametrize("name", list(GPU_MODELS))
def test_torch_models_on_opencl_match_the_cpu_and_torch(name):
    torch = pytest.importorskip("torch")
    from kiln.testing import torch_models

    torch.manual_seed(0)
    module, names, specs = GPU_MODELS[name](torch_models)
    inputs = _model_inputs(specs, np.random.default_rng(11))
    data = torch_models.export_onnx(module, tuple(torch.from_numpy(a) for a in inputs), names)
    with torch.no_grad():
        ref = module(*(torch.from_numpy(a) for a in inputs)).numpy()
    mod, params = from_onnx(data)
    out = kiln.build(mod, "opencl", params=params)(*inputs)
    cpu = kiln.build(mod, "c", params=params)(*inputs)
    scale = float(np.abs(ref).max())
    np.testing.assert_allclose(out, cpu, rtol=1e-4, atol=1e-5 * scale)
    np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-4 * scale)
