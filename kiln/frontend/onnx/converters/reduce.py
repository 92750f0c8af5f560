"""Reductions: ReduceSum/Mean/Max/Min/Prod, ReduceL1/L2/SumSquare/LogSum/LogSumExp, ArgMax/ArgMin.

Reduction axes moved from an attribute to an input (ReduceSum at opset 13, the others at 18);
an empty axes list reduces everything unless ``noop_with_empty_axes`` (then, as for a 0-d
input, each element still goes through the reduction's element-wise steps). The composite reductions
are decomposed into kiln ops (``abs``/``multiply`` + ``sum``, then ``sqrt``/``log``): FuseOps
puts the element-wise prologue and epilogue into the reduction kernel. Over an empty set they
give the ONNX values: 0 for L1/L2/SumSquare, -inf for LogSum/LogSumExp.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from .common import along, dtype_of, ints, iota, ndim_of, node_axis, scalar, shape_of, static_int
from .dynamic import check_range, runtime_shape


def _square(x: Any) -> Any:
    return op.multiply(x, x)


def _log_sum_exp(x: Any, axis: tuple[int, ...], keepdims: bool) -> Any:
    """``log(sum(exp(x - m))) + m`` with ``m`` the maximum (no overflow); an infinite maximum
    (all -inf, an inf, or an empty set) shifts by 0 so that the result is that infinity."""
    dt = dtype_of(x)
    m = op.max(x, axis=axis, keepdims=True)
    finite = op.less(op.abs(m), scalar(np.inf, dt))
    shift = op.where(finite, m, scalar(0, dt))
    total = op.sum(op.exp(op.subtract(x, shift)), axis=axis, keepdims=keepdims)
    if not keepdims:
        shift = op.squeeze(shift, axis=axis)
    return op.add(op.log(total), shift)


_STATIC = {"sum": op.sum, "mean": op.mean, "max": op.max, "min": op.min, "prod": op.prod,
           "logsumexp": _log_sum_exp}

# ONNX op -> (kiln reduction kind, element-wise prologue, epilogue, opset where axes became an
# input). The float epilogues (and logsumexp) run integers through float64 and back.
_REDUCE: dict[str, tuple[str, Any, Any, int]] = {
    "ReduceSum": ("sum", None, None, 13), "ReduceMean": ("mean", None, None, 18),
    "ReduceMax": ("max", None, None, 18), "ReduceMin": ("min", None, None, 18),
    "ReduceProd": ("prod", None, None, 18),
    "ReduceL1": ("sum", op.abs, None, 18), "ReduceL2": ("sum", _square, op.sqrt, 18),
    "ReduceSumSquare": ("sum", _square, None, 18), "ReduceLogSum": ("sum", None, op.log, 18),
    "ReduceLogSumExp": ("logsumexp", None, None, 18),
}


def _is_float(x: Any) -> bool:
    return dtype_of(x).startswith(("float", "bfloat"))


def _check_axes_rank(node: Any, rank: int) -> None:
    """The ``axes`` input is a list of axes, a 1-D tensor (onnxruntime refuses others too)."""
    if rank != 1:
        raise node.error(f"input 1 (axes) must be a 1-D tensor, got rank {rank}")


def _reduce(kind: str, pre: Any, post: Any, axes_from_input: bool) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        keepdims = bool(node.attr("keepdims", 1))
        runtime_axes = None
        if axes_from_input:
            if node.has_input(1) and not node.is_const(1):
                runtime_axes = node.input(1)
                _check_axes_rank(node, ndim_of(runtime_axes))
                if static_int(shape_of(runtime_axes)[0]) == 0:  # statically empty
                    runtime_axes, axes = None, []
            else:
                value = node.const_input(1, "axes")
                if value is not None:
                    _check_axes_rank(node, np.ndim(value))
                axes = None if value is None else ints(value)
        else:
            axes = node.attr("axes", None)
            axes = None if axes is None else [int(a) for a in axes]
        # over no axes (noop_with_empty_axes, or a 0-d input) each element is its own
        # reduction: it still goes through the element-wise steps (SumSquare squares, L1/L2
        # take |x|, LogSum the log), as in onnxruntime and onnx.reference
        no_axes = ndim_of(x) == 0
        if runtime_axes is None and not axes:
            if node.attr("noop_with_empty_axes", 0):
                no_axes = True
            else:
                axes = list(range(ndim_of(x)))
        if no_axes and pre is None and post is None:
            return x
        dt = dtype_of(x)
        widen = (kind == "logsumexp" or post is not None) and not _is_float(x)
        if widen:
            x = op.cast(x, "float64")
        if pre is not None:
            x = pre(x)
        if no_axes:  # log(exp(x)) of logsumexp is x itself
            out = x
        elif runtime_axes is None:
            out = _STATIC[kind](x, axis=tuple(axes), keepdims=keepdims)
        else:
            x = ctx.emit(x, f"{node.name}_input") if x is not node.input(0) else x
            out = _reduce_runtime_axes(ctx, node, x, runtime_axes, kind, keepdims)
        if post is not None:
            out = post(out)
        return op.cast(out, dt) if widen else out

    return convert


for _name, (_kind, _pre, _post, _since) in _REDUCE.items():
    converter(_name, since=1)(_reduce(_kind, _pre, _post, False))
    converter(_name, since=_since)(_reduce(_kind, _pre, _post, True))


def _arg(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        axis = int(node.attr("axis", 0))
        keepdims = bool(node.attr("keepdims", 1))
        if not node.attr("select_last_index", 0):
            return fn(x, axis=axis, keepdims=keepdims)
        # the last extremum is the first one of the reversed axis: n - 1 - index there
        n = static_int(shape_of(x)[axis])
        if n is None:
            raise node.error("select_last_index=1 needs a static reduced axis")
        rev = op.strided_slice(x, (None,), (None,), (-1,), (axis,))
        idx = fn(rev, axis=axis, keepdims=keepdims)
        return op.subtract(g.const(np.array(n - 1, dtype="int64")), idx)

    return convert


converter("ArgMax")(_arg(op.argmax))
converter("ArgMin")(_arg(op.argmin))


# ---- run-time scalars ----------------------------------------------------------------------


def _reduce_runtime_axes(ctx: Any, node: Any, x: Any, axes_t: Any, kind: str,
                         keepdims: bool) -> Any:
    """A reduction whose axes are a tensor known only at run time (static input shape).

    Small int64 graph ops turn the axes into the kept-dims shape (1 where reduced), a host
    shape function binds it, and ``reduce_to`` reduces; without ``keepdims`` a second shape
    function (``reshape``, which checks the element count, so repeated axes are an error)
    drops the reduced dims."""
    dims = [static_int(d) for d in shape_of(x)]
    if any(d is None for d in dims):
        raise node.error(f"axes known only at run time need a static input shape, got "
                         f"{x.struct_info}")
    if ndim_of(axes_t) != 1 or static_int(shape_of(axes_t)[0]) is None:
        raise node.error(f"axes must be a 1-d tensor of static length, got {axes_t.struct_info}")
    r, n_axes = len(dims), static_int(shape_of(axes_t)[0])
    if n_axes > r:
        raise node.error(f"axes has {n_axes} entries, more than the input's rank {r} (an axis "
                         "may appear once)")
    i64 = "int64"
    a = ctx.emit(op.cast(axes_t, i64), f"{node.name}_axes")
    check_range(ctx, node, a, -r, r - 1, "axes")
    a = op.where(op.less(a, scalar(0, i64)), op.add(a, scalar(r, i64)), a)
    hit = op.equal(op.expand_dims(a, 1), op.reshape(iota(r, i64), (1, r)))  # (n_axes, r)
    reduced = ctx.emit(op.greater(op.sum(op.cast(hit, i64), axis=0), scalar(0, i64)),
                       f"{node.name}_reduced")
    dims_c = g.const(np.array(dims, dtype=i64))
    sizes = ctx.emit(op.where(reduced, scalar(1, i64), dims_c), f"{node.name}_sizes")
    m = runtime_shape(ctx, node, "values", [sizes], [1 if d == 1 else None for d in dims],
                      "reduced")
    y = op.reduce_to(x, shape=m, kind="sum" if kind == "mean" else kind)
    if kind == "mean":
        count = op.prod(op.where(reduced, dims_c, scalar(1, i64)))
        if _is_float(x):
            y = op.divide(y, op.cast(count, dtype_of(x)))
        else:
            y = op.floor_divide(y, op.cast(op.maximum(count, scalar(1, i64)), dtype_of(x)))
    if keepdims:
        return y
    # kept[p] = the p-th kept dim: a one-hot over the kept dims' positions
    keep = op.cast(op.logical_not(reduced), i64)
    pos = op.cumsum(keep, axis=0, exclusive=True)
    slots = op.reshape(iota(r - n_axes, i64), (1, r - n_axes))
    onehot = op.logical_and(op.equal(op.expand_dims(pos, 1), slots),
                            op.expand_dims(op.greater(keep, scalar(0, i64)), 1))
    kept = op.sum(op.where(onehot, op.expand_dims(dims_c, 1), scalar(0, i64)), axis=0)
    kept = ctx.emit(kept, f"{node.name}_kept")
    out = runtime_shape(ctx, node, "reshape", [g.ShapeExpr(tuple(m)), kept, g.PrimValue(1)],
                        [None] * (r - n_axes), "kept")
    return op.dynamic_reshape(y, out)


# ---- CumSum / CumProd ----------------------------------------------------------------------
def _scan(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        kw = {"exclusive": bool(node.attr("exclusive", 0)),
              "reverse": bool(node.attr("reverse", 0))}
        nd = ndim_of(x)
        if nd == 0:
            raise node.error("x must have rank >= 1")
        value = node.const_value(1)
        if value is not None:
            axis = ints(value)[0]
            if not -nd <= axis < nd:
                raise node.error(f"axis {axis} is out of range for rank {nd}")
            return fn(x, axis=axis, **kw)
        # axis known only at run time: check it, then scan along every axis and select (the
        # result's shape does not depend on it; real models pass a constant axis)
        axis_t = node.input(1)
        check_range(ctx, node, axis_t, -nd, nd - 1, "axis")
        out = fn(x, axis=nd - 1, **kw)
        if nd == 1:
            return out
        a = op.reshape(op.cast(axis_t, "int64"), ())
        a = op.where(op.less(a, scalar(0, "int64")), op.add(a, scalar(nd, "int64")), a)
        a = ctx.emit(a, f"{node.name}_axis")
        for d in range(nd - 1):
            out = op.where(op.equal(a, scalar(d, "int64")), fn(x, axis=d, **kw), out)
        return out

    return convert


converter("CumSum", since=11)(_scan(op.cumsum))
converter("CumProd", since=26)(_scan(op.cumprod))


# ---- Hardmax, OneHot (one-hot of an index, decomposed) -------------------------------------
def _one_hot_along(index: Any, n: Any, axis: int, ndim: int) -> Any:
    """bool: ``index == position along axis`` (``index`` broadcasts along ``axis``)."""
    return op.equal(index, along(iota(n, "int64"), axis, ndim))


def _size(dims: Any) -> Any:
    """The product of ``dims``: an int when all are static."""
    static = [static_int(d) for d in dims]
    if None not in static:
        return int(np.prod(static, dtype=np.int64))
    out: Any = 1
    for d in dims:
        out = out * d
    return out


@converter("Hardmax", since=1)
def hardmax_v1(ctx: Any, node: Any) -> Any:
    # before opset 13 the input is coerced to 2-D at ``axis``: hardmax over x[:axis] flattened
    x = node.input(0)
    shape = shape_of(x)
    axis = int(node.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    rows, cols = _size(shape[:axis]), _size(shape[axis:])
    flat = op.reshape(x, (rows, cols))
    y = op.cast(_one_hot_along(op.argmax(flat, axis=1, keepdims=True), cols, 1, 2), dtype_of(x))
    return op.reshape(y, shape)


@converter("Hardmax", since=13)
def hardmax(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    nd = ndim_of(x)
    axis = node_axis(node, nd)
    first = op.argmax(x, axis=axis, keepdims=True)  # ties: the first maximum
    return op.cast(_one_hot_along(first, shape_of(x)[axis], axis, nd), dtype_of(x))


@converter("OneHot", since=9)
def one_hot(ctx: Any, node: Any) -> Any:
    indices, values = node.input(0), node.input(2)
    nd = ndim_of(indices) + 1
    axis = node_axis(node, nd, what="output rank")
    i64 = "int64"
    depth_v = node.const_value(1)
    if depth_v is not None:
        if depth_v.size != 1 or int(depth_v.reshape(-1)[0]) < 1:
            raise node.error(f"depth must be one positive value, got {depth_v.tolist()}")
        depth: Any = int(depth_v.reshape(-1)[0])
        depth_t = scalar(depth, i64)
    else:  # known at run time: a host shape function binds the output dim (and checks > 0)

        raw = node.input(1)
        depth_t = ctx.emit(op.reshape(op.cast(raw, i64), ()), f"{node.name}_depth")
        check_range(ctx, node, depth_t, 1, np.iinfo(np.int64).max - 1, "depth")
        (depth,) = runtime_shape(ctx, node, "values", [op.reshape(depth_t, (1,))], [None],
                                 "depth")
    idx = op.cast(indices, i64) if dtype_of(indices) != i64 else indices
    idx = op.where(op.less(idx, scalar(0, i64)), op.add(idx, depth_t), idx)  # -1: the last
    hot = _one_hot_along(op.expand_dims(idx, axis), depth, axis, nd)  # out of range: none
    off = op.take(values, g.const(np.array(0, dtype=i64)), axis=0)
    on = op.take(values, g.const(np.array(1, dtype=i64)), axis=0)
    return op.where(hot, on, off)


# ---- TopK ----------------------------------------------------------------------------------
def _topk(ctx: Any, node: Any, k: Any) -> Any:
    x = node.input(0)
    nd = ndim_of(x)
    axis = node_axis(node, nd)
    n = static_int(shape_of(x)[axis])
    if isinstance(k, int) and n is not None and not 0 <= k <= n:
        raise node.error(f"k={k} must be in [0, {n}] (the length of axis {axis})")
    # sorted=0 allows any order: the sorted result is one of them
    out = ctx.emit(op.topk(x, k, axis=axis, largest=bool(node.attr("largest", 1))),
                   f"{node.name}_topk")
    return [g.TupleGetItem(out, 0), g.TupleGetItem(out, 1)]


@converter("TopK", since=1)
def topk_v1(ctx: Any, node: Any) -> Any:
    return _topk(ctx, node, int(node.attr("k")))


@converter("TopK", since=10)
def topk_v10(ctx: Any, node: Any) -> Any:
    value = node.const_value(1)
    if value is not None:
        return _topk(ctx, node, ints(value)[0])
    # k known at run time: checked against the axis, then bound as the output dim

    x, k_t = node.input(0), node.input(1)
    axis = int(node.attr("axis", -1))
    n = static_int(shape_of(x)[axis]) if -ndim_of(x) <= axis < ndim_of(x) else None
    if n is None:
        raise node.error("a k known only at run time needs a static length of the axis")
    k_t = ctx.emit(op.reshape(op.cast(k_t, "int64"), (1,)), f"{node.name}_k")
    check_range(ctx, node, k_t, 0, n, "k")
    (k,) = runtime_shape(ctx, node, "values", [k_t], [None], "k")
    return _topk(ctx, node, k)


from . import einsum  # noqa: E402, F401 - Einsum (a contraction) lives in its own module
