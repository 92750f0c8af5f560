"""Reductions: sum, mean, max, min, prod, argmax, argmin (numpy semantics).

Attributes are ``axis`` (an int, a tuple of ints, or None for all axes; negative axes count from
the end and are normalized at inference) and ``keepdims``. ``axis=()`` reduces nothing (numpy).

Result dtypes: ``sum``/``prod`` keep the input dtype, except bool which counts in int64;
``max``/``min`` keep it; ``mean`` keeps it too — for integers it is the floor of the exact mean.
float16/bfloat16 ``sum``/``mean``/``prod`` accumulate in float32 and round once at the end.
``argmax``/``argmin`` return int64 indices of the first occurrence of the extreme value; with
``axis=None`` the index is into the flattened tensor. A NaN is the extreme of its row (as
``max``/``min`` propagate it): the index of the first NaN (numpy, torch; onnxruntime skips
NaNs instead).

``reduce_to(x, shape, kind)`` reduces to a same-rank ``shape`` whose dims are each 1 (reduced)
or x's dim (kept), possibly symbolic: the form a reduction takes when *which* axes it reduces is
only known at run time (ONNX reductions whose ``axes`` is a graph input; a host shape function
binds the dims). Output element ``o`` reduces ``x[o + k]`` over ``k_d < x_d - shape_d + 1``, so a
kept axis has a one-step reduction loop and a reduced one the whole axis. Its gradient spreads
the adjoint back with clipped ``take`` ops, so it also works when the reduced axes are only known
at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import te
from ..graph.expr import Constant
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    INDEX_DTYPE,
    arg_ndim,
    arg_shape,
    as_dim,
    const_int,
    dims_equal,
    reduce_axes,
    scalar,
    shape_attr,
    shape_attr_value,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .elementwise import divide, equal, exp, logical_and, multiply, subtract, where
from .grad import expand_reduced
from .index import take
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpDef, OpPattern, register_op
from .scan import cumprod
from .shape import broadcast_to, reshape, transpose
from .sort import topk  # noqa: F401 - selection lives in sort.py; exported with the reductions

__all__ = ["sum", "mean", "max", "min", "prod", "argmax", "argmin", "reduce_to", "topk"]


@dataclass(frozen=True)
class ReduceAttrs:
    """``axis``: int, tuple of ints, or None (all axes); ``keepdims``: keep reduced dims as 1."""

    axis: int | tuple[int, ...] | None = None
    keepdims: bool = False

    def __post_init__(self):
        axis = self.axis
        if isinstance(axis, list):
            axis = tuple(axis)
            object.__setattr__(self, "axis", axis)
        items = axis if isinstance(axis, tuple) else () if axis is None else (axis,)
        for a in items:
            if isinstance(a, bool) or not isinstance(a, int):
                raise KilnError(f"reduction axis must be an int, a tuple of ints or None: {axis!r}")
        if not isinstance(self.keepdims, bool):
            raise KilnError(f"keepdims must be a bool, got {self.keepdims!r}")


@dataclass(frozen=True)
class ArgReduceAttrs:
    """``axis``: one int, or None for an index into the flattened tensor."""

    axis: int | None = None
    keepdims: bool = False

    def __post_init__(self):
        ax = self.axis
        if ax is not None and (isinstance(ax, bool) or not isinstance(ax, int)):
            raise KilnError(f"argmax/argmin axis must be an int or None, got {self.axis!r}")
        if not isinstance(self.keepdims, bool):
            raise KilnError(f"keepdims must be a bool, got {self.keepdims!r}")


def reduced_shape(shape: Sequence[Any], axes: Sequence[int], keepdims: bool) -> list[Any]:
    out = []
    for d, dim in enumerate(shape):
        if d in axes:
            if keepdims:
                out.append(1)
        else:
            out.append(dim)
    return out


def _result_dtype(op: str, dtype: DataType) -> DataType:
    if op in ("argmax", "argmin"):
        return INDEX_DTYPE
    if op in ("sum", "prod") and dtype.is_bool:
        return INDEX_DTYPE
    return dtype


def _make_infer(op: str, arg_reduce: bool = False) -> Callable[[Any], Any]:
    def infer(call: Any) -> Any:
        x = tensor_arg(call, 0, op, "x")
        dtype = as_dtype(x.dtype)
        if op == "mean" and not (dtype.is_float or dtype.is_integer):
            raise StructInfoError(f"{op}: x must be a numeric tensor, got dtype {dtype}")
        if dtype.is_handle:
            raise StructInfoError(f"{op}: x must be a tensor of numbers, got dtype {dtype}")
        attrs = call.attrs or (ArgReduceAttrs() if arg_reduce else ReduceAttrs())
        out_dtype = _result_dtype(op, dtype)
        ndim = arg_ndim(x)
        if ndim < 0:
            if attrs.axis is None and not attrs.keepdims:
                return tensor_sinfo((), out_dtype)
            return tensor_sinfo(None, out_dtype, ndim=-1)
        axes = reduce_axes(attrs.axis, ndim, op)
        shape = arg_shape(x)
        if shape is None:
            out_ndim = ndim if attrs.keepdims else ndim - len(axes)
            return tensor_sinfo(None, out_dtype, ndim=out_ndim)
        return tensor_sinfo(reduced_shape(shape, axes, attrs.keepdims), out_dtype)

    return infer


# ---- te computes ---------------------------------------------------------------------------
def _input_index(
    ndim: int, axes: Sequence[int], keepdims: bool, out_idx: Sequence[PrimExpr],
    red_vars: Sequence[PrimExpr],
) -> list[PrimExpr]:
    """Input index of a reduction point: output indices for kept dims, reduce vars for others."""
    it, rt = iter(out_idx), iter(red_vars)
    full = []
    for d in range(ndim):
        if d in axes:
            full.append(next(rt))
            if keepdims:
                next(it)
        else:
            full.append(next(it))
    return full


def _count(x: te.Tensor, axes: Sequence[int]) -> PrimExpr:
    n: PrimExpr = tx.const(INDEX_DTYPE, 1)
    for a in axes:
        n = n * x.shape[a]

    return simplify(n)


# Reductions over the innermost axis are split into PARTIALS interleaved partial results
# (``partial[..., p] = reduce_k x[..., k * PARTIALS + p]``) and a short final reduction. The
# first stage reads contiguous memory with its partial axis innermost, so the CPU schedule
# vectorizes it like a column reduction; a single running accumulator could not be vectorized
# without reassociating it. Only used when the axis is long enough to pay for the extra stage.
PARTIALS = 8
_PARTIAL_MIN_EXTENT = 64


def _reduce_stage(
    x: te.Tensor, axes: Sequence[int], keepdims: bool, reducer: Callable[..., PrimExpr],
    acc_dtype: DataType, name: str,
) -> te.Tensor:
    """``reducer`` over ``axes`` of ``x`` (cast to ``acc_dtype``)."""
    out_shape = reduced_shape(x.shape, axes, keepdims)
    if not axes:
        return te.compute(out_shape, lambda *i: tx.cast(acc_dtype, x(*i)), name=name)
    last = x.ndim - 1
    extent = const_int(x.shape[last])
    if (last in axes and extent is not None and extent % PARTIALS == 0
            and extent >= _PARTIAL_MIN_EXTENT):
        return _partial_reduce(x, axes, keepdims, reducer, acc_dtype, name)
    red = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
    rvars = [r.var for r in red]

    def body(*idx: PrimExpr) -> PrimExpr:
        value = x(*_input_index(x.ndim, axes, keepdims, idx, rvars))
        return reducer(tx.cast(acc_dtype, value), axis=red)

    return te.compute(out_shape, body, name=name)


def _partial_reduce(
    x: te.Tensor, axes: Sequence[int], keepdims: bool, reducer: Callable[..., PrimExpr],
    acc_dtype: DataType, name: str,
) -> te.Tensor:
    """Two-stage reduction for a long innermost axis (see PARTIALS)."""
    last = x.ndim - 1
    out_shape = reduced_shape(x.shape, axes, keepdims)
    chunks = tx.const(INDEX_DTYPE, const_int(x.shape[last]) // PARTIALS)
    red = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes if a != last]
    ko = te.reduce_axis((0, chunks), name=f"k{last}o")

    def partial_body(*idx: PrimExpr) -> PrimExpr:
        *out_idx, p = idx
        rvars = [r.var for r in red] + [ko.var * PARTIALS + p]
        value = x(*_input_index(x.ndim, axes, keepdims, out_idx, rvars))
        return reducer(tx.cast(acc_dtype, value), axis=[*red, ko])

    partial = te.compute([*out_shape, PARTIALS], partial_body, name=name + "_partial")
    kp = te.reduce_axis((0, PARTIALS), name="kp")
    return te.compute(
        out_shape, lambda *idx: reducer(partial(*idx, kp.var), axis=kp), name=name
    )


def _accumulator(dtype: DataType) -> DataType:
    if dtype.is_bool:
        return INDEX_DTYPE
    if dtype.is_float and dtype.bits < 32:
        return DataType("float32")
    return dtype


def _finish(t: te.Tensor, dtype: DataType, name: str) -> te.Tensor:
    """Cast an accumulator tensor to the result dtype (a no-op stage is avoided)."""
    if t.dtype == dtype:
        return t
    return te.compute(t.shape, lambda *i: tx.cast(dtype, t(*i)), name=name)


_prod = te.comm_reducer(lambda a, b: a * b, lambda t: 1, name="prod")


def _make_compute(op: str) -> Callable[..., te.Tensor]:
    def compute(x: te.Tensor, attrs: ReduceAttrs | None = None) -> te.Tensor:
        attrs = attrs or ReduceAttrs()
        axes = reduce_axes(attrs.axis, x.ndim, op)
        dtype = _result_dtype(op, x.dtype)
        if op in ("max", "min"):
            reducer = te.max if op == "max" else te.min
            return _reduce_stage(x, axes, attrs.keepdims, reducer, x.dtype, op)
        acc = _accumulator(x.dtype)
        reducer = _prod if op == "prod" else te.sum
        if op != "mean":
            stage = _reduce_stage(x, axes, attrs.keepdims, reducer, acc, op)
            return _finish(stage, dtype, op + "_cast")
        total = _reduce_stage(x, axes, attrs.keepdims, te.sum, acc, "mean_sum")
        n = _count(x, axes)
        if acc.is_float:
            return te.compute(
                total.shape,
                lambda *i: tx.cast(dtype, total(*i) / tx.cast(acc, n)),
                name="mean",
            )
        denom = tx.cast(acc, tx.max(n, tx.const(INDEX_DTYPE, 1)))  # empty: sum 0, no trap
        return te.compute(total.shape, lambda *i: tx.floordiv(total(*i), denom), name="mean")

    compute.__doc__ = f"te compute of {op}."
    return compute


def _make_arg_compute(op: str) -> Callable[..., te.Tensor]:
    extreme = te.max if op == "argmax" else te.min

    def compute(x: te.Tensor, attrs: ArgReduceAttrs | None = None) -> te.Tensor:
        attrs = attrs or ArgReduceAttrs()
        axes = reduce_axes(attrs.axis, x.ndim, op)
        keep = attrs.keepdims
        best = _reduce_stage(x, axes, keep, extreme, x.dtype, op + "_value")
        out_shape = reduced_shape(x.shape, axes, keep)
        if not axes:  # rank-0 input: the only index is 0
            return te.compute(out_shape, lambda *i: tx.const(INDEX_DTYPE, 0), name=op)
        red = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
        rvars = [r.var for r in red]
        # flat index of the reduce point within the reduced axes (row-major)
        flat: PrimExpr = rvars[0]
        for a, v in zip(axes[1:], rvars[1:]):
            flat = flat * x.shape[a] + v
        count = _count(x, axes)

        def body(*idx: PrimExpr) -> PrimExpr:
            value = x(*_input_index(x.ndim, axes, keep, idx, rvars))
            extreme_value = best(*idx)
            hit = tx.eq(value, extreme_value)
            if x.dtype.is_float:  # max/min propagate NaN: a NaN is the extreme (numpy)
                hit = tx.logical_or(hit, tx.logical_and(tx.isnan(value),
                                                        tx.isnan(extreme_value)))
            # first occurrence: the smallest index whose value equals the extreme
            return te.min(tx.select(hit, flat, count), axis=red)

        return te.compute(out_shape, body, name=op)

    compute.__doc__ = f"te compute of {op} (extreme value, then its first index)."
    return compute


# ---- gradients (signature in kiln.op.registry) ---------------------------------------------
def _products_of_others(x: Any, axes: Sequence[int], ndim: int) -> Any:
    """``prod_{j != i} x[j]`` over the reduced axes, for every position ``i`` (exact with
    zeros): the reduced axes are moved last and flattened, and the exclusive cumulative
    products from both ends are multiplied."""
    kept = [d for d in range(ndim) if d not in axes]
    perm = kept + list(axes)
    moved = perm != list(range(ndim))
    xt = transpose(x, tuple(perm)) if moved else x
    shape = shape_attr(arg_shape(x.struct_info))
    flat = len(axes) != 1
    xr = reshape(xt, tuple(shape[d] for d in kept) + (-1,)) if flat else xt
    both = multiply(cumprod(xr, axis=-1, exclusive=True),
                    cumprod(xr, axis=-1, exclusive=True, reverse=True))
    if flat:
        both = reshape(both, tuple(shape[d] for d in perm))
    if moved:
        both = transpose(both, tuple(perm.index(d) for d in range(ndim)))
    return both


def _make_grad(op: str) -> Callable[..., list[Any]]:
    def rule(call: Any, output_grad: Any, bb: Any) -> list[Any]:
        x = call.args[0]
        xs = x.struct_info
        if not as_dtype(xs.dtype).is_float:
            return [None]
        attrs = call.attrs or ReduceAttrs()
        ndim = arg_ndim(xs)
        axes = reduce_axes(attrs.axis, ndim, op)
        g = expand_reduced(output_grad, xs, axes, attrs.keepdims)
        if op == "sum" or not axes:
            return [g]
        if op == "mean":
            return [divide(g, _count_expr(x, axes))]
        if op in ("max", "min"):  # ties: every input equal to the extreme gets the gradient
            hit = equal(x, expand_reduced(call, xs, axes, attrs.keepdims))
            return [where(hit, g, scalar(0, xs.dtype))]
        return [multiply(g, _products_of_others(x, axes, ndim))]  # prod

    rule.__doc__ = f"Gradient of {op}."
    return rule


def _count_expr(x: Any, axes: Sequence[int]) -> Any:
    """The number of reduced elements as a 0-d constant (a run-time count when symbolic)."""
    shape = shape_attr(arg_shape(x.struct_info))
    dtype = x.struct_info.dtype
    sizes = [const_int(shape[a]) for a in axes]
    if all(s is not None for s in sizes):
        n = 1
        for s in sizes:
            n *= s
        return scalar(n, dtype)
    ones = broadcast_to(scalar(1, dtype), shape)
    return sum(ones, tuple(axes), True)  # this module's sum op


_GRADIENTS = {op: _make_grad(op) for op in ("sum", "mean", "prod", "max", "min")}


def _declare(
    op: str, mixed_precision: MixedPrecision, doc: str, arg_reduce: bool = False
) -> OpDef:
    return register_op(
        op,
        inputs=("x",),
        infer=_make_infer(op, arg_reduce),
        pattern=OpPattern.COMM_REDUCE,
        attrs=ArgReduceAttrs if arg_reduce else ReduceAttrs,
        compute=_make_arg_compute(op) if arg_reduce else _make_compute(op),
        mixed_precision=mixed_precision,
        gradient=NON_DIFFERENTIABLE if arg_reduce else _GRADIENTS[op],
        doc=doc,
    )


# sum/mean/prod accumulate: keep them in full precision under ToMixedPrecision (NEVER);
# max/min/argmax/argmin are exact in any precision (FOLLOW).
sum = _declare("sum", MixedPrecision.NEVER, "Sum over axes.")  # noqa: A001
mean = _declare("mean", MixedPrecision.NEVER, "Arithmetic mean over axes.")
prod = _declare("prod", MixedPrecision.NEVER, "Product over axes.")
max = _declare("max", MixedPrecision.FOLLOW, "Maximum over axes.")  # noqa: A001
min = _declare("min", MixedPrecision.FOLLOW, "Minimum over axes.")  # noqa: A001
argmax = _declare(
    "argmax", MixedPrecision.FOLLOW, "Index (int64) of the first maximum.", arg_reduce=True
)
argmin = _declare(
    "argmin", MixedPrecision.FOLLOW, "Index (int64) of the first minimum.", arg_reduce=True
)


# ---- reduce_to: reduced axes chosen at run time ---------------------------------------------
_REDUCE_TO_KINDS = ("sum", "max", "min", "prod", "logsumexp")


@dataclass(frozen=True)
class ReduceToAttrs:
    """``shape``: the result shape, of x's rank, each dim 1 or x's dim (ints or int64
    PrimExprs); ``kind``: sum, max, min, prod or logsumexp (``log(sum(exp(x)))``, shifted by
    the maximum so that it does not overflow)."""

    shape: tuple[Any, ...]
    kind: str = "sum"

    def __post_init__(self):
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "reduce_to"))
        if self.kind not in _REDUCE_TO_KINDS:
            raise KilnError(f"reduce_to: kind must be one of {_REDUCE_TO_KINDS}, got "
                            f"{self.kind!r}")


def _reduce_to_dtype(kind: str, dtype: DataType) -> DataType:
    return dtype if kind == "logsumexp" else _result_dtype(kind, dtype)


def _reduce_to_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "reduce_to", "x")
    attrs = call.attrs
    dtype = as_dtype(x.dtype)
    if dtype.is_handle or (attrs.kind == "logsumexp" and not dtype.is_float):
        raise StructInfoError(f"reduce_to: x must be a tensor of numbers (floats for "
                              f"logsumexp), got dtype {dtype} for kind {attrs.kind!r}")
    ndim = arg_ndim(x)
    if ndim >= 0 and ndim != len(attrs.shape):
        raise StructInfoError(f"reduce_to: shape {attrs.shape} must have x's rank {ndim}")
    return tensor_sinfo(tuple(as_dim(d) for d in attrs.shape), _reduce_to_dtype(attrs.kind, dtype))


def _reduce_to_compute(x: te.Tensor, attrs: ReduceToAttrs) -> te.Tensor:
    out = tuple(as_dim(d) for d in attrs.shape)
    one = tx.const(INDEX_DTYPE, 1)

    def axes() -> list[Any]:
        return [te.reduce_axis((0, simplify(x.shape[d] - out[d] + one)), name=f"k{d}")
                for d in range(x.ndim)]

    def load(o: Sequence[PrimExpr], red: Sequence[Any], dtype: DataType) -> PrimExpr:
        return tx.cast(dtype, x(*[simplify(i + r.var) for i, r in zip(o, red)]))

    kind = attrs.kind
    if kind in ("max", "min"):
        reducer = te.max if kind == "max" else te.min
        red_mm = axes()
        return te.compute(out, lambda *o: reducer(load(o, red_mm, x.dtype), axis=red_mm),
                          name="reduce_to")
    acc = _accumulator(x.dtype)
    if kind != "logsumexp":
        red = axes()
        reducer = _prod if kind == "prod" else te.sum
        total = te.compute(out, lambda *o: reducer(load(o, red, acc), axis=red),
                           name="reduce_to")
        return _finish(total, _result_dtype(kind, x.dtype), "reduce_to_cast")
    red_m = axes()
    peak = te.compute(out, lambda *o: te.max(load(o, red_m, acc), axis=red_m),
                      name="reduce_to_max")
    inf = tx.const(acc, float("inf"))

    def shift(o: Sequence[PrimExpr]) -> PrimExpr:  # an infinite maximum shifts by 0
        m = peak(*o)
        return tx.select(tx.lt(tx.fabs(m), inf), m, tx.const(acc, 0))

    red_s = axes()
    total = te.compute(out, lambda *o: te.sum(tx.exp(load(o, red_s, acc) - shift(o)),
                                              axis=red_s), name="reduce_to_sum")
    return te.compute(out, lambda *o: tx.cast(x.dtype, tx.log(total(*o)) + shift(o)),
                      name="reduce_to")


def _spread(value: Any, x: Any, out_dims: Sequence[Any]) -> Any:
    """``value`` (shaped like a ``reduce_to`` result) repeated along the reduced axes to x's
    shape. Which axes are reduced may be known only at run time, so each axis not statically
    kept is a clipped ``take`` of ``arange(x_d)``: the identity on a kept axis (``out_d ==
    x_d``), all zeros on a reduced one (``out_d == 1``). Needs those axes of x static."""
    for d, (n, o) in enumerate(zip(arg_shape(x.struct_info), out_dims)):
        if dims_equal(n, o):
            continue
        if const_int(n) is None:
            raise KilnError(f"reduce_to gradient: axis {d} of x must be static (x is "
                            f"{x.struct_info}, result shape {tuple(out_dims)})")
        value = take(value, Constant(np.arange(const_int(n), dtype=np.int64)), axis=d,
                     mode="clip")
    return value


def _reduce_to_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """The reduced-dims adjoint spread back over x (:func:`_spread`), like the static
    reductions' rules: max/min send it to every element equal to the extreme, prod multiplies
    by the product of the other elements (exact with zeros: counted, not divided by),
    logsumexp by the softmax ``exp(x - result)``."""
    x = call.args[0]
    dtype = x.struct_info.dtype
    if not as_dtype(dtype).is_float or arg_shape(x.struct_info) is None:
        if as_dtype(dtype).is_float:
            raise KilnError(f"reduce_to gradient: needs x of known shape, got {x.struct_info}")
        return [None]
    attrs = call.attrs
    out = tuple(as_dim(d) for d in attrs.shape)
    g = _spread(output_grad, x, out)
    zero, one = scalar(0, dtype), scalar(1, dtype)
    if attrs.kind == "sum":
        return [g]
    if attrs.kind in ("max", "min"):
        return [where(equal(x, _spread(call, x, out)), g, zero)]
    if attrs.kind == "logsumexp":
        return [multiply(g, exp(subtract(x, _spread(call, x, out))))]
    is_zero = bb.emit(equal(x, zero))
    nonzero = bb.emit(where(is_zero, one, x))
    p_nz = _spread(reduce_to(nonzero, attrs.shape, "prod"), x, out)
    zeros_n = bb.emit(_spread(reduce_to(where(is_zero, one, zero), attrs.shape, "sum"), x, out))
    others = where(equal(zeros_n, zero), divide(p_nz, nonzero),
                   where(logical_and(equal(zeros_n, one), is_zero), p_nz, zero))
    return [multiply(g, others)]


reduce_to = register_op(
    "reduce_to",
    inputs=("x",),
    infer=_reduce_to_infer,
    pattern=OpPattern.COMM_REDUCE,
    attrs=ReduceToAttrs,
    compute=_reduce_to_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=_reduce_to_grad,
    doc="Reduce to a same-rank shape of 1s (reduced axes) and x's dims (kept), symbolic dims "
        "allowed (reduced axes chosen at run time).",
)
