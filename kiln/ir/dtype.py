"""DataType: the one definition of a data type's layout (type code, bits, lanes).

``DTYPE_LAYOUT`` below is the single source of truth for how a data type is laid out in memory.
The ctypes ``DLDataType`` (``kiln.ir.abi``), the C runtime header used by generated code and the
executable file format are all derived from it, so widening ``lanes`` is a one-line change here.
``lanes`` is a signed 32-bit field so that long vectors (``float32x65536``) are representable.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import ml_dtypes
import numpy as np

from .errors import DTypeError

# (field name, fixed-width integer type) in declaration order. Change a width here and every
# struct, header and serializer follows.
DTYPE_LAYOUT: tuple[tuple[str, str], ...] = (
    ("code", "uint8"),
    ("bits", "uint8"),
    ("lanes", "int32"),
)

_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "uint8": (0, 2**8 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}


def layout_field_range(field: str) -> tuple[int, int]:
    """Representable range of one DTYPE_LAYOUT field."""
    for name, ty in DTYPE_LAYOUT:
        if name == field:
            return _INT_RANGES[ty]
    raise KeyError(field)


_LANES_MAX = layout_field_range("lanes")[1]
_BITS_MAX = layout_field_range("bits")[1]


class TypeCode(IntEnum):
    """Type codes; values follow DLPack's DLDataTypeCode (DLPack 1.1 for the float8, float6
    and float4 formats; each of those codes names one format, so its ``bits`` is fixed)."""

    INT = 0
    UINT = 1
    FLOAT = 2
    HANDLE = 3
    BFLOAT = 4
    BOOL = 6
    FLOAT8_E3M4 = 7
    FLOAT8_E4M3 = 8
    FLOAT8_E4M3B11FNUZ = 9
    FLOAT8_E4M3FN = 10
    FLOAT8_E4M3FNUZ = 11
    FLOAT8_E5M2 = 12
    FLOAT8_E5M2FNUZ = 13
    FLOAT8_E8M0FNU = 14
    FLOAT6_E2M3FN = 15
    FLOAT6_E3M2FN = 16
    FLOAT4_E2M1FN = 17
    #: kiln's own code (outside DLPack's): a tensor of text strings, held on the host as a
    #: numpy object array of ``str``. Only host functions read or write it (no kernel, no
    #: DLPack exchange); ``bits`` is the width of the object pointer.
    STRING = 200


@dataclass(frozen=True, slots=True)
class MiniFloat:
    """The encoding of a float narrower than 16 bits (OCP / ml_dtypes naming).

    ``kind`` says how the special values are encoded, which is all that differs between the
    formats beyond the field widths and the exponent ``bias``:

    - ``"ieee"``: like IEEE 754 (exponent all ones: Inf when the mantissa is 0, else NaN);
    - ``"fn"``: finite, NaN is ``S.1111.111`` (all exponent and mantissa bits set), no Inf;
    - ``"fnuz"``: finite, no negative zero; NaN is the bit pattern of -0 (``0x80``);
    - ``"fnu"``: unsigned exponent-only (e8m0): value ``2^(e - bias)``, NaN is ``0xff``, no 0;
    - ``"finite"``: no Inf and no NaN (float4/float6): conversions saturate.
    """

    name: str
    bits: int
    ebits: int
    mbits: int
    bias: int
    kind: str

    @property
    def signed(self) -> bool:
        return self.kind != "fnu"


#: Every float8/float6/float4 format: type code -> encoding. Storage is one byte per element.
MINIFLOATS: dict[TypeCode, MiniFloat] = {
    TypeCode.FLOAT8_E3M4: MiniFloat("float8_e3m4", 8, 3, 4, 3, "ieee"),
    TypeCode.FLOAT8_E4M3: MiniFloat("float8_e4m3", 8, 4, 3, 7, "ieee"),
    TypeCode.FLOAT8_E4M3B11FNUZ: MiniFloat("float8_e4m3b11fnuz", 8, 4, 3, 11, "fnuz"),
    TypeCode.FLOAT8_E4M3FN: MiniFloat("float8_e4m3fn", 8, 4, 3, 7, "fn"),
    TypeCode.FLOAT8_E4M3FNUZ: MiniFloat("float8_e4m3fnuz", 8, 4, 3, 8, "fnuz"),
    TypeCode.FLOAT8_E5M2: MiniFloat("float8_e5m2", 8, 5, 2, 15, "ieee"),
    TypeCode.FLOAT8_E5M2FNUZ: MiniFloat("float8_e5m2fnuz", 8, 5, 2, 16, "fnuz"),
    TypeCode.FLOAT8_E8M0FNU: MiniFloat("float8_e8m0fnu", 8, 8, 0, 127, "fnu"),
    TypeCode.FLOAT6_E2M3FN: MiniFloat("float6_e2m3fn", 6, 2, 3, 1, "finite"),
    TypeCode.FLOAT6_E3M2FN: MiniFloat("float6_e3m2fn", 6, 3, 2, 3, "finite"),
    TypeCode.FLOAT4_E2M1FN: MiniFloat("float4_e2m1fn", 4, 2, 1, 1, "finite"),
}
_MINIFLOAT_BY_NAME = {f.name: code for code, f in MINIFLOATS.items()}


_CODE_NAMES = {
    TypeCode.INT: "int",
    TypeCode.UINT: "uint",
    TypeCode.FLOAT: "float",
    TypeCode.HANDLE: "handle",
    TypeCode.BFLOAT: "bfloat",
    TypeCode.BOOL: "bool",
    TypeCode.STRING: "string",
}

_DTYPE_RE = re.compile(r"^(int|uint|float|bfloat|handle|bool|string)(\d+)?(?:x(\d+))?$")
# Longest names first, so that ``float8_e4m3fnuz`` is not read as ``float8_e4m3fn`` + junk.
_MINIFLOAT_RE = re.compile(
    r"^(" + "|".join(sorted(_MINIFLOAT_BY_NAME, key=len, reverse=True)) + r")(?:x(\d+))?$"
)
# Integer widths: 2 and 4 bits are stored one element per byte, like ml_dtypes.
_INT_BITS = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class DataType:
    """A scalar or vector data type: ``DataType(TypeCode.FLOAT, 32, 4)`` is ``float32x4``.

    ``DataType("float32")`` parses a string; every public API accepts strings, numpy dtypes and
    DataType objects through :func:`as_dtype`.
    """

    code: int
    bits: int = 0
    lanes: int = 1

    def __init__(self, code: int | str | DataType, bits: int = 0, lanes: int = 1):
        if not isinstance(code, int):
            parsed = as_dtype(code)
            code, bits, lanes = parsed.code, parsed.bits, parsed.lanes
        if not isinstance(code, TypeCode):
            code = TypeCode(code)
        if bits == 0:
            if code == TypeCode.BOOL:
                bits = 1
            elif code in (TypeCode.HANDLE, TypeCode.STRING):
                bits = 64
            elif code in MINIFLOATS:
                bits = MINIFLOATS[code].bits
        if code in MINIFLOATS and bits != MINIFLOATS[code].bits:
            raise DTypeError(f"{MINIFLOATS[code].name} has {MINIFLOATS[code].bits} bits, "
                             f"got {bits}")
        if not 1 <= lanes <= _LANES_MAX:
            raise DTypeError(f"lanes must be in [1, {_LANES_MAX}], got {lanes}")
        if not 0 < bits <= _BITS_MAX:
            raise DTypeError(f"bits must be in [1, {_BITS_MAX}], got {bits}")
        object.__setattr__(self, "code", code)
        object.__setattr__(self, "bits", bits)
        object.__setattr__(self, "lanes", lanes)

    # ---- parsing / printing -------------------------------------------------------------
    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def parse(text: str) -> DataType:
        mf = _MINIFLOAT_RE.match(text.strip())
        if mf:
            code = _MINIFLOAT_BY_NAME[mf.group(1)]
            return DataType(code, MINIFLOATS[code].bits, int(mf.group(2)) if mf.group(2) else 1)
        m = _DTYPE_RE.match(text.strip())
        if not m:
            raise DTypeError(f"cannot parse data type {text!r}")
        kind, bits, lanes = m.group(1), m.group(2), m.group(3)
        code = {
            "int": TypeCode.INT,
            "uint": TypeCode.UINT,
            "float": TypeCode.FLOAT,
            "bfloat": TypeCode.BFLOAT,
            "handle": TypeCode.HANDLE,
            "bool": TypeCode.BOOL,
            "string": TypeCode.STRING,
        }[kind]
        if kind == "string" and (bits is not None or lanes is not None):
            raise DTypeError(f"string has no bit width or lanes: {text!r}")
        if bits is None:
            bits = {"bool": 1, "handle": 64, "string": 64}.get(kind)
            if bits is None:
                raise DTypeError(f"data type {text!r} needs a bit width (e.g. {kind}32)")
        nbits = int(bits)
        if kind == "bool" and nbits != 1:
            raise DTypeError(f"bool has no bit width: {text!r}")
        if kind == "float" and nbits not in (16, 32, 64):
            raise DTypeError(f"unsupported float width in {text!r}")
        if kind == "bfloat" and nbits != 16:
            raise DTypeError(f"only bfloat16 is supported, got {text!r}")
        if kind in ("int", "uint") and nbits not in _INT_BITS:
            raise DTypeError(f"unsupported integer width in {text!r}")
        return DataType(code, nbits, int(lanes) if lanes else 1)

    def __str__(self) -> str:
        if self.code == TypeCode.BOOL:
            base = "bool"
        elif self.code in (TypeCode.HANDLE, TypeCode.STRING):
            base = _CODE_NAMES[self.code]
        elif self.code in MINIFLOATS:
            base = MINIFLOATS[self.code].name
        else:
            base = f"{_CODE_NAMES[self.code]}{self.bits}"
        return base if self.lanes == 1 else f"{base}x{self.lanes}"

    def __repr__(self) -> str:
        return f"DataType('{self}')"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            try:
                other = DataType.parse(other)
            except DTypeError:
                return False
        if not isinstance(other, DataType):
            return NotImplemented
        return (self.code, self.bits, self.lanes) == (other.code, other.bits, other.lanes)

    def __hash__(self) -> int:
        return hash((int(self.code), self.bits, self.lanes))

    # ---- queries ------------------------------------------------------------------------
    def with_lanes(self, lanes: int) -> DataType:
        return DataType(self.code, self.bits, lanes)

    def with_bits(self, bits: int) -> DataType:
        return DataType(self.code, bits, self.lanes)

    @property
    def element(self) -> DataType:
        """The scalar type of one lane."""
        return self if self.lanes == 1 else _element(self.code, self.bits)

    @property
    def is_scalar(self) -> bool:
        return self.lanes == 1

    @property
    def is_vector(self) -> bool:
        return self.lanes > 1

    @property
    def is_float(self) -> bool:
        """True for IEEE floats, bfloat16 and the float8/float6/float4 formats."""
        return self.code in (TypeCode.FLOAT, TypeCode.BFLOAT) or self.code in MINIFLOATS

    @property
    def is_minifloat(self) -> bool:
        """A float8/float6/float4 format (see :data:`MINIFLOATS`)."""
        return self.code in MINIFLOATS

    @property
    def minifloat(self) -> MiniFloat | None:
        """The encoding of a float8/float6/float4 type, else None."""
        return MINIFLOATS.get(self.code)

    @property
    def is_subbyte(self) -> bool:
        """Narrower than a byte (int4, uint2, float4_e2m1fn...): stored one element per byte."""
        return self.code not in (TypeCode.BOOL, TypeCode.HANDLE) and self.bits < 8

    @property
    def is_bfloat(self) -> bool:
        return self.code == TypeCode.BFLOAT

    @property
    def is_int(self) -> bool:
        return self.code == TypeCode.INT

    @property
    def is_uint(self) -> bool:
        return self.code == TypeCode.UINT

    @property
    def is_integer(self) -> bool:
        """Signed or unsigned integer (not bool)."""
        return self.code in (TypeCode.INT, TypeCode.UINT)

    @property
    def is_bool(self) -> bool:
        return self.code == TypeCode.BOOL

    @property
    def is_handle(self) -> bool:
        return self.code == TypeCode.HANDLE

    @property
    def is_string(self) -> bool:
        """A tensor of text strings (host functions only, see ``TypeCode.STRING``)."""
        return self.code == TypeCode.STRING

    @property
    def itemsize(self) -> int:
        """Bytes of storage for one element of all lanes (bool takes one byte per lane)."""
        lane_bytes = 1 if self.code == TypeCode.BOOL else (self.bits + 7) // 8
        return lane_bytes * self.lanes

    def min_value(self) -> int | float:
        return _value_range(self.code, self.bits)[0]

    def max_value(self) -> int | float:
        return _value_range(self.code, self.bits)[1]

    # ---- numpy interop ------------------------------------------------------------------
    def to_numpy(self) -> np.dtype:
        """The numpy dtype of one lane (vector types map to their element type); bfloat16, the
        float8/float6/float4 formats and 2/4-bit integers are ``ml_dtypes`` types."""
        if self.code == TypeCode.BFLOAT:
            return np.dtype(ml_dtypes.bfloat16)
        if self.code in MINIFLOATS or (self.is_integer and self.bits < 8):
            return np.dtype(getattr(ml_dtypes, str(self.element)))
        if self.code == TypeCode.BOOL:
            return np.dtype(np.bool_)
        if self.code == TypeCode.HANDLE:
            return np.dtype(np.uintp)
        if self.code == TypeCode.STRING:
            return np.dtype(object)
        return np.dtype(f"{_CODE_NAMES[self.code]}{self.bits}")

    @staticmethod
    def from_numpy(dtype: Any) -> DataType:
        dt = np.dtype(dtype)
        if dt.name == "bfloat16":
            return DataType(TypeCode.BFLOAT, 16, 1)
        if dt.name in _ML_DTYPES_NAMES and dt.kind in "Vf":
            return DataType.parse(dt.name)
        if dt.kind == "b":
            return DataType(TypeCode.BOOL, 1, 1)
        if dt.kind in "OUS":  # object arrays (of str), numpy unicode and byte strings
            return DataType(TypeCode.STRING, 64, 1)
        kinds = {"i": TypeCode.INT, "u": TypeCode.UINT, "f": TypeCode.FLOAT}
        if dt.kind not in kinds:
            raise DTypeError(f"numpy dtype {dt} has no kiln equivalent")
        return DataType(kinds[dt.kind], dt.itemsize * 8, 1)


# ml_dtypes types with a kiln equivalent (numpy ``kind`` "V", "f" for float8_e5m2).
_ML_DTYPES_NAMES = frozenset(
    [*_MINIFLOAT_BY_NAME, "int2", "uint2", "int4", "uint4"]
)


@functools.lru_cache(maxsize=256)
def _element(code: int, bits: int) -> DataType:
    return DataType(code, bits, 1)


@functools.lru_cache(maxsize=256)
def _value_range(code: int, bits: int) -> tuple[int | float, int | float]:
    if code in (TypeCode.FLOAT, TypeCode.BFLOAT):
        return -float("inf"), float("inf")
    if code in MINIFLOATS:
        # Formats without Inf: the finite extremes (the identity of a max/min reduction).
        fmt = MINIFLOATS[TypeCode(code)]
        if fmt.kind == "ieee":
            return -float("inf"), float("inf")

        info = ml_dtypes.finfo(getattr(ml_dtypes, fmt.name))
        lo = float(info.smallest_normal) if fmt.kind == "fnu" else -float(info.max)
        return lo, float(info.max)
    if code == TypeCode.BOOL:
        return 0, 1
    if code == TypeCode.INT:
        return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    return 0, 2**bits - 1


def as_dtype(value: Any) -> DataType:
    """Convert a string, numpy dtype/type or DataType into a DataType."""
    if isinstance(value, DataType):
        return value
    if isinstance(value, str):
        return DataType.parse(value)
    try:
        return DataType.from_numpy(value)
    except TypeError as err:
        raise DTypeError(f"not a data type: {value!r}") from err


# Frequently used constants.
bool_ = DataType(TypeCode.BOOL, 1)
int32 = DataType(TypeCode.INT, 32)
int64 = DataType(TypeCode.INT, 64)
float16 = DataType(TypeCode.FLOAT, 16)
float32 = DataType(TypeCode.FLOAT, 32)
float64 = DataType(TypeCode.FLOAT, 64)
bfloat16 = DataType(TypeCode.BFLOAT, 16)
handle = DataType(TypeCode.HANDLE, 64)
string = DataType(TypeCode.STRING, 64)
