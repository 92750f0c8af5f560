"""Operators computed by a host function (``kiln.runtime.host_funcs``), not by a kernel.

``image_decode`` (ONNX ImageDecoder) calls an image library: there is no loop nest to write,
and the output shape depends on the bytes. Such an op's StructInfo has a known rank but an
unknown shape; LegalizeOps turns the call into ``call(ExternFunc("kiln.host_func.<name>"),
args, attrs)``, which the plan runs as a ``"host_func"`` step. The step binds the dims of its
own output slot from the array it gets (so the image is decoded once: a shape function ahead
of it, as the dynamic ops use, would have to decode it a first time only to learn H and W); the
frontend then ``match_cast``\\ s the value to ``(h, w, c)`` with fresh symbolic dims ``h, w``
(and a known ``c``, checked at run time), which keeps the graph well formed and gives later
ops named dims, as after a shape function.

These ops are OPAQUE (nothing fuses into a host call), never constant-folded (their shape is
not static), and NON_DIFFERENTIABLE (decoding bytes has no gradient). They have no schedule on
any target (``kiln.schedule.register_no_schedule`` records why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..graph import expr as gx
from ..ir.errors import KilnError, StructInfoError
from ..runtime import host_funcs
from .common import arg_shape, tensor_arg, tensor_sinfo
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["image_decode"]

#: The ops declared with :func:`register_host_op` (the schedule rooms record that they have no
#: schedule: ``kiln.schedule.register_no_schedule``).
HOST_OPS: list[str] = []


def host_legalize(func: str) -> Any:
    """The legalize hook of an op run by host function ``func``: an extern call carrying the
    op's attributes (the plan saves them as the step's JSON ``attrs``). A variadic argument
    (a Tuple) is passed as its fields, one host-function argument each."""

    def legalize(bb: Any, call: Any) -> Any:
        args = []
        for a in call.args:
            args.extend(a.fields if isinstance(a, gx.Tuple) else [a])
        return gx.Call(gx.ExternFunc(host_funcs.PREFIX + func), args,
                       attrs=call.attrs, sinfo_args=[call.struct_info])

    return legalize


def register_host_op(name: str, inputs: tuple[str, ...], infer: Any, attrs: type | None,
                     doc: str) -> Any:
    """Declare op ``name`` run by the host function of the same name: OPAQUE, no mixed
    precision, no gradient (sequence, optional and string ops)."""
    HOST_OPS.append(name)
    return register_op(name, inputs=inputs, infer=infer, pattern=OpPattern.OPAQUE, attrs=attrs,
                       legalize=host_legalize(name), mixed_precision=MixedPrecision.NEVER,
                       gradient=NON_DIFFERENTIABLE, doc=doc)


# =============================================================================================
# image_decode
# =============================================================================================
@dataclass(frozen=True)
class ImageDecodeAttrs:
    """``pixel_format``: ``"RGB"`` (default), ``"BGR"`` or ``"Grayscale"`` (one channel)."""

    pixel_format: str = "RGB"

    def __post_init__(self):
        if self.pixel_format not in host_funcs.PIXEL_FORMATS:
            raise KilnError(f"image_decode: pixel_format must be one of "
                            f"{', '.join(host_funcs.PIXEL_FORMATS)}, got {self.pixel_format!r}")


def _image_decode_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "image_decode", "encoded")
    shape = arg_shape(x)
    if str(x.dtype) != "uint8" or (shape is not None and len(shape) != 1) or (
            shape is None and x.ndim not in (-1, 1)):
        raise StructInfoError(f"image_decode: encoded must be a 1-d uint8 tensor, got {x}")
    return tensor_sinfo(None, "uint8", ndim=3)


image_decode = register_op(
    "image_decode", inputs=("encoded",), infer=_image_decode_infer, pattern=OpPattern.OPAQUE,
    attrs=ImageDecodeAttrs, legalize=host_legalize("image_decode"),
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="Decode an encoded image (a 1-d uint8 tensor of JPEG/PNG/BMP/TIFF/WebP/... bytes) to "
    "an [H, W, C] uint8 tensor: C = 3 for RGB and BGR, 1 for Grayscale. H and W are known only "
    "at run time (match_cast the result to bind them). Runs on the host with Pillow.",
)
