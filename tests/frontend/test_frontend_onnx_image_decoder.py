"""ONNX ImageDecoder: random images encoded with Pillow in several formats, decoded by one
compiled model (H and W bound at run time) and compared with onnx.reference; constant bytes
decoded at import; save/load; errors naming the node."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.frontend.onnx import from_onnx
from kiln.ir.errors import ArgumentError, KilnError

PIL_Image = pytest.importorskip("PIL.Image")
RNG = np.random.default_rng(7)
FORMATS = ("PNG", "JPEG", "BMP", "TIFF", "WEBP", "PPM")


def encode(img: np.ndarray, fmt: str) -> np.ndarray:
    buf = io.BytesIO()
    PIL_Image.fromarray(img).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), np.uint8)


def random_image() -> np.ndarray:
    h, w = (int(v) for v in RNG.integers(2, 48, 2))
    return RNG.integers(0, 256, (h, w, 3), dtype=np.uint8)


def decoder_model(pixel_format: str = "RGB", tail: bool = False, const: np.ndarray | None = None,
                  dtype: int = TensorProto.UINT8):
    """data -> ImageDecoder 'dec' -> out (with ``tail``: also Cast + ReduceSum over H, W)."""
    nodes = [helper.make_node("ImageDecoder", ["data"], ["out"], name="dec",
                              pixel_format=pixel_format)]
    outputs = [helper.make_tensor_value_info("out", TensorProto.UINT8, None)]
    if tail:
        nodes += [helper.make_node("Cast", ["out"], ["f"], to=TensorProto.FLOAT),
                  helper.make_node("ReduceSum", ["f", "axes"], ["sums"], keepdims=0)]
        outputs.append(helper.make_tensor_value_info("sums", TensorProto.FLOAT, None))
    inits = [numpy_helper.from_array(np.array([0, 1], np.int64), "axes")] if tail else []
    inputs = [helper.make_tensor_value_info("data", dtype, ["n"])]
    if const is not None:
        inits.append(numpy_helper.from_array(const, "data"))
        inputs = []
    graph = helper.make_graph(nodes, "decode", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def build(model):
    mod, params = from_onnx(model)
    return kiln.build(mod, params=params)


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_decoder_matches_the_reference_on_every_format(pixel_format):
    model = decoder_model(pixel_format, tail=True)
    exe, ref = build(model), ReferenceEvaluator(model)
    for fmt in FORMATS:
        data = encode(random_image(), fmt)
        got, sums = exe(data)
        want, want_sums = ref.run(None, {"data": data})
        assert got.shape == want.shape, fmt
        np.testing.assert_array_equal(got, want, err_msg=fmt)
        np.testing.assert_allclose(sums, want_sums, rtol=1e-6)  # float32 sums of <= 2304 ints


def test_save_load_round_trip(tmp_path):
    exe = build(decoder_model("BGR"))
    path = str(tmp_path / "decoder.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    for fmt in ("PNG", "JPEG"):
        img = random_image()
        data = encode(img, fmt)
        np.testing.assert_array_equal(loaded(data), exe(data))
        if fmt == "PNG":
            np.testing.assert_array_equal(loaded(data), img[:, :, ::-1])


def test_constant_bytes_are_decoded_at_import():
    img = random_image()
    data = encode(img, "PNG")
    model = decoder_model("Grayscale", const=data)
    exe = build(model)
    assert not exe.plans["main"].has_host_steps
    np.testing.assert_array_equal(exe(), ReferenceEvaluator(model).run(None, {})[0])


def test_import_errors_name_the_node(monkeypatch):
    with pytest.raises(KilnError, match="ImageDecoder node 'dec': pixel_format"):
        from_onnx(decoder_model("HSV"))
    with pytest.raises(KilnError,
                       match=r"ImageDecoder node 'dec': .*encoded_stream\) is tensor\(int8\)"):
        from_onnx(decoder_model(dtype=TensorProto.INT8))
    with pytest.raises(KilnError, match="ImageDecoder node 'dec': cannot decode"):
        from_onnx(decoder_model(const=np.arange(30, dtype=np.uint8)))
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # as if Pillow were not installed
    with pytest.raises(KilnError, match=r"ImageDecoder node 'dec': .*pip install kiln\[image\]"):
        from_onnx(decoder_model())


def test_run_time_errors_name_the_node():
    exe = build(decoder_model())
    with pytest.raises(ArgumentError, match="dec_ImageDecoder: cannot decode the image"):
        exe(np.frombuffer(b"definitely not an image", np.uint8))
    png = encode(random_image(), "PNG")
    with pytest.raises(ArgumentError, match="dec_ImageDecoder: cannot decode the image"):
        exe(png[: len(png) // 2])
