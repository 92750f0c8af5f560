"""Host functions on string tensors (ONNX StringNormalizer, StringConcat, StringSplit,
RegexFullMatch, Equal on strings, Cast to and from string; ai.onnx.ml LabelEncoder and
CategoryMapper).

A string tensor is a numpy object array of Python ``str`` (``kiln.runtime.host_values``):
text has no fixed width and no kernel reads it, so these operators are host steps. Each
function returns a fresh array (object arrays for strings). Regular expressions use Python's
``re``, whose syntax covers what ONNX's RE2 patterns use (RE2 has no backreferences or
lookaround; a pattern using them is accepted here too); a pattern ``re`` rejects is a
``ValueError``.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from .host_funcs import host_func


def _strings(values: Sequence[str], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(values), object)
    out[:] = list(values)
    return out.reshape(shape)


def _map(fn: Any, x: np.ndarray, otype: Any) -> np.ndarray:
    """``fn`` applied to every element of ``x``, as an array of ``otype`` (object: strings)."""
    flat = [fn(v) for v in x.reshape(-1)]
    if otype is object:
        return _strings(flat, x.shape)
    return np.array(flat, dtype=otype).reshape(x.shape)


@host_func("string_normalizer")
def string_normalizer(x: np.ndarray, case_change_action: str = "NONE",
                      is_case_sensitive: bool = False, locale: str = "",
                      stopwords: Sequence[str] = ()) -> np.ndarray:
    """ONNX StringNormalizer on ``[C]`` or ``[1, C]``: drop the elements that are stop words
    (compared case-insensitively unless ``is_case_sensitive``), then change the case; when
    nothing is left the result is one empty string (``[1]`` / ``[1, 1]``). ``locale`` is
    accepted as ONNX does; case mapping is Unicode's (what every locale but Turkish gives)."""
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise ValueError(f"StringNormalizer: the input must be [C] or [1, C], got shape "
                         f"{x.shape}")
    if case_change_action not in ("NONE", "LOWER", "UPPER"):
        raise ValueError(f"StringNormalizer: case_change_action must be NONE, LOWER or UPPER, "
                         f"got {case_change_action!r}")
    if is_case_sensitive:
        stops = set(stopwords)
        kept = [w for w in x.reshape(-1) if w not in stops]
    else:
        stops = {w.lower() for w in stopwords}
        kept = [w for w in x.reshape(-1) if w.lower() not in stops]
    if case_change_action == "LOWER":
        kept = [w.lower() for w in kept]
    elif case_change_action == "UPPER":
        kept = [w.upper() for w in kept]
    if not kept:
        kept = [""]
    return _strings(kept, (len(kept),) if x.ndim == 1 else (1, len(kept)))


def _broadcast(fn: Any, a: np.ndarray, b: np.ndarray, otype: Any) -> np.ndarray:
    """``fn`` of the elements of ``a`` and ``b`` broadcast together (0-d included)."""
    x, y = np.broadcast_arrays(a, b)
    flat = [fn(u, v) for u, v in zip(x.reshape(-1), y.reshape(-1))]
    if otype is object:
        return _strings(flat, x.shape)
    return np.array(flat, dtype=otype).reshape(x.shape)


@host_func("string_concat")
def string_concat(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise ``a + b`` with numpy broadcasting."""
    return _broadcast(operator.add, a, b, object)


@host_func("string_equal")
def string_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise ``a == b`` with numpy broadcasting (ONNX Equal on strings)."""
    return _broadcast(operator.eq, a, b, np.bool_)


def _split(text: str, delimiter: str, maxsplit: int | None) -> list[str]:
    limit = -1 if maxsplit is None else maxsplit
    return text.split(delimiter or None, limit)


@host_func("string_split")
def string_split(x: np.ndarray, delimiter: str = "", maxsplit: int | None = None
                 ) -> np.ndarray:
    """ONNX StringSplit's substrings: ``x.shape + [longest split]``, padded with ``""``.
    An empty delimiter splits at runs of whitespace (ignoring it at both ends), as Python's
    ``str.split()``; at most ``maxsplit`` splits per string."""
    parts = [_split(v, delimiter, maxsplit) for v in x.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    flat = [s for p in parts for s in (*p, *([""] * (width - len(p))))]
    return _strings(flat, (*x.shape, width))


@host_func("string_split_count")
def string_split_count(x: np.ndarray, delimiter: str = "", maxsplit: int | None = None
                       ) -> np.ndarray:
    """ONNX StringSplit's second output: the number of substrings of each string."""
    return _map(lambda v: len(_split(v, delimiter, maxsplit)), x, np.int64)


@functools.lru_cache(maxsize=64)
def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as err:
        raise ValueError(f"RegexFullMatch: invalid pattern {pattern!r}: {err}") from None


@host_func("regex_full_match")
def regex_full_match(x: np.ndarray, pattern: str = "") -> np.ndarray:
    """Whether each string matches ``pattern`` as a whole."""
    regex = _compile(pattern)
    return _map(lambda v: regex.fullmatch(v) is not None, x, np.bool_)


def _key(v: Any) -> Any:
    """A dictionary key for a LabelEncoder key or input element: NaN keys match NaN inputs
    (as the operator requires), numbers compare by value."""
    if isinstance(v, (float, np.floating)) and math.isnan(v):
        return "nan"  # no string key can collide: string and number keys never mix
    if isinstance(v, np.generic):
        return v.item()
    return v


@host_func("label_encoder")
def label_encoder(x: np.ndarray, keys: Sequence[Any] = (), values: Sequence[Any] = (),
                  default: Any = None, dtype: str = "int64") -> np.ndarray:
    """ai.onnx.ml LabelEncoder: each element of ``x`` mapped through ``keys -> values``
    (``default`` for the others), as an array of ``dtype`` (``"string"``: strings)."""
    if len(keys) != len(values):
        raise ValueError(f"LabelEncoder: {len(keys)} keys but {len(values)} values")
    table = {_key(k): v for k, v in zip(keys, values)}
    otype = object if dtype == "string" else np.dtype(dtype)
    return _map(lambda v: table.get(_key(v), default), x, otype)


@host_func("category_mapper")
def category_mapper(x: np.ndarray, cats_strings: Sequence[str] = (),
                    cats_int64s: Sequence[int] = (), default_string: str = "_Unused",
                    default_int64: int = -1) -> np.ndarray:
    """ai.onnx.ml CategoryMapper: strings to their int64 category (``default_int64`` when
    unknown), or int64 categories to their strings (``default_string``)."""
    if len(cats_strings) != len(cats_int64s):
        raise ValueError(f"CategoryMapper: {len(cats_strings)} strings but {len(cats_int64s)} "
                         "int64 categories")
    if x.dtype == object:
        table = dict(zip(cats_strings, cats_int64s))
        return _map(lambda v: table.get(v, default_int64), x, np.int64)
    codes = dict(zip(cats_int64s, cats_strings))
    return _map(lambda v: codes.get(int(v), default_string), x, object)


@host_func("cast_to_string")
def cast_to_string(x: np.ndarray) -> np.ndarray:
    """ONNX Cast to STRING: numpy's text of each element (``1.5``, ``-3``, ``True``, ``nan``,
    ``inf``), as the ONNX reference writes them. numpy has no text for the ml_dtypes types
    (bfloat16, float8, int4, ...: kind ``V``): their values are written as float32 / int64."""
    if x.dtype.kind == "V":
        x = x.astype(np.int64 if "int" in x.dtype.name else np.float32)
    return x.astype(np.str_).astype(object)


@host_func("cast_from_string")
def cast_from_string(x: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """ONNX Cast from STRING: each string parsed as a number of ``dtype`` (``"NaN"``,
    ``"INF"``, ``"-inf"`` and exponents are accepted for floats); text that is not a number is
    a ``ValueError``."""
    target = np.dtype(dtype)
    try:
        if target.kind == "b":
            return _map(lambda v: _parse_bool(v), x, np.bool_)
        if target.kind in "iu":
            return _map(lambda v: int(float(v)) if not v.strip().lstrip("+-").isdigit()
                        else int(v), x, target)
        return _map(float, x, np.float64).astype(target)
    except (ValueError, OverflowError) as err:
        raise ValueError(f"Cast: cannot read the strings as {dtype}: {err}") from None


def _parse_bool(v: str) -> bool:
    text = v.strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0", ""):
        return False
    return bool(float(text))
