"""Pooling: ``nn.max_pool2d``, ``nn.avg_pool2d`` and their adaptive forms (global pooling
for an output size of 1), in any layout with unsplit H and W (NCHW, NHWC, NCHW8c: the other
axes are carried through), and their adjoints (``nn.*_pool2d_backward``). Max pooling's adjoint
sends a window's gradient to every input equal to the window's maximum (a tie gives each tied
input the full gradient; PyTorch gives it to one of them).

Pooling is OUT_EWISE_FUSABLE. Padded taps never win a max and count for an average only with
``count_include_pad``. A NaN in a max pooling window makes the result NaN (numpy, PyTorch), or,
with ``ignore_nan`` (ONNX MaxPool), is skipped: a window of -inf gives -inf, as onnxruntime and the
ONNX reference do, and so does one of NaNs only (both give NaN there; they resolve a window
mixing NaNs and numbers differently, by the NaN's position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import te, tir
from ...graph.struct_info import TensorStructInfo
from ...ir.dtype import DataType, as_dtype
from ...ir.errors import KilnError, StructInfoError
from ...tir import expr as tx
from ...tir.expr import PrimExpr
from ..common import INDEX_DTYPE, arg_ndim, arg_shape, attr_fields, is_float_arg
from ..grad import check_grad_shape, float_grad, like_result, masked
from ..layout import Layout, as_layout
from ..linalg import const_int, simplify, tensor_arg
from ..registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, get_op_def, register_op
from .window import (
    I64,
    check_out_dim,
    clamp_index,
    i64,
    needs_guard,
    norm_padding,
    norm_pair,
    out_dim,
    set_frozen,
    window_source,
)

#: A pooling window reads the input width with unit stride and no bounds guard, so the output
#: width can be vectorized with contiguous loads.
UNIT_STRIDE_W = "kiln.unit_stride_w"


#: A pooling window's innermost axis is one it carries through (channels of NHWC, NCHW8c), so
#: it can be vectorized with contiguous loads.
CARRIED_INNER = "kiln.carried_inner"


def _pool_layout(value: Any, op: str) -> str:
    """A pooling layout: any layout with unsplit primal H and W (NCHW, NHWC, NCHW8c...)."""
    lay = as_layout(value, op, "layout")
    if lay.index("H") < 0 or lay.index("W") < 0 or lay.factor("H") or lay.factor("W"):
        raise KilnError(
            f"{op}: layout must have unsplit H and W axes (like 'NCHW', 'NHWC' or 'NCHW8c'), "
            f"got {value!r}"
        )
    return lay.name


@dataclass(frozen=True)
class MaxPool2DAttrs:
    """``pool_size``/``strides``/``dilation``: int or (h, w) (strides default to 1);
    ``padding``: int, (v, h) or (top, left, bottom, right), padded taps never win;
    ``ceil_mode``: round the output size up (the last window may be partial); ``layout``: the
    data's layout (NCHW, NHWC, NCHW8c...; every axis but H and W is carried through);
    ``ignore_nan``: skip NaN inputs instead of propagating them (see the module docstring)."""

    pool_size: Any = (1, 1)
    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    ceil_mode: bool = False
    layout: str = "NCHW"
    ignore_nan: bool = False

    def __post_init__(self):
        _normalize_pool(self, "nn.max_pool2d")
        set_frozen(self, "ignore_nan", bool(self.ignore_nan))


@dataclass(frozen=True)
class AvgPool2DAttrs:
    """As :class:`MaxPool2DAttrs`, plus ``count_include_pad``: divide by the number of taps
    inside the padded input (True) or inside the input only (False). Taps past the padding
    (ceil_mode) never count."""

    pool_size: Any = (1, 1)
    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    ceil_mode: bool = False
    count_include_pad: bool = False
    layout: str = "NCHW"

    def __post_init__(self):
        _normalize_pool(self, "nn.avg_pool2d")
        set_frozen(self, "count_include_pad", bool(self.count_include_pad))


def _normalize_pool(attrs: Any, op: str) -> None:
    set_frozen(attrs, "pool_size", norm_pair(attrs.pool_size, op, "pool_size"))
    set_frozen(attrs, "strides", norm_pair(attrs.strides, op, "strides"))
    set_frozen(attrs, "padding", norm_padding(attrs.padding, op))
    set_frozen(attrs, "dilation", norm_pair(attrs.dilation, op, "dilation"))
    set_frozen(attrs, "ceil_mode", bool(attrs.ceil_mode))
    set_frozen(attrs, "layout", _pool_layout(attrs.layout, op))
    kh, kw = attrs.pool_size
    pt, pl, pb, pr = attrs.padding
    if max(pt, pb) >= (kh - 1) * attrs.dilation[0] + 1 or max(pl, pr) >= (
        kw - 1
    ) * attrs.dilation[1] + 1:
        raise KilnError(
            f"{op}: padding {attrs.padding} must be smaller than the (dilated) window "
            f"{attrs.pool_size}, or some windows would see only padding"
        )


def _hw(layout: str) -> tuple[int, int]:
    lay = Layout(layout)
    return lay.index("H"), lay.index("W")


def _with_hw(shape: Sequence[Any], layout: str, h: Any, w: Any) -> tuple:
    hi, wi = _hw(layout)
    out = list(shape)
    out[hi], out[wi] = h, w
    return tuple(out)


def _pool_out_shape(attrs: Any, shape: Sequence[Any]) -> tuple:
    hi, wi = _hw(attrs.layout)
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return _with_hw(
        shape, attrs.layout,
        out_dim(shape[hi], kh, sh, dh, pt, pb, attrs.ceil_mode),
        out_dim(shape[wi], kw, sw, dw, pl, pr, attrs.ceil_mode),
    )


def _pool_data(call: Any, op: str, float_only: bool) -> Any:
    """The data argument of a pooling call, checked against the layout's rank and dtype."""
    ndim = Layout(call.attrs.layout).ndim
    data = tensor_arg(call, 0, op, "data")
    if data.ndim >= 0 and data.ndim != ndim:
        raise StructInfoError(
            f"{op}: data must be {ndim}-d for layout {call.attrs.layout!r}, got {data.ndim}-d"
        )
    ok = data.dtype.is_float or (not float_only and data.dtype.is_integer)
    if not ok:
        kind = "a float" if float_only else "a numeric"
        raise StructInfoError(f"{op}: data must be {kind} tensor, got dtype {data.dtype}")
    return data


def _make_pool_infer(op: str, float_only: bool):
    def infer(call: Any) -> Any:
        data = _pool_data(call, op, float_only)
        ndim = Layout(call.attrs.layout).ndim
        if data.shape is None:
            return TensorStructInfo(None, data.dtype, ndim)
        shape = _pool_out_shape(call.attrs, data.shape)
        hi, wi = _hw(call.attrs.layout)
        check_out_dim(op, "height", shape[hi], data.shape[hi])
        check_out_dim(op, "width", shape[wi], data.shape[wi])
        return TensorStructInfo(shape, data.dtype)

    return infer


def _window(data: Any, attrs: Any, out_shape: tuple, pad_value: Any, name: str, reducer: Any):
    """The reduction of ``data`` over each (padded, dilated) pooling window."""
    hi, wi = _hw(attrs.layout)
    h, w = data.shape[hi], data.shape[wi]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, _, _ = attrs.padding
    glo_h, ghi_h = needs_guard(h, out_shape[hi], kh, sh, dh, pt)
    glo_w, ghi_w = needs_guard(w, out_shape[wi], kw, sw, dw, pl)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def body(*idx):
        hy, wx = idx[hi] * sh + ry * dh - pt, idx[wi] * sw + rx * dw - pl
        conds = (
            ([tir.ge(hy, 0)] if glo_h else []) + ([tir.lt(hy, h)] if ghi_h else [])
            + ([tir.ge(wx, 0)] if glo_w else []) + ([tir.lt(wx, w)] if ghi_w else [])
        )
        src = list(idx)
        src[hi] = clamp_index(hy, h, glo_h, ghi_h)
        src[wi] = clamp_index(wx, w, glo_w, ghi_w)
        val = data[tuple(src)]
        if conds:
            val = tir.select(tir.all_of(conds), val, pad_value)
        return reducer(val, axis=[ry, rx])

    guarded = glo_h or ghi_h or glo_w or ghi_w
    # a guard on any axis is a scalar condition around vector loads, which the C code generator
    # cannot emit yet (see _pool_annotations), so guarded windows stay scalar
    contiguous = wi == len(data.shape) - 1 and sw == 1 and not guarded
    out = te.compute(out_shape, body, name=name,
                     attrs=_pool_annotations(attrs.layout, contiguous, guarded))
    return out, guarded


def _pool_annotations(layout: str, contiguous: bool, guarded: bool) -> dict[str, Any]:
    """Facts for the pooling schedule: whether the innermost axis is W read with unit stride,
    or an axis the window carries through (a channel axis: always contiguous, also under a
    padded window's guard -- a scalar condition selecting between vectors)."""
    del guarded
    hi, wi = _hw(layout)
    ndim = Layout(layout).ndim
    if ndim - 1 in (hi, wi):
        return {UNIT_STRIDE_W: contiguous}
    return {UNIT_STRIDE_W: False, CARRIED_INNER: True}


def _neg_inf(dtype: DataType) -> PrimExpr:
    return tir.const(dtype, float("-inf"))


#: The maximum that skips NaN: ``b`` wins only when it is greater than the accumulator ``a``
#: (which starts at -inf, so is never NaN), which a NaN never is. One comparison and a select,
#: which vectorizes (an ``isnan`` call did not: ResNet-18's 3x3/s2 max pooling in NCHW16c ran
#: scalar, 2.1x onnxruntime's time; nor does a test ``a != a`` that would let a window of NaNs
#: give NaN: 6x slower). Starting from the lowest finite value instead turned windows of -inf
#: into -3.4e38 (fuzz seed 3022967).
max_ignoring_nan = te.comm_reducer(
    lambda a, b: tir.select(b > a, b, a), _neg_inf, name="max_ignoring_nan")


def _max_pool2d_compute(data: Any, *, attrs: MaxPool2DAttrs) -> Any:
    """Maximum over each window; padded taps hold the dtype's lowest value."""
    shape = _pool_out_shape(attrs, data.shape)
    lowest = tir.const(data.dtype, data.dtype.min_value())
    reducer = max_ignoring_nan if attrs.ignore_nan and data.dtype.is_float else te.max
    out, _ = _window(data, attrs, shape, lowest, "max_pool2d", reducer)
    return out


def _tap_count(o: Any, stride: int, pad_lo: int, kernel: int, dilation: int, lo: Any,
               hi: Any) -> Any:
    """Number of taps ``o*stride - pad_lo + r*dilation`` (r < kernel) inside ``[lo, hi)``."""
    base = o * stride - pad_lo

    def ceildiv(a: Any) -> Any:
        return tir.floordiv(a + (dilation - 1), dilation)

    first = tir.max(ceildiv(lo - base), tir.const(I64, 0))
    last = tir.min(ceildiv(hi - base), tir.const(I64, kernel))
    return tir.max(last - first, tir.const(I64, 0))


def _pool_sum_dtype(dtype: DataType) -> DataType:
    """float16/bfloat16 windows are summed in float32 (a 16-bit sum of a large window stalls);
    every other dtype in itself."""
    return DataType("float32") if dtype.is_float and dtype.bits < 32 else dtype


def _pool_sum(dtype: DataType) -> Any:
    """The window reducer of an average: a sum in :func:`_pool_sum_dtype`."""
    ct = _pool_sum_dtype(dtype)
    return lambda val, axis: te.sum(tir.cast(ct, val), axis=axis)


def _avg_pool2d_compute(data: Any, *, attrs: AvgPool2DAttrs) -> Any:
    """Window sums (``avg_pool2d_sum``) divided by the number of counted taps."""
    shape = _pool_out_shape(attrs, data.shape)
    zero = tir.const(data.dtype, 0)
    acc, guarded = _window(data, attrs, shape, zero, "avg_pool2d_sum", _pool_sum(data.dtype))
    ct = _pool_sum_dtype(data.dtype)
    hi, wi = _hw(attrs.layout)
    h, w = data.shape[hi], data.shape[wi]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    if not guarded:
        return te.compute(shape, lambda *i: tir.cast(data.dtype, acc[i] / tir.const(ct, kh * kw)),
                          name="avg_pool2d")
    if attrs.count_include_pad:
        lo_h, hi_h, lo_w, hi_w = -pt, i64(h) + pb, -pl, i64(w) + pr
    else:
        lo_h, hi_h, lo_w, hi_w = 0, i64(h), 0, i64(w)

    def body(*i):
        cnt = _tap_count(i[hi], sh, pt, kh, dh, i64(lo_h), hi_h) * _tap_count(
            i[wi], sw, pl, kw, dw, i64(lo_w), hi_w)
        return tir.cast(data.dtype, acc[i] / tir.cast(ct, cnt))

    return te.compute(shape, body, name="avg_pool2d")



def _max_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Each window's gradient to the inputs equal to its maximum (the forward result)."""
    x = call.args[0]
    if not is_float_arg(x):
        return [None]
    return [max_pool2d_backward(output_grad, x, call, **attr_fields(call.attrs))]


max_pool2d = register_op(
    "nn.max_pool2d",
    inputs=("data",),
    attrs=MaxPool2DAttrs,
    infer=_make_pool_infer("nn.max_pool2d", float_only=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_max_pool2d_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_max_pool2d_grad,
    doc="2-d max pooling (data in ``layout``: NCHW by default, NHWC, NCHW8c...).",
)


def _avg_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [avg_pool2d_backward(output_grad, call.args[0], **attr_fields(call.attrs))]


avg_pool2d = register_op(
    "nn.avg_pool2d",
    inputs=("data",),
    attrs=AvgPool2DAttrs,
    infer=_make_pool_infer("nn.avg_pool2d", float_only=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_avg_pool2d_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_avg_pool2d_grad,
    doc="2-d average pooling (data in ``layout``: NCHW by default, NHWC, NCHW8c...).",
)


@dataclass(frozen=True)
class AdaptivePool2DAttrs:
    """``output_size``: int or (h, w). Output cell ``i`` of an axis of size ``n`` pools input
    ``[floor(i*n/out), ceil((i+1)*n/out))``; ``(1, 1)`` is global pooling. ``layout``: the
    data's layout (NCHW, NHWC, NCHW8c...)."""

    output_size: Any = (1, 1)
    layout: str = "NCHW"

    def __post_init__(self):
        set_frozen(self, "output_size",
                   norm_pair(self.output_size, "nn.adaptive_pool2d", "output_size"))
        set_frozen(self, "layout", _pool_layout(self.layout, "nn.adaptive_pool2d"))


def _infer_adaptive(op: str, float_only: bool):
    def infer(call: Any) -> Any:
        data = _pool_data(call, op, float_only)
        if data.shape is None:
            return TensorStructInfo(None, data.dtype, Layout(call.attrs.layout).ndim)
        oh, ow = call.attrs.output_size
        return TensorStructInfo(_with_hw(data.shape, call.attrs.layout, oh, ow), data.dtype)

    return infer


def _adaptive_axis(size: Any, out: int) -> tuple[Any, Any, Any, bool]:
    """(start(i), end(i), max window, whether windows vary) for one adaptive axis."""
    s = const_int(size)
    if s is not None and s % out == 0:
        k = s // out
        return (lambda i: i * k), (lambda i: i * k + k), k, False
    if out == 1:
        return (lambda i: tir.const(I64, 0)), (lambda i: i64(size)), size, False

    def start(i):
        return tir.floordiv(i * size, out)

    def end(i):
        return tir.floordiv((i + 1) * size + (out - 1), out)

    if s is not None:
        kmax = max(-(-((i + 1) * s) // out) - (i * s) // out for i in range(out))
    else:
        kmax = simplify(tir.floordiv(i64(size) + (out - 1), out) + 1)
    return start, end, kmax, True


def _adaptive_compute(kind: str):
    def compute(data: Any, *, attrs: AdaptivePool2DAttrs) -> Any:
        hi, wi = _hw(attrs.layout)
        h, w = data.shape[hi], data.shape[wi]
        oh, ow = attrs.output_size
        out_shape = _with_hw(data.shape, attrs.layout, oh, ow)
        sh, eh, kh, vary_h = _adaptive_axis(h, oh)
        sw, ew, kw, vary_w = _adaptive_axis(w, ow)
        ry = te.reduce_axis((0, kh), name="ry")
        rx = te.reduce_axis((0, kw), name="rx")
        if kind == "max":
            reducer, pad = te.max, tir.const(data.dtype, data.dtype.min_value())
        else:
            reducer, pad = _pool_sum(data.dtype), tir.const(data.dtype, 0)

        def body(*idx):
            y, x = idx[hi], idx[wi]
            hy, wx = sh(y) + ry, sw(x) + rx
            conds = ([tir.lt(hy, eh(y))] if vary_h else []) + (
                [tir.lt(wx, ew(x))] if vary_w else [])
            src = list(idx)
            src[hi] = tir.min(hy, i64(h) - 1) if vary_h else hy
            src[wi] = tir.min(wx, i64(w) - 1) if vary_w else wx
            val = data[tuple(src)]
            if conds:
                val = tir.select(tir.all_of(conds), val, pad)
            return reducer(val, axis=[ry, rx])

        name = f"adaptive_{kind}_pool2d"
        ann = _pool_annotations(attrs.layout, False, vary_h or vary_w)
        red = te.compute(out_shape, body, name=name if kind == "max" else name + "_sum",
                         attrs=ann if CARRIED_INNER in ann else {})
        if kind == "max":
            return red

        def avg(*idx):
            y, x = idx[hi], idx[wi]
            cnt = (eh(y) - sh(y)) * (ew(x) - sw(x))
            return tir.cast(data.dtype, red[idx] / tir.cast(_pool_sum_dtype(data.dtype), cnt))

        return te.compute(out_shape, avg, name=name)

    return compute


def _adaptive_avg_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [adaptive_avg_pool2d_backward(output_grad, call.args[0],
                                         **attr_fields(call.attrs))]


adaptive_avg_pool2d = register_op(
    "nn.adaptive_avg_pool2d",
    inputs=("data",),
    attrs=AdaptivePool2DAttrs,
    infer=_infer_adaptive("nn.adaptive_avg_pool2d", float_only=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_compute("avg"),
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_adaptive_avg_pool2d_grad,
    doc="Average pooling to a fixed output size (global pooling for (1, 1)); data in "
    "``layout`` (NCHW by default).",
)


def _adaptive_max_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    x = call.args[0]
    if not is_float_arg(x):
        return [None]
    return [adaptive_max_pool2d_backward(output_grad, x, call, **attr_fields(call.attrs))]


adaptive_max_pool2d = register_op(
    "nn.adaptive_max_pool2d",
    inputs=("data",),
    attrs=AdaptivePool2DAttrs,
    infer=_infer_adaptive("nn.adaptive_max_pool2d", float_only=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_compute("max"),
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_adaptive_max_pool2d_grad,
    doc="Max pooling to a fixed output size (global pooling for (1, 1)); data in ``layout`` "
    "(NCHW by default).",
)


def global_avg_pool2d(data: Any, layout: str = "NCHW") -> Any:
    """Mean over H and W, keeping them as size-1 dims: ``[N, C, 1, 1]`` for NCHW data."""
    return adaptive_avg_pool2d(data, (1, 1), layout)


def global_max_pool2d(data: Any, layout: str = "NCHW") -> Any:
    """Maximum over H and W, keeping them as size-1 dims: ``[N, C, 1, 1]`` for NCHW data."""
    return adaptive_max_pool2d(data, (1, 1), layout)


def _pool_infer(op: str, with_out: bool):
    def infer(call: Any) -> Any:
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
        qy, cy = window_source(idx[hi], ky.var, sh, dh, pt, oh)
        qx, cx = window_source(idx[wi], kx.var, sw, dw, pl, ow)
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
    hi, wi = _hw(attrs.layout)
    h, w = data.shape[hi], data.shape[wi]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    if attrs.count_include_pad:
        lo_h, hi_h, lo_w, hi_w = -pt, i64(h) + pb, -pl, i64(w) + pr
    else:
        lo_h, hi_h, lo_w, hi_w = 0, i64(h), 0, i64(w)
    one = tx.const(INDEX_DTYPE, 1)

    def term(p: tuple, q: tuple, exists: PrimExpr) -> PrimExpr:
        cnt = _tap_count(q[hi], sh, pt, kh, dh, i64(lo_h), hi_h) * _tap_count(
            q[wi], sw, pl, kw, dw, i64(lo_w), hi_w)
        return masked(exists, grad(*q) / tx.cast(grad.dtype, tx.max(cnt, one)))

    return _pool_taps(grad, data, attrs, "avg_pool2d_backward", term)


def _adaptive_cells(grad: te.Tensor, data: te.Tensor, attrs: Any, name: str, value_of: Any
                    ) -> te.Tensor:
    """``dx[p] = sum over output cells (cy, cx) whose window contains p of value_of(...)``."""
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
    return [get_op_def("nn.avg_pool2d")(output_grad, **attr_fields(call.attrs)), None]


def _adaptive_avg_backward_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [get_op_def("nn.adaptive_avg_pool2d")(output_grad, **attr_fields(call.attrs)), None]



max_pool2d_backward = register_op(
    "nn.max_pool2d_backward",
    inputs=("grad", "data", "out"),
    attrs=MaxPool2DAttrs,
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
    attrs=AvgPool2DAttrs,
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
    attrs=AdaptivePool2DAttrs,
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
    attrs=AdaptivePool2DAttrs,
    infer=_pool_infer("nn.adaptive_max_pool2d_backward", with_out=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_max_backward_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="The adjoint of ``nn.adaptive_max_pool2d``: each cell's ``grad`` sent to the inputs of "
    "its window equal to the cell's maximum ``out`` (the forward result).",
)
