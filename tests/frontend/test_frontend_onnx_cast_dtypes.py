"""ONNX Cast/CastLike to and from float8, float4 and 2/4-bit integers, against onnx.reference.

Covers what the backend node cases do not: random values with out-of-range magnitudes and
special values under both ``saturate`` settings, e8m0's three ``round_mode`` values, constant
inputs (converted by kiln, not folded by numpy, so that ``saturate`` holds) and CastLike.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from kiln.frontend.onnx.backend import KilnBackend

RNG = np.random.default_rng(0)
F8 = {"FLOAT8E4M3FN": ml_dtypes.float8_e4m3fn, "FLOAT8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz,
      "FLOAT8E5M2": ml_dtypes.float8_e5m2, "FLOAT8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz}
OPSET = 25


def _values(n: int = 300) -> np.ndarray:
    mags = np.float32(2.0) ** RNG.integers(-20, 20, n).astype(np.float32)
    x = RNG.standard_normal(n).astype(np.float32) * mags
    return np.concatenate([x, np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e6, -1e6,
                                          448, 464, 465, 57344, 61440, 0.25, 2.5])])


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "cast", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def _run_both(model: onnx.ModelProto, *inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    feeds = {i.name: v for i, v in zip(model.graph.input, inputs)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    got = KilnBackend.prepare(model).run(list(inputs))[0]
    return got, want


def _assert_same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    gb, wb = got.view(np.uint8), want.view(np.uint8)
    # NaN patterns: both must be NaN, the payload does not matter (onnx.reference's vary).
    gnan = np.isnan(got.astype(np.float32))
    same = (gb == wb) | (gnan & np.isnan(want.astype(np.float32)))
    assert same.all(), f"{np.flatnonzero(~same)[:5]}: {gb[~same][:5]} vs {wb[~same][:5]}"


def _cast_model(src: int, dst: int, shape, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Cast", ["x"], ["y"], to=dst, **attrs)
    return _model([node], [helper.make_tensor_value_info("x", src, shape)],
                  [helper.make_tensor_value_info("y", dst, shape)])


@pytest.mark.parametrize("saturate", [0, 1])
@pytest.mark.parametrize("to", sorted(F8))
def test_cast_float_to_float8(to, saturate):
    x = _values()
    model = _cast_model(TensorProto.FLOAT, getattr(TensorProto, to), x.shape, saturate=saturate)
    _assert_same_bits(*_run_both(model, x))


@pytest.mark.parametrize("frm", sorted(F8))
def test_cast_float8_to_float16(frm):
    x = np.arange(256, dtype=np.uint8).view(F8[frm])
    model = _cast_model(getattr(TensorProto, frm), TensorProto.FLOAT16, x.shape)
    got, want = _run_both(model, x)
    np.testing.assert_array_equal(got, want)


def test_cast_float16_to_float4_and_back():
    with np.errstate(over="ignore"):
        x = _values().astype(np.float16)
    to4 = _cast_model(TensorProto.FLOAT16, TensorProto.FLOAT4E2M1, x.shape)
    got, want = _run_both(to4, x)
    # float4 has no NaN: NaN -> a zero, Inf and overflow -> +-6, bit for bit
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    back = _cast_model(TensorProto.FLOAT4E2M1, TensorProto.FLOAT, (16,))
    pats = np.arange(16, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn)
    got, want = _run_both(back, pats)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["INT4", "UINT4", "INT2", "UINT2"])
def test_cast_subbyte_ints(name):
    t = getattr(ml_dtypes, name.lower())
    x = RNG.integers(-40, 40, 101).astype(np.float32)
    to = _cast_model(TensorProto.FLOAT, getattr(TensorProto, name), x.shape)
    got, want = _run_both(to, x)
    _assert_same_bits(got, want)
    info = ml_dtypes.iinfo(t)
    v = RNG.integers(int(info.min), int(info.max) + 1, 101).astype(t)
    back = _cast_model(getattr(TensorProto, name), TensorProto.INT32, v.shape)
    got, want = _run_both(back, v)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_cast_to_e8m0_round_modes(mode):
    mags = np.float32(2.0) ** RNG.integers(-120, 120, 300).astype(np.float32)
    x = np.concatenate([RNG.uniform(-2, 2, 300).astype(np.float32) * mags,
                        np.float32([0.0, 1.0, 0.75, 3.0, np.inf, np.nan])])
    model = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E8M0, x.shape, saturate=1,
                        round_mode=mode)
    _assert_same_bits(*_run_both(model, x))


def test_cast_of_a_constant_saturates():
    """A Cast of an initializer must not be folded by numpy (ml_dtypes does not saturate)."""
    c = np.float32([1000.0, -1e9, np.inf, 3.0, 0.1])
    init = numpy_helper.from_array(c, "c")
    node = helper.make_node("Cast", ["c"], ["y0"], to=TensorProto.FLOAT8E4M3FN, saturate=1)
    add = helper.make_node("Add", ["y0", "x"], ["y"])
    model = _model([node, add],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT8E4M3FN, (5,))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, (5,))],
                   [init])
    x = np.zeros(5, ml_dtypes.float8_e4m3fn)
    got, want = _run_both(model, x)
    _assert_same_bits(got, want)
    assert float(got[0]) == 448.0 and float(got[2]) == 448.0


@pytest.mark.parametrize("saturate", [0, 1])
def test_castlike_to_float8(saturate):
    x = _values()
    like = np.zeros(1, ml_dtypes.float8_e5m2)
    node = helper.make_node("CastLike", ["x", "t"], ["y"], saturate=saturate)
    model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                            helper.make_tensor_value_info("t", TensorProto.FLOAT8E5M2, (1,))],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT8E5M2, x.shape)])
    _assert_same_bits(*_run_both(model, x, like))


def test_bad_saturate_names_the_node():
    model = _cast_model(TensorProto.FLOAT, TensorProto.FLOAT8E4M3FN, (3,), saturate=2)
    model.graph.node[0].name = "my_cast"
    with pytest.raises(Exception, match="my_cast.*saturate"):
        KilnBackend.prepare(model)
