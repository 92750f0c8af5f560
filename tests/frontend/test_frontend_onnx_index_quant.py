"""from_onnx for the indexing and quantization operators, checked against onnx.reference.

Each family is one multi-node model (one compile): GatherElements, GatherND, ScatterElements
(every reduction, repeated and negative indices), ScatterND, Scatter, ReverseSequence,
TensorScatter; QuantizeLinear (per tensor / per axis / blocked, ties and saturation),
DequantizeLinear, MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv (2-D and 1-D),
DynamicQuantizeLinear.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError
from kiln.ir.errors import RuntimeCheckError

RNG = np.random.default_rng(5)
I64 = TP.INT64


def _model(nodes, inputs, outputs, opset):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(onnx.shape_inference.infer_shapes(model))
    return model


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _out(name, dtype):
    return helper.make_tensor_value_info(name, dtype, None)


def _onnxruntime(model, feeds):
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _compare(model, feeds, rtol=1e-6, reference=None):
    """kiln's outputs against ``reference(model, feeds)`` (default: onnx.reference)."""
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    if reference is None:
        ref = ReferenceEvaluator(model).run(None, feeds)
    else:
        ref = reference(model, feeds)
    assert len(got) == len(ref)
    for out, a, b in zip(model.graph.output, got, ref):
        b = np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (out.name, a.shape, b.shape, a.dtype)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol, err_msg=out.name)


def test_indexing_ops_against_the_reference():
    F = TP.FLOAT
    n = helper.make_node
    nodes = [
        n("GatherElements", ["x", "ge_i"], ["ge"], axis=1),
        n("GatherND", ["x", "gn_i"], ["gn"], batch_dims=1),
        *[n("ScatterElements", ["x", "se_i", "se_u"], [f"se_{r}"], axis=-1, reduction=r)
          for r in ("none", "add", "mul", "max", "min")],
        *[n("ScatterND", ["x", "sn_i", "sn_u"], [f"sn_{r}"], reduction=r)
          for r in ("add", "max")],
        n("ReverseSequence", ["x", "lens"], ["rs"], time_axis=1, batch_axis=0),
        n("TensorScatter", ["cache", "upd", "wi"], ["ts_lin"], axis=2),
        n("TensorScatter", ["cache", "upd", "wi_c"], ["ts_circ"], axis=2, mode="circular"),
    ]
    feeds = {
        "x": RNG.standard_normal((3, 4, 5)).astype("float32"),
        "ge_i": RNG.integers(-4, 4, (3, 2, 5)),
        "gn_i": RNG.integers(-4, 4, (3, 6, 1)),
        # a permutation per row would hide last-write-wins; these repeat positions
        "se_i": np.array([[[0, 0, -1], [2, 2, 2], [1, -5, 4], [3, 3, 0]]] * 3),
        "se_u": RNG.standard_normal((3, 4, 3)).astype("float32"),
        "sn_i": np.array([[0, 1], [2, -1], [0, 1]]),
        "sn_u": RNG.standard_normal((3, 5)).astype("float32"),
        "lens": np.array([4, 1, 3]),
        "cache": RNG.standard_normal((2, 3, 6, 4)).astype("float32"),
        "upd": RNG.standard_normal((2, 3, 2, 4)).astype("float32"),
        "wi": np.array([1, 4]),
        "wi_c": np.array([5, 2]),
    }
    inputs = [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    outputs = [_out(o, F) for node in nodes for o in node.output]
    _compare(_model(nodes, inputs, outputs, opset=24), feeds)


def test_scatter_opset10_and_reverse_sequence_time_major():
    n = helper.make_node
    nodes = [n("Scatter", ["x", "i", "u"], ["s"], axis=1),
             n("ReverseSequence", ["x", "lens"], ["r"], time_axis=0, batch_axis=1)]
    feeds = {"x": RNG.standard_normal((3, 3)).astype("float32"),
             "i": np.array([[1, 0, 2], [0, 2, 1]]),
             "u": RNG.standard_normal((2, 3)).astype("float32"),
             "lens": np.array([3, 2, 1])}
    inputs = [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    model = _model(nodes, inputs, [_out("s", TP.FLOAT), _out("r", TP.FLOAT)], opset=10)
    _compare(model, feeds, reference=_onnxruntime)  # onnx.reference has no Scatter


def test_quantization_ops_against_the_reference():
    n = helper.make_node
    U8, I8, U16, I16, I32 = TP.UINT8, TP.INT8, TP.UINT16, TP.INT16, TP.INT32
    nodes = [
        n("QuantizeLinear", ["x", "s_ax", "zp_ax"], ["q_ax"], axis=1),
        n("QuantizeLinear", ["x", "s", "zp_u16"], ["q_u16"]),
        n("QuantizeLinear", ["x", "s_blk", "zp_blk"], ["q_blk"], axis=1, block_size=2),
        n("QuantizeLinear", ["x", "s"], ["q_u8"]),
        n("DequantizeLinear", ["q_ax", "s_ax", "zp_ax"], ["d_ax"], axis=1),
        n("DequantizeLinear", ["q_blk", "s_blk", "zp_blk"], ["d_blk"], axis=1, block_size=2),
        n("MatMulInteger", ["a", "b", "a_zp", "b_zp"], ["mmi"]),
        n("QLinearMatMul", ["a", "a_s", "a_zp", "b", "b_s", "b_zp0", "y_s", "y_zp"], ["qmm"]),
        n("ConvInteger", ["cx", "cw", "cx_zp", "cw_zp"], ["ci"], pads=[1, 1, 1, 1]),
        n("QLinearConv", ["cx", "a_s", "cx_zp", "cw", "cw_s", "cw_zp", "y_s", "y_zp8", "bias"],
          ["qc"], pads=[0, 1, 0, 1], strides=[1, 2]),
        n("DynamicQuantizeLinear", ["x"], ["dq", "dq_s", "dq_zp"]),
        n("ConvInteger", ["cx1", "cw1", "cx_zp"], ["ci1"], pads=[2, 0], dilations=[2]),
        n("QLinearConv", ["cx1", "a_s", "cx_zp", "cw1", "b_s", "b_zp0", "y_s", "y_zp"],
          ["qc1"], strides=[2]),
    ]
    # multiples of 0.25 with scale 0.5 put many values exactly on .5 ties; +-90 saturates
    x = RNG.integers(-360, 360, (2, 5, 3)).astype("float32") * 0.25
    feeds = {
        "x": x,
        "s_ax": np.array([0.5, 0.25, 1.0, 0.5, 2.0], "float32"),
        "zp_ax": np.array([0, 3, -7, 120, -128], "int8"),
        "s": np.array(0.5, "float32"),
        "zp_u16": np.array(60000, "uint16"),
        "s_blk": RNG.choice(np.array([0.125, 0.25, 0.5, 1.0, 4.0], "float32"), (2, 3, 3)),
        "zp_blk": RNG.integers(-300, 300, (2, 3, 3)).astype("int16"),
        "a": RNG.integers(0, 256, (3, 4)).astype("uint8"),
        "b": RNG.integers(0, 256, (4, 5)).astype("uint8"),
        "a_zp": np.array(128, "uint8"),
        "b_zp": RNG.integers(0, 256, (5,)).astype("uint8"),
        "b_zp0": np.array(7, "uint8"),
        "a_s": np.array(0.02, "float32"),
        "b_s": np.array(0.03, "float32"),
        "y_s": np.array(0.7, "float32"),
        "y_zp": np.array(100, "uint8"),
        "y_zp8": np.array(-5, "int8"),
        "cx": RNG.integers(0, 256, (1, 2, 5, 5)).astype("uint8"),
        "cw": RNG.integers(0, 256, (3, 2, 3, 3)).astype("uint8"),
        "cx_zp": np.array(120, "uint8"),
        "cw_zp": RNG.integers(0, 256, (3,)).astype("uint8"),
        "cw_s": np.array([0.001, 0.002, 0.0005], "float32"),
        "bias": RNG.integers(-2000, 2000, (3,)).astype("int32"),
        "cx1": RNG.integers(0, 256, (2, 2, 9)).astype("uint8"),
        "cw1": RNG.integers(0, 256, (4, 2, 3)).astype("uint8"),
    }
    inputs = [_vi(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for k, v in feeds.items()]
    types = {"q_ax": I8, "q_u16": U16, "q_blk": I16, "q_u8": U8, "d_ax": TP.FLOAT,
             "d_blk": TP.FLOAT, "mmi": I32, "qmm": U8, "ci": I32, "qc": I8, "dq": U8,
             "dq_s": TP.FLOAT, "dq_zp": U8, "ci1": I32, "qc1": U8}
    outputs = [_out(o, types[o]) for node in nodes for o in node.output]
    _compare(_model(nodes, inputs, outputs, opset=21), feeds)


def test_narrow_quantized_types():
    """int4 (saturating), float8 with and without saturation, float4, and back."""
    n = helper.make_node
    nodes = [
        n("QuantizeLinear", ["x", "s", "zp4"], ["q4"]),
        n("QuantizeLinear", ["x", "s", "zp8"], ["q8"]),
        n("QuantizeLinear", ["x", "s", "zp8"], ["q8_wrap"], saturate=0),
        n("QuantizeLinear", ["x", "s"], ["qf4"], output_dtype=TP.FLOAT4E2M1),
        n("DequantizeLinear", ["q4", "s", "zp4"], ["d4"]),
        n("DequantizeLinear", ["q8", "s"], ["d8"]),
    ]
    x = RNG.standard_normal((4, 6)).astype("float32") * 4
    x[0, :3] = [1e4, -1e4, 0.75]  # beyond float8_e4m3fn's 448 after scaling; a tie for int4
    feeds = {"x": x, "s": np.array(0.5, "float32"),
             "zp4": np.array(1, ml_dtypes.int4),
             "zp8": np.array(0, ml_dtypes.float8_e4m3fn)}
    inputs = [_vi("x", TP.FLOAT, (4, 6)), _vi("s", TP.FLOAT, ()), _vi("zp4", TP.INT4, ()),
              _vi("zp8", TP.FLOAT8E4M3FN, ())]
    types = {"q4": TP.INT4, "q8": TP.FLOAT8E4M3FN, "q8_wrap": TP.FLOAT8E4M3FN,
             "qf4": TP.FLOAT4E2M1, "d4": TP.FLOAT, "d8": TP.FLOAT}
    outputs = [_out(o, types[o]) for node in nodes for o in node.output]
    mod, params = from_onnx(_model(nodes, inputs, outputs, opset=23))
    got = kiln.build(mod, params=params)(**feeds)
    ref = ReferenceEvaluator(_model(nodes, inputs, outputs, opset=23)).run(None, feeds)
    for out, a, b in zip(outputs, got, ref):
        assert a.dtype == b.dtype, out.name
        np.testing.assert_array_equal(a.astype("float32"), b.astype("float32"),
                                      err_msg=out.name)


def test_errors_name_the_node():
    nodes = [helper.make_node("QLinearMatMul", ["a", "s2", "z", "a", "s", "z", "s", "z"],
                              ["y"], name="qmm")]
    inputs = [_vi("a", TP.UINT8, (2, 2)), _vi("s2", TP.FLOAT, (2,)), _vi("s", TP.FLOAT, ()),
              _vi("z", TP.UINT8, ())]
    with pytest.raises(KilnError, match="QLinearMatMul node 'qmm'.*a_scale"):
        from_onnx(_model(nodes, inputs, [_out("y", TP.UINT8)], opset=21))
    nodes = [helper.make_node("ReverseSequence", ["x", "l"], ["y"], name="rev",
                              time_axis=1, batch_axis=1)]
    inputs = [_vi("x", TP.FLOAT, (2, 3)), _vi("l", I64, (2,))]
    with pytest.raises(KilnError, match="ReverseSequence node 'rev'.*distinct"):
        from_onnx(_model(nodes, inputs, [_out("y", TP.FLOAT)], opset=10), opset=10)
    # an axis attribute out of range (fuzz 3033829: batch_axis 100) was an IndexError
    nodes = [helper.make_node("ReverseSequence", ["x", "l"], ["y"], name="rev",
                              time_axis=0, batch_axis=100)]
    with pytest.raises(KilnError, match="node .rev.*batch_axis 100 is out of range"):
        from_onnx(_model(nodes, inputs, [_out("y", TP.FLOAT)], opset=10), opset=10)


def test_scatter_updates_of_symbolic_shape_are_checked_at_run_time():
    """Exported models compute the updates' dims at run time (a NonZero count, a Reshape:
    longformer, xmod, switch-transformers in the model zoo): dims not provably equal to what the
    scatter needs import, and a run whose sizes differ raises a RuntimeCheckError naming the
    node before the kernel reads anything."""
    n = helper.make_node
    model = _model(
        [n("ScatterND", ["x", "i", "u"], ["y"], name="s"),
         n("ScatterElements", ["x", "j", "v"], ["z"], axis=1, name="e")],
        [_vi("x", TP.FLOAT, [4, 3]), _vi("i", TP.INT64, ["N", 1]), _vi("u", TP.FLOAT, ["M", 3]),
         _vi("j", TP.INT64, [2, "K"]), _vi("v", TP.FLOAT, [2, "L"])],
        [_out("y", TP.FLOAT), _out("z", TP.FLOAT)], 18)
    feeds = {"x": RNG.standard_normal((4, 3)).astype("float32"), "i": np.array([[2], [0]]),
             "u": RNG.standard_normal((2, 3)).astype("float32"), "j": np.array([[0, 2], [1, 1]]),
             "v": RNG.standard_normal((2, 2)).astype("float32")}
    _compare(model, feeds, reference=_onnxruntime)
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    with pytest.raises(RuntimeCheckError, match=r"ScatterND node 's'.*M = 3"):
        exe(**dict(feeds, u=RNG.standard_normal((3, 3)).astype("float32")))
    with pytest.raises(RuntimeCheckError, match=r"ScatterElements node 'e'.*L = 3"):
        exe(**dict(feeds, v=RNG.standard_normal((2, 3)).astype("float32")))
