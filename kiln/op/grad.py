"""Operators that gradients need, and the helpers gradient rules are written with.

Gradient rules (the ``gradient=`` of each declaration, signature in ``kiln.op.registry``) are
graph code made of ordinary ops. Most adjoints are expressible with the forward ops themselves
(``relu``'s is a ``where``, ``matmul``'s two matmuls); the operators here are the ones that are
not:

- ``collapse_sum_like(data, collapse_target)`` / ``collapse_sum_to(data, shape)``: sum ``data``
  down to a shape it was broadcast from (numpy rules read backwards: leading axes, and axes
  where the target has length 1, are summed). Every broadcasting op's gradient uses it.
- ``take_backward(grad, data, indices)``: the scatter-add adjoint of ``take`` (``data`` only
  gives the result's shape). It is a loop program (``legalize``): for every line of the output
  it zeroes the line and then adds each gradient entry at its (clamped/wrapped) index, O(size
  of grad) work instead of the O(size of data x number of indices) of a gather formulation.
- ``strided_slice_backward``, ``pad_backward``: the adjoints of slicing (zeros outside the
  slice) and of edge/reflect padding (the padded border folds back onto the edge).
- ``nn.conv2d_backward_data`` / ``nn.conv2d_backward_weight``: the two adjoints of a grouped,
  strided, dilated, padded NCHW/OIHW convolution, as direct reductions.
- ``nn.max_pool2d_backward``, ``nn.avg_pool2d_backward``, ``nn.adaptive_max_pool2d_backward``,
  ``nn.adaptive_avg_pool2d_backward``: pooling adjoints (any pooling layout). Max pooling sends
  the gradient of a window to every input equal to the window's maximum (a tie gives each tied
  input the full gradient; PyTorch gives it to one of them).

The operators that are linear in their gradient input declare gradients themselves (the
adjoint of an adjoint is the forward op), so second derivatives through them work; the max
pooling adjoints are marked non-differentiable.

Helpers for rule authors: :func:`scalar` (a 0-d constant), :func:`zeros`, :func:`unbroadcast`
and :func:`fit_to` (sum an adjoint down to a broadcast input's shape), :func:`expand_reduced`
(broadcast a reduction's gradient back), :func:`shape_of`/:func:`shape_attr` (shapes as
attributes), :func:`cast_to`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import te, tir
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .elementwise import (
    INDEX_DTYPE,
    arg_ndim,
    arg_shape,
    as_dim,
    const_int,
    dims_equal,
    fmt_shape,
    normalize_axis,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op
from .schedule_helpers import PARALLEL_MIN_WORK, schedule_injective, schedule_reduction
from .shape import shape_attr_value

__all__ = [
    "adaptive_avg_pool2d_backward", "adaptive_max_pool2d_backward", "avg_pool2d_backward",
    "collapse_sum_like", "collapse_sum_to", "conv2d_backward_data", "conv2d_backward_weight",
    "max_pool2d_backward", "pad_backward", "strided_slice_backward", "take_backward",
]


# =============================================================================================
# helpers for gradient rules (graph level)
# =============================================================================================
def shape_attr(dims: Sequence[Any]) -> tuple[Any, ...]:
    """Dimensions as a shape attribute: python ints for constants, symbolic ones as they are
    (so attributes print and compare like hand-written ones)."""
    return tuple(const_int(d) if const_int(d) is not None else d for d in dims)


def shape_of(expr: Any, what: str = "gradient") -> tuple[Any, ...]:
    """The shape of a normalized tensor expression as a shape attribute (see
    :func:`shape_attr`); KilnError if unknown."""
    shape = arg_shape(expr.struct_info)
    if shape is None:
        raise KilnError(f"{what}: needs a tensor of known shape, got {expr.struct_info}")
    return shape_attr(shape)


def scalar(value: float, dtype: Any) -> Any:
    """A 0-d constant of ``dtype`` (broadcasts against any tensor of that dtype)."""
    from ..graph.expr import Constant

    return Constant(np.array(value, dtype=as_dtype(dtype).to_numpy()))


def zeros(sinfo: Any, what: str = "gradient") -> Any:
    """An explicit zero tensor of a TensorStructInfo: a broadcast 0-d constant, so no large
    constant is stored and symbolic shapes work."""
    from .shape import broadcast_to

    shape = arg_shape(sinfo)
    if shape is None:
        raise KilnError(f"{what}: cannot make zeros of unknown shape ({sinfo})")
    zero = scalar(0, sinfo.dtype)
    return zero if not shape else broadcast_to(zero, shape_attr(shape))


def cast_to(expr: Any, dtype: Any, current: Any) -> Any:
    """``expr`` (of dtype ``current``) cast to ``dtype`` when they differ."""
    from .elementwise import cast

    return expr if as_dtype(current) == as_dtype(dtype) else cast(expr, str(as_dtype(dtype)))


def unbroadcast(grad: Any, out_sinfo: Any, x: Any) -> Any:
    """The adjoint of a broadcast input ``x``: ``grad`` (shaped like ``out_sinfo``) summed down
    to ``x``'s shape, or ``grad`` itself when no broadcasting happened."""
    from ..graph.struct_info import shapes_equal

    if shapes_equal(arg_shape(out_sinfo), arg_shape(x.struct_info)):
        return grad
    return collapse_sum_like(grad, x)


def fit_to(bb: Any, expr: Any, x: Any) -> Any:
    """``expr`` made an adjoint of ``x``: summed down to x's shape if it is a broadcast of it
    (its StructInfo is inferred with ``bb``, nothing is emitted) and cast to x's dtype."""
    from ..graph.struct_info import shapes_equal

    sinfo = bb.normalize(expr).struct_info
    if not shapes_equal(arg_shape(sinfo), arg_shape(x.struct_info)):
        expr = collapse_sum_like(expr, x)
    return cast_to(expr, x.struct_info.dtype, sinfo.dtype)


def expand_reduced(grad: Any, x_sinfo: Any, axes: Sequence[int], keepdims: bool) -> Any:
    """A reduction's result (or its gradient) broadcast back over the reduced ``axes`` of a
    tensor ``x_sinfo`` (``keepdims``: whether the reduction kept them as length 1)."""
    from .shape import broadcast_to, expand_dims

    shape = arg_shape(x_sinfo)
    if shape is None:
        raise KilnError(f"gradient of a reduction needs a known input shape, got {x_sinfo}")
    if axes and not keepdims and tuple(axes) != tuple(range(len(axes))):
        grad = expand_dims(grad, tuple(axes))  # leading axes need none: broadcasting adds them
    if not axes:
        return grad
    return broadcast_to(grad, shape_attr(shape))


# =============================================================================================
# collapse_sum_like / collapse_sum_to
# =============================================================================================
def _collapse_axes(op: str, data: Sequence[Any], target: Sequence[Any]) -> tuple[int, ...]:
    """Axes of ``data`` summed to reach ``target`` (numpy broadcasting run backwards)."""
    if len(target) > len(data):
        raise StructInfoError(
            f"{op}: cannot collapse shape {fmt_shape(data)} to the higher-rank "
            f"{fmt_shape(target)}"
        )
    lead = len(data) - len(target)
    axes = list(range(lead))
    for t, td in enumerate(target):
        d = lead + t
        if dims_equal(data[d], td):
            continue
        if const_int(td) == 1:
            axes.append(d)
            continue
        raise StructInfoError(
            f"{op}: cannot collapse {fmt_shape(data)} to {fmt_shape(target)}: dimension {d} "
            f"({data[d]}) is not a broadcast of {td}"
        )
    return tuple(axes)


def _accumulator(dtype: DataType) -> DataType:
    return DataType("float32") if dtype.is_float and dtype.bits < 32 else dtype


def _collapse_compute(x: te.Tensor, target: Sequence[Any], name: str) -> te.Tensor:
    target = tuple(as_dim(d) for d in target)
    axes = _collapse_axes(name, x.shape, target)
    lead = x.ndim - len(target)
    if not axes:
        return te.compute(target, lambda *j: x(*j), name=name)
    acc = _accumulator(x.dtype)
    red = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}

    def body(*j: PrimExpr) -> PrimExpr:
        idx = [red[d].var if d in red else j[d - lead] for d in range(x.ndim)]
        return te.sum(tx.cast(acc, x(*idx)), axis=list(red.values()))

    out = te.compute(target, body, name=name)
    if acc != x.dtype:
        out = te.compute(target, lambda *j: tx.cast(x.dtype, out(*j)), name=name + "_cast")
    return out


def _numeric(op: str, arg: str, sinfo: Any) -> None:
    dt = as_dtype(sinfo.dtype)
    if not (dt.is_float or dt.is_integer):
        raise StructInfoError(f"{op}: {arg} must be a numeric tensor, got dtype {dt}")


def _collapse_like_infer(call: Any) -> Any:
    op = "collapse_sum_like"
    data = tensor_arg(call, 0, op, "data")
    target = tensor_arg(call, 1, op, "collapse_target")
    _numeric(op, "data", data)
    dshape, tshape = arg_shape(data), arg_shape(target)
    if tshape is None:
        return tensor_sinfo(None, data.dtype, ndim=arg_ndim(target))
    if dshape is not None:
        _collapse_axes(op, dshape, tshape)
    return tensor_sinfo(tshape, data.dtype)


def _collapse_like_compute(data: te.Tensor, target: te.Tensor, attrs: Any = None) -> te.Tensor:
    """Sum ``data`` down to the shape of ``collapse_target``."""
    return _collapse_compute(data, target.shape, "collapse_sum_like")


def _collapse_like_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .shape import broadcast_to

    data = call.args[0]
    return [broadcast_to(output_grad, shape_of(data, "collapse_sum_like gradient")), None]


collapse_sum_like = register_op(
    "collapse_sum_like",
    inputs=("data", "collapse_target"),
    infer=_collapse_like_infer,
    pattern=OpPattern.COMM_REDUCE,
    compute=_collapse_like_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_collapse_like_grad,
    doc="Sum ``data`` down to the shape of ``collapse_target`` (which ``data``'s shape must be "
    "a numpy broadcast of); the values of ``collapse_target`` are not used.",
)


@dataclass(frozen=True)
class CollapseSumToAttrs:
    """``shape``: the target shape (ints or PrimExprs); ``data`` must broadcast from it."""

    shape: tuple[Any, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "collapse_sum_to"))


def _collapse_to_infer(call: Any) -> Any:
    op = "collapse_sum_to"
    data = tensor_arg(call, 0, op, "data")
    _numeric(op, "data", data)
    target = tuple(as_dim(d) for d in call.attrs.shape)
    dshape = arg_shape(data)
    if dshape is not None:
        _collapse_axes(op, dshape, target)
    return tensor_sinfo(target, data.dtype)


def _collapse_to_compute(data: te.Tensor, attrs: CollapseSumToAttrs) -> te.Tensor:
    """Sum ``data`` down to ``shape``."""
    return _collapse_compute(data, attrs.shape, "collapse_sum_to")


def _collapse_to_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .shape import broadcast_to

    return [broadcast_to(output_grad, shape_of(call.args[0], "collapse_sum_to gradient"))]


collapse_sum_to = register_op(
    "collapse_sum_to",
    inputs=("data",),
    attrs=CollapseSumToAttrs,
    infer=_collapse_to_infer,
    pattern=OpPattern.COMM_REDUCE,
    compute=_collapse_to_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_collapse_to_grad,
    doc="Sum ``data`` down to ``shape`` (the inverse of a numpy broadcast to data's shape).",
)


# =============================================================================================
# shared checks of the backward ops: grad and a "like" input that gives the result's shape
# =============================================================================================
def _float_grad(call: Any, op: str, index: int = 0) -> Any:
    g = tensor_arg(call, index, op, "grad")
    if not as_dtype(g.dtype).is_float:
        raise StructInfoError(f"{op}: grad must be a float tensor, got dtype {g.dtype}")
    return g


def _like_result(call: Any, op: str, g: Any, like_index: int, like_name: str) -> Any:
    like = tensor_arg(call, like_index, op, like_name)
    return tensor_sinfo(arg_shape(like), g.dtype, ndim=arg_ndim(like))


def _check_grad_shape(op: str, g: Any, expected: Sequence[Any] | None) -> None:
    shape = arg_shape(g)
    if shape is None or expected is None:
        return
    if len(shape) != len(expected) or any(
        const_int(a) is not None and const_int(b) is not None and const_int(a) != const_int(b)
        for a, b in zip(shape, expected)
    ):
        raise StructInfoError(
            f"{op}: grad has shape {fmt_shape(shape)}, expected {fmt_shape(expected)} (the "
            "shape of the forward op's result)"
        )


def _clamp(v: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """``v`` clamped into ``[0, hi)`` (loads stay in bounds even when a select discards them)."""
    return tx.max(tx.min(v, simplify(hi - 1)), tx.const(INDEX_DTYPE, 0))


def _all(conds: list[PrimExpr]) -> PrimExpr | None:
    return tx.all_of(conds) if conds else None


def _masked(cond: PrimExpr | None, value: PrimExpr) -> PrimExpr:
    return value if cond is None else tx.select(cond, value, tx.const(value.dtype, 0))


# =============================================================================================
# take_backward (scatter-add, written as a loop program)
# =============================================================================================
def _take_backward_infer(call: Any) -> Any:
    from .shape import TakeAttrs

    op = "take_backward"
    g = _float_grad(call, op)
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
        _check_grad_shape(op, g, expected)
    return _like_result(call, op, g, 1, "data")


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


class _KernelDims:
    """Symbolic sizes as plain variables (a kernel binds its sizes from argument shapes, which
    needs each dimension to be a constant or a variable); shared by all buffers of a kernel."""

    def __init__(self) -> None:
        self.known: dict[str, tir.Var] = {}

    def __call__(self, shape: Sequence[Any]) -> tuple[PrimExpr, ...]:
        out = []
        for d in shape:
            d = as_dim(d)
            if const_int(d) is not None or isinstance(d, tir.Var):
                out.append(d)
            else:
                key = str(d)
                self.known.setdefault(key, tir.Var(f"d{len(self.known)}", INDEX_DTYPE))
                out.append(self.known[key])
        return tuple(out)


def take_backward_prim_func(grad_shape: Sequence[Any], data_shape: Sequence[Any],
                            ind_shape: Sequence[Any], dtype: Any, ind_dtype: Any,
                            axis: int | None, mode: str) -> tir.PrimFunc:
    """The PrimFunc ``(G, I, Y)``: ``Y = 0; Y[..., fix(I[q]), ...] += G[..., q, ...]``.

    With an ``axis`` there is one block instance per output line (every axis but ``axis``:
    spatial, so lines run in parallel); with ``axis=None`` one instance scatters into the
    flattened output.
    """
    from .shape import unravel

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
        n = simplify(_prod(data_shape))

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


def _prod(dims: Sequence[Any]) -> PrimExpr:
    total: PrimExpr = tx.const(INDEX_DTYPE, 1)
    for d in dims:
        total = total * as_dim(d)
    return total


def _take_backward_legalize(bb: Any, call: Any) -> Any:
    from ..graph import expr as gx
    from .registry import get_op_def
    from .shape import TakeAttrs

    g, data, ind = (a.struct_info for a in call.args)
    for name, s in (("grad", g), ("data", data), ("indices", ind)):
        if arg_shape(s) is None:
            raise StructInfoError(f"LegalizeOps: take_backward needs {name} of known shape")
    attrs = call.attrs or TakeAttrs()
    dims = _KernelDims()
    data_shape = dims(arg_shape(data))
    axis = None if attrs.axis is None else normalize_axis(attrs.axis, len(data_shape),
                                                          "take_backward")
    func = take_backward_prim_func(dims(arg_shape(g)), data_shape, dims(arg_shape(ind)),
                                   g.dtype, ind.dtype, axis, attrs.mode)
    opdef = get_op_def("take_backward")
    func = func.with_attr("op_name", opdef.name).with_attr("op_pattern", int(opdef.pattern))
    gvar = bb.add_func(func, "take_backward")
    return gx.call_tir(gvar, [call.args[0], call.args[2]], call.struct_info)


def _schedule_take_backward(sch: Any, target: Any) -> None:
    """Lines of the output are independent: fuse their loops into one parallel loop when
    there is enough work (the scatter inside a line stays serial: indices may repeat)."""
    block = sch.get_block("take_backward")
    loops = sch.get_loops(block)
    if not loops or getattr(target, "num_threads", 0) == 1:
        return
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    lines = const_int(sch.get(fused).extent)
    grad = sch.func.buffer_map[sch.func.params[0]]
    work = 1
    for d in grad.shape:
        work = None if work is None or const_int(d) is None else work * const_int(d)
    if (lines is None or lines > 1) and (work is None or work >= PARALLEL_MIN_WORK):
        sch.parallel(fused)


def _take_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .shape import TakeAttrs, take

    attrs = call.attrs or TakeAttrs()
    return [take(output_grad, call.args[2], axis=attrs.axis, mode=attrs.mode), None, None]


def _take_attrs() -> type:
    from .shape import TakeAttrs

    return TakeAttrs


take_backward = register_op(
    "take_backward",
    inputs=("grad", "data", "indices"),
    attrs=_take_attrs(),
    infer=_take_backward_infer,
    pattern=OpPattern.OPAQUE,
    legalize=_take_backward_legalize,
    schedules={"c": _schedule_take_backward},
    mixed_precision=MixedPrecision.NEVER,
    gradient=_take_backward_grad,
    doc="The adjoint of ``take(data, indices, axis, mode)``: a tensor shaped like ``data`` "
    "(whose values are not used) with every entry of ``grad`` added at the position its index "
    "selects (repeated indices accumulate).",
)


# =============================================================================================
# strided_slice_backward
# =============================================================================================
def _slice_backward_infer(call: Any) -> Any:
    from .shape import _slice_plan

    op = "strided_slice_backward"
    g = _float_grad(call, op)
    data = tensor_arg(call, 1, op, "data")
    shape = arg_shape(data)
    if shape is not None:
        _check_grad_shape(op, g, [length for _, length, _ in _slice_plan(shape, call.attrs)])
    return _like_result(call, op, g, 1, "data")


def _slice_backward_compute(grad: te.Tensor, data: te.Tensor, attrs: Any) -> te.Tensor:
    """``grad`` placed at the sliced positions of a zero tensor shaped like ``data``."""
    from .shape import _slice_plan

    plan = _slice_plan(data.shape, attrs)
    if any(const_int(length) == 0 for _, length, _ in plan):
        return te.compute(data.shape, lambda *i: tx.const(grad.dtype, 0),
                          name="strided_slice_backward")

    def body(*i: PrimExpr) -> PrimExpr:
        conds, src = [], []
        for d, (start, length, step) in enumerate(plan):
            if const_int(start) == 0 and step == 1 and dims_equal(length, data.shape[d]):
                src.append(i[d])
                continue
            off = simplify(i[d] - start)
            q = tx.floordiv(off, step) if step != 1 else off
            conds += [q >= 0, q < length]
            if step not in (1, -1):
                conds.append(tx.eq(tx.floormod(off, step), 0))
            src.append(_clamp(q, length))
        return _masked(_all(conds), grad(*src))

    return te.compute(data.shape, body, name="strided_slice_backward")


def _slice_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .registry import get_op_def

    a = call.attrs
    return [get_op_def("strided_slice")(output_grad, **_fields(a)), None]


def _slice_attrs() -> type:
    from .shape import StridedSliceAttrs

    return StridedSliceAttrs


strided_slice_backward = register_op(
    "strided_slice_backward",
    inputs=("grad", "data"),
    attrs=_slice_attrs(),
    infer=_slice_backward_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_slice_backward_compute,
    schedules={"c": schedule_injective},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_slice_backward_grad,
    doc="The adjoint of ``strided_slice(data, ...)``: ``grad`` at the sliced positions of a "
    "zero tensor shaped like ``data``.",
)


# =============================================================================================
# pad_backward
# =============================================================================================
def _pad_backward_infer(call: Any) -> Any:
    op = "pad_backward"
    g = _float_grad(call, op)
    data = tensor_arg(call, 1, op, "data")
    shape = arg_shape(data)
    pw = call.attrs.pad_width
    if arg_ndim(data) >= 0 and len(pw) != arg_ndim(data):
        raise StructInfoError(
            f"{op}: pad_width has {len(pw)} entries for a tensor of rank {arg_ndim(data)}"
        )
    if shape is not None:
        _check_grad_shape(op, g, [simplify(d + (b + a)) for d, (b, a) in zip(shape, pw)])
    return _like_result(call, op, g, 1, "data")


def _pad_source(mode: str, p: PrimExpr, before: int, dim: PrimExpr) -> PrimExpr:
    """The input position that padded position ``p`` copies (edge or reflect mode)."""
    m = p - before
    if mode == "edge":
        return tx.max(tx.min(m, dim - 1), tx.const(INDEX_DTYPE, 0))
    period = tx.max(2 * (dim - 1), tx.const(INDEX_DTYPE, 1))
    r = tx.floormod(m, period)
    return tx.select(r < dim, r, period - r)


def _pad_backward_compute(grad: te.Tensor, data: te.Tensor, attrs: Any) -> te.Tensor:
    """Each input position sums the padded positions that copy it: its own (shifted by the
    leading pad) and, for edge/reflect modes, the border positions that map onto it."""
    pw = attrs.pad_width
    folded = [k for k, (b, a) in enumerate(pw) if attrs.mode != "constant" and (b or a)]
    red = {k: te.reduce_axis((0, 1 + pw[k][0] + pw[k][1]), name=f"r{k}") for k in folded}

    def body(*i: PrimExpr) -> PrimExpr:
        conds, src = [], []
        for k in range(data.ndim):
            b, a = pw[k]
            if k not in red:
                src.append(i[k] + b if b else i[k])
                continue
            r = red[k].var
            dim = data.shape[k]
            # r == 0: the position itself; 1..b: leading pads; b+1..b+a: trailing pads
            pos = tx.select(tx.eq(r, 0), i[k] + b,
                            tx.select(r <= b, r - 1, simplify(dim + b) + (r - 1 - b)))
            conds.append(tx.logical_or(tx.eq(r, 0),
                                       tx.eq(_pad_source(attrs.mode, pos, b, dim), i[k])))
            src.append(pos)
        value = _masked(_all(conds), grad(*src))
        return te.sum(value, axis=list(red.values())) if red else value

    return te.compute(data.shape, body, name="pad_backward")


def _pad_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .shape import pad

    a = call.attrs
    return [pad(output_grad, a.pad_width, 0.0, a.mode), None]


def _pad_attrs() -> type:
    from .shape import PadAttrs

    return PadAttrs


pad_backward = register_op(
    "pad_backward",
    inputs=("grad", "data"),
    attrs=_pad_attrs(),
    infer=_pad_backward_infer,
    pattern=OpPattern.COMM_REDUCE,
    compute=_pad_backward_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_pad_backward_grad,
    doc="The adjoint of ``pad(data, pad_width, pad_value, mode)``: the gradient of the padded "
    "tensor folded back onto ``data``'s shape (edge/reflect borders add onto the positions "
    "they copy).",
)


# =============================================================================================
# conv2d adjoints (NCHW data, OIHW weight)
# =============================================================================================
@dataclass(frozen=True)
class Conv2DGradAttrs:
    """The forward convolution's ``strides``, ``padding`` (top, left, bottom, right),
    ``dilation`` and ``groups`` (NCHW data, OIHW weight)."""

    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    groups: int = 1

    def __post_init__(self):
        from .nn import _padding, _pair

        op = "nn.conv2d_backward"
        object.__setattr__(self, "strides", _pair(self.strides, op, "strides"))
        object.__setattr__(self, "padding", _padding(self.padding, op))
        object.__setattr__(self, "dilation", _pair(self.dilation, op, "dilation"))
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise KilnError(f"{op}: groups must be a positive int, got {self.groups!r}")


def _conv_args(call: Any, op: str, names: Sequence[str]) -> list[Any]:
    infos = [tensor_arg(call, i, op, n) for i, n in enumerate(names)]
    for n, s in zip(names, infos):
        if arg_ndim(s) not in (-1, 4):
            raise StructInfoError(f"{op}: {n} must be 4-d, got {arg_ndim(s)}-d")
    dt = as_dtype(infos[0].dtype)
    if not dt.is_float:
        raise StructInfoError(f"{op}: grad must be a float tensor, got dtype {dt}")
    if as_dtype(infos[1].dtype) != dt:
        raise StructInfoError(f"{op}: {names[1]} has dtype {infos[1].dtype} but grad has {dt}")
    return infos


def _conv_out_shape(attrs: Conv2DGradAttrs, dshape: Sequence[Any], wshape: Sequence[Any]
                    ) -> tuple:
    from .nn import _out_dim

    n, _, h, w = dshape
    o, _, kh, kw = wshape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return (n, o, _out_dim(h, kh, sh, dh, pt, pb), _out_dim(w, kw, sw, dw, pl, pr))


def _conv_bwd_data_infer(call: Any) -> Any:
    op = "nn.conv2d_backward_data"
    g, w, data = _conv_args(call, op, ("grad", "weight", "data"))
    if arg_shape(data) is not None and arg_shape(w) is not None:
        _check_grad_shape(op, g, _conv_out_shape(call.attrs, arg_shape(data), arg_shape(w)))
    return tensor_sinfo(arg_shape(data), g.dtype, ndim=4)


def _conv_bwd_weight_infer(call: Any) -> Any:
    op = "nn.conv2d_backward_weight"
    g, data, w = _conv_args(call, op, ("grad", "data", "weight"))
    if arg_shape(data) is not None and arg_shape(w) is not None:
        _check_grad_shape(op, g, _conv_out_shape(call.attrs, arg_shape(data), arg_shape(w)))
    return tensor_sinfo(arg_shape(w), g.dtype, ndim=4)


def _window_source(pos: PrimExpr, tap: PrimExpr, stride: int, dilation: int, pad_lo: int,
                   out: PrimExpr) -> tuple[PrimExpr, list[PrimExpr]]:
    """The output position whose window puts tap ``tap`` on input position ``pos`` (clamped
    into range) and the conditions under which it exists."""
    t = pos + pad_lo - tap * dilation if pad_lo else pos - tap * dilation
    q = tx.floordiv(t, stride) if stride != 1 else t
    conds = [t >= 0, q < out]
    if stride != 1:
        conds.append(tx.eq(tx.floormod(t, stride), 0))
    return _clamp(q, out), conds


def _conv_bwd_data_compute(grad: te.Tensor, weight: te.Tensor, data: te.Tensor, *,
                           attrs: Conv2DGradAttrs) -> te.Tensor:
    """``dx[n, c, y, x] = sum_{o in c's group, ry, rx} grad[n, o, q(y, ry), q(x, rx)] *
    w[o, c % ig, ry, rx]`` over the taps whose output position ``q`` exists."""
    o, ig, kh, kw = weight.shape
    oh, ow = grad.shape[2], grad.shape[3]
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, _, _ = attrs.padding
    groups = attrs.groups
    og = o if groups == 1 else simplify(tx.floordiv(o, groups))
    ro = te.reduce_axis((0, og), name="ro")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def body(n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        if groups == 1:
            oo, ci = ro.var, c
        else:
            grp = tx.floordiv(c, ig)
            oo, ci = grp * og + ro.var, tx.floormod(c, ig)
        qy, cy = _window_source(y, ry.var, sh, dh, pt, oh)
        qx, cx = _window_source(x, rx.var, sw, dw, pl, ow)
        # the product is masked, not the gradient: a tap with no output position adds 0, even
        # with an inf/NaN weight (0 * inf would make the sum NaN)
        value = _masked(tx.all_of(cy + cx), grad[n, oo, qy, qx] * weight[oo, ci, ry, rx])
        return te.sum(value, axis=[ro, ry, rx])

    return te.compute(data.shape, body, name="conv2d_backward_data")


def _conv_bwd_weight_compute(grad: te.Tensor, data: te.Tensor, weight: te.Tensor, *,
                             attrs: Conv2DGradAttrs) -> te.Tensor:
    """``dw[o, c, ry, rx] = sum_{n, y, x} grad[n, o, y, x] * pad(data)[n, g(o) + c, y*sh + ry*dh,
    x*sw + rx*dw]``."""
    _, _, h, w = data.shape
    o, ig, _, _ = weight.shape
    nb, _, oh, ow = grad.shape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, _, _ = attrs.padding
    groups = attrs.groups
    og = None if groups == 1 else simplify(tx.floordiv(o, groups))
    rn = te.reduce_axis((0, nb), name="rn")
    ry = te.reduce_axis((0, oh), name="ry")
    rx = te.reduce_axis((0, ow), name="rx")

    def body(oo: PrimExpr, c: PrimExpr, ky: PrimExpr, kx: PrimExpr) -> PrimExpr:
        chan = c if og is None else tx.floordiv(oo, og) * ig + c
        hy = ry.var * sh + ky * dh - pt
        wx = rx.var * sw + kx * dw - pl
        inside = tx.all_of([hy >= 0, hy < h, wx >= 0, wx < w])
        value = data[rn, chan, _clamp(hy, h), _clamp(wx, w)]
        return te.sum(_masked(inside, grad[rn, oo, ry, rx] * value), axis=[rn, ry, rx])

    return te.compute(weight.shape, body, name="conv2d_backward_weight")


def _conv_bwd_data_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``<h, bd(g, W)> = <conv(h, W), g>``: linear in g and in W."""
    from .nn import conv2d

    g, w, _ = call.args
    a = call.attrs
    return [
        conv2d(output_grad, w, **_fields(a)),
        conv2d_backward_weight(g, output_grad, w, **_fields(a)),
        None,
    ]


def _conv_bwd_weight_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``<H, bw(g, x)> = <conv(x, H), g>``."""
    from .nn import conv2d

    g, x, _ = call.args
    a = call.attrs
    return [
        conv2d(x, output_grad, **_fields(a)),
        conv2d_backward_data(g, output_grad, x, **_fields(a)),
        None,
    ]


conv2d_backward_data = register_op(
    "nn.conv2d_backward_data",
    inputs=("grad", "weight", "data"),
    attrs=Conv2DGradAttrs,
    infer=_conv_bwd_data_infer,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_conv_bwd_data_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv_bwd_data_grad,
    doc="The adjoint of ``nn.conv2d(data, weight)`` with respect to ``data`` (a transposed "
    "convolution of ``grad``); ``data`` only gives the result's shape.",
)

conv2d_backward_weight = register_op(
    "nn.conv2d_backward_weight",
    inputs=("grad", "data", "weight"),
    attrs=Conv2DGradAttrs,
    infer=_conv_bwd_weight_infer,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_conv_bwd_weight_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv_bwd_weight_grad,
    doc="The adjoint of ``nn.conv2d(data, weight)`` with respect to ``weight`` (a correlation "
    "of ``data`` with ``grad``); ``weight`` only gives the result's shape.",
)


# =============================================================================================
# pooling adjoints (any layout with unsplit H and W)
# =============================================================================================
def _pool_infer(op: str, with_out: bool):
    def infer(call: Any) -> Any:
        from .layout import Layout

        g = _float_grad(call, op)
        data = tensor_arg(call, 1, op, "data")
        ndim = Layout(call.attrs.layout).ndim
        if arg_ndim(data) not in (-1, ndim):
            raise StructInfoError(
                f"{op}: data must be {ndim}-d for layout {call.attrs.layout!r}, got "
                f"{arg_ndim(data)}-d"
            )
        if with_out:
            out = tensor_arg(call, 2, op, "out")
            if as_dtype(out.dtype) != as_dtype(data.dtype):
                raise StructInfoError(f"{op}: out has dtype {out.dtype} but data has {data.dtype}")
            _check_grad_shape(op, g, arg_shape(out))
        return _like_result(call, op, g, 1, "data")

    return infer


def _hw(layout: str) -> tuple[int, int]:
    from .layout import Layout

    lay = Layout(layout)
    return lay.index("H"), lay.index("W")


def _pool_taps(grad: te.Tensor, data: te.Tensor, attrs: Any, name: str, value_of: Any
               ) -> te.Tensor:
    """``dx[p] = sum over window taps (ky, kx) whose window exists of value_of(p, q)`` where
    ``q`` is the gradient index of that window (clamped) and ``value_of`` gives the term."""
    hi, wi = _hw(attrs.layout)
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, _, _ = attrs.padding
    oh, ow = grad.shape[hi], grad.shape[wi]
    ky = te.reduce_axis((0, kh), name="ky")
    kx = te.reduce_axis((0, kw), name="kx")

    def body(*idx: PrimExpr) -> PrimExpr:
        qy, cy = _window_source(idx[hi], ky.var, sh, dh, pt, oh)
        qx, cx = _window_source(idx[wi], kx.var, sw, dw, pl, ow)
        q = list(idx)
        q[hi], q[wi] = qy, qx
        return te.sum(value_of(idx, tuple(q), tx.all_of(cy + cx)), axis=[ky, kx])

    return te.compute(data.shape, body, name=name)


def _max_pool_backward_compute(grad: te.Tensor, data: te.Tensor, out: te.Tensor, *,
                               attrs: Any) -> te.Tensor:
    """Each window's gradient goes to the inputs equal to the window's maximum."""

    def term(p: tuple, q: tuple, exists: PrimExpr) -> PrimExpr:
        return _masked(tx.logical_and(exists, tx.eq(data(*p), out(*q))), grad(*q))

    return _pool_taps(grad, data, attrs, "max_pool2d_backward", term)


def _avg_pool_backward_compute(grad: te.Tensor, data: te.Tensor, *, attrs: Any) -> te.Tensor:
    """Each window's gradient divided by the window's tap count, spread over its taps."""
    from .nn import _i64, _tap_count

    hi, wi = _hw(attrs.layout)
    h, w = data.shape[hi], data.shape[wi]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    if attrs.count_include_pad:
        lo_h, hi_h, lo_w, hi_w = -pt, _i64(h) + pb, -pl, _i64(w) + pr
    else:
        lo_h, hi_h, lo_w, hi_w = 0, _i64(h), 0, _i64(w)
    one = tx.const(INDEX_DTYPE, 1)

    def term(p: tuple, q: tuple, exists: PrimExpr) -> PrimExpr:
        cnt = _tap_count(q[hi], sh, pt, kh, dh, _i64(lo_h), hi_h) * _tap_count(
            q[wi], sw, pl, kw, dw, _i64(lo_w), hi_w)
        return _masked(exists, grad(*q) / tx.cast(grad.dtype, tx.max(cnt, one)))

    return _pool_taps(grad, data, attrs, "avg_pool2d_backward", term)


def _adaptive_cells(grad: te.Tensor, data: te.Tensor, attrs: Any, name: str, value_of: Any
                    ) -> te.Tensor:
    """``dx[p] = sum over output cells (cy, cx) whose window contains p of value_of(...)``."""
    from .nn import _adaptive_axis

    hi, wi = _hw(attrs.layout)
    oh, ow = attrs.output_size
    start_h, end_h, _, _ = _adaptive_axis(data.shape[hi], oh)
    start_w, end_w, _, _ = _adaptive_axis(data.shape[wi], ow)
    cy = te.reduce_axis((0, oh), name="cy")
    cx = te.reduce_axis((0, ow), name="cx")

    def body(*idx: PrimExpr) -> PrimExpr:
        y, x = cy.var, cx.var
        inside = tx.all_of([start_h(y) <= idx[hi], idx[hi] < end_h(y),
                            start_w(x) <= idx[wi], idx[wi] < end_w(x)])
        q = list(idx)
        q[hi], q[wi] = y, x
        count = (end_h(y) - start_h(y)) * (end_w(x) - start_w(x))
        return te.sum(value_of(idx, tuple(q), inside, count), axis=[cy, cx])

    return te.compute(data.shape, body, name=name)


def _adaptive_avg_backward_compute(grad: te.Tensor, data: te.Tensor, *, attrs: Any
                                   ) -> te.Tensor:
    """Each cell's gradient divided by its window size, spread over the window."""

    def term(p: tuple, q: tuple, inside: PrimExpr, count: PrimExpr) -> PrimExpr:
        return _masked(inside, grad(*q) / tx.cast(grad.dtype, count))

    return _adaptive_cells(grad, data, attrs, "adaptive_avg_pool2d_backward", term)


def _adaptive_max_backward_compute(grad: te.Tensor, data: te.Tensor, out: te.Tensor, *,
                                   attrs: Any) -> te.Tensor:
    """Each cell's gradient goes to the inputs of its window equal to the cell's maximum."""

    def term(p: tuple, q: tuple, inside: PrimExpr, count: PrimExpr) -> PrimExpr:
        return _masked(tx.logical_and(inside, tx.eq(data(*p), out(*q))), grad(*q))

    return _adaptive_cells(grad, data, attrs, "adaptive_max_pool2d_backward", term)


def _avg_pool_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .registry import get_op_def

    return [get_op_def("nn.avg_pool2d")(output_grad, **_fields(call.attrs)), None]


def _adaptive_avg_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .registry import get_op_def

    return [get_op_def("nn.adaptive_avg_pool2d")(output_grad, **_fields(call.attrs)), None]


def _fields(attrs: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(attrs, f.name) for f in dataclasses.fields(attrs)}


def _nn_attrs(name: str) -> type:
    from . import nn

    return getattr(nn, name)


max_pool2d_backward = register_op(
    "nn.max_pool2d_backward",
    inputs=("grad", "data", "out"),
    attrs=_nn_attrs("MaxPool2DAttrs"),
    infer=_pool_infer("nn.max_pool2d_backward", with_out=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_max_pool_backward_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="The adjoint of ``nn.max_pool2d``: ``grad`` of each window sent to the inputs equal to "
    "the window's maximum ``out`` (the forward result).",
)

avg_pool2d_backward = register_op(
    "nn.avg_pool2d_backward",
    inputs=("grad", "data"),
    attrs=_nn_attrs("AvgPool2DAttrs"),
    infer=_pool_infer("nn.avg_pool2d_backward", with_out=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_avg_pool_backward_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_avg_pool_backward_grad,
    doc="The adjoint of ``nn.avg_pool2d``: each window's ``grad`` divided by its tap count and "
    "spread over its taps; ``data`` only gives the result's shape.",
)

adaptive_avg_pool2d_backward = register_op(
    "nn.adaptive_avg_pool2d_backward",
    inputs=("grad", "data"),
    attrs=_nn_attrs("AdaptivePool2DAttrs"),
    infer=_pool_infer("nn.adaptive_avg_pool2d_backward", with_out=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_avg_backward_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_adaptive_avg_backward_grad,
    doc="The adjoint of ``nn.adaptive_avg_pool2d``; ``data`` only gives the result's shape.",
)

adaptive_max_pool2d_backward = register_op(
    "nn.adaptive_max_pool2d_backward",
    inputs=("grad", "data", "out"),
    attrs=_nn_attrs("AdaptivePool2DAttrs"),
    infer=_pool_infer("nn.adaptive_max_pool2d_backward", with_out=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_max_backward_compute,
    schedules={"c": schedule_reduction},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="The adjoint of ``nn.adaptive_max_pool2d``: each cell's ``grad`` sent to the inputs of "
    "its window equal to the cell's maximum ``out`` (the forward result).",
)
