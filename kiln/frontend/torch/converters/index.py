"""Indexing ATen ops: index_select, gather, scatter(_add/_reduce), advanced indexing
(``index.Tensor``, ``index_put``), masked_fill, topk, sort, argsort."""

from __future__ import annotations

from typing import Any

from .... import graph as g
from .... import op
from ..registry import converter
from .common import (
    as_tensor,
    cast,
    dtype_of,
    ndim_of,
    norm_dim,
    scalar,
    shape_of,
    static_int,
)


def _wrap(ctx: Any, idx: Any, size: Any) -> Any:
    """Negative indices counted from the end (``i + size`` where ``i < 0``)."""
    idx = cast(idx, "int64")
    return op.where(op.less(idx, scalar(0, "int64")),
                    op.add(idx, as_tensor(size, "int64", ctx)), idx)


@converter("aten.index_select.default")
def index_select(ctx: Any, node: Any) -> Any:
    x, idx = node.arg(0), node.arg(2)
    if ndim_of(x) == 0:
        return op.reshape(op.take(op.reshape(x, (1,)), cast(idx, "int64"), axis=0), ())
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    if ndim_of(idx) == 0:
        idx = op.reshape(idx, (1,))
    return op.take(x, _wrap(ctx, idx, shape_of(x)[d]), axis=d)


@converter("aten.gather.default")
def gather(ctx: Any, node: Any) -> Any:
    x, idx = node.arg(0), node.arg(2)
    if ndim_of(x) == 0:
        return op.reshape(x, shape_of(idx)) if ndim_of(idx) else x
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    return op.gather_elements(x, _wrap(ctx, idx, shape_of(x)[d]), axis=d)


_REDUCE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max",
           "amin": "min", "mean": "mean"}


def _scatter(ctx: Any, node: Any, x: Any, idx: Any, src: Any, reduction: str) -> Any:
    if ndim_of(x) == 0:
        x, idx = op.reshape(x, (1,)), op.reshape(idx, (1,))
        src = op.reshape(src, (1,)) if ndim_of(src) == 0 else src
        return op.reshape(op.scatter_elements(x, idx, src, axis=0, reduction=reduction), ())
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    if ndim_of(src) and shape_of(src) != shape_of(idx):  # src may be larger than index
        src = op.strided_slice(src, (0,) * ndim_of(idx),
                               tuple(static_int(s) for s in shape_of(idx)),
                               axes=tuple(range(ndim_of(idx))))
    elif ndim_of(src) == 0:
        src = op.broadcast_to(src, shape_of(idx))
    return op.scatter_elements(x, _wrap(ctx, idx, shape_of(x)[d]), src, axis=d, reduction=reduction)


@converter("aten.scatter.src", "aten.scatter.value", "aten.scatter.reduce",
           "aten.scatter.value_reduce")
def scatter(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    src = as_tensor(node.arg(3), dtype_of(x))
    reduce = node.arg("reduce") if "reduce" in node._names else None
    return _scatter(ctx, node, x, node.arg(2), src, _REDUCE[reduce] if reduce else "none")


@converter("aten.scatter_add.default")
def scatter_add(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return _scatter(ctx, node, x, node.arg(2), cast(node.arg(3), dtype_of(x)), "add")


@converter("aten.scatter_reduce.two")
def scatter_reduce(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    reduce = node.arg(4)
    include_self = bool(node.arg("include_self", True))
    src = cast(node.arg(3), dtype_of(x))
    idx = node.arg(2)
    kind = _REDUCE[reduce]
    if kind == "mean" or not include_self:
        return _scatter_mean_or_exclusive(ctx, node, x, idx, src, kind, include_self)
    return _scatter(ctx, node, x, idx, src, kind)


def _scatter_mean_or_exclusive(ctx: Any, node: Any, x: Any, idx: Any, src: Any, kind: str,
                               include_self: bool) -> Any:
    """scatter_reduce without ``self`` (positions hit take only the scattered values) or with
    ``mean``: a reduction into an identity-filled tensor, then merged with ``x``."""
    dt = dtype_of(x)
    if kind == "mean":
        total = _scatter(ctx, node, x if include_self else op.multiply(x, scalar(0, dt)), idx, src,
                         "add")
        ones = op.broadcast_to(scalar(1, dt), shape_of(idx))
        count = _scatter(ctx, node, op.broadcast_to(scalar(1 if include_self else 0, dt),
                                               shape_of(x)), idx, ones, "add")
        hit = op.greater(count, scalar(0, dt))
        safe = op.where(hit, count, scalar(1, dt))
        mean = op.divide(total, safe) if dt.startswith(("float", "bfloat")) else \
            op.floor_divide(total, safe)
        return op.where(hit, mean, x)
    ident = {"add": 0, "mul": 1, "max": float("-inf") if dt.startswith("float")
             else -(2 ** 62), "min": float("inf") if dt.startswith("float") else 2 ** 62}[kind]
    base = op.broadcast_to(scalar(ident, dt), shape_of(x))
    reduced = _scatter(ctx, node, base, idx, src, kind)
    hit = _scatter(ctx, node, op.broadcast_to(scalar(False, "bool"), shape_of(x)), idx,
                   op.broadcast_to(scalar(True, "bool"), shape_of(idx)), "none")
    return op.where(hit, reduced, x)


def _broadcast_indices(ctx: Any, indices: list[Any]) -> list[Any]:
    shapes = [shape_of(i) for i in indices]
    rank = max(len(s) for s in shapes)
    out_shape = []
    for k in range(rank):
        dims = [s[len(s) - rank + k] for s in shapes if len(s) - rank + k >= 0]
        big = [d for d in dims if static_int(d) != 1]
        out_shape.append(big[0] if big else 1)
    return [op.broadcast_to(i, tuple(out_shape)) if shape_of(i) != tuple(out_shape) else i
            for i in indices]


@converter("aten.index.Tensor")
def index(ctx: Any, node: Any) -> Any:
    """``x[i0, :, i2]`` with index tensors: the indexed dims move to the front, the broadcast
    indices (negatives wrapped) are stacked into tuples for ``gather_nd``, and -- as numpy
    does -- the result dims go where the indexed dims were when those are adjacent."""
    x = node.arg(0)
    indices = list(node.arg(1))
    pos = [i for i, t in enumerate(indices) if t is not None]
    if any(dtype_of(indices[i]) == "bool" for i in pos):
        raise node.error("boolean mask indexing (a data-dependent shape) is not supported")
    nd = ndim_of(x)
    if len(pos) == 1:
        d = pos[0]
        return op.take(x, _wrap(ctx, indices[d], shape_of(x)[d]), axis=d)
    idx = _broadcast_indices(ctx, [_wrap(ctx, indices[i], shape_of(x)[i]) for i in pos])
    rest = [d for d in range(nd) if d not in pos]
    xt = op.transpose(x, tuple(pos + rest)) if pos + rest != list(range(nd)) else x
    stacked = op.concat([op.expand_dims(i, -1) for i in idx], axis=-1)
    out = op.gather_nd(xt, stacked)
    bdims = ndim_of(idx[0])
    adjacent = pos == list(range(pos[0], pos[0] + len(pos)))
    if adjacent and pos[0] > 0:
        lead = pos[0]
        perm = (tuple(range(bdims, bdims + lead)) + tuple(range(bdims))
                + tuple(range(bdims + lead, bdims + len(rest))))
        out = op.transpose(out, perm)
    return out


@converter("aten.index_put.default", "aten._index_put_impl.default")
def index_put(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    indices = list(node.arg(1))
    values = cast(node.arg(2), dtype_of(x))
    accumulate = bool(node.arg(3))
    pos = [i for i, t in enumerate(indices) if t is not None]
    if any(dtype_of(indices[i]) == "bool" for i in pos):
        raise node.error("boolean mask index_put (a data-dependent shape) is not supported")
    if pos != list(range(len(pos))):
        raise node.error("index_put with indices that do not start at dim 0 is not supported")
    idx = _broadcast_indices(ctx, [_wrap(ctx, indices[i], shape_of(x)[i]) for i in pos])
    stacked = op.concat([op.expand_dims(i, -1) for i in idx], axis=-1)
    target = tuple(shape_of(idx[0])) + tuple(shape_of(x)[len(pos):])
    if tuple(shape_of(values)) != target:
        values = op.broadcast_to(values, target)
    return op.scatter_nd(x, stacked, values, reduction="add" if accumulate else "none")


@converter("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def masked_fill(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return op.where(cast(node.arg(1), "bool"), as_tensor(node.arg(2), dtype_of(x)), x)


@converter("aten.topk.default")
def topk(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    k = int(node.arg(1))
    if ndim_of(x) == 0:
        return [x, scalar(0, "int64")]
    d = norm_dim(int(node.arg("dim", -1)), ndim_of(x))
    largest = bool(node.arg("largest", True))
    out = ctx.emit(op.topk(x, k, axis=d, largest=largest))
    return [g.TupleGetItem(out, 0), g.TupleGetItem(out, 1)]


@converter("aten.sort.default", "aten.sort.stable")
def sort(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    if ndim_of(x) == 0:
        return [x, scalar(0, "int64")]
    d = norm_dim(int(node.arg("dim", -1)), ndim_of(x))
    desc = bool(node.arg("descending", False))
    n = static_int(shape_of(x)[d])
    if n is None:
        raise node.error("sort along a symbolic dimension")
    out = ctx.emit(op.topk(x, n, axis=d, largest=desc))
    return [g.TupleGetItem(out, 0), g.TupleGetItem(out, 1)]
