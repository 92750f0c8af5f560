"""``kiln show model.onnx --target npu --stage npu``: every kernel with its tiling, where the
model's work ran (the unit shares) and every scalar-unit fallback with its reason."""

import numpy as np

from kiln import cli


def _onnx_with_a_log(path):
    """x -> Abs -> Log (no vector instruction: the scalar unit) -> MatMul (the tensor unit)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["a"], name="abs"),
         helper.make_node("Log", ["a"], ["l"], name="log"),
         helper.make_node("MatMul", ["l", "w"], ["y"], name="mm")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_show_npu_lists_scalar_fallbacks(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    _onnx_with_a_log(path)
    assert cli.main(["show", str(path), "--target", "npu -hw=edge", "--stage", "npu"]) == 0
    out = capsys.readouterr().out
    fallback = [line for line in out.splitlines() if line.startswith("  scalar fallback ")]
    assert len(fallback) == 1 and fallback[0].strip().endswith(":log: log: no vector instruction")
    assert "MACs on tensor unit: 100.00%" in out
    assert "(scalar 64, CPU 0 of " in out  # the log's 4 x 16 elements
    assert "scalar fallbacks: 1 (1 x log: no vector instruction)" in out
    assert "scalar unit (log: no vector instruction)" in out  # the kernel's own line
