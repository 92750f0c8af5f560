"""FoldConstant: calls of constants are evaluated (with kiln itself) at compile time."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import KilnError, assert_structural_equal
from kiln.transform import DeadCodeElimination, FoldConstant, LegalizeOps, PassContext
from kiln.transform.fold_constant import MAX_ELEMENTS_KEY


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


RNG = np.random.default_rng(7)
W = RNG.standard_normal((4, 8)).astype("float32")
B = RNG.standard_normal((8,)).astype("float32")


def _model():
    """main(x) = x @ exp(W.T + 1).T... with a constant subgraph feeding a dense."""
    x = g.Var("x", _t(2, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(op.exp(g.const(W)))                   # folded by kiln
            wt = bb.emit(op.transpose(w))                      # folded by numpy
            b = bb.emit(op.add(g.const(B), g.const(np.ones(8, "float32"))))
            h = bb.emit(op.add(x, b))                          # x: not constant
            out = bb.emit_output(op.matmul(h, wt))
        bb.emit_func_output(out)
    return bb.get(), x


def test_constant_subgraph_folds_to_expected_ir():
    mod, x = _model()
    after = FoldConstant()(mod)
    folded = [bnd.value.data for bnd in after["main"].body.blocks[0].bindings[:3]]
    # exp comes from kiln's compiled kernel (tolerance); numpy-evaluated ops are exact
    np.testing.assert_allclose(folded[0], np.exp(W), rtol=1e-6)
    np.testing.assert_array_equal(folded[1], folded[0].T)
    np.testing.assert_array_equal(folded[2], B + 1)

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            bb.emit(g.const(folded[0]))
            wt = bb.emit(g.const(folded[1]))
            b = bb.emit(g.const(folded[2]))
            h = bb.emit(op.add(x, b))
            out = bb.emit_output(op.matmul(h, wt))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_folded_model_computes_the_same():
    mod, _ = _model()
    after = DeadCodeElimination()(FoldConstant()(mod))
    data = RNG.standard_normal((2, 8)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), kiln.build(mod)(data), rtol=1e-6)
    assert kiln.build(after).num_kernels == 2  # add + matmul


def test_equal_folds_share_one_constant():
    """The same call on the same Constant (a weight transformed once per time step of an
    unrolled RNN) folds to one shared Constant; another call or constant gets its own."""
    x = g.Var("x", _t(2, 8))
    w, w2 = g.const(W), g.const(W.copy())
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            folds = [bb.emit(op.exp(w)), bb.emit(op.exp(w)), bb.emit(op.exp(w2)),
                     bb.emit(op.tanh(w))]
            h = x
            for f in folds:
                h = bb.emit(op.matmul(bb.emit(op.add(h, op.sum(f, axis=(0,)))),
                                      g.const(np.eye(8, dtype="float32"))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    mod = bb.get()
    after = FoldConstant()(mod)
    consts = [b.value for b in after["main"].body.blocks[0].bindings[:4]]
    assert all(isinstance(c, g.Constant) for c in consts)
    assert consts[0] is consts[1] and consts[2] is not consts[0] and consts[3] is not consts[0]
    np.testing.assert_allclose(consts[2].data, consts[0].data, rtol=1e-6)
    np.testing.assert_allclose(consts[3].data, np.tanh(W), rtol=1e-6)
    data = RNG.standard_normal((2, 8)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), kiln.build(mod)(data), rtol=1e-6)


def test_multi_output_and_tuple_get_item():
    x = g.Var("x", _t(2, 2))
    c = np.arange(8, dtype="float32").reshape(2, 4)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(op.split(g.const(c), 2, axis=1))
            second = bb.emit(g.TupleGetItem(parts, 1))
            out = bb.emit_output(op.add(x, second))
        bb.emit_func_output(out)
    after = FoldConstant()(bb.get())
    bindings = after["main"].body.blocks[0].bindings
    assert isinstance(bindings[0].value, g.Tuple)
    np.testing.assert_array_equal(bindings[1].value.data, c[:, 2:])


def test_non_constant_and_impure_calls_untouched():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        a = bb.emit(op.exp(x))
        bb.emit(g.Call(g.ExternFunc("rand_fill"), [g.const(np.ones(4, "float32"))],
                       sinfo_args=(_t(4),)))
        bb.emit_func_output(a)
    mod = bb.get()
    assert FoldConstant()(mod)["main"] is mod["main"]


def test_size_cap_from_pass_context():
    x = g.Var("x", _t(64, 64))
    big = np.arange(64 * 64, dtype="float32").reshape(64, 64)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            grown = bb.emit(op.broadcast_to(g.const(np.ones((1, 64), "float32")), (64, 64)))
            moved = bb.emit(op.transpose(g.const(big)))  # no growth: always folds
            out = bb.emit_output(op.add(op.add(x, grown), moved))
        bb.emit_func_output(out)
    mod = bb.get()
    with PassContext(config={MAX_ELEMENTS_KEY: 100}):
        capped = FoldConstant()(mod)
    kinds = [type(b.value).__name__ for b in capped["main"].body.blocks[0].bindings[:2]]
    assert kinds == ["Call", "Constant"]
    np.testing.assert_array_equal(capped["main"].body.blocks[0].bindings[1].value.data, big.T)
    default = FoldConstant()(mod)
    assert isinstance(default["main"].body.blocks[0].bindings[0].value, g.Constant)
    with pytest.raises(KilnError, match="expects int"):
        PassContext(config={MAX_ELEMENTS_KEY: "many"})


def test_call_tir_of_constants_folds():
    x = g.Var("x", _t(3))
    c = np.array([0.5, -1.0, 2.0], "float32")
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(op.sqrt(op.abs(g.const(c))))
            out = bb.emit_output(op.multiply(x, s))
        bb.emit_func_output(out)
    legal = LegalizeOps()(bb.get())
    after = FoldConstant()(legal)
    bindings = after["main"].body.blocks[0].bindings
    assert all(isinstance(b.value, g.Constant) for b in bindings[:2])
    np.testing.assert_allclose(bindings[1].value.data, np.sqrt(np.abs(c)), rtol=1e-6)
    data = np.array([1.0, 2.0, 3.0], "float32")
    np.testing.assert_allclose(kiln.build(after)(data), data * np.sqrt(np.abs(c)), rtol=1e-6)
