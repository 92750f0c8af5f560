"""ONNX operators run as host functions (``kiln.op.host``, ``kiln.runtime.host_funcs``).

ImageDecoder decodes an image file held in a 1-D uint8 tensor into ``[H, W, C]`` uint8. The
converter emits ``image_decode`` and ``match_cast``\\ s its result to ``(h, w, C)``: ``h`` and
``w`` are fresh symbolic dims bound when the step runs, ``C`` (3, or 1 for Grayscale) is known
and checked. Constant bytes are decoded at import time instead (the same host function).
"""

from __future__ import annotations

from typing import Any

from .... import graph as g
from .... import op, tir
from ....ir.errors import KilnError
from ....runtime import host_funcs
from ..registry import converter
from .common import dtype_of, ndim_of
from .dynamic import safe_name


@converter("ImageDecoder", since=20)
def image_decoder(ctx: Any, node: Any) -> Any:
    fmt = node.attr("pixel_format", "RGB")
    if fmt not in host_funcs.PIXEL_FORMATS:
        raise node.error(f"pixel_format must be one of {', '.join(host_funcs.PIXEL_FORMATS)}, "
                         f"got {fmt!r}")
    x = node.input(0)
    if str(dtype_of(x)) != "uint8" or ndim_of(x) != 1:
        raise node.error(f"encoded_stream must be a 1-D uint8 tensor, got {x.struct_info}")
    try:
        host_funcs.pillow_image()  # fail at import, not at the first run, without Pillow
        const = node.const_value(0)
        if const is not None:
            return host_funcs.image_decode(const, pixel_format=fmt)
    except (KilnError, ValueError) as err:
        raise node.error(str(err)) from None
    decoded = ctx.emit(op.image_decode(x, pixel_format=fmt), f"{node.name}_ImageDecoder")
    base = safe_name(node.name)
    dims = (tir.Var(f"{base}_height", "int64"), tir.Var(f"{base}_width", "int64"),
            1 if fmt == "Grayscale" else 3)
    return ctx.bb.match_cast(decoded, g.TensorStructInfo(dims, "uint8"))
