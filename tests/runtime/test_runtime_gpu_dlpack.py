"""DLPack import of CUDA device arrays, checked without a GPU: a producer whose capsule
describes CUDA memory (the importer reads the DLTensor struct only; nothing is launched)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kiln.ir import ArgumentError
from kiln.ir.abi import DEVICE_CUDA
from kiln.runtime.gpu.dlpack import (
    DEVICE_ARRAY_ALIGN,
    import_cuda_array,
    is_cuda_array,
)

_new_capsule = ctypes.pythonapi.PyCapsule_New
_new_capsule.restype = ctypes.py_object
_new_capsule.argtypes = (ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    """DLPack's ``DLTensor`` as the specification (dlpack.h) lays it out."""

    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32),
                ("dtype", _DType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class _FakeCudaArray:
    """A float32 array at device address ``data`` (never dereferenced), C-contiguous."""

    def __init__(self, data: int, shape: tuple[int, ...], byte_offset: int = 0):
        self.shape = (ctypes.c_int64 * len(shape))(*shape)
        self.managed = _Managed()
        t = self.managed.dl_tensor
        t.data, t.ndim, t.shape, t.byte_offset = data, len(shape), self.shape, byte_offset
        t.device.device_type, t.device.device_id = DEVICE_CUDA, 0
        t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1  # kDLFloat, 32 bits

    def __dlpack_device__(self):
        return (DEVICE_CUDA, 0)

    def __dlpack__(self, **kwargs):
        return _new_capsule(ctypes.addressof(self.managed), b"dltensor", None)


def test_an_aligned_device_array_is_viewed():
    arr = _FakeCudaArray(0x7F0000000000, (4, 8))
    assert is_cuda_array(arr)
    view = import_cuda_array(arr, "x")
    assert view.shape == (4, 8) and view.dtype == np.float32
    assert view.buffer.handle == 0x7F0000000000 and view.buffer.nbytes == 128


@pytest.mark.parametrize("data, offset", [(0x7F0000000004, 0), (0x7F0000000000, 12)])
def test_a_misaligned_device_array_is_refused(data, offset):
    """A view at an element offset (torch's ``t[1:]``) would make the kernels' 16-byte vector
    loads fault and take the CUDA context down: an ArgumentError naming the input instead."""
    with pytest.raises(ArgumentError, match=rf"input 'x'.*multiple of {DEVICE_ARRAY_ALIGN}"):
        import_cuda_array(_FakeCudaArray(data, (4, 8), offset), "x")
