"""Image operators (kiln/op/image.py): inference, errors, and numerics against numpy and the
ONNX reference implementation (``onnx.reference``) on random inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from kiln import op
from kiln.ir.errors import KilnError, StructInfoError
from kiln.testing.op_testing import check, dims, infer, run_cases, tvar

RNG = np.random.default_rng(11)


def _onnx_ref(op_type: str, inputs: list[np.ndarray], opset: int, **attrs) -> np.ndarray:
    """One-node model evaluated by onnx.reference."""
    names = [f"i{k}" for k in range(len(inputs))]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
         for n, a in zip(names, inputs)],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return ReferenceEvaluator(model).run(None, dict(zip(names, inputs)))[0]


# ---------------------------------------------------------------------------------------------
# resample
# ---------------------------------------------------------------------------------------------
def _resample_ref(x, index, weight, axis):
    gathered = np.take(x.astype(np.float64), np.clip(index, 0, x.shape[axis] - 1), axis=axis)
    w = weight.reshape((1,) * axis + weight.shape + (1,) * (x.ndim - axis - 1))
    return (gathered * w).sum(axis=axis + 1)


def test_resample_inference_and_errors():
    x = tvar("x", (2, 3, 8, 5))
    idx, w = tvar("i", (11, 4), "int64"), tvar("w", (11, 4))
    assert dims(infer(op.resample(x, idx, w, axis=2))) == (2, 3, 11, 5)
    assert dims(infer(op.resample(x, idx, w, axis=-1))) == (2, 3, 8, 11)
    with pytest.raises(StructInfoError, match="index must be an integer"):
        infer(op.resample(x, w, w, axis=2))
    with pytest.raises(StructInfoError, match="differ in shape"):
        infer(op.resample(x, idx, tvar("w", (11, 3)), axis=2))
    with pytest.raises(StructInfoError, match="out_len, taps"):
        infer(op.resample(x, tvar("i", (11,), "int64"), tvar("w", (11,)), axis=2))
    with pytest.raises(KilnError, match="axis must be an int"):
        op.resample(x, idx, w, axis="2")


def test_resample_numerics_float_and_saturating_int():
    x = RNG.standard_normal((2, 3, 6, 5)).astype("float32")
    idx = RNG.integers(-2, 8, size=(9, 3)).astype("int64")  # out of range: clamped
    w = RNG.uniform(-0.5, 1.5, size=(9, 3))
    xi = RNG.integers(0, 256, size=(2, 7, 4)).astype("uint8")
    ii = RNG.integers(0, 4, size=(5, 2)).astype("int64")
    wi = RNG.uniform(-0.6, 1.6, size=(5, 2)).astype("float32")
    cases = [
        ("image.resample", [x, idx, w.astype("float32")], {"axis": 2}),
        ("image.resample", [x.astype("float64"), idx, w], {"axis": -1}),
        ("image.resample", [xi, ii, wi], {"axis": 2}),
    ]
    got = run_cases(cases)
    check(got[0], _resample_ref(x, idx, w.astype("float32"), 2), rtol=1e-5)
    check(got[1], _resample_ref(x.astype("float64"), idx, w, 3), rtol=1e-12)
    want = np.clip(np.round(_resample_ref(xi, ii, wi.astype(np.float64), 2)), 0, 255)
    assert got[2].dtype == np.uint8
    # float32 accumulation: allow a rounding flip at exact halves
    assert np.max(np.abs(got[2].astype(int) - want.astype(int))) <= 1
    assert np.mean(got[2] == want) > 0.95


# ---------------------------------------------------------------------------------------------
# grid_sample
# ---------------------------------------------------------------------------------------------
def test_grid_sample_inference_and_errors():
    x = tvar("x", (2, 3, 8, 5))
    assert dims(infer(op.grid_sample(x, tvar("g", (2, 4, 6, 2))))) == (2, 3, 4, 6)
    x3 = tvar("x", (1, 2, 4, 5, 6))
    assert dims(infer(op.grid_sample(x3, tvar("g", (1, 3, 4, 2, 3))))) == (1, 2, 3, 4, 2)
    with pytest.raises(StructInfoError, match="grid must be"):
        infer(op.grid_sample(x, tvar("g", (2, 4, 6, 3))))
    with pytest.raises(StructInfoError, match="batch size"):
        infer(op.grid_sample(x, tvar("g", (3, 4, 6, 2))))
    with pytest.raises(StructInfoError, match="float"):
        infer(op.grid_sample(tvar("x", (2, 3, 8, 5), "int32"), tvar("g", (2, 4, 6, 2))))
    with pytest.raises(KilnError, match="mode must be"):
        op.grid_sample(x, tvar("g", (2, 4, 6, 2)), mode="bilinear")
    with pytest.raises(KilnError, match="padding_mode must be"):
        op.grid_sample(x, tvar("g", (2, 4, 6, 2)), padding_mode="wrap")


# every mode, padding and alignment at least once; the backend suite runs the 18 official
# cases (large per-tap expressions make these kernels slow to compile, so the list is short)
_GS_2D = [("nearest", "reflection", True), ("linear", "border", False),
          ("linear", "zeros", True), ("cubic", "reflection", False)]
_GS_3D = [("linear", "reflection", True)]


def test_grid_sample_matches_onnx_reference():
    x2 = RNG.standard_normal((2, 2, 4, 5)).astype("float32")
    g2 = RNG.uniform(-1.4, 1.4, size=(2, 3, 4, 2)).astype("float32")
    x3 = RNG.standard_normal((1, 2, 3, 4, 3)).astype("float32")
    g3 = RNG.uniform(-1.3, 1.3, size=(1, 2, 3, 2, 3)).astype("float32")
    combos = [(x2, g2, c) for c in _GS_2D] + [(x3, g3, c) for c in _GS_3D]
    cases = [("image.grid_sample", [x, g], {"mode": m, "padding_mode": p, "align_corners": a})
             for x, g, (m, p, a) in combos]
    for (x, g, (m, p, a)), got in zip(combos, run_cases(cases)):
        want = _onnx_ref("GridSample", [x, g], 22, mode=m, padding_mode=p,
                         align_corners=int(a))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{m} {p} {a}")


# ---------------------------------------------------------------------------------------------
# roi_align
# ---------------------------------------------------------------------------------------------
def test_roi_align_inference_and_errors():
    x = tvar("x", (2, 3, 8, 8))
    r, b = tvar("r", (5, 4)), tvar("b", (5,), "int64")
    assert dims(infer(op.roi_align(x, r, b, output_size=(3, 2), sampling_ratio=2))) == (
        5, 3, 3, 2)
    with pytest.raises(StructInfoError, match="rois must be"):
        infer(op.roi_align(x, tvar("r", (5, 5)), b, output_size=(3, 2)))
    with pytest.raises(StructInfoError, match="batch_indices must be an integer"):
        infer(op.roi_align(x, r, tvar("b", (5,)), output_size=(3, 2)))
    with pytest.raises(KilnError, match="sampling_ratio must be a positive"):
        op.roi_align(x, r, b, output_size=(3, 2), sampling_ratio=0)
    with pytest.raises(KilnError, match="mode must be"):
        op.roi_align(x, r, b, mode="sum")
    with pytest.raises(KilnError, match=r"sampling_ratio 1000000 asks for 1000000\*\*2"):
        op.roi_align(x, r, b, sampling_ratio=10**6)  # fuzz seed 3031165: ran for hours
    op.roi_align(x, r, b, sampling_ratio=1024)


def test_roi_align_matches_onnx_reference():
    x = RNG.standard_normal((2, 3, 9, 7)).astype("float32")
    rois = np.array([[0, 0, 6, 8], [1.5, 2.2, 5.1, 4.9], [-2, -3, 3, 4], [4, 5, 12, 15],
                     [3, 3, 3.2, 3.1]], "float32")
    bidx = np.array([0, 1, 1, 0, 1], "int64")
    variants = [("avg", True, 2, 1.0, (3, 2)), ("avg", False, 1, 0.5, (2, 3)),
                ("max", False, 2, 1.0, (3, 3)), ("max", True, 3, 0.75, (2, 2))]
    cases = [("image.roi_align", [x, rois, bidx],
              {"output_size": size, "sampling_ratio": s, "spatial_scale": sc, "mode": m,
               "half_pixel": hp}) for m, hp, s, sc, size in variants]
    for (m, hp, s, sc, size), got in zip(variants, run_cases(cases)):
        want = _onnx_ref("RoiAlign", [x, rois, bidx], 22, mode=m, output_height=size[0],
                         output_width=size[1], sampling_ratio=s, spatial_scale=sc,
                         coordinate_transformation_mode="half_pixel" if hp
                         else "output_half_pixel")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{m} {hp} {s}")


def test_image_ops_are_declared_non_differentiable():
    from kiln.op.registry import NON_DIFFERENTIABLE, get_op_def

    for name in ("image.resample", "image.grid_sample", "image.roi_align"):
        assert get_op_def(name).gradient is NON_DIFFERENTIABLE
    assert onnx.defs.has("GridSample")
