"""ConvertLayout: conv2d (and pooling) in the desired layouts, layout-agnostic ops following,
layout_transform only at boundaries, inverse pairs cancelled, numerics unchanged."""

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir import KilnError, assert_structural_equal
from kiln.op.layout import transform_array
from kiln.testing import models
from kiln.transform import ConvertLayout, PassContext, Sequential
from kiln.transform.convert_layout import DESIRED_LAYOUTS_KEY

RNG = np.random.default_rng(11)
NHWC = {"nn.conv2d": ("NHWC", "HWIO")}


def _t(*shape, dtype="float32"):
    return g.TensorStructInfo(shape, dtype)


def _rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def _nhwc(a):
    return transform_array(a, "NCHW", "NHWC")


def _hwio(w):
    return transform_array(w, "OIHW", "HWIO")


def _same_numerics(before, after, *inputs, rtol=1e-5):
    """Both modules built with kiln give the same outputs (a tuple is compared per field)."""
    ref = kiln.build(before)(*inputs)
    out = kiln.build(after)(*inputs)
    refs, outs = (ref, out) if isinstance(ref, (list, tuple)) else ([ref], [out])
    assert len(refs) == len(outs)
    for r, o in zip(refs, outs):
        scale = max(float(np.max(np.abs(r))), 1.0)
        np.testing.assert_allclose(o, r, rtol=rtol, atol=rtol * scale)


W1, W2 = _rand(8, 4, 3, 3), _rand(8, 8, 3, 3)
BIAS = _rand(8, 1, 1)


def _conv_bias_relu_pool_conv():
    x = g.Var("x", _t(2, 4, 10, 10))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(W1), padding=1))
            h = bb.emit(op.add(h, g.const(BIAS)))
            h = bb.emit(op.nn.relu(h))
            h = bb.emit(op.nn.max_pool2d(h, 2, 2))
            h = bb.emit(op.nn.conv2d(h, g.const(W2), padding=1))
            out = bb.emit_output(op.multiply(h, g.const(np.float32(0.5))))
        bb.emit_func_output(out)
    return bb.get(), x


def test_chain_converts_with_transforms_only_at_the_ends():
    mod, x = _conv_bias_relu_pool_conv()
    after = ConvertLayout(NHWC)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", "NHWC"))
            h = bb.emit(op.nn.conv2d(t, g.const(_hwio(W1)), padding=1, data_layout="NHWC",
                                     kernel_layout="HWIO"))
            h = bb.emit(op.add(h, g.const(_nhwc(BIAS))))          # (1, 1, 1, 8)
            h = bb.emit(op.nn.relu(h))
            h = bb.emit(op.nn.max_pool2d(h, 2, 2, layout="NHWC"))
            h = bb.emit(op.nn.conv2d(h, g.const(_hwio(W2)), padding=1, data_layout="NHWC",
                                     kernel_layout="HWIO"))
            h = bb.emit(op.multiply(h, g.const(np.float32(0.5))))  # a scalar stays as it is
            out = bb.emit_output(op.layout_transform(h, "NHWC", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    assert _nhwc(BIAS).shape == (1, 1, 1, 8)
    _same_numerics(mod, after, _rand(2, 4, 10, 10))


def test_op_that_cannot_follow_gets_the_original_layout_once():
    """softmax over channels cannot follow NHWC: one transform back feeds both the softmax and
    the reshape; the second conv reuses the NHWC value (no NCHW -> NHWC transform)."""
    x = g.Var("x", _t(1, 4, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            c1 = bb.emit(op.nn.conv2d(x, g.const(W1), padding=1))
            s = bb.emit(op.nn.softmax(c1, axis=1))
            r = bb.emit(op.reshape(c1, (1, 288)))
            c2 = bb.emit(op.nn.conv2d(c1, g.const(W2), padding=1))
            out = bb.emit_output(op.add(c2, s))
            out2 = bb.emit_output(r)
        bb.emit_func_output(g.Tuple((out, out2)))
    mod = bb.get()
    after = ConvertLayout(NHWC)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", "NHWC"))
            c1 = bb.emit(op.nn.conv2d(t, g.const(_hwio(W1)), padding=1, data_layout="NHWC",
                                      kernel_layout="HWIO"))
            back = bb.emit(op.layout_transform(c1, "NHWC", "NCHW"))
            s = bb.emit(op.nn.softmax(back, axis=1))
            r = bb.emit(op.reshape(back, (1, 288)))
            c2 = bb.emit(op.nn.conv2d(c1, g.const(_hwio(W2)), padding=1, data_layout="NHWC",
                                      kernel_layout="HWIO"))
            # add follows c2's NHWC: the softmax result (a variable) is transformed to NHWC
            s2 = bb.emit(op.layout_transform(s, "NCHW", "NHWC"))
            a = bb.emit(op.add(c2, s2))
            out = bb.emit_output(op.layout_transform(a, "NHWC", "NCHW"))
            out2 = bb.emit_output(r)
        bb.emit_func_output(g.Tuple((out, out2)))
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(1, 4, 6, 6))


def test_existing_inverse_transforms_cancel():
    """A transform pair already in the graph disappears once the conv wants NHWC."""
    x = g.Var("x", _t(1, 4, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.layout_transform(x, "NCHW", "NHWC"))
            z = bb.emit(op.layout_transform(y, "NHWC", "NCHW"))
            out = bb.emit_output(op.nn.conv2d(z, g.const(W1)))
        bb.emit_func_output(out)
    mod = bb.get()
    after = ConvertLayout(NHWC)(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.layout_transform(x, "NCHW", "NHWC"))
            c = bb.emit(op.nn.conv2d(y, g.const(_hwio(W1)), data_layout="NHWC",
                                     kernel_layout="HWIO"))
            out = bb.emit_output(op.layout_transform(c, "NHWC", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])


def test_block_output_keeps_its_layout_and_batch_norm_follows():
    """A conv result that leaves the dataflow block is transformed back there; batch_norm
    moves its channel axis; a non-constant weight gets a runtime transform."""
    x = g.Var("x", _t(1, 4, 6, 6))
    w = g.Var("w", _t(8, 4, 3, 3))
    params = [g.const(_rand(8)) for _ in range(3)]
    params.append(g.const(RNG.uniform(0.5, 2.0, 8).astype("float32")))  # variance
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit_output(op.nn.conv2d(x, w, padding=1))
            bn = bb.emit(op.nn.batch_norm(c, *params, axis=1))
            out = bb.emit_output(op.nn.relu(bn))
        bb.emit_func_output(g.Tuple((c, out)))
    mod = bb.get()
    after = ConvertLayout({"nn.conv2d": ("NHWC", "default")})(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", "NHWC"))
            wt = bb.emit(op.layout_transform(w, "OIHW", "HWIO"))
            cl = bb.emit(op.nn.conv2d(t, wt, padding=1, data_layout="NHWC",
                                      kernel_layout="HWIO"))
            c = bb.emit_output(op.layout_transform(cl, "NHWC", "NCHW"))
            bn = bb.emit(op.nn.batch_norm(cl, *params, axis=3))
            r = bb.emit(op.nn.relu(bn))
            out = bb.emit_output(op.layout_transform(r, "NHWC", "NCHW"))
        bb.emit_func_output(g.Tuple((c, out)))
    assert_structural_equal(after["main"], bb.get()["main"])
    _same_numerics(mod, after, _rand(1, 4, 6, 6), _rand(8, 4, 3, 3))


def test_pool_conversion_and_no_op_cases():
    x = g.Var("x", _t(1, 4, 6, 6))
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(op.nn.avg_pool2d(x, 2, 2))
        bb.emit_func_output(out)
    mod = bb.get()
    after = ConvertLayout({"nn.avg_pool2d": ("NHWC",)})(mod)
    bb = g.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            t = bb.emit(op.layout_transform(x, "NCHW", "NHWC"))
            p = bb.emit(op.nn.avg_pool2d(t, 2, 2, layout="NHWC"))
            out = bb.emit_output(op.layout_transform(p, "NHWC", "NCHW"))
        bb.emit_func_output(out)
    assert_structural_equal(after["main"], bb.get()["main"])
    # already in the desired layout, or an op not asked for: unchanged
    assert_structural_equal(ConvertLayout({"nn.avg_pool2d": ("NCHW",)})(mod)["main"],
                            mod["main"])
    assert_structural_equal(ConvertLayout(NHWC)(mod)["main"], mod["main"])


def test_desired_layouts_from_the_pass_context_config():
    mod, _ = _conv_bias_relu_pool_conv()
    assert_structural_equal(ConvertLayout()(mod)["main"], mod["main"])  # nothing asked
    with PassContext(opt_level=2, config={DESIRED_LAYOUTS_KEY: {"nn.conv2d": ("NHWC",)}}):
        via_config = Sequential([ConvertLayout()])(mod)
    assert_structural_equal(via_config["main"], ConvertLayout(NHWC)(mod)["main"])
    with PassContext(opt_level=1, config={DESIRED_LAYOUTS_KEY: {"nn.conv2d": ("NHWC",)}}):
        gated = Sequential([ConvertLayout()])(mod)  # opt level 2 pass
    assert_structural_equal(gated["main"], mod["main"])


def test_bad_desired_layouts_name_the_problem():
    with pytest.raises(KilnError, match="cannot convert 'dense'"):
        ConvertLayout({"dense": ("NC",)})
    with pytest.raises(KilnError, match="kernel layout must be a permutation of 'OIHW'"):
        ConvertLayout({"nn.conv2d": ("NHWC", "HWIO8o")})
    with pytest.raises(KilnError, match="no default kernel layout for nn.conv2d data layout"):
        ConvertLayout({"nn.conv2d": ("HWNC",)})
    with pytest.raises(KilnError, match="must have unsplit H and W"):
        ConvertLayout({"nn.max_pool2d": ("NC",)})
    with pytest.raises(KilnError, match="must be a dict"):
        ConvertLayout([("nn.conv2d", "NHWC")])


def test_small_cnn_in_nhwc_matches():
    model = models.small_cnn(batch=2, channels=8, size=8, seed=1)
    after = ConvertLayout({"nn.conv2d": ("NHWC", "default")})(model.mod)
    names = [b.value.op.name for b in after["main"].body.blocks[0].bindings]
    assert names.count("layout_transform") == 2  # the input, and before the reshape
    out = kiln.build(after)(*model.inputs)
    ref = model.reference(*model.inputs)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
