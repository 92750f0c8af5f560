"""ONNX image operators (converters/image.py): Resize, Upsample, GridSample, AffineGrid,
CenterCropPad, RoiAlign against onnx.reference / onnxruntime on random inputs.

Many nodes share one model, so each model is compiled once.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.errors import KilnError

RNG = np.random.default_rng(5)


def _model(nodes, inputs, inits, outputs, opset, out_type=TensorProto.UNDEFINED):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, out_type, None) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run_kiln(model, feeds):
    mod, params = from_onnx(model)
    out = kiln.build(mod, params=params)(**feeds)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _f32(*values):
    return np.array(values, "float32")


def _i64(*values):
    return np.array(values, "int64")


# (attributes, scales, sizes, roi, axes): one Resize node each, on x of shape (1, 2, 5, 6)
RESIZES = [
    ({}, _f32(1, 1, 2, 1.5), None, None),
    ({"nearest_mode": "floor", "coordinate_transformation_mode": "align_corners"}, None,
     _i64(1, 2, 3, 4), None),
    ({"nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric"},
     None, _i64(1, 2, 8, 9), None),
    ({"nearest_mode": "ceil", "coordinate_transformation_mode": "pytorch_half_pixel"}, None,
     _i64(1, 2, 7, 1), None),
    ({"mode": "linear"}, _f32(1, 1, 0.6, 1.7), None, None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, None,
     _i64(1, 2, 8, 4), None),
    ({"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}, None,
     _i64(1, 2, 3, 1), None),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
     _f32(1, 1, 1.7, 0.7), None, None),
    ({"mode": "cubic", "coordinate_transformation_mode": "asymmetric"}, _f32(1, 1, 1.4, 2),
     None, None),
    ({"mode": "cubic", "exclude_outside": 1, "cubic_coeff_a": -0.5}, _f32(1, 1, 0.7, 1.3),
     None, None),
    ({"mode": "linear", "antialias": 1}, None, _i64(1, 2, 3, 2), None),
    ({"mode": "cubic", "antialias": 1}, _f32(1, 1, 0.45, 0.6), None, None),
    ({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 10.0, "axes": [3, 2]}, None, _i64(5, 4),
     _f32(0.1, 0.2, 1.2, 0.9)),
    ({"axes": [2, 3], "keep_aspect_ratio_policy": "not_smaller"}, None, _i64(7, 7), None),
    ({"mode": "cubic", "axes": [3], "keep_aspect_ratio_policy": "not_larger"}, None, _i64(4),
     None),
]


def test_resize_opset19_matches_onnx_reference():
    x = RNG.standard_normal((1, 2, 5, 6)).astype("float32")
    xu = RNG.integers(0, 256, (1, 1, 4, 4)).astype("uint8")
    nodes, inits, outs = [], {}, []
    for k, (attrs, scales, sizes, roi) in enumerate(RESIZES):
        names = ["x", "", "", ""]
        for j, (tag, v) in ((1, ("roi", roi)), (2, ("scales", scales)), (3, ("sizes", sizes))):
            if v is not None:
                names[j] = f"{tag}{k}"
                inits[names[j]] = v
        while names[-1] == "":
            names.pop()
        nodes.append(helper.make_node("Resize", names, [f"y{k}"], **attrs))
        outs.append(f"y{k}")
    inits["su"] = _f32(1, 1, 1.5, 1.75)
    nodes.append(helper.make_node("Resize", ["xu", "", "su"], ["yu"], mode="linear"))
    outs.append("yu")
    model = _model(nodes, {"x": x, "xu": xu}, inits, outs, 19)
    want = ReferenceEvaluator(model).run(None, {"x": x, "xu": xu})
    got = _run_kiln(model, {"x": x, "xu": xu})
    for k, (g, w) in enumerate(zip(got[:-1], want[:-1])):
        assert g.shape == w.shape, (k, RESIZES[k])
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=str(RESIZES[k]))
    assert got[-1].dtype == np.uint8 and got[-1].shape == want[-1].shape
    # float32 accumulation may flip a rounding at an exact half
    assert np.max(np.abs(got[-1].astype(int) - want[-1].astype(int))) <= 1


def test_resize_opset10_and_upsample_match_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    x = RNG.standard_normal((1, 2, 4, 6)).astype("float32")
    cases = [
        (10, "Resize", {"mode": "nearest"}, _f32(1, 1, 2, 1.5)),
        (10, "Resize", {"mode": "nearest"}, _f32(1, 1, 0.5, 0.7)),
        (10, "Resize", {"mode": "linear"}, _f32(1, 1, 1.5, 0.6)),
        (9, "Upsample", {"mode": "nearest"}, _f32(1, 1, 2, 3)),
        (9, "Upsample", {"mode": "linear"}, _f32(1, 1, 2.5, 1.5)),
        (7, "Upsample", {"mode": "linear", "scales": [1.0, 1.0, 2.0, 1.5]}, None),
    ]
    for opset, op_type, attrs, scales in cases:
        ins, inits = ["x"], {}
        if scales is not None:
            ins.append("s")
            inits["s"] = scales
        model = _model([helper.make_node(op_type, ins, ["y"], **attrs)], {"x": x}, inits,
                       ["y"], opset, TensorProto.FLOAT)
        sess = ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        (got,) = _run_kiln(model, {"x": x})
        assert got.shape == want.shape, (opset, op_type, attrs, scales)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{op_type}-{opset} {attrs} {scales}")


def test_grid_affine_crop_roi_match_onnx_reference():
    x = RNG.standard_normal((2, 3, 5, 6)).astype("float32")
    grid = RNG.uniform(-1.2, 1.2, (2, 4, 3, 2)).astype("float32")
    theta = RNG.standard_normal((2, 2, 3)).astype("float32")
    theta3 = RNG.standard_normal((1, 3, 4)).astype("float32")
    rois = _f32(0, 0, 4, 3, 1.5, 0.5, 5.5, 4.5, -1, 2, 3, 7).reshape(3, 4)
    inits = {"size": _i64(2, 3, 4, 5), "size3": _i64(1, 1, 2, 3, 4), "crop": _i64(3, 9),
             "crop1": _i64(4), "bidx": _i64(1, 0, 1)}
    nodes = [
        helper.make_node("GridSample", ["x", "grid"], ["gs"], mode="cubic",
                         padding_mode="border", align_corners=1),
        helper.make_node("AffineGrid", ["theta", "size"], ["ag"]),
        helper.make_node("AffineGrid", ["theta3", "size3"], ["ag3"], align_corners=1),
        helper.make_node("CenterCropPad", ["x", "crop"], ["ccp"], axes=[2, -1]),
        helper.make_node("CenterCropPad", ["x", "crop1"], ["ccp1"], axes=[1]),
        helper.make_node("RoiAlign", ["x", "rois", "bidx"], ["ra"], output_height=3,
                         output_width=2, sampling_ratio=2, spatial_scale=0.8),
    ]
    outs = ["gs", "ag", "ag3", "ccp", "ccp1", "ra"]
    feeds = {"x": x, "grid": grid, "theta": theta, "theta3": theta3, "rois": rois}
    model = _model(nodes, feeds, inits, outs, 20)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = _run_kiln(model, feeds)
    for name, g, w in zip(outs, got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=name)


def test_errors_name_the_node():
    x = np.zeros((1, 1, 4, 4), "float32")
    rois, bidx = np.zeros((1, 4), "float32"), np.zeros((1,), "int64")
    ra = helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], name="pool")
    model = _model([ra], {"x": x, "r": rois, "b": bidx}, {}, ["y"], 16)
    with pytest.raises(KilnError, match=r"RoiAlign node 'pool'.*sampling_ratio"):
        from_onnx(model)
    rs = helper.make_node("Resize", ["x", "", "s"], ["y"], name="up")
    model = _model([rs], {"x": x}, {"s": _f32(1, 1, 2, 2)}, ["y"], 13)
    with pytest.raises(KilnError, match=r"Resize node 'up'.*static lengths"):
        from_onnx(model, shape_dict={"x": [1, 1, "h", 4]})
    model = _model([helper.make_node("Resize", ["x", "", "s", "z"], ["y"], name="both")],
                   {"x": x}, {"s": _f32(1, 1, 2, 2), "z": _i64(1, 1, 8, 8)}, ["y"], 13)
    with pytest.raises(KilnError, match=r"Resize node 'both'.*exactly one"):
        from_onnx(model)
    assert onnx.defs.has("CenterCropPad")


def test_roi_align_batch_indices_are_checked():
    """One batch index per region, each naming an image of x: a count that differs from the
    rois' is refused when the model is compiled (static) or run (symbolic), an index outside
    [0, N) fails the run -- both naming the node (was: regions read past batch_indices, and an
    out-of-range index silently clamped to the nearest image)."""
    x = RNG.standard_normal((2, 3, 6, 6)).astype("float32")
    rois = np.array([[0, 0, 4, 4], [1, 1, 5, 3], [0, 2, 3, 5]], "float32")
    bidx = np.array([1, 0, 1], "int64")
    node = helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], name="pool", output_height=2,
                            output_width=2, sampling_ratio=2)
    model = _model([node], {"x": x, "r": rois, "b": bidx[:2]}, {}, ["y"], 16)
    with pytest.raises(KilnError, match=r"RoiAlign node 'pool'.*one image per region"):
        from_onnx(model)
    model = _model([node], {"x": x, "r": rois, "b": bidx}, {}, ["y"], 16)
    mod, params = from_onnx(model, shape_dict={"r": ["R", 4], "b": ["B"]})
    exe = kiln.build(mod, params=params)
    want = ReferenceEvaluator(model).run(None, {"x": x, "r": rois, "b": bidx})[0]
    np.testing.assert_allclose(exe(x=x, r=rois, b=bidx), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(KilnError, match="one image per region"):
        exe(x=x, r=rois, b=bidx[:2])
    with pytest.raises(KilnError, match=r"pool.*batch_indices.*index 2 is out of range"):
        exe(x=x, r=rois, b=np.array([1, 2, 0], "int64"))
    huge = helper.make_node("RoiAlign", ["x", "r", "b"], ["y"], name="pool", sampling_ratio=10**6)
    with pytest.raises(KilnError, match=r"RoiAlign node 'pool'.*sampling_ratio 1000000"):
        from_onnx(_model([huge], {"x": x, "r": rois, "b": bidx}, {}, ["y"], 16))
