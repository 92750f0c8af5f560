"""Initializers whose data lives in an external file (ONNX's external data, used by models over
2 GB and by many exporters for any weight).

An external initializer names a file relative to the model's folder (``location``) and a byte
range in it (``offset``, ``length``). The importer resolves it against ``base_dir`` -- the
folder of the model file, or what the caller passes with a loaded ModelProto -- never against
the current directory, and reads each tensor straight into its numpy array: the weights are
held once (``onnx.load`` would first copy every byte into the protobuf, then numpy would copy
them again). Types whose file layout is not numpy's (4-bit types, packed two to a byte) go
through ONNX's own conversion, one tensor at a time.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx

from ...ir import ModelFormatError

#: ONNX element types stored in files exactly as numpy stores them (little-endian, one element
#: after the other), by TensorProto.DataType number.
_PLAIN = {1: "<f4", 2: "u1", 3: "i1", 4: "<u2", 5: "<i2", 6: "<i4", 7: "<i8", 9: "?",
          10: "<f2", 11: "<f8", 12: "<u4", 13: "<u8"}


def is_external(init: Any) -> bool:
    """Whether initializer ``init`` keeps its data in an external file."""
    return init.data_location == 1  # TensorProto.EXTERNAL


def read_external(init: Any, base_dir: str | None) -> np.ndarray:
    """The array of external initializer ``init`` (see the module docstring)."""
    info = {e.key: e.value for e in init.external_data}
    location = info.get("location")
    if not location:
        raise ModelFormatError(f"initializer {init.name!r}: external data without a location")
    if base_dir is None:
        raise ModelFormatError(
            f"initializer {init.name!r} keeps its data in the external file {location!r}: "
            "pass base_dir= (the folder of the model file) to from_onnx, or import the model "
            "from its path")
    if os.path.isabs(location) or ".." in location.replace("\\", "/").split("/"):
        raise ModelFormatError(f"initializer {init.name!r}: external data location "
                               f"{location!r} must be a path inside the model's folder")
    path = os.path.join(base_dir, location)
    try:
        offset = int(info.get("offset", 0))
        length = int(info["length"]) if "length" in info else None
    except ValueError as err:
        raise ModelFormatError(f"initializer {init.name!r}: bad external data offset/length "
                               f"({err})") from err
    shape = tuple(int(d) for d in init.dims)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            if init.data_type in _PLAIN:
                dtype = np.dtype(_PLAIN[init.data_type])
                count = int(np.prod(shape, dtype=np.int64))
                if length is not None and length != count * dtype.itemsize:
                    raise ModelFormatError(
                        f"initializer {init.name!r}: external data length {length} does not "
                        f"match its shape {shape} of {dtype.name} ({count * dtype.itemsize} "
                        "bytes)")
                arr = np.fromfile(f, dtype=dtype, count=count)
                if arr.size != count:
                    raise ModelFormatError(
                        f"initializer {init.name!r}: external file {location!r} ends before "
                        f"its data ({arr.size} of {count} elements at offset {offset})")
                return arr.reshape(shape).astype(dtype.newbyteorder("="), copy=False)
            raw = f.read() if length is None else f.read(length)
    except OSError as err:
        raise ModelFormatError(f"initializer {init.name!r}: cannot read its external data "
                               f"file {path!r}: {err.strerror or err}") from err
    return _convert_raw(init, raw)


def _convert_raw(init: Any, raw: bytes) -> np.ndarray:
    """ONNX's conversion of ``raw`` bytes laid out as ``init``'s type (4-bit types...)."""
    tensor = onnx.TensorProto()
    tensor.name, tensor.data_type = init.name, init.data_type
    tensor.dims.extend(init.dims)
    tensor.raw_data = raw
    try:
        return onnx.numpy_helper.to_array(tensor)
    except Exception as err:  # noqa: BLE001 - onnx raises ValueError / TypeError
        raise ModelFormatError(f"initializer {init.name!r}: external data cannot be read as "
                               f"its type ({err})") from err
