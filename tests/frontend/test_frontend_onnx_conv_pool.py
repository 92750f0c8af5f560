"""3-D Conv/pooling, MaxPool's Indices output and ConvTranspose checked against onnxruntime on
random inputs (shapes and attributes the ONNX backend node cases do not cover)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx

ort = pytest.importorskip("onnxruntime")

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def _run(op_type, inputs, n_out=1, out_types=(F, I64), opset=19, **attrs):
    """Import a one-node model, run it with kiln and onnxruntime, return both results."""
    names = [f"i{k}" for k in range(len(inputs))]
    outs = [f"o{k}" for k in range(n_out)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, F, a.shape) for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info(o, out_types[k], None) for k, o in enumerate(outs)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 9
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    feeds = dict(zip(names, inputs))
    got = exe(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return got, sess.run(None, feeds)


def _close(got, ref, tol=1e-4):
    assert len(got) == len(ref)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("attrs", [
    dict(strides=[2, 1, 2], pads=[1, 0, 2, 0, 1, 1], dilations=[1, 2, 1]),
    dict(group=2, auto_pad="SAME_UPPER", strides=[2, 2, 1]),
])
def test_conv3d(attrs):
    x, w, b = _rand(2, 4, 7, 6, 5), _rand(6, 4 // attrs.get("group", 1), 3, 2, 3), _rand(6)
    _close(*_run("Conv", [x, w, b], **attrs))


@pytest.mark.parametrize("op_type,attrs", [
    ("MaxPool", dict(kernel_shape=[3, 2, 2], strides=[2, 1, 2], pads=[1, 0, 1, 1, 1, 0])),
    ("AveragePool", dict(kernel_shape=[3, 3, 2], strides=[2, 2, 1], pads=[1, 1, 0, 1, 0, 1],
                         ceil_mode=1)),
    ("AveragePool", dict(kernel_shape=[2, 3, 3], strides=[1, 2, 2], pads=[0, 1, 1, 1, 1, 0],
                         count_include_pad=1)),
])
def test_pool3d_separable(op_type, attrs):
    _close(*_run(op_type, [_rand(2, 3, 7, 6, 8)], **attrs), tol=1e-5)


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_conv_transpose_nonfinite_weight_stays_in_its_outputs(bad):
    """An inf/NaN weight reaches only the outputs its taps land on (the zeros between taps
    once multiplied it: 0 * inf = NaN everywhere)."""
    x, w = np.abs(_rand(1, 2, 4, 4)) + 0.1, _rand(2, 3, 3, 3)
    w[0, 0, 0, 0] = bad
    (got,), (ref,) = _run("ConvTranspose", [x, w], strides=[2, 2])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    assert np.isfinite(got).sum() > got.size // 2
    _close([np.where(np.isfinite(got), got, 0)], [np.where(np.isfinite(ref), ref, 0)])


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 9), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ((2, 3, 7, 6), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1)),
    ((2, 3, 7, 6), dict(kernel_shape=[2, 3], dilations=[2, 1], storage_order=1)),
    ((1, 2, 5, 4, 6), dict(kernel_shape=[2, 2, 3], strides=[2, 1, 2], pads=[0, 1, 1, 1, 0, 1])),
])
def test_maxpool_indices(shape, attrs):
    _close(*_run("MaxPool", [_rand(*shape)], n_out=2, **attrs), tol=0)


@pytest.mark.parametrize("shape,wshape,attrs", [
    ((2, 4, 5, 4), (4, 3, 3, 2), dict(strides=[2, 3], pads=[2, 0, 1, 1], output_padding=[1, 2],
                                       group=2)),
    ((1, 2, 4, 3), (2, 3, 2, 3), dict(strides=[2, 2], output_shape=[9, 8],
                                       auto_pad="SAME_LOWER")),
    ((1, 2, 6), (2, 2, 3), dict(strides=[3], dilations=[2], pads=[1, 2])),
    ((1, 2, 3, 4, 3), (2, 2, 2, 3, 2), dict(strides=[2, 1, 2], pads=[1, 0, 1, 0, 1, 0],
                                             dilations=[2, 1, 1])),
])
def test_conv_transpose(shape, wshape, attrs):
    x, w, b = _rand(*shape), _rand(*wshape), _rand(wshape[1] * attrs.get("group", 1))
    _close(*_run("ConvTranspose", [x, w, b], **attrs))


@pytest.mark.parametrize("shape,wshape,attrs", [
    # kernel == stride: one tap per output (the per-pixel GEMM and a depth-to-space shuffle)
    ((1, 24, 10, 12), (24, 24, 2, 2), dict(strides=[2, 2])),
    ((1, 24, 6, 5), (24, 1, 2, 2), dict(strides=[2, 2])),
    ((2, 8, 5, 4), (8, 3, 4, 4), dict(strides=[4, 4])),
    ((1, 6, 5, 7), (6, 2, 2, 3), dict(strides=[2, 3], group=3)),
    # overlapping taps (kernel > stride), uneven phases, phases no tap reaches, output_padding
    ((1, 16, 6, 7), (16, 8, 4, 4), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 8, 5, 6), (8, 4, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1],
                                      output_padding=[1, 1])),
    ((1, 4, 5, 6), (4, 6, 3, 3), dict(strides=[1, 1], pads=[1, 0, 1, 2])),
    ((1, 4, 5, 6), (4, 3, 2, 2), dict(strides=[3, 3], pads=[0, 1, 1, 0])),
    ((1, 4, 5, 6), (4, 3, 3, 2), dict(strides=[2, 2], dilations=[2, 3], output_padding=[1, 0])),
])
def test_conv_transpose_gemm_col2im(shape, wshape, attrs):
    """The per-pixel GEMM + col2im formulation against onnxruntime in float32, at 1e-5 of the
    output's scale."""
    x, w, b = _rand(*shape), _rand(*wshape), _rand(wshape[1] * attrs.get("group", 1))
    (got,), (ref,) = _run("ConvTranspose", [x, w, b], **attrs)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("shape,attrs", [
    ((2, 3, 9, 8), dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], p=3,
                        ceil_mode=1)),
    ((1, 2, 5, 6, 4), dict(kernel_shape=[2, 3, 2], strides=[2, 1, 2], p=2)),
])
def test_lp_pool(shape, attrs):
    _close(*_run("LpPool", [_rand(*shape)], **attrs))


def test_global_lp_pool():
    _close(*_run("GlobalLpPool", [_rand(2, 3, 5, 4)], p=3))


def _col2im_model(x, image, block, **attrs):
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], **attrs)
    inits = [helper.make_tensor("image", I64, [len(image)], image),
             helper.make_tensor("block", I64, [len(block)], block)]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, x.shape)],
                              [helper.make_tensor_value_info("y", F, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


@pytest.mark.parametrize("shape,image,block,attrs", [
    ((2, 2 * 6, 15), [5, 6], [2, 3], dict(strides=[2, 1], pads=[1, 0, 0, 1])),
    ((1, 3 * 4, 4), [6, 5], [2, 2], dict(strides=[2, 2], dilations=[2, 1])),
    ((1, 2 * 3, 4), [6], [3], dict(strides=[2], pads=[1, 2])),
    # an output width of 5: with a multiple of 4 the depth padding of the 3-D path hits a C
    # codegen bug (a select under a scalar condition between an unaligned vector load and a
    # broadcast: gcc's "type mismatch in conditional expression"; any Pad of a non-inner axis)
    ((1, 2 * 8, 8), [3, 3, 5], [2, 2, 2], dict(strides=[1, 2, 2], pads=[0, 0, 0, 0, 1, 0])),
])
def test_col2im_constant_shapes(shape, image, block, attrs):
    from onnx.reference import ReferenceEvaluator

    x = _rand(*shape)
    model = _col2im_model(x, image, block, **attrs)
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x)
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_max_unpool_roundtrip():
    """MaxPool's Indices fed to MaxUnpool (with a constant output_shape) against onnxruntime."""
    x = _rand(2, 3, 7, 6)
    pool = helper.make_node("MaxPool", ["x"], ["v", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = helper.make_node("MaxUnpool", ["v", "i", "s"], ["y"], kernel_shape=[2, 2],
                              strides=[2, 2])
    graph = helper.make_graph(
        [pool, unpool], "g", [helper.make_tensor_value_info("x", F, x.shape)],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[helper.make_tensor("s", I64, [4], [2, 3, 7, 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, sess.run(None, {"x": x})[0])


@pytest.mark.parametrize("pads", [[0, 1, 2, 0, 2, 1], [1, 0, 7, 0, 2, 0]])
def test_wrap_pad_constant_pads(pads):
    """Pad mode 'wrap' with constant pads (also wider than the axis) against numpy."""
    x = _rand(2, 3, 4)
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="wrap")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, x.shape)],
                              [helper.make_tensor_value_info("y", F, None)],
                              initializer=[helper.make_tensor("p", I64, [6], pads)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x)
    want = np.pad(x, [(pads[i], pads[i + 3]) for i in range(3)], mode="wrap")
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize("pads", [[0, 1, 0, 0, -1, 0], [0, -2, 1, 0, 3, -1]])
def test_negative_pads_crop(mode, pads):
    """Negative pads remove elements (RWKV's time shift: pads [0, 1, 0, 0, -1, 0]), before the
    positive ones pad, against onnxruntime."""
    x = _rand(3, 6, 7)
    node = helper.make_node("Pad", ["x", "p", "v"], ["y"], mode=mode)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, x.shape)],
                              [helper.make_tensor_value_info("y", F, None)],
                              initializer=[helper.make_tensor("p", I64, [6], pads),
                                           helper.make_tensor("v", F, [], [1.5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, sess.run(None, {"x": x})[0])


def test_deform_conv_groups_strides_mask():
    """DeformConv with group=2, offset_group=2, strides, dilations, pads, mask and bias against
    the ONNX reference (offsets up to +-2 pixels, so taps also fall outside the input)."""
    from onnx.reference import ReferenceEvaluator

    x, w, b = _rand(1, 4, 6, 5), _rand(4, 2, 2, 3), _rand(4)
    attrs = dict(group=2, offset_group=2, strides=[2, 1], dilations=[1, 2], pads=[1, 1, 0, 1])
    oh, ow = (6 + 1 - 2) // 2 + 1, (5 + 2 - 5) // 1 + 1
    offset = (2 * RNG.standard_normal((1, 2 * 2 * 6, oh, ow))).astype(np.float32)
    mask = RNG.random((1, 2 * 6, oh, ow)).astype(np.float32)
    names = ["x", "w", "offset", "b", "mask"]
    node = helper.make_node("DeformConv", names, ["y"], **attrs)
    arrays = [x, w, offset, b, mask]
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, F, a.shape) for n, a in zip(names, arrays)],
        [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    feeds = dict(zip(names, arrays))
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(**feeds)
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_conv_transpose_float16_accumulates_in_float32():
    """A float16 ConvTranspose (its per-pixel GEMM a 1x1 conv accumulating in float32, rounded
    once) against onnxruntime's float32 result on the same float16 values."""
    x, w, b = _rand(1, 32, 6, 5), _rand(32, 8, 2, 2) * 0.2, _rand(8)
    x16, w16, b16 = (a.astype(np.float16) for a in (x, w, b))
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT16, a.shape)
                      for n, a in (("x", x16), ("w", w16), ("b", b16))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(x=x16, w=w16, b=b16)
    _, (ref,) = _run("ConvTranspose", [x16.astype(np.float32), w16.astype(np.float32),
                                       b16.astype(np.float32)], strides=[2, 2])
    assert got.dtype == np.float16 and got.shape == ref.shape
    # one rounding to float16 (half an ulp: 2^-11 relative) on top of the float32 sum
    np.testing.assert_allclose(got.astype(np.float32), ref, rtol=2 ** -10, atol=1e-3)


def test_conv_transpose_dynamic_batch():
    """A symbolic batch (the GEMM is a matmul broadcast over it): one executable, any batch."""
    w = _rand(8, 4, 3, 3)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                            pads=[1, 1, 1, 1], output_padding=[1, 1])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", F, ["N", 8, 5, 6])],
        [helper.make_tensor_value_info("y", F, None)],
        initializer=[helper.make_tensor("w", F, w.shape, w.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 3):
        x = _rand(n, 8, 5, 6)
        ref = sess.run(None, {"x": x})[0]
        got = exe(x=x)
        assert got.shape == ref.shape == (n, 4, 10, 12)
        assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()


def _max_pool_skipping_nan(x, kernel, strides, pads):
    """MaxPool with NaNs skipped (a window of NaNs only gives -inf): the padding is NaN too,
    then a NaN-skipping windowed maximum."""
    n = len(kernel)
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pads[i], pads[n + i]) for i in range(n)],
                constant_values=np.nan)
    win = np.lib.stride_tricks.sliding_window_view(xp, kernel, axis=tuple(range(2, 2 + n)))
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]
    out = np.fmax.reduce(win.reshape(*win.shape[:2 + n], -1), axis=-1)
    return np.where(np.isnan(out), -np.inf, out)


@pytest.mark.parametrize("shape,kernel,strides,pads", [
    ((1, 2, 7, 9), [3, 3], [2, 2], [1, 1, 1, 1]),
    ((2, 3, 8, 8), [2, 2], [1, 1], [0, 0, 0, 0]),
    ((1, 2, 5, 6, 7), [3, 2, 3], [2, 1, 2], [1, 0, 1, 1, 1, 0]),
])
def test_maxpool_skips_nan(shape, kernel, strides, pads):
    """NaN inputs are skipped (onnxruntime's reference loop and onnx.reference's N-d pooling
    skip them; onnxruntime's vectorized 2-D kernel gives an order-dependent result); a window
    of -inf only gives -inf, as both references do, and so does one of NaNs only (they gave
    the lowest finite float); the Indices output points at an input element whose value is the
    result (a NaN for a window of NaNs), never at the padding."""
    x = _rand(*shape)
    x.flat[RNG.choice(x.size, x.size // 6, replace=False)] = np.nan
    x[0, 0, :3, :3] = np.nan  # whole windows of NaNs
    x[-1, -1, -3:, -3:] = -np.inf  # whole windows of -inf (some with NaNs), by the padding
    x[-1, -1, -1, -1] = np.nan
    attrs = dict(kernel_shape=kernel, strides=strides, pads=pads)
    (got,), _ = _run("MaxPool", [x], **attrs)
    want = _max_pool_skipping_nan(x, kernel, strides, pads)
    np.testing.assert_array_equal(got, want)
    assert np.isneginf(got).any()
    (values, indices), _ = _run("MaxPool", [x], n_out=2, **attrs)
    np.testing.assert_array_equal(values, got)
    assert indices.min() >= 0 and indices.max() < x.size
    picked = x.reshape(-1)[indices]
    np.testing.assert_array_equal(np.where(np.isnan(picked), -np.inf, picked), got)


@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (6, 2)])
def test_batch_norm_training_mode_against_the_reference(shape):
    """training_mode=1: normalized by the batch statistics, running statistics updated with
    the momentum (outputs 1 and 2); against onnx.reference on random data."""
    c = shape[1]
    x = _rand(*shape) * 3 + 1
    params = [_rand(c), _rand(c), _rand(c), np.abs(_rand(c)) + 0.5]
    names = ["x", "s", "b", "m", "v"]
    node = helper.make_node("BatchNormalization", names, ["y", "rm", "rv"], training_mode=1,
                            momentum=0.7, epsilon=1e-3)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, F, a.shape) for n, a in zip(names, [x, *params])],
        [helper.make_tensor_value_info(o, F, None) for o in ("y", "rm", "rv")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    feeds = dict(zip(names, [x, *params]))
    mod, weights = from_onnx(model)
    got = kiln.build(mod, params=weights)(**feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    _close(list(got), want)
