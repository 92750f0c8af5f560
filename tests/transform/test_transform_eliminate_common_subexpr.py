"""EliminateCommonSubexpr: repeated pure computations in a block are bound once."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import assert_structural_equal
from kiln.transform import EliminateCommonSubexpr


def _t(*shape):
    return g.TensorStructInfo(shape, "float32")


def test_duplicate_calls_share_one_binding():
    x, y = g.Var("x", _t(4, 8)), g.Var("y", _t(4, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(op.add(x, y))
            b = bb.emit(op.add(x, y))
            c = bb.emit(op.exp(a))
            d = bb.emit(op.exp(b))  # equal to c once b is replaced by a
            gv = bb.emit_output(op.multiply(c, d))
        bb.emit_func_output(gv)
    mod = bb.get()
    after = EliminateCommonSubexpr()(mod)

    bb = g.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(op.add(x, y))
            c = bb.emit(op.exp(a))
            gv = bb.emit_output(op.multiply(c, c))
        bb.emit_func_output(gv)
    assert_structural_equal(after["main"], bb.get()["main"])
    rng = np.random.default_rng(1)
    xs, ys = (rng.standard_normal((4, 8)).astype("float32") for _ in range(2))
    np.testing.assert_array_equal(kiln.build(after)(xs, ys), kiln.build(mod)(xs, ys))


def test_different_attrs_or_argument_order_are_not_merged():
    x, y = g.Var("x", _t(4, 8)), g.Var("y", _t(4, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            bb.emit(op.sum(x, axis=0))
            bb.emit(op.sum(x, axis=1))
            bb.emit(op.sum(x, axis=1, keepdims=True))
            bb.emit(op.subtract(x, y))
            bb.emit(op.subtract(y, x))
            gv = bb.emit_output(op.add(x, y))
        bb.emit_func_output(gv)
    mod = bb.get()
    after = EliminateCommonSubexpr()(mod)
    assert after["main"] is mod["main"]


def test_block_output_duplicate_keeps_an_alias():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(op.exp(x))
            gv = bb.emit_output(op.exp(x))
            gv2 = bb.emit_output(op.add(lv, gv))
        bb.emit_func_output(gv2)
    after = EliminateCommonSubexpr()(bb.get())

    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            lv = bb.emit(op.exp(x))
            gv = bb.emit_output(lv)  # the DataflowVar must not escape: alias it
            gv2 = bb.emit_output(op.add(lv, gv))
        bb.emit_func_output(gv2)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_small_equal_constants_match_and_blocks_are_separate():
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.add(x, g.const(np.ones(4, "float32"))))
            b = bb.emit(op.add(x, g.const(np.ones(4, "float32"))))  # another, equal constant
            gv = bb.emit_output(op.multiply(a, b))
        c = bb.emit(op.add(x, g.const(np.ones(4, "float32"))))  # next block: not merged
        out = bb.emit(op.add(gv, c))
        bb.emit_func_output(out)
    after = EliminateCommonSubexpr()(bb.get())
    blocks = after["main"].body.blocks
    assert len(blocks[0].bindings) == 2
    assert blocks[0].bindings[1].value.args[0] is blocks[0].bindings[1].value.args[1]
    assert len(blocks[1].bindings) == 2


def test_if_branches_do_not_share():
    c = g.Var("c", g.TensorStructInfo((), "bool"))
    x = g.Var("x", _t(4))
    bb = g.BlockBuilder()
    with bb.function("main", [c, x]):
        e = bb.emit(op.exp(x))
        v = bb.emit(g.If(c, op.exp(x), op.exp(x)))
        bb.emit_func_output(bb.emit(op.add(e, v)))
    mod = bb.get()
    after = EliminateCommonSubexpr()(mod)
    assert after["main"] is mod["main"]
