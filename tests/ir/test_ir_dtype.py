"""DataType parsing/printing, numpy conversion and the layout-derived ABI."""

import ctypes

import ml_dtypes
import numpy as np
import pytest

from kiln.ir import DataType, DTypeError, TypeCode, abi, as_dtype
from kiln.ir.dtype import DTYPE_LAYOUT


@pytest.mark.parametrize(
    "text,code,bits,lanes",
    [
        ("float32", TypeCode.FLOAT, 32, 1),
        ("float16x16", TypeCode.FLOAT, 16, 16),
        ("bfloat16", TypeCode.BFLOAT, 16, 1),
        ("int8", TypeCode.INT, 8, 1),
        ("uint8", TypeCode.UINT, 8, 1),
        ("bool", TypeCode.BOOL, 1, 1),
        ("float32x65536", TypeCode.FLOAT, 32, 65536),
        ("int64x4", TypeCode.INT, 64, 4),
        ("handle", TypeCode.HANDLE, 64, 1),
    ],
)
def test_parse_and_print_round_trip(text, code, bits, lanes):
    dt = DataType(text)
    assert (dt.code, dt.bits, dt.lanes) == (code, bits, lanes)
    assert str(dt) == text
    assert DataType(code, bits, lanes) == dt
    assert hash(DataType(str(dt))) == hash(dt)


@pytest.mark.parametrize("bad", ["float", "float33", "int7", "bfloat32", "x", "float32x0", ""])
def test_bad_strings_raise(bad):
    with pytest.raises(DTypeError):
        DataType(bad)


def test_lanes_is_a_signed_32_bit_field():
    assert dict(DTYPE_LAYOUT)["lanes"] == "int32"
    DataType("float32x2147483647")
    with pytest.raises(DTypeError):
        DataType(TypeCode.FLOAT, 32, 2**31)


@pytest.mark.parametrize(
    "text,npdt",
    [
        ("float32", np.float32),
        ("float64", np.float64),
        ("float16", np.float16),
        ("int8", np.int8),
        ("uint8", np.uint8),
        ("int64", np.int64),
        ("bool", np.bool_),
        ("bfloat16", ml_dtypes.bfloat16),
    ],
)
def test_numpy_round_trip(text, npdt):
    dt = DataType(text)
    assert dt.to_numpy() == np.dtype(npdt)
    assert DataType.from_numpy(npdt) == dt
    assert as_dtype(np.dtype(npdt)) == dt


def test_vector_numpy_is_element_type():
    assert DataType("float32x65536").to_numpy() == np.float32
    assert DataType("float32x65536").element == DataType("float32")
    assert DataType("float32").with_lanes(65536) == DataType("float32x65536")


def test_itemsize_and_queries():
    assert DataType("float32x4").itemsize == 16
    assert DataType("bool").itemsize == 1
    assert DataType("bfloat16").is_float and DataType("bfloat16").is_bfloat
    assert DataType("uint8").is_integer and not DataType("uint8").is_int
    assert DataType("int8").max_value() == 127


def test_ctypes_dldatatype_is_derived_from_layout():
    fields = [(name, ctypes.sizeof(ty)) for name, ty in abi.DLDataType._fields_]
    assert [f for f, _ in fields] == [f for f, _ in DTYPE_LAYOUT]
    widths = {"uint8": 1, "int32": 4, "int64": 8, "uint16": 2}
    assert [w for _, w in fields] == [widths[t] for _, t in DTYPE_LAYOUT]
    c = abi.DLDataType(code=2, bits=32, lanes=65536)
    assert c.lanes == 65536


def test_header_declares_every_layout_field():
    header = abi.c_header()
    for name, ty in DTYPE_LAYOUT:
        assert f"{abi.c_type_name(ty)} {name};" in header


def test_binary_dtype_serialization_round_trip():
    for text in ["float32x65536", "int8", "bool", "bfloat16", "uint64x3"]:
        dt = DataType(text)
        assert abi.unpack_dtype(abi.pack_dtype(dt)) == dt
    assert abi.DTYPE_STRUCT.size == sum(
        {"uint8": 1, "int32": 4, "int64": 8}[t] for _, t in DTYPE_LAYOUT
    )
