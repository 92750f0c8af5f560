"""Shape and data-movement ATen ops: views, permutes, expand, squeeze, cat, slicing, split,
padding, flip, repeat, roll, and the tensor factories (full, arange, scalar_tensor)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op, tir
from ....ir.dtype import as_dtype
from ..registry import converter
from ..tensors import kiln_dtype
from .common import (
    as_tensor,
    cast,
    dtype_of,
    ndim_of,
    norm_dim,
    norm_dims,
    producer,
    same_dim,
    same_shape,
    scalar,
    shape_of,
    sizes,
    static_int,
)


@converter("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
           "aten.view_copy.default")
def view(ctx: Any, node: Any) -> Any:
    """A reshape; a reshape of a reshape reads the first one's input (torch's decompositions
    flatten ``(b, s, k)`` to ``(b*s, k)`` around matrix products and back: the merged sizes
    then never appear, which keeps symbolic shapes plain)."""
    x = node.arg(0)
    shape = sizes(node.arg(1))
    if ndim_of(x) and len(shape) and any(static_int(d) == -1 for d in shape):
        shape = tuple(node.out_shape)  # torch resolved the -1 (symbolically when sizes are)
    inner = producer(ctx, x, "reshape")
    if inner is not None:
        x = inner.args[0]
    if same_shape(shape, shape_of(x)):
        return x
    return op.reshape(x, shape)


@converter("aten.permute.default", "aten.permute_copy.default")
def permute(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    perm = tuple(norm_dim(int(d), ndim_of(x)) for d in node.arg(1))
    if perm == tuple(range(ndim_of(x))):
        return x
    return op.transpose(x, perm)


@converter("aten.transpose.int")
def transpose(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    n = ndim_of(x)
    if n < 2:
        return x
    a, b = norm_dim(int(node.arg(1)), n), norm_dim(int(node.arg(2)), n)
    perm = list(range(n))
    perm[a], perm[b] = perm[b], perm[a]
    return op.transpose(x, tuple(perm)) if a != b else x


@converter("aten.t.default", "aten.numpy_T.default")
def t(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    return x if ndim_of(x) < 2 else op.transpose(x, tuple(reversed(range(ndim_of(x)))))


@converter("aten.expand.default", "aten.expand_copy.default")
def expand(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    target = list(sizes(node.arg(1)))
    off = len(target) - ndim_of(x)
    for i, d in enumerate(target):
        if static_int(d) == -1:
            target[i] = shape_of(x)[i - off]
    if len(target) == ndim_of(x) and all(same_dim(a, b) for a, b in zip(target, shape_of(x))):
        return x
    return op.broadcast_to(x, tuple(target))


@converter("aten.squeeze.dims", "aten.squeeze.dim", "aten.squeeze.default",
           "aten.squeeze_copy.dims")
def squeeze(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    n = ndim_of(x)
    dims = norm_dims(node.arg(1), n) if node.has(1) else tuple(range(n))
    if n == 0:
        return x
    dims = tuple(d for d in (dims or range(n)) if static_int(shape_of(x)[d]) == 1)
    return op.squeeze(x, axis=dims) if dims else x


@converter("aten.unsqueeze.default", "aten.unsqueeze_copy.default")
def unsqueeze(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    d = int(node.arg(1))
    if d < 0:
        d += ndim_of(x) + 1
    return op.expand_dims(x, d)


@converter("aten.cat.default", "aten.concat.default")
def cat(ctx: Any, node: Any) -> Any:
    tensors = list(node.arg(0))
    dt = node.out_dtype
    # legacy torch: 1-d empty tensors are skipped whatever the others' rank
    keep = [t for t in tensors if not (ndim_of(t) == 1 and static_int(shape_of(t)[0]) == 0)]
    if not keep:
        return cast(tensors[0], dt)
    d = norm_dim(int(node.arg("dim", 0)), ndim_of(keep[0]))
    keep = [cast(t, dt) for t in keep]
    nonempty = [t for t in keep if static_int(shape_of(t)[d]) != 0]
    if len(nonempty) == 1:
        return nonempty[0]
    if not nonempty:
        return keep[0]
    return op.concat(nonempty, axis=d)


def _slice_bound(v: Any, dim: Any, default: int | None) -> int | None | Any:
    """A slice start/end as an int (None: the default); a symbolic bound equal to the
    dimension is the end; other symbolic bounds are returned as they are."""
    if v is None:
        return default
    s = static_int(v)
    if s is not None:
        return s
    if same_dim(v, dim):
        return None
    return v


@converter("aten.slice.Tensor", "aten.slice_copy.Tensor")
def slice_(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    if ndim_of(x) == 0:
        return x
    d = norm_dim(int(node.arg("dim", 0)), ndim_of(x))
    dim = shape_of(x)[d]
    start = _slice_bound(node.arg("start"), dim, 0) or 0
    end = _slice_bound(node.arg("end"), dim, None)
    step = int(node.arg("step", 1))
    n = static_int(dim)
    if not isinstance(start, int) or not (end is None or isinstance(end, int)):
        return _symbolic_slice(ctx, node, x, d, start, step)
    if n is not None:
        start = min(max(start + n if start < 0 else start, 0), n)
        end = n if end is None else min(max(end + n if end < 0 else end, 0), n)
        if start == 0 and end == n and step == 1:
            return x
        end = max(end, start)
    elif start == 0 and end is None and step == 1:
        return x
    return op.strided_slice(x, (start,), (end,), strides=(step,), axes=(d,))


def _symbolic_slice(ctx: Any, node: Any, x: Any, d: int, start: Any, step: int) -> Any:
    """A slice with a symbolic bound (``pos_ids[:, :seq]``) as a gather of
    ``start + i * step`` for ``i`` below the length torch worked out for the result."""
    if not isinstance(start, int) or start < 0:
        raise node.error(f"a slice starting at {start} of a symbolic extent is not supported")
    length = node.out_shape[d]
    idx = _iota(ctx, length, "int64")
    if step != 1:
        idx = op.multiply(idx, scalar(step, "int64"))
    if start:
        idx = op.add(idx, scalar(start, "int64"))
    return op.take(x, idx, axis=d)


@converter("aten.select.int", "aten.select_copy.int")
def select(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    d = norm_dim(int(node.arg(1)), ndim_of(x))
    i = int(node.arg(2))
    n = static_int(shape_of(x)[d])
    if i < 0:
        if n is None:
            raise node.error("a negative index on a symbolic dimension")
        i += n
    out = op.strided_slice(x, (i,), (i + 1,), axes=(d,))
    return op.squeeze(out, axis=(d,))


@converter("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def split_with_sizes(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    parts = [int(s) for s in node.arg(1)]
    d = norm_dim(int(node.arg("dim", 0)), ndim_of(x))
    return _split(ctx, x, parts, d)


def _split(ctx: Any, x: Any, parts: list[int], d: int) -> list[Any]:
    if len(parts) == 1:
        return [x]
    outs, start = [], 0
    for p in parts:
        outs.append(op.strided_slice(x, (start,), (start + p,), axes=(d,)))
        start += p
    return outs


@converter("aten.split.Tensor", "aten.split_copy.Tensor")
def split(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    d = norm_dim(int(node.arg("dim", 0)), ndim_of(x))
    n = static_int(shape_of(x)[d])
    size = int(node.arg(1))
    if n is None:
        raise node.error("split of a symbolic dimension")
    parts = [min(size, n - s) for s in range(0, n, size)] or [0]
    return _split(ctx, x, parts, d)


@converter("aten.unbind.int", "aten.unbind_copy.int")
def unbind(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    d = norm_dim(int(node.arg("dim", 0)), ndim_of(x))
    n = static_int(shape_of(x)[d])
    if n is None:
        raise node.error("unbind of a symbolic dimension")
    return [op.squeeze(op.strided_slice(x, (i,), (i + 1,), axes=(d,)), axis=(d,))
            for i in range(n)]


@converter("aten.constant_pad_nd.default")
def constant_pad_nd(ctx: Any, node: Any) -> Any:
    """``pad`` lists (before, after) pairs from the last dimension backwards; negative
    amounts crop."""
    x = node.arg(0)
    pad = [int(p) for p in node.arg(1)]
    value = node.arg("value", 0)
    n = ndim_of(x)
    width = [[0, 0] for _ in range(n)]
    for i in range(len(pad) // 2):
        width[n - 1 - i] = [pad[2 * i], pad[2 * i + 1]]
    crop = [(i, max(-b, 0), max(-a, 0)) for i, (b, a) in enumerate(width) if b < 0 or a < 0]
    for i, b, a in crop:
        dim = static_int(shape_of(x)[i])
        x = op.strided_slice(x, (b,), (dim - a,), axes=(i,))
    width = [(max(b, 0), max(a, 0)) for b, a in width]
    if not any(b or a for b, a in width):
        return x
    return op.pad(x, tuple(width), pad_value=float(value))


@converter("aten.flip.default")
def flip(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    dims = norm_dims(node.arg(1), ndim_of(x)) or ()
    if ndim_of(x) == 0 or not dims:
        return x
    return op.strided_slice(x, (None,) * len(dims), (None,) * len(dims),
                            strides=(-1,) * len(dims), axes=dims)


@converter("aten.repeat.default")
def repeat(ctx: Any, node: Any) -> Any:
    """``x.repeat(r)``: x gets leading 1s to ``len(r)`` dims, then each dim ``i`` is tiled
    ``r[i]`` times (broadcast along a new axis before it, then merged)."""
    x = node.arg(0)
    reps = [int(r) for r in node.arg(1)]
    shape = list(shape_of(x))
    shape = [1] * (len(reps) - len(shape)) + shape
    x = op.reshape(x, tuple(shape))
    inter, target = [], []
    for r, d in zip(reps, shape):
        inter += [1, d]
        target += [r, d]
    y = op.broadcast_to(op.reshape(x, tuple(inter)), tuple(target))
    return op.reshape(y, tuple(r * d for r, d in zip(reps, shape)))


@converter("aten.roll.default")
def roll(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    shifts = [int(s) for s in node.arg(1)]
    dims = list(node.arg(2) or [])
    if not dims:
        flat = op.reshape(x, (-1,))
        out = _roll_axis(flat, shifts[0], 0)
        return op.reshape(out, shape_of(x))
    for s, d in zip(shifts, dims):
        x = _roll_axis(x, s, norm_dim(int(d), ndim_of(x)))
    return x


def _roll_axis(x: Any, shift: int, d: int) -> Any:
    n = static_int(shape_of(x)[d])
    if not n or shift % n == 0:
        return x
    k = shift % n
    tail = op.strided_slice(x, (n - k,), (n,), axes=(d,))
    head = op.strided_slice(x, (0,), (n - k,), axes=(d,))
    return op.concat([tail, head], axis=d)


# ---- factories ----------------------------------------------------------------------------
def _dtype_arg(node: Any, default: str) -> str:
    dt = node.arg("dtype")
    return kiln_dtype(dt) if dt is not None else default


@converter("aten.empty.memory_format", "aten.empty_permuted.default",
           "aten.empty_strided.default", "aten.empty_like.default", "aten.new_empty.default")
def empty(ctx: Any, node: Any) -> Any:
    """Uninitialized memory: any values are valid (a program writes before it reads), kiln
    gives zeros so runs are deterministic."""
    shape = node.out_shape
    zero = scalar(0, node.out_dtype)
    return op.broadcast_to(zero, tuple(shape)) if shape else zero


@converter("aten.full.default", "aten.full_like.default", "aten.zeros_like.default",
           "aten.ones_like.default", "aten.zeros.default", "aten.ones.default",
           "aten.new_full.default", "aten.new_zeros.default", "aten.new_ones.default",
           "aten.scalar_tensor.default")
def full(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    name = node.op_name
    if "zeros" in name:
        value: Any = 0
    elif "ones" in name:
        value = 1
    elif name == "aten.scalar_tensor.default":
        value = node.arg(0)
    else:
        value = node.arg("fill_value")
    shape = node.out_shape
    if isinstance(value, ctx.bb.__class__) or hasattr(value, "struct_info"):
        v = cast(value, dt)  # a 0-d tensor fill value
    else:
        v = as_tensor(_to_py(value), dt)
    if not shape:
        return v
    return op.broadcast_to(v, tuple(shape))


def _to_py(value: Any) -> Any:
    if isinstance(value, (tir.IntImm, tir.FloatImm)):
        return value.value
    return value


@converter("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def arange(ctx: Any, node: Any) -> Any:
    dt = node.out_dtype
    if node.op_name == "aten.arange.default":
        start, end, step = 0, node.arg(0), 1
    else:
        start, end, step = node.arg(0), node.arg(1), node.arg("step", 1)
    vals = [_to_py(v) for v in (start, end, step)]
    if not all(isinstance(v, (int, float)) for v in vals):
        n = node.out_shape[0]
        if static_int(vals[0]) == 0 and static_int(vals[2]) == 1:
            return _iota(ctx, n, dt)
        raise node.error("arange with symbolic bounds other than arange(n) is not supported")
    n = static_int(node.out_shape[0])
    data = np.array([vals[0] + i * vals[2] for i in range(n)], dtype=np.float64)
    return _const_of(data, dt)


def _iota(ctx: Any, n: Any, dt: str) -> Any:
    """``0, 1, ..., n-1`` for a symbolic ``n``: a cumulative sum of ones."""
    ones = op.broadcast_to(scalar(1, "int64"), (n,))
    idx = op.subtract(op.cumsum(ones, axis=0), scalar(1, "int64"))
    return cast(idx, dt)


def _const_of(data: np.ndarray, dt: str) -> Any:
    return g.const(data.astype(as_dtype(dt).to_numpy()))


@converter("aten.linspace.default")
def linspace(ctx: Any, node: Any) -> Any:
    start, end, steps = (_to_py(node.arg(k)) for k in (0, 1, 2))
    dt = node.out_dtype
    if steps == 1:
        data = np.array([start], dtype=np.float64)
    else:
        step = (end - start) / (steps - 1)
        half = steps // 2
        data = np.array([start + i * step if i < half else end - (steps - 1 - i) * step
                         for i in range(steps)], dtype=np.float64)
    if not dt.startswith(("float", "bfloat")):
        data = np.trunc(data)
    return _const_of(data.astype(np.float32) if dt == "float32" else data, dt)


@converter("aten.tril.default", "aten.triu.default")
def triangle(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    k = int(node.arg("diagonal", 0))
    rows, cols = (static_int(d) for d in shape_of(x)[-2:])
    if rows is None or cols is None:
        raise node.error("tril/triu of symbolic matrix sizes")
    i = np.arange(rows)[:, None]
    j = np.arange(cols)[None, :]
    keep = (j - i <= k) if node.op_name.startswith("aten.tril") else (j - i >= k)
    zero = scalar(0, dtype_of(x)) if dtype_of(x) != "bool" else scalar(False, "bool")
    return op.where(_const_of(keep, "bool"), x, zero)


@converter("aten.eye.default", "aten.eye.m")
def eye(ctx: Any, node: Any) -> Any:
    n, m = (static_int(d) for d in node.out_shape)
    return _const_of(np.eye(n, m), node.out_dtype)
