"""Reductions, scans and softmax: sum, mean, amax/amin, max/min (values and indices), argmax,
prod, any/all, var/std, logsumexp, norms, cumsum/cumprod, (log_)softmax."""

from __future__ import annotations

from typing import Any

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
