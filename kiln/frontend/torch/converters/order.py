"""Order statistics: median, nanmedian, kthvalue, mode (values and indices), from kiln's
``topk``.

Each is the k-th smallest entry of a line: ``topk`` of the k smallest (ascending, with their
positions) and its last slot. NaN follows torch: ``median`` propagates it (a line holding
one has the NaN as median, at its first position), ``kthvalue`` ranks it above every number,
and ``nanmedian`` takes the median of the numbers only (NaN for a line of NaNs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from .common import dtype_of, ndim_of, norm_dim, reshape, scalar, shape_of, static_int


def _kth(ctx: Any, node: Any, x: Any, axis: int, k: int) -> tuple[Any, Any]:
    """(values, indices) of the k-th smallest (1-based) entries along ``axis``, kept dims."""
    out = ctx.emit(op.topk(x, k, axis=axis, largest=False))
    vals, idx = g.TupleGetItem(out, 0), g.TupleGetItem(out, 1)
    return (op.strided_slice(vals, (k - 1,), (k,), axes=(axis,)),
            op.strided_slice(idx, (k - 1,), (k,), axes=(axis,)))


def _isnan(x: Any) -> Any:
    return op.not_equal(x, x)


def _line_length(node: Any, x: Any, axis: int) -> int:
    n = static_int(shape_of(x)[axis])
    if n is None:
        raise node.error("needs a static size along the reduced dimension")
    return n


def _with_nan(x: Any, axis: int, vals: Any, idx: Any) -> tuple[Any, Any]:
    """Lines holding a NaN: the NaN and its first position."""
    isnan = _isnan(x)
    has = op.max(op.cast(isnan, "int8"), axis=(axis,), keepdims=True)
    where_nan = op.expand_dims(op.argmax(op.cast(isnan, "int8"), axis=axis), axis)
    hit = op.greater(has, scalar(0, "int8"))
    return (op.where(hit, scalar(float("nan"), dtype_of(x)), vals),
            op.where(hit, where_nan, idx))


def _finish(vals: Any, idx: Any, axis: int, keep: bool) -> list[Any]:
    if keep:
        return [vals, idx]
    return [op.squeeze(vals, axis=(axis,)), op.squeeze(idx, axis=(axis,))]


@converter("aten.median.default", "aten.nanmedian.default")
def median_all(ctx: Any, node: Any) -> Any:
    x = reshape(node.arg(0), (-1,))
    n = _line_length(node, x, 0)
    nan_skipping = "nanmedian" in node.op_name
    if n == 0:
        return scalar(float("nan"), dtype_of(x))
    if nan_skipping:
        vals, _ = _nan_median(ctx, x, 0, n)
        return reshape(vals, ())
    vals, idx = _kth(ctx, node, x, 0, (n - 1) // 2 + 1)
    if dtype_of(x).startswith(("float", "bfloat")):
        vals, idx = _with_nan(x, 0, vals, idx)
    return reshape(vals, ())


def _nan_median(ctx: Any, x: Any, axis: int, n: int) -> tuple[Any, Any]:
    """The median of each line's numbers: NaN sorted last (as +inf, then restored), the
    ``(count - 1) // 2``-th entry of the sorted line; NaN (position 0) for lines of NaNs."""
    dt = dtype_of(x)
    isnan = ctx.emit(_isnan(x))
    count = op.sum(op.cast(op.logical_not(isnan), "int64"), axis=(axis,), keepdims=True)
    key = op.where(isnan, scalar(float("inf"), dt), x)
    out = ctx.emit(op.topk(key, n, axis=axis, largest=False))
    pos = ctx.emit(op.maximum(op.floor_divide(op.subtract(count, scalar(1, "int64")),
                                              scalar(2, "int64")), scalar(0, "int64")))
    idx = op.gather_elements(g.TupleGetItem(out, 1), pos, axis=axis)
    vals = op.gather_elements(x, idx, axis=axis)
    empty = op.equal(count, scalar(0, "int64"))
    return (op.where(empty, scalar(float("nan"), dt), vals),
            op.where(empty, scalar(0, "int64"), idx))


@converter("aten.median.dim", "aten.nanmedian.dim")
def median_dim(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    keep = bool(node.arg("keepdim", False))
    if ndim_of(x) == 0:
        return [x, scalar(0, "int64")]
    axis = norm_dim(int(node.arg(1)), ndim_of(x))
    n = _line_length(node, x, axis)
    is_float = dtype_of(x).startswith(("float", "bfloat"))
    if "nanmedian" in node.op_name and is_float:
        vals, idx = _nan_median(ctx, x, axis, n)
        return _finish(vals, idx, axis, keep)
    vals, idx = _kth(ctx, node, x, axis, (n - 1) // 2 + 1)
    if is_float:
        vals, idx = _with_nan(x, axis, vals, idx)
    return _finish(vals, idx, axis, keep)


@converter("aten.kthvalue.default")
def kthvalue(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    k = int(node.arg(1))
    keep = bool(node.arg("keepdim", False))
    if ndim_of(x) == 0:
        return [x, scalar(0, "int64")]
    axis = norm_dim(int(node.arg("dim", -1)), ndim_of(x))
    if not dtype_of(x).startswith(("float", "bfloat")):
        return _finish(*_kth(ctx, node, x, axis, k), axis, keep)
    # NaN counts as the largest value: ranked as +inf, read back from x
    _, idx = _kth(ctx, node, op.where(_isnan(x), scalar(float("inf"), dtype_of(x)), x), axis, k)
    return _finish(op.gather_elements(x, idx, axis=axis), idx, axis, keep)


def _running_max(ctx: Any, v: Any, axis: int, n: int) -> Any:
    """The running maximum of non-negative ints along ``axis``: log2(n) doubling steps, each
    taking the max with the line shifted by ``s`` (zeros shifted in)."""
    s = 1
    while s < n:
        width = [(0, 0)] * ndim_of(v)
        width[axis] = (s, 0)
        shifted = op.pad(op.strided_slice(v, (0,), (n - s,), axes=(axis,)), tuple(width))
        v = ctx.emit(op.maximum(v, shifted))
        s *= 2
    return v


@converter("aten.mode.default")
def mode(ctx: Any, node: Any) -> Any:
    """The most frequent value of each line and a position holding it: the line sorted
    (``topk``, equal values in input order), the length of the run of equal values so far at
    each sorted position (the position minus the run's start, a running max of the run
    starts), the first position where it peaks. So ties between values go to the smallest,
    and the position is the value's last occurrence, as torch's CPU kernel reports; NaNs
    count as one value, sorted last."""
    x = node.arg(0)
    keep = bool(node.arg("keepdim", False))
    if ndim_of(x) == 0:
        return [x, scalar(0, "int64")]
    axis = norm_dim(int(node.arg("dim", -1)), ndim_of(x))
    n = _line_length(node, x, axis)
    out = ctx.emit(op.topk(x, n, axis=axis, largest=False))
    vals, idx = g.TupleGetItem(out, 0), g.TupleGetItem(out, 1)
    line = [1] * ndim_of(x)
    line[axis] = n
    pos = g.const(np.arange(n, dtype=np.int64).reshape(line))
    width = [(0, 0)] * ndim_of(x)
    width[axis] = (1, 0)
    prev = op.pad(op.strided_slice(vals, (0,), (n - 1,), axes=(axis,)), tuple(width))
    same = op.equal(vals, prev)
    if dtype_of(x).startswith(("float", "bfloat")):
        same = op.logical_or(same, op.logical_and(_isnan(vals), _isnan(prev)))
    same = op.logical_and(same, op.greater(pos, scalar(0, "int64")))
    starts = op.where(same, scalar(0, "int64"), op.broadcast_to(pos, shape_of(x)))
    run = op.subtract(pos, _running_max(ctx, ctx.emit(starts), axis, n))
    best = op.expand_dims(op.argmax(run, axis=axis), axis)
    return _finish(op.gather_elements(vals, best, axis=axis),
                   op.gather_elements(idx, best, axis=axis), axis, keep)
