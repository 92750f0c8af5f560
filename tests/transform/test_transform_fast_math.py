"""FastMath: exp/tanh/erf/sigmoid calls are replaced by their fast_* forms (the ops' own
accuracy is tested in tests/op/test_op_fast_math.py)."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import KilnError, assert_structural_equal
from kiln.transform import FastMath


def _model(dtype="float32"):
    x = g.Var("x", g.TensorStructInfo((64,), dtype))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.exp(x))
            b = bb.emit(op.tanh(a))
            c = bb.emit(op.erf(b))
            d = bb.emit(op.sigmoid(c))
            out = bb.emit_output(op.sqrt(d))
        bb.emit_func_output(out)
    return bb.get(), x


def test_rewrite_replaces_the_four_ops():
    mod, x = _model()
    after = FastMath(ops=("exp", "tanh", "erf", "sigmoid"))(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.fast_exp(x))
            b = bb.emit(op.fast_tanh(a))
            c = bb.emit(op.fast_erf(b))
            d = bb.emit(op.fast_sigmoid(c))
            out = bb.emit_output(op.sqrt(d))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    data = np.random.default_rng(0).uniform(-3, 1, 64).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), kiln.build(mod)(data), atol=2e-6)


def test_default_ops_and_float64_untouched():
    mod, _ = _model()
    names = [b.value.op.name for b in FastMath()(mod)["main"].body.blocks[0].bindings]
    assert names == ["exp", "fast_tanh", "fast_erf", "fast_sigmoid", "sqrt"]
    mod64, _ = _model("float64")
    assert FastMath(ops=("exp", "tanh"))(mod64)["main"] is mod64["main"]
    with pytest.raises(KilnError, match="no fast form for \\['log'\\]"):
        FastMath(ops=["log"])
