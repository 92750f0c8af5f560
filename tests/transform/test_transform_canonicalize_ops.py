"""CanonicalizeOps: explicit axes, matmul-of-transpose -> dense, x*sigmoid(x) -> silu,
power(x, 2) -> x*x, split pieces -> strided_slice."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import assert_structural_equal
from kiln.transform import CanonicalizeOps, DeadCodeElimination, EliminateCommonSubexpr

RNG = np.random.default_rng(5)


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _single(x, call):
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(call)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("before, after", [
    (lambda x: op.sum(x, axis=-1), lambda x: op.sum(x, axis=(2,))),
    (lambda x: op.mean(x, axis=(-1, 0), keepdims=True),
     lambda x: op.mean(x, axis=(0, 2), keepdims=True)),
    (lambda x: op.max(x, axis=(0, 1, -1)), lambda x: op.max(x)),
    (lambda x: op.argmax(x, axis=-2), lambda x: op.argmax(x, axis=1)),
    (lambda x: op.transpose(x), lambda x: op.transpose(x, (2, 1, 0))),
    (lambda x: op.transpose(x, (0, -1, 1)), lambda x: op.transpose(x, (0, 2, 1))),
    (lambda x: op.nn.softmax(x), lambda x: op.nn.softmax(x, axis=2)),
    (lambda x: op.concat([x, x], axis=-1), lambda x: op.concat([x, x], axis=2)),
    (lambda x: op.squeeze(x), lambda x: op.squeeze(x, (1,))),
    (lambda x: op.expand_dims(x, -1), lambda x: op.expand_dims(x, (3,))),
    (lambda x: op.split(x, 2, axis=-1), lambda x: op.split(x, 2, axis=2)),
])
def test_axes_become_explicit_and_non_negative(before, after):
    x = g.Var("x", _t(2, 1, 4))
    got = CanonicalizeOps()(_single(x, before(x)))
    assert_structural_equal(got["main"], _single(x, after(x))["main"])


def test_canonical_calls_are_left_alone():
    x = g.Var("x", _t(2, 1, 4))
    mod = _single(x, op.sum(x, axis=(0, 2)))
    assert CanonicalizeOps()(mod)["main"] is mod["main"]


def test_equivalent_spellings_merge_under_cse():
    x = g.Var("x", _t(3, 5))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.sum(x, axis=-1))
            b = bb.emit(op.sum(x, axis=1))
            out = bb.emit_output(op.add(a, b))
        bb.emit_func_output(out)
    after = EliminateCommonSubexpr()(CanonicalizeOps()(bb.get()))
    assert len(after["main"].body.blocks[0].bindings) == 2


def test_matmul_of_transposed_weight_becomes_dense():
    x, w = g.Var("x", _t(2, 3, 8)), g.Var("w", _t(16, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            wt = bb.emit(op.transpose(w))
            out = bb.emit_output(op.matmul(x, wt))
        bb.emit_func_output(out)
    mod = bb.get()
    after = DeadCodeElimination()(CanonicalizeOps()(mod))

    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.dense(x, w))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    xs = RNG.standard_normal((2, 3, 8)).astype("float32")
    ws = RNG.standard_normal((16, 8)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(xs, ws), kiln.build(mod)(xs, ws), rtol=1e-5,
                               atol=1e-5)


def test_constant_weights_become_matmul_with_the_weight_transposed_at_compile_time():
    """dense(x, W) and matmul(x, transpose(W)) with a constant W -> matmul(x, W.T)."""
    x = g.Var("x", _t(3, 8))
    w = RNG.standard_normal((16, 8)).astype("float32")
    for spell in ("dense", "matmul_transpose"):
        bb = g.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                if spell == "dense":
                    out = bb.emit_output(op.dense(x, g.const(w)))
                else:
                    wt = bb.emit(op.transpose(g.const(w)))
                    out = bb.emit_output(op.matmul(x, wt))
            bb.emit_func_output(out)
        mod = bb.get()
        after = DeadCodeElimination()(CanonicalizeOps()(mod))
        bb = g.BlockBuilder()
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(op.matmul(x, g.const(np.ascontiguousarray(w.T))))
            bb.emit_func_output(out)
        assert_structural_equal(after["main"], bb.get()["main"])
        xs = RNG.standard_normal((3, 8)).astype("float32")
        np.testing.assert_allclose(kiln.build(after)(xs), xs @ w.T, rtol=1e-5, atol=1e-5)


def test_products_with_one_constant_weight_share_its_transpose():
    """Every time step of an unrolled RNN multiplies by the same weight (torch transposes it
    per step): all the products read one transposed Constant, not a copy each."""
    x = g.Var("x", _t(1, 8))
    w = g.const(RNG.standard_normal((16, 8)).astype("float32"))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = x
            for _ in range(3):
                h = bb.emit(op.tanh(op.sum(op.reshape(op.matmul(h, bb.emit(op.transpose(w))),
                                                      (1, 2, 8)), axis=(1,))))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    mod = bb.get()
    after = DeadCodeElimination()(CanonicalizeOps()(mod))
    weights = {id(b.value.args[1]) for blk in after["main"].body.blocks for b in blk.bindings
               if isinstance(b.value, g.Call) and b.value.op.name == "matmul"}
    assert len(weights) == 1
    xs = RNG.standard_normal((1, 8)).astype("float32")
    wt = w.data.T
    ref = xs
    for _ in range(3):
        ref = np.tanh((ref @ wt).reshape(1, 2, 8).sum(1))
    np.testing.assert_allclose(kiln.build(after)(xs), ref, rtol=1e-5, atol=1e-5)


def test_matmul_of_other_transposes_is_kept():
    x, w = g.Var("x", _t(2, 4, 8)), g.Var("w", _t(2, 4, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            wt = bb.emit(op.transpose(w, (0, 2, 1)))  # batched: not a dense weight
            out = bb.emit_output(op.matmul(x, wt))
        bb.emit_func_output(out)
    mod = bb.get()
    assert [b.value.op.name for b in CanonicalizeOps()(mod)["main"].body.blocks[0].bindings] \
        == ["transpose", "matmul"]


def test_silu_and_square():
    x = g.Var("x", _t(4, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            s = bb.emit(op.sigmoid(x))
            a = bb.emit(op.multiply(s, x))
            p = bb.emit(op.power(a, g.const(np.full((6,), 2.0, "float32"))))
            out = bb.emit_output(op.power(p, g.const(np.full((6,), 3.0, "float32"))))
        bb.emit_func_output(out)
    mod = bb.get()
    after = DeadCodeElimination()(CanonicalizeOps()(mod))

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.silu(x))
            p = bb.emit(op.multiply(a, a))
            out = bb.emit_output(op.power(p, g.const(np.full((6,), 3.0, "float32"))))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    data = RNG.standard_normal((4, 6)).astype("float32")
    np.testing.assert_allclose(kiln.build(after)(data), kiln.build(mod)(data), rtol=1e-5)


def test_square_of_integers_is_kept():
    x = g.Var("x", _t(4, dtype="int32"))
    mod = _single(x, op.power(x, g.const(np.full((4,), 2, "int32"))))
    assert CanonicalizeOps()(mod)["main"] is mod["main"]


def test_split_pieces_become_slices_that_fuse_into_their_consumers():
    x = g.Var("x", _t(4, 12))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            parts = bb.emit(op.split(x, (3, 7), axis=-1))
            a = bb.emit(op.nn.relu(g.TupleGetItem(parts, 0)))
            b = bb.emit(op.exp(g.TupleGetItem(parts, 1)))
            c = bb.emit(op.negative(g.TupleGetItem(parts, 2)))
            out = bb.emit_output(op.concat([a, b, c], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    got = DeadCodeElimination()(CanonicalizeOps()(mod))
    names = [b.value.op.name for blk in got["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, g.Call)]
    assert "split" not in names and names.count("strided_slice") == 3
    xv = RNG.standard_normal((4, 12)).astype("float32")
    ref = np.concatenate([np.maximum(xv[:, :3], 0), np.exp(xv[:, 3:7]), -xv[:, 7:]], axis=1)
    np.testing.assert_allclose(kiln.build(mod)(xv), ref, rtol=1e-6)


def test_split_used_as_a_tuple_is_kept():
    x = g.Var("x", _t(4, 12))
    got = CanonicalizeOps()(_single(x, op.split(x, 3, axis=1)))
    names = [b.value.op.name for blk in got["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, g.Call)]
    assert names == ["split"]
