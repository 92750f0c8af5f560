"""More element-wise operators: bitwise AND/OR/XOR (integer and bool), and the float corners of
``mod`` (numpy ``np.mod`` semantics with infinities, NaN, signed operands)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import StructInfoError
from kiln.op.registry import NON_DIFFERENTIABLE, OpPattern, get_op_def

INT_DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
BITWISE = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
           "bitwise_xor": np.bitwise_xor}


def _random(rng, dtype, shape):
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def test_declarations():
    for name in BITWISE:
        d = get_op_def(name)
        assert d.pattern == OpPattern.BROADCAST
        assert d.gradient is NON_DIFFERENTIABLE


def test_bitwise_inference_and_errors():
    bb = g.BlockBuilder()
    a = g.Var("a", g.TensorStructInfo((3, 1), "int16"))
    b = g.Var("b", g.TensorStructInfo((4,), "int16"))
    out = bb.normalize(op.bitwise_xor(a, b)).struct_info
    assert out.static_shape() == (3, 4) and out.dtype == "int16"
    f = g.Var("f", g.TensorStructInfo((4,), "float32"))
    with pytest.raises(StructInfoError, match="bitwise_and: lhs must be an integer or bool"):
        bb.normalize(op.bitwise_and(f, f))
    c = g.Var("c", g.TensorStructInfo((4,), "int32"))
    with pytest.raises(StructInfoError, match="bitwise_or"):
        bb.normalize(op.bitwise_or(b, c))


def test_bitwise_and_float_mod_numerics():
    """Every dtype and op in one module (one C compile), against numpy."""
    rng = np.random.default_rng(0)
    params, feeds, expected = [], [], []
    bb = g.BlockBuilder()
    outs = []
    with bb.function("main"):
        with bb.dataflow():
            for dtype in [*INT_DTYPES, "bool"]:
                x, y = _random(rng, dtype, (3, 9)), _random(rng, dtype, (9,))
                if dtype != "bool":
                    x[0, :3] = [np.iinfo(dtype).min, np.iinfo(dtype).max, 0]
                vx = g.Var(f"x_{dtype}", g.TensorStructInfo(x.shape, dtype))
                vy = g.Var(f"y_{dtype}", g.TensorStructInfo(y.shape, dtype))
                params += [vx, vy]
                feeds += [x, y]
                for name, ref in BITWISE.items():
                    outs.append(bb.emit_output(getattr(op, name)(vx, vy)))
                    expected.append((f"{name} {dtype}", ref(x, y)))
            for dtype in ("float32", "float64", "float16"):
                a = np.array([0.0, -0.0, 1.5, -2.5, -3.0, 3.0, np.inf, np.nan, 7.25, -7.25,
                              1e-7, 5.0], dtype)
                b = np.array([2.0, -2.0, np.inf, np.inf, -np.inf, -np.inf, 2.0, 1.0, -3.5,
                              3.5, -1.0, 0.0], dtype)
                va = g.Var(f"a_{dtype}", g.TensorStructInfo(a.shape, dtype))
                vb = g.Var(f"b_{dtype}", g.TensorStructInfo(b.shape, dtype))
                params += [va, vb]
                feeds += [a, b]
                outs.append(bb.emit_output(op.mod(va, vb)))
                with np.errstate(invalid="ignore"):
                    expected.append((f"mod {dtype}", np.mod(a, b)))
        bb.emit_func_output(g.Tuple(outs), params=params)
    got = kiln.build(bb.get())(*feeds)
    for out, (what, want) in zip(got, expected):
        assert out.dtype == want.dtype, what
        np.testing.assert_array_equal(out, want, err_msg=what)
