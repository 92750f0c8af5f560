"""ONNX string operators (``kiln.op.strings``, run as host functions).

StringNormalizer, StringConcat, StringSplit, RegexFullMatch, Equal on strings, Cast to and
from STRING (:func:`string_cast`, used by the Cast converters) and the ai.onnx.ml LabelEncoder
and CategoryMapper. Results whose shape depends on the text get fresh symbolic dims
(``sequence.bind_dims``). Nodes whose inputs are all constants are evaluated at import with
the same host functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import op
from ....ir.dtype import as_dtype
from ....runtime import string_funcs
from ..importer import as_text, initializer_array
from ..registry import converter
from .common import dtype_of
from .sequence import bind_dims

ML = "ai.onnx.ml"


def _string_input(node: Any, i: int) -> Any:
    x = node.input(i)
    if dtype_of(x) != "string":
        raise node.error(f"input {i} must be a string tensor, got {x.struct_info}")
    return x


@converter("StringNormalizer", since=10)
def string_normalizer(ctx: Any, node: Any) -> Any:
    x = _string_input(node, 0)
    value = op.string_normalizer(
        x, case_change_action=node.attr("case_change_action", "NONE"),
        is_case_sensitive=bool(node.attr("is_case_sensitive", 0)),
        locale=node.attr("locale", ""),
        stopwords=tuple(as_text(w) for w in node.attr("stopwords", ())))
    return bind_dims(ctx, node, value, "normalized")


@converter("StringConcat", since=20)
def string_concat(ctx: Any, node: Any) -> Any:
    return op.string_concat(_string_input(node, 0), _string_input(node, 1))


@converter("Equal", since=19)
def equal(ctx: Any, node: Any) -> Any:
    """Equal: string tensors (opset 19 on) compare on the host, other dtypes as before."""
    a, b = node.input(0), node.input(1)
    if dtype_of(a) == "string" or dtype_of(b) == "string":
        return op.string_equal(_string_input(node, 0), _string_input(node, 1))
    return op.equal(a, b)


@converter("StringSplit", since=20)
def string_split(ctx: Any, node: Any) -> Any:
    x = _string_input(node, 0)
    delimiter = node.attr("delimiter", "") or ""
    maxsplit = node.attrs.get("maxsplit")
    attrs = {"delimiter": delimiter, "maxsplit": None if maxsplit is None else int(maxsplit)}
    parts = bind_dims(ctx, node, op.string_split(x, **attrs), "substrings")
    return [parts, op.string_split_count(x, **attrs)]


@converter("RegexFullMatch", since=20)
def regex_full_match(ctx: Any, node: Any) -> Any:
    pattern = node.attr("pattern")
    if pattern is None:
        raise node.error("the pattern attribute is required")
    try:
        string_funcs.regex_full_match(np.empty(0, object), pattern=pattern)  # check it here
    except ValueError as err:
        raise node.error(str(err)) from None
    return op.regex_full_match(_string_input(node, 0), pattern=pattern)


# =============================================================================================
# ai.onnx.ml
# =============================================================================================
#: LabelEncoder's key/value attributes by type, with the default attribute and the dtype.
_LABEL_KINDS = (("strings", "default_string", "string", "_Unused"),
                ("int64s", "default_int64", "int64", -1),
                ("floats", "default_float", "float32", -0.0))


def _tensor_attr(node: Any, name: str) -> np.ndarray | None:
    value = node.attrs.get(name)
    return None if value is None else initializer_array(value, None)


def _label_side(node: Any, side: str) -> tuple[list[Any], str, Any]:
    """(items, dtype, default) of LabelEncoder's keys or values."""
    tensor = _tensor_attr(node, f"{side}_tensor")
    if tensor is not None:
        dtype = "string" if tensor.dtype == object else tensor.dtype.name
        default = _tensor_attr(node, "default_tensor") if side == "values" else None
        if default is not None:
            default = default.reshape(-1)[0]
            default = str(default) if dtype == "string" else default.item()
        elif side == "values":
            default = "_Unused" if dtype == "string" else (-0.0 if "float" in dtype else -1)
        return [v.item() if hasattr(v, "item") else v for v in tensor.reshape(-1)], dtype, \
            default
    found = [(kind, dflt_attr, dtype, dflt) for kind, dflt_attr, dtype, dflt in _LABEL_KINDS
             if node.attrs.get(f"{side}_{kind}") is not None]
    if len(found) != 1:
        raise node.error(f"exactly one of the {side}_* attributes must be given, got "
                         f"{len(found)}")
    kind, dflt_attr, dtype, dflt = found[0]
    items = list(node.attr(f"{side}_{kind}"))
    if kind == "strings":
        items = [as_text(v) for v in items]
    default = node.attr(dflt_attr, dflt)
    if kind == "floats":
        items = [float(np.float32(v)) for v in items]
        default = float(np.float32(default))
    return items, dtype, default


@converter("LabelEncoder", since=1, domain=ML)
def label_encoder(ctx: Any, node: Any) -> Any:
    keys, key_dtype, _ = _label_side(node, "keys")
    values, dtype, default = _label_side(node, "values")
    x = node.input(0)
    if str(as_dtype(dtype_of(x))) != str(as_dtype(key_dtype)):
        raise node.error(f"the input is {dtype_of(x)} but the keys are {key_dtype}")
    if len(keys) != len(values):
        raise node.error(f"{len(keys)} keys but {len(values)} values")
    return op.label_encoder(x, keys=tuple(keys), values=tuple(values), default=default,
                            dtype=dtype)


@converter("CategoryMapper", since=1, domain=ML)
def category_mapper(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    if dtype_of(x) not in ("string", "int64"):
        raise node.error(f"the input must be a string or int64 tensor, got {x.struct_info}")
    return op.category_mapper(
        x, cats_strings=tuple(as_text(v) for v in node.attr("cats_strings", ())),
        cats_int64s=tuple(int(v) for v in node.attr("cats_int64s", ())),
        default_string=as_text(node.attr("default_string", "_Unused")),
        default_int64=int(node.attr("default_int64", -1)))


def string_cast(node: Any, dtype: str) -> Any:
    """Input 0 of a Cast/CastLike node to or from STRING (the other side numeric or bool)."""
    x = node.input(0)
    src = dtype_of(x)
    if src == "string" and dtype == "string":
        return x
    if dtype == "string":
        return op.cast_to_string(x)
    dt = as_dtype(dtype)
    if not (dt.is_float or dt.is_integer or dt.is_bool) or dt.is_minifloat:
        raise node.error(f"cannot cast strings to {dtype}")
    return op.cast_from_string(x, dtype=dtype)
