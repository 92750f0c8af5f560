"""Reductions, scans and softmax: sum, mean, amax/amin, max/min (values and indices), argmax,
prod, any/all, var/std, logsumexp, norms, cumsum/cumprod, (log_)softmax."""

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
