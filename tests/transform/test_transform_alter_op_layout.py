"""AlterOpLayout: conv2d becomes nn.conv2d_nchwc on CPUs through its declared alter_layout hook,
consecutive convolutions stay in NCHW[x]c, element-wise ops follow, numerics unchanged."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir import assert_structural_equal
from kiln.op.layout import transform_array
from kiln.op.registry import get_op_def
from kiln.target import Target
from kiln.testing import models
from kiln.transform import (
    AlterOpLayout,
    FoldConstant,
    PassContext,
    Sequential,
    SimplifyInference,
)

RNG = np.random.default_rng(5)
TARGET = Target("c")
L = TARGET.vector_lanes("float32")


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _same_numerics(before, after, *inputs, rtol=1e-5):
    ref = kiln.build(before)(*inputs)
    out = kiln.build(after)(*inputs)
    scale = max(float(np.max(np.abs(ref))), 1.0)
    np.testing.assert_allclose(out, ref, rtol=rtol, atol=rtol * scale)


def _ops(func):
    return [b.value.op.name for blk in func.body.blocks for b in blk.bindings
            if isinstance(b.value, g.Call)]


W1, W2 = _rand(2 * L, 3, 3, 3), _rand(L, 2 * L, 3, 3)
BIAS = _rand(2 * L, 1, 1)


def _two_convs(w1=W1):
    x = g.Var("x", _t(1, 3, 8, 8))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(w1), padding=1))
            h = bb.emit(op.add(h, g.const(BIAS)))
            h = bb.emit(op.nn.relu(h))
            out = bb.emit_output(op.nn.conv2d(h, g.const(W2), padding=1))
        bb.emit_func_output(out)
    return bb.get(), x


def test_hook_is_declared_with_the_op():
    assert "c" in get_op_def("nn.conv2d").alter_layout
    assert get_op_def("relu").alter_layout == {}


def test_consecutive_convs_stay_blocked():
    mod, x = _two_convs()
    after = AlterOpLayout(TARGET)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", "NCHW3c"))
            w1 = transform_array(W1, "OIHW", f"OIHW3i{L}o")
            h = bb.emit(op.nn.conv2d_nchwc(t, g.const(w1), padding=1))
            h = bb.emit(op.add(h, g.const(transform_array(BIAS, "NCHW", f"NCHW{L}c"))))
            h = bb.emit(op.nn.relu(h))
            w2 = transform_array(W2, "OIHW", f"OIHW{L}i{L}o")
            h = bb.emit(op.nn.conv2d_nchwc(h, g.const(w2), padding=1))
            out = bb.emit_output(op.layout_transform(h, f"NCHW{L}c", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    assert transform_array(W1, "OIHW", f"OIHW3i{L}o").shape == (2, 1, 3, 3, 3, L)
    _same_numerics(mod, after, _rand(1, 3, 8, 8))
    # idempotent: the second run finds nothing to change
    assert_structural_equal(AlterOpLayout(TARGET)(after)["main"], after["main"])


def test_declined_convs_are_left_alone():
    x = g.Var("x", _t(1, 4, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.nn.conv2d(x, g.const(_rand(L + 1, 4, 3, 3))))       # channels
            b = bb.emit(op.nn.conv2d(x, g.const(_rand(4, 1, 3, 3)), groups=4))  # groups
            c = bb.emit(op.nn.conv2d(op.cast(x, "float16"),
                                     g.const(_rand(L, 4, 3, 3).astype("float16"))))
            out = bb.emit_output(g.Tuple((a, b, c)))
        bb.emit_func_output(out)
    mod = bb.get()
    assert_structural_equal(AlterOpLayout(TARGET)(mod)["main"], mod["main"])


def test_weight_parameter_gets_a_runtime_transform():
    x = g.Var("x", _t(1, 3, 8, 8))
    w = g.Var("w", _t(L, 3, 3, 3))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.conv2d(x, w))
        bb.emit_func_output(out)
    mod = bb.get()
    after = AlterOpLayout(TARGET)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", "NCHW3c"))
            wt = bb.emit(op.layout_transform(w, "OIHW", f"OIHW3i{L}o"))
            c = bb.emit(op.nn.conv2d_nchwc(t, wt))
            out = bb.emit_output(op.layout_transform(c, f"NCHW{L}c", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(1, 3, 8, 8), _rand(L, 3, 3, 3))


def test_block_size_follows_the_target(monkeypatch):
    monkeypatch.delenv("KILN_VECTOR_BITS", raising=False)  # the override would win
    wide = Target("c", features=frozenset({"avx512f"}))
    assert wide.vector_lanes("float32") == 16
    x = g.Var("x", _t(1, 16, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.conv2d(x, g.const(_rand(32, 16, 1, 1))))
        bb.emit_func_output(out)
    mod = bb.get()
    after = AlterOpLayout(wide)(mod)
    conv = after["main"].body.blocks[0].bindings[1].value
    assert conv.op.name == "nn.conv2d_nchwc"
    assert [int(d) for d in conv.args[1].struct_info.static_shape()] == [2, 1, 1, 1, 16, 16]
    _same_numerics(mod, after, _rand(1, 16, 6, 6))


def test_small_cnn_through_alter_op_layout():
    model = models.small_cnn(batch=2, channels=L, size=8, seed=2)
    ref = model.reference(*model.inputs)
    # alone: batch_norm cannot follow blocked channels, so NCHW comes back around it
    alone = AlterOpLayout(TARGET)(model.mod)
    assert _ops(alone["main"]).count("nn.conv2d_nchwc") == 2
    out = kiln.build(alone)(*model.inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
    # after SimplifyInference the batch norm is a per-channel multiply-add that follows:
    # only the input and the reshape see a layout_transform
    with PassContext(opt_level=3):
        seq = Sequential([SimplifyInference(), FoldConstant(), AlterOpLayout(TARGET)])(model.mod)
    names = _ops(seq["main"])
    assert names.count("layout_transform") == 2 and "nn.conv2d" not in names
    out = kiln.build(seq)(*model.inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_symbolic_batch():
    n = tir.Var("n", "int64")
    x = g.Var("x", _t(n, 4, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(_rand(L, 4, 3, 3)), padding=1))
            out = bb.emit_output(op.nn.relu(h))
        bb.emit_func_output(out)
    mod = bb.get()
    after = AlterOpLayout(TARGET)(mod)
    assert _ops(after["main"]) == ["layout_transform", "nn.conv2d_nchwc", "relu",
                                   "layout_transform"]
    assert after["main"].body.blocks[0].bindings[1].var.struct_info.shape[0] is n
    _same_numerics(mod, after, _rand(3, 4, 6, 6))
