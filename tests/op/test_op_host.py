"""Host-function operators (``kiln.op.host``): StructInfo, attributes, legalization to a host
call, and numerics of ``op.image_decode`` through a built graph against Pillow's own decode."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest

import kiln
from kiln import graph as g
from kiln import op, tir
from kiln.ir.errors import KilnError, StructInfoError
from kiln.runtime import host_funcs
from kiln.transform import LegalizeOps

PIL_Image = pytest.importorskip("PIL.Image")
RNG = np.random.default_rng(3)


def _png(img: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    PIL_Image.fromarray(img).save(buf, format="PNG")
    return np.frombuffer(buf.getvalue(), np.uint8)


def _decode_module(pixel_format: str, channels: int) -> Any:
    data = g.Var("data", g.TensorStructInfo((tir.Var("n", "int64"),), "uint8"))
    bb = g.BlockBuilder()
    with bb.function("main", [data]):
        with bb.dataflow():
            dec = bb.emit(op.image_decode(data, pixel_format=pixel_format))
            h, w = tir.Var("h", "int64"), tir.Var("w", "int64")
            img = bb.match_cast(dec, g.TensorStructInfo((h, w, channels), "uint8"))
            out = bb.emit_output(op.cast(img, "float32"))
        bb.emit_func_output(out)
    return bb.get()


def test_image_decode_struct_info_and_attrs():
    data = g.Var("data", g.TensorStructInfo((100,), "uint8"))
    call = g.BlockBuilder().normalize(op.image_decode(data))
    assert call.struct_info.shape is None and call.struct_info.ndim == 3
    assert str(call.struct_info.dtype) == "uint8" and call.attrs.pixel_format == "RGB"
    with pytest.raises(StructInfoError, match="1-d uint8"):
        g.BlockBuilder().normalize(op.image_decode(g.Var("x", g.TensorStructInfo((4,), "int8"))))
    with pytest.raises(KilnError, match="pixel_format"):
        op.image_decode(data, pixel_format="YUV")


def test_image_decode_legalizes_to_a_host_call():
    legal = LegalizeOps()(_decode_module("BGR", 3))
    calls = [b.value for blk in legal["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, g.Call) and isinstance(b.value.op, g.ExternFunc)]
    assert [c.op.symbol for c in calls] == [host_funcs.PREFIX + "image_decode"]
    assert calls[0].attrs.pixel_format == "BGR"


@pytest.mark.parametrize("pixel_format", ["RGB", "BGR", "Grayscale"])
def test_image_decode_numerics(pixel_format):
    channels = 1 if pixel_format == "Grayscale" else 3
    exe = kiln.build(_decode_module(pixel_format, channels))
    img = RNG.integers(0, 256, (int(RNG.integers(2, 30)), int(RNG.integers(2, 30)), 3),
                       dtype=np.uint8)
    want = {"RGB": img, "BGR": img[:, :, ::-1],
            "Grayscale": np.asarray(PIL_Image.fromarray(img).convert("L"))[:, :, None]}
    np.testing.assert_array_equal(exe(_png(img)), want[pixel_format].astype(np.float32))
