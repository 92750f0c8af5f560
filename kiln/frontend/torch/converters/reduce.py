"""Reductions, scans and softmax: sum, mean, amax/amin, max/min (values and indices), argmax,
prod, any/all, var/std, logsumexp, norms, cumsum/cumprod, (log_)softmax, histc, and the
reductions by segment (segment_reduce, embedding_bag)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from .common import (
    as_tensor,
    cast,
    dtype_of,
    is_float,
    ndim_of,
    norm_dim,
    norm_dims,
    prod,
    scalar,
    shape_of,
    static_int,
)


def _axes(node: Any, x: Any, key: Any = 1) -> tuple[int, ...] | None:
    return norm_dims(node.arg(key), ndim_of(x))


def _reduce(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.arg(0)
        dt = node.out_dtype
        if dtype_of(x) != dt:  # sum(int) -> int64, sum(dtype=...), mean of an int...
            x = op.cast(x, dt)
        if ndim_of(x) == 0:  # dims 0 / -1 of a 0-d tensor: the value itself
            return x
        if "dim" not in node._names:
            return fn(x)
        keep = bool(node.arg("keepdim", False))
        return fn(x, axis=_axes(node, x, "dim"), keepdims=keep)

    return convert


converter("aten.sum.dim_IntList", "aten.sum.default")(_reduce(op.sum))
converter("aten.mean.dim", "aten.mean.default")(_reduce(op.mean))
converter("aten.prod.dim_int", "aten.prod.default")(_reduce(op.prod))


def _minmax(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.arg(0)
        if ndim_of(x) == 0:
            return x
        keep = bool(node.arg("keepdim", False))
        axes = _axes(node, x, "dim") if "dim" in node._names else None
        if dtype_of(x) == "bool":
            return op.cast(fn(op.cast(x, "int8"), axis=axes, keepdims=keep), "bool")
        out = fn(x, axis=axes, keepdims=keep)
        if is_float(dtype_of(x)):  # NaN wins, as in torch
            nan = op.max(op.cast(op.not_equal(x, x), "int8"), axis=axes, keepdims=keep)
            out = op.where(op.cast(nan, "bool"), scalar(float("nan"), dtype_of(x)), out)
        return out

    return convert


converter("aten.amax.default", "aten.max.default")(_minmax(op.max))
converter("aten.amin.default", "aten.min.default")(_minmax(op.min))


def _with_index(fn: Any, arg: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.arg(0)
        keep = bool(node.arg("keepdim", False))
        if ndim_of(x) == 0:
            return [x, scalar(0, "int64")]
        d = norm_dim(int(node.arg(1)), ndim_of(x))
        src = op.cast(x, "int8") if dtype_of(x) == "bool" else x
        values = fn(src, axis=(d,), keepdims=keep)
        index = arg(src, axis=d, keepdims=keep)
        return [cast(values, dtype_of(x)) if dtype_of(x) == "bool" else values, index]

    return convert


converter("aten.max.dim")(_with_index(op.max, op.argmax))
converter("aten.min.dim")(_with_index(op.min, op.argmin))


def _arg(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.arg(0)
        keep = bool(node.arg("keepdim", False))
        dim = node.arg("dim")
        if ndim_of(x) == 0:
            return scalar(0, "int64")
        if dim is None:
            out = fn(op.reshape(x, (-1,)), axis=0)
            return op.reshape(out, (1,) * ndim_of(x)) if keep else out
        return fn(x, axis=norm_dim(int(dim), ndim_of(x)), keepdims=keep)

    return convert


converter("aten.argmax.default")(_arg(op.argmax))
converter("aten.argmin.default")(_arg(op.argmin))


def _logic(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = op.cast(op.cast(node.arg(0), "bool"), "int8")
        if ndim_of(x) == 0:  # dims 0 / -1 of a 0-d tensor: the value itself
            return cast(op.cast(x, "bool"), node.out_dtype)
        keep = bool(node.arg("keepdim", False))
        axes = None
        if node.has("dim"):
            axes = norm_dims(node.arg("dim"), ndim_of(node.arg(0)))
        out = op.cast(fn(x, axis=axes, keepdims=keep), "bool")
        return cast(out, node.out_dtype)

    return convert


converter("aten.any.default", "aten.any.dim", "aten.any.dims")(_logic(op.max))
converter("aten.all.default", "aten.all.dim", "aten.all.dims")(_logic(op.min))


def _count(x: Any, axes: tuple[int, ...] | None) -> Any:
    dims = shape_of(x)
    return prod([dims[a] for a in (axes if axes is not None else range(len(dims)))])


def _variance(ctx: Any, node: Any) -> tuple[Any, Any]:
    """(variance, mean) of ``var.correction``/``var_mean.correction``-style nodes."""
    x = node.arg(0)
    dt = dtype_of(x)
    axes = norm_dims(node.arg("dim"), ndim_of(x))
    keep = bool(node.arg("keepdim", False))
    correction = node.arg("correction")
    correction = 1 if correction is None else correction
    mean = ctx.emit(op.mean(x, axis=axes, keepdims=True))
    dev = ctx.emit(op.subtract(x, mean))
    ss = op.sum(op.multiply(dev, dev), axis=axes, keepdims=keep)
    n = _count(x, axes)
    denom = op.maximum(op.subtract(as_tensor(n, dt, ctx), scalar(correction, dt)), scalar(0, dt))
    var = op.divide(ss, denom)
    return var, (mean if keep else op.mean(x, axis=axes, keepdims=False))


@converter("aten.var.correction", "aten.var.dim")
def var(ctx: Any, node: Any) -> Any:
    return _variance(ctx, node)[0]


@converter("aten.std.correction", "aten.std.dim")
def std(ctx: Any, node: Any) -> Any:
    return op.sqrt(_variance(ctx, node)[0])


@converter("aten.var_mean.correction")
def var_mean(ctx: Any, node: Any) -> Any:
    return list(_variance(ctx, node))


@converter("aten.std_mean.correction")
def std_mean(ctx: Any, node: Any) -> Any:
    v, m = _variance(ctx, node)
    return [op.sqrt(v), m]


@converter("aten.logsumexp.default")
def logsumexp(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    if not is_float(dtype_of(x)):
        x = op.cast(x, node.out_dtype)
    if ndim_of(x) == 0:
        return x
    axes = norm_dims(node.arg(1), ndim_of(x))
    keep = bool(node.arg("keepdim", False))
    m = ctx.emit(op.max(x, axis=axes, keepdims=True))
    finite = ctx.emit(op.where(op.less(op.abs(m), scalar(float("inf"), dtype_of(x))), m,
                               scalar(0.0, dtype_of(x))))
    s = op.sum(op.exp(op.subtract(x, finite)), axis=axes, keepdims=True)
    out = op.add(op.log(s), finite)
    return out if keep else op.squeeze(out, axis=axes if axes is not None
                                       else tuple(range(ndim_of(x))))


@converter("aten.linalg_vector_norm.default")
def vector_norm(ctx: Any, node: Any) -> Any:
    x = cast(node.arg(0), node.out_dtype)
    ordv = float(node.arg("ord", 2))
    axes = norm_dims(node.arg("dim"), ndim_of(x))
    keep = bool(node.arg("keepdim", False))
    dt = dtype_of(x)
    a = ctx.emit(op.abs(x))
    if ordv == float("inf"):
        return op.max(a, axis=axes, keepdims=keep)
    if ordv == float("-inf"):
        return op.min(a, axis=axes, keepdims=keep)
    if ordv == 0:
        return op.sum(op.cast(op.not_equal(a, scalar(0, dt)), dt), axis=axes, keepdims=keep)
    if ordv == 1:
        return op.sum(a, axis=axes, keepdims=keep)
    if ordv == 2:
        return op.sqrt(op.sum(op.multiply(a, a), axis=axes, keepdims=keep))
    p = scalar(ordv, dt)
    s = op.sum(op.power(a, p), axis=axes, keepdims=keep)
    return op.power(s, scalar(1.0 / ordv, dt))


def _scan(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.arg(0)
        dt = node.out_dtype
        if ndim_of(x) == 0:
            return cast(x, dt)
        d = norm_dim(int(node.arg(1)), ndim_of(x))
        return fn(cast(x, dt), axis=d)

    return convert


converter("aten.cumsum.default")(_scan(op.cumsum))
converter("aten.cumprod.default")(_scan(op.cumprod))


def _softmax(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = cast(node.arg(0), node.out_dtype)
        if ndim_of(x) == 0:
            return op.reshape(fn(op.reshape(x, (1,)), axis=0), ())
        return fn(x, axis=norm_dim(int(node.arg(1)), ndim_of(x)))

    return convert


converter("aten._softmax.default", "aten.softmax.int")(_softmax(op.nn.softmax))
converter("aten._log_softmax.default", "aten.log_softmax.int")(_softmax(op.nn.log_softmax))


@converter("aten.logcumsumexp.default")
def logcumsumexp(ctx: Any, node: Any) -> Any:
    """log(cumsum(exp(x))) along a dim, in float64 shifted by the line's largest finite value
    (so the exponentials neither overflow nor, for float32 inputs, underflow)."""
    x = node.arg(0)
    dt = node.out_dtype
    if ndim_of(x) == 0:
        return cast(x, dt)
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    x64 = ctx.emit(op.cast(x, "float64"))
    finite = op.less(op.abs(x64), scalar(float("inf"), "float64"))
    top = op.max(op.where(finite, x64, scalar(float("-inf"), "float64")), axis=(d,),
                 keepdims=True)
    top = ctx.emit(op.where(op.less(op.abs(top), scalar(float("inf"), "float64")), top,
                            scalar(0.0, "float64")))
    s = op.cumsum(op.exp(op.subtract(x64, top)), axis=d)
    return op.cast(op.add(op.log(s), top), dt)


def _p_norm(diff: Any, p: float, axis: int) -> Any:
    """The p-norm of ``diff`` along ``axis`` (p = 0 counts non-zeros, inf the largest)."""
    dt = dtype_of(diff)
    a = op.abs(diff)
    if p == float("inf"):
        return op.max(a, axis=(axis,))
    if p == 0:
        return op.sum(op.cast(op.not_equal(a, scalar(0, dt)), dt), axis=(axis,))
    if p == 1:
        return op.sum(a, axis=(axis,))
    if p == 2:
        return op.sqrt(op.sum(op.multiply(a, a), axis=(axis,)))
    s = op.sum(op.power(a, scalar(p, dt)), axis=(axis,))
    return op.power(s, scalar(1.0 / p, dt))


@converter("aten.dist.default")
def dist(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    diff = op.subtract(cast(node.arg(0), dt), cast(node.arg(1), dt))
    flat = op.reshape(diff, (-1,))
    return _p_norm(flat, float(node.arg(2, 2)), 0)


@converter("aten._cdist_forward.default")
def cdist(ctx: Any, node: Any) -> Any:
    """Distances between the rows of x1 (..., P, M) and x2 (..., R, M): (..., P, R)."""
    x1, x2 = node.arg(0), node.arg(1)
    diff = op.subtract(op.expand_dims(x1, -2), op.expand_dims(x2, -3))
    return _p_norm(diff, float(node.arg(2)), ndim_of(x1))


@converter("aten._pdist_forward.default")
def pdist(ctx: Any, node: Any) -> Any:
    """Distances between row pairs i < j of x (N, M), in row-major pair order."""
    x = node.arg(0)
    n = static_int(shape_of(x)[0])
    if n is None:
        raise node.error("pdist needs a static number of rows")
    i, j = np.triu_indices(n, k=1)
    a = op.take(x, g.const(i.astype(np.int64)), axis=0)
    b = op.take(x, g.const(j.astype(np.int64)), axis=0)
    return _p_norm(op.subtract(a, b), float(node.arg(1, 2)), 1)


@converter("aten.cummax.default", "aten.cummin.default")
def cummax(ctx: Any, node: Any) -> Any:
    """Running max (min) and the position holding it, by log2(n) doubling steps (each
    position merges the summary of the ``s`` positions before it). The later of equal values
    wins and NaN, once seen, stays until the next NaN, as torch's sequential loop has it:
    ``later if isnan(later) or (not isnan(earlier) and later >= earlier) else earlier``."""
    x = node.arg(0)
    if ndim_of(x) == 0:
        return [x, scalar(0, "int64")]
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    n = static_int(shape_of(x)[d])
    if n is None:
        raise node.error("needs a static size along the scanned dimension")
    is_bool = dtype_of(x) == "bool"
    v = op.cast(x, "int8") if is_bool else x
    better = op.greater_equal if "cummax" in node.op_name else op.less_equal
    line = [1] * ndim_of(x)
    line[d] = n
    pos = g.const(np.arange(n, dtype=np.int64).reshape(line))
    i = op.broadcast_to(pos, shape_of(x))
    s = 1
    while s < n:
        width = [(0, 0)] * ndim_of(x)
        width[d] = (s, 0)
        pv = op.pad(op.strided_slice(v, (0,), (n - s,), axes=(d,)), tuple(width))
        pi = op.pad(op.strided_slice(i, (0,), (n - s,), axes=(d,)), tuple(width))
        later = op.logical_or(op.not_equal(v, v), op.logical_and(op.equal(pv, pv),
                                                                 better(v, pv)))
        take = ctx.emit(op.logical_or(later, op.less(pos, scalar(s, "int64"))))
        v, i = ctx.emit(op.where(take, v, pv)), ctx.emit(op.where(take, i, pi))
        s *= 2
    return [op.cast(v, "bool") if is_bool else v, i]


@converter("aten.histc.default")
def histc(ctx: Any, node: Any) -> Any:
    """Counts of ``bins`` equal-width bins over [min, max] (the data's range when min == max,
    widened by 1 each way when that is a single value), in x's dtype; values outside and NaN
    are not counted, max falls in the last bin. The bin is ``(x - lo) * bins / (hi - lo)``,
    moved by one where the bin edges (torch's linspace) say so, then counted by a scatter-add
    into ``bins + 1`` slots (the last one collecting the values not counted)."""
    x = op.reshape(node.arg(0), (-1,))
    dt = dtype_of(x)
    bins = int(node.arg(1, 100))
    lo_v, hi_v = float(node.arg(2, 0)), float(node.arg(3, 0))
    if bins <= 0:
        raise node.error(f"histc needs bins > 0, got {bins}")
    if lo_v > hi_v:
        raise node.error(f"histc: min {lo_v} is greater than max {hi_v}")
    if static_int(shape_of(x)[0]) == 0:
        return op.broadcast_to(scalar(0, dt), (bins,))
    if lo_v == hi_v:
        finite = op.logical_and(op.equal(x, x), op.less(op.abs(x), scalar(float("inf"), dt)))
        lo = ctx.emit(op.min(op.where(finite, x, scalar(float("inf"), dt))))
        hi = ctx.emit(op.max(op.where(finite, x, scalar(float("-inf"), dt))))
        flat = op.equal(lo, hi)
        lo = ctx.emit(op.where(flat, op.subtract(lo, scalar(1, dt)), lo))
        hi = ctx.emit(op.where(flat, op.add(hi, scalar(1, dt)), hi))
    else:
        lo, hi = scalar(lo_v, dt), scalar(hi_v, dt)
    # torch.linspace(lo, hi, bins + 1): from lo in the first half, from hi in the second
    k = g.const(np.arange(bins + 1, dtype=np.int64))
    step = op.divide(op.subtract(hi, lo), scalar(bins, dt))
    kf = op.cast(k, dt)
    edges = ctx.emit(op.where(op.less(k, scalar((bins + 1) // 2, "int64")),
                              op.add(lo, op.multiply(kf, step)),
                              op.subtract(hi, op.multiply(op.subtract(scalar(bins, dt), kf),
                                                          step))))
    pos = op.floor(op.divide(op.multiply(op.subtract(x, lo), scalar(bins, dt)),
                             op.subtract(hi, lo)))
    inside = ctx.emit(op.logical_and(op.greater_equal(x, lo), op.less_equal(x, hi)))
    pos = op.cast(op.clip(op.where(inside, pos, scalar(0, dt)), min=0, max=bins - 1), "int64")
    pos = ctx.emit(pos)
    down = op.logical_and(op.greater(pos, scalar(0, "int64")),
                          op.less(x, op.take(edges, pos, axis=0)))
    up = op.logical_and(op.less(pos, scalar(bins - 1, "int64")),
                        op.greater_equal(x, op.take(edges, op.add(pos, scalar(1, "int64")),
                                                    axis=0)))
    pos = op.where(down, op.subtract(pos, scalar(1, "int64")),
                   op.where(up, op.add(pos, scalar(1, "int64")), pos))
    slot = op.where(inside, pos, scalar(bins, "int64"))
    ones = op.broadcast_to(scalar(1, dt), shape_of(x))
    counts = op.scatter_elements(op.broadcast_to(scalar(0, dt), (bins + 1,)), slot, ones,
                                 axis=0, reduction="add")
    return op.strided_slice(counts, (0,), (bins,), axes=(0,))


_SEGMENT_REDUCE = {"sum": "add", "mean": "add", "max": "max", "min": "min", "prod": "mul"}


def _segments_of(ctx: Any, starts_or_ends: Any, n_rows: int, ends: bool) -> Any:
    """The segment of each of ``n_rows`` rows: how many segment ends lie at or before the row
    (``ends``), or how many starts do, less one (rows before the first start give -1)."""
    rows = g.const(np.arange(n_rows, dtype=np.int64))
    hit = op.less_equal(op.expand_dims(starts_or_ends, 0), op.expand_dims(rows, 1))
    seg = op.sum(op.cast(hit, "int64"), axis=1)
    return ctx.emit(seg if ends else op.subtract(seg, scalar(1, "int64")))


def _reduce_segments(ctx: Any, data: Any, seg: Any, segments: int, reduce: str, start: float,
                     empty: float) -> tuple[Any, Any]:
    """Rows of ``data`` scatter-reduced by segment (``seg``: one per row; rows outside
    ``[0, segments)`` are dropped) into slots starting at ``start``; ``mean`` divides by the
    count (``empty`` where a segment has no row). Returns the (segments, ...) result and the
    per-segment row counts."""
    dt = dtype_of(data)
    valid = op.logical_and(op.greater_equal(seg, scalar(0, "int64")),
                           op.less(seg, scalar(segments, "int64")))
    seg = op.where(valid, seg, scalar(segments, "int64"))
    line = (-1,) + (1,) * (ndim_of(data) - 1)
    idx = ctx.emit(op.broadcast_to(op.reshape(seg, line), shape_of(data)))
    out_shape = (segments + 1,) + tuple(shape_of(data)[1:])
    acc = op.scatter_elements(op.broadcast_to(scalar(start, dt), out_shape), idx, data,
                              axis=0, reduction=_SEGMENT_REDUCE[reduce])
    count = ctx.emit(op.scatter_elements(op.broadcast_to(scalar(0, "int64"), (segments + 1,)),
                                         seg, op.broadcast_to(scalar(1, "int64"),
                                                              shape_of(seg)),
                                         axis=0, reduction="add"))
    count = ctx.emit(op.strided_slice(count, (0,), (segments,), axes=(0,)))
    acc = op.strided_slice(acc, (0,), (segments,), axes=(0,))
    if reduce == "mean":
        c = op.reshape(op.cast(count, dt), (-1,) + (1,) * (ndim_of(data) - 1))
        none = op.equal(c, scalar(0, dt))
        acc = op.where(none, scalar(empty, dt), op.divide(acc, op.where(none, scalar(1, dt), c)))
    return acc, count


@converter("aten.segment_reduce.default")
def segment_reduce(ctx: Any, node: Any) -> Any:
    """Reductions of consecutive runs of rows (``lengths``, or ``offsets`` of their starts and
    the end) of a tensor along its first axis (1-D lengths/offsets). Each row's segment is
    the number of segment ends at or before it; rows are scatter-reduced into one slot per
    segment, which starts at ``initial`` (else the reduction's identity): so ``initial``
    takes part in every segment, as in torch, and an empty segment is ``initial``, or the
    identity (NaN for mean)."""
    data = node.arg(0)
    reduce = str(node.arg(1))
    if reduce not in _SEGMENT_REDUCE:
        raise node.error(f"segment_reduce: unknown reduction {reduce!r}")
    lengths, offsets = node.arg("lengths", None), node.arg("offsets", None)
    bounds = lengths if lengths is not None else offsets
    if bounds is None:
        raise node.error("segment_reduce needs lengths or offsets")
    if ndim_of(bounds) != 1 or int(node.arg("axis", 0)) != 0:
        raise node.error("segment_reduce: only 1-D lengths/offsets (axis 0) are supported")
    bounds = cast(bounds, "int64")
    n_bounds, n_rows = static_int(shape_of(bounds)[0]), static_int(shape_of(data)[0])
    if n_bounds is None or n_rows is None:
        raise node.error("segment_reduce needs static numbers of rows and segments")
    if lengths is not None:
        ends, segments = op.cumsum(bounds, axis=0), n_bounds
    else:
        ends, segments = op.strided_slice(bounds, (1,), (n_bounds,), axes=(0,)), n_bounds - 1
    initial = node.arg("initial", None)
    ident = {"sum": 0.0, "mean": 0.0, "max": float("-inf"), "min": float("inf"),
             "prod": 1.0}[reduce]
    start = float(initial) if initial is not None else ident
    seg = _segments_of(ctx, ends, n_rows, ends=True)
    out, _ = _reduce_segments(ctx, data, seg, segments, reduce, start,
                              start if initial is not None else float("nan"))
    return out


@converter("aten._embedding_bag_forward_only.default", "aten._embedding_bag.default")
def embedding_bag(ctx: Any, node: Any) -> Any:
    """Sums, means or maxima of bags of embedding rows: bag ``b`` holds the indices from
    ``offsets[b]`` to the next bag's start (the last bag to the end, or with
    ``include_last_offset`` to the final offset), ``per_sample_weights``
    scale the rows (sum mode), indices equal to ``padding_idx`` (>= 0) are left out, and an
    empty bag is zeros. Returns torch's four results: the bags, each index's bag
    (``offset2bag``), each bag's size and ``max_indices`` (the row chosen per bag and column
    in max mode, the bag sizes in mean mode); in sum mode, as torch's kernel, the sizes and
    max_indices are zeros and offset2bag is empty unless ``padding_idx`` is set."""
    weight, indices, offsets = node.arg(0), cast(node.arg(1), "int64"), cast(node.arg(2), "int64")
    mode = int(node.arg("mode", 0))
    psw = node.arg("per_sample_weights", None)
    last = bool(node.arg("include_last_offset", False))
    padding = int(node.arg("padding_idx", -1))
    if ndim_of(indices) != 1 or ndim_of(offsets) != 1:
        raise node.error("embedding_bag: indices and offsets must be 1-D")
    n, n_off = static_int(shape_of(indices)[0]), static_int(shape_of(offsets)[0])
    if n is None or n_off is None:
        raise node.error("embedding_bag needs static numbers of indices and offsets")
    bags = n_off - 1 if last else n_off
    if mode not in (0, 1, 2):
        raise node.error(f"embedding_bag: unknown mode {mode}")
    dt = dtype_of(weight)
    starts = op.strided_slice(offsets, (0,), (bags,), axes=(0,)) if last else offsets
    bag = _segments_of(ctx, starts, n, ends=False)
    skip = op.equal(indices, scalar(padding, "int64")) if padding >= 0 else None
    if last:  # indices at or past the final offset belong to no bag
        pos = g.const(np.arange(n, dtype=np.int64))
        past = op.greater_equal(pos, op.strided_slice(offsets, (bags,), (bags + 1,), axes=(0,)))
        skip = past if skip is None else op.logical_or(skip, past)
    seg = bag if skip is None else ctx.emit(op.where(skip, scalar(-1, "int64"), bag))
    rows = ctx.emit(op.take(weight, indices, axis=0))
    if psw is not None:
        rows = op.multiply(rows, op.expand_dims(cast(psw, dt), 1))
    reduce = ("sum", "mean", "max")[mode]
    out, count = _reduce_segments(ctx, rows, seg, bags, reduce,
                                  float("-inf") if mode == 2 else 0.0, 0.0)
    out = ctx.emit(out)
    if mode == 2:
        has = op.greater(op.expand_dims(count, 1), scalar(0, "int64"))
        best = op.take(out, op.maximum(seg, scalar(0, "int64")), axis=0)
        who = op.where(op.logical_and(op.equal(rows, best),
                                      op.expand_dims(op.greater_equal(seg, scalar(0, "int64")),
                                                     1)),
                       op.broadcast_to(op.expand_dims(indices, 1), shape_of(rows)),
                       scalar(-1, "int64"))
        chosen, _ = _reduce_segments(ctx, who, seg, bags, "max", -1, 0)
        max_indices = op.where(has, chosen, scalar(0, "int64"))
        out = op.where(has, out, scalar(0, dt))
        return [out, bag, count, max_indices]
    if mode == 1:
        return [out, bag, count, count]
    # sum: torch's kernel fills neither the sizes nor (without padding_idx) offset2bag
    zeros = op.broadcast_to(scalar(0, "int64"), (n_off,))
    return [out, bag if padding >= 0 else g.const(np.zeros((0,), np.int64)), zeros, zeros]


