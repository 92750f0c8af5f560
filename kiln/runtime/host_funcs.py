"""Host functions: plan steps that compute a tensor *value* in Python, not in a kernel.

Some operators are not loop nests over tensors but calls into a host library whose output
shape depends on the input bytes: ONNX ImageDecoder turns a 1-D uint8 tensor of encoded image
bytes (JPEG, PNG, ...) into an ``[H, W, C]`` uint8 image. kiln runs them as a host step of the
plan (kind ``"host_func"``, see ``kiln.runtime.plan``)::

    y0 = call(ExternFunc("kiln.host_func.image_decode"), x, attrs=ImageDecodeAttrs("RGB"),
              sinfo_args=Tensor(ndim=3, "uint8"))        # shape unknown until it runs
    y = match_cast(y0, Tensor((h, w, 3), "uint8"))      # binds h, w; checks C == 3

The step's output slot has fresh dim names that the step itself binds from the array the
function returns (decoding once; a separate shape function would decode the bytes twice), and
the graph's ``match_cast`` binds the graph's symbolic dims from them (or checks known ones),
exactly like the match step after a shape function (``kiln.runtime.shape_funcs``).

A host function takes the step's input arrays in graph order plus the op's attributes as
keyword arguments (JSON data, saved in the executable), and returns a numpy array of the
declared dtype and rank. It raises ``ValueError`` with a plain message for inputs the operator
rejects (the executor names the step) and ``KilnError`` when an optional dependency is
missing. Functions are looked up by name, so executables that use them load without the
compiler.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ..ir.errors import KilnError

#: Prefix of the ``ExternFunc`` symbol of a host function in the graph IR.
PREFIX = "kiln.host_func."

HOST_FUNCS: dict[str, Callable[..., np.ndarray]] = {}


def host_func(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn`` as host function ``name``."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        HOST_FUNCS[name] = fn
        return fn

    return register


def run(name: str, inputs: Sequence[np.ndarray], attrs: Mapping[str, Any]) -> np.ndarray:
    """Run host function ``name`` (KeyError when this runtime does not know it; the executor
    checks ``HOST_FUNCS`` first, so a KeyError from inside a function is not mistaken)."""
    return HOST_FUNCS[name](*inputs, **attrs)


# =============================================================================================
# image_decode (ONNX ImageDecoder)
# =============================================================================================
#: Pixel formats of ONNX ImageDecoder, each with the Pillow mode it decodes to.
PIXEL_FORMATS = {"RGB": "RGB", "BGR": "RGB", "Grayscale": "L"}


def pillow_image() -> Any:
    """The ``PIL.Image`` module; a KilnError saying how to install it when Pillow is missing
    (it is an optional dependency: only image decoding needs it)."""
    try:
        import PIL.Image  # noqa: PLC0415 - optional dependency, imported on use
    except ImportError as err:
        raise KilnError("decoding images needs Pillow, which is not installed: "
                        "pip install kiln[image]") from err
    return PIL.Image


@host_func("image_decode")
def image_decode(encoded: np.ndarray, pixel_format: str = "RGB") -> np.ndarray:
    """Decode image bytes (any format Pillow reads) to ``[H, W, C]`` uint8.

    Every image is converted to the requested format, so the channel count is always 3 (RGB,
    BGR) or 1 (Grayscale, ITU-R 601-2 luma as Pillow's ``L``), whatever the file holds (a
    palette or RGBA PNG, a grayscale JPEG). The ONNX reference returns Pillow's array as it
    comes for RGB (4 channels for RGBA), which the operator's [H, W, 3] contract excludes.
    """
    if pixel_format not in PIXEL_FORMATS:
        raise ValueError(f"unsupported pixel_format {pixel_format!r} (expected one of "
                         f"{', '.join(PIXEL_FORMATS)})")
    data = np.asarray(encoded)
    if data.dtype != np.uint8 or data.ndim != 1:
        raise ValueError(f"encoded image must be a 1-D uint8 tensor, got {data.dtype} of shape "
                         f"{data.shape}")
    image_mod = pillow_image()
    try:
        img = image_mod.open(io.BytesIO(data.tobytes()))
        img.load()
        fmt = img.format or "unknown"
        img = img.convert(PIXEL_FORMATS[pixel_format])
    except image_mod.UnidentifiedImageError:
        raise ValueError(f"cannot decode the image ({len(data)} bytes): not an image format "
                         "Pillow can read") from None
    except (OSError, ValueError, SyntaxError, EOFError, image_mod.DecompressionBombError) as err:
        # Pillow reports truncated or corrupt data, and formats it was built without, so.
        raise ValueError(f"cannot decode the image ({len(data)} bytes): {err}") from None
    out = np.asarray(img, dtype=np.uint8)
    if out.ndim == 2:
        out = out[:, :, None]
    if out.ndim != 3:
        raise ValueError(f"decoding the {fmt} image gave an array of shape {out.shape}")
    if pixel_format == "BGR":
        out = out[:, :, ::-1]
    return np.ascontiguousarray(out)
