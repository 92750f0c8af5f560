"""ONNX operators whose shape-setting inputs arrive at run time (AffineGrid's size,
CenterCropPad's shape, Col2Im's image/block shapes, MaxUnpool's output_shape, Pad 'wrap' with
run-time pads, DFT's axis with a one-sided output): each model is compiled once and must give
onnx.reference's answer for several values of those inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from kiln.frontend.onnx import from_onnx
from kiln.frontend.onnx.backend import prepare
from kiln.ir.errors import KilnError

RNG = np.random.default_rng(5)
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(node, inputs, opset=20):
    graph = helper.make_graph([node], "g", inputs, [_vi("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check_runs(model, feeds_list, rtol=1e-5, atol=1e-6):
    """One kiln build; every feed set must match onnx.reference (shape, dtype, values)."""
    rep = prepare(model)
    exe = rep.exe
    ref = ReferenceEvaluator(model)
    names = [i.name for i in model.graph.input]
    for feeds in feeds_list:
        (want,) = ref.run(None, dict(zip(names, feeds)))
        (got,) = rep.run(list(feeds))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    assert rep.exe is exe  # never recompiled
    return rep


def _f32(*shape):
    return RNG.standard_normal(shape).astype("float32")


@pytest.mark.parametrize("axes", [None, [0, 2], [-1, 1]])
def test_center_crop_pad_shape_is_a_graph_input(axes):
    n = 3 if axes is None else len(axes)
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], name="ccp",
                            **({} if axes is None else {"axes": axes}))
    m = _model(node, [_vi("x", F, [4, 5, 6]), _vi("s", I64, [n])], opset=18)
    x = _f32(4, 5, 6)
    shapes = [(2, 5, 3), (7, 5, 9), (3, 8, 1), (4, 5, 6)]
    _check_runs(m, [(x, np.array(s[:n], np.int64)) for s in shapes])


@pytest.mark.filterwarnings("ignore:divide by zero")
@pytest.mark.parametrize("k,align", [(2, 0), (2, 1), (3, 1)])
def test_affine_grid_size_is_a_graph_input(k, align):
    node = helper.make_node("AffineGrid", ["theta", "size"], ["y"], name="ag",
                            align_corners=align)
    m = _model(node, [_vi("theta", F, [2, k, k + 1]), _vi("size", I64, [k + 2])])
    theta = _f32(2, k, k + 1)
    sizes = [(2, 3, 4, 5), (2, 1, 1, 7), (2, 4, 3, 1)] if k == 2 else [
        (2, 3, 2, 3, 4), (2, 1, 1, 5, 2)]
    rep = _check_runs(m, [(theta, np.array(s, np.int64)) for s in sizes])
    with pytest.raises(KilnError, match="dimension 2 = 2 but the value has 3"):  # theta's N
        rep.run([theta, np.array((3, *sizes[0][1:]), np.int64)])


def test_pad_wrap_with_run_time_pads():
    node = helper.make_node("Pad", ["x", "p"], ["y"], name="pad", mode="wrap")
    m = _model(node, [_vi("x", F, [3, 4]), _vi("p", I64, [4])], opset=19)
    x = _f32(3, 4)
    _check_runs(m, [(x, np.array(p, np.int64)) for p in
                    ((1, 2, 0, 3), (0, 0, 0, 0), (5, 1, 2, 9))])


def test_max_unpool_output_shape_is_a_graph_input():
    """Checked against onnxruntime, not onnx.reference: with output_shape, kiln (like
    onnxruntime and PyTorch) reads MaxPool's indices as positions in the output_shape tensor,
    the reference as positions in the inferred shape (then zero-pads)."""
    import onnxruntime as ort

    pool = helper.make_node("MaxPool", ["x"], ["p", "i"], kernel_shape=[2, 2], strides=[2, 2])
    unpool = helper.make_node("MaxUnpool", ["p", "i", "s"], ["y"], name="unpool",
                              kernel_shape=[2, 2], strides=[2, 2])
    graph = helper.make_graph([pool, unpool], "g", [_vi("x", F, [1, 2, 5, 5]),
                                                     _vi("s", I64, [4])], [_vi("y", F, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    m.ir_version = 8
    rep = prepare(m)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = _f32(1, 2, 5, 5)
    for s in ((1, 2, 5, 5), (1, 2, 5, 6), (1, 2, 6, 7)):
        feeds = (x, np.array(s, np.int64))
        (want,) = sess.run(None, {"x": feeds[0], "s": feeds[1]})
        (got,) = rep.run(list(feeds))
        assert got.shape == want.shape == s
        np.testing.assert_array_equal(got, want)
    with pytest.raises(KilnError, match="= 2 but the value has 3"):  # N and C must be X's
        rep.run([x, np.array((1, 3, 5, 5), np.int64)])


@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 1], "dilations": [1, 2],
                                        "pads": [1, 0, 1, 1]}])
def test_col2im_image_and_block_shapes_are_graph_inputs(attrs):
    node = helper.make_node("Col2Im", ["x", "image", "block"], ["y"], name="c2i", **attrs)
    m = _model(node, [_vi("x", F, [2, 8, 6]), _vi("image", I64, [2]), _vi("block", I64, [2])],
               opset=18)
    x = _f32(2, 8, 6)
    feeds = []
    for blk in ((2, 2), (1, 4), (4, 1), (2, 1)):
        for h in range(1, 9):
            for w in range(1, 9):
                try:  # the geometries whose block count is the input's 6 columns
                    ReferenceEvaluator(m).run(None, {"x": x, "image": np.array([h, w]),
                                                     "block": np.array(blk)})
                except Exception:  # noqa: BLE001 - the reference rejects the geometry
                    continue
                if _col_count((h, w), blk, attrs) == 6:
                    feeds.append((x, np.array([h, w], np.int64), np.array(blk, np.int64)))
    assert len(feeds) >= 3
    rep = _check_runs(m, feeds[:6])
    with pytest.raises(Exception, match="does not hold"):
        rep.run([x, np.array([9, 9], np.int64), np.array([2, 2], np.int64)])


def _col_count(image, block, attrs):
    s, d = attrs.get("strides", [1, 1]), attrs.get("dilations", [1, 1])
    p = attrs.get("pads", [0, 0, 0, 0])
    return int(np.prod([(image[i] + p[i] + p[2 + i] - (block[i] - 1) * d[i] - 1) // s[i] + 1
                        for i in range(2)]))


@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_one_sided_with_run_time_axis(inverse):
    """A one-sided output halves the transformed axis, so the output shape depends on the
    run-time axis."""
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], name="dft", onesided=1,
                            inverse=inverse)
    m = _model(node, [_vi("x", F, [2, 6, 4, 1 + inverse]), _vi("axis", I64, [])])
    x = _f32(2, 6, 4, 1 + inverse)
    _check_runs(m, [(x, np.array(a, np.int64)) for a in (1, 2, -2, 0)], rtol=1e-4, atol=1e-5)


def _if_model(then_nodes, then_out, else_nodes, else_out):
    then_g = helper.make_graph(then_nodes, "then", [], [_vi(then_out, F, None)])
    else_g = helper.make_graph(else_nodes, "else", [], [_vi(else_out, F, None)])
    node = helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g,
                            else_branch=else_g)
    return _model(node, [_vi("c", TensorProto.BOOL, []), _vi("x", F, [4, 3])], opset=13)


def _const_i64(name, values):
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        name, I64, [len(values)], values))


def test_if_branches_of_different_dims_under_a_run_time_condition():
    """Both branches run; the chosen one's dims are bound at run time."""
    then_nodes = [_const_i64("s", [0]), _const_i64("e", [2]), _const_i64("a", [1]),
                  helper.make_node("Slice", ["x", "s", "e", "a"], ["t"])]
    else_nodes = [helper.make_node("Concat", ["x", "x"], ["u"], axis=0)]
    m = _if_model(then_nodes, "t", else_nodes, "u")
    x = _f32(4, 3)
    _check_runs(m, [(np.array(True), x), (np.array(False), x), (np.array(True), x)])


def test_if_branches_of_different_rank_are_refused_by_from_onnx_and_specialized_by_prepare():
    """A value's rank is static in kiln: () vs (1,) under a run-time condition is an error
    naming the node from ``from_onnx``, never a guessed rank; the backend (``compile_onnx``)
    specializes on the condition, each rank right (vs onnx.reference)."""
    then_nodes = [helper.make_node("ReduceSum", ["x"], ["t"], keepdims=0)]
    else_nodes = [_const_i64("s", [1]), helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
                  helper.make_node("Reshape", ["r", "s"], ["u"])]
    m = _if_model(then_nodes, "t", else_nodes, "u")
    with pytest.raises(KilnError, match="If node 'if'.*differs in rank"):
        from_onnx(m)
    rep = prepare(m)
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    for c in (True, False):
        (got,) = rep.run([np.array(c), x])
        (want,) = ReferenceEvaluator(m).run(None, {"c": np.array(c), "x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
