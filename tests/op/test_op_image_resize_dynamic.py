"""Resize with run-time scales (kiln/op/image.py ``image.resize_axis`` and
``image.resize_axis_antialias``; ``kiln.runtime.shape_funcs`` ``resize`` / ``resize_taps``):
inference, errors, and numerics of one axis against onnx.reference on random inputs, each graph
compiled once and run at several scales."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir.errors import ArgumentError, KilnError, StructInfoError
from kiln.op.registry import get_op_def
from kiln.runtime import shape_funcs
from kiln.testing.op_testing import dims, infer, tvar

RNG = np.random.default_rng(31)
SHAPE = (2, 3, 5, 7)


def _reference(x, axis, scale, roi, **attrs):
    """onnx.reference Resize-19 of ``x`` along ``axis`` by ``scale`` (float32)."""
    names = ["x", "roi", "s"]
    node = helper.make_node("Resize", names, ["y"], axes=[axis], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
         helper.make_tensor_value_info("roi", TensorProto.FLOAT, (2,)),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, (1,))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return ReferenceEvaluator(model).run(None, {"x": x, "roi": roi,
                                                "s": np.array([scale], "float32")})[0]


def _build(axis, antialias=False, **attrs):
    """main(x, s: float64 (1,), roi: float32 (2,)): one resize_axis with run-time length."""
    x = g.Var("x", g.TensorStructInfo(SHAPE, "float32"))
    s = g.Var("s", g.TensorStructInfo((1,), "float64"))
    roi = g.Var("roi", g.TensorStructInfo((2,), "float32"))
    bb = g.BlockBuilder()
    how = [g.ShapeExpr(SHAPE), s, g.ShapeExpr((axis,)), g.PrimValue(0), g.PrimValue(0)]

    def runtime_dims(fn, args, ndim, hint):
        call = g.Call(g.ExternFunc(shape_funcs.PREFIX + fn), args,
                      sinfo_args=[g.ShapeStructInfo(ndim=ndim)])
        out = tuple(tir.Var(f"{hint}{i}", "int64") for i in range(ndim))
        bb.match_cast(bb.emit(call), g.ShapeStructInfo(out))
        return out

    with bb.function("main", [x, s, roi]):
        with bb.dataflow():
            shape = runtime_dims("resize", how, len(SHAPE), "d")
            if antialias:
                support = g.PrimValue(1 if attrs["mode"] == "linear" else 2)
                (t,) = runtime_dims("resize_taps", [*how, support], 1, "t")
                taps = bb.emit(op.broadcast_to(g.const(np.zeros((), np.int8)), (t,)))
                y = op.image.resize_axis_antialias(x, s, roi, taps, axis=axis, slot=0,
                                                   length=shape[axis], **attrs)
            else:
                y = op.image.resize_axis(x, s, roi, axis=axis, slot=0, length=shape[axis],
                                         **attrs)
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    kiln.graph.well_formed(mod)
    return kiln.build(mod)


CASES = [
    (2, {"mode": "nearest"}),
    (3, {"mode": "nearest", "nearest_mode": "ceil", "coord": "asymmetric"}),
    (3, {"mode": "nearest", "nearest_mode": "simple", "coord": "asymmetric"}),
    (2, {"mode": "linear", "coord": "align_corners"}),
    (3, {"mode": "linear", "coord": "tf_crop_and_resize", "extrapolation_value": -3.0}),
    (3, {"mode": "cubic", "cubic_a": -0.5, "exclude_outside": True}),
    (1, {"mode": "cubic", "coord": "half_pixel_symmetric"}),
]
_ONNX_NAMES = {"coord": "coordinate_transformation_mode", "cubic_a": "cubic_coeff_a"}


def _onnx_attrs(attrs, scale):
    out = {_ONNX_NAMES.get(k, k): (int(v) if isinstance(v, bool) else v)
           for k, v in attrs.items()}
    if out.get("nearest_mode") == "simple":  # Resize-10: floor up, ceil down
        out["nearest_mode"] = "ceil" if scale < 1 else "floor"
    return out


@pytest.mark.parametrize("axis,attrs", CASES)
def test_resize_axis_matches_onnx_reference_at_several_scales(axis, attrs):
    exe = _build(axis, **attrs)
    roi = np.array([-0.2, 0.9], "float32")
    for scale in (2.5, 0.75, 1.0, 0.4):
        x = RNG.standard_normal(SHAPE).astype("float32")
        got = exe(x, np.array([scale]), roi)
        want = _reference(x, axis, scale, roi, **_onnx_attrs(attrs, scale))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_axis_antialias_matches_onnx_reference(mode):
    exe = _build(3, antialias=True, mode=mode)
    roi = np.array([0.0, 1.0], "float32")
    for scale in (0.3, 0.6, 1.0, 1.75):  # 14, 8, 4 and 4 taps for linear
        x = RNG.standard_normal(SHAPE).astype("float32")
        got = exe(x, np.array([scale]), roi)
        want = _reference(x, 3, scale, roi, mode=mode, antialias=1)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_resize_axis_inference_and_errors():
    assert get_op_def("image.resize_axis") is op.image.resize_axis
    assert get_op_def("image.resize_axis_antialias") is op.image.resize_axis_antialias
    x, s, roi = tvar("x", (2, 3, 5, 7)), tvar("s", (2,), "float64"), tvar("r", (4,))
    n = tir.Var("n", "int64")
    assert dims(infer(op.image.resize_axis(x, s, roi, axis=3, slot=1, length=n))) == (2, 3, 5, n)
    assert dims(infer(op.image.resize_axis(x, s, roi, axis=2, slot=0, length=9))) == (2, 3, 9, 7)
    with pytest.raises(StructInfoError, match="scales must be a 1-d float64"):
        infer(op.image.resize_axis(x, tvar("s", (2,)), roi, axis=3, slot=0, length=n))
    with pytest.raises(StructInfoError, match="above slot 2"):
        infer(op.image.resize_axis(x, s, roi, axis=3, slot=2, length=n))
    with pytest.raises(StructInfoError, match="roi must be a float tensor of 4"):
        infer(op.image.resize_axis(x, s, tvar("r", (2,)), axis=3, slot=0, length=n))
    with pytest.raises(StructInfoError, match="needs a numeric input"):
        infer(op.image.resize_axis(tvar("b", (2, 3), "bool"), s, roi, axis=1, length=n,
                                   mode="linear"))
    taps = tvar("t", (n,), "int8")
    with pytest.raises(StructInfoError, match="linear and cubic"):
        infer(op.image.resize_axis_antialias(x, s, roi, taps, axis=3, length=n))
    assert dims(infer(op.image.resize_axis_antialias(x, s, roi, taps, axis=3, length=n,
                                                     mode="cubic"))) == (2, 3, 5, n)
    with pytest.raises(KilnError, match="unknown coordinate mode"):
        op.image.resize_axis(x, s, roi, axis=3, length=n, coord="corners")
    with pytest.raises(KilnError, match="length must be"):
        op.image.resize_axis(x, s, roi, axis=3, length=2.5)


def test_resize_shape_functions():
    run = shape_funcs.run
    f32 = np.array([1, 1, 2.5, 0.6], "float32")
    assert run("resize", [(1, 2, 5, 7), f32, (0, 1, 2, 3), 0, 0]) == (1, 2, 12, 4)
    assert run("resize", [(1, 2, 5, 7), np.array([3, 9]), (3, 2), 1, 0]) == (1, 2, 9, 3)
    # keep_aspect_ratio_policy: one scale, round half up
    assert run("resize", [(1, 2, 4, 8), np.array([6, 6]), (2, 3), 1, 1]) == (1, 2, 3, 6)
    assert run("resize", [(1, 2, 4, 8), np.array([6, 6]), (2, 3), 1, 2]) == (1, 2, 6, 12)
    # antialias taps: 2 * ceil(support / min(scale, 1))
    assert run("resize_taps", [(1, 2, 4, 8), f32[2:], (2, 3), 0, 0, 1]) == (2, 4)
    assert run("resize_taps", [(1, 2, 4, 8), f32[2:], (2, 3), 0, 0, 2]) == (4, 8)
    with pytest.raises(ValueError, match="must be positive"):
        run("resize", [(1, 2, 4, 8), np.array([1.0, 0.1]), (2, 3), 0, 0])
    with pytest.raises(ValueError, match="2 entries for 1"):
        run("resize", [(1, 2, 4, 8), np.array([1.0, 2.0]), (2,), 0, 0])


def test_resize_axis_rejects_bad_scales_at_run_time():
    exe = _build(2, mode="linear")
    x = RNG.standard_normal(SHAPE).astype("float32")
    roi = np.array([0, 1], "float32")
    with pytest.raises(ArgumentError, match="scales must be positive"):
        exe(x, np.array([-1.0]), roi)
