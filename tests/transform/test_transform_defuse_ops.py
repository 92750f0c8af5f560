"""DefuseOps: fused calls become their member calls again (round trips through fusion)."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op, te
from kiln.ir import assert_structural_equal
from kiln.testing import models
from kiln.tir import PrimFunc
from kiln.transform import DefuseOps, FuseOps, FuseTIR, LegalizeOps, PassContext

T = g.TensorStructInfo


def test_round_trip_through_fuse_ops():
    legal = LegalizeOps()(models.resnet_block_cnn(batch=1, channels=4, size=8).mod)
    fused = FuseOps()(legal)
    assert any(f.attrs.get("Primitive") for f in fused.functions.values()
               if isinstance(f, g.Function))
    back = DefuseOps()(fused)
    assert_structural_equal(back["main"], legal["main"])
    assert sorted(back.functions) == sorted(legal.functions)


def test_round_trip_through_fuse_tir():
    legal = LegalizeOps()(models.mlp(batch=2, sizes=(16, 12, 8)).mod)
    fused = FuseTIR()(FuseOps()(legal))
    assert "dense" not in fused.functions  # member PrimFuncs left with FuseTIR
    back = DefuseOps()(fused)
    assert_structural_equal(back["main"], legal["main"])
    assert sorted(back.functions) == sorted(legal.functions)
    for name, func in legal.items():
        if isinstance(func, PrimFunc):
            assert_structural_equal(back[name], func)


def test_defuse_then_fuse_again_with_other_settings():
    legal = LegalizeOps()(models.mlp(batch=2, sizes=(16, 12, 8)).mod)
    fused = FuseTIR()(FuseOps()(legal))
    small = FuseOps(max_depth=2)(DefuseOps()(fused))
    names = [b.value.op.name for b in small["main"].body.blocks[0].bindings
             if isinstance(b.value.op, g.GlobalVar)]
    assert names == ["fused_dense_add", "fused_dense_add1"]


def test_multi_output_group_becomes_a_tuple():
    shape = (4, 8)
    a = te.placeholder(shape, "float32", name="A")
    double = te.create_prim_func([a, te.compute(shape, lambda i, j: a[i, j] * 2.0, name="d")])
    neg = te.create_prim_func([a, te.compute(shape, lambda i, j: -a[i, j], name="n")])
    bb = g.BlockBuilder()
    gd, gn = bb.add_func(double, "double"), bb.add_func(neg, "neg")
    p = g.Var("p", T(shape, "float32"))
    with bb.function("fused", [p], attrs={"Primitive": True}):
        with bb.dataflow():
            d = bb.emit_output(g.call_tir(gd, [p], T(shape, "float32")))
            n = bb.emit_output(g.call_tir(gn, [d], T(shape, "float32")))
        bb.emit_func_output([d, n])
    x = g.Var("x", T(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            tup = bb.emit(g.Call(g.GlobalVar("fused"), (x,)))
            r = bb.emit_output(op.subtract(bb.emit(g.TupleGetItem(tup, 0)),
                                           bb.emit(g.TupleGetItem(tup, 1))))
        bb.emit_func_output(r)
    mod = bb.get()
    back = DefuseOps()(mod)
    assert "fused" not in back.functions
    bindings = back["main"].body.blocks[0].bindings
    assert [g.is_call_tir(b.value) for b in bindings[:2]] == [True, True]
    assert isinstance(bindings[2].value, g.Tuple)
    xs = np.random.default_rng(0).standard_normal(shape).astype("float32")
    with PassContext(opt_level=0):
        got = kiln.build(back)(xs)
        again = kiln.build(FuseTIR()(mod))(xs)
    np.testing.assert_allclose(got, 4 * xs, rtol=1e-6)  # d - n = 2x - (-2x)
    np.testing.assert_array_equal(again, got)


def test_nothing_fused_is_a_copy():
    legal = LegalizeOps()(models.mlp(batch=2, sizes=(16, 8)).mod)
    out = DefuseOps()(legal)
    assert out is not legal
    assert all(out[k] is legal[k] for k in legal)
