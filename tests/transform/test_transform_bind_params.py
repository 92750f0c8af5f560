"""BindParams: parameters become constants, checked; symbolic dims are bound."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir import KilnError, assert_structural_equal
from kiln.transform import BindParams

RNG = np.random.default_rng(3)
W = RNG.standard_normal((16, 8)).astype("float32")
B = RNG.standard_normal((16,)).astype("float32")


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _linear(x, w, b):
    bb = g.BlockBuilder()
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(op.linear(x, w, b))
        bb.emit_func_output(out)
    return bb.get()


def test_bound_params_become_constants():
    x, w, b = g.Var("x", _t(4, 8)), g.Var("w", _t(16, 8)), g.Var("b", _t(16))
    after = BindParams("main", {"w": W, "b": B})(_linear(x, w, b))

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.linear(x, g.const(W), g.const(B)))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_var_keys_and_numerics():
    x, w, b = g.Var("x", _t(4, 8)), g.Var("w", _t(16, 8)), g.Var("b", _t(16))
    mod = _linear(x, w, b)
    after = BindParams("main", {w: W})(mod)
    assert [p.name_hint for p in after["main"].params] == ["x", "b"]
    data = RNG.standard_normal((4, 8)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data, B), kiln.build(mod)(data, W, B),
                               rtol=1e-6)
    # kiln.build(params=...) goes through the same pass
    np.testing.assert_allclose(kiln.build(mod, params={"w": W, "b": B})(data),
                               kiln.build(mod)(data, W, B), rtol=1e-6)


@pytest.mark.parametrize("params, match", [
    ({"weight": W}, r"no parameter named 'weight'.*\['x', 'w', 'b'\]"),
    ({"w": W[:8]}, r"'w' expects .*\(16, 8\).*dimension 0: 16 vs 8"),
    ({"w": W.astype("float64")}, r"'w' expects dtype float32 but the value has dtype float64"),
    ({"b": W}, r"'b' expects .* \(rank 1\) but the value has shape \(16, 8\)"),
])
def test_mismatches_name_the_parameter(params, match):
    x, w, b = g.Var("x", _t(4, 8)), g.Var("w", _t(16, 8)), g.Var("b", _t(16))
    with pytest.raises(KilnError, match=match):
        BindParams("main", params)(_linear(x, w, b))


def test_unknown_function():
    x, w, b = g.Var("x", _t(4, 8)), g.Var("w", _t(16, 8)), g.Var("b", _t(16))
    with pytest.raises(KilnError, match="no function named 'encoder'"):
        BindParams("encoder", {"w": W})(_linear(x, w, b))


def test_symbolic_dims_are_bound_everywhere():
    n = tir.Var("n", "int64")
    x, w = g.Var("x", _t(4, n)), g.Var("w", _t(16, n))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, w))
            r = bb.emit(op.reshape(x, (n * 4,)))
            out = bb.emit_output(op.add(op.sum(r), op.sum(d)))
        bb.emit_func_output(out)
    mod = bb.get()
    after = BindParams("main", {"w": W})(mod)

    x8 = g.Var("x", _t(4, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x8]):
        with bb.dataflow():
            d = bb.emit(op.dense(x8, g.const(W)))
            r = bb.emit(op.reshape(x8, (32,)))
            out = bb.emit_output(op.add(op.sum(r), op.sum(d)))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_conflicting_symbolic_sizes():
    n = tir.Var("n", "int64")
    a, b = g.Var("a", _t(n)), g.Var("b", _t(n))
    bb = g.BlockBuilder()
    with bb.function("main", [a, b]):
        bb.emit_func_output(bb.emit(op.add(a, b)))
    with pytest.raises(KilnError, match=r"'b' gives dimension n the size 3, but parameter 'a' "
                                        r"gave it 2"):
        BindParams("main", {"a": np.zeros(2, "float32"), "b": np.zeros(3, "float32")})(bb.get())
