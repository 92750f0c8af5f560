"""CombineParallelDense / CombineParallelConv2D: parallel branches on one input become one op on
concatenated weights and a split; shared element-wise followers are combined too."""

import numpy as np

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import assert_structural_equal
from kiln.transform import CombineParallelConv2D, CombineParallelDense, PassContext, Sequential

RNG = np.random.default_rng(3)


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _same_numerics(before, after, *inputs, rtol=1e-5):
    ref = kiln.build(before)(*inputs)
    out = kiln.build(after)(*inputs)
    refs, outs = (ref, out) if isinstance(ref, (list, tuple)) else ([ref], [out])
    for r, o in zip(refs, outs):
        scale = max(float(np.max(np.abs(r))), 1.0)
        np.testing.assert_allclose(o, r, rtol=rtol, atol=rtol * scale)


def _unchanged(p, mod):
    assert_structural_equal(p(mod)["main"], mod["main"])


# ---- dense ---------------------------------------------------------------------------------
UNITS = (8, 12, 4)
WS = [_rand(u, 16) for u in UNITS]
BS = [_rand(u) for u in UNITS]


def test_dense_branches_with_bias_and_relu_combine():
    x = g.Var("x", _t(4, 16))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for w, b in zip(WS, BS):
                d = bb.emit(op.dense(x, g.const(w)))
                a = bb.emit(op.add(d, g.const(b)))
                outs.append(bb.emit(op.nn.relu(a)))
            out = bb.emit_output(op.concat(outs[::-1], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    after = CombineParallelDense()(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, g.const(np.concatenate(WS, axis=0))))
            a = bb.emit(op.add(d, g.const(np.concatenate(BS))))
            r = bb.emit(op.nn.relu(a))
            parts = bb.emit(op.split(r, (8, 20), axis=1))
            outs = [bb.emit(g.TupleGetItem(parts, k)) for k in range(3)]
            out = bb.emit_output(op.concat(outs[::-1], axis=1))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(4, 16))


def test_matmul_branches_with_constant_weights_combine_along_units():
    """matmul(x, W) with 2-d [in, units] weights (the canonical form of constant weights)."""
    x = g.Var("x", _t(2, 4, 16))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = [bb.emit(op.add(bb.emit(op.matmul(x, g.const(w.T.copy()))), g.const(b)))
                    for w, b in zip(WS, BS)]
            out = bb.emit_output(g.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    after = CombineParallelDense()(mod)
    names = [b.value.op.name for b in after["main"].body.blocks[0].bindings
             if isinstance(b.value, g.Call) and hasattr(b.value.op, "name")]
    assert names.count("matmul") == 1 and names.count("add") == 1
    _same_numerics(mod, after, _rand(2, 4, 16))


def test_dense_followers_that_differ_stay_per_branch():
    """Only the dense ops combine when the branches' followers differ; a scalar constant that
    is the same in every branch combines (shared, not concatenated)."""
    x = g.Var("x", _t(2, 16))
    half = np.float32(0.5)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            d0 = bb.emit(op.dense(x, g.const(WS[0])))
            m0 = bb.emit(op.multiply(d0, g.const(half)))
            r0 = bb.emit(op.nn.relu(m0))
            d1 = bb.emit(op.dense(x, g.const(WS[1])))
            m1 = bb.emit(op.multiply(d1, g.const(half)))
            t1 = bb.emit(op.tanh(m1))
            out = bb.emit_output(g.Tuple((r0, t1)))
        bb.emit_func_output(out)
    mod = bb.get()
    after = CombineParallelDense()(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            d = bb.emit(op.dense(x, g.const(np.concatenate(WS[:2], axis=0))))
            m = bb.emit(op.multiply(d, g.const(half)))
            parts = bb.emit(op.split(m, (8,), axis=1))
            m0 = bb.emit(g.TupleGetItem(parts, 0))
            m1 = bb.emit(g.TupleGetItem(parts, 1))
            r0 = bb.emit(op.nn.relu(m0))
            t1 = bb.emit(op.tanh(m1))
            out = bb.emit_output(g.Tuple((r0, t1)))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(2, 16))


def test_dense_weight_parameters_are_concatenated_at_run_time():
    x, w0, w1 = g.Var("x", _t(3, 16)), g.Var("w0", _t(8, 16)), g.Var("w1", _t(4, 16))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w0, w1]):
        with bb.dataflow():
            a = bb.emit_output(op.dense(x, w0))
            b = bb.emit_output(op.dense(x, w1))
        bb.emit_func_output(g.Tuple((a, b)))
    mod = bb.get()
    after = CombineParallelDense()(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x, w0, w1]):
        with bb.dataflow():
            w = bb.emit(op.concat([w0, w1], axis=0))
            d = bb.emit(op.dense(x, w))
            parts = bb.emit(op.split(d, (8,), axis=1))
            a = bb.emit_output(g.TupleGetItem(parts, 0))
            b = bb.emit_output(g.TupleGetItem(parts, 1))
        bb.emit_func_output(g.Tuple((a, b)))
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(3, 16), _rand(8, 16), _rand(4, 16))


def test_dense_group_waits_for_a_weight_computed_later():
    x = g.Var("x", _t(2, 16))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.dense(x, g.const(WS[0])))
            w1 = bb.emit(op.negative(g.const(WS[1])))
            b = bb.emit(op.dense(x, w1))
            out = bb.emit_output(g.Tuple((a, b)))
        bb.emit_func_output(out)
    mod = bb.get()
    after = CombineParallelDense()(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            w1 = bb.emit(op.negative(g.const(WS[1])))
            w = bb.emit(op.concat([g.const(WS[0]), w1], axis=0))
            d = bb.emit(op.dense(x, w))
            parts = bb.emit(op.split(d, (8,), axis=1))
            a = bb.emit(g.TupleGetItem(parts, 0))
            b = bb.emit(g.TupleGetItem(parts, 1))
            out = bb.emit_output(g.Tuple((a, b)))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_dense_not_combined():
    x, y = g.Var("x", _t(2, 16)), g.Var("y", _t(2, 16))
    bb = g.BlockBuilder()
    with bb.function("main", [x, y]):
        with bb.dataflow():
            a = bb.emit(op.dense(x, g.const(_rand(16, 16))))
            b = bb.emit(op.dense(y, g.const(WS[1])))                     # another input
            c = bb.emit(op.dense(x, g.const(_rand(4, 16)), out_dtype="float64"))  # attrs
            d = bb.emit(op.dense(x, a))           # its weight depends on a member: skipped
            out = bb.emit_output(g.Tuple((a, b, c, d)))
        bb.emit_func_output(out)
    _unchanged(CombineParallelDense(), bb.get())
    mod = _two_dense()
    _unchanged(CombineParallelDense(min_num_branches=3), mod)
    with PassContext(opt_level=1):  # opt level 2 pass: skipped in a Sequential at opt 1
        _unchanged(Sequential([CombineParallelDense()]), mod)
    with PassContext(opt_level=2):
        assert "split" in g.script(Sequential([CombineParallelDense()])(mod)["main"])


def _two_dense():
    x = g.Var("x", _t(2, 16))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.dense(x, g.const(WS[0])))
            b = bb.emit(op.dense(x, g.const(WS[1])))
            out = bb.emit_output(g.Tuple((a, b)))
        bb.emit_func_output(out)
    return bb.get()


# ---- conv2d ----------------------------------------------------------------------------------
def test_conv2d_branches_combine_per_kernel_size():
    """Two 1x1 branches with a per-channel bias and relu combine; the 3x3 branch (another
    kernel size) stays as it is."""
    x = g.Var("x", _t(1, 8, 6, 6))
    w1, w2, w3 = _rand(4, 8, 1, 1), _rand(6, 8, 1, 1), _rand(5, 8, 3, 3)
    b1, b2 = _rand(4, 1, 1), _rand(6, 1, 1)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c1 = bb.emit(op.nn.conv2d(x, g.const(w1)))
            r1 = bb.emit(op.nn.relu(op.add(c1, g.const(b1))))
            c3 = bb.emit(op.nn.conv2d(x, g.const(w3), padding=1))
            c2 = bb.emit(op.nn.conv2d(x, g.const(w2)))
            r2 = bb.emit(op.nn.relu(op.add(c2, g.const(b2))))
            out = bb.emit_output(op.concat([r1, c3, r2], axis=1))
        bb.emit_func_output(out)
    mod = bb.get()
    after = CombineParallelConv2D(min_num_branches=2)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(x, g.const(np.concatenate([w1, w2], axis=0))))
            a = bb.emit(op.add(c, g.const(np.concatenate([b1, b2], axis=0))))
            r = bb.emit(op.nn.relu(a))
            parts = bb.emit(op.split(r, (4,), axis=1))
            r1 = bb.emit(g.TupleGetItem(parts, 0))
            r2 = bb.emit(g.TupleGetItem(parts, 1))
            c3 = bb.emit(op.nn.conv2d(x, g.const(w3), padding=1))
            out = bb.emit_output(op.concat([r1, c3, r2], axis=1))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(1, 8, 6, 6))


def test_conv2d_nhwc_concatenates_along_o_and_splits_channels_last():
    x = g.Var("x", _t(1, 5, 5, 4))
    w1, w2 = _rand(3, 3, 4, 8), _rand(3, 3, 4, 4)
    attrs = dict(padding=1, data_layout="NHWC", kernel_layout="HWIO")
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.nn.conv2d(x, g.const(w1), **attrs))
            b = bb.emit(op.nn.conv2d(x, g.const(w2), **attrs))
            out = bb.emit_output(op.add(a, op.concat([b, b], axis=3)))
        bb.emit_func_output(out)
    mod = bb.get()
    after = CombineParallelConv2D(min_num_branches=2)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(x, g.const(np.concatenate([w1, w2], axis=3)), **attrs))
            parts = bb.emit(op.split(c, (8,), axis=3))
            a = bb.emit(g.TupleGetItem(parts, 0))
            b = bb.emit(g.TupleGetItem(parts, 1))
            out = bb.emit_output(op.add(a, op.concat([b, b], axis=3)))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(1, 5, 5, 4))


def test_conv2d_not_combined_when_attrs_differ():
    x = g.Var("x", _t(1, 4, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(op.nn.conv2d(x, g.const(_rand(4, 4, 3, 3)), padding=1))
            b = bb.emit(op.nn.conv2d(x, g.const(_rand(4, 4, 3, 3)), strides=2))
            c = bb.emit(op.nn.conv2d(x, g.const(_rand(4, 1, 3, 3)), groups=4))
            d = bb.emit(op.nn.conv2d(x, g.const(_rand(4, 1, 3, 3)), groups=4))
            out = bb.emit_output(g.Tuple((a, b, c, d)))
        bb.emit_func_output(out)
    _unchanged(CombineParallelConv2D(min_num_branches=2), bb.get())


def _conv_branches(n: int):
    x = g.Var("x", _t(1, 8, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            convs = [bb.emit(op.nn.conv2d(x, g.const(_rand(4 + i, 8, 1, 1)))) for i in range(n)]
            out = bb.emit_output(op.concat(convs, axis=1))
        bb.emit_func_output(out)
    return bb.get()


def test_conv2d_default_combines_three_branches_not_two():
    """Two branches stay apart by default (their split would cost more than the combined conv
    gains on NCHWc CPUs); three or more combine."""
    _unchanged(CombineParallelConv2D(), _conv_branches(2))
    mod = _conv_branches(3)
    after = CombineParallelConv2D()(mod)
    assert str(after["main"]).count("nn.conv2d(") == 1
    _same_numerics(mod, after, _rand(1, 8, 6, 6))
