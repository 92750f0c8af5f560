"""Indexing ONNX operators: GatherElements, GatherND, Scatter*, ReverseSequence, TensorScatter.

GatherElements/GatherND/ScatterElements/ScatterND map one to one onto kiln's indexing ops
(``kiln/op/index.py``). ReverseSequence and TensorScatter are index arithmetic around them:
ReverseSequence gathers along the time axis at ``len - 1 - t`` (for ``t < len``), TensorScatter
scatters the update along the sequence axis at ``write_index + s`` (modulo the cache length when
circular).
"""

from __future__ import annotations

from typing import Any

from .... import op
from ..registry import converter
from .common import dtype_of, iota, ndim_of, node_axis, scalar, shape_of, static_int


@converter("GatherElements", since=11)
def gather_elements(ctx: Any, node: Any) -> Any:
    return op.gather_elements(node.input(0), node.input(1), axis=int(node.attr("axis", 0)))


@converter("GatherND", since=11)
def gather_nd(ctx: Any, node: Any) -> Any:
    return op.gather_nd(node.input(0), node.input(1),
                        batch_dims=int(node.attr("batch_dims", 0)))


def _scatter_elements(node: Any, reduction: str) -> Any:
    return op.scatter_elements(node.input(0), node.input(1), node.input(2),
                               axis=int(node.attr("axis", 0)), reduction=reduction)


@converter("Scatter", since=9)
def scatter(ctx: Any, node: Any) -> Any:
    """Scatter (deprecated at opset 11) is ScatterElements without reduction."""
    return _scatter_elements(node, "none")


@converter("ScatterElements", since=11)
def scatter_elements(ctx: Any, node: Any) -> Any:
    return _scatter_elements(node, node.attr("reduction", "none"))


@converter("ScatterND", since=11)
def scatter_nd(ctx: Any, node: Any) -> Any:
    return op.scatter_nd(node.input(0), node.input(1), node.input(2),
                         reduction=node.attr("reduction", "none"))


def _arange_along(n: int, axis: int, ndim: int) -> Any:
    """``0 .. n-1`` (int64) along ``axis`` of a rank-``ndim`` tensor (:func:`iota`: computed
    at run time when too long for a constant)."""
    shape = [1] * ndim
    shape[axis] = n
    return op.reshape(iota(n, "int64"), tuple(shape))


def _per_batch(v: Any, axis: int, ndim: int) -> Any:
    """A 1-D per-batch tensor ``v`` (int64) laid along ``axis`` for broadcasting."""
    shape = [1] * ndim
    shape[axis] = -1
    return op.reshape(op.cast(v, "int64") if dtype_of(v) != "int64" else v, tuple(shape))


@converter("ReverseSequence", since=10)
def reverse_sequence(ctx: Any, node: Any) -> Any:
    """``out[t, b] = x[len[b] - 1 - t, b]`` for ``t < len[b]``, else ``x[t, b]``."""
    x, lens = node.input(0), node.input(1)
    nd = ndim_of(x)
    t_axis = node_axis(node, nd, 0, attr="time_axis")
    b_axis = node_axis(node, nd, 1, attr="batch_axis")
    if nd < 2 or t_axis == b_axis:
        raise node.error(f"needs distinct time and batch axes of a rank >= 2 input, got "
                         f"time_axis {t_axis}, batch_axis {b_axis}, rank {nd}")
    t_len = static_int(shape_of(x)[t_axis])
    if t_len is None:
        raise node.error("the time axis must have a static length")
    t = _arange_along(int(t_len), t_axis, nd)
    length = ctx.emit(_per_batch(lens, b_axis, nd))
    flipped = op.subtract(op.subtract(length, scalar(1, "int64")), t)
    idx = op.where(op.less(t, length), flipped, t)
    idx = op.broadcast_to(ctx.emit(idx), shape_of(x))
    return op.gather_elements(x, ctx.emit(idx), axis=t_axis)


@converter("TensorScatter", since=24)
def tensor_scatter(ctx: Any, node: Any) -> Any:
    """The update rows go to ``write_indices[b] + s`` along the sequence axis (modulo its length
    in circular mode): a ScatterElements with those indices."""
    past, update, write = node.input(0), node.input(1), node.input(2)
    nd = ndim_of(past)
    axis = node_axis(node, nd, -2)
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular"):
        raise node.error(f"unknown mode {mode!r} (expected 'linear' or 'circular')")
    if axis == 0:
        raise node.error("axis must not be the batch axis 0")
    seq = static_int(shape_of(update)[axis])
    if seq is None:
        raise node.error("the update's sequence length must be static")
    idx: Any = _arange_along(int(seq), axis, nd)
    if write is not None:
        idx = op.add(ctx.emit(_per_batch(write, 0, nd)), idx)
    if mode == "circular":
        length = static_int(shape_of(past)[axis])
        if length is None:
            raise node.error("circular mode needs a static cache length")
        idx = op.mod(ctx.emit(idx), scalar(int(length), "int64"))
    idx = op.broadcast_to(ctx.emit(idx), shape_of(update))
    return op.scatter_elements(past, ctx.emit(idx), update, axis=axis, reduction="none")
