"""Attribute normalization and window arithmetic shared by convolution and pooling.

Window attributes (``strides``, ``dilation``, ``padding`` given as one int, ``(vertical,
horizontal)`` or ``(top, left, bottom, right)``) are normalized to tuples of python ints; the
output size of a (padded, dilated, strided) window, the index clamping that keeps every load of
a padded window inside its buffer, and the inverse map from an input position to the window
that reads it (what the adjoints use) are computed here once for every window operator.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ... import tir
from ...ir.dtype import DataType
from ...ir.errors import KilnError, StructInfoError
from ...tir import expr as tx
from ...tir.expr import PrimExpr
from ..grad import clamp_into
from ..linalg import const_int, fmt_dim, simplify

I64 = DataType("int64")


def _ints(value: Any, n: int, op: str, what: str) -> tuple[int, ...]:
    """``value`` (an int or a sequence of ints) as an n-tuple of python ints."""
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return (int(value),) * n
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        vals = tuple(value)
        if len(vals) == n and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            return tuple(int(v) for v in vals)
    raise KilnError(f"{op}: {what} must be an int or {n} ints, got {value!r}")


def norm_pair(value: Any, op: str, what: str, minimum: int = 1) -> tuple[int, int]:
    vals = _ints(value, 2, op, what)
    if any(v < minimum for v in vals):
        raise KilnError(f"{op}: {what} must be >= {minimum}, got {value!r}")
    return vals  # type: ignore[return-value]


def norm_padding(value: Any, op: str) -> tuple[int, int, int, int]:
    """``int``, ``(v, h)`` or ``(top, left, bottom, right)`` -> ``(top, left, bottom, right)``."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        v, h = _ints(value, 2, op, "padding")
        vals = (v, h, v, h)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 4:
        vals = _ints(value, 4, op, "padding")
    elif isinstance(value, int) and not isinstance(value, bool):
        vals = (value,) * 4
    else:
        raise KilnError(
            f"{op}: padding must be an int, (vertical, horizontal) or (top, left, bottom, "
            f"right), got {value!r}"
        )
    if any(p < 0 for p in vals):
        raise KilnError(f"{op}: padding must be non-negative, got {value!r}")
    return vals  # type: ignore[return-value]


def set_frozen(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


def i64(v: Any) -> Any:
    return tir.const(I64, v) if isinstance(v, int) else v


def out_dim(size: Any, kernel: Any, stride: int, dilation: int, pad_lo: int, pad_hi: int,
             ceil_mode: bool = False) -> Any:
    """Number of window positions along one axis (an int64 PrimExpr, folded when static)."""
    size, kernel = i64(size), i64(kernel)
    span = size + (pad_lo + pad_hi) - (kernel - 1) * dilation - 1
    if not ceil_mode:
        return simplify(tir.floordiv(span, stride) + 1)
    out = tir.floordiv(span + (stride - 1), stride) + 1
    # the last window must start inside the input or the leading padding
    out = out - tir.select(tir.ge((out - 1) * stride, size + pad_lo), tir.const(I64, 1),
                           tir.const(I64, 0))
    return simplify(out)


def check_out_dim(op: str, what: str, dim: Any, size: Any) -> None:
    if const_int(dim) is not None and const_int(dim) <= 0:
        raise StructInfoError(
            f"{op}: the window does not fit the input: {what} {fmt_dim(size)} (with padding) "
            f"is smaller than the (dilated) kernel"
        )


def clamp_index(idx: Any, size: Any, lo: bool, hi: bool) -> Any:
    """``idx`` clamped into ``[0, size)`` on the sides that can overflow."""
    if hi:
        idx = tir.min(idx, i64(size) - 1)
    if lo:
        idx = tir.max(idx, tir.const(I64, 0))
    return idx


def needs_guard(size: Any, out: Any, kernel: Any, stride: int, dilation: int,
                 pad_lo: int) -> tuple[bool, bool]:
    """Whether taps can fall before the start / past the end of the input along one axis."""
    lo = pad_lo > 0
    s, o, k = const_int(size), const_int(out), const_int(kernel)
    if s is None or o is None or k is None:
        return lo, True
    last = (o - 1) * stride + (k - 1) * dilation - pad_lo
    return lo, last >= s


def window_source(pos: PrimExpr, tap: PrimExpr, stride: int, dilation: int, pad_lo: int,
                   out: PrimExpr) -> tuple[PrimExpr, list[PrimExpr]]:
    """The output position whose window puts tap ``tap`` on input position ``pos`` (clamped
    into range) and the conditions under which it exists."""
    t = pos + pad_lo - tap * dilation if pad_lo else pos - tap * dilation
    q = tx.floordiv(t, stride) if stride != 1 else t
    conds = [t >= 0, q < out]
    if stride != 1:
        conds.append(tx.eq(tx.floormod(t, stride), 0))
    return clamp_into(q, out), conds
