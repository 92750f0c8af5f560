"""Neural-network operators: convolution, pooling, softmax, normalization, dropout.

Registry names are ``nn.<name>``; this module is also the ``kiln.op.nn`` namespace, so it
re-exports the activations declared with the element-wise ops (``nn.relu``, ``nn.gelu``...).

Layouts are NCHW for data and OIHW for convolution weights. Padding is given as one int, two
values ``(vertical, horizontal)``, or four values ``(top, left, bottom, right)``.

Fusion patterns follow TVM: convolution and pooling are OUT_EWISE_FUSABLE (element-wise
consumers such as bias-add and relu fuse into their output loop); softmax, log_softmax and
layer_norm are OPAQUE because they are several reductions and element-wise passes over the same
rows, which the fuser's single-anchor groups cannot describe; batch_norm in inference form is
plain per-channel arithmetic (BROADCAST), so it fuses like any element-wise op.

Out-of-bounds taps of padded windows are handled by clamping the index into the input and
selecting the padding value, so a load never leaves its buffer even when both sides of the
select are evaluated (vector code).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import te, tir
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from .elementwise import gelu, relu, sigmoid, silu, tanh  # noqa: F401  (kiln.op.nn.relu ...)
from .linalg import (
    attr_out_dtype,
    block_work,
    const_int,
    fmt_dim,
    fmt_shape,
    loop_extent,
    norm_dtype,
    other_blocks,
    parallel_outer,
    pick_factor,
    provably_unequal,
    result_dtype,
    schedule_epilogue,
    simplify,
    split_off,
    tensor_arg,
    vector_factor,
    vectorize_inner,
)
from .registry import MixedPrecision, OpPattern, register_op
from .schedule_helpers import PARALLEL_MIN_WORK, schedule_injective, schedule_reduction

__all__ = [
    "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool2d", "batch_norm", "conv2d",
    "dropout", "global_avg_pool2d", "global_max_pool2d", "layer_norm", "log_softmax",
    "max_pool2d", "softmax",
]

I64 = DataType("int64")

# Block annotations (compute ``attrs``) that tell an op's schedule a fact about its compute.
#: The axes a row-wise op (softmax, layer_norm) reduces over.
ROW_AXES = "kiln.row_axes"
#: A pooling window reads the input width with unit stride and no bounds guard, so the output
#: width can be vectorized with contiguous loads.
UNIT_STRIDE_W = "kiln.unit_stride_w"


# =============================================================================================
# attribute normalization
# =============================================================================================
def _ints(value: Any, n: int, op: str, what: str) -> tuple[int, ...]:
    """``value`` (an int or a sequence of ints) as an n-tuple of python ints."""
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return (int(value),) * n
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        vals = tuple(value)
        if len(vals) == n and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            return tuple(int(v) for v in vals)
    raise KilnError(f"{op}: {what} must be an int or {n} ints, got {value!r}")


def _pair(value: Any, op: str, what: str, minimum: int = 1) -> tuple[int, int]:
    vals = _ints(value, 2, op, what)
    if any(v < minimum for v in vals):
        raise KilnError(f"{op}: {what} must be >= {minimum}, got {value!r}")
    return vals  # type: ignore[return-value]


def _padding(value: Any, op: str) -> tuple[int, int, int, int]:
    """``int``, ``(v, h)`` or ``(top, left, bottom, right)`` -> ``(top, left, bottom, right)``."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 2:
        v, h = _ints(value, 2, op, "padding")
        vals = (v, h, v, h)
    elif isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and len(value) == 4:
        vals = _ints(value, 4, op, "padding")
    elif isinstance(value, int) and not isinstance(value, bool):
        vals = (value,) * 4
    else:
        raise KilnError(
            f"{op}: padding must be an int, (vertical, horizontal) or (top, left, bottom, "
            f"right), got {value!r}"
        )
    if any(p < 0 for p in vals):
        raise KilnError(f"{op}: padding must be non-negative, got {value!r}")
    return vals  # type: ignore[return-value]


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)


# =============================================================================================
# window arithmetic shared by conv and pooling
# =============================================================================================
def _i64(v: Any) -> Any:
    return tir.const(I64, v) if isinstance(v, int) else v


def _out_dim(size: Any, kernel: Any, stride: int, dilation: int, pad_lo: int, pad_hi: int,
             ceil_mode: bool = False) -> Any:
    """Number of window positions along one axis (an int64 PrimExpr, folded when static)."""
    size, kernel = _i64(size), _i64(kernel)
    span = size + (pad_lo + pad_hi) - (kernel - 1) * dilation - 1
    if not ceil_mode:
        return simplify(tir.floordiv(span, stride) + 1)
    out = tir.floordiv(span + (stride - 1), stride) + 1
    # the last window must start inside the input or the leading padding
    out = out - tir.select(tir.ge((out - 1) * stride, size + pad_lo), tir.const(I64, 1),
                           tir.const(I64, 0))
    return simplify(out)


def _check_out_dim(op: str, what: str, dim: Any, size: Any) -> None:
    if const_int(dim) is not None and const_int(dim) <= 0:
        raise StructInfoError(
            f"{op}: the window does not fit the input: {what} {fmt_dim(size)} (with padding) "
            f"is smaller than the (dilated) kernel"
        )


def _clamp_index(idx: Any, size: Any, lo: bool, hi: bool) -> Any:
    """``idx`` clamped into ``[0, size)`` on the sides that can overflow."""
    if hi:
        idx = tir.min(idx, _i64(size) - 1)
    if lo:
        idx = tir.max(idx, tir.const(I64, 0))
    return idx


def _needs_guard(size: Any, out: Any, kernel: Any, stride: int, dilation: int,
                 pad_lo: int) -> tuple[bool, bool]:
    """Whether taps can fall before the start / past the end of the input along one axis."""
    lo = pad_lo > 0
    s, o, k = const_int(size), const_int(out), const_int(kernel)
    if s is None or o is None or k is None:
        return lo, True
    last = (o - 1) * stride + (k - 1) * dilation - pad_lo
    return lo, last >= s


# =============================================================================================
# conv2d
# =============================================================================================
@dataclass(frozen=True)
class Conv2DAttrs:
    """2-d convolution of NCHW data with an OIHW weight.

    ``strides``/``dilation``: int or (h, w); ``padding``: int, (v, h) or (top, left, bottom,
    right); ``groups``: input and output channels are split into that many groups (``groups ==
    channels`` with one input channel per group is a depthwise convolution); ``out_dtype``:
    accumulation and result dtype (None: the inputs').
    """

    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    groups: int = 1
    out_dtype: str | None = None

    def __post_init__(self):
        _set(self, "strides", _pair(self.strides, "nn.conv2d", "strides"))
        _set(self, "padding", _padding(self.padding, "nn.conv2d"))
        _set(self, "dilation", _pair(self.dilation, "nn.conv2d", "dilation"))
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise KilnError(f"nn.conv2d: groups must be a positive int, got {self.groups!r}")
        _set(self, "out_dtype", norm_dtype(self.out_dtype, "nn.conv2d"))


def _conv2d_out_shape(attrs: Conv2DAttrs, dshape: Sequence[Any], wshape: Sequence[Any]) -> tuple:
    n, _, h, w = dshape
    o, _, kh, kw = wshape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return (n, o, _out_dim(h, kh, sh, dh, pt, pb), _out_dim(w, kw, sw, dw, pl, pr))


def _infer_conv2d(call: Any) -> Any:
    from ..graph.struct_info import TensorStructInfo

    op = "nn.conv2d"
    data = tensor_arg(call, 0, op, "data", ndim=4)
    weight = tensor_arg(call, 1, op, "weight", ndim=4)
    attrs: Conv2DAttrs = call.attrs
    dtype = result_dtype(op, attr_out_dtype(call), ("data", data), ("weight", weight))
    if data.shape is None or weight.shape is None:
        return TensorStructInfo(None, dtype, 4)
    g = attrs.groups
    c, o, ig = data.shape[1], weight.shape[0], weight.shape[1]
    if const_int(c) is not None and const_int(ig) is not None:
        if const_int(c) != const_int(ig) * g:
            raise StructInfoError(
                f"{op}: data has {const_int(c)} channels but weight expects "
                f"{const_int(ig) * g} (groups={g}, weight {fmt_shape(weight.shape)})"
            )
    elif g == 1 and provably_unequal(c, ig):
        raise StructInfoError(f"{op}: data has {fmt_dim(c)} channels but weight expects "
                              f"{fmt_dim(ig)} (groups=1)")
    if const_int(o) is not None and const_int(o) % g != 0:
        raise StructInfoError(
            f"{op}: weight has {const_int(o)} output channels, not divisible by groups={g}"
        )
    shape = _conv2d_out_shape(attrs, data.shape, weight.shape)
    _check_out_dim(op, "height", shape[2], data.shape[2])
    _check_out_dim(op, "width", shape[3], data.shape[3])
    return TensorStructInfo(shape, dtype)


def _conv2d_compute(data: Any, weight: Any, *, attrs: Conv2DAttrs) -> Any:
    """``out[n, o, y, x] = sum_{c, ry, rx} pad(data)[n, g(o) + c, y*sh + ry*dh, x*sw + rx*dw]
    * weight[o, c, ry, rx]``; padding is a separate stage ``conv2d_pad``."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else data.dtype
    n, c, h, w = data.shape
    o, ig, kh, kw = weight.shape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    shape = _conv2d_out_shape(attrs, data.shape, weight.shape)
    src = data
    if any(attrs.padding):
        zero = tir.const(data.dtype, 0)

        def pad_body(nn, cc, yy, xx):
            y, x = yy - pt, xx - pl
            inside = tir.all_of(
                ([tir.ge(y, 0)] if pt else []) + ([tir.lt(y, h)] if pb else [])
                + ([tir.ge(x, 0)] if pl else []) + ([tir.lt(x, w)] if pr else [])
            )
            val = data[nn, cc, _clamp_index(y, h, pt > 0, pb > 0),
                       _clamp_index(x, w, pl > 0, pr > 0)]
            return tir.select(inside, val, zero)

        src = te.compute((n, c, h + (pt + pb), w + (pl + pr)), pad_body, name="conv2d_pad")
    rc = te.reduce_axis((0, ig), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    groups = attrs.groups
    og = o // groups if groups > 1 else None

    def body(nn, oo, yy, xx):
        chan = rc if og is None else (oo // og) * ig + rc
        v = src[nn, chan, yy * sh + ry * dh, xx * sw + rx * dw]
        prod = tir.cast(out_dtype, v) * tir.cast(out_dtype, weight[oo, rc, ry, rx])
        return te.sum(prod, axis=[rc, ry, rx])

    return te.compute(shape, body, name="conv2d")


#: Output channels per register tile of the conv2d schedule.
CONV_OC_TILE = 4


def _schedule_conv2d(sch: Any, target: Any) -> None:
    """Output-channel tiles, accumulated in place in the outer-product order of the GEMM.

    Loops: parallel(n, oc_outer[, y]) / y / rc, ry, rx / x_outer / oc_inner (unrolled) /
    x_inner (vectorized along the output width when a vector length divides it): each input
    vector is loaded once per tap for OC_TILE output channels, whose row segments stay in L1
    across the taps. The padded input is its own stage, copied in parallel row by row.
    """
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_pad", "conv2d"})
    if "conv2d_pad" in names:  # row copies, parallel over (n, c[, y])
        pad = sch.get_block("conv2d_pad")
        parallel_outer(sch, sch.get_loops(pad)[:3], target, work=block_work(sch, pad))
    block = sch.get_block("conv2d")
    work = block_work(sch, block)
    n, o, y, x, rc, ry, rx = sch.get_loops(block)
    dtype = sch.get(block).writes[0].buffer.dtype
    ow = loop_extent(sch, x)
    xb = vector_factor(target, dtype, ow)
    vec = xb is not None
    if xb is None:
        xb = pick_factor(ow, list(range(min(16, ow or 0), 1, -1)))
    o_ext = loop_extent(sch, o)
    ob = pick_factor(o_ext, [CONV_OC_TILE, 2]) if o_ext is not None else None
    oo, oi = split_off(sch, o, ob)
    xo, xi = split_off(sch, x, xb)
    order = [n, oo, y, rc, ry, rx, xo] + [lp for lp in (oi, xi) if lp is not None]
    sch.reorder(*order)
    init = sch.decompose_reduction(block, rc)
    if oi is not None:
        sch.unroll(oi)
    if xi is not None:
        if vec:
            sch.vectorize(xi)
            init_loops = sch.get_loops(init)
            sch.vectorize(init_loops[-1])
        else:
            sch.unroll(xi)
    at = parallel_outer(sch, [n, oo, y], target, work=work)
    schedule_epilogue(sch, target, rest, at)


conv2d = register_op(
    "nn.conv2d",
    inputs=("data", "weight"),
    attrs=Conv2DAttrs,
    infer=_infer_conv2d,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_conv2d_compute,
    schedules={"c": _schedule_conv2d},
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=None,
    doc="2-d convolution, NCHW data and OIHW weight, with strides, padding (int, (v, h) or "
    "(top, left, bottom, right)), dilation and groups (depthwise when groups == channels).",
)


# =============================================================================================
# pooling
# =============================================================================================
@dataclass(frozen=True)
class MaxPool2DAttrs:
    """``pool_size``/``strides``/``dilation``: int or (h, w) (strides default to 1);
    ``padding``: int, (v, h) or (top, left, bottom, right), padded taps never win;
    ``ceil_mode``: round the output size up (the last window may be partial)."""

    pool_size: Any = (1, 1)
    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    ceil_mode: bool = False

    def __post_init__(self):
        _normalize_pool(self, "nn.max_pool2d")


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

    def __post_init__(self):
        _normalize_pool(self, "nn.avg_pool2d")
        _set(self, "count_include_pad", bool(self.count_include_pad))


def _normalize_pool(attrs: Any, op: str) -> None:
    _set(attrs, "pool_size", _pair(attrs.pool_size, op, "pool_size"))
    _set(attrs, "strides", _pair(attrs.strides, op, "strides"))
    _set(attrs, "padding", _padding(attrs.padding, op))
    _set(attrs, "dilation", _pair(attrs.dilation, op, "dilation"))
    _set(attrs, "ceil_mode", bool(attrs.ceil_mode))
    kh, kw = attrs.pool_size
    pt, pl, pb, pr = attrs.padding
    if max(pt, pb) >= (kh - 1) * attrs.dilation[0] + 1 or max(pl, pr) >= (
        kw - 1
    ) * attrs.dilation[1] + 1:
        raise KilnError(
            f"{op}: padding {attrs.padding} must be smaller than the (dilated) window "
            f"{attrs.pool_size}, or some windows would see only padding"
        )


def _pool_out_shape(attrs: Any, shape: Sequence[Any]) -> tuple:
    n, c, h, w = shape
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return (
        n, c,
        _out_dim(h, kh, sh, dh, pt, pb, attrs.ceil_mode),
        _out_dim(w, kw, sw, dw, pl, pr, attrs.ceil_mode),
    )


def _make_pool_infer(op: str, float_only: bool):
    def infer(call: Any) -> Any:
        from ..graph.struct_info import TensorStructInfo

        data = tensor_arg(call, 0, op, "data", ndim=4)
        ok = data.dtype.is_float or (not float_only and data.dtype.is_integer)
        if not ok:
            kind = "a float" if float_only else "a numeric"
            raise StructInfoError(f"{op}: data must be {kind} tensor, got dtype {data.dtype}")
        if data.shape is None:
            return TensorStructInfo(None, data.dtype, 4)
        shape = _pool_out_shape(call.attrs, data.shape)
        _check_out_dim(op, "height", shape[2], data.shape[2])
        _check_out_dim(op, "width", shape[3], data.shape[3])
        return TensorStructInfo(shape, data.dtype)

    return infer


def _window(data: Any, attrs: Any, out_shape: tuple, pad_value: Any, name: str, reducer: Any):
    """The reduction of ``data`` over each (padded, dilated) pooling window."""
    _, _, h, w = data.shape
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, _, _ = attrs.padding
    glo_h, ghi_h = _needs_guard(h, out_shape[2], kh, sh, dh, pt)
    glo_w, ghi_w = _needs_guard(w, out_shape[3], kw, sw, dw, pl)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def body(n, c, y, x):
        hy, wx = y * sh + ry * dh - pt, x * sw + rx * dw - pl
        conds = (
            ([tir.ge(hy, 0)] if glo_h else []) + ([tir.lt(hy, h)] if ghi_h else [])
            + ([tir.ge(wx, 0)] if glo_w else []) + ([tir.lt(wx, w)] if ghi_w else [])
        )
        val = data[n, c, _clamp_index(hy, h, glo_h, ghi_h), _clamp_index(wx, w, glo_w, ghi_w)]
        if conds:
            val = tir.select(tir.all_of(conds), val, pad_value)
        return reducer(val, axis=[ry, rx])

    contiguous = sw == 1 and not (glo_w or ghi_w)
    out = te.compute(out_shape, body, name=name, attrs={UNIT_STRIDE_W: contiguous})
    return out, (glo_h or ghi_h or glo_w or ghi_w)


def _max_pool2d_compute(data: Any, *, attrs: MaxPool2DAttrs) -> Any:
    """Maximum over each window; padded taps hold the dtype's lowest value."""
    shape = _pool_out_shape(attrs, data.shape)
    lowest = tir.const(data.dtype, data.dtype.min_value())
    out, _ = _window(data, attrs, shape, lowest, "max_pool2d", te.max)
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


def _avg_pool2d_compute(data: Any, *, attrs: AvgPool2DAttrs) -> Any:
    """Window sums (``avg_pool2d_sum``) divided by the number of counted taps."""
    shape = _pool_out_shape(attrs, data.shape)
    zero = tir.const(data.dtype, 0)
    acc, guarded = _window(data, attrs, shape, zero, "avg_pool2d_sum", te.sum)
    _, _, h, w = data.shape
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    if not guarded:
        return te.compute(shape, lambda n, c, y, x: acc[n, c, y, x] / tir.const(
            data.dtype, kh * kw), name="avg_pool2d")
    if attrs.count_include_pad:
        lo_h, hi_h, lo_w, hi_w = -pt, _i64(h) + pb, -pl, _i64(w) + pr
    else:
        lo_h, hi_h, lo_w, hi_w = 0, _i64(h), 0, _i64(w)

    def body(n, c, y, x):
        cnt = _tap_count(y, sh, pt, kh, dh, _i64(lo_h), hi_h) * _tap_count(
            x, sw, pl, kw, dw, _i64(lo_w), hi_w)
        return acc[n, c, y, x] / tir.cast(data.dtype, cnt)

    return te.compute(shape, body, name="avg_pool2d")


def _schedule_pool(sch: Any, target: Any) -> None:
    """Parallel over (n, c[, y]); the window loops innermost, accumulating in a register.

    When the window reads the input width contiguously (unit stride, no padding guard) the
    output width is vectorized instead: its vector loop goes under the window loops, so every
    tap is one vector load and one vector max/add. An average's division follows each
    parallel chunk of sums.
    """
    red = next(b for b in sch.get_child_blocks(sch.get_block("root")) if any(
        iv.iter_type == tir.IterType.COMM_REDUCE for iv in sch.get(b).iter_vars))
    rest = other_blocks(sch, {sch.get(red).name_hint})
    n, c, y, x, ry, rx = sch.get_loops(red)
    blk = sch.get(red)
    work = block_work(sch, red)
    factor = None
    if blk.annotations.get(UNIT_STRIDE_W, False):
        factor = vector_factor(target, blk.writes[0].buffer.dtype, loop_extent(sch, x))
    if factor is not None:
        xo, xi = split_off(sch, x, factor)
        sch.reorder(xo, ry, rx, xi)
        init = sch.decompose_reduction(red, ry)
        sch.vectorize(xi)
        sch.vectorize(sch.get_loops(init)[-1])
    else:
        sch.decompose_reduction(red, ry)
    outer = parallel_outer(sch, [n, c, y], target, work=work)
    # an average's division (and any fused consumer) follows each parallel chunk of sums
    schedule_epilogue(sch, target, rest, outer)


max_pool2d = register_op(
    "nn.max_pool2d",
    inputs=("data",),
    attrs=MaxPool2DAttrs,
    infer=_make_pool_infer("nn.max_pool2d", float_only=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_max_pool2d_compute,
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=None,
    doc="2-d max pooling over NCHW data.",
)

avg_pool2d = register_op(
    "nn.avg_pool2d",
    inputs=("data",),
    attrs=AvgPool2DAttrs,
    infer=_make_pool_infer("nn.avg_pool2d", float_only=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_avg_pool2d_compute,
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=None,
    doc="2-d average pooling over NCHW data.",
)


# ---- adaptive pooling -------------------------------------------------------------------------
@dataclass(frozen=True)
class AdaptivePool2DAttrs:
    """``output_size``: int or (h, w). Output cell ``i`` of an axis of size ``n`` pools input
    ``[floor(i*n/out), ceil((i+1)*n/out))``; ``(1, 1)`` is global pooling."""

    output_size: Any = (1, 1)

    def __post_init__(self):
        _set(self, "output_size", _pair(self.output_size, "nn.adaptive_pool2d", "output_size"))


def _infer_adaptive(op: str, float_only: bool):
    def infer(call: Any) -> Any:
        from ..graph.struct_info import TensorStructInfo

        data = tensor_arg(call, 0, op, "data", ndim=4)
        ok = data.dtype.is_float or (not float_only and data.dtype.is_integer)
        if not ok:
            raise StructInfoError(f"{op}: data must be a float tensor, got dtype {data.dtype}")
        if data.shape is None:
            return TensorStructInfo(None, data.dtype, 4)
        oh, ow = call.attrs.output_size
        return TensorStructInfo((data.shape[0], data.shape[1], oh, ow), data.dtype)

    return infer


def _adaptive_axis(size: Any, out: int) -> tuple[Any, Any, Any, bool]:
    """(start(i), end(i), max window, whether windows vary) for one adaptive axis."""
    s = const_int(size)
    if s is not None and s % out == 0:
        k = s // out
        return (lambda i: i * k), (lambda i: i * k + k), k, False
    if out == 1:
        return (lambda i: tir.const(I64, 0)), (lambda i: _i64(size)), size, False

    def start(i):
        return tir.floordiv(i * size, out)

    def end(i):
        return tir.floordiv((i + 1) * size + (out - 1), out)

    if s is not None:
        kmax = max(-(-((i + 1) * s) // out) - (i * s) // out for i in range(out))
    else:
        kmax = simplify(tir.floordiv(_i64(size) + (out - 1), out) + 1)
    return start, end, kmax, True


def _adaptive_compute(kind: str):
    def compute(data: Any, *, attrs: AdaptivePool2DAttrs) -> Any:
        n, c, h, w = data.shape
        oh, ow = attrs.output_size
        sh, eh, kh, vary_h = _adaptive_axis(h, oh)
        sw, ew, kw, vary_w = _adaptive_axis(w, ow)
        ry = te.reduce_axis((0, kh), name="ry")
        rx = te.reduce_axis((0, kw), name="rx")
        if kind == "max":
            reducer, pad = te.max, tir.const(data.dtype, data.dtype.min_value())
        else:
            reducer, pad = te.sum, tir.const(data.dtype, 0)

        def body(nn, cc, y, x):
            hy, wx = sh(y) + ry, sw(x) + rx
            conds = ([tir.lt(hy, eh(y))] if vary_h else []) + (
                [tir.lt(wx, ew(x))] if vary_w else [])
            val = data[nn, cc, tir.min(hy, _i64(h) - 1) if vary_h else hy,
                       tir.min(wx, _i64(w) - 1) if vary_w else wx]
            if conds:
                val = tir.select(tir.all_of(conds), val, pad)
            return reducer(val, axis=[ry, rx])

        name = f"adaptive_{kind}_pool2d"
        red = te.compute((n, c, oh, ow), body, name=name if kind == "max" else name + "_sum")
        if kind == "max":
            return red

        def avg(nn, cc, y, x):
            cnt = (eh(y) - sh(y)) * (ew(x) - sw(x))
            return red[nn, cc, y, x] / tir.cast(data.dtype, cnt)

        return te.compute((n, c, oh, ow), avg, name=name)

    return compute


adaptive_avg_pool2d = register_op(
    "nn.adaptive_avg_pool2d",
    inputs=("data",),
    attrs=AdaptivePool2DAttrs,
    infer=_infer_adaptive("nn.adaptive_avg_pool2d", float_only=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_compute("avg"),
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=None,
    doc="Average pooling of NCHW data to a fixed output size (global pooling for (1, 1)).",
)

adaptive_max_pool2d = register_op(
    "nn.adaptive_max_pool2d",
    inputs=("data",),
    attrs=AdaptivePool2DAttrs,
    infer=_infer_adaptive("nn.adaptive_max_pool2d", float_only=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_compute("max"),
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=None,
    doc="Max pooling of NCHW data to a fixed output size (global pooling for (1, 1)).",
)


def global_avg_pool2d(data: Any) -> Any:
    """Mean over H and W of NCHW data, keeping them as size-1 dims: ``[N, C, 1, 1]``."""
    return adaptive_avg_pool2d(data, (1, 1))


def global_max_pool2d(data: Any) -> Any:
    """Maximum over H and W of NCHW data: ``[N, C, 1, 1]``."""
    return adaptive_max_pool2d(data, (1, 1))


# =============================================================================================
# softmax / log_softmax
# =============================================================================================
@dataclass(frozen=True)
class SoftmaxAttrs:
    """``axis``: the axis normalized over (negative counts from the end)."""

    axis: int = -1

    def __post_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise KilnError(f"softmax: axis must be an int, got {self.axis!r}")


def _float_like_infer(op: str):
    def infer(call: Any) -> Any:
        from ..graph.shape_utils import normalize_axis
        from ..graph.struct_info import TensorStructInfo

        x = tensor_arg(call, 0, op, "data")
        if not x.dtype.is_float:
            raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
        if x.ndim >= 0:
            if x.ndim == 0:
                raise StructInfoError(f"{op}: data must have at least one dimension")
            normalize_axis(call.attrs.axis, x.ndim, op)
        return TensorStructInfo(x.shape, x.dtype, x.ndim)

    return infer


def _compute_dtype(dtype: DataType) -> DataType:
    """Half-precision inputs are normalized in float32 (one rounding at the end)."""
    return DataType("float32") if dtype.bits < 32 else dtype


def _drop(idx: Sequence[Any], axes: Sequence[int]) -> tuple:
    return tuple(v for d, v in enumerate(idx) if d not in axes)


def _put(idx: Sequence[Any], axis: int, value: Any) -> tuple:
    return tuple(idx[:axis]) + (value,) + tuple(idx[axis:])


def _row_max(x: Any, axis: int, ct: DataType, name: str) -> Any:
    red_shape = _drop(x.shape, [axis])
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    return te.compute(
        red_shape, lambda *i: te.max(tir.cast(ct, x[_put(i, axis, k)]), axis=k), name=name
    )


def _softmax_compute(x: Any, *, attrs: SoftmaxAttrs) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``: four stages (max, exp, sum, div)."""
    axis = attrs.axis % x.ndim
    ct = _compute_dtype(x.dtype)
    mx = _row_max(x, axis, ct, "softmax_max")
    ex = te.compute(
        x.shape, lambda *i: tir.exp(tir.cast(ct, x[i]) - mx[_drop(i, [axis])]), name="softmax_exp"
    )
    k = te.reduce_axis((0, x.shape[axis]), name="k")
    sm = te.compute(
        _drop(x.shape, [axis]), lambda *i: te.sum(ex[_put(i, axis, k)], axis=k),
        name="softmax_sum",
    )
    return te.compute(
        x.shape, lambda *i: tir.cast(x.dtype, ex[i] / sm[_drop(i, [axis])]), name="softmax",
        attrs={ROW_AXES: (axis,)},
    )


def _log_softmax_compute(x: Any, *, attrs: SoftmaxAttrs) -> Any:
    """``x - max - log(sum(exp(x - max)))`` along ``axis`` (three stages)."""
    axis = attrs.axis % x.ndim
    ct = _compute_dtype(x.dtype)
    mx = _row_max(x, axis, ct, "log_softmax_max")
    k = te.reduce_axis((0, x.shape[axis]), name="k")

    def sum_body(*i):
        return te.sum(tir.exp(tir.cast(ct, x[_put(i, axis, k)]) - mx[i]), axis=k)

    sm = te.compute(_drop(x.shape, [axis]), sum_body, name="log_softmax_sum")

    def body(*i):
        r = _drop(i, [axis])
        return tir.cast(x.dtype, tir.cast(ct, x[i]) - mx[r] - tir.log(sm[r]))

    return te.compute(x.shape, body, name="log_softmax", attrs={ROW_AXES: (axis,)})


def schedule_rows(sch: Any, target: Any, out_name: str, reduced_axes: Sequence[int]) -> None:
    """CPU schedule of a multi-stage row-wise op (softmax, log_softmax, layer_norm).

    When the reduced axes are the trailing ones, each row is independent: the output's outer
    loops are fused and run in parallel, every producer stage is computed at that loop (so a
    row's max/sum/exp are made right before its outputs), and the element-wise stages are
    vectorized along the contiguous axis. Otherwise every stage gets the generic reduction or
    injective schedule.
    """
    out = sch.get_block(out_name)
    loops = sch.get_loops(out)
    ndim = len(loops)
    n_outer = ndim - len(reduced_axes)
    trailing = sorted(reduced_axes) == list(range(n_outer, ndim))
    if not trailing or n_outer == 0:
        schedule_reduction(sch, target)
        return
    blocks = sch.get_child_blocks(sch.get_block("root"))
    names = [sch.get(b).name_hint for b in blocks]
    producers = blocks[: names.index(out_name)]
    rest = names[names.index(out_name) + 1:]
    outer = sch.fuse(*loops[:n_outer]) if n_outer > 1 else loops[0]
    for b in reversed(producers):
        sch.compute_at(b, outer)
    vectorize_inner(sch, target, out)
    for b in producers:
        blk = sch.get(b)
        if any(iv.iter_type == tir.IterType.COMM_REDUCE for iv in blk.iter_vars):
            _hoist_init(sch, b, outer)
        else:
            vectorize_inner(sch, target, b)
    work = block_work(sch, out)
    if loop_extent(sch, outer) != 1 and getattr(target, "num_threads", 0) != 1 and (
        work is None or work >= PARALLEL_MIN_WORK
    ):
        sch.parallel(outer)
    schedule_epilogue(sch, target, rest, outer)


def _hoist_init(sch: Any, block: Any, outer: Any) -> None:
    """Give a reduction computed under ``outer`` its init before its own (reduction) loops."""
    loops = sch.get_loops(block)
    outer_var = sch.get(outer).loop_var
    pos = [k for k, lp in enumerate(loops) if sch.get(lp).loop_var is outer_var]
    below = loops[pos[0] + 1:] if pos else []
    if below:
        sch.decompose_reduction(block, below[0])


def _schedule_row_op(out_name: str):
    def schedule(sch: Any, target: Any) -> None:
        block = sch.get(sch.get_block(out_name))
        axes = block.annotations.get(ROW_AXES, (len(block.iter_vars) - 1,))
        schedule_rows(sch, target, out_name, tuple(axes))

    return schedule


softmax = register_op(
    "nn.softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_softmax_compute,
    schedules={"c": _schedule_row_op("softmax")},
    mixed_precision=MixedPrecision.NEVER,
    gradient=None,
    doc="Softmax along ``axis`` (max-subtracted for stability).",
)

log_softmax = register_op(
    "nn.log_softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.log_softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_log_softmax_compute,
    schedules={"c": _schedule_row_op("log_softmax")},
    mixed_precision=MixedPrecision.NEVER,
    gradient=None,
    doc="Logarithm of the softmax along ``axis``, computed as ``x - max - log(sum(exp(x - "
    "max)))``.",
)


# =============================================================================================
# layer_norm
# =============================================================================================
@dataclass(frozen=True)
class LayerNormAttrs:
    """``axes``: the normalized axes (gamma and beta have their sizes); ``epsilon`` is added
    to the variance."""

    axes: Any = (-1,)
    epsilon: float = 1e-5

    def __post_init__(self):
        axes = self.axes
        if isinstance(axes, int) and not isinstance(axes, bool):
            axes = (axes,)
        if not isinstance(axes, Sequence) or not axes or not all(
            isinstance(a, int) and not isinstance(a, bool) for a in axes
        ):
            raise KilnError(f"nn.layer_norm: axes must be an int or a list of ints, got {axes!r}")
        _set(self, "axes", tuple(int(a) for a in axes))
        _set(self, "epsilon", float(self.epsilon))


def _infer_layer_norm(call: Any) -> Any:
    from ..graph.shape_utils import normalize_axes
    from ..graph.struct_info import TensorStructInfo

    op = "nn.layer_norm"
    x = tensor_arg(call, 0, op, "data")
    gamma = tensor_arg(call, 1, op, "gamma")
    beta = tensor_arg(call, 2, op, "beta")
    if not x.dtype.is_float:
        raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.dtype != x.dtype:
            raise StructInfoError(f"{op}: {name} has dtype {p.dtype} but data has {x.dtype}")
    if x.ndim < 0:
        return TensorStructInfo(None, x.dtype)
    axes = normalize_axes(call.attrs.axes, x.ndim, op)
    for name, p in (("gamma", gamma), ("beta", beta)):
        if p.ndim >= 0 and p.ndim != len(axes):
            raise StructInfoError(
                f"{op}: {name} must have {len(axes)} dimension(s) (one per normalized axis), "
                f"got {p.ndim}"
            )
        if p.shape is not None and x.shape is not None:
            want = tuple(x.shape[a] for a in sorted(axes))
            if any(provably_unequal(a, b) for a, b in zip(p.shape, want)):
                raise StructInfoError(
                    f"{op}: {name} has shape {fmt_shape(p.shape)} but the normalized axes of "
                    f"data {fmt_shape(x.shape)} have {fmt_shape(want)}"
                )
    return TensorStructInfo(x.shape, x.dtype, x.ndim)


def _count(shape: Sequence[Any], axes: Sequence[int], dtype: DataType) -> Any:
    """Number of elements over ``axes`` as a ``dtype`` value."""
    static, symbolic = 1, []
    for a in axes:
        if const_int(shape[a]) is not None:
            static *= const_int(shape[a])
        else:
            symbolic.append(shape[a])
    if not symbolic:
        return tir.const(dtype, static)
    total = _i64(static)
    for d in symbolic:
        total = total * d
    return tir.cast(dtype, total)


def _layer_norm_compute(x: Any, gamma: Any, beta: Any, *, attrs: LayerNormAttrs) -> Any:
    """Two passes over each group: the mean, then the mean squared deviation; then
    ``(x - mean) * rsqrt(var + eps) * gamma + beta``."""
    axes = sorted(a % x.ndim for a in attrs.axes)
    ct = _compute_dtype(x.dtype)
    red_shape = _drop(x.shape, axes)
    inv_n = tir.const(ct, 1.0) / _count(x.shape, axes, ct)

    def full_index(i: Sequence[Any], ks: Sequence[Any]) -> tuple:
        it, kt = iter(i), iter(ks)
        return tuple(next(kt) if d in axes else next(it) for d in range(x.ndim))

    ks = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
    total = te.compute(
        red_shape, lambda *i: te.sum(tir.cast(ct, x[full_index(i, ks)]), axis=ks),
        name="layer_norm_sum",
    )
    ks2 = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]

    def sq_body(*i):
        dev = tir.cast(ct, x[full_index(i, ks2)]) - total[i] * inv_n
        return te.sum(dev * dev, axis=ks2)

    sq = te.compute(red_shape, sq_body, name="layer_norm_sqsum")
    eps = tir.const(ct, attrs.epsilon)

    def body(*i):
        r = _drop(i, axes)
        p = tuple(i[a] for a in axes)
        norm = (tir.cast(ct, x[i]) - total[r] * inv_n) * tir.rsqrt(sq[r] * inv_n + eps)
        return tir.cast(x.dtype, norm * tir.cast(ct, gamma[p]) + tir.cast(ct, beta[p]))

    return te.compute(x.shape, body, name="layer_norm", attrs={ROW_AXES: tuple(axes)})


layer_norm = register_op(
    "nn.layer_norm",
    inputs=("data", "gamma", "beta"),
    attrs=LayerNormAttrs,
    infer=_infer_layer_norm,
    pattern=OpPattern.OPAQUE,
    compute=_layer_norm_compute,
    schedules={"c": _schedule_row_op("layer_norm")},
    mixed_precision=MixedPrecision.NEVER,
    gradient=None,
    doc="Layer normalization over ``axes`` with scale ``gamma`` and shift ``beta``.",
)


# =============================================================================================
# batch_norm (inference)
# =============================================================================================
@dataclass(frozen=True)
class BatchNormAttrs:
    """``axis``: the channel axis; ``epsilon`` is added to the variance."""

    axis: int = 1
    epsilon: float = 1e-5

    def __post_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            raise KilnError(f"nn.batch_norm: axis must be an int, got {self.axis!r}")
        _set(self, "epsilon", float(self.epsilon))


_BN_PARAMS = ("gamma", "beta", "moving_mean", "moving_var")


def _infer_batch_norm(call: Any) -> Any:
    from ..graph.shape_utils import normalize_axis
    from ..graph.struct_info import TensorStructInfo

    op = "nn.batch_norm"
    x = tensor_arg(call, 0, op, "data")
    if not x.dtype.is_float:
        raise StructInfoError(f"{op}: data must be a float tensor, got dtype {x.dtype}")
    params = [tensor_arg(call, i + 1, op, n, ndim=1) for i, n in enumerate(_BN_PARAMS)]
    for name, p in zip(_BN_PARAMS, params):
        if p.dtype != x.dtype:
            raise StructInfoError(f"{op}: {name} has dtype {p.dtype} but data has {x.dtype}")
    if x.ndim < 0:
        return TensorStructInfo(None, x.dtype)
    axis = normalize_axis(call.attrs.axis, x.ndim, op)
    if x.shape is not None:
        c = x.shape[axis]
        for name, p in zip(_BN_PARAMS, params):
            if p.shape is not None and provably_unequal(p.shape[0], c):
                raise StructInfoError(
                    f"{op}: {name} has {fmt_dim(p.shape[0])} elements but data "
                    f"{fmt_shape(x.shape)} has {fmt_dim(c)} channels on axis {axis}"
                )
    return TensorStructInfo(x.shape, x.dtype, x.ndim)


def _batch_norm_compute(x: Any, gamma: Any, beta: Any, mean: Any, var: Any, *,
                        attrs: BatchNormAttrs) -> Any:
    """``(x - mean[c]) * gamma[c] / sqrt(var[c] + eps) + beta[c]`` along the channel axis."""
    axis = attrs.axis % x.ndim
    ct = _compute_dtype(x.dtype)
    eps = tir.const(ct, attrs.epsilon)

    def body(*i):
        c = i[axis]

        def p(t: Any) -> Any:
            return tir.cast(ct, t[c])

        scale = p(gamma) * tir.rsqrt(p(var) + eps)
        return tir.cast(x.dtype, (tir.cast(ct, x[i]) - p(mean)) * scale + p(beta))

    return te.compute(x.shape, body, name="batch_norm")


batch_norm = register_op(
    "nn.batch_norm",
    inputs=("data", *_BN_PARAMS),
    attrs=BatchNormAttrs,
    infer=_infer_batch_norm,
    pattern=OpPattern.BROADCAST,
    compute=_batch_norm_compute,
    schedules={"c": schedule_injective},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=None,
    doc="Batch normalization in inference form: normalizes with the given moving statistics "
    "(no batch statistics are computed or updated) and returns only the normalized tensor.",
)


# =============================================================================================
# dropout (inference)
# =============================================================================================
@dataclass(frozen=True)
class DropoutAttrs:
    """``rate``: the training-time drop probability (unused in inference)."""

    rate: float = 0.5

    def __post_init__(self):
        rate = float(self.rate)
        if not 0.0 <= rate < 1.0:
            raise KilnError(f"nn.dropout: rate must be in [0, 1), got {self.rate!r}")
        _set(self, "rate", rate)


def _infer_dropout(call: Any) -> Any:
    from ..graph.struct_info import TensorStructInfo

    x = tensor_arg(call, 0, "nn.dropout", "data")
    return TensorStructInfo(x.shape, x.dtype, x.ndim)


dropout = register_op(
    "nn.dropout",
    inputs=("data",),
    attrs=DropoutAttrs,
    infer=_infer_dropout,
    pattern=OpPattern.ELEMWISE,
    compute=lambda x, *, attrs: te.compute(x.shape, lambda *i: x[i], name="dropout"),
    schedules={"c": schedule_injective},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=None,
    doc="Dropout in inference form: the identity (training-time dropping is not modelled).",
)
