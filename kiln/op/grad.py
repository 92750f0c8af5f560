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

from .. import te
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    INDEX_DTYPE,
    arg_ndim,
    arg_shape,
    attr_fields,
    const_int,
    fmt_shape,
    scalar,
    shape_attr,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .elementwise import cast_to
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op
from .shape import collapse_sum_like

__all__ = [
    "adaptive_avg_pool2d_backward", "adaptive_max_pool2d_backward", "avg_pool2d_backward",
    "conv2d_backward_data", "conv2d_backward_weight", "max_pool2d_backward",
]


# =============================================================================================
# helpers for gradient rules (graph level)
# =============================================================================================


def zeros(sinfo: Any, what: str = "gradient") -> Any:
    """An explicit zero tensor of a TensorStructInfo: a broadcast 0-d constant, so no large
    constant is stored and symbolic shapes work."""
    from .shape import broadcast_to

    shape = arg_shape(sinfo)
    if shape is None:
        raise KilnError(f"{what}: cannot make zeros of unknown shape ({sinfo})")
    zero = scalar(0, sinfo.dtype)
    return zero if not shape else broadcast_to(zero, shape_attr(shape))


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
# shared checks of the backward ops: grad and a "like" input that gives the result's shape
# =============================================================================================
def float_grad(call: Any, op: str, index: int = 0) -> Any:
    g = tensor_arg(call, index, op, "grad")
    if not as_dtype(g.dtype).is_float:
        raise StructInfoError(f"{op}: grad must be a float tensor, got dtype {g.dtype}")
    return g


def like_result(call: Any, op: str, g: Any, like_index: int, like_name: str) -> Any:
    like = tensor_arg(call, like_index, op, like_name)
    return tensor_sinfo(arg_shape(like), g.dtype, ndim=arg_ndim(like))


def check_grad_shape(op: str, g: Any, expected: Sequence[Any] | None) -> None:
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


def clamp_into(v: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """``v`` clamped into ``[0, hi)`` (loads stay in bounds even when a select discards them)."""
    return tx.max(tx.min(v, simplify(hi - 1)), tx.const(INDEX_DTYPE, 0))


def all_of_or_none(conds: list[PrimExpr]) -> PrimExpr | None:
    return tx.all_of(conds) if conds else None


def masked(cond: PrimExpr | None, value: PrimExpr) -> PrimExpr:
    return value if cond is None else tx.select(cond, value, tx.const(value.dtype, 0))


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
        check_grad_shape(op, g, _conv_out_shape(call.attrs, arg_shape(data), arg_shape(w)))
    return tensor_sinfo(arg_shape(data), g.dtype, ndim=4)


def _conv_bwd_weight_infer(call: Any) -> Any:
    op = "nn.conv2d_backward_weight"
    g, data, w = _conv_args(call, op, ("grad", "data", "weight"))
    if arg_shape(data) is not None and arg_shape(w) is not None:
        check_grad_shape(op, g, _conv_out_shape(call.attrs, arg_shape(data), arg_shape(w)))
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
    return clamp_into(q, out), conds


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
        value = masked(tx.all_of(cy + cx), grad[n, oo, qy, qx]) * weight[oo, ci, ry, rx]
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
        value = masked(inside, data[rn, chan, clamp_into(hy, h), clamp_into(wx, w)])
        return te.sum(grad[rn, oo, ry, rx] * value, axis=[rn, ry, rx])

    return te.compute(weight.shape, body, name="conv2d_backward_weight")


def _conv_bwd_data_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``<h, bd(g, W)> = <conv(h, W), g>``: linear in g and in W."""
    from .nn import conv2d

    g, w, _ = call.args
    a = call.attrs
    return [
        conv2d(output_grad, w, **attr_fields(a)),
        conv2d_backward_weight(g, output_grad, w, **attr_fields(a)),
        None,
    ]


def _conv_bwd_weight_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``<H, bw(g, x)> = <conv(x, H), g>``."""
    from .nn import conv2d

    g, x, _ = call.args
    a = call.attrs
    return [
        conv2d(x, output_grad, **attr_fields(a)),
        conv2d_backward_data(g, output_grad, x, **attr_fields(a)),
        None,
    ]


conv2d_backward_data = register_op(
    "nn.conv2d_backward_data",
    inputs=("grad", "weight", "data"),
    attrs=Conv2DGradAttrs,
    infer=_conv_bwd_data_infer,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_conv_bwd_data_compute,
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

        g = float_grad(call, op)
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
            check_grad_shape(op, g, arg_shape(out))
        return like_result(call, op, g, 1, "data")

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
        return masked(tx.logical_and(exists, tx.eq(data(*p), out(*q))), grad(*q))

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
        return masked(exists, grad(*q) / tx.cast(grad.dtype, tx.max(cnt, one)))

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
        return masked(inside, grad(*q) / tx.cast(grad.dtype, count))

    return _adaptive_cells(grad, data, attrs, "adaptive_avg_pool2d_backward", term)


def _adaptive_max_backward_compute(grad: te.Tensor, data: te.Tensor, out: te.Tensor, *,
                                   attrs: Any) -> te.Tensor:
    """Each cell's gradient goes to the inputs of its window equal to the cell's maximum."""

    def term(p: tuple, q: tuple, inside: PrimExpr, count: PrimExpr) -> PrimExpr:
        return masked(tx.logical_and(inside, tx.eq(data(*p), out(*q))), grad(*q))

    return _adaptive_cells(grad, data, attrs, "adaptive_max_pool2d_backward", term)


def _avg_pool_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .registry import get_op_def

    return [get_op_def("nn.avg_pool2d")(output_grad, **attr_fields(call.attrs)), None]


def _adaptive_avg_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .registry import get_op_def

    return [get_op_def("nn.adaptive_avg_pool2d")(output_grad, **attr_fields(call.attrs)), None]


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
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="The adjoint of ``nn.adaptive_max_pool2d``: each cell's ``grad`` sent to the inputs of "
    "its window equal to the cell's maximum ``out`` (the forward result).",
)
