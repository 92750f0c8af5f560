"""ONNX Resize / Upsample whose scales, sizes or roi are graph inputs (known only at run time):
the converter's run-time path (``resize_rt``: the ``resize`` shape function and
``image.resize_axis`` kernels) against onnx.reference on random inputs, each model compiled
once and run with several values.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.errors import KilnError

RNG = np.random.default_rng(23)


def _model(nodes, inputs, outputs, opset):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in inputs.items()],
        [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _compile(model):
    mod, params = from_onnx(model)
    return kiln.build(mod, params=params)


def _check(exe, model, feeds, rtol=1e-4, atol=1e-5, ref_model=None):
    got = exe(**feeds)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    want = ReferenceEvaluator(ref_model or model).run(None, feeds)
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        a = np.asarray(a)
        assert a.shape == b.shape, (k, model.graph.node[k].attribute, a.shape, b.shape)
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol,
                                   err_msg=f"output {k}: {model.graph.node[k].attribute}")


# attributes of Resize-19 nodes fed by the run-time scales "S" (4,)
BY_SCALES = [
    {},
    {"nearest_mode": "round_prefer_ceil", "coordinate_transformation_mode": "asymmetric"},
    {"nearest_mode": "ceil", "coordinate_transformation_mode": "pytorch_half_pixel"},
    {"nearest_mode": "floor", "coordinate_transformation_mode": "align_corners"},
    {"mode": "linear"},
    {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
    {"mode": "linear", "antialias": 1},
    {"mode": "cubic"},
    {"mode": "cubic", "cubic_coeff_a": -0.5, "exclude_outside": 1},
    {"mode": "cubic", "antialias": 1, "exclude_outside": 1},
]
# attributes of nodes fed by the run-time sizes "Z" (4,) and roi "R" (8,)
BY_SIZES = [
    {"mode": "linear"},
    {"mode": "nearest", "coordinate_transformation_mode": "half_pixel_symmetric"},
    {"mode": "cubic", "antialias": 1},
    {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
     "extrapolation_value": 7.5},
    {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize"},
]


def test_resize_runtime_scales_and_sizes_two_runs_one_executable():
    x = RNG.standard_normal((1, 2, 5, 6)).astype("float32")
    feeds0 = {"X": x, "S": np.zeros(4, "float32"), "Z": np.zeros(4, "int64"),
              "R": np.zeros(8, "float32")}
    nodes = [helper.make_node("Resize", ["X", "", "S"], [f"s{k}"], name=f"s{k}", **a)
             for k, a in enumerate(BY_SCALES)]
    nodes += [helper.make_node("Resize", ["X", "R", "", "Z"], [f"z{k}"], name=f"z{k}", **a)
              for k, a in enumerate(BY_SIZES)]
    model = _model(nodes, feeds0, [n.output[0] for n in nodes], 19)
    exe = _compile(model)
    runs = [
        (np.array([1, 1, 2.0, 1.5], "float32"), np.array([1, 2, 9, 4], "int64"),
         np.array([0, 0, 0.2, -0.3, 1, 1, 0.9, 1.4], "float32")),
        (np.array([1, 2, 0.6, 0.45], "float32"), np.array([1, 1, 3, 11], "int64"),
         np.array([0, 0, -0.1, 0.1, 1, 1, 0.7, 0.8], "float32")),
    ]
    for scales, sizes, roi in runs:
        x = RNG.standard_normal((1, 2, 5, 6)).astype("float32")
        _check(exe, model, {"X": x, "S": scales, "Z": sizes, "R": roi})


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_runtime_axes_and_keep_aspect_ratio(policy):
    x = RNG.standard_normal((2, 3, 4, 7)).astype("float32")
    feeds = {"X": x, "Z": np.array([9, 5], "int64"), "S": np.array([0.5, 2.5], "float32")}
    nodes = [
        helper.make_node("Resize", ["X", "", "", "Z"], ["a"], mode="linear", axes=[3, 2],
                         keep_aspect_ratio_policy=policy),
        helper.make_node("Resize", ["X", "", "S"], ["b"], mode="nearest", axes=[3, 1]),
    ]
    model = _model(nodes, feeds, ["a", "b"], 19)
    exe = _compile(model)
    _check(exe, model, feeds)
    _check(exe, model, {"X": x, "Z": np.array([3, 2], "int64"),
                        "S": np.array([1.5, 1.0], "float32")})


def test_resize_runtime_integer_input_rounds_and_saturates():
    x = RNG.integers(0, 256, size=(1, 1, 4, 5)).astype("uint8")
    feeds = {"X": x, "S": np.array([1, 1, 1.7, 0.8], "float32")}
    nodes = [helper.make_node("Resize", ["X", "", "S"], ["y"], mode="cubic")]
    model = _model(nodes, feeds, ["y"], 19)
    exe = _compile(model)
    _check(exe, model, feeds, rtol=0, atol=0)
    _check(exe, model, {"X": x, "S": np.array([1, 1, 2.5, 3.0], "float32")}, rtol=0, atol=0)


@pytest.mark.parametrize("op_type,opset", [("Upsample", 9), ("Resize", 10)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample_and_resize10_runtime_scales(op_type, opset, mode):
    """Checked against the equivalent Resize-19 (asymmetric coordinates; nearest rounds down
    when upsampling, up when downsampling), which onnx.reference implements."""
    x = RNG.standard_normal((1, 2, 3, 4)).astype("float32")
    feeds = {"X": x, "S": np.array([1, 1, 2.0, 1.5], "float32")}
    model = _model([helper.make_node(op_type, ["X", "S"], ["y"], mode=mode)], feeds, ["y"],
                   opset)
    exe = _compile(model)
    for scales, rounding in (([1, 1, 2.0, 1.5], "floor"), ([1, 1, 0.5, 0.75], "ceil")):
        ref = _model([helper.make_node("Resize", ["X", "", "S"], ["y"], mode=mode,
                                       coordinate_transformation_mode="asymmetric",
                                       nearest_mode=rounding)], feeds, ["y"], 19)
        _check(exe, model, {"X": x, "S": np.array(scales, "float32")}, ref_model=ref)


def test_resize_runtime_bad_values_raise_clear_errors():
    x = RNG.standard_normal((1, 1, 4, 4)).astype("float32")
    feeds = {"X": x, "S": np.array([1, 1, 2, 2], "float32")}
    model = _model([helper.make_node("Resize", ["X", "", "S"], ["y"], name="rs")], feeds, ["y"],
                   19)
    exe = _compile(model)
    with pytest.raises(KilnError, match="must be positive"):
        exe(X=x, S=np.array([1, 1, 0.1, 2], "float32"))  # floor(0.4) = 0 rows
    with pytest.raises(KilnError, match="scales must be positive"):
        exe(X=x, S=np.array([1, 1, -2, 2], "float32"))
    bad = _model([helper.make_node("Resize", ["X", "", "S"], ["y"], name="rs")],
                 {"X": x, "S": np.ones(3, "float32")}, ["y"], 19)
    with pytest.raises(KilnError, match="'rs'.*must have 4 entries"):
        from_onnx(bad)


def test_resize_runtime_symbolic_input_shape_and_float16():
    """Input lengths known only at run time too (sizes -> scale = out / in read from the
    input's shape); float16 is interpolated in float32 and rounded once."""
    nodes = [helper.make_node("Resize", ["X", "", "", "Z"], ["a"], mode="linear", axes=[2, 3],
                              keep_aspect_ratio_policy="not_larger"),
             helper.make_node("Resize", ["X", "", "S"], ["b"], mode="cubic")]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT16, [1, 2, "H", "W"]),
         helper.make_tensor_value_info("Z", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("S", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT16, None) for o in ("a", "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    exe = _compile(model)
    for hw, sizes, scales in (((4, 5), [7, 9], [1, 1, 1.5, 0.7]),
                              ((6, 3), [2, 8], [1, 2, 0.5, 2.0])):
        feeds = {"X": RNG.standard_normal((1, 2, *hw)).astype("float16"),
                 "Z": np.array(sizes, "int64"), "S": np.array(scales, "float32")}
        _check(exe, model, feeds, rtol=1e-3, atol=1e-3)


def test_resize_opset11_empty_scales_input_with_constant_sizes():
    """A graph-input scales of static length 0 is an absent input: constant sizes keep the
    import-time tables."""
    x = RNG.standard_normal((1, 1, 3, 4)).astype("float32")
    node = helper.make_node("Resize", ["X", "R", "S", "Z"], ["y"], mode="linear")
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, x.shape),
         helper.make_tensor_value_info("R", TensorProto.FLOAT, [0]),
         helper.make_tensor_value_info("S", TensorProto.FLOAT, [0])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("Z", TensorProto.INT64, [4], [1, 1, 5, 7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    mod, params = from_onnx(model)
    assert "resize_axis" not in str(mod)  # the constant path
    got = kiln.build(mod, params=params)(X=x, R=np.zeros(0, "float32"),
                                         S=np.zeros(0, "float32"))
    want = ReferenceEvaluator(model).run(None, {"X": x, "R": np.zeros(0, "float32"),
                                                "S": np.zeros(0, "float32")})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
