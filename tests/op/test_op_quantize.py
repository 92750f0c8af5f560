"""qnn.quantize / qnn.dequantize / qnn.requantize on the CPU against their specification
(kiln/op/quantize.py) written out in numpy: rounding ties, saturation, per-channel and
per-tensor multipliers, the int64 product's extremes. (The NPU's instruction sequences:
tests/codegen/test_codegen_npu_quant.py.)"""

import numpy as np
import pytest

from kiln import graph as g
from kiln import op
from kiln.ir import KilnError
from kiln.testing.op_testing import infer, run_graph, tvar

RNG = np.random.default_rng(28)


def test_quantize_rounds_ties_to_even_and_saturates():
    x = (RNG.integers(-3000, 3000, (4, 33)) / 8).astype("float32")
    x.flat[:6] = [0.125, 0.375, -0.375, 0.625, 1e30, -np.inf]
    out = run_graph(lambda bb, v: op.qnn_quantize(v, 0.25), x)
    want = np.clip(np.rint(x * np.float32(4.0)), -128, 127).astype("int8")
    np.testing.assert_array_equal(out, want)
    assert list(out.flat[:6]) == [0, 2, -2, 2, 127, -128]
    # the product is rounded to float32 first: scale 0.1 multiplies by float32(10.0) exactly
    y = np.array([0.05, 0.15, 0.25, -0.35], "float32")
    want = np.rint((y * np.float32(1 / 0.1)).astype("float32")).astype("int8")
    np.testing.assert_array_equal(run_graph(lambda bb, v: op.qnn_quantize(v, 0.1), y), want)


@pytest.mark.parametrize("dtype", ["int8", "int32"])
def test_dequantize_is_one_float32_product(dtype):
    q = RNG.integers(-128 if dtype == "int8" else -2 ** 31, 127 if dtype == "int8" else 2 ** 31,
                     (3, 17)).astype(dtype)
    out = run_graph(lambda bb, v: op.qnn_dequantize(v, 0.037), q)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, q.astype("float32") * np.float32(0.037))


def _requantize(acc, bias, mult, shift, axis, lo, hi):
    shape = [1] * acc.ndim
    shape[axis] = -1
    a = np.clip(acc.astype(object) + bias.astype(object).reshape(shape), -2 ** 31, 2 ** 31 - 1)
    r = (a * mult.astype(object).reshape(shape) + (1 << (shift - 1))) >> shift
    return np.clip(r, lo, hi).astype("int8")


@pytest.mark.parametrize("shift,axis,lo,hi", [(31, 1, -128, 127), (45, 1, 0, 127),
                                              (62, 2, -5, 90), (1, 0, -128, 127)])
def test_requantize_matches_exact_integer_arithmetic(shift, axis, lo, hi):
    acc = RNG.integers(-2 ** 31, 2 ** 31, (3, 4, 5)).astype("int32")
    acc.flat[:3] = [2 ** 31 - 1, -2 ** 31, 0]
    n = acc.shape[axis]
    bias = RNG.integers(-2 ** 31, 2 ** 31, n).astype("int32")
    bias[0] = 2 ** 31 - 1  # acc + bias saturates
    mult = RNG.integers(1, 2 ** 31, n).astype("int32")
    mult[-1] = 2 ** 31 - 1
    out = run_graph(lambda bb, a, b, m: op.qnn_requantize(a, b, m, shift=shift, axis=axis,
                                                          out_min=lo, out_max=hi),
                    acc, bias, mult)
    np.testing.assert_array_equal(out, _requantize(acc, bias, mult, shift, axis, lo, hi))


def test_requantize_rounds_half_toward_plus_infinity():
    """a * m / 2**shift exactly halfway: +2.5 -> 3, -2.5 -> -2 (floor of x + 1/2)."""
    acc = np.array([5, -5, 3, -3, 1, -1], "int32")
    one = np.array([1], "int32")
    out = run_graph(lambda bb, a, b, m: op.qnn_requantize(a, b, m, shift=1, axis=0),
                    acc, np.zeros(1, "int32"), one)
    np.testing.assert_array_equal(out, [3, -2, 2, -1, 1, 0])


def test_struct_info_and_attribute_errors():
    acc = tvar("acc", (2, 3, 4), "int32")
    b3 = g.const(np.zeros(3, "int32"))
    assert str(infer(op.qnn_requantize(acc, b3, b3, shift=8)).dtype) == "int8"
    assert str(infer(op.qnn_quantize(tvar("x", (2,)), 0.5)).dtype) == "int8"
    assert str(infer(op.qnn_dequantize(tvar("q", (2,), "int8"), 0.5)).dtype) == "float32"
    with pytest.raises(KilnError, match="acc must be int32"):
        infer(op.qnn_requantize(tvar("f", (2, 3), "float32"), b3, b3, shift=8))
    with pytest.raises(KilnError, match="multiplier must be a 1-D int32"):
        infer(op.qnn_requantize(acc, b3, g.const(np.zeros((3, 1), "int32")), shift=8))
    with pytest.raises(KilnError, match="axis 3 out of range"):
        infer(op.qnn_requantize(acc, b3, b3, shift=8, axis=3))
    with pytest.raises(KilnError, match="x must be"):
        infer(op.qnn_quantize(tvar("i", (2,), "int32"), 0.5))
    with pytest.raises(KilnError, match="out_min <= out_max"):
        op.qnn_requantize(acc, b3, b3, shift=8, out_min=5, out_max=4)
    with pytest.raises(KilnError, match="scale must be positive"):
        op.qnn_dequantize(tvar("q", (2,), "int8"), float("inf"))
