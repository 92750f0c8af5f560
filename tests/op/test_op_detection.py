"""Numerics of ``non_max_suppression`` (kiln/op/detection.py) against ``onnx.reference``.

The op gets each (batch, class) line of scores sorted by ``topk`` (as the ONNX converter does)
and returns the selected box indices per line, -1 padded; ``onnx.reference``'s
NonMaxSuppression rows (batch, class, box) are packed the same way to compare.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln import graph as g
from kiln import op
from kiln.ir.errors import KilnError, StructInfoError

RNG = np.random.default_rng(5)


def _build(b, c, n, dtype="float32", **attrs):
    boxes = g.Var("boxes", g.TensorStructInfo((b, n, 4), dtype))
    scores = g.Var("scores", g.TensorStructInfo((b, c, n), dtype))
    max_out = g.Var("max_out", g.TensorStructInfo((), "int64"))
    iou = g.Var("iou", g.TensorStructInfo((), dtype))
    thr = g.Var("thr", g.TensorStructInfo((), dtype))
    bb = g.BlockBuilder()
    with bb.function("main", [boxes, scores, max_out, iou, thr]):
        with bb.dataflow():
            out = bb.emit_output(op.non_max_suppression(boxes, scores, max_out, iou, thr,
                                                        **attrs))
        bb.emit_func_output(out)
    mod = bb.get()
    kiln.graph.well_formed(mod)
    return kiln.build(mod)


def _reference(boxes, scores, max_out, iou, thr, center=0, use_thr=True):
    """onnx.reference's selection, packed per (batch, class) line and -1 padded."""
    names = ["boxes", "scores", "max_out", "iou", "thr"][:5 if use_thr else 4]
    node = helper.make_node("NonMaxSuppression", names, ["y"], center_point_box=center)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(
        n, TensorProto.UNDEFINED, None) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)])
    feeds = [boxes.astype(np.float32), scores.astype(np.float32), np.array([max(max_out, 0)]),
             np.array([iou], np.float32), np.array([thr], np.float32)]
    (rows,) = ReferenceEvaluator(helper.make_model(graph)).run(None, dict(zip(names, feeds)))
    b, c, n = scores.shape
    out = np.full((b, c, n), -1, np.int64)
    for bi, ci, box in rows.reshape(-1, 3):
        line = out[bi, ci]
        line[np.argmax(line < 0)] = box
    return out


def _corner_boxes(b, n):
    p = RNG.random((b, n, 4)).astype("float32")  # either diagonal order
    p.reshape(-1, 4)[::5, 2] = p.reshape(-1, 4)[::5, 0]  # zero-area boxes
    return p


@pytest.mark.parametrize("levels", [None, 3])
def test_corner_boxes_match_onnx_reference(levels):
    b, c, n = 2, 5, 33
    exe = _build(b, c, n)
    boxes = _corner_boxes(b, n)
    scores = RNG.random((b, c, n)).astype("float32")
    if levels:  # ties: the lower box index goes first
        scores = (np.floor(scores * levels) / levels).astype("float32")
    for max_out, iou, thr in ((4, 0.3, 0.1), (50, 0.5, 0.0), (2, 0.0, 0.7), (0, 0.5, 0.0),
                              (-3, 0.5, 0.0), (33, 1.0, -1.0)):
        got = exe(boxes, scores, np.array(max_out), np.float32(iou), np.float32(thr))
        np.testing.assert_array_equal(got, _reference(boxes, scores, max_out, iou, thr))


def test_many_boxes_deep_heap():
    """Hundreds of boxes per line: the in-kernel heap is several levels deep."""
    b, c, n = 1, 3, 300
    exe = _build(b, c, n)
    xy = RNG.random((b, n, 2)).astype("float32")
    boxes = np.concatenate([xy, xy + RNG.random((b, n, 2)).astype("float32") * 0.2], -1)
    scores = (np.floor(RNG.random((b, c, n)) * 50) / 50).astype("float32")
    for max_out, iou, thr in ((300, 0.3, 0.0), (40, 0.6, 0.5)):
        got = exe(boxes, scores, np.array(max_out), np.float32(iou), np.float32(thr))
        np.testing.assert_array_equal(got, _reference(boxes, scores, max_out, iou, thr))


def test_center_boxes_without_score_threshold():
    b, c, n = 1, 4, 20
    exe = _build(b, c, n, center_point_box=True, use_score_threshold=False)
    boxes = np.concatenate([RNG.random((b, n, 2)), RNG.random((b, n, 2)) * 0.4], -1)
    boxes = boxes.astype("float32")
    boxes[0, ::4, 3] = 0  # zero height
    scores = RNG.standard_normal((b, c, n)).astype("float32")  # negative scores are kept too
    for max_out, iou in ((5, 0.2), (20, 0.6)):
        got = exe(boxes, scores, np.array(max_out), np.float32(iou), np.float32(99))
        np.testing.assert_array_equal(
            got, _reference(boxes, scores, max_out, iou, 99, center=1, use_thr=False))


def test_float64_boxes():
    b, c, n = 1, 2, 16
    exe = _build(b, c, n, dtype="float64")
    boxes = _corner_boxes(b, n).astype("float64")
    scores = RNG.random((b, c, n))
    got = exe(boxes, scores, np.array(16), np.float64(0.25), np.float64(0.2))
    np.testing.assert_array_equal(got, _reference(boxes, scores, 16, 0.25, 0.2))


def _infer(*args, **attrs):
    params = [a for a in args if isinstance(a, g.Var)]
    bb = g.BlockBuilder()
    with bb.function("f", list(dict.fromkeys(params))):
        bb.emit(op.non_max_suppression(*args, **attrs))


def test_inputs_are_checked():
    def var(name, shape, dtype="float32"):
        return g.Var(name, g.TensorStructInfo(shape, dtype))

    boxes, m, t = var("boxes", (1, 6, 4)), var("m", (), "int64"), var("t", ())
    scores = var("scores", (1, 2, 6))
    with pytest.raises(StructInfoError, match="non_max_suppression: boxes must be"):
        _infer(boxes, var("s5", (1, 2, 5)), m, t, t)
    with pytest.raises(StructInfoError, match="iou_threshold must be a 0-d float32"):
        _infer(boxes, scores, m, var("t1", (1,)), t)
    with pytest.raises(StructInfoError, match="max_output must be a 0-d int64"):
        _infer(boxes, scores, var("m32", (), "int32"), t, t)
    with pytest.raises(StructInfoError, match="float tensors of one dtype"):
        _infer(boxes, var("s64", (1, 2, 6), "float64"), m, t, t)
    with pytest.raises(KilnError, match="center_point_box must be a bool"):
        op.non_max_suppression(boxes, scores, m, t, t, center_point_box=1)
