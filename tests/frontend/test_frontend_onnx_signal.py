"""DFT / STFT / windows / MelWeightMatrix import checked against onnx.reference and numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.frontend.onnx.converters.signal import mel_weight_matrix
from kiln.ir.errors import RuntimeCheckError
from kiln.testing.onnx_graphs import onnx_model
from kiln.testing.onnx_graphs import value_info as _vi

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=20):
    return onnx_model(nodes, inputs, outputs, inits, opset, ir_version=9)


def _run(model, feeds):
    mod, params = from_onnx(model)
    got = kiln.build(mod, params=params)(**feeds)
    return list(got) if isinstance(got, (list, tuple)) else [got]


def _check(model, feeds, atol=1e-4):
    got = _run(model, feeds)
    ref = ReferenceEvaluator(model).run(None, feeds)
    for a, b in zip(got, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("inverse,onesided,comps,length,axis", [
    (0, 0, 1, None, 1), (0, 0, 2, 7, -2), (0, 1, 1, None, 2), (0, 1, 2, 4, 1),
    (1, 0, 2, None, 1), (1, 0, 1, 9, 2), (1, 1, 2, None, 1), (1, 1, 2, 9, 1),
])
def test_dft_options_against_reference(inverse, onesided, comps, length, axis):
    x = RNG.standard_normal((2, 6, 5, comps)).astype("float32")
    inits = [helper.make_tensor("axis", I64, [], [axis])]
    ins = ["x", "", "axis"]
    if length is not None:
        inits.append(helper.make_tensor("n", I64, [], [length]))
        ins[1] = "n"
    node = helper.make_node("DFT", ins, ["y"], inverse=inverse, onesided=onesided)
    _check(_model([node], [_vi("x", list(x.shape))], [_vi("y", None)], inits), {"x": x})


def test_dft_opset17_axis_attribute():
    x = RNG.standard_normal((3, 8, 2)).astype("float32")
    node = helper.make_node("DFT", ["x"], ["y"], axis=1)
    model = _model([node], [_vi("x", [3, 8, 2])], [_vi("y", None)], opset=17)
    got = _run(model, {"x": x})[0]
    ref = np.fft.fft(x[..., 0] + 1j * x[..., 1], axis=1)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("inverse", [0, 1])
@pytest.mark.parametrize("data", ["ramp", "random"])
def test_dft_is_rounded_once_from_the_exact_transform(inverse, data):
    """Twiddles from angles reduced exactly mod n, sums in float64: each output is within
    half a float32 ulp of the exact (float64) transform, also the zeros of an inverse of a
    ramp (the ONNX inverse-DFT case's input) that a float32 FFT misses by 1.9e-07."""
    n = 10 if data == "ramp" else 96
    x = (np.arange(n * n * 2, dtype=np.float32).reshape(1, n, n, 2) if data == "ramp"
         else RNG.standard_normal((1, n, 3, 2)).astype(np.float32))
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], inverse=inverse)
    inits = [helper.make_tensor("axis", I64, [], [1])]
    got = _run(_model([node], [_vi("x", list(x.shape))], [_vi("y", None)], inits),
               {"x": x})[0]
    xc = x[..., 0].astype(np.float64) + 1j * x[..., 1]
    exact = np.fft.ifft(xc, axis=1) if inverse else np.fft.fft(xc, axis=1)
    exact = np.stack([exact.real, exact.imag], axis=-1)
    half_ulp = 0.5 * np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got - exact) <= half_ulp * 1.001 + 1e-12 * np.abs(exact).max())


def test_dft_runtime_axis_selects_candidate():
    x = RNG.standard_normal((1, 4, 4, 2)).astype("float32")
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"])
    model = _model([node], [_vi("x", [1, 4, 4, 2]), _vi("axis", [], I64)], [_vi("y", None)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    for axis in (1, 2, -2):
        feeds = {"x": x, "axis": np.array(axis, np.int64)}
        ref = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(exe(**feeds), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("onesided", [0, 1])
def test_dft_runtime_axis_out_of_range_fails_the_call(onesided):
    """The last axis holds the real/imaginary parts: an axis naming it, or beyond the rank,
    is an error at run time (found by the fuzzer: kiln returned NaNs, onnx.reference a
    transform along a wrapped axis, onnxruntime an error), and the executable stays usable."""
    x = RNG.standard_normal((1, 6, 6, 1)).astype("float32")
    node = helper.make_node("DFT", ["x", "", "axis"], ["y"], onesided=onesided)
    model = _model([node], [_vi("x", [1, 6, 6, 1]), _vi("axis", [], I64)], [_vi("y", None)])
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    for axis in (-5, -1, 3, 4):
        with pytest.raises(RuntimeCheckError, match=r"DFT.*axis out of range \[-4, 2\]"):
            exe(x=x, axis=np.array(axis, np.int64))
    feeds = {"x": x, "axis": np.array(-3, np.int64)}
    ref = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(exe(**feeds), ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_constant_and_runtime_size(op_type, periodic):
    node = helper.make_node(op_type, ["n"], ["w"], periodic=periodic)
    const = _model([helper.make_node("Constant", [], ["n"], value=helper.make_tensor(
        "v", I64, [], [11])), node], [], [_vi("w", None)], opset=17)
    _check(const, {}, atol=1e-6)
    rt = _model([node], [_vi("n", [], I64)], [_vi("w", None)], opset=17)
    mod, params = from_onnx(rt)
    exe = kiln.build(mod, params=params)
    for n in (7, 12):
        feeds = {"n": np.array(n, np.int64)}
        ref = ReferenceEvaluator(rt).run(None, feeds)[0]
        np.testing.assert_allclose(exe(**feeds), ref, rtol=1e-5, atol=1e-6)


def test_window_output_datatype_double():
    node = helper.make_node("HannWindow", ["n"], ["w"], output_datatype=TensorProto.DOUBLE)
    inits = [helper.make_tensor("n", I64, [], [6])]
    model = _model([node], [], [_vi("w", None, TensorProto.DOUBLE)], inits, opset=17)
    _check(model, {}, atol=1e-12)


@pytest.mark.parametrize("with_window,onesided", [(True, 1), (False, 0)])
def test_stft_constant_and_runtime_step(with_window, onesided):
    sig = RNG.standard_normal((2, 40, 1)).astype("float32")
    win = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)).astype("float32")
    inits = [helper.make_tensor("flen", I64, [], [8])]
    ins = ["x", "step", "win" if with_window else "", "flen"]
    inputs = [_vi("x", [2, 40, 1]), _vi("step", [], I64)]
    feeds = {"x": sig, "step": np.array(5, np.int64)}
    if with_window:
        inputs.append(_vi("win", [8]))
        feeds["win"] = win
    node = helper.make_node("STFT", ins, ["y"], onesided=onesided)
    model = _model([node], inputs, [_vi("y", None)], inits, opset=17)
    _check(model, feeds)  # run-time frame_step
    const_step = _model([node], [i for i in inputs if i.name != "step"], [_vi("y", None)],
                        [*inits, helper.make_tensor("step", I64, [], [6])], opset=17)
    feeds.pop("step")
    _check(const_step, feeds)


@pytest.mark.parametrize("onesided,comps", [(1, 1), (0, 2)])
def test_stft_runtime_frame_length(onesided, comps):
    sig = RNG.standard_normal((1, 30, comps)).astype("float32")
    node = helper.make_node("STFT", ["x", "step", "", "flen"], ["y"], onesided=onesided)
    model = _model([node], [_vi("x", [1, 30, comps]), _vi("step", [], I64),
                            _vi("flen", [], I64)], [_vi("y", None)], opset=17)
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    for step, flen in ((4, 8), (3, 5)):
        feeds = {"x": sig, "step": np.array(step, np.int64), "flen": np.array(flen, np.int64)}
        ref = ReferenceEvaluator(model).run(None, feeds)[0]
        np.testing.assert_allclose(exe(**feeds), ref, rtol=1e-4, atol=1e-4)


def test_mel_weight_matrix_constant_inputs():
    vals = [("bins", I64, 10), ("dft", I64, 64), ("sr", I64, 16000), ("lo", F, 20.0),
            ("hi", F, 7000.0)]
    inits = [helper.make_tensor(n, t, [], [v]) for n, t, v in vals]
    node = helper.make_node("MelWeightMatrix", [n for n, _, _ in vals], ["m"])
    model = _model([node], [], [_vi("m", None)], inits, opset=17)
    _check(model, {}, atol=1e-6)
    ref = mel_weight_matrix(10, 64, 16000, 20.0, 7000.0)
    assert ref.shape == (33, 10) and ref.max() == 1.0


def test_mel_weight_matrix_runtime_inputs():
    vals = [("bins", I64), ("dft", I64), ("sr", I64), ("lo", F), ("hi", F)]
    node = helper.make_node("MelWeightMatrix", [n for n, _ in vals], ["m"])
    model = _model([node], [_vi(n, [], t) for n, t in vals], [_vi("m", None)], opset=17)
    mod, params = from_onnx(model)
    exe = kiln.build(mod, params=params)
    for b, d, sr, lo, hi in ((8, 16, 8192, 0.0, 4096.0), (12, 128, 16000, 30.0, 7500.0)):
        feeds = {"bins": np.array(b, np.int64), "dft": np.array(d, np.int64),
                 "sr": np.array(sr, np.int64), "lo": np.array(lo, np.float32),
                 "hi": np.array(hi, np.float32)}
        ref = ReferenceEvaluator(model).run(None, feeds)[0]
        got = exe(**feeds)
        assert got.shape == ref.shape == (d // 2 + 1, b)
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
