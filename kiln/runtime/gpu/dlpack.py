"""Device arrays through DLPack: ``torch.cuda`` tensors and CuPy arrays taken without copies.

An object whose ``__dlpack_device__()`` says CUDA is exported with ``__dlpack__()``; the
capsule's ``DLManagedTensor`` (the ``DLTensor`` struct of :mod:`kiln.ir.abi`) gives the data
pointer, shape, strides and dtype. The capsule is kept (never consumed) for as long as the
:class:`DeviceArray` lives, so the producer's memory stays valid; dropping it runs the
producer's deleter. Outputs for such inputs are allocated by the same framework
(:func:`empty_like_framework`), so a torch caller gets torch tensors back, on the GPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.abi import DEVICE_CUDA, DLDataType, DLDevice
from ...ir.dtype import DataType
from ...ir.errors import ArgumentError
from ..ndarray import from_dl_dtype
from .device import DeviceBuffer

#: DLPack device types of CUDA memory (device, pinned host, managed).
CUDA_DEVICE_TYPES = (DEVICE_CUDA, 13)

#: Bytes a device array's data pointer must be a multiple of: kiln's kernels load and store
#: 16-byte vectors (``float4``, ``cp.async``, ``ldmatrix``) from the start of every buffer, which
#: a misaligned address turns into CUDA_ERROR_MISALIGNED_ADDRESS -- an error that destroys the
#: CUDA context, so every later call in the process fails. Framework allocations are aligned
#: (torch and CuPy to 256 bytes or more); a view at an element offset (``t[1:]``) may not be.
DEVICE_ARRAY_ALIGN = 16


class _DLPackDataType(ctypes.Structure):
    """DLPack's own ``DLDataType`` (16-bit lanes): the layout other frameworks export. kiln's
    ABI struct (:mod:`kiln.ir.abi`) widens ``lanes`` to 32 bits and cannot read theirs."""

    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLPackTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLPackDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLPackTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = (ctypes.py_object, ctypes.c_char_p)


@dataclass
class DeviceArray:
    """A view of a framework's device array: what kiln needs to pass it to kernels."""

    obj: Any
    buffer: DeviceBuffer
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


def is_cuda_array(obj: Any) -> bool:
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        return False
    try:
        return int(dev()[0]) in CUDA_DEVICE_TYPES
    except Exception:  # noqa: BLE001 - not a usable DLPack producer
        return False


def import_cuda_array(obj: Any, name: str) -> DeviceArray:
    """``obj`` (a CUDA ``__dlpack__`` producer) as a :class:`DeviceArray`, zero-copy."""
    try:
        capsule = obj.__dlpack__()
        address = _get_pointer(capsule, b"dltensor")
    except Exception as err:  # noqa: BLE001 - the producer's own errors
        raise ArgumentError(f"input {name!r}: cannot export {type(obj).__name__} through "
                            f"DLPack ({err})") from err
    t = _DLManagedTensor.from_address(address).dl_tensor
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    dtype: DataType = from_dl_dtype(DLDataType(t.dtype.code, t.dtype.bits, t.dtype.lanes))
    if t.strides:
        expected = 1
        for axis in range(t.ndim - 1, -1, -1):
            if shape[axis] != 1 and int(t.strides[axis]) != expected:
                raise ArgumentError(f"input {name!r}: the device array is not C-contiguous; "
                                    "make it contiguous first (kiln does not copy device "
                                    "arrays)")
            expected *= shape[axis]
    ptr = int(t.data or 0) + int(t.byte_offset)
    if ptr % DEVICE_ARRAY_ALIGN:
        raise ArgumentError(f"input {name!r}: the device array's data starts at {ptr:#x}, not a "
                            f"multiple of {DEVICE_ARRAY_ALIGN} bytes (a view at an offset?); "
                            "pass an aligned copy (torch: .clone(), CuPy: .copy()) -- kiln's "
                            "kernels load 16-byte vectors and does not copy device arrays")
    nbytes = int(np.prod(shape, dtype=np.int64)) * max(dtype.itemsize, 1)
    buf = DeviceBuffer(ptr, nbytes, (obj, capsule))
    return DeviceArray(obj, buf, shape, np.dtype(dtype.to_numpy()))


def empty_like_framework(template: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any | None:
    """A new device array of the framework ``template`` comes from (torch, CuPy), or None
    when kiln does not know the framework."""
    module = type(template).__module__.split(".")[0]
    if module == "torch":
        import torch

        tdt = torch.bfloat16 if dtype.name == "bfloat16" else \
            torch.from_numpy(np.empty(0, dtype)).dtype
        return torch.empty(shape, dtype=tdt, device=template.device)
    if module == "cupy":
        import cupy

        return cupy.empty(shape, dtype=dtype)
    return None
