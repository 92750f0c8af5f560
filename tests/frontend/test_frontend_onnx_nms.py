"""ONNX NonMaxSuppression through kiln against ``onnx.reference`` on random boxes.

The thresholds and ``max_output_boxes_per_class`` are graph inputs: each model is compiled
once and run with several values (the output's row count is bound at run time).
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from kiln.frontend.onnx.backend import prepare
from kiln.ir.errors import KilnError

RNG = np.random.default_rng(11)
F, I64 = TensorProto.FLOAT, TensorProto.INT64
INPUTS = ("boxes", "scores", "max_output", "iou", "score_threshold")


def _model(boxes_shape, scores_shape, n_inputs=5, center=0, scalar_shape=(1,)):
    node = helper.make_node("NonMaxSuppression", list(INPUTS[:n_inputs]), ["y"], name="nms",
                            center_point_box=center)
    types = (F, F, I64, F, F)
    shapes = (boxes_shape, scores_shape) + (scalar_shape,) * 3
    inputs = [helper.make_tensor_value_info(n, t, s)
              for n, t, s in zip(INPUTS[:n_inputs], types, shapes)]
    graph = helper.make_graph([node], "g", inputs,
                              [helper.make_tensor_value_info("y", I64, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def _corner_boxes(b, n):
    """[y1, x1, y2, x2] in either diagonal order; a few zero-area (a line or a point)."""
    p = RNG.random((b, n, 2, 2)).astype("float32")
    boxes = np.concatenate([p[..., 0, :], p[..., 1, :]], axis=-1)
    flat = boxes.reshape(-1, 4)
    flat[::7, 2] = flat[::7, 0]  # zero height
    flat[::11, 2:] = flat[::11, :2]  # a point
    return boxes


def _scores(b, c, n, levels=None):
    s = RNG.random((b, c, n)).astype("float32")
    if levels:  # many equal scores: ties must keep the lower box index first
        s = (np.floor(s * levels) / levels).astype("float32")
    return s


def _reference(ref, feeds):
    """onnx.reference's answer (it fails on a negative max_output, which ONNX reads as 0, and
    on 0-d scalars)."""
    feeds = [f if k < 2 else f.reshape(1) for k, f in enumerate(feeds)]
    if len(feeds) > 2:
        feeds[2] = np.maximum(feeds[2], 0)
    (want,) = ref.run(None, dict(zip(INPUTS, feeds)))
    return want.reshape(-1, 3)


def _check(model, feeds_list):
    rep = prepare(model)
    exe = rep.exe
    ref = ReferenceEvaluator(model)
    for feeds in feeds_list:
        want = _reference(ref, feeds)
        (got,) = rep.run(list(feeds))
        assert got.dtype == np.int64 and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    assert rep.exe is exe  # one build for every value of the thresholds


def _scalars(max_out, iou, thr, shape=(1,)):
    return (np.full(shape, max_out, np.int64), np.full(shape, iou, np.float32),
            np.full(shape, thr, np.float32))


def test_corner_boxes_many_classes_and_ties():
    b, c, n = 2, 9, 40
    boxes = _corner_boxes(b, n)
    model = _model(boxes.shape, (b, c, n))
    cases = ((5, 0.3, 0.2), (100, 0.5, 0.0), (3, 0.0, 0.5), (0, 0.5, 0.0), (40, 1.0, -1.0),
             (-2, 0.5, 0.0))
    _check(model, [(boxes, _scores(b, c, n, levels), *_scalars(m, iou, thr))
                   for levels in (None, 4) for m, iou, thr in cases])


def test_center_point_boxes():
    b, c, n = 3, 4, 30
    centers = RNG.random((b, n, 2)).astype("float32")
    sizes = (RNG.random((b, n, 2)) * 0.5).astype("float32")
    sizes[:, ::6, 0] = 0  # zero width
    boxes = np.concatenate([centers, sizes], axis=-1)
    scores = _scores(b, c, n, levels=8)
    model = _model(boxes.shape, scores.shape, center=1)
    _check(model, [(boxes, scores, *_scalars(m, iou, thr)) for m, iou, thr in (
        (4, 0.4, 0.1), (30, 0.1, 0.0), (1, 0.5, 0.9))])


def test_without_score_threshold_and_scalar_inputs():
    """No score threshold: every box is a candidate; 0-d scalar inputs are accepted too."""
    boxes, scores = _corner_boxes(1, 25), _scores(1, 3, 25)
    scores[0, 0, :5] = -1.0  # negative scores are candidates when there is no threshold
    model = _model(boxes.shape, scores.shape, n_inputs=4, scalar_shape=())
    rep = prepare(model)
    ref = ReferenceEvaluator(model)
    for max_out, iou in ((10, 0.2), (25, 0.6)):
        feeds = (boxes, scores, np.array(max_out), np.array(iou, np.float32))
        np.testing.assert_array_equal(rep.run(list(feeds))[0], _reference(ref, feeds))


def test_without_max_output_selects_nothing():
    boxes, scores = _corner_boxes(1, 6), _scores(1, 2, 6)
    (got,) = prepare(_model(boxes.shape, scores.shape, n_inputs=2)).run([boxes, scores])
    assert got.shape == (0, 3) and got.dtype == np.int64


def test_symbolic_batch_and_box_counts():
    """One build serves every batch size and box count (dims bound from the inputs)."""
    model = _model(["b", "n", 4], ["b", 3, "n"])
    rep = prepare(model)
    ref = ReferenceEvaluator(model)
    for b, n in ((1, 5), (2, 17), (3, 0)):
        feeds = (_corner_boxes(b, n), _scores(b, 3, n, 5), *_scalars(6, 0.3, 0.1))
        np.testing.assert_array_equal(rep.run(list(feeds))[0], _reference(ref, feeds))


def test_bad_shapes_name_the_node():
    with pytest.raises(KilnError, match="NonMaxSuppression node 'nms'.*4 coordinates"):
        prepare(_model((1, 6, 3), (1, 2, 6)))
    with pytest.raises(KilnError, match="NonMaxSuppression node 'nms'.*one value"):
        prepare(_model((1, 6, 4), (1, 2, 6), scalar_shape=(2,)))
    with pytest.raises(KilnError, match="NonMaxSuppression node 'nms'"):
        prepare(_model((1, 6, 4), (1, 2, 5)))
