"""ONNX models whose weights sit in an external data file import from any directory."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import ModelFormatError

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(3)


def _model(hidden: int = 64) -> onnx.ModelProto:
    """x (2, 16) -> MatMul w1 -> Add b (float16 cast back) -> Reshape by an int64 initializer."""
    w1 = RNG.standard_normal((16, hidden)).astype("float32")
    b16 = RNG.standard_normal(hidden).astype("float16")
    shape = np.array([2, hidden // 4, 4], dtype="int64")
    keep = np.array([True, False] * (hidden // 2), dtype=bool)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm"),
        helper.make_node("Cast", ["b16"], ["b"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["h", "b"], ["hb"], name="add"),
        helper.make_node("Cast", ["keep"], ["keepf"], to=TensorProto.FLOAT, name="cast_keep"),
        helper.make_node("Mul", ["hb", "keepf"], ["m"], name="mul"),
        helper.make_node("Reshape", ["m", "shape"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes, "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, hidden // 4, 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b16, "b16"),
         numpy_helper.from_array(shape, "shape"), numpy_helper.from_array(keep, "keep")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save_external(model: onnx.ModelProto, folder) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert os.path.exists(os.path.join(folder, "weights.bin"))
    return path


def _check(mod, params, path):
    x = RNG.standard_normal((2, 16)).astype("float32")
    got = kiln.build(mod, params=params)(x)
    inline = onnx.load(path).SerializeToString()  # (ORT cannot read an external shape tensor)
    ref = ort.InferenceSession(inline, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_import_by_path_from_another_directory(tmp_path, monkeypatch):
    path = _save_external(_model(), tmp_path / "models")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    mod, params = from_onnx(path)
    assert set(params) == {"w1"}  # the others (casts, the shape) fold at import
    _check(mod, params, path)
    # relative path too, and bound as constants
    monkeypatch.chdir(tmp_path)
    mod, params = from_onnx(os.path.join("models", "model.onnx"), bind_params=True)
    assert params == {}
    _check(mod, None, path)


def test_loaded_proto_with_base_dir(tmp_path, monkeypatch):
    path = _save_external(_model(), tmp_path / "m")
    monkeypatch.chdir(tmp_path)
    proto = onnx.load(path, load_external_data=False)
    with pytest.raises(ModelFormatError, match="external file 'weights.bin': pass base_dir="):
        from_onnx(proto)
    mod, params = from_onnx(proto, base_dir=str(tmp_path / "m"))
    _check(mod, params, path)
    # the caller's proto was not filled with the weights (read straight into the arrays)
    assert all(not init.raw_data for init in proto.graph.initializer)
    # a proto loaded with its data inline needs nothing
    mod, params = from_onnx(onnx.load(path))
    _check(mod, params, path)


_PEAK_CHILD = """
import sys
from kiln.frontend.onnx import from_onnx
def kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # resets the peak (VmHWM) to the current resident size
base = kib("VmRSS")
_, params = from_onnx(sys.argv[1])
print((kib("VmHWM") - base) * 1024, float(params["w"][7, 11]))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_weights_are_held_once(tmp_path):
    """Importing 32 MiB of external weights raises the process's peak resident memory by
    about 32 MiB: the bytes go straight from the file into the numpy array. (``onnx.load``
    followed by converting every initializer peaks at twice that: the protobuf holds a copy.)
    Measured in a fresh process: protobuf's memory is invisible to tracemalloc."""
    import subprocess
    import sys

    w = RNG.standard_normal((2048, 4096)).astype("float32")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4096])],
        [numpy_helper.from_array(w, "w")])
    path = _save_external(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                          tmp_path / "big")
    root = os.path.dirname(os.path.dirname(kiln.__file__))
    out = subprocess.run([sys.executable, "-c", _PEAK_CHILD, path], capture_output=True,
                         text=True, check=True, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": root})
    peak, value = out.stdout.split()
    assert float(value) == float(w[7, 11])
    assert int(peak) < 1.4 * w.nbytes, f"peak {int(peak) / 2**20:.1f} MiB for 32 MiB"


def test_bad_external_data_is_reported(tmp_path):
    path = _save_external(_model(), tmp_path / "m")
    proto = onnx.load(path, load_external_data=False)
    w1 = next(i for i in proto.graph.initializer if i.name == "w1")
    for entry in w1.external_data:
        if entry.key == "location":
            entry.value = "../secrets.bin"
    with pytest.raises(ModelFormatError, match="must be a path inside the model's folder"):
        from_onnx(proto, base_dir=str(tmp_path / "m"))
    os.remove(tmp_path / "m" / "weights.bin")
    with pytest.raises(ModelFormatError, match="w1.*cannot read its external data file"):
        from_onnx(path)
    with open(tmp_path / "m" / "weights.bin", "wb") as f:
        f.write(b"\0" * 10)
    with pytest.raises(ModelFormatError, match="ends before its data"):
        from_onnx(path)
