"""float8/float6/float4 and 2/4-bit integer DataTypes: names, DLPack codes, numpy interop."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from kiln.ir import DataType, abi
from kiln.ir.dtype import MINIFLOATS, TypeCode, as_dtype
from kiln.ir.errors import DTypeError
from kiln.runtime.ndarray import dl_dtype_fields, from_dl_dtype, to_dl_dtype

# DLPack 1.1 dlpack.h, DLDataTypeCode (written out here, not read from kiln).
DLPACK_CODES = {
    "float8_e3m4": 7, "float8_e4m3": 8, "float8_e4m3b11fnuz": 9, "float8_e4m3fn": 10,
    "float8_e4m3fnuz": 11, "float8_e5m2": 12, "float8_e5m2fnuz": 13, "float8_e8m0fnu": 14,
    "float6_e2m3fn": 15, "float6_e3m2fn": 16, "float4_e2m1fn": 17,
}
SUBBYTE_INTS = ["int2", "uint2", "int4", "uint4"]


@pytest.mark.parametrize("name", sorted(DLPACK_CODES))
def test_minifloat_names_codes_and_numpy(name):
    dt = DataType(name)
    assert int(dt.code) == DLPACK_CODES[name] and dt.lanes == 1
    assert str(dt) == name and dt == name and as_dtype(name) is not None
    assert dt.is_float and dt.is_minifloat and not dt.is_bfloat and not dt.is_integer
    assert dt.itemsize == 1  # one byte per element, float4/float6 included
    assert dt.to_numpy() == np.dtype(getattr(ml_dtypes, name))
    assert DataType.from_numpy(getattr(ml_dtypes, name)) == dt
    vec = DataType(f"{name}x8")
    assert vec.lanes == 8 and vec.element == dt and str(vec) == f"{name}x8"
    assert vec.itemsize == 8


@pytest.mark.parametrize("name", sorted(DLPACK_CODES))
def test_minifloat_encoding_matches_ml_dtypes(name):
    fmt = DataType(name).minifloat
    info = ml_dtypes.finfo(getattr(ml_dtypes, name))
    assert fmt.bits == info.bits and fmt.mbits == info.nmant and fmt.ebits == info.nexp
    assert fmt.bias == 1 - info.minexp or fmt.kind == "fnu"
    patterns = np.arange(1 << fmt.bits, dtype=np.uint8).view(getattr(ml_dtypes, name))
    values = patterns.astype(np.float32)
    has_nan = bool(np.isnan(values).any())
    has_inf = bool(np.isinf(values).any())
    assert has_inf == (fmt.kind == "ieee")
    assert has_nan == (fmt.kind != "finite")


@pytest.mark.parametrize("name", SUBBYTE_INTS)
def test_subbyte_ints(name):
    dt = DataType(name)
    bits = int(name[-1])
    assert dt.bits == bits and dt.is_integer and dt.is_subbyte and dt.itemsize == 1
    info = ml_dtypes.iinfo(getattr(ml_dtypes, name))
    assert (dt.min_value(), dt.max_value()) == (int(info.min), int(info.max))
    assert dt.to_numpy() == np.dtype(getattr(ml_dtypes, name))
    assert DataType.from_numpy(np.dtype(getattr(ml_dtypes, name))) == dt
    assert str(DataType(f"{name}x4")) == f"{name}x4"


def test_parse_prefers_the_longest_format_name():
    assert DataType("float8_e4m3fnuz").code == TypeCode.FLOAT8_E4M3FNUZ
    assert DataType("float8_e4m3fnx16") == DataType(TypeCode.FLOAT8_E4M3FN, 8, 16)
    assert DataType("float8_e4m3").code == TypeCode.FLOAT8_E4M3


@pytest.mark.parametrize("bad", ["float8", "float8_e4m3fm", "int3", "uint1", "float4"])
def test_bad_names(bad):
    with pytest.raises(DTypeError):
        DataType(bad)


def test_minifloat_bits_are_fixed_by_the_code():
    assert DataType(TypeCode.FLOAT8_E5M2).bits == 8
    assert DataType(TypeCode.FLOAT4_E2M1FN, 0, 2) == "float4_e2m1fnx2"
    with pytest.raises(DTypeError, match="has 8 bits"):
        DataType(TypeCode.FLOAT8_E5M2, 16)


@pytest.mark.parametrize("name", [*DLPACK_CODES, *SUBBYTE_INTS])
def test_serialized_and_dltensor_dtype_round_trip(name):
    dt = DataType(name)
    assert abi.unpack_dtype(abi.pack_dtype(dt)) == dt
    # DLTensor metadata keeps the logical width (4 for int4); storage is one byte per element.
    code, bits, lanes = dl_dtype_fields(dt)
    assert (code, bits, lanes) == (int(dt.code), dt.bits, 1)
    assert from_dl_dtype(to_dl_dtype(dt)) == dt


def test_every_minifloat_code_is_a_typecode():
    assert {f.name for f in MINIFLOATS.values()} == set(DLPACK_CODES)
