"""Strided views and their scatters: diagonal, unfold, as_strided, narrow_copy and the
``*_scatter`` ops that write through them (slice, diagonal, as_strided), plus put and
masked_scatter.

torch computes these on a tensor's storage; kiln has no storage, so each becomes a gather or
scatter with a constant index table built here from the (static) sizes the view needs. The
input's storage is taken as contiguous, which is what ``torch.export`` gives a program's inputs.
"""

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
    ndim_of,
    norm_dim,
    prod,
    reshape,
    scalar,
    shape_of,
    static_int,
)


def _static(node: Any, dims: Any, what: str) -> list[int]:
    out = [static_int(d) for d in dims]
    if any(d is None for d in out):
        raise node.error(f"{what} needs static sizes, got {tuple(dims)}")
    return [int(d) for d in out]


def _const(table: np.ndarray) -> Any:
    return g.const(np.ascontiguousarray(table, dtype=np.int64))


# diagonal ------------------------------------------------------------------------------------


def _diag_positions(n1: int, n2: int, offset: int) -> np.ndarray:
    """Flat positions (row * n2 + col) of the ``offset`` diagonal of an n1 x n2 matrix."""
    rows = np.arange(max(n1, 0))
    cols = rows + offset
    keep = (cols >= 0) & (cols < n2)
    return rows[keep] * n2 + cols[keep]


def _to_matrix_last(x: Any, d1: int, d2: int) -> tuple[Any, tuple[int, ...]]:
    """``x`` with dims d1, d2 moved last (in that order) and merged; the permutation used."""
    nd = ndim_of(x)
    perm = tuple(d for d in range(nd) if d not in (d1, d2)) + (d1, d2)
    xt = op.transpose(x, perm) if perm != tuple(range(nd)) else x
    return reshape(xt, (*[shape_of(x)[d] for d in perm[:-2]], -1)), perm


def _diag_args(node: Any, x: Any) -> tuple[int, int, int, np.ndarray]:
    nd = ndim_of(x)
    offset = int(node.arg("offset", 0))
    d1 = norm_dim(int(node.arg("dim1", 0)), nd)
    d2 = norm_dim(int(node.arg("dim2", 1)), nd)
    if d1 == d2:
        raise node.error("diagonal dimensions cannot be identical")
    n1, n2 = _static(node, (shape_of(x)[d1], shape_of(x)[d2]), "diagonal")
    return offset, d1, d2, _diag_positions(n1, n2, offset)


@converter("aten.diagonal.default", "aten.diagonal_copy.default")
def diagonal(ctx: Any, node: Any) -> Any:
    """The diagonal as the last dim: the two dims merged last, a take of the flat positions."""
    x = node.arg(0)
    _, d1, d2, pos = _diag_args(node, x)
    flat, _ = _to_matrix_last(x, d1, d2)
    return op.take(flat, _const(pos), axis=ndim_of(x) - 2)


@converter("aten.diagonal_scatter.default")
def diagonal_scatter(ctx: Any, node: Any) -> Any:
    """``src`` written onto a diagonal: a scatter into the merged last dim, dims put back."""
    x, src = node.arg(0), cast(node.arg(1), dtype_of(node.arg(0)))
    _, d1, d2, pos = _diag_args(node, x)
    flat, perm = _to_matrix_last(x, d1, d2)
    lead = ndim_of(x) - 2
    idx = op.broadcast_to(_const(pos), shape_of(src))
    out = op.scatter_elements(flat, idx, src, axis=lead)
    out = reshape(out, [shape_of(x)[d] for d in perm])
    inverse = tuple(int(i) for i in np.argsort(perm))
    return op.transpose(out, inverse) if inverse != tuple(range(len(perm))) else out


# unfold --------------------------------------------------------------------------------------


@converter("aten.unfold.default", "aten.unfold_copy.default")
def unfold(ctx: Any, node: Any) -> Any:
    """Windows of ``size`` every ``step`` along ``dimension``, the window as a new last dim:
    one take with a (windows, size) index table, its size axis moved last."""
    x = node.arg(0)
    size, step = int(node.arg(2)), int(node.arg(3))
    if ndim_of(x) == 0:
        x = reshape(x, (1,))
        return op.take(x, _const(np.zeros((size,))), axis=0)
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    (n,) = _static(node, (shape_of(x)[d],), "unfold")
    count = (n - size) // step + 1
    table = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    out = op.take(x, _const(table), axis=d)
    nd = ndim_of(x) + 1
    perm = tuple(i for i in range(nd) if i != d + 1) + (d + 1,)
    return op.transpose(out, perm) if perm != tuple(range(nd)) else out


# as_strided ----------------------------------------------------------------------------------


def _strided_positions(node: Any, size: Any, stride: Any, offset: Any) -> np.ndarray:
    size = _static(node, size, "as_strided")
    stride = _static(node, stride, "as_strided")
    start = int(static_int(offset) or 0) if offset is not None else 0
    pos = np.full(size, start, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = n
        pos = pos + (np.arange(n) * s).reshape(shape)
    return pos


@converter("aten.as_strided.default", "aten.as_strided_copy.default")
def as_strided(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    pos = _strided_positions(node, node.arg(1), node.arg(2), node.arg("storage_offset"))
    return op.take(reshape(x, (-1,)), _const(pos), axis=0)


@converter("aten.as_strided_scatter.default")
def as_strided_scatter(ctx: Any, node: Any) -> Any:
    x, src = node.arg(0), cast(node.arg(1), dtype_of(node.arg(0)))
    pos = _strided_positions(node, node.arg(2), node.arg(3), node.arg("storage_offset"))
    flat = op.scatter_elements(reshape(x, (-1,)), _const(pos.ravel()), reshape(src, (-1,)),
                               axis=0)
    return reshape(flat, shape_of(x))


# slices --------------------------------------------------------------------------------------


def _clamp_bound(v: Any, n: int, default: int) -> int:
    if v is None:
        return default
    v = int(v)
    v = v + n if v < 0 else v
    return min(max(v, 0), n)


@converter("aten.slice_scatter.default")
def slice_scatter(ctx: Any, node: Any) -> Any:
    """``src`` written onto ``x[start:end:step]`` along ``dim``: a scatter along that dim with
    the slice's positions broadcast to ``src``."""
    x = node.arg(0)
    src = cast(node.arg(1), dtype_of(x))
    if ndim_of(x) == 0:
        return reshape(src, ())
    d = norm_dim(int(node.arg("dim", 0)), ndim_of(x))
    (n,) = _static(node, (shape_of(x)[d],), "slice_scatter")
    start = _clamp_bound(node.arg("start"), n, 0)
    end = max(_clamp_bound(node.arg("end"), n, n), start)
    positions = np.arange(start, end, int(node.arg("step", 1)))
    if positions.size == 0:
        return x
    shape = [1] * ndim_of(x)
    shape[d] = positions.size
    idx = op.broadcast_to(_const(positions.reshape(shape)), shape_of(src))
    return op.scatter_elements(x, idx, src, axis=d)


@converter("aten.narrow_copy.default")
def narrow_copy(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    (n,) = _static(node, (shape_of(x)[d],), "narrow_copy")
    start = int(node.arg(2))
    start = start + n if start < 0 else start
    return op.strided_slice(x, (start,), (start + int(node.arg(3)),), axes=(d,))


# put / masked_scatter ------------------------------------------------------------------------


@converter("aten.put.default")
def put(ctx: Any, node: Any) -> Any:
    """``x.flatten()[index] = source`` (``accumulate``: added), negative indices from the end."""
    x = node.arg(0)
    src = reshape(cast(node.arg(2), dtype_of(x)), (-1,))
    idx = reshape(cast(node.arg(1), "int64"), (-1,))
    total = as_tensor(prod(shape_of(x)), "int64", ctx)
    idx = op.where(op.less(idx, scalar(0, "int64")), op.add(idx, total), idx)
    flat = op.scatter_elements(reshape(x, (-1,)), idx, src, axis=0,
                               reduction="add" if bool(node.arg(3, False)) else "none")
    return reshape(flat, shape_of(x))


@converter("aten.masked_scatter.default")
def masked_scatter(ctx: Any, node: Any) -> Any:
    """Where ``mask`` is true, the next element of ``source`` (in order): the k-th true
    position reads ``source.flatten()[k]``, found by a running count of the mask."""
    x = node.arg(0)
    out_shape = node.out_shape
    mask = op.broadcast_to(cast(node.arg(1), "bool"), out_shape)
    x = op.broadcast_to(x, out_shape)
    flat_mask = ctx.emit(reshape(mask, (-1,)))
    count = op.cumsum(op.cast(flat_mask, "int64"), axis=0)
    src = reshape(cast(node.arg(2), dtype_of(node.arg(0))), (-1,))
    size = prod(shape_of(src))
    if static_int(size) == 0:
        return x
    last = op.subtract(as_tensor(size, "int64", ctx), scalar(1, "int64"))
    pos = op.clip(op.subtract(count, scalar(1, "int64")), 0, None)
    vals = op.take(src, op.minimum(pos, last), axis=0)
    return reshape(op.where(flat_mask, vals, reshape(x, (-1,))), out_shape)
