"""C spellings of kiln data types and constants.

Scalars: ``float``/``double``, ``int8_t``..``uint64_t``, ``_Bool`` for bool values (stored as one
``uint8_t`` byte in buffers, like numpy), ``_Float16`` for float16 and ``float`` for bfloat16
values (stored as ``uint16_t`` bits and converted through float, so bfloat16 math is float32
math rounded to bfloat16). Vectors are GCC vector extensions named after the dtype
(``float32x8``); bool vectors are lane masks (``int32x8`` with -1/0 lanes) whose width follows
the values that produced them.
"""

from __future__ import annotations

import math

import numpy as np

from ...ir.dtype import DataType
from ...ir.errors import CodegenError

_INT_C = {
    ("int", 8): "int8_t", ("int", 16): "int16_t", ("int", 32): "int32_t", ("int", 64): "int64_t",
    ("uint", 8): "uint8_t", ("uint", 16): "uint16_t", ("uint", 32): "uint32_t",
    ("uint", 64): "uint64_t",
}


def _kind(dt: DataType) -> str:
    if dt.is_int:
        return "int"
    if dt.is_uint:
        return "uint"
    return "other"


def value_ctype(dt: DataType) -> str:
    """C type holding one scalar *value* of ``dt`` in expressions and local variables."""
    dt = dt.element
    if dt.is_bool:
        return "_Bool"
    if dt.is_bfloat:
        return "float"
    if dt.is_float:
        return {16: "_Float16", 32: "float", 64: "double"}[dt.bits]
    if dt.is_handle:
        return "void*"
    try:
        return _INT_C[(_kind(dt), dt.bits)]
    except KeyError:
        raise CodegenError(f"data type {dt} has no C equivalent") from None


def storage_ctype(dt: DataType) -> str:
    """C element type of a *buffer* of ``dt``."""
    dt = dt.element
    if dt.is_bool:
        return "uint8_t"
    if dt.is_bfloat:
        return "uint16_t"
    return value_ctype(dt)


def vector_elem_dtype(dt: DataType) -> DataType:
    """The element type of the GCC vector that holds ``dt`` (bool vectors: see mask types)."""
    el = dt.element
    if el.is_bfloat or (el.is_float and el.bits == 16):
        raise CodegenError(f"vectors of {el} are not supported by the C backend")
    return el


def vector_name(elem: DataType, lanes: int) -> str:
    """Typedef name of the GCC vector of ``lanes`` ``elem`` values, e.g. ``float32x8``."""
    return f"{elem.element}x{lanes}"


def mask_dtype(bits: int) -> DataType:
    return DataType(f"int{bits}")


def int_literal(value: int, dt: DataType, force_wide: bool = False) -> str:
    """C literal of an integer constant of type ``dt``."""
    dt = dt.element
    if dt.is_bool:
        return "1" if value else "0"
    if dt.is_uint:
        suffix = "ULL" if dt.bits == 64 else ("U" if dt.bits == 32 else "")
        return f"{value}{suffix}"
    if dt.bits == 64:
        if value == -(2**63):
            return "(-9223372036854775807LL - 1)"
        wide = force_wide or not -(2**31) < value < 2**31
        text = f"{value}LL" if wide else str(value)
    else:
        text = str(value)
    return f"({text})" if value < 0 else text


def _float_text(value: float, suffix: str) -> str:
    if math.isnan(value):
        return "NAN" if suffix == "f" else "((double)NAN)"
    if math.isinf(value):
        inf = "INFINITY" if suffix == "f" else "((double)INFINITY)"
        return inf if value > 0 else f"(-{inf})"
    # Shortest decimal that reads back as the same float32 (``f``) or double.
    text = str(np.float32(value)) if suffix == "f" else repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    text += suffix
    return f"({text})" if value < 0 or text.startswith("-") else text


def float_literal(value: float, dt: DataType) -> str:
    """C literal of a float constant, already rounded to ``dt``'s precision."""
    dt = dt.element
    if dt.is_bfloat:
        import ml_dtypes

        return _float_text(float(np.float32(ml_dtypes.bfloat16(value))), "f")
    if dt.bits == 16:
        with np.errstate(over="ignore"):
            return f"((_Float16){_float_text(float(np.float16(value)), 'f')})"
    if dt.bits == 32:
        with np.errstate(over="ignore"):
            return _float_text(float(np.float32(value)), "f")
    return _float_text(float(value), "")


def c_string(text: str, printf: bool = False) -> str:
    """A C string literal of ``text`` (UTF-8); ``printf=True`` also doubles ``%``."""
    parts: list[str] = []
    for b in text.encode("utf-8"):
        ch = chr(b)
        if ch in '\\"':
            parts.append("\\" + ch)
        elif ch == "%" and printf:
            parts.append("%%")
        elif 32 <= b < 127:
            parts.append(ch)
        else:
            parts.append(f"\\{b:03o}")
    return '"' + "".join(parts) + '"'
