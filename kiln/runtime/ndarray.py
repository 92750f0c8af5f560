"""Arrays at the native boundary: numpy / DLPack objects <-> ctypes ``DLTensor``.

Generated kernels take ``DLTensor*`` arguments (``kiln.ir.abi``). :func:`as_dltensor` makes one
that points straight at the memory of a numpy array (no copy) and keeps alive everything the
struct points to (the array and the shape array). Any object with ``__dlpack__`` (a torch CPU
tensor, a JAX array, ...) is viewed through ``np.from_dlpack``, also without a copy.

Copies happen in two cases only, both documented behaviour:

- a non-C-contiguous array is copied to a contiguous one, because kernels index with compact
  row-major strides; when such an argument may be written (an output), :meth:`DLTensorArg.
  writeback` copies the result back into the caller's array after the call;
- a Python number passed for a scalar parameter becomes a 0-d array of the parameter's dtype.

Data types follow DLPack: ``bool`` is type code 6 with 8 bits (one byte per element, as numpy
stores it), ``bfloat16`` arrays are ``ml_dtypes.bfloat16``. float8/float6/float4 arrays (DLPack
codes 7..17) and 2/4-bit integer arrays are ``ml_dtypes`` arrays too, one element per byte: the
DLTensor keeps their logical width (``int4``: code 0, bits 4) and the storage is *padded*
(DLPack's ``DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`` layout, not its packed default).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from ..ir.abi import DEVICE_CPU, DLDataType, DLDevice, DLTensor
from ..ir.dtype import DataType, TypeCode, as_dtype
from ..ir.errors import ArgumentError


def dl_dtype_fields(dtype: Any) -> tuple[int, int, int]:
    """(code, bits, lanes) of ``dtype`` as a DLTensor carries it (bool is 8 bits; sub-byte
    types keep their width, stored one element per byte)."""
    dt = as_dtype(dtype)
    bits = 8 if dt.is_bool else dt.bits
    return int(dt.code), bits, dt.lanes


def to_dl_dtype(dtype: Any) -> DLDataType:
    """The ctypes ``DLDataType`` of a kiln data type."""
    code, bits, lanes = dl_dtype_fields(dtype)
    return DLDataType(code, bits, lanes)


def from_dl_dtype(dl: DLDataType) -> DataType:
    """The kiln data type of a ctypes ``DLDataType`` (inverse of :func:`to_dl_dtype`)."""
    code = TypeCode(dl.code)
    bits = 1 if code == TypeCode.BOOL else int(dl.bits)
    return DataType(code, bits, int(dl.lanes))


def as_numpy(obj: Any, what: str = "argument") -> np.ndarray:
    """View ``obj`` (a numpy array or a ``__dlpack__`` object) as a numpy array, zero-copy."""
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__dlpack__"):
        try:
            return np.from_dlpack(obj)
        except (RuntimeError, BufferError, TypeError, ValueError) as err:
            raise ArgumentError(
                f"{what}: cannot view {type(obj).__name__} as a CPU array through DLPack "
                f"({err})"
            ) from err
    if isinstance(obj, np.generic):
        return np.asarray(obj)
    raise ArgumentError(
        f"{what}: expected a numpy array or an object with __dlpack__, got {type(obj).__name__}"
    )


_CPU = DLDevice(DEVICE_CPU, 0)
_DL_DTYPES: dict[np.dtype, DLDataType] = {}


def _dl_dtype_of_numpy(dt: np.dtype) -> DLDataType:
    """DLDataType of a numpy dtype (memoized: this is on every call's path)."""
    dl = _DL_DTYPES.get(dt)
    if dl is None:
        try:
            dtype = DataType.from_numpy(dt)
        except Exception as err:  # noqa: BLE001 - re-raised as an ArgumentError
            raise ArgumentError(f"array dtype {dt} has no kiln equivalent") from err
        dl = _DL_DTYPES[dt] = to_dl_dtype(dtype)
    return dl


def data_address(arr: np.ndarray) -> int:
    """Address of a C-contiguous array's first element, through a ctypes view of its buffer
    (about 0.3 us) rather than ``__array_interface__`` (about 1.5 us: it builds a dict); a
    small model's call spent more time on these than in its kernels. Read-only and empty arrays,
    which ctypes cannot view, take the slow way."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))
    except (TypeError, ValueError, BufferError):
        return arr.__array_interface__["data"][0]


class DLTensorArg:
    """A ctypes ``DLTensor`` viewing an array, plus the objects its pointers refer to.

    Keep this object alive for as long as native code may use :attr:`tensor`.
    """

    __slots__ = ("_shape", "array", "original", "tensor")

    def __init__(self, array: np.ndarray, original: np.ndarray | None = None):
        self.array = array
        # Set only when ``array`` is a contiguous copy of ``original``.
        self.original = original
        ndim = array.ndim
        self._shape = (ctypes.c_int64 * max(ndim, 1))(*array.shape)
        self.tensor = DLTensor(data_address(array), _CPU, ndim, _dl_dtype_of_numpy(array.dtype),
                               self._shape, None, 0)

    @property
    def address(self) -> int:
        """Address of the DLTensor struct (what a ``DLTensor*`` argument receives)."""
        return ctypes.addressof(self.tensor)

    def writeback(self) -> None:
        """Copy the data back into the caller's array if the kernel worked on a copy."""
        if self.original is not None and self.original.flags.writeable:
            np.copyto(self.original, self.array)


def as_dltensor(obj: Any, what: str = "argument", dtype: Any = None) -> DLTensorArg:
    """Make a :class:`DLTensorArg` for ``obj`` (numpy array, ``__dlpack__`` object, number).

    ``dtype`` is the expected data type; it is only used to convert Python numbers (scalar
    parameters). Non-contiguous arrays are copied (see the module docstring).
    """
    if isinstance(obj, (bool, int, float)) and dtype is not None:
        return DLTensorArg(np.asarray(obj, dtype=as_dtype(dtype).to_numpy()))
    arr = as_numpy(obj, what)
    if not arr.flags.c_contiguous:
        return DLTensorArg(np.array(arr, order="C", copy=True), original=arr)
    return DLTensorArg(arr)


__all__ = [
    "DLTensorArg", "as_dltensor", "as_numpy", "dl_dtype_fields", "from_dl_dtype", "to_dl_dtype",
]
