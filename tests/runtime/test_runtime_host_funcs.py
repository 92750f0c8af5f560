"""Host-function plan steps (``kiln.runtime.host_funcs``): the image_decode function against
the ONNX reference, its errors, and plans whose steps compute tensors on the host (dims bound by
the step, checked by a match_cast, saved and loaded)."""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir.errors import ArgumentError, KilnError
from kiln.runtime import host_funcs

PIL_Image = pytest.importorskip("PIL.Image")
onnx_ref = pytest.importorskip("onnx.reference.ops.op_image_decoder")

RNG = np.random.default_rng(11)
FORMATS = ("PNG", "BMP", "TIFF", "JPEG", "WEBP")


def encode(img: np.ndarray, fmt: str, mode: str | None = None) -> np.ndarray:
    buf = io.BytesIO()
    PIL_Image.fromarray(img, mode).save(buf, format=fmt)
    return np.frombuffer(buf.getvalue(), np.uint8)


def reference(data: np.ndarray, pixel_format: str) -> np.ndarray:
    return onnx_ref.ImageDecoder._run(None, data, pixel_format=pixel_format)[0]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decode_matches_the_reference(fmt, pixel_format):
    h, w = (int(v) for v in RNG.integers(3, 40, 2))
    data = encode(RNG.integers(0, 256, (h, w, 3), dtype=np.uint8), fmt)
    got = host_funcs.run("image_decode", [data], {"pixel_format": pixel_format})
    want = reference(data, pixel_format)
    assert got.dtype == np.uint8 and got.flags.c_contiguous
    assert got.shape == (h, w, 1 if pixel_format == "Grayscale" else 3)
    np.testing.assert_array_equal(got, want)


def test_lossless_formats_round_trip_the_pixels():
    img = RNG.integers(0, 256, (9, 13, 3), dtype=np.uint8)
    for fmt in ("PNG", "BMP", "TIFF"):
        data = encode(img, fmt)
        np.testing.assert_array_equal(host_funcs.image_decode(data), img)
        np.testing.assert_array_equal(host_funcs.image_decode(data, "BGR"), img[:, :, ::-1])


def test_other_channel_layouts_are_converted_to_the_pixel_format():
    """RGBA and grayscale files still give [H, W, 3] for RGB and [H, W, 1] for Grayscale."""
    rgba = RNG.integers(0, 256, (6, 5, 4), dtype=np.uint8)
    got = host_funcs.image_decode(encode(rgba, "PNG"), "RGB")
    np.testing.assert_array_equal(got, rgba[:, :, :3])
    gray = RNG.integers(0, 256, (6, 5), dtype=np.uint8)
    data = encode(gray, "PNG")
    np.testing.assert_array_equal(host_funcs.image_decode(data, "Grayscale")[:, :, 0], gray)
    np.testing.assert_array_equal(host_funcs.image_decode(data, "RGB"),
                                  np.repeat(gray[:, :, None], 3, axis=2))


def test_image_decode_rejects_bad_input():
    with pytest.raises(ValueError, match="not an image format"):
        host_funcs.image_decode(np.arange(50, dtype=np.uint8))
    png = encode(RNG.integers(0, 256, (8, 8, 3), dtype=np.uint8), "PNG")
    with pytest.raises(ValueError, match="cannot decode"):
        host_funcs.image_decode(png[: len(png) // 2])
    with pytest.raises(ValueError, match="pixel_format"):
        host_funcs.image_decode(png, "CMYK")
    with pytest.raises(ValueError, match="1-D uint8"):
        host_funcs.image_decode(png.astype(np.int32))


def test_missing_pillow_says_how_to_install_it(monkeypatch):
    png = encode(RNG.integers(0, 256, (4, 4, 3), dtype=np.uint8), "PNG")
    monkeypatch.setitem(sys.modules, "PIL.Image", None)  # makes `import PIL.Image` fail
    with pytest.raises(KilnError, match=r"pip install kiln\[image\]"):
        host_funcs.image_decode(png)


# ---- plans with a host-function step -------------------------------------------------------
def _decode_exe(channels: int = 3, pixel_format: str = "RGB"):
    """main(data) = image_decode(data) as (h, w, channels) (checked), then + 1 in a kernel."""
    data = g.Var("data", g.TensorStructInfo((tir.Var("n", "int64"),), "uint8"))
    bb = g.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():
            dec = bb.emit(op.image_decode(data, pixel_format=pixel_format))
            h, w = tir.Var("h", "int64"), tir.Var("w", "int64")
            img = bb.match_cast(dec, g.TensorStructInfo((h, w, channels), "uint8"))
            out = bb.emit_output(op.add(img, g.const(np.uint8(1))))
        bb.emit_func_output(out)
    return kiln.build(bb.get())


@pytest.fixture(scope="module")
def exe():
    return _decode_exe()


def test_plan_runs_the_host_step_and_binds_its_dims(exe, tmp_path):
    plan = exe.plans["main"]
    assert [c.kind for c in plan.calls] == ["host_func", "match", "kernel"]
    assert plan.calls[0].extra["attrs"] == {"pixel_format": "RGB"} and plan.entry is None
    path = str(tmp_path / "decode.kiln")
    exe.save(path)
    loaded = kiln.load(path)
    for shape in ((5, 7, 3), (17, 2, 3)):
        img = RNG.integers(0, 255, shape, dtype=np.uint8)
        for run in (exe, loaded):
            np.testing.assert_array_equal(run(encode(img, "PNG")), img + 1)


def test_match_cast_checks_the_known_channel_count():
    exe = _decode_exe(channels=1)  # RGB gives 3 channels, the graph claims 1
    with pytest.raises(ArgumentError, match="match_cast"):
        exe(encode(RNG.integers(0, 256, (4, 4, 3), dtype=np.uint8), "PNG"))


def test_run_time_errors_name_the_step(exe):
    with pytest.raises(ArgumentError, match="main: .*cannot decode the image"):
        exe(np.zeros(20, np.uint8))


def test_host_function_results_are_checked(exe, monkeypatch):
    monkeypatch.setitem(host_funcs.HOST_FUNCS, "image_decode",
                        lambda data, pixel_format: np.zeros((2, 2), np.uint8))
    with pytest.raises(KilnError, match="expected uint8 of rank 3"):
        exe(np.zeros(4, np.uint8))
    monkeypatch.delitem(host_funcs.HOST_FUNCS, "image_decode")
    with pytest.raises(KilnError, match="no host function 'image_decode'"):
        exe(np.zeros(4, np.uint8))
