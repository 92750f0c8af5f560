"""C spellings of kiln data types and constants.

Scalars: ``float``/``double``, ``int8_t``..``uint64_t``, ``_Bool`` for bool values (stored as one
``uint8_t`` byte in buffers, like numpy). Vectors are GCC vector extensions named after the dtype
(``float32x8``); bool vectors are lane masks (``int32x8`` with -1/0 lanes) whose width follows
the values that produced them.

float16 and bfloat16 ("low-precision floats") are *stored* in 16 bits and, unless the target
computes in float16 natively, *computed* in float32 (see :func:`compute_dtype`):

- widened (the default; every bfloat16, and float16 on targets without AVX512-FP16): buffers are
  ``uint16_t``; a load converts to float32 exactly, arithmetic runs in float32, and a store or an
  explicit cast to float16/bfloat16 rounds to nearest even (NaN stays NaN);
- native float16 (``native_fp16=True``: the target has ``avx512fp16``): buffers and values are
  ``_Float16`` and arithmetic is float16 arithmetic.
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


F32 = DataType("float32")


def is_low_float(dt: DataType) -> bool:
    """float16 or bfloat16 (any lanes)."""
    el = dt.element
    return el.is_bfloat or (el.is_float and el.bits == 16)


def compute_dtype(dt: DataType, native_fp16: bool = False) -> DataType:
    """Element type that holds ``dt``'s values in generated C expressions (float32 for
    low-precision floats computed widened; ``dt``'s element otherwise)."""
    el = dt.element
    if el.is_bfloat or (el.is_float and el.bits == 16 and not native_fp16):
        return F32
    return el


def value_ctype(dt: DataType, native_fp16: bool = True) -> str:
    """C type holding one scalar *value* of ``dt`` in expressions and local variables."""
    dt = compute_dtype(dt, native_fp16)
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


def storage_ctype(dt: DataType, native_fp16: bool = True) -> str:
    """C element type of a *buffer* of ``dt``."""
    dt = dt.element
    if dt.is_bool:
        return "uint8_t"
    if is_low_float(dt) and not (native_fp16 and not dt.is_bfloat):
        return "uint16_t"
    return value_ctype(dt)


def vector_elem_dtype(dt: DataType, native_fp16: bool = False) -> DataType:
    """The element type of the GCC vector that holds ``dt`` (bool vectors: see mask types);
    low-precision floats are held as float32 vectors unless float16 is native."""
    return compute_dtype(dt, native_fp16)


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


def float_literal(value: float, dt: DataType, native_fp16: bool = True) -> str:
    """C literal of a float constant, already rounded to ``dt``'s precision (a float literal
    for a low-precision float held in float32)."""
    dt = dt.element
    if dt.is_bfloat:
        import ml_dtypes

        return _float_text(float(np.float32(ml_dtypes.bfloat16(value))), "f")
    if dt.bits == 16:
        with np.errstate(over="ignore"):
            text = _float_text(float(np.float16(value)), "f")
        return f"((_Float16){text})" if native_fp16 else text
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
