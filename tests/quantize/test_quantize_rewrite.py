"""calibrate and QuantizeGraph: the ranges recorded, the layers the rewrite forms, the errors.
(Model-level bit-exactness on the CPU and NPU: tests/codegen/test_codegen_npu_quant.py.)"""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import KilnError
from kiln.quantize import QuantizationError, QuantizeGraph, calibrate, quantize_model
from kiln.testing import models
from kiln.testing.quant_reference import run_quantized_graph


def _ops(mod):
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, g.Call)]


def _samples(shape, n=3):
    rng = np.random.default_rng(5)
    return [rng.standard_normal(shape).astype("float32") for _ in range(n)]


def test_calibration_records_each_tensors_range():
    m = models.mlp(batch=2, sizes=(16, 8, 4))
    samples = _samples((2, 16))
    calib = calibrate(m.mod, None, samples)
    x = calib.mod["main"].params[0]
    r = calib.ranges[x]
    assert r.lo == min(float(s.min()) for s in samples)
    assert r.hi == max(float(s.max()) for s in samples)
    assert r.absmax == max(abs(r.lo), abs(r.hi)) and r.scale == r.absmax / 127
    # every float32 tensor of the prepared graph has a range; the softmax's is within [0, 1]
    out = calib.mod["main"].body.body
    assert 0 <= calib.ranges[out].lo <= calib.ranges[out].hi <= 1
    pct = calibrate(m.mod, None, samples, method="percentile", percentile=50.0)
    px = pct.ranges[pct.mod["main"].params[0]]
    want = np.percentile(np.abs(np.concatenate([s.ravel() for s in samples])), 50.0)
    assert px.absmax == pytest.approx(want) and px.absmax < r.absmax


def test_conv_batch_norm_relu_becomes_one_int8_layer():
    """small_cnn: conv + folded batch norm (multiply, add) + relu is one int8 conv and one
    requantize with out_min=0; the global average pool is an int32 sum."""
    m = models.small_cnn(batch=1, channels=4, size=8)
    qmod = quantize_model(m.mod, None, _samples((1, 3, 8, 8)))
    ops = _ops(qmod)
    assert ops.count("nn.conv2d") == 2 and "multiply" not in ops and "add" not in ops
    assert "relu" not in ops and "sum" in ops and "mean" not in ops
    req = [b.value for blk in qmod["main"].body.blocks for b in blk.bindings
           if isinstance(b.value, g.Call) and b.value.op.name == "qnn.requantize"]
    assert [r.attrs.out_min for r in req[:2]] == [0, 0]
    convs = [b.var for blk in qmod["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, g.Call) and b.value.op.name == "nn.conv2d"]
    assert all(str(v.struct_info.dtype) == "int32" for v in convs)


def test_relu6_clamp_folds_into_the_requantization():
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((2, 8), "float32"))
    w = np.random.default_rng(2).standard_normal((4, 8)).astype("float32")
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.dense(x, g.const(w)))
            y = bb.emit(op.maximum(y, g.const(np.float32(0))))
            y = bb.emit_output(op.minimum(y, g.const(np.float32(6))))
        bb.emit_func_output(y)
    samples = [np.random.default_rng(3).standard_normal((2, 8)).astype("float32") * 4]
    qmod = quantize_model(bb.get(), None, samples)
    # (the graph passes canonicalize dense with a constant weight to matmul)
    assert _ops(qmod) == ["qnn.quantize", "matmul", "qnn.requantize", "qnn.dequantize"]
    req = [b.value for b in qmod["main"].body.blocks[0].bindings
           if isinstance(b.value, g.Call) and b.value.op.name == "qnn.requantize"][0]
    scale = calibrate(bb.get(), None, samples).ranges
    assert req.attrs.out_min == 0 and req.attrs.out_max <= 127
    out = run_quantized_graph(qmod, samples[0])
    assert out.min() >= 0 and out.max() <= 6 + max(r.scale for r in scale.values())
    np.testing.assert_array_equal(kiln.build(qmod, target="c")(samples[0]), out)


def test_skip_ops_keeps_layers_in_float():
    m = models.mlp(batch=2, sizes=(16, 8, 4))
    calib = calibrate(m.mod, None, _samples((2, 16)))
    qmod = QuantizeGraph(calib, skip_ops=["dense", "matmul"])(calib.mod)
    assert not any(o.startswith("qnn.") for o in _ops(qmod))


def test_errors_name_the_problem():
    m = models.mlp(batch=2, sizes=(16, 4))
    with pytest.raises(QuantizationError, match="unknown calibration method 'kl'"):
        calibrate(m.mod, None, _samples((2, 16)), method="kl")
    with pytest.raises(QuantizationError, match="at least one sample"):
        calibrate(m.mod, None, [])
    with pytest.raises(QuantizationError, match="percentile"):
        calibrate(m.mod, None, _samples((2, 16)), method="percentile", percentile=0)
    calib = calibrate(m.mod, None, _samples((2, 16)))
    with pytest.raises(QuantizationError, match="no calibration range"):
        other = models.mlp(batch=2, sizes=(16, 4)).mod  # the same model, other variables
        QuantizeGraph(calib)(other)
    with pytest.raises(KilnError, match="shift must be in 1..62"):
        op.qnn_requantize(g.const(np.zeros(2, "int32")), g.const(np.zeros(1, "int32")),
                          g.const(np.ones(1, "int32")), shift=0, axis=0)
    with pytest.raises(KilnError, match="scale must be positive"):
        op.qnn_quantize(g.const(np.zeros(2, "float32")), 0.0)
    a = g.Var("a", g.TensorStructInfo((2, 3), "int32"))
    with pytest.raises(KilnError, match="bias has 4 elements"):
        g.BlockBuilder().normalize(op.qnn_requantize(a, g.const(np.zeros(4, "int32")),
                                                     g.const(np.ones(3, "int32")),
                                                     shift=8, axis=1))
