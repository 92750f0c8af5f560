"""AlterOpLayout on depthwise and grouped convolutions: a depthwise conv2d becomes
nn.depthwise_conv2d_nchwc and a grouped one a grouped nn.conv2d_nchwc, so an inverted residual
block (1x1 expand, depthwise 3x3, 1x1 project, residual add) stays in NCHW[x]c from its input to
its output; convolutions whose channels do not fit the block stay NCHW. Numerics are compared
with the graph before the pass (and a float64 numpy reference for the block)."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir import assert_structural_equal
from kiln.op.layout import transform_array
from kiln.target import Target
from kiln.transform import AlterOpLayout, PassContext

RNG = np.random.default_rng(7)
TARGET = Target("c")
L = TARGET.vector_lanes("float32")


def _t(*shape):
    return g.TensorStructInfo(shape, "float32")


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _ops(func):
    return [b.value.op.name for blk in func.body.blocks for b in blk.bindings
            if isinstance(b.value, g.Call)]


def _same_numerics(before, after, *inputs):
    """``after`` (built as is) matches ``before`` built without AlterOpLayout (plain NCHW)."""
    with PassContext(opt_level=2, disabled_pass=["AlterOpLayout"]):
        ref = kiln.build(before)(*inputs)
    out = kiln.build(after)(*inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(np.abs(ref).max(), 1.0))


def _single_conv(c, w, **attrs):
    x = g.Var("x", _t(1, c, 9, 9))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.conv2d(x, g.const(w), **attrs))
        bb.emit_func_output(out)
    return bb.get(), x


def test_depthwise_becomes_depthwise_nchwc():
    w = _rand(2 * L, 1, 3, 3)
    mod, x = _single_conv(2 * L, w, groups=2 * L, padding=1, strides=2)
    after = AlterOpLayout(TARGET)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", f"NCHW{L}c"))
            wb = transform_array(w, "OIHW", f"OIHW{L}o")
            h = bb.emit(op.nn.depthwise_conv2d_nchwc(t, g.const(wb), padding=1, strides=2))
            out = bb.emit_output(op.layout_transform(h, f"NCHW{L}c", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    assert wb.shape == (2, 1, 3, 3, L)
    _same_numerics(mod, after, _rand(1, 2 * L, 9, 9))


def test_grouped_becomes_grouped_nchwc():
    w = _rand(4 * L, L, 3, 3)  # 2 groups of L input and 2L output channels
    mod, x = _single_conv(2 * L, w, groups=2, padding=(1, 0, 1, 1))
    after = AlterOpLayout(TARGET)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", f"NCHW{L}c"))
            wb = transform_array(w, "OIHW", f"OIHW{L}i{L}o")
            h = bb.emit(op.nn.conv2d_nchwc(t, g.const(wb), groups=2, padding=(1, 0, 1, 1)))
            out = bb.emit_output(op.layout_transform(h, f"NCHW{L}c", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(1, 2 * L, 9, 9))


@pytest.mark.parametrize("c, o, groups", [
    (L + L // 2, L + L // 2, L + L // 2),  # depthwise, channels not a multiple of the block
    (L, 2 * L, L),  # depthwise with channel multiplier 2
    (2 * L, 2 * L, 4),  # grouped, L/2 input channels per group
    (4 * L, 2 * L, 4),  # grouped, L/2 output channels per group
])
def test_convs_that_do_not_fit_the_block_stay_nchw(c, o, groups):
    mod, _ = _single_conv(c, _rand(o, c // groups, 3, 3), groups=groups, padding=1)
    assert_structural_equal(AlterOpLayout(TARGET)(mod)["main"], mod["main"])


def _inverted_residual(c, expand, stride):
    """1x1 expand + relu6, depthwise 3x3 + relu6, 1x1 project (+ residual when stride 1)."""
    e = c * expand
    ws = (_rand(e, c, 1, 1) * 0.3, _rand(e, 1, 3, 3) * 0.3, _rand(c, e, 1, 1) * 0.3)
    bias = _rand(e, 1, 1)
    x = g.Var("x", _t(1, c, 10, 10))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(ws[0])))
            h = bb.emit(op.clip(op.add(h, g.const(bias)), 0.0, 6.0))
            h = bb.emit(op.nn.conv2d(h, g.const(ws[1]), groups=e, padding=1, strides=stride))
            h = bb.emit(op.clip(h, 0.0, 6.0))
            h = bb.emit(op.nn.conv2d(h, g.const(ws[2])))
            out = bb.emit_output(op.add(h, x) if stride == 1 else h)
        bb.emit_func_output(out)

    def reference(xv):
        x64 = xv.astype(np.float64)
        h = np.clip(np.einsum("nchw,oc->nohw", x64, ws[0][:, :, 0, 0]) + bias, 0, 6)
        win = np.lib.stride_tricks.sliding_window_view(
            np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))
        h = np.einsum("nchwij,cij->nchw", win[:, :, ::stride, ::stride], ws[1][:, 0])
        h = np.einsum("nchw,oc->nohw", np.clip(h, 0, 6), ws[2][:, :, 0, 0])
        return h + x64 if stride == 1 else h

    return bb.get(), reference


@pytest.mark.parametrize("stride", [1, 2])
def test_inverted_residual_block_stays_blocked(stride):
    mod, reference = _inverted_residual(L, 4, stride)
    with PassContext(opt_level=2):
        after = AlterOpLayout(TARGET)(mod)
    names = _ops(after["main"])
    assert names.count("layout_transform") == 2  # the block's input and output only
    assert names.count("nn.depthwise_conv2d_nchwc") == 1 and "nn.conv2d" not in names
    xv = _rand(1, L, 10, 10)
    out = kiln.build(mod)(xv)  # the default pipeline: AlterOpLayout and fusion
    ref = reference(xv)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_symbolic_batch_and_weight_parameter():
    """A run-time weight gets a layout_transform; a symbolic batch keeps the schedule's
    parallel loop over rows (the channel blocks alone are not known to feed the threads)."""
    n = tir.Var("n", "int64")
    x = g.Var("x", _t(n, 2 * L, 7, 7))
    w = g.Var("w", _t(2 * L, 1, 5, 5))
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, w, groups=2 * L, padding=2))
            out = bb.emit_output(op.nn.relu(h))
        bb.emit_func_output(out)
    mod = bb.get()
    after = AlterOpLayout(TARGET)(mod)
    assert _ops(after["main"]) == ["layout_transform", "layout_transform",
                                   "nn.depthwise_conv2d_nchwc", "relu", "layout_transform"]
    _same_numerics(mod, after, _rand(3, 2 * L, 7, 7), _rand(2 * L, 1, 5, 5))
