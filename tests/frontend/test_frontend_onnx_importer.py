"""from_onnx: hand-built ONNX models per op family checked against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln import graph as g
from kiln.frontend.onnx import converter, from_onnx, lookup_converter
from kiln.frontend.onnx.converters.common import iota
from kiln.ir import KilnError, ModelFormatError, UnsupportedOperatorError
from kiln.ir.errors import ArgumentError, MemoryLimitError
from kiln.testing.onnx_graphs import onnx_model
from kiln.testing.onnx_graphs import value_info as _vi

ort = pytest.importorskip("onnxruntime")

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    return onnx_model(nodes, inputs, outputs, inits, opset, check=True)


def _ort(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(model, feeds, rtol=1e-5):
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    got = exe(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    ref = _ort(model, feeds)
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        scale = float(np.max(np.abs(b))) if b.size else 1.0
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(scale, 1.0))
    return exe


def _x(*shape):
    return RNG.standard_normal(shape).astype("float32")


def test_elementwise_family():
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Mul", ["s", "a"], ["m"]),
        helper.make_node("Tanh", ["m"], ["t"]),
        helper.make_node("LeakyRelu", ["t"], ["l"], alpha=0.3),
        helper.make_node("Elu", ["l"], ["e"], alpha=0.7),
        helper.make_node("HardSigmoid", ["e"], ["h"]),
        helper.make_node("Clip", ["b", "lo", "hi"], ["c"]),
        helper.make_node("Max", ["h", "c", "b"], ["mx"]),
        helper.make_node("Less", ["a", "b"], ["lt"]),
        helper.make_node("Where", ["lt", "mx", "a"], ["w"]),
        helper.make_node("Softplus", ["w"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(-0.5, "float32"), "lo"),
             numpy_helper.from_array(np.array(0.5, "float32"), "hi")]
    model = _model(nodes, [_vi("a", [2, 3]), _vi("b", [3])], [_vi("y", [2, 3])], inits)
    _check(model, {"a": _x(2, 3), "b": _x(3)})


def test_nn_family_conv_pool_bn_gemm():
    w = _x(4, 3, 3, 3) * 0.3
    nodes = [
        helper.make_node("Conv", ["x", "w", "bias"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"], epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("AveragePool", ["p"], ["ap"], kernel_shape=[3, 3], auto_pad="SAME_UPPER"),
        helper.make_node("GlobalAveragePool", ["ap"], ["gp"]),
        helper.make_node("Flatten", ["gp"], ["f"]),
        helper.make_node("Gemm", ["f", "wd", "bd"], ["gm"], transB=1, alpha=0.5),
        helper.make_node("Softmax", ["gm"], ["y"], axis=1),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in [
        ("w", w), ("bias", _x(4)), ("g", _x(4)), ("b", _x(4)), ("m", _x(4)),
        ("v", np.abs(_x(4)) + 0.5), ("wd", _x(5, 4)), ("bd", _x(5))]]
    model = _model(nodes, [_vi("x", [2, 3, 8, 8])], [_vi("y", [2, 5])], inits)
    _check(model, {"x": _x(2, 3, 8, 8)})


def test_softmax_opset11_coerces_to_2d():
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    model = _model([node], [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])], opset=11)
    _check(model, {"x": _x(2, 3, 4)})
    node = helper.make_node("LogSoftmax", ["x"], ["y"], axis=1)
    model = _model([node], [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])], opset=13)
    _check(model, {"x": _x(2, 3, 4)})


def test_reduce_family():
    nodes = [
        helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=1),
        helper.make_node("ReduceMean", ["s"], ["m"], axes=[2], keepdims=0),
        helper.make_node("ArgMax", ["x"], ["am"], axis=1, keepdims=0),
    ]
    inits = [numpy_helper.from_array(np.array([1], "int64"), "ax")]
    model = _model(nodes, [_vi("x", [2, 3, 4])],
                   [_vi("m", [2, 1]), _vi("am", [2, 4], TensorProto.INT64)], inits, opset=17)
    _check(model, {"x": _x(2, 3, 4)})


def test_shape_family_folds_constant_shapes():
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "zs"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        helper.make_node("Slice", ["t", "st", "en", "axs", "stp"], ["sl"]),
        helper.make_node("Split", ["sl", "sizes"], ["a", "b"], axis=0),
        helper.make_node("Pad", ["a", "pads", "pv"], ["pa"], mode="constant"),
        helper.make_node("Tile", ["b", "reps"], ["ti"]),
        helper.make_node("Expand", ["pa", "esh"], ["ex"]),
        helper.make_node("Squeeze", ["ex", "zero"], ["sq"]),
    ]
    i64 = lambda v, n: numpy_helper.from_array(np.array(v, "int64"), n)  # noqa: E731
    inits = [i64(0, "zs"), i64([0], "zero"), i64([-1], "minus1"), i64([-1], "st"),
             i64([-100], "en"),
             i64([0], "axs"), i64([-2], "stp"), i64([3, 3], "sizes"), i64([0, 1, 0, 2], "pads"),
             i64([1, 2], "reps"), i64([1, 3, 5], "esh"),
             numpy_helper.from_array(np.array(1.5, "float32"), "pv")]
    model = _model(nodes, [_vi("x", [2, 3, 4])],
                   [_vi("sq", [3, 5]), _vi("ti", [3, 4])], inits, opset=17)
    _check(model, {"x": _x(2, 3, 4)})


def test_depth_space_round_trip_and_cast():
    nodes = [
        helper.make_node("DepthToSpace", ["x"], ["d"], blocksize=2, mode="CRD"),
        helper.make_node("SpaceToDepth", ["d"], ["s"], blocksize=2),
        helper.make_node("Cast", ["s"], ["y"], to=TensorProto.INT32),
    ]
    model = _model(nodes, [_vi("x", [1, 8, 2, 3])], [_vi("y", [1, 8, 2, 3], TensorProto.INT32)])
    _check(model, {"x": _x(1, 8, 2, 3) * 10})


def test_layer_norm_and_matmul():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("LayerNormalization", ["mm", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in [("w", _x(4, 6)), ("g", _x(6)),
                                                          ("b", _x(6))]]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 6])], inits)
    _check(model, {"x": _x(2, 3, 4)})


def test_dynamic_batch_compiles_once_runs_two_sizes():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Relu", ["mm"], ["y"])]
    w = _x(4, 5)
    model = _model(nodes, [_vi("x", ["N", 4])], [_vi("y", ["N", 5])],
                   [numpy_helper.from_array(w, "w")])
    mod, params = from_onnx(model)
    assert list(params) == ["w"]
    (xparam,) = [p for p in mod["main"].params if p.name == "x"]
    assert isinstance(xparam.struct_info.shape[0], kiln.tir.Var)
    exe = kiln.build(mod, params=params)
    for n in (1, 7):
        x = _x(n, 4)
        np.testing.assert_allclose(exe(x=x), np.maximum(x @ w, 0), rtol=1e-5, atol=1e-5)


def test_bind_params_embeds_initializers():
    nodes = [helper.make_node("Add", ["x", "w"], ["y"])]
    w = _x(3)
    model = _model(nodes, [_vi("x", [3]), _vi("w", [3])], [_vi("y", [3])],
                   [numpy_helper.from_array(w, "w")])
    mod, params = from_onnx(model, bind_params=True)
    assert params == {} and [p.name for p in mod["main"].params] == ["x"]
    x = _x(3)
    np.testing.assert_allclose(kiln.build(mod)(x), x + w, rtol=1e-6)


def test_several_outputs_in_model_order():
    nodes = [helper.make_node("Neg", ["x"], ["a"]), helper.make_node("Exp", ["x"], ["b"])]
    model = _model(nodes, [_vi("x", [4])], [_vi("b", [4]), _vi("a", [4])])
    exe = _check(model, {"x": _x(4)})
    x = _x(4)
    b, a = exe(x)
    np.testing.assert_allclose(a, -x)


def test_unsupported_operators_listed_before_conversion():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="ok"),
             helper.make_node("MaxRoiPool", ["r", "r"], ["n"], name="nms1", pooled_shape=[1, 1]),
             helper.make_node("ImageDecoder", ["r"], ["d1"], name="det1"),
             helper.make_node("ImageDecoder", ["r"], ["d2"], name="det2")]
    graph = helper.make_graph(nodes, "g", [_vi("x", [2, 2])], [_vi("d2", [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedOperatorError) as info:
        from_onnx(model)
    msg = str(info.value)
    # (MaxRoiPool has no converter; ImageDecoder only exists from opset 20)
    for text in ("MaxRoiPool", "nms1", "ImageDecoder", "det1", "det2"):
        assert text in msg
    assert "Relu" not in msg


def test_truncated_and_garbage_files(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    data = _model(nodes, [_vi("x", [2])], [_vi("y", [2])]).SerializeToString()
    path = tmp_path / "m.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError):
        from_onnx(str(path))
    with pytest.raises(ModelFormatError):
        from_onnx(b"\xff\xfe not a model")
    with pytest.raises(ModelFormatError):
        from_onnx(str(tmp_path / "missing.onnx"))
    mod, _ = from_onnx(data)  # the whole file imports
    assert "main" in mod


def test_run_time_shape_of_unknown_length_names_the_node():
    """A Reshape shape known only at run time works (tests/frontend/
    test_frontend_onnx_runtime_shapes.py); one whose *length* (the output rank) is unknown
    cannot, and the error names the node."""
    nodes = [helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape_me")]
    model = _model(nodes, [_vi("x", [2, 3]), _vi("s", ["k"], TensorProto.INT64)],
                   [_vi("y", ["r0", "r1"])])
    with pytest.raises(KilnError, match="reshape_me"):
        from_onnx(model)


def test_damaged_constant_operands_name_the_node():
    """Constant operands that no valid model has (fuzz 3034384, 3034906, 3034812, 3036169,
    3036302) are errors naming the node, not a numpy error or running out of memory reported
    as a kiln bug."""
    i64 = TensorProto.INT64

    def const(name, value):
        return numpy_helper.from_array(np.asarray(value, np.int64), name)

    cat = onnx_model([helper.make_node("Concat", ["a", "b"], ["y"], name="cat", axis=0)], [],
                     [_vi("y", [None], i64)], [const("a", np.zeros(0)), const("b", 3)])
    with pytest.raises(KilnError, match="Concat node 'cat': cannot concatenate constant inputs"):
        from_onnx(cat)
    take = onnx_model([helper.make_node("Gather", ["a", "i"], ["y"], name="take")], [],
                      [_vi("y", [], i64)], [const("a", [4, 5]), const("i", 3)])
    with pytest.raises(KilnError, match="Gather node 'take': index 3 is out of range"):
        from_onnx(take)
    cut = onnx_model([helper.make_node("Slice", ["x", "s", "e"], ["y"], name="cut")],
                     [_vi("x", [2, 3]), _vi("s", [1 << 40], i64), _vi("e", [1 << 40], i64)],
                     [_vi("y", [None, None])])
    with pytest.raises(KilnError, match="Slice node 'cut': starts has 1099511627776 entries"):
        from_onnx(cut)
    fold = onnx_model([helper.make_node("Reshape", ["a", "s"], ["y"], name="fold")], [],
                      [_vi("y", [None], i64)], [const("a", [7]), const("s", [2, 3])])
    with pytest.raises(KilnError, match="Reshape node 'fold': cannot reshape a constant"):
        from_onnx(fold)
    deep = onnx_model([helper.make_node("Reshape", ["x", "s"], ["y"], name="deep")],
                      [_vi("x", [2, 3]), _vi("s", [(1 << 32) + 1], i64)], [_vi("y", None)])
    with pytest.raises(KilnError, match="Reshape node 'deep'.*rank 4294967297, above"):
        from_onnx(deep)
    pad = onnx_model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad")],
                     [_vi("x", [2, 3, 4])], [_vi("y", None)], [const("p", [1, 1, 1, 1])])
    with pytest.raises(KilnError, match="Pad node 'pad': pads has 4 entries"):
        from_onnx(pad)
    # a Python number that the input's dtype cannot hold (fuzz 3036777: an OverflowError)
    same = onnx_model([helper.make_node("Identity", ["x"], ["y"])],
                      [_vi("x", [], TensorProto.UINT8)], [_vi("y", [], TensorProto.UINT8)])
    mod, params = from_onnx(same)
    with pytest.raises(ArgumentError, match="input 'x': int value is not a uint8 array"):
        kiln.build(mod, params=params)(x=300)


def test_damaged_signal_resize_and_transpose_inputs_name_the_node(monkeypatch):
    """More damaged models the fuzzer reported as kiln bugs (fuzz 3035692, 3035797, 3036035,
    3035624, 3035674): each now a KilnError naming the node or the limit."""
    stft = onnx_model([helper.make_node("STFT", ["x", "step"], ["y"], name="stft")],
                      [_vi("x", [16]), _vi("step", [], TensorProto.INT64)], [_vi("y", None)],
                      (), 17)
    with pytest.raises(KilnError, match="STFT node 'stft': the signal must be"):
        from_onnx(stft)
    deconv = onnx_model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="deconv",
                                          output_shape=[3])],
                        [_vi("x", [1, 1, 3, 3]), _vi("w", [1, 1, 2, 2])], [_vi("y", None)])
    with pytest.raises(KilnError, match="ConvTranspose node 'deconv': output_shape"):
        from_onnx(deconv)
    monkeypatch.setenv("KILN_MEMORY_LIMIT", "1M")  # the DFT's matrices: 2 x 1024 x 513 x 8 B
    dft = onnx_model([helper.make_node("DFT", ["x"], ["y"], name="dft", axis=1, onesided=1)],
                     [_vi("x", [1, 1024, 1])], [_vi("y", None)], (), 17)
    with pytest.raises(MemoryLimitError, match="DFT node 'dft'.*memory limit"):
        from_onnx(dft)
    monkeypatch.delenv("KILN_MEMORY_LIMIT")
    resize = onnx_model([helper.make_node("Resize", ["x", "", "s"], ["y"], name="up")],
                        [_vi("x", [1, 1, 2, 2]), _vi("s", [4])], [_vi("y", None)], (), 19)
    mod, params = from_onnx(resize)
    exe = kiln.build(mod, params=params)
    scales = np.array([np.inf, 1, 2, 2], np.float32)
    with pytest.raises(KilnError, match="scales must be positive and finite"):
        exe(x=_x(1, 1, 2, 2), s=scales)
    # a declared length of 2**31 is an arange computed at run time, not a 16 GiB constant
    assert not isinstance(iota(1 << 31, "int64"), np.ndarray | g.Constant)
    assert isinstance(iota(4, "int64"), g.Constant)


def test_opset_versioned_registry():
    assert lookup_converter("Softmax", 11) is not lookup_converter("Softmax", 13)
    assert lookup_converter("ReduceSum", 12) is not lookup_converter("ReduceSum", 13)
    assert lookup_converter("HardSwish", 13) is None
    assert lookup_converter("Relu", 1, domain="com.example") is None

    @converter("KilnTestOnlyOp", since=3, domain="com.kiln.test")
    def _conv(ctx, node):
        return node.input(0)

    assert lookup_converter("KilnTestOnlyOp", 2, "com.kiln.test") is None
    assert lookup_converter("KilnTestOnlyOp", 9, "com.kiln.test") is _conv


def test_bad_model_argument_type():
    with pytest.raises(KilnError, match="ModelProto"):
        from_onnx(42)


def test_feeds_by_original_onnx_names():
    nodes = [helper.make_node("Relu", ["input:0"], ["out.1"])]
    model = _model(nodes, [_vi("input:0", [2])], [_vi("out.1", [2])])
    exe = _check(model, {"input:0": np.array([-1.0, 2.0], "float32")})
    np.testing.assert_array_equal(exe(**{"input:0": np.array([3.0, -4.0], "float32")}), [3, 0])


def test_conv_and_pool_1d_are_lifted_to_2d():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[2, 1], dilations=[2]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[3], strides=[2]),
             helper.make_node("AveragePool", ["p"], ["y"], kernel_shape=[2],
                              auto_pad="SAME_LOWER")]
    model = _model(nodes, [_vi("x", [2, 3, 16])], [_vi("y", [2, 4, 7])],
                   [numpy_helper.from_array(_x(4, 3, 3), "w")])
    _check(model, {"x": _x(2, 3, 16)})


def test_output_names_and_io_description_match_onnxruntime(tmp_path):
    """exe.inputs/exe.outputs describe the model as ORT's get_inputs()/get_outputs() do, the
    outputs keep the graph's names (through save and load), and run(feeds, names) returns
    what sess.run(names, feeds) returns."""
    w = _x(8, 3)
    nodes = [helper.make_node("MatMul", ["image", "w"], ["logits/raw"], name="mm"),
             helper.make_node("Softmax", ["logits/raw"], ["probs"], axis=-1, name="sm"),
             helper.make_node("ArgMax", ["probs"], ["label"], axis=-1, keepdims=0, name="am")]
    model = _model(nodes, [_vi("image", ["batch", 8])],
                   [_vi("probs", ["batch", 3]), _vi("label", ["batch"], TensorProto.INT64),
                    _vi("logits/raw", ["batch", 3])],
                   [numpy_helper.from_array(w, "w")])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [(i.name, tuple(i.shape), i.dtype) for i in exe.inputs] == [
        (i.name, tuple(i.shape), "float32") for i in sess.get_inputs()]
    assert [o.name for o in exe.outputs] == [o.name for o in sess.get_outputs()]
    assert [o.shape for o in exe.outputs] == [("batch", 3), ("batch",), ("batch", 3)]
    assert [o.dtype for o in exe.outputs] == ["float32", "int64", "float32"]
    feeds = {"image": _x(5, 8)}
    for names in (None, ["label"], ["logits/raw", "probs"]):
        got, ref = exe.run(feeds, names), sess.run(names, feeds)
        assert len(got) == len(ref)
        for a, b in zip(got, ref):
            assert a.shape == b.shape and a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert sorted(exe.run(feeds, as_dict=True)) == ["label", "logits/raw", "probs"]
    path = str(tmp_path / "m.kiln")
    exe.save(path)
    assert kiln.load(path).outputs == exe.outputs
