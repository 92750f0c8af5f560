"""String operators, run by host functions (``kiln.runtime.string_funcs``).

A string tensor is a tensor of dtype ``string`` (``kiln.ir.dtype.TypeCode.STRING``): its shape
and rank are known to the graph like any tensor's, its elements are Python ``str`` held by the
executor in a numpy object array. No kernel reads text, so every op here is legalized to a host
function (OPAQUE, NON_DIFFERENTIABLE, never mixed precision). Results whose shape depends on the
text (``string_normalizer`` drops stop words, ``string_split`` pads to the longest split) have a
known rank and an unknown shape; the frontend ``match_cast``\\ s them to fresh symbolic dims.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..runtime import string_funcs  # noqa: F401 - registers the host functions
from .common import arg_ndim, arg_shape, broadcast_sinfo, tensor_arg, tensor_sinfo
from .host import register_host_op

__all__ = [
    "cast_from_string", "cast_to_string", "category_mapper", "label_encoder",
    "regex_full_match", "string_concat", "string_equal", "string_normalizer", "string_split",
    "string_split_count",
]


def _string_arg(call: Any, index: int, op: str, arg: str) -> Any:
    sinfo = tensor_arg(call, index, op, arg)
    if not sinfo.dtype.is_string:
        raise StructInfoError(f"{op}: {arg} must be a string tensor, got {sinfo}")
    return sinfo


def _same_shape(call: Any, op: str, dtype: str) -> Any:
    x = _string_arg(call, 0, op, "x")
    return tensor_sinfo(arg_shape(x), dtype, arg_ndim(x))


@dataclass(frozen=True)
class StringNormalizerAttrs:
    case_change_action: str = "NONE"
    is_case_sensitive: bool = False
    locale: str = ""
    stopwords: tuple[str, ...] = ()

    def __post_init__(self):
        if self.case_change_action not in ("NONE", "LOWER", "UPPER"):
            raise KilnError(f"string_normalizer: case_change_action must be NONE, LOWER or "
                            f"UPPER, got {self.case_change_action!r}")
        object.__setattr__(self, "stopwords", tuple(str(w) for w in self.stopwords))


def _normalizer_infer(call: Any) -> Any:
    x = _string_arg(call, 0, "string_normalizer", "x")
    ndim = arg_ndim(x)
    shape = arg_shape(x)
    if ndim not in (1, 2) or (shape is not None and ndim == 2 and const_dim(shape[0]) not in
                              (1, None)):
        raise StructInfoError(f"string_normalizer: x must be [C] or [1, C], got {x}")
    if not call.attrs.stopwords and shape is not None:
        return x  # nothing is dropped: the shape stays
    return tensor_sinfo(None, "string", ndim)


def const_dim(dim: Any) -> int | None:
    return getattr(dim, "value", None)


string_normalizer = register_host_op(
    "string_normalizer", ("x",), _normalizer_infer, StringNormalizerAttrs,
    "ONNX StringNormalizer: drop stop words from a [C] or [1, C] string tensor and change the "
    "case; one empty string when nothing is left.")

string_concat = register_host_op(
    "string_concat", ("a", "b"),
    lambda call: (_string_arg(call, 0, "string_concat", "a"),
                  _string_arg(call, 1, "string_concat", "b"),
                  broadcast_sinfo(call, "string_concat", ("a", "b"), "string"))[2],
    None, "Element-wise concatenation of two string tensors (numpy broadcasting).")

string_equal = register_host_op(
    "string_equal", ("a", "b"),
    lambda call: (_string_arg(call, 0, "string_equal", "a"),
                  _string_arg(call, 1, "string_equal", "b"),
                  broadcast_sinfo(call, "string_equal", ("a", "b"), "bool"))[2],
    None, "Element-wise equality of two string tensors (numpy broadcasting).")


@dataclass(frozen=True)
class StringSplitAttrs:
    """``delimiter`` ("" : runs of whitespace); at most ``maxsplit`` splits (None: all)."""

    delimiter: str = ""
    maxsplit: int | None = None

    def __post_init__(self):
        if self.maxsplit is not None and self.maxsplit < 0:
            raise KilnError(f"string_split: maxsplit must be >= 0, got {self.maxsplit}")


def _split_infer(call: Any) -> Any:
    x = _string_arg(call, 0, "string_split", "x")
    ndim = arg_ndim(x)
    if ndim < 0:
        raise StructInfoError("string_split: the input's rank must be known")
    return tensor_sinfo(None, "string", ndim + 1)


string_split = register_host_op(
    "string_split", ("x",), _split_infer, StringSplitAttrs,
    "ONNX StringSplit's substrings: x.shape + [longest split], padded with empty strings.")

string_split_count = register_host_op(
    "string_split_count", ("x",),
    lambda call: _same_shape(call, "string_split_count", "int64"), StringSplitAttrs,
    "ONNX StringSplit's counts: the number of substrings of each string (int64).")


@dataclass(frozen=True)
class RegexFullMatchAttrs:
    pattern: str = ""


regex_full_match = register_host_op(
    "regex_full_match", ("x",), lambda call: _same_shape(call, "regex_full_match", "bool"),
    RegexFullMatchAttrs, "Whether each string matches ``pattern`` as a whole (bool).")


@dataclass(frozen=True)
class LabelEncoderAttrs:
    """``keys -> values`` (numbers or strings), ``default`` for unknown inputs, the result's
    ``dtype`` (``"string"`` for string values)."""

    keys: tuple[Any, ...] = ()
    values: tuple[Any, ...] = ()
    default: Any = None
    dtype: str = "int64"

    def __post_init__(self):
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "values", tuple(self.values))
        object.__setattr__(self, "dtype", str(as_dtype(self.dtype)))
        if len(self.keys) != len(self.values):
            raise KilnError(f"label_encoder: {len(self.keys)} keys but {len(self.values)} "
                            "values")


def _label_encoder_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "label_encoder", "x")
    return tensor_sinfo(arg_shape(x), call.attrs.dtype, arg_ndim(x))


label_encoder = register_host_op(
    "label_encoder", ("x",), _label_encoder_infer, LabelEncoderAttrs,
    "ai.onnx.ml LabelEncoder: map each element through ``keys -> values``.")


@dataclass(frozen=True)
class CategoryMapperAttrs:
    cats_strings: tuple[str, ...] = ()
    cats_int64s: tuple[int, ...] = ()
    default_string: str = "_Unused"
    default_int64: int = -1

    def __post_init__(self):
        object.__setattr__(self, "cats_strings", tuple(str(s) for s in self.cats_strings))
        object.__setattr__(self, "cats_int64s", tuple(int(v) for v in self.cats_int64s))
        if len(self.cats_strings) != len(self.cats_int64s):
            raise KilnError(f"category_mapper: {len(self.cats_strings)} strings but "
                            f"{len(self.cats_int64s)} int64 categories")


def _category_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "category_mapper", "x")
    if not x.dtype.is_string and str(x.dtype) != "int64":
        raise StructInfoError(f"category_mapper: x must be a string or int64 tensor, got {x}")
    return tensor_sinfo(arg_shape(x), "int64" if x.dtype.is_string else "string", arg_ndim(x))


category_mapper = register_host_op(
    "category_mapper", ("x",), _category_infer, CategoryMapperAttrs,
    "ai.onnx.ml CategoryMapper: strings to int64 categories or back.")


def _to_string_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "cast_to_string", "x")
    if x.dtype.is_string:
        raise StructInfoError("cast_to_string: x is a string tensor already")
    return tensor_sinfo(arg_shape(x), "string", arg_ndim(x))


cast_to_string = register_host_op(
    "cast_to_string", ("x",), _to_string_infer, None,
    "Each element's text (ONNX Cast to STRING).")


@dataclass(frozen=True)
class CastFromStringAttrs:
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "dtype", str(as_dtype(self.dtype)))


cast_from_string = register_host_op(
    "cast_from_string", ("x",),
    lambda call: _same_shape(call, "cast_from_string", call.attrs.dtype), CastFromStringAttrs,
    "Each string read as a number of ``dtype`` (ONNX Cast from STRING).")
