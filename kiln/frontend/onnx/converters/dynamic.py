"""ONNX operators whose shapes are computed at run time (and NonZero, Compress: data-dependent).

Shape-determining inputs (Reshape's shape, Expand's shape, Slice's starts, Pad's pads, Tile's
repeats, ConstantOfShape, Range) are folded when known at import time (``converters/shape.py``);
when they are only known at run time the converters there call the functions below, which emit
the Relax-style sequence (see ``kiln.runtime.shape_funcs``)::

    s = call_extern("kiln.shape_func.<fn>", ..., sinfo_args=Shape(ndim=k))
    s1 = match_cast(s, Shape((d0, ..., dk-1)))          # fresh symbolic dims
    y = <kiln op with output shape (d0, ..., dk-1)>

The executor runs the shape function when its inputs exist, binds the dims and allocates the
outputs; the compiled model is not specialized to the values. Where the output dim must equal a
known input dim (an axis a Slice does not touch, an Expand axis of a non-1 input dim) the
match_cast uses that dim, so the run-time value is checked instead of trusted.

``select_shaped`` picks, by run-time flags, one of several values of one rank but different
dims (an If's branches, DFT's candidate axes): padded to the largest shape, selected, and cut
back by a run-time slice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .... import graph as g
from .... import op, tir
from ....runtime.shape_funcs import PREFIX
from ..registry import converter
from .common import ndim_of, norm_axis, prod, reshape, shape_of, static_int


def safe_name(name: str) -> str:
    out = "".join(c if c.isalnum() else "_" for c in name)
    return out if out and not out[0].isdigit() else f"v_{out}"


def runtime_shape(ctx: Any, node: Any, fn: str, args: Sequence[Any], known: Sequence[Any],
                  hint: str = "shape") -> tuple[Any, ...]:
    """Emit shape function ``fn`` on ``args`` and a match_cast of its result; the dims.

    ``known`` has one entry per result dim: a PrimExpr the dim must equal (checked at run
    time), or None for a fresh symbolic dim bound by the run.
    """
    call = g.Call(g.ExternFunc(PREFIX + fn), list(args),
                  sinfo_args=[g.ShapeStructInfo(ndim=len(known))])
    value = ctx.emit(call, f"{node.name}_{hint}")
    base = safe_name(node.name)
    dims = tuple(tir.Var(f"{base}_{hint}{i}", "int64") if k is None else k
                 for i, k in enumerate(known))
    ctx.bb.match_cast(value, g.ShapeStructInfo(dims))
    return dims


def shape_expr(ctx: Any, node: Any, x: Any) -> Any:
    """``x``'s shape as a ShapeExpr for a shape function; a clear error when only its rank is
    known at import (the sum of two run-time reshapes, whose dims cannot be related)."""
    if x.struct_info.shape is None:
        raise node.error(f"the dims of its input are not known at import ({x.struct_info}); "
                         "a shape computed at run time needs them")
    return g.ShapeExpr(shape_of(x))


def int64_tensor(x: Any) -> Any:
    """``x`` (an int tensor) as int64 (the dtype kernels read indices in)."""
    return x if str(x.struct_info.dtype) == "int64" else op.cast(x, "int64")


def static_len(node: Any, x: Any, what: str) -> int:
    shape = shape_of(x)
    n = static_int(shape[0]) if len(shape) == 1 else None
    if n is None:
        raise node.error(f"{what} must be a 1-d tensor of static length (it sets the output "
                         f"rank), got {x.struct_info}")
    return n


#: The highest rank of a tensor kiln returns: numpy's (``NPY_MAXDIMS``, 64 since numpy 2).
MAX_RANK = 64


def output_rank(node: Any, rank: int, what: str) -> int:
    """``rank``, the output rank a run-time operand (``what``) sets, checked against
    :data:`MAX_RANK` (a damaged model declared a shape input of 2**32 entries: fuzz 3036302)."""
    if rank > MAX_RANK:
        raise node.error(f"{what} makes an output of rank {rank}, above numpy's limit of "
                         f"{MAX_RANK}")
    return rank


def reshape_rt(ctx: Any, node: Any, x: Any, shape_t: Any, allowzero: bool) -> Any:
    """Reshape to a shape tensor known at run time (0 copies a dim, -1 is inferred)."""
    k = output_rank(node, static_len(node, shape_t, "the shape input"), "the shape input")
    dims = runtime_shape(ctx, node, "reshape", [shape_expr(ctx, node, x), shape_t, g.PrimValue(
        int(allowzero))], [None] * k)
    return op.dynamic_reshape(x, dims)


def expand_rt(ctx: Any, node: Any, x: Any, shape_t: Any) -> Any:
    """Expand to a shape tensor known at run time (numpy broadcasting)."""
    k = output_rank(node, static_len(node, shape_t, "the shape input"), "the shape input")
    in_shape = list(shape_of(x))
    rank = max(len(in_shape), k)
    aligned = [None] * (rank - len(in_shape)) + in_shape
    # a static dim other than 1 stays; a symbolic one may be 1 and broadcast: a fresh dim
    known = [d if d is not None and static_int(d) not in (None, 1) else None for d in aligned]
    dims = runtime_shape(ctx, node, "expand", [shape_expr(ctx, node, x), shape_t], known)
    return op.broadcast_to(x, dims)


def constant_of_shape_rt(ctx: Any, node: Any, shape_t: Any, fill: np.ndarray) -> Any:
    """A tensor of ``fill`` whose shape is a tensor known at run time."""
    k = output_rank(node, static_len(node, shape_t, "the shape input"), "the shape input")
    dims = runtime_shape(ctx, node, "values", [shape_t], [None] * k)
    return op.broadcast_to(g.const(np.asarray(fill.reshape(-1)[0], dtype=fill.dtype)), dims)


def range_rt(ctx: Any, node: Any, start: Any, limit: Any, delta: Any) -> Any:
    """ONNX Range with start/limit/delta known at run time."""
    (n,) = runtime_shape(ctx, node, "range", [start, limit, delta], [None])
    return op.dynamic_arange(start, delta, (n,))


def tile_rt(ctx: Any, node: Any, x: Any, repeats: Any) -> Any:
    """Tile by repeats known at run time: reshape, broadcast and reshape, with symbolic repeats."""
    s = list(shape_of(x))
    if static_len(node, repeats, "repeats") != len(s):
        raise node.error(f"repeats must have one entry per input axis ({len(s)})")
    reps = runtime_shape(ctx, node, "values", [repeats], [None] * len(s), "repeats")
    inter = [v for d in s for v in (1, d)]
    wide = [v for r, d in zip(reps, s) for v in (r, d)]
    out = op.broadcast_to(reshape(x, inter), tuple(wide))
    return op.dynamic_reshape(out, tuple(r * d for r, d in zip(reps, s)))


def _per_axis(nd: int, axes: Any, values: Sequence[tuple[Any, int]]) -> list[Any]:
    """Each of ``values`` (one entry per element of the run-time ``axes`` tensor) spread to one
    entry per axis of a rank-``nd`` tensor (``default`` where an axis is not listed): a one-hot
    of the normalized axes picks the entry."""
    i64 = "int64"
    a = int64_tensor(axes)
    a = op.where(op.less(a, g.const(np.zeros(1, i64))), op.add(a, g.const(np.full(1, nd))), a)
    hit = op.equal(op.expand_dims(a, 1), g.const(np.arange(nd, dtype=i64).reshape(1, nd)))
    has = op.greater(op.sum(op.cast(hit, i64), axis=0), g.const(np.zeros(1, i64)))
    out = []
    for v, default in values:
        picked = op.sum(op.where(hit, op.expand_dims(int64_tensor(v), 1),
                                 g.const(np.zeros(1, i64))), axis=0)
        out.append(op.where(has, picked, g.const(np.full(1, default, i64))))
    return out


def slice_rt(ctx: Any, node: Any, x: Any, starts: Any, ends: Any, axes: Any,
             steps: Any) -> Any:
    """ONNX Slice with starts/ends/steps (and axes: a list, or a tensor known at run time)
    known at run time."""
    nd = ndim_of(x)
    n = static_len(node, starts, "starts")
    if n > nd:
        raise node.error(f"starts has {n} entries, more than the input's rank {nd}")
    if axes is not None and not isinstance(axes, list):
        steps = g.const(np.ones(n, np.int64)) if steps is None else steps
        full = _per_axis(nd, axes, [(starts, 0), (ends, np.iinfo(np.int64).max), (steps, 1)])
        starts, ends, steps = (ctx.emit(v, f"{node.name}_{w}") for v, w in zip(
            full, ("starts", "ends", "steps")))
        axes, n = list(range(nd)), nd
    axes = list(range(n)) if axes is None else [norm_axis(a, nd) for a in axes]
    if len(axes) != n or len(set(axes)) != n or any(not 0 <= a < nd for a in axes):
        raise node.error(f"axes {axes} do not fit starts of length {n} and rank {nd}")
    starts = int64_tensor(starts)
    steps = g.const(np.ones(n, np.int64)) if steps is None else int64_tensor(steps)
    known = [None if a in axes else d for a, d in enumerate(shape_of(x))]
    dims = runtime_shape(ctx, node, "slice", [shape_expr(ctx, node, x), starts, int64_tensor(ends),
                                              g.ShapeExpr(tuple(axes)), steps], known)
    return op.dynamic_strided_slice(x, starts, steps, tuple(axes), dims)


def pad_rt(ctx: Any, node: Any, x: Any, pads: Any, fill: Any, axes: Any, mode: str) -> Any:
    """ONNX Pad with pads and the fill value (a scalar tensor) known at run time (negative pads
    crop)."""
    nd = ndim_of(x)
    if axes is not None and not isinstance(axes, list):
        n = static_len(node, pads, "pads") // 2
        begin = ctx.emit(op.strided_slice(pads, (0,), (n,)), f"{node.name}_begin")
        end = ctx.emit(op.strided_slice(pads, (n,), (2 * n,)), f"{node.name}_end")
        pads = ctx.emit(op.concat(_per_axis(nd, axes, [(begin, 0), (end, 0)]), axis=0),
                        f"{node.name}_pads")
        axes = None
    axes = list(range(nd)) if axes is None else [norm_axis(a, nd) for a in axes]
    if static_len(node, pads, "pads") != 2 * len(axes):
        raise node.error(f"pads must have 2 entries per padded axis ({len(axes)})")
    pads = int64_tensor(pads)
    known = [None if a in axes else d for a, d in enumerate(shape_of(x))]
    dims = runtime_shape(ctx, node, "pad",
                         [shape_expr(ctx, node, x), pads, g.ShapeExpr(tuple(axes))], known)
    if fill is None:
        fill = g.const(np.zeros((), dtype=str(x.struct_info.dtype)))
    elif shape_of(fill):
        fill = op.reshape(fill, ())
    return op.dynamic_pad(x, pads, fill, tuple(axes), dims, mode=mode)


def unsqueeze_rt(ctx: Any, node: Any, x: Any, axes: Any) -> Any:
    """Unsqueeze by axes known at run time (their count, hence the rank, is static)."""
    rank = output_rank(node, ndim_of(x) + static_len(node, axes, "axes"), "axes")
    dims = runtime_shape(ctx, node, "unsqueeze", [shape_expr(ctx, node, x), axes], [None] * rank)
    return op.dynamic_reshape(x, dims)


def squeeze_rt(ctx: Any, node: Any, x: Any, axes: Any) -> Any:
    """Squeeze axes known at run time (their count, hence the rank, is static)."""
    rank = ndim_of(x) - static_len(node, axes, "axes")
    dims = runtime_shape(ctx, node, "squeeze", [shape_expr(ctx, node, x), axes], [None] * rank)
    return op.dynamic_reshape(x, dims)


def split_rt(ctx: Any, node: Any, x: Any, sizes: Any, axis: int) -> list[Any]:
    """Split by sizes known at run time (their count, the number of outputs, is static)."""
    k = static_len(node, sizes, "split")
    sizes = ctx.emit(int64_tensor(sizes), f"{node.name}_sizes")
    lens = runtime_shape(ctx, node, "split", [shape_expr(ctx, node, x), sizes, g.PrimValue(axis)],
                         [None] * k, "part")
    offsets = ctx.emit(op.cumsum(sizes, axis=0, exclusive=True), f"{node.name}_offsets")
    one = g.const(np.ones(1, np.int64))
    outs = []
    for i, length in enumerate(lens):
        start = op.strided_slice(offsets, (i,), (i + 1,))
        dims = tuple(length if a == axis else d for a, d in enumerate(shape_of(x)))
        outs.append(op.dynamic_strided_slice(x, start, one, (axis,), dims))
    return outs



def select_shaped(ctx: Any, node: Any, default: Any, choices: Sequence[tuple[Any, Any]]
                  ) -> Any:
    """The value of the last of ``choices`` (``(bool scalar, value)``) whose flag holds at run
    time, else ``default``, when the values differ in shape (not in rank or dtype): each is
    zero-padded to the largest shape, ``where`` picks one, and a run-time slice cuts it back to
    its own shape; the output dims are bound by the slice shape function (static where every
    value agrees). A rank that depends on a run-time choice cannot be expressed (a value's rank
    is static in kiln): that is an error naming the node."""
    def bound(v: Any) -> Any:
        return v if isinstance(v, (g.Var, g.Constant)) else ctx.emit(v)

    default, choices = bound(default), [(f, bound(v)) for f, v in choices]
    values = [default, *(v for _, v in choices)]
    shapes = [[static_int(d) for d in shape_of(v)] for v in values]
    dtypes = {str(v.struct_info.dtype) for v in values}
    if len({len(sh) for sh in shapes}) != 1 or len(dtypes) != 1:
        raise node.error("the candidate values differ in rank or dtype ("
                         + ", ".join(str(v.struct_info) for v in values) + "); kiln needs a "
                         "static rank and dtype for a value chosen at run time")
    if any(None in sh for sh in shapes):
        raise node.error("the candidate values have symbolic dims and differ in shape ("
                         + ", ".join(str(v.struct_info) for v in values) + ")")
    big = [max(col) for col in zip(*shapes)]
    nd = len(big)

    def padded(v: Any, sh: list[int]) -> Any:
        return op.pad(v, tuple((0, b - d) for b, d in zip(big, sh))) if sh != big else v

    out, ends = padded(default, shapes[0]), g.const(np.array(shapes[0], np.int64))
    for (flag, v), sh in zip(choices, shapes[1:]):
        out = op.where(flag, padded(v, sh), out)
        ends = op.where(flag, g.const(np.array(sh, np.int64)), ends)
    out, ends = ctx.emit(out, f"{node.name}_padded"), ctx.emit(ends, f"{node.name}_ends")
    zeros, ones = g.const(np.zeros(nd, np.int64)), g.const(np.ones(nd, np.int64))
    known = [big[k] if len({sh[k] for sh in shapes}) == 1 else None for k in range(nd)]
    dims = runtime_shape(ctx, node, "slice", [shape_expr(ctx, node, out), zeros, ends, g.ShapeExpr(
        tuple(range(nd))), ones], known)
    return op.dynamic_strided_slice(out, zeros, ones, tuple(range(nd)), dims)


# ---- data-dependent output shapes ---------------------------------------------------------
def _nonzero_coords(ctx: Any, node: Any, x: Any) -> Any:
    """(ndim, count) int64 coordinates of the nonzero elements of ``x``: a counting kernel
    (cumsum of the mask; its sum binds ``count``), then the filling kernel."""
    if not ndim_of(x):
        raise node.error("a 0-d input is not supported")
    zero = g.const(np.zeros((), dtype=str(x.struct_info.dtype)))
    mask = op.cast(op.not_equal(x, zero), "int64")
    mask = ctx.emit(mask, f"{node.name}_mask")
    counts = ctx.emit(op.cumsum(mask), f"{node.name}_counts")
    total = ctx.emit(op.sum(mask), f"{node.name}_count")
    (n,) = runtime_shape(ctx, node, "values", [total], [None], "count")
    return op.dynamic_nonzero(x, counts, (ndim_of(x), n))


@converter("NonZero", since=9)
def nonzero(ctx: Any, node: Any) -> Any:
    const = node.const_value(0)
    if const is not None:
        return np.array(np.nonzero(const), dtype=np.int64)
    return _nonzero_coords(ctx, node, node.input(0))


@converter("Compress", since=9)
def compress(ctx: Any, node: Any) -> Any:
    x, cond = node.input(0), node.input(1)
    axis = node.attr("axis", None)
    if axis is None:
        x = ctx.emit(reshape(x, (prod(shape_of(x)),)), f"{node.name}_flat")
        axis = 0
    axis = norm_axis(int(axis), ndim_of(x))
    if ndim_of(cond) != 1:
        raise node.error(f"condition must be 1-d, got {cond.struct_info}")
    dim, length = static_int(shape_of(x)[axis]), static_int(shape_of(cond)[0])
    # symbolic lengths: a condition longer than the axis selects an index out of range,
    # which the gather's run-time check reports
    if length is not None and dim is not None and length > dim:
        raise node.error(f"condition has {length} entries for an axis of {dim}")
    coords = ctx.emit(_nonzero_coords(ctx, node, cond), f"{node.name}_indices")
    (n,) = shape_of(coords)[1:]
    return op.take(x, op.dynamic_reshape(coords, (n,)), axis=axis)



def _group_bounds(ctx: Any, node: Any, diff: Any, n: int) -> tuple[Any, Any, Any, Any]:
    """Runs of equal rows in sorted order, given ``diff`` ((n-1,) bool: row p+1 differs from
    row p): (starts, ends, group id + 1 of each sorted position, the run count ``u``); starts
    and ends are (u,) int64 positions."""
    i64 = "int64"
    true = g.const(np.ones(1, bool))
    is_new = op.concat([true, diff], axis=0) if n > 1 else true
    is_last = op.concat([diff, true], axis=0) if n > 1 else true
    is_new, is_last = ctx.emit(is_new, f"{node.name}_new"), ctx.emit(is_last, f"{node.name}_last")
    new_c = ctx.emit(op.cumsum(op.cast(is_new, i64)), f"{node.name}_group")
    last_c = ctx.emit(op.cumsum(op.cast(is_last, i64)), f"{node.name}_last_count")
    total = ctx.emit(op.sum(op.cast(is_new, i64)), f"{node.name}_count")
    (u,) = runtime_shape(ctx, node, "values", [total], [None], "unique")
    starts = op.dynamic_reshape(op.dynamic_nonzero(is_new, new_c, (1, u)), (u,))
    ends = op.dynamic_reshape(op.dynamic_nonzero(is_last, last_c, (1, u)), (u,))
    return ctx.emit(starts, f"{node.name}_starts"), ctx.emit(ends, f"{node.name}_ends"), new_c, u


def _argsort(x: Any, n: Any) -> Any:
    """Stable ascending argsort of a 1-d tensor of length ``n``."""
    return g.TupleGetItem(op.topk(x, n, axis=0, largest=False), 1)


def _lex_order(ctx: Any, node: Any, rows: Any, n: int, m: int) -> Any:
    """Stable lexicographic argsort of the ``n`` rows of ``rows`` (n, m): stable sorts by the
    last column first, then each earlier one (least significant key first)."""
    perm: Any = None
    for k in range(m - 1, -1, -1):
        col = op.reshape(op.strided_slice(rows, (0, k), (n, k + 1)), (n,))
        if perm is not None:
            col = op.take(col, perm, axis=0)
        idx = ctx.emit(_argsort(ctx.emit(col, f"{node.name}_key{k}"), n), f"{node.name}_ord{k}")
        perm = idx if perm is None else ctx.emit(op.take(perm, idx, axis=0),
                                                 f"{node.name}_perm{k}")
    return perm


@converter("Unique", since=11)
def unique(ctx: Any, node: Any) -> Any:
    """Sort the rows (the elements, or the slices along ``axis``) with stable TopKs, find runs
    of equal rows (their count binds the output length), and gather; ``sorted=0`` reorders the
    runs by first occurrence with another argsort."""
    x = node.input(0)
    dims = [static_int(d) for d in shape_of(x)]
    if None in dims:
        raise node.error(f"Unique needs a static input shape, got {x.struct_info}")
    axis = node.attr("axis", None)
    if axis is None:
        x, dims, axis = reshape(x, (int(np.prod(dims, dtype=np.int64)),)), [int(np.prod(dims))], 0
    axis = norm_axis(int(axis), len(dims))
    n, rest = dims[axis], dims[:axis] + dims[axis + 1:]
    m = int(np.prod(rest, dtype=np.int64))
    if n == 0 or m == 0:
        raise node.error("Unique of an empty tensor is not supported")
    i64 = "int64"
    moved = op.transpose(x, (axis, *[d for d in range(len(dims)) if d != axis]))
    rows = ctx.emit(reshape(moved, (n, m)), f"{node.name}_rows")
    perm = _lex_order(ctx, node, rows, n, m)
    srows = ctx.emit(op.take(rows, perm, axis=0), f"{node.name}_sorted")
    diff = None
    if n > 1:
        ne = op.not_equal(op.strided_slice(srows, (1, 0), (n, m)),
                          op.strided_slice(srows, (0, 0), (n - 1, m)))
        diff = op.greater(op.sum(op.cast(ne, i64), axis=1), g.const(np.zeros(1, i64)))
    starts, ends, group, u = _group_bounds(ctx, node, diff, n)
    values = ctx.emit(op.take(srows, starts, axis=0), f"{node.name}_unique_rows")
    first = ctx.emit(op.take(perm, starts, axis=0), f"{node.name}_first")
    counts = op.add(op.subtract(ends, starts), g.const(np.ones(1, i64)))
    inverse = op.take(op.subtract(group, g.const(np.ones(1, i64))), _argsort(perm, n), axis=0)
    if not int(node.attr("sorted", 1)):
        order = ctx.emit(_argsort(first, u), f"{node.name}_by_first")
        values = ctx.emit(op.take(values, order, axis=0), f"{node.name}_in_order")
        first, counts = op.take(first, order, axis=0), op.take(counts, order, axis=0)
        inverse = op.take(_argsort(order, u), inverse, axis=0)
    # (u, m) rows -> (u, *rest) -> the unique axis back in place
    out = op.dynamic_reshape(values, (u, *rest))
    if axis:
        back = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(dims)))
        out = op.transpose(out, tuple(back))
    return [out, first, inverse, counts]


def check_range(ctx: Any, node: Any, value: Any, lo: int, hi: int, what: str) -> None:
    """Check at run time that every element of the int tensor ``value`` (static size) lies in
    ``[lo, hi]``: the shape function ``values`` rejects the negative entries of
    ``[min(value) - lo, hi - max(value)]``, so the model raises (naming this node) instead of
    computing with an invalid value."""
    value = ctx.emit(value, f"{node.name}_{what}") if value.struct_info is None else value
    sizes = [static_int(d) for d in shape_of(value)]
    n = None if None in sizes else int(np.prod(sizes, dtype=np.int64))
    if n is None:
        raise node.error(f"{what} must have a static number of elements, got {value.struct_info}")
    if n == 0:
        return
    # the smallest and the largest value: two numbers to check however many values there are
    v = op.cast(value, "int64")
    low = op.reshape(op.subtract(op.min(v), _i64(lo)), (1,))
    high = op.reshape(op.subtract(_i64(hi), op.max(v)), (1,))
    bounds = ctx.emit(op.concat([low, high], axis=0), f"{node.name}_{what}_bounds")
    runtime_shape(ctx, node, "values", [bounds], [None, None],
                  f"{node.op_type}_{what}_range_check")


def _i64(v: int) -> Any:
    return g.const(np.array([v], dtype="int64"))
