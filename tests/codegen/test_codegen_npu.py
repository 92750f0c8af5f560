"""Models end to end through ``kiln.build(target="npu")`` on both hardware descriptions: the
executable runs the simulator, reports cycles, and matches the numpy reference (float16
products with float32 accumulation: rel. error <= 1e-2)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln import cli
from kiln.build import npu_pipeline
from kiln.codegen.npu import NPUExecutable, build_npu
from kiln.frontend.onnx import from_onnx
from kiln.ir import ArgumentError, KilnError, ModelFormatError, RuntimeCheckError
from kiln.npu import SimulationError
from kiln.testing import models, torch_models
from kiln.transform.pass_infra import PassContext

HW = ["default", "edge"]
MODELS = {
    "mlp": lambda: models.mlp(batch=4, sizes=(64, 96, 32, 10)),
    "small_cnn": lambda: models.small_cnn(batch=2, channels=8, size=16),
    "resnet_block_cnn": lambda: models.resnet_block_cnn(batch=1, channels=16, size=16),
}


def _rel(out, ref):
    return float(np.max(np.abs(out.astype(np.float64) - ref)) / np.max(np.abs(ref)))


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_on_npu_matches_numpy(hw, name):
    model = MODELS[name]()
    exe = kiln.build(model.mod, target=f"npu -hw={hw}")
    assert isinstance(exe, NPUExecutable) and exe.config.name == hw
    assert exe.cpu_ops == []  # every op of these models has an NPU lowering
    out = exe(*model.inputs)
    assert _rel(out, model.reference(*model.inputs)) <= 1e-2
    assert exe.last_cycles > 0 and len(exe.last_reports) == 1
    phases = exe.last_reports[0].phase_cycles()
    assert [k.label for k in exe.kernels] == [p for p in phases if p != "tail"]
    x = np.random.default_rng(9).standard_normal(model.inputs[0].shape).astype("float32")
    assert _rel(exe(x), model.reference(x)) <= 1e-2


def test_describe_names_each_kernel_and_its_tiling():
    exe = kiln.build(models.small_cnn(batch=1, channels=8, size=16).mod,
                     target=kiln.Target("npu", hw="edge"))
    text = exe.describe()
    assert "'edge'" in text and "nn.conv2d" in text and "tile M" in text


def test_opt_level_0_keeps_dense_and_batch_norm_runs_on_cpu():
    model = models.small_cnn(batch=1, channels=4, size=8)
    with PassContext(opt_level=0):
        exe = kiln.build(model.mod, target="npu")
    assert exe.cpu_ops == ["nn.batch_norm"]  # not simplified at opt level 0
    assert "dense" in [k.op for k in exe.kernels]
    assert _rel(exe(*model.inputs), model.reference(*model.inputs)) <= 1e-2


def test_bad_inputs_and_targets():
    model = models.mlp(batch=2, sizes=(8, 4))
    exe = kiln.build(model.mod, target="npu")
    with pytest.raises(ArgumentError, match=r"'x'.*\(2, 8\).*\(2, 7\)"):
        exe(np.zeros((2, 7), "float32"))
    with pytest.raises(ArgumentError, match="expected 1 input"):
        exe()
    with pytest.raises(KilnError, match="hw= names an NPU"):
        kiln.Target("c", hw="edge")
    with pytest.raises(KilnError, match="unknown"):
        kiln.build(model.mod, target="npu -hw=no_such_chip")
    assert kiln.Target.create("npu -hw=edge").hw == "edge"
    assert kiln.Target.create("npu -hw=edge").spec == "npu -hw=edge"


def test_hazard_checker_catches_a_missing_token():
    """The pipeline's tokens are what make the program correct: dropping the DMA-in ->
    tensor tokens makes the simulator report the hazard instead of a wrong answer."""
    model = models.mlp(batch=2, sizes=(64, 32))
    exe = kiln.build(model.mod, target="npu")
    prog = exe.steps[0].program
    prog.streams[0] = [i for i in prog.streams[0]
                       if not (i.op in ("tok.push", "tok.pop") and i.args["src"] == 0)]
    with pytest.raises(SimulationError, match="hazard|deadlock"):
        exe(*model.inputs)


def test_elementwise_chains_become_one_kernel():
    model = models.resnet_block_cnn(batch=1, channels=8, size=8, blocks=1)
    mod = npu_pipeline()(model.mod)
    # the chains as vector kernels of their own (by default they run on the convolutions'
    # tiles: tests/schedule/test_schedule_npu_epilogue.py)
    fused = build_npu(mod, kiln.Target("npu"), fuse=True, fuse_epilogue=False)
    alone = build_npu(mod, kiln.Target("npu"), fuse=False)
    ops = [k.op for k in fused.kernels]
    assert "multiply+add+relu" in ops and "multiply+add+add+relu" in ops
    assert len(fused.kernels) < len(alone.kernels)
    ref = model.reference(*model.inputs)
    assert _rel(fused(*model.inputs), ref) <= 1e-2
    assert _rel(alone(*model.inputs), ref) <= 1e-2
    assert fused.last_cycles < alone.last_cycles


def test_cli_show_prints_npu_tilings_and_assembly(capsys, tmp_path):
    assert cli.main(["show", "demo:small_cnn", "--target", "npu -hw=edge", "--stage", "npu"]) == 0
    out = capsys.readouterr().out
    assert "'edge'" in out and "nn.conv2d" in out and "tile M" in out
    assert cli.main(["show", "demo:mlp", "--target", "npu", "--stage", "asm"]) == 0
    out = capsys.readouterr().out
    assert ".core 0" in out and "mma.set" in out and "barrier" in out
    assert cli.main(["show", "demo:mlp", "--target", "npu", "--stage", "tir"]) != 0
    assert "stages graph, optimized, partition, scheduled, npu, asm" in capsys.readouterr().err


@pytest.mark.parametrize("hw", HW)
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_vision_models_from_onnx_run_entirely_on_npu(hw, name, tmp_path):
    """ResNet-18 and MobileNetV2 (random weights, 32x32 images to keep the simulation short)
    exported by torch to ONNX: every op on the NPU (MobileNetV2's depthwise convolutions on
    the vector unit), rel. error <= 1e-2 and the same top-1 class as torch in float32."""
    torch = pytest.importorskip("torch")
    net = getattr(torch_models, name)()
    x = np.random.default_rng(12).standard_normal((1, 3, 32, 32)).astype("float32")
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(torch_models.export_onnx(net, (torch.from_numpy(x),), ["x"]))
    mod, params = from_onnx(str(path))
    exe = kiln.build(mod, target=f"npu -hw={hw}", params=params)
    assert exe.cpu_ops == []
    with torch.no_grad():
        ref = net(torch.from_numpy(x)).numpy()
    out = exe(x)
    assert _rel(out, ref) <= 1e-2
    np.testing.assert_array_equal(out.argmax(-1), ref.argmax(-1))


def _bert_onnx(torch, net, inputs, names, tmp_path):
    path = tmp_path / "bert.onnx"
    path.write_bytes(torch_models.export_onnx(net, tuple(torch.from_numpy(a) for a in inputs),
                                              names))
    mod, params = from_onnx(str(path))
    with torch.no_grad():
        ref = net(*(torch.from_numpy(a) for a in inputs)).numpy()
    return mod, params, ref


@pytest.mark.parametrize("hw", HW)
def test_bert_encoder_on_npu(hw, tmp_path):
    """The BERT-style encoder (small: 2 layers, hidden 64, 4 heads, 16 tokens) exported by torch
    to ONNX: attention's run-time batched products, the transposes, the Q/K/V slices, softmax,
    GELU (erf) and layer norms on the NPU, the mask's int64 -> float cast on the scalar unit
    (no int64 vector type), rel. error <= 1e-2 vs torch in float32. The embedding gather
    (run-time row indices: the NPU has no indirect DMA) is a scalar-unit loop, so the whole
    model builds with strict=True, and an id outside the vocabulary stops the run (ONNX
    Gather's "raise" mode) with a RuntimeCheckError naming it."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch_models.bert_encoder(layers=2, hidden=64, heads=4, ffn=128, vocab=100,
                                    max_len=32).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 100, (2, 16)).astype(np.int64)
    mask = np.ones((2, 16), np.int64)
    mask[:, 12:] = 0
    mod, params, ref = _bert_onnx(torch, net, [ids, mask], ["input_ids", "attention_mask"],
                                  tmp_path)
    exe = kiln.build(mod, target=f"npu -hw={hw}", params=params, strict=True)
    assert exe.cpu_ops == []  # the position embedding's gather is folded
    assert any(k.op == "cast" and k.tiling.startswith("scalar unit") for k in exe.kernels)
    assert any(k.op == "take" and k.tiling.startswith("scalar unit (take: no indirect DMA)")
               for k in exe.kernels)
    assert _rel(exe(ids, mask), ref) <= 1e-2
    ops = {k.op for k in exe.kernels}
    assert {"matmul", "nn.layer_norm", "nn.softmax", "transpose", "strided_slice"} <= ops
    bad = ids.copy()
    bad[1, 3] = 100
    with pytest.raises(RuntimeCheckError, match="index out of range: 100"):
        exe(bad, mask)

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = net.blocks

        def forward(self, x, bias):
            for blk in self.blocks:
                x = blk(x, bias)
            return x

    x = rng.standard_normal((2, 16, 64)).astype("float32")
    bias = np.where(mask[:, None, None, :] == 0, -10000.0, 0.0).astype("float32")
    mod, params, ref = _bert_onnx(torch, Blocks().eval(), [x, bias], ["x", "bias"], tmp_path)
    exe = kiln.build(mod, target=f"npu -hw={hw}", params=params, strict=True)
    assert exe.cpu_ops == []
    assert _rel(exe(x, bias), ref) <= 1e-2


def _onnx_cnn(path):
    """A small ONNX model whose CumSum has no NPU lowering: NPU, CPU and NPU steps."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((6, 3, 3, 3)).astype("float32"), "w")
    fc = numpy_helper.from_array(rng.standard_normal((6 * 8 * 8, 5)).astype("float32"), "fc")
    shape = numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")
    axis = numpy_helper.from_array(np.array(3, dtype=np.int64), "axis")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("CumSum", ["r", "axis"], ["t"]),
             helper.make_node("Reshape", ["t", "shape"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(
        nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, fc, shape, axis])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("hw", HW)
def test_npu_executable_saves_and_loads_in_a_fresh_process(hw, tmp_path, capsys):
    """`kiln compile --target npu` writes the programs (binary encoding), DRAM layout,
    constants and CPU steps; another process loads the file and gets the same outputs and
    simulated cycles."""
    _onnx_cnn(tmp_path / "m.onnx")
    out = tmp_path / "m.kiln"
    assert cli.main(["compile", str(tmp_path / "m.onnx"), "--target", f"npu -hw={hw}", "-o",
                     str(out)]) == 0
    assert "CPU ops: cumsum" in capsys.readouterr().out
    mod, params = from_onnx(str(tmp_path / "m.onnx"))
    exe = kiln.build(mod, target=f"npu -hw={hw}", params=params)
    x = np.random.default_rng(4).standard_normal((1, 3, 8, 8)).astype("float32")
    y = exe(x)
    assert [type(s).__name__ for s in exe.steps] == ["NpuStep", "CpuStep", "NpuStep"]
    np.save(tmp_path / "x.npy", x)
    script = ("import sys, numpy as np, kiln\n"
              "exe = kiln.load(sys.argv[1])\n"
              "y = exe(np.load(sys.argv[2]))\n"
              "np.save(sys.argv[3], y)\n"
              "print(exe.last_cycles, exe.cpu_ops, exe.config.name)\n")
    res = subprocess.run([sys.executable, "-c", script, str(out), str(tmp_path / "x.npy"),
                          str(tmp_path / "y.npy")], capture_output=True, text=True,
                         cwd=Path(kiln.__file__).parent.parent, timeout=300)
    assert res.returncode == 0, res.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), y)
    assert res.stdout.split() == [str(exe.last_cycles), "['cumsum']", hw]
    ref = np.cumsum(np.maximum(_conv_nchw(x, params["w"]), 0), axis=3).reshape(1, -1) @ \
        params["fc"]
    assert _rel(y, ref) <= 1e-2
    assert cli.main(["inspect", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"npu -hw={hw}" in text and "nn.conv2d" in text and "CPU ops: cumsum" in text
    assert cli.main(["run", str(out), str(tmp_path / "x.npy"), "-o",
                     str(tmp_path / "o.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "o.npy"), y)
    assert "NPU cycles" in capsys.readouterr().out


def _conv_nchw(x, w):
    """A 3x3 stride-1 convolution with padding 1 (numpy, float64)."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    cols = np.stack([xp[:, :, a:a + h, b:b + wd] for a in range(3) for b in range(3)], axis=2)
    return np.einsum("nctij,oct->noij", cols, w.reshape(w.shape[0], w.shape[1], 9))


def test_an_executable_with_a_mean_of_36_saves(tmp_path):
    """A global average pool over 6 x 6 multiplies by 1/36, not a float32 value: the
    instruction encoding refused to save it (IsaError); immediates are rounded to float32 when
    emitted, as the vector unit computes with them -- the loaded file gives the same bits."""
    m = models.small_cnn(batch=1, channels=8, size=12)
    exe = kiln.build(m.mod, target="npu")
    want = exe(*m.inputs)
    exe.save(str(tmp_path / "m.kiln"))
    back = kiln.load(str(tmp_path / "m.kiln"))
    np.testing.assert_array_equal(back(*m.inputs), want)
    assert back.last_cycles == exe.last_cycles


def test_damaged_npu_executable_is_refused(tmp_path):
    exe = kiln.build(models.mlp(batch=2, sizes=(8, 4)).mod, target="npu")
    path = tmp_path / "m.kiln"
    exe.save(str(path))
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last section (the constants)
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="npu.constants"):
        kiln.load(str(path))


@pytest.mark.parametrize("hw", HW)
def test_dram_reuse_shrinks_the_footprint_and_changes_no_output(hw):
    """Tensors never live together share DRAM: the residual block's skip tensor stays live
    across the convolutions (its bytes are not reused), the outputs are bit-identical to the
    build with a range per tensor, and the footprint shrinks."""
    model = MODELS["resnet_block_cnn"]()
    mod = npu_pipeline(target=f"npu -hw={hw}")(model.mod)
    shared = build_npu(mod, kiln.Target("npu", hw=hw))
    alone = build_npu(mod, kiln.Target("npu", hw=hw), reuse_dram=False)
    assert alone.dram_bytes == alone.unshared_dram_bytes == shared.unshared_dram_bytes
    assert shared.dram_bytes < 0.8 * alone.dram_bytes
    np.testing.assert_array_equal(shared(*model.inputs), alone(*model.inputs))
    assert _rel(shared(*model.inputs), model.reference(*model.inputs)) <= 1e-2
    x = np.random.default_rng(5).standard_normal(model.inputs[0].shape).astype("float32")
    np.testing.assert_array_equal(shared(x), alone(x))  # a second call: constants intact


def test_float64_tensors_live_in_dram_for_cpu_steps(tmp_path):
    """The NPU has no float64, but a model may compute part of its graph in float64: those
    ops run as CPU steps and their tensors (here a float64 output) live in the executable's
    DRAM, which holds any fixed-width dtype -- the build used to fail with a KeyError."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype("float32"), "w")
    scale = numpy_helper.from_array(np.array(1.0 / 3.0), "scale")  # a float64 constant
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Cast", ["r"], ["d"], to=TensorProto.DOUBLE),
             helper.make_node("Mul", ["d", "scale"], ["y"])]
    graph = helper.make_graph(
        nodes, "f64", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [1, 4, 8, 8])], [w, scale])
    path = tmp_path / "m.onnx"
    path.write_bytes(helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    mod, params = from_onnx(str(path))
    exe = kiln.build(mod, target="npu -hw=edge", params=params)
    assert "nn.conv2d" in [k.op for k in exe.kernels] and exe.cpu_ops  # float64 on the CPU
    x = rng.standard_normal((1, 3, 8, 8)).astype("float32")
    y = exe(x)
    assert y.dtype == np.float64 and y.shape == (1, 4, 8, 8)
    ref = np.maximum(_conv_nchw(x, params["w"]), 0) / 3.0
    assert _rel(y, ref) <= 1e-2
    exe.save(str(tmp_path / "m.kiln"))
    np.testing.assert_array_equal(kiln.load(str(tmp_path / "m.kiln"))(x), y)
