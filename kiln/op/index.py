"""Indexing operators: gather_elements, gather_nd, scatter_elements, scatter_nd (ONNX semantics).

Indices may be negative (counted from the end of their axis). Gathers are tensor expressions
(each output element reads one input element: INJECTIVE). An index outside ``[-n, n)`` makes
the kernel fail with a :class:`~kiln.ir.errors.RuntimeCheckError` naming the op, the axis and
the index, as onnxruntime does (``kiln.tir.check_index``: the check leaves the loops it does not
depend on, so a gather of rows checks each index once).

Scatters are loop programs, written as block TIR by their ``legalize`` hook: a parallel copy of
``data`` into the output, then a block that walks the updates in row-major order and combines
each into the output. Only lines of updates that can never collide (scatter_elements: every
axis but ``axis``; scatter_nd: the slice axes) are iteration variables a schedule may
parallelize; within a line the walk is sequential. That makes repeated indices well defined:
with ``reduction="none"`` the last write wins (as in the ONNX reference), and the reductions
(``add``, ``mul``, ``max``, ``min``) accumulate every update.

Gradients: gathers and scatters are each other's adjoints (see "gradient rules" below); the
scatters are differentiable for reductions ``none`` and ``add`` only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import te, tir
from ..graph import expr as gx
from ..graph.expr import Constant
from ..graph.struct_info import dims_differ
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from ..tir.function import ASSUME_ATTR
from .common import (
    INDEX_DTYPE,
    KernelDims,
    arg_ndim,
    arg_shape,
    as_dim,
    assume,
    const_int,
    declare_injective,
    dims_equal,
    equal_dims,
    fmt_shape,
    index_const,
    known_shape,
    normalize_axis,
    scalar,
    shape_of,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .elementwise import cast, equal, where
from .grad import check_grad_shape, float_grad, like_result, zeros
from .registry import MixedPrecision, OpPattern, get_op_def, register_op
from .scan import cumsum
from .shape import broadcast_to, concat, dims_product, reshape, unravel

__all__ = [
    "gather_elements", "gather_nd", "scatter_elements", "scatter_nd", "take", "take_backward",
]

REDUCTIONS = ("none", "add", "mul", "max", "min")


def _zero() -> PrimExpr:
    return tx.const(INDEX_DTYPE, 0)


def _checked(v: PrimExpr, n: PrimExpr, op: str, axis: int) -> PrimExpr:
    """An index into axis ``axis`` (of size ``n``) of ``op``'s data, resolved into ``[0, n)``
    and checked while the kernel runs (an index outside ``[-n, n)`` fails the call)."""
    return tx.check_index(v, n, f"{op} along axis {axis}")


def _fits(op: str, what: str, small: Sequence[Any] | None, big: Sequence[Any] | None,
          axes: Sequence[int]) -> list[tuple[PrimExpr, str]]:
    """Dims ``axes`` of ``small`` (indices, updates) walk the same dims of ``big`` (data), so
    they must not be longer: a StructInfoError for constant dims that are, the conditions (for
    ``assume``) for symbolic ones."""
    if small is None or big is None:
        return []
    conds = []
    for d in axes:
        a, b = small[d], big[d]
        if dims_equal(a, b):
            continue
        if const_int(a) is not None and const_int(b) is not None:
            if const_int(a) > const_int(b):
                raise StructInfoError(f"{op}: {what} {fmt_shape(small)} is longer than data "
                                      f"{fmt_shape(big)} in dimension {d}")
            continue
        conds.append((tx.le(a, b), f"{op}: {what} {fmt_shape(small)} must not be longer than "
                                   f"data {fmt_shape(big)} in dimension {d}"))
    return conds


def _integer_indices(op: str, sinfo: Any) -> None:
    if not as_dtype(sinfo.dtype).is_integer:
        raise StructInfoError(f"{op}: indices must be an integer tensor, got dtype {sinfo.dtype}")


# =============================================================================================
# gradient rules
# =============================================================================================
# Gathers and scatters are each other's adjoints: a gather's gradient is a scatter-add of the
# output gradient into zeros, a scatter's is a gather of it. A scatter with reduction "none"
# and a repeated index is handled exactly: only the update that won the position (the last in
# row-major order) gets its gradient.
def _is_float(expr: Any) -> bool:
    return as_dtype(expr.struct_info.dtype).is_float


def _unsupported_reduction(op: str, reduction: str) -> KilnError:
    return KilnError(f"{op}: no gradient for reduction {reduction!r} (only 'none' and 'add' "
                     "are differentiable here)")


def _gather_elements_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Scatter-add of the gradient into zeros shaped like data; indices get none."""
    data, indices = call.args
    if not _is_float(data):
        return [None, None]
    axis = (call.attrs or GatherElementsAttrs()).axis
    return [scatter_elements(zeros(data.struct_info, "gather_elements gradient"), indices,
                             output_grad, axis, "add"), None]


def _gather_nd_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Scatter-add of the gradient slices into zeros shaped like data; indices get none."""
    data, indices = call.args
    if not _is_float(data):
        return [None, None]
    b = (call.attrs or GatherNDAttrs()).batch_dims
    zero = zeros(data.struct_info, "gather_nd gradient")
    if b == 0:
        return [scatter_nd(zero, indices, output_grad, "add"), None]
    return [_batched_scatter_nd_add(data, zero, indices, output_grad, b), None]


def _batched_scatter_nd_add(like: Any, data: Any, indices: Any, updates: Any, b: int) -> Any:
    """``scatter_nd(data, indices, updates, "add")`` with ``b`` leading batch axes (the adjoint
    of ``gather_nd`` with ``batch_dims=b``): the batch axes are flattened into one, whose
    coordinate is prepended to every index tuple, so one ``scatter_nd`` without batch axes
    does it. ``like``: a normalized tensor shaped like ``data``. Needs static shapes (the
    batch coordinates are a constant)."""
    what = "gather_nd gradient (batch_dims > 0)"
    dshape, ishape = shape_of(like, what), shape_of(indices, what)
    static = [const_int(d) for d in (*dshape, *ishape)]
    if any(d is None for d in static):
        raise KilnError(f"{what}: needs static shapes, got data {fmt_shape(dshape)} and "
                        f"indices {fmt_shape(ishape)}")
    nb = 1
    for d in dshape[:b]:
        nb *= d
    k = ishape[-1]
    nq = 1
    for d in ishape[b:-1]:
        nq *= d
    batch = Constant(np.arange(nb, dtype=np.int64).reshape(nb, 1, 1))
    flat_ind = reshape(cast(indices, "int64"), (nb, nq, k))
    full_ind = concat([broadcast_to(batch, (nb, nq, 1)), flat_ind], axis=2)
    rest = tuple(dshape[b + k:])
    flat = scatter_nd(reshape(data, (nb, *dshape[b:])), full_ind,
                      reshape(updates, (nb, nq, *rest)), "add")
    return reshape(flat, tuple(dshape))


def _winners_only(bb: Any, d_updates: Any, data: Any, indices: Any, updates: Any,
                  scatter: Callable[..., Any], gather: Callable[..., Any]) -> Any:
    """``d_updates`` zeroed for the updates a later one overwrote (reduction "none" with a
    repeated index): every update's row-major number is scattered the same way, and an
    update keeps its gradient where its own number is the one that landed."""
    ushape = shape_of(updates, "scatter gradient")
    ones = broadcast_to(scalar(1, INDEX_DTYPE), ushape) if ushape else scalar(1, INDEX_DTYPE)
    ids = bb.emit(reshape(cumsum(ones, None, exclusive=True), ushape))
    unset = broadcast_to(scalar(-1, INDEX_DTYPE), shape_of(data, "scatter gradient"))
    landed = gather(scatter(unset, indices, ids), indices)
    return where(equal(landed, ids), d_updates, scalar(0, updates.struct_info.dtype))


def _scatter_elements_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """data: the gradient, zeroed where "none" overwrote it; updates: the gradient gathered at
    their targets; indices: none."""
    data, indices, updates = call.args
    if not _is_float(data):
        return [None, None, None]
    attrs = call.attrs or ScatterElementsAttrs()
    if attrs.reduction not in ("none", "add"):
        raise _unsupported_reduction("scatter_elements", attrs.reduction)
    d_updates = gather_elements(output_grad, indices, attrs.axis)
    if attrs.reduction == "add":
        return [output_grad, None, d_updates]
    cleared = scatter_elements(output_grad, indices,
                               zeros(updates.struct_info, "scatter_elements gradient"),
                               attrs.axis, "none")
    d_updates = _winners_only(bb, d_updates, data, indices, updates,
                              lambda d, i, u: scatter_elements(d, i, u, attrs.axis, "none"),
                              lambda d, i: gather_elements(d, i, attrs.axis))
    return [cleared, None, d_updates]


def _scatter_nd_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """As for scatter_elements, with gather_nd/scatter_nd."""
    data, indices, updates = call.args
    if not _is_float(data):
        return [None, None, None]
    reduction = (call.attrs or ScatterNDAttrs()).reduction
    if reduction not in ("none", "add"):
        raise _unsupported_reduction("scatter_nd", reduction)
    d_updates = gather_nd(output_grad, indices)
    if reduction == "add":
        return [output_grad, None, d_updates]
    cleared = scatter_nd(output_grad, indices,
                         zeros(updates.struct_info, "scatter_nd gradient"), "none")
    d_updates = _winners_only(bb, d_updates, data, indices, updates,
                              lambda d, i, u: scatter_nd(d, i, u, "none"), gather_nd)
    return [cleared, None, d_updates]


# =============================================================================================
# gather_elements
# =============================================================================================
@dataclass(frozen=True)
class GatherElementsAttrs:
    """``axis``: the axis the indices select along (negative counts from the end)."""

    axis: int = 0

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise KilnError(f"gather_elements: axis must be an int, got {self.axis!r}")


def _gather_elements_infer(call: Any) -> Any:
    op = "gather_elements"
    data, ind = tensor_arg(call, 0, op, "data"), tensor_arg(call, 1, op, "indices")
    _integer_indices(op, ind)
    attrs = call.attrs or GatherElementsAttrs()
    nd, ni = arg_ndim(data), arg_ndim(ind)
    if nd >= 0 and ni >= 0 and nd != ni:
        raise StructInfoError(f"{op}: data (rank {nd}) and indices (rank {ni}) must have the "
                              "same rank")
    if nd >= 0:
        axis = normalize_axis(attrs.axis, nd, op)
        _fits(op, "indices", arg_shape(ind), arg_shape(data), [d for d in range(nd) if d != axis])
    return tensor_sinfo(arg_shape(ind), data.dtype, ndim=ni)


def _gather_elements_compute(data: te.Tensor, indices: te.Tensor,
                             attrs: GatherElementsAttrs | None = None) -> te.Tensor:
    """``out[i] = data[i with i[axis] replaced by indices[i]]``."""
    attrs = attrs or GatherElementsAttrs()
    axis = normalize_axis(attrs.axis, data.ndim, "gather_elements")
    n = data.shape[axis]

    def body(*i: PrimExpr) -> PrimExpr:
        return data(*i[:axis], _checked(indices(*i), n, "gather_elements", axis), *i[axis + 1:])

    fits = _fits("gather_elements", "indices", indices.shape, data.shape,
                 [d for d in range(data.ndim) if d != axis])
    return te.compute(indices.shape, body, name="gather_elements", attrs=assume(fits))


gather_elements = register_op(
    "gather_elements",
    inputs=("data", "indices"),
    attrs=GatherElementsAttrs,
    infer=_gather_elements_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_gather_elements_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_gather_elements_grad,
    doc="Gather along ``axis`` element by element: the result has the shape of ``indices`` "
    "(ONNX GatherElements, numpy ``take_along_axis``).",
)


# =============================================================================================
# gather_nd
# =============================================================================================
@dataclass(frozen=True)
class GatherNDAttrs:
    """``batch_dims``: leading axes shared by data and indices (not indexed)."""

    batch_dims: int = 0

    def __post_init__(self):
        b = self.batch_dims
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise KilnError(f"gather_nd: batch_dims must be a non-negative int, got {b!r}")


def _nd_depth(op: str, ishape: Sequence[Any], data_ndim: int, batch_dims: int) -> int:
    """The static length ``k`` of the index tuples (last axis of indices), checked."""
    if not ishape:
        raise StructInfoError(f"{op}: indices must have rank >= 1")
    k = const_int(ishape[-1])
    if k is None:
        raise StructInfoError(f"{op}: the last axis of indices must be static, got "
                              f"{fmt_shape(ishape)}")
    if batch_dims + k > data_ndim or batch_dims >= len(ishape):
        raise StructInfoError(f"{op}: batch_dims {batch_dims} + index length {k} does not fit "
                              f"data of rank {data_ndim} and indices {fmt_shape(ishape)}")
    return k


def _gather_nd_infer(call: Any) -> Any:
    op = "gather_nd"
    data, ind = tensor_arg(call, 0, op, "data"), tensor_arg(call, 1, op, "indices")
    _integer_indices(op, ind)
    b = (call.attrs or GatherNDAttrs()).batch_dims
    shape, ishape = arg_shape(data), arg_shape(ind)
    if shape is None or ishape is None:
        return tensor_sinfo(None, data.dtype)
    k = _nd_depth(op, ishape, len(shape), b)
    for d in range(b):
        if not dims_equal(shape[d], ishape[d]):
            raise StructInfoError(f"{op}: batch dimension {d} differs: data {fmt_shape(shape)}, "
                                  f"indices {fmt_shape(ishape)}")
    return tensor_sinfo([*ishape[:-1], *shape[b + k:]], data.dtype)


def _gather_nd_compute(data: te.Tensor, indices: te.Tensor,
                       attrs: GatherNDAttrs | None = None) -> te.Tensor:
    """``out[batch, q, rest] = data[batch, indices[batch, q, :], rest]``."""
    b = (attrs or GatherNDAttrs()).batch_dims
    q = indices.ndim - 1
    k = _nd_depth("gather_nd", indices.shape, data.ndim, b)

    def body(*i: PrimExpr) -> PrimExpr:
        pos = [_checked(indices(*i[:q], tx.const(INDEX_DTYPE, j)), data.shape[b + j],
                        "gather_nd", b + j) for j in range(k)]
        return data(*i[:b], *pos, *i[q:])

    shape = [*indices.shape[:-1], *data.shape[b + k:]]
    return te.compute(shape, body, name="gather_nd")


gather_nd = register_op(
    "gather_nd",
    inputs=("data", "indices"),
    attrs=GatherNDAttrs,
    infer=_gather_nd_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_gather_nd_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_gather_nd_grad,
    doc="Gather slices of ``data`` addressed by the index tuples in the last axis of "
    "``indices`` (ONNX GatherND, with ``batch_dims``).",
)


# =============================================================================================
# scatters: shared loop-program builder
# =============================================================================================
def _check_reduction(op: str, reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise KilnError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def _combine(reduction: str) -> Callable[[PrimExpr, PrimExpr], PrimExpr]:
    if reduction == "add":
        return lambda old, new: old + new
    if reduction == "mul":
        return lambda old, new: old * new
    if reduction == "max":
        return tx.max
    if reduction == "min":
        return tx.min
    return lambda old, new: new


def _nest(extents: Sequence[PrimExpr], prefix: str,
          body_of: Callable[[list[PrimExpr]], tir.Stmt]) -> tir.Stmt:
    """Serial loops over ``extents`` around ``body_of(loop vars)``."""
    vs = [tir.Var(f"{prefix}{k}", INDEX_DTYPE) for k in range(len(extents))]
    stmt = body_of(vs)
    for v, e in reversed(list(zip(vs, extents))):
        stmt = tir.For(v, _zero(), e, tir.ForKind.SERIAL, stmt)
    return stmt


def _copy_stage(src: tir.Buffer, dst: tir.Buffer, name: str) -> tir.Stmt:
    """A spatial block ``dst[v] = src[v]`` (schedulable like any injective block)."""
    loop_vars = [tir.Var(f"i{d}", INDEX_DTYPE) for d in range(src.ndim)]
    iter_vars = [tx.IterVar(tx.Range(_zero(), e), tir.Var(f"v{d}", INDEX_DTYPE),
                            tx.IterType.DATA_PAR) for d, e in enumerate(src.shape)]
    idx = tuple(iv.var for iv in iter_vars)

    def point(buf: tir.Buffer) -> tir.BufferRegion:
        return tir.BufferRegion(buf, tuple(tx.Range(v, tx.const(INDEX_DTYPE, 1)) for v in idx))

    block = tir.Block(tuple(iter_vars), (point(src),), (point(dst),), name,
                      tir.BufferStore(dst, src.load(idx), idx))
    stmt: tir.Stmt = tir.BlockRealize(tuple(loop_vars), tir.true_predicate(), block)
    for lv, iv in reversed(list(zip(loop_vars, iter_vars))):
        stmt = tir.For(lv, iv.dom.min, iv.dom.extent, tir.ForKind.SERIAL, stmt)
    return stmt


def scatter_prim_func(op: str, data_shape: Sequence[Any], ind_shape: Sequence[Any],
                      upd_shape: Sequence[Any], dtype: Any, ind_dtype: Any, reduction: str,
                      target_of: Callable[..., tuple[list[Any], list[PrimExpr], list[PrimExpr]]],
                      lines: Sequence[int] = (), y_line_axes: Sequence[int] = (),
                      i_line_axes: Sequence[int] = ()) -> tir.PrimFunc:
    """The PrimFunc ``(D, I, U, Y)`` of a scatter: ``Y = D`` (block ``<op>_copy``), then the
    update block ``<op>``: for each update position ``u`` (row-major), ``target_of(u, I, Y)``
    gives ``(lets, position, conditions)`` -- the resolved (checked) indices bound once as
    ``(var, value)`` lets, the output position and the conditions under which the update
    applies (none for the scatters here) -- and the update is combined into ``Y`` there.

    ``lines``: axes of the updates along which updates never collide (their coordinate is also
    the output's, at ``y_line_axes``, and the indices', at ``i_line_axes``). They become the
    update block's spatial iteration variables, so a schedule may run lines in parallel; the
    other axes are serial loops inside the block, so repeated indices within a line are
    combined in order.
    """
    dbuf = tir.decl_buffer(tuple(data_shape), dtype, "D")
    ibuf = tir.decl_buffer(tuple(ind_shape), ind_dtype, "I")
    ubuf = tir.decl_buffer(tuple(upd_shape), dtype, "U")
    ybuf = tir.decl_buffer(tuple(data_shape), dtype, "Y")
    combine = _combine(reduction)
    iter_vars = [tx.IterVar(tx.Range(_zero(), ubuf.shape[d]), tir.Var(f"v{d}", INDEX_DTYPE),
                            tx.IterType.DATA_PAR) for d in lines]
    serial = [d for d in range(ubuf.ndim) if d not in lines]

    def update(ss: list[PrimExpr]) -> tir.Stmt:
        at = dict(zip(lines, (iv.var for iv in iter_vars))) | dict(zip(serial, ss))
        us = [at[d] for d in range(ubuf.ndim)]
        lets, dst, conds = target_of(us, ibuf, ybuf)
        stmt: tir.Stmt = tir.BufferStore(
            ybuf, combine(ybuf.load(tuple(dst)), ubuf.load(tuple(us))), tuple(dst))
        stmt = tir.IfThenElse(tx.all_of(conds), stmt) if conds else stmt
        for var, value in reversed(lets):
            stmt = tir.LetStmt(var, value, stmt)
        return stmt

    def region(buf: tir.Buffer, axes: Sequence[int]) -> tir.BufferRegion:
        """One line of ``buf``: ``axes[j]`` is at line variable ``j``, the rest in full."""
        var_at = {a: iv.var for a, iv in zip(axes, iter_vars)}
        return tir.BufferRegion(buf, tuple(
            tx.Range(var_at[d], tx.const(INDEX_DTYPE, 1)) if d in var_at else
            tx.Range(_zero(), buf.shape[d]) for d in range(buf.ndim)))

    scatter = tir.Block(tuple(iter_vars),
                        (region(ibuf, i_line_axes), region(ubuf, lines),
                         region(ybuf, y_line_axes)),
                        (region(ybuf, y_line_axes),), op,
                        _nest([ubuf.shape[d] for d in serial], "s", update))
    loop_vars = [tir.Var(f"i{d}", INDEX_DTYPE) for d in lines]
    stmt: tir.Stmt = tir.BlockRealize(tuple(loop_vars), tir.true_predicate(), scatter)
    for lv, iv in reversed(list(zip(loop_vars, iter_vars))):
        stmt = tir.For(lv, iv.dom.min, iv.dom.extent, tir.ForKind.SERIAL, stmt)
    root = tir.Block((), (), (), "root", tir.seq(_copy_stage(dbuf, ybuf, f"{op}_copy"), stmt))
    params = tuple(tir.Var(nm, "handle") for nm in ("D", "I", "U", "Y"))
    # update lines walk the output at the same coordinates: they must fit in it
    fits = [(tx.le(ubuf.shape[d], ybuf.shape[y]), f"{op}: updates dimension {d} must not be "
                                                  f"longer than data dimension {y}")
            for d, y in zip(lines, y_line_axes)
            if not (dims_equal(ubuf.shape[d], ybuf.shape[y])
                    or None not in (const_int(ubuf.shape[d]), const_int(ybuf.shape[y])))]
    return tir.PrimFunc(params, dict(zip(params, (dbuf, ibuf, ubuf, ybuf))),
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": op, "num_outputs": 1, **assume(fits)})


# (target_of, update line axes, their output axes, their indices axes): see scatter_prim_func
_ScatterPlan = tuple[Callable[..., Any], list[int], list[int], list[int]]


def _kernel_dims(shapes: Sequence[Sequence[Any]]) -> list[tuple[PrimExpr, ...]]:
    dims = KernelDims()
    return [dims(s) for s in shapes]


def _scatter_legalize(op: str, target_factory: Callable[..., Any]) -> Callable[..., Any]:
    def legalize(bb: Any, call: Any) -> Any:
        sinfos = [a.struct_info for a in call.args]
        for name, s in zip(("data", "indices", "updates"), sinfos):
            if arg_shape(s) is None:
                raise StructInfoError(f"LegalizeOps: {op} needs {name} of known shape")
        dshape, ishape, ushape = _kernel_dims([arg_shape(s) for s in sinfos])
        attrs = call.attrs or get_op_def(op).attrs()
        target_of, lines, y_axes, i_axes = target_factory(attrs, dshape, ishape)
        func = scatter_prim_func(op, dshape, ishape, ushape, sinfos[0].dtype, sinfos[1].dtype,
                                 attrs.reduction, target_of, lines, y_axes, i_axes)
        checks = _update_checks(op, dshape, ishape, ushape)
        if checks:  # run-time equalities of symbolic dims, before the kernel computes
            func = func.with_attr(ASSUME_ATTR, (*(func.attrs.get(ASSUME_ATTR) or ()), *checks))
        opdef = get_op_def(op)
        func = func.with_attr("op_name", op).with_attr("op_pattern", int(opdef.pattern))
        gvar = bb.add_func(func, op)
        return gx.call_tir(gvar, list(call.args), call.struct_info)

    return legalize


def _update_checks(op: str, dshape: Sequence[PrimExpr], ishape: Sequence[PrimExpr],
                   ushape: Sequence[PrimExpr]) -> list[tuple[PrimExpr, str]]:
    """The conditions (for ``assume``) that the updates have the shape the scatter reads them
    in, for the dims inference could not prove equal: ScatterND's ``indices.shape[:-1] +
    data.shape[k:]``, ScatterElements' indices shape (exported models compute such dims at run
    time, e.g. from a NonZero or a Reshape)."""
    if op == "scatter_nd":
        k = _nd_depth(op, ishape, len(dshape), 0)
        expected = [*ishape[:-1], *dshape[k:]]
        what = "indices.shape[:-1] + data.shape[k:]"
    else:
        expected, what = list(ishape), "the shape of indices"
    return equal_dims([(e, u, f"{op}: updates dimension {d} must equal {e} ({what})")
                       for d, (e, u) in enumerate(zip(expected, ushape))])


def _scatter_common_infer(op: str, call: Any, reduction: str) -> tuple[Any, Any, Any]:
    data = tensor_arg(call, 0, op, "data")
    ind = tensor_arg(call, 1, op, "indices")
    upd = tensor_arg(call, 2, op, "updates")
    _integer_indices(op, ind)
    if as_dtype(upd.dtype) != as_dtype(data.dtype):
        raise StructInfoError(f"{op}: updates ({upd.dtype}) must have the dtype of data "
                              f"({data.dtype})")
    if as_dtype(data.dtype).is_bool and reduction in ("add", "mul"):
        raise StructInfoError(f"{op}: reduction {reduction!r} is not defined for bool data")
    return data, ind, upd


# =============================================================================================
# scatter_elements
# =============================================================================================
@dataclass(frozen=True)
class ScatterElementsAttrs:
    """``axis``: the axis indices address; ``reduction``: none (last write wins), add, mul,
    max or min."""

    axis: int = 0
    reduction: str = "none"

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise KilnError(f"scatter_elements: axis must be an int, got {self.axis!r}")
        _check_reduction("scatter_elements", self.reduction)


def _scatter_elements_infer(call: Any) -> Any:
    op = "scatter_elements"
    attrs = call.attrs or ScatterElementsAttrs()
    data, ind, upd = _scatter_common_infer(op, call, attrs.reduction)
    nd = arg_ndim(data)
    for name, s in (("indices", ind), ("updates", upd)):
        if nd >= 0 and arg_ndim(s) >= 0 and arg_ndim(s) != nd:
            raise StructInfoError(f"{op}: {name} (rank {arg_ndim(s)}) must have the rank of "
                                  f"data ({nd})")
    ishape, ushape = arg_shape(ind), arg_shape(upd)
    # dims not provably equal (symbolic) are checked when the kernel runs (_update_checks)
    if ishape is not None and ushape is not None and any(
            dims_differ(a, b) for a, b in zip(ishape, ushape)):
        raise StructInfoError(f"{op}: indices {fmt_shape(ishape)} and updates "
                              f"{fmt_shape(ushape)} must have the same shape")
    if nd >= 0:
        axis = normalize_axis(attrs.axis, nd, op)
        _fits(op, "updates", ushape, arg_shape(data), [d for d in range(nd) if d != axis])
    return tensor_sinfo(arg_shape(data), data.dtype, ndim=nd)


def _elements_target(attrs: ScatterElementsAttrs, dshape: Sequence[PrimExpr],
                     ishape: Sequence[PrimExpr]) -> _ScatterPlan:
    axis = normalize_axis(attrs.axis, len(dshape), "scatter_elements")
    n = dshape[axis]

    def target_of(us: list[PrimExpr], ibuf: tir.Buffer, ybuf: tir.Buffer) -> Any:
        pos = tir.Var("pos", INDEX_DTYPE)
        dst = [pos if d == axis else u for d, u in enumerate(us)]
        return [(pos, _checked(ibuf.load(tuple(us)), n, "scatter_elements", axis))], dst, []

    lines = [d for d in range(len(dshape)) if d != axis]  # updates collide only along axis
    return target_of, lines, lines, lines


scatter_elements = register_op(
    "scatter_elements",
    inputs=("data", "indices", "updates"),
    attrs=ScatterElementsAttrs,
    infer=_scatter_elements_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_scatter_legalize("scatter_elements", _elements_target),
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_scatter_elements_grad,
    doc="A copy of ``data`` with ``updates[u]`` combined in at ``u`` with its ``axis`` "
    "coordinate replaced by ``indices[u]`` (ONNX ScatterElements).",
)


# =============================================================================================
# scatter_nd
# =============================================================================================
@dataclass(frozen=True)
class ScatterNDAttrs:
    """``reduction``: none (last write wins), add, mul, max or min."""

    reduction: str = "none"

    def __post_init__(self):
        _check_reduction("scatter_nd", self.reduction)


def _scatter_nd_infer(call: Any) -> Any:
    op = "scatter_nd"
    data, ind, upd = _scatter_common_infer(op, call, (call.attrs or ScatterNDAttrs()).reduction)
    shape, ishape, ushape = arg_shape(data), arg_shape(ind), arg_shape(upd)
    if shape is not None and ishape is not None and ushape is not None:
        k = _nd_depth(op, ishape, len(shape), 0)
        expected = [*ishape[:-1], *shape[k:]]
        # dims not provably equal (symbolic) are checked when the kernel runs (_update_checks)
        if len(expected) != len(ushape) or any(
                dims_differ(a, b) for a, b in zip(expected, ushape)):
            raise StructInfoError(f"{op}: updates must have shape {fmt_shape(expected)} "
                                  f"(indices.shape[:-1] + data.shape[k:]), got "
                                  f"{fmt_shape(ushape)}")
    return tensor_sinfo(shape, data.dtype, ndim=arg_ndim(data))


def _nd_target(attrs: ScatterNDAttrs, dshape: Sequence[PrimExpr],
               ishape: Sequence[PrimExpr]) -> _ScatterPlan:
    q = len(ishape) - 1
    k = _nd_depth("scatter_nd", ishape, len(dshape), 0)

    def target_of(us: list[PrimExpr], ibuf: tir.Buffer, ybuf: tir.Buffer) -> Any:
        pos = [tir.Var(f"pos{j}", INDEX_DTYPE) for j in range(k)]
        lets = [(p, _checked(ibuf.load((*us[:q], tx.const(INDEX_DTYPE, j))), dshape[j],
                             "scatter_nd", j)) for j, p in enumerate(pos)]
        return lets, [*pos, *us[q:]], []

    # the slice axes: an update's trailing coordinates are the output's trailing ones
    slices = list(range(q, q + len(dshape) - k))
    return target_of, slices, list(range(k, len(dshape))), []


scatter_nd = register_op(
    "scatter_nd",
    inputs=("data", "indices", "updates"),
    attrs=ScatterNDAttrs,
    infer=_scatter_nd_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_scatter_legalize("scatter_nd", _nd_target),
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_scatter_nd_grad,
    doc="A copy of ``data`` with each slice ``updates[q]`` combined in at the index tuple "
    "``indices[q]`` (ONNX ScatterND).",
)


# =============================================================================================
# take
# =============================================================================================
@dataclass(frozen=True)
class TakeAttrs:
    """``axis``: None indexes the flattened tensor. ``mode``: an index outside ``[-n, n)``
    fails the call while it runs ("raise", numpy's default: a RuntimeCheckError naming the
    index; negative ones count from the end), or out-of-range indices are clamped ("clip",
    numpy: negatives go to 0) or wrapped ("wrap"); with "fast", only negative indices are
    counted from the end (no bounds check: the caller guarantees the range)."""

    axis: int | None = None
    mode: str = "clip"

    def __post_init__(self):
        if self.mode not in ("raise", "clip", "wrap", "fast"):
            raise KilnError(f"take: mode must be 'raise', 'clip', 'wrap' or 'fast', got "
                            f"{self.mode!r}")
        ax = self.axis
        if ax is not None and (isinstance(ax, bool) or not isinstance(ax, int)):
            raise KilnError(f"take: axis must be an int or None, got {self.axis!r}")


def _take_infer(call: Any) -> Any:
    x, shape = known_shape(call, "take")
    ind, ishape = known_shape(call, "take", "indices", 1)
    idt = as_dtype(ind.dtype)
    if not idt.is_integer:
        raise StructInfoError(f"take: indices must be an integer tensor, got dtype {idt}")
    axis = call.attrs.axis if call.attrs else None
    ndim = arg_ndim(x)
    if axis is None:
        return tensor_sinfo(ishape, x.dtype, ndim=arg_ndim(ind))
    if ndim < 0:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    axis = normalize_axis(axis, ndim, "take")
    if shape is None or ishape is None:
        ind_ndim = arg_ndim(ind)
        return tensor_sinfo(None, x.dtype, ndim=-1 if ind_ndim < 0 else ndim - 1 + ind_ndim)
    return tensor_sinfo([*shape[:axis], *ishape, *shape[axis + 1:]], x.dtype)


def _take_compute(x: te.Tensor, indices: te.Tensor, attrs: TakeAttrs | None = None) -> te.Tensor:
    attrs = attrs or TakeAttrs()
    if attrs.axis is None:
        n = dims_product(x.shape)
        out_shape = list(indices.shape)
    else:
        axis = normalize_axis(attrs.axis, x.ndim, "take")
        n = x.shape[axis]
        out_shape = [*x.shape[:axis], *indices.shape, *x.shape[axis + 1:]]
    k = indices.ndim

    def fix(v: PrimExpr) -> PrimExpr:
        if attrs.mode == "raise":
            where = "the flattened input" if attrs.axis is None else f"axis {attrs.axis}"
            return tx.check_index(v, n, f"take along {where}")
        if attrs.mode == "clip":
            return tx.max(tx.min(v, n - 1), index_const(0))
        if attrs.mode == "wrap":
            return tx.floormod(v, tx.max(n, index_const(1)))
        return tx.select(v < 0, v + n, v)

    def body(*i: PrimExpr) -> PrimExpr:
        if attrs.axis is None:
            pos = fix(tx.cast(INDEX_DTYPE, indices(*i)))
            return x(*unravel(pos, x.shape)) if x.ndim else x()
        pos = fix(tx.cast(INDEX_DTYPE, indices(*i[axis:axis + k])))
        return x(*i[:axis], pos, *i[axis + k:])

    return te.compute(out_shape, body, name="take")


def _take_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Scatter-add of the gradient at the taken positions; indices get none."""
    attrs = call.attrs or TakeAttrs()
    x, indices = call.args
    if not as_dtype(x.struct_info.dtype).is_float:
        return [None, None]
    return [take_backward(output_grad, x, indices, attrs.axis, attrs.mode), None]


take = declare_injective(
    "take", ("x", "indices"), _take_infer, _take_compute, TakeAttrs,
    "Gather entries of ``x`` along ``axis`` at ``indices`` (numpy ``take``).",
    gradient=_take_grad,
)


# =============================================================================================
# take_backward (scatter-add, written as a loop program)
# =============================================================================================
def _take_backward_infer(call: Any) -> Any:
    op = "take_backward"
    g = float_grad(call, op)
    data = tensor_arg(call, 1, op, "data")
    ind = tensor_arg(call, 2, op, "indices")
    if not as_dtype(ind.dtype).is_integer:
        raise StructInfoError(f"{op}: indices must be an integer tensor, got dtype {ind.dtype}")
    attrs = call.attrs or TakeAttrs()
    shape, ishape = arg_shape(data), arg_shape(ind)
    if shape is not None and ishape is not None:
        if attrs.axis is None:
            expected = ishape
        else:
            axis = normalize_axis(attrs.axis, len(shape), op)
            expected = (*shape[:axis], *ishape, *shape[axis + 1:])
        check_grad_shape(op, g, expected)
    return like_result(call, op, g, 1, "data")


def _fix_index(v: PrimExpr, n: PrimExpr, mode: str) -> PrimExpr:
    """An index as ``take`` resolves it (raise / clip / wrap / fast), int64."""
    zero = tx.const(INDEX_DTYPE, 0)
    if mode == "raise":
        return tx.check_index(v, n, "take gradient")
    if mode == "clip":
        return tx.max(tx.min(v, n - 1), zero)
    if mode == "wrap":
        return tx.floormod(v, tx.max(n, tx.const(INDEX_DTYPE, 1)))
    return tx.select(v < zero, v + n, v)


def take_backward_prim_func(grad_shape: Sequence[Any], data_shape: Sequence[Any],
                            ind_shape: Sequence[Any], dtype: Any, ind_dtype: Any,
                            axis: int | None, mode: str) -> tir.PrimFunc:
    """The PrimFunc ``(G, I, Y)``: ``Y = 0; Y[..., fix(I[q]), ...] += G[..., q, ...]``.

    With an ``axis`` there is one block instance per output line (every axis but ``axis``:
    spatial, so lines run in parallel); with ``axis=None`` one instance scatters into the
    flattened output.
    """
    i64 = INDEX_DTYPE
    zero = tx.const(i64, 0)
    gbuf = tir.decl_buffer(tuple(grad_shape), dtype, "G")
    ibuf = tir.decl_buffer(tuple(ind_shape), ind_dtype, "I")
    ybuf = tir.decl_buffer(tuple(data_shape), dtype, "Y")
    ndim = len(data_shape)
    spatial = [] if axis is None else [d for d in range(ndim) if d != axis]
    loop_vars = [tir.Var(f"i{d}", i64) for d in spatial]
    iter_vars = [tx.IterVar(tx.Range(zero, data_shape[d]), tir.Var(f"v{d}", i64),
                            tx.IterType.DATA_PAR) for d in spatial]
    line = dict(zip(spatial, (iv.var for iv in iter_vars)))

    def nest(extents: Sequence[PrimExpr], prefix: str, body_of: Any) -> tir.Stmt:
        """Serial loops over ``extents`` around ``body_of(loop vars)``."""
        vs = [tir.Var(f"{prefix}{k}", i64) for k in range(len(extents))]
        stmt = body_of(vs)
        for v, e in reversed(list(zip(vs, extents))):
            stmt = tir.For(v, zero, e, tir.ForKind.SERIAL, stmt)
        return stmt

    if axis is None:
        n = simplify(_flat_size(data_shape))

        def clear(vs: list[PrimExpr]) -> tir.Stmt:
            return tir.BufferStore(ybuf, tx.const(ybuf.dtype, 0), tuple(vs))

        def scatter(qs: list[PrimExpr]) -> tir.Stmt:
            pos = _fix_index(tx.cast(i64, ibuf.load(tuple(qs))), n, mode)
            dst = tuple(unravel(pos, data_shape)) if ndim else ()
            return tir.BufferStore(ybuf, ybuf.load(dst) + gbuf.load(tuple(qs)), dst)

        reads = (gbuf.full_region(), ibuf.full_region(), ybuf.full_region())
        writes = (ybuf.full_region(),)
        body = tir.seq(nest(data_shape, "c", clear), nest(ind_shape, "q", scatter))
    else:
        n = data_shape[axis]

        def at(p: PrimExpr) -> tuple[PrimExpr, ...]:
            return tuple(p if d == axis else line[d] for d in range(ndim))

        def clear(vs: list[PrimExpr]) -> tir.Stmt:
            return tir.BufferStore(ybuf, tx.const(ybuf.dtype, 0), at(vs[0]))

        def scatter(qs: list[PrimExpr]) -> tir.Stmt:
            pos = _fix_index(tx.cast(i64, ibuf.load(tuple(qs))), n, mode)
            src = (*[line[d] for d in range(axis)], *qs,
                   *[line[d] for d in range(axis + 1, ndim)])
            return tir.BufferStore(ybuf, ybuf.load(at(pos)) + gbuf.load(src), at(pos))

        def region(buf: tir.Buffer, full_axes: Sequence[int]) -> tir.BufferRegion:
            ranges, it = [], iter(iv.var for iv in iter_vars)
            for d in range(buf.ndim):
                if d in full_axes:
                    ranges.append(tx.Range(zero, buf.shape[d]))
                else:
                    ranges.append(tx.Range(next(it), tx.const(i64, 1)))
            return tir.BufferRegion(buf, tuple(ranges))

        k = len(ind_shape)
        reads = (region(gbuf, range(axis, axis + k)), ibuf.full_region(), region(ybuf, [axis]))
        writes = (region(ybuf, [axis]),)
        body = tir.seq(nest([n], "c", clear), nest(ind_shape, "q", scatter))
    block = tir.Block(tuple(iter_vars), reads, writes, "take_backward", body)
    stmt: tir.Stmt = tir.BlockRealize(tuple(loop_vars), tir.true_predicate(), block)
    for lv, iv in reversed(list(zip(loop_vars, iter_vars))):
        stmt = tir.For(lv, iv.dom.min, iv.dom.extent, tir.ForKind.SERIAL, stmt)
    root = tir.Block((), (), (), "root", stmt)
    params = tuple(tir.Var(nm, "handle") for nm in ("G", "I", "Y"))
    return tir.PrimFunc(params, dict(zip(params, (gbuf, ibuf, ybuf))),
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": "take_backward", "num_outputs": 1})


def _flat_size(dims: Sequence[Any]) -> PrimExpr:
    total: PrimExpr = tx.const(INDEX_DTYPE, 1)
    for d in dims:
        total = total * as_dim(d)
    return total


def _take_backward_legalize(bb: Any, call: Any) -> Any:
    g, data, ind = (a.struct_info for a in call.args)
    for name, s in (("grad", g), ("data", data), ("indices", ind)):
        if arg_shape(s) is None:
            raise StructInfoError(f"LegalizeOps: take_backward needs {name} of known shape")
    attrs = call.attrs or TakeAttrs()
    dims = KernelDims()
    data_shape = dims(arg_shape(data))
    axis = None if attrs.axis is None else normalize_axis(attrs.axis, len(data_shape),
                                                          "take_backward")
    func = take_backward_prim_func(dims(arg_shape(g)), data_shape, dims(arg_shape(ind)),
                                   g.dtype, ind.dtype, axis, attrs.mode)
    opdef = get_op_def("take_backward")
    func = func.with_attr("op_name", opdef.name).with_attr("op_pattern", int(opdef.pattern))
    gvar = bb.add_func(func, "take_backward")
    return gx.call_tir(gvar, [call.args[0], call.args[2]], call.struct_info)


def _take_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    attrs = call.attrs or TakeAttrs()
    return [take(output_grad, call.args[2], axis=attrs.axis, mode=attrs.mode), None, None]


take_backward = register_op(
    "take_backward",
    inputs=("grad", "data", "indices"),
    attrs=TakeAttrs,
    infer=_take_backward_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_take_backward_legalize,
    mixed_precision=MixedPrecision.NEVER,
    gradient=_take_backward_grad,
    doc="The adjoint of ``take(data, indices, axis, mode)``: a tensor shaped like ``data`` "
    "(whose values are not used) with every entry of ``grad`` added at the position its index "
    "selects (repeated indices accumulate).",
)
