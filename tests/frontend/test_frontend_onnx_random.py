"""ONNX random generators (RandomUniform/Normal(+Like), Bernoulli, Multinomial, training-mode
Dropout) and BitCast through kiln: shapes and dtypes as ONNX says, distributions checked
statistically, seeds reproducible; BitCast against onnx.reference on every same-width pair."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir import KilnError
from kiln.testing.onnx_graphs import onnx_model, value_info

RNG = np.random.default_rng(5)


def _list(result):
    """A run's outputs as a list (a one-output model returns its array)."""
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _build(nodes, inputs, outputs, opset=22):
    model = onnx_model(nodes, inputs, outputs, opset=opset, ir_version=10)
    mod, _ = from_onnx(model)
    return kiln.build(mod), model


def test_random_uniform_and_normal_attributes():
    n = helper.make_node
    nodes = [n("RandomUniform", [], ["u"], shape=[300, 200], low=-1.0, high=2.0, seed=3.0),
             n("RandomNormal", [], ["z"], shape=[300, 200], mean=4.0, scale=0.5,
               dtype=TensorProto.DOUBLE),
             n("RandomUniformLike", ["x"], ["ul"], seed=1.0),
             n("RandomNormalLike", ["x"], ["zl"], dtype=TensorProto.FLOAT16)]
    outs = [value_info("u", [300, 200]), value_info("z", [300, 200], TensorProto.DOUBLE),
            value_info("ul", [40, 50]), value_info("zl", [40, 50], TensorProto.FLOAT16)]
    ex, _ = _build(nodes, [value_info("x", [40, 50])], outs)
    x = np.zeros((40, 50), np.float32)
    u, z, ul, zl = ex(x=x)
    assert (u.shape, u.dtype, z.dtype, ul.shape, zl.dtype) == (
        (300, 200), np.float32, np.float64, (40, 50), np.float16)
    assert u.min() >= -1.0 and u.max() < 2.0 and abs(u.mean() - 0.5) < 0.02
    assert abs(z.mean() - 4.0) < 0.01 and abs(z.std() - 0.5) < 0.01
    assert ul.min() >= 0.0 and ul.max() < 1.0
    assert abs(float(zl.astype(np.float64).std()) - 1.0) < 0.1
    u2, _, ul2, zl2 = ex(x=x)
    np.testing.assert_array_equal(u, u2)  # seeded: the same on every run
    np.testing.assert_array_equal(ul, ul2)
    assert np.mean(zl == zl2) < 0.2  # unseeded: a fresh draw (equal float16s are common-ish)


def test_bernoulli_node():
    p = np.tile(np.array([0.0, 0.25, 0.75, 1.0], np.float64), 20000)
    nodes = [helper.make_node("Bernoulli", ["p"], ["b"], dtype=TensorProto.INT32, seed=2.0)]
    ex, _ = _build(nodes, [value_info("p", [p.size], TensorProto.DOUBLE)],
                   [value_info("b", [p.size], TensorProto.INT32)])
    (b,) = _list(ex(p=p))
    assert b.dtype == np.int32
    freq = b.reshape(-1, 4).mean(axis=0)
    assert freq[0] == 0 and freq[3] == 1
    assert np.all(np.abs(freq[1:3] - [0.25, 0.75]) < 5 * math.sqrt(0.1875 / 20000))


def test_multinomial_counts():
    probs = np.array([[0.2, 0.5, 0.0, 0.3], [0.7, 0.1, 0.1, 0.1]], np.float32)
    logits = np.log(np.maximum(probs, 1e-30)) + 3.0  # unnormalized log-probabilities
    s = 40000
    nodes = [helper.make_node("Multinomial", ["x"], ["y"], sample_size=s, seed=5.0,
                              dtype=TensorProto.INT64)]
    ex, _ = _build(nodes, [value_info("x", [2, 4])],
                   [value_info("y", [2, s], TensorProto.INT64)])
    (y,) = _list(ex(x=logits))
    assert y.shape == (2, s) and y.dtype == np.int64
    for row in range(2):
        counts = np.bincount(y[row], minlength=4)
        sd = np.sqrt(s * probs[row] * (1 - probs[row]))
        assert np.all(np.abs(counts - s * probs[row]) <= 5 * sd + 1), counts
    assert (y[0] == 2).sum() == 0


@pytest.mark.parametrize("runtime_flag", [False, True])
def test_training_dropout(runtime_flag):
    """Kept elements are scaled by 1 / (1 - ratio), dropped ones are 0 and the mask says
    which; about ``ratio`` of them are dropped. With training_mode a run-time input, False
    gives the identity."""
    shape, ratio = (200, 300), 0.3
    x = RNG.uniform(1.0, 2.0, shape).astype(np.float32)
    r = helper.make_tensor("r", TensorProto.FLOAT, (), [ratio])
    inits = [r]
    inputs = [value_info("x", list(shape))]
    if runtime_flag:
        inputs.append(value_info("t", [], TensorProto.BOOL))
    else:
        inits.append(helper.make_tensor("t", TensorProto.BOOL, (), [True]))
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "m"], seed=4)
    model = onnx_model([node], inputs, [value_info("y", list(shape)),
                                        value_info("m", list(shape), TensorProto.BOOL)],
                       inits=inits, opset=13)
    mod, _ = from_onnx(model, bind_params=True)
    ex = kiln.build(mod)
    feeds = {"x": x, "t": np.array(True)} if runtime_flag else {"x": x}
    y, m = ex(**feeds)
    assert m.dtype == np.bool_ and y.shape == shape
    np.testing.assert_allclose(y[m], x[m] / (1 - ratio), rtol=1e-6)
    assert np.all(y[~m] == 0)
    assert abs((~m).mean() - ratio) < 5 * math.sqrt(ratio * (1 - ratio) / m.size)
    if runtime_flag:
        y, m = ex(x=x, t=np.array(False))
        np.testing.assert_array_equal(y, x)
        assert m.all()


def test_random_errors_name_the_node():
    n = helper.make_node("RandomUniform", [], ["u"], name="r0", shape=[3],
                         dtype=TensorProto.INT32)
    with pytest.raises(KilnError, match="RandomUniform node 'r0'.*float types only"):
        from_onnx(onnx_model([n], [], [value_info("u", [3], TensorProto.INT32)]))
    n = helper.make_node("Multinomial", ["x"], ["y"], name="m0", dtype=TensorProto.FLOAT)
    with pytest.raises(KilnError, match="Multinomial node 'm0'.*int32 or int64"):
        from_onnx(onnx_model([n], [value_info("x", [2, 3])], [value_info("y", [2, 1])]))


_BITCAST_PAIRS = [
    (TensorProto.FLOAT16, TensorProto.INT16), (TensorProto.UINT16, TensorProto.FLOAT16),
    (TensorProto.BFLOAT16, TensorProto.INT16), (TensorProto.FLOAT16, TensorProto.BFLOAT16),
    (TensorProto.FLOAT, TensorProto.UINT32), (TensorProto.UINT64, TensorProto.DOUBLE),
    (TensorProto.DOUBLE, TensorProto.INT64), (TensorProto.INT32, TensorProto.FLOAT),
]


@pytest.mark.parametrize("src,dst", _BITCAST_PAIRS)
def test_bitcast_pairs_match_the_reference(src, dst):
    from onnx import helper as h

    np_src = h.tensor_dtype_to_np_dtype(src)
    if src == TensorProto.BFLOAT16:
        np_src = np.dtype(ml_dtypes.bfloat16)
    bits = np.dtype(np_src).itemsize * 8
    raw = RNG.integers(0, 2**bits, (6, 9), dtype=np.uint64).astype(f"uint{bits}")
    x = raw.view(np_src)
    node = helper.make_node("BitCast", ["x"], ["y"], to=dst)
    model = onnx_model([node], [value_info("x", [6, 9], src)], [value_info("y", [6, 9], dst)],
                       opset=26, ir_version=13)
    mod, _ = from_onnx(model)
    (got,) = _list(kiln.build(mod)(x=x))
    want = x.view(ml_dtypes.bfloat16 if dst == TensorProto.BFLOAT16
                  else h.tensor_dtype_to_np_dtype(dst))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(raw.dtype), want.view(raw.dtype))
    if src not in (TensorProto.BFLOAT16,) and dst != TensorProto.BFLOAT16:
        (ref,) = ReferenceEvaluator(model).run(None, {"x": x})
        np.testing.assert_array_equal(got.view(raw.dtype), np.asarray(ref).view(raw.dtype))
