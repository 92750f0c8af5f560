"""Neural-network operators: convolution, pooling, softmax, normalization, dropout.

Registry names are ``nn.<name>``; this module is also the ``kiln.op.nn`` namespace, so it
re-exports the activations declared with the element-wise ops (``nn.relu``, ``nn.gelu``...).

Layouts (see ``kiln.op.layout``) are NCHW for data and OIHW for convolution weights by default;
``conv2d`` also takes other ``data_layout``/``kernel_layout`` permutations (NHWC/HWIO has its
own CPU schedule, vectorized along the output channels), pooling any ``layout`` with unsplit H
and W (NCHW, NHWC, NCHW8c: the other axes are carried through), and ``conv2d_nchwc`` works on
channel-blocked NCHW[x]c data (``groups`` too) and ``depthwise_conv2d_nchwc`` does depthwise
convolutions on it; they are what ``conv2d``'s CPU ``alter_layout`` hook asks for, so the
AlterOpLayout pass can turn convolutions into them. Padding is given as one int, two values
``(vertical, horizontal)``, or four values ``(top, left, bottom, right)``.

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
from typing import Any, ClassVar

from .. import te, tir
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir.stmt import FMA_IN_REGISTERS, JAM_TAILS
from .elementwise import (  # noqa: F401  (kiln.op.nn.relu ...)
    assume,
    equal_dims,
    gelu,
    relu,
    sigmoid,
    silu,
    tanh,
)
from .layout import Layout, LayoutRewrite, as_layout
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
    tiles_to_fill,
    vector_factor,
    vectorize_inner,
    write_out_tile,
)
from .registry import MixedPrecision, OpPattern, register_op
from .schedule_helpers import (
    PARALLEL_MIN_WORK,
    schedule_injective,
    schedule_reduction,
    target_threads,
)

__all__ = [
    "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool2d", "batch_norm", "conv2d",
    "conv2d_nchwc", "depthwise_conv2d_nchwc",
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
#: ``(data_layout, kernel_layout)`` of a convolution not in NCHW/OIHW, for its schedule.
CONV_LAYOUTS = "kiln.conv_layouts"
#: A pooling window's innermost axis is one it carries through (channels of NHWC, NCHW8c), so
#: it can be vectorized with contiguous loads.
CARRIED_INNER = "kiln.carried_inner"


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
def _plain_layout(value: Any, op: str, what: str, axes: str) -> str:
    """A layout attribute that must be a permutation of ``axes`` (no blocked axes)."""
    lay = as_layout(value, op, what)
    if lay.is_split() or sorted(lay.primal) != sorted(axes):
        raise KilnError(
            f"{op}: {what} must be a permutation of {axes!r} (like 'NHWC' or 'HWIO'), got "
            f"{value!r}"
        )
    return lay.name


def _pick(shape: Sequence[Any], layout: Layout, letters: str) -> tuple:
    """The dims of ``shape`` (stored in ``layout``) for ``letters``, in that order."""
    return tuple(shape[layout.index(a)] for a in letters)


def _place(layout: Layout, values: dict[str, Any]) -> tuple:
    """A tuple in ``layout`` order from values given by axis letter."""
    return tuple(values[a] for a, _ in layout.axes)


@dataclass(frozen=True)
class Conv2DAttrs:
    """2-d convolution; data in ``data_layout`` (default NCHW, also NHWC or any permutation),
    weight in ``kernel_layout`` (default OIHW, also HWIO or any permutation); the result has
    the data's layout.

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
    data_layout: str = "NCHW"
    kernel_layout: str = "OIHW"

    def __post_init__(self):
        _set(self, "strides", _pair(self.strides, "nn.conv2d", "strides"))
        _set(self, "padding", _padding(self.padding, "nn.conv2d"))
        _set(self, "dilation", _pair(self.dilation, "nn.conv2d", "dilation"))
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise KilnError(f"nn.conv2d: groups must be a positive int, got {self.groups!r}")
        _set(self, "out_dtype", norm_dtype(self.out_dtype, "nn.conv2d"))
        _set(self, "data_layout", _plain_layout(self.data_layout, "nn.conv2d", "data_layout",
                                                "NCHW"))
        _set(self, "kernel_layout", _plain_layout(self.kernel_layout, "nn.conv2d",
                                                  "kernel_layout", "OIHW"))


def _conv_hw(attrs: Any, h: Any, w: Any, kh: Any, kw: Any) -> tuple[Any, Any]:
    """Output height and width of a convolution window."""
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return _out_dim(h, kh, sh, dh, pt, pb), _out_dim(w, kw, sw, dw, pl, pr)


def _conv2d_out_shape(attrs: Conv2DAttrs, dshape: Sequence[Any], wshape: Sequence[Any]) -> tuple:
    dl, kl = Layout(attrs.data_layout), Layout(attrs.kernel_layout)
    n, _, h, w = _pick(dshape, dl, "NCHW")
    o, _, kh, kw = _pick(wshape, kl, "OIHW")
    oh, ow = _conv_hw(attrs, h, w, kh, kw)
    return _place(dl, {"N": n, "C": o, "H": oh, "W": ow})


def _infer_conv2d(call: Any) -> Any:
    from ..graph.struct_info import TensorStructInfo

    op = "nn.conv2d"
    data = tensor_arg(call, 0, op, "data", ndim=4)
    weight = tensor_arg(call, 1, op, "weight", ndim=4)
    attrs: Conv2DAttrs = call.attrs
    dtype = result_dtype(op, attr_out_dtype(call), ("data", data), ("weight", weight))
    if data.shape is None or weight.shape is None:
        return TensorStructInfo(None, dtype, 4)
    dl, kl = Layout(attrs.data_layout), Layout(attrs.kernel_layout)
    g = attrs.groups
    c, h, w = _pick(data.shape, dl, "CHW")
    o, ig = _pick(weight.shape, kl, "OI")
    if const_int(c) is not None and const_int(ig) is not None:
        if const_int(c) != const_int(ig) * g:
            raise StructInfoError(
                f"{op}: data has {const_int(c)} channels but weight expects "
                f"{const_int(ig) * g} (groups={g}, weight {fmt_shape(weight.shape)} "
                f"{kl.name})"
            )
    elif g == 1 and provably_unequal(c, ig):
        raise StructInfoError(f"{op}: data has {fmt_dim(c)} channels but weight expects "
                              f"{fmt_dim(ig)} (groups=1)")
    if const_int(o) is not None and const_int(o) % g != 0:
        raise StructInfoError(
            f"{op}: weight has {const_int(o)} output channels, not divisible by groups={g}"
        )
    shape = _conv2d_out_shape(attrs, data.shape, weight.shape)
    _check_out_dim(op, "height", shape[dl.index("H")], h)
    _check_out_dim(op, "width", shape[dl.index("W")], w)
    return TensorStructInfo(shape, dtype)


def _pad_hw(data: Any, hi: int, wi: int, padding: tuple[int, int, int, int], name: str,
            dtype: Any = None) -> Any:
    """``data`` zero-padded along axes ``hi`` and ``wi`` (a separate stage), or ``data``; the
    padded copy holds ``dtype`` values (default: the data's)."""
    if not any(padding):
        return data
    pt, pl, pb, pr = padding
    h, w = data.shape[hi], data.shape[wi]
    dtype = as_dtype(dtype) if dtype is not None else data.dtype
    zero = tir.const(dtype, 0)

    def pad_body(*idx):
        y, x = idx[hi] - pt, idx[wi] - pl
        inside = tir.all_of(
            ([tir.ge(y, 0)] if pt else []) + ([tir.lt(y, h)] if pb else [])
            + ([tir.ge(x, 0)] if pl else []) + ([tir.lt(x, w)] if pr else [])
        )
        src = list(idx)
        src[hi] = _clamp_index(y, h, pt > 0, pb > 0)
        src[wi] = _clamp_index(x, w, pl > 0, pr > 0)
        return tir.select(inside, tir.cast(dtype, data[tuple(src)]), zero)

    shape = list(data.shape)
    shape[hi] = h + (pt + pb)
    shape[wi] = w + (pl + pr)
    return te.compute(tuple(shape), pad_body, name=name)


def _conv2d_compute(data: Any, weight: Any, *, attrs: Conv2DAttrs) -> Any:
    """``out[n, o, y, x] = sum_{c, ry, rx} pad(data)[n, g(o) + c, y*sh + ry*dh, x*sw + rx*dw]
    * weight[o, c, ry, rx]`` (indices placed by the layouts); padding is a separate stage
    ``conv2d_pad``."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else data.dtype
    dl, kl = Layout(attrs.data_layout), Layout(attrs.kernel_layout)
    o, ig, kh, kw = _pick(weight.shape, kl, "OIHW")
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    shape = _conv2d_out_shape(attrs, data.shape, weight.shape)
    # float16/bfloat16 data accumulated in float32 is widened once, in the padded copy, not
    # at every tap of the inner loop
    widen = data.dtype.is_float and out_dtype.is_float and data.dtype.bits < out_dtype.bits
    src = _pad_hw(data, dl.index("H"), dl.index("W"), attrs.padding, "conv2d_pad",
                  out_dtype if widen else None)
    rc = te.reduce_axis((0, ig), name="rc")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    groups = attrs.groups
    og = o // groups if groups > 1 else None

    def body(*idx):
        nn, oo, yy, xx = _pick(idx, dl, "NCHW")
        chan = rc if og is None else (oo // og) * ig + rc
        v = src[_place(dl, {"N": nn, "C": chan, "H": yy * sh + ry * dh, "W": xx * sw + rx * dw})]
        wv = weight[_place(kl, {"O": oo, "I": rc, "H": ry, "W": rx})]
        prod = tir.cast(out_dtype, v) * tir.cast(out_dtype, wv)
        return te.sum(prod, axis=[rc, ry, rx])

    layouts = (dl.name, kl.name)
    ann = {} if layouts == ("NCHW", "OIHW") else {CONV_LAYOUTS: layouts}
    (c,) = _pick(data.shape, dl, "C")
    ann |= assume(equal_dims([(c, simplify(ig * groups), f"nn.conv2d: data has {fmt_dim(c)} "
                               f"channels but the weight expects {fmt_dim(ig)} x "
                               f"groups={groups}")]))
    return te.compute(shape, body, name="conv2d", attrs=ann)


#: Output channels per register tile of the conv2d schedule.
CONV_OC_TILE = 4
#: Candidate lengths of the output-width register tile of the channel-vectorized schedules.
CONV_X_TILES = [8, 7, 6, 5, 4, 3, 2]



def _schedule_conv2d(sch: Any, target: Any) -> None:
    """CPU schedule of nn.conv2d, by layout: NCHW data with an OIHW weight
    (:func:`_schedule_conv2d_nchw`), channels-last data with O the weight's last axis (NHWC +
    HWIO, :func:`_schedule_conv2d_nhwc`), else the generic reduction schedule."""
    layouts = sch.get(sch.get_block("conv2d")).annotations.get(CONV_LAYOUTS, ("NCHW", "OIHW"))
    if tuple(layouts) == ("NCHW", "OIHW"):
        _schedule_conv2d_nchw(sch, target)
    elif layouts[0] == "NHWC" and layouts[1][-1] == "O":
        _schedule_conv2d_nhwc(sch, target)
    else:
        schedule_reduction(sch, target)


def _schedule_pad(sch: Any, target: Any, name: str, names: set[str]) -> None:
    """Padded copy of the input: parallel over its three outer axes."""
    if name in names:
        pad = sch.get_block(name)
        parallel_outer(sch, sch.get_loops(pad)[:3], target, work=block_work(sch, pad))


def _schedule_conv2d_nchw(sch: Any, target: Any) -> None:
    """Output-channel tiles, accumulated in place in the outer-product order of the GEMM.

    Loops: parallel(n, oc_outer[, y]) / y / rc, ry, rx / x_outer / oc_inner (unrolled) /
    x_inner (vectorized along the output width when a vector length divides it): each input
    vector is loaded once per tap for OC_TILE output channels, whose row segments stay in L1
    across the taps. The padded input is its own stage, copied in parallel row by row.
    """
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_pad", "conv2d"})
    _schedule_pad(sch, target, "conv2d_pad", names)
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


def _vector_channels(sch: Any, target: Any, block: Any, loop: Any) -> tuple[Any, Any, bool]:
    """Split a vector off the contiguous channel ``loop``: ``(outer, inner, vectorizable)``."""
    dtype = sch.get(block).writes[0].buffer.dtype
    ext = loop_extent(sch, loop)
    f = vector_factor(target, dtype, ext)
    if f is None:
        return None, loop, False
    if f == ext:
        return None, loop, True
    outer, inner = sch.split(loop, factors=[None, f])
    return outer, inner, True


def _schedule_channels_last(sch: Any, target: Any, block: Any, spatial: list[Any],
                            c_loop: Any, reduce: list[Any], rest: list[str]) -> None:
    """Shared nest of the channel-vectorized convolutions (NHWC, NCHWc).

    Loops: parallel(spatial outer...) / x_outer / [channel vectors] / reduce... / x_inner
    (unrolled) / channel lanes (vectorized): each weight vector is loaded once per tap for a
    row segment of outputs, each input element broadcast across the lanes. ``spatial`` are the
    outer output loops, the last of them the output width.
    """
    work = block_work(sch, block)
    x = spatial[-1]
    xo, xi = split_off(sch, x, pick_factor(loop_extent(sch, x), CONV_X_TILES))
    co, ci, vec = _vector_channels(sch, target, block, c_loop)
    order = [*spatial[:-1], xo] + ([co] if co is not None else []) + list(reduce)
    order += [lp for lp in (xi, ci) if lp is not None]
    sch.reorder(*order)
    init = sch.decompose_reduction(block, reduce[0])
    if xi is not None:
        sch.unroll(xi)
    if vec:
        sch.vectorize(ci)
        sch.vectorize(sch.get_loops(init)[-1])
    at = parallel_outer(sch, spatial[:-1], target, work=work)
    schedule_epilogue(sch, target, rest, at)


def _schedule_conv2d_nhwc(sch: Any, target: Any) -> None:
    """NHWC data, weight with O innermost (HWIO): vectors along the output channels."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_pad", "conv2d"})
    _schedule_pad(sch, target, "conv2d_pad", names)
    block = sch.get_block("conv2d")
    n, y, x, o, rc, ry, rx = sch.get_loops(block)
    _schedule_channels_last(sch, target, block, [n, y, x], o, [ry, rx, rc], rest)


def _alter_conv2d_c(call: Any, target: Any) -> LayoutRewrite | None:
    """On CPUs, a float32 NCHW/OIHW convolution (groups=1) becomes ``nn.conv2d_nchwc`` with
    output channels in blocks of one SIMD vector (when the vector length divides them) and
    input channels in blocks of the largest divisor of the channel count up to that length;
    depthwise and grouped ones go to :func:`_alter_grouped_conv2d_c`."""
    attrs: Conv2DAttrs = call.attrs
    data, weight = call.args[0].struct_info, call.args[1].struct_info
    if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW"):
        return None
    if data.shape is None or not weight.is_static or attrs.out_dtype not in (None, "float32"):
        return None
    if data.dtype != "float32" or weight.dtype != "float32":
        return None
    lanes = vector = target.vector_lanes("float32")
    o, c = weight.static_shape()[0], const_int(data.shape[1])
    if attrs.groups == 1 and lanes >= 16 and o % lanes and o % (lanes // 2) == 0:
        # half a vector: MobileNetV2's 24-channel projections on AVX-512, which otherwise
        # stay NCHW between two layout transforms (0.26 ms of its 2.8 ms, 0.11 ms this way)
        lanes //= 2
    if lanes < 2 or o % lanes or c is None:
        return None
    if attrs.groups != 1:
        return _alter_grouped_conv2d_c(attrs, c, o, lanes)
    ic = max(d for d in range(1, min(vector, c) + 1) if c % d == 0)

    def build(d: Any, w: Any) -> Any:
        return conv2d_nchwc(d, w, strides=attrs.strides, padding=attrs.padding,
                            dilation=attrs.dilation, out_dtype=attrs.out_dtype)

    return LayoutRewrite(
        inputs=(("NCHW", f"NCHW{ic}c"), ("OIHW", f"OIHW{ic}i{lanes}o")),
        output=("NCHW", f"NCHW{lanes}c"),
        build=build,
    )


def _alter_grouped_conv2d_c(attrs: Conv2DAttrs, c: int, o: int,
                            lanes: int) -> LayoutRewrite | None:
    """A float32 grouped convolution with ``c`` input and ``o`` output channels (``o`` a
    multiple of ``lanes``) in blocks of ``lanes`` channels, so it stays in the NCHW[lanes]c of
    its neighbours: a depthwise one (``groups == c == o``) becomes
    ``nn.depthwise_conv2d_nchwc``; one whose groups have a multiple of ``lanes`` input and
    output channels each becomes a grouped ``nn.conv2d_nchwc``; the others stay NCHW."""
    g = attrs.groups
    window = {"strides": attrs.strides, "padding": attrs.padding, "dilation": attrs.dilation,
              "out_dtype": attrs.out_dtype}
    data_layout = ("NCHW", f"NCHW{lanes}c")
    if g == c == o:
        return LayoutRewrite(
            inputs=(data_layout, ("OIHW", f"OIHW{lanes}o")),
            output=data_layout,
            build=lambda d, w: depthwise_conv2d_nchwc(d, w, **window),
        )
    if c % g or (c // g) % lanes or (o // g) % lanes:
        return None
    return LayoutRewrite(
        inputs=(data_layout, ("OIHW", f"OIHW{lanes}i{lanes}o")),
        output=data_layout,
        build=lambda d, w: conv2d_nchwc(d, w, groups=g, **window),
    )


def _is_float_arg(x: Any) -> bool:
    return as_dtype(x.struct_info.dtype).is_float


def _permute(x: Any, perm: Sequence[int]) -> Any:
    """``x`` transposed by ``perm`` (nothing for the identity)."""
    from .shape import transpose

    return x if list(perm) == list(range(len(perm))) else transpose(x, tuple(perm))


def _inverse(perm: Sequence[int]) -> list[int]:
    return [list(perm).index(d) for d in range(len(perm))]


def _conv_adjoints(g: Any, x: Any, w: Any, attrs: Any, groups: int) -> tuple[Any, Any]:
    """(d data, d weight) of an NCHW/OIHW convolution, computed in ``g``'s dtype (``g``,
    ``x`` and ``w`` are normalized expressions)."""
    from .grad import cast_to, conv2d_backward_data, conv2d_backward_weight

    gdt = g.struct_info.dtype
    kw = {"strides": attrs.strides, "padding": attrs.padding, "dilation": attrs.dilation,
          "groups": groups}
    xc, wc = cast_to(x, gdt, x.struct_info.dtype), cast_to(w, gdt, w.struct_info.dtype)
    return conv2d_backward_data(g, wc, x, **kw), conv2d_backward_weight(g, xc, w, **kw)


def _conv2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Adjoints through ``nn.conv2d_backward_data``/``_weight`` (NCHW/OIHW; other layouts
    are transposed there and back), computed in the result's dtype and cast back."""
    from .grad import fit_to

    x, w = call.args
    if not (_is_float_arg(x) and _is_float_arg(w)):
        return [None, None]
    attrs = call.attrs
    dl, kl = Layout(attrs.data_layout), Layout(attrs.kernel_layout)
    to_d = [dl.index(a) for a in "NCHW"]
    to_k = [kl.index(a) for a in "OIHW"]
    g = bb.normalize(_permute(output_grad, to_d))
    xn, wn = bb.normalize(_permute(x, to_d)), bb.normalize(_permute(w, to_k))
    dx, dw = _conv_adjoints(g, xn, wn, attrs, attrs.groups)
    return [fit_to(bb, _permute(dx, _inverse(to_d)), x),
            fit_to(bb, _permute(dw, _inverse(to_k)), w)]


conv2d = register_op(
    "nn.conv2d",
    inputs=("data", "weight"),
    attrs=Conv2DAttrs,
    infer=_infer_conv2d,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_conv2d_compute,
    schedules={"c": _schedule_conv2d},
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv2d_grad,
    alter_layout={"c": _alter_conv2d_c},
    doc="2-d convolution with strides, padding (int, (v, h) or (top, left, bottom, right)), "
    "dilation and groups (depthwise when groups == channels); NCHW data and OIHW weight by "
    "default (``data_layout``/``kernel_layout``: e.g. NHWC and HWIO).",
)


# ---- conv2d on channel-blocked data -----------------------------------------------------------
@dataclass(frozen=True)
class _BlockedConvAttrs:
    """Window attributes shared by the channel-blocked convolutions (``OP`` names the op in
    errors): ``strides``, ``padding``, ``dilation``, ``out_dtype`` as in :class:`Conv2DAttrs`."""

    OP: ClassVar[str] = "nn.conv2d_nchwc"

    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    out_dtype: str | None = None

    def __post_init__(self):
        op = self.OP
        _set(self, "strides", _pair(self.strides, op, "strides"))
        _set(self, "padding", _padding(self.padding, op))
        _set(self, "dilation", _pair(self.dilation, op, "dilation"))
        _set(self, "out_dtype", norm_dtype(self.out_dtype, op))


@dataclass(frozen=True)
class Conv2DNCHWcAttrs(_BlockedConvAttrs):
    """Convolution of NCHW[x]c data with an OIHW[x]i[y]o weight into NCHW[y]c; the block sizes
    come from the shapes. ``groups``: input and output channels split into that many groups,
    each group's channel counts a multiple of its block size (the weight's I axis is the
    channels of one group)."""

    groups: int = 1

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise KilnError(f"{self.OP}: groups must be a positive int, got {self.groups!r}")


def _infer_conv2d_nchwc(call: Any) -> Any:
    from ..graph.struct_info import TensorStructInfo

    op = "nn.conv2d_nchwc"
    data = tensor_arg(call, 0, op, "data", ndim=5)
    weight = tensor_arg(call, 1, op, "weight", ndim=6)
    dtype = result_dtype(op, attr_out_dtype(call), ("data", data), ("weight", weight))
    if data.shape is None or weight.shape is None:
        return TensorStructInfo(None, dtype, 5)
    n, cb, h, w, ic = data.shape
    ob, wcb, kh, kw, wic, oc = weight.shape
    groups = call.attrs.groups
    if groups > 1:
        _check_groups(op, groups, cb, wcb, ob)
        wcb = cb
    for what, a, b in (("input channel blocks", cb, wcb), ("input channel block size", ic, wic)):
        if provably_unequal(a, b):
            raise StructInfoError(
                f"{op}: data {fmt_shape(data.shape)} (NCHW[x]c) has {fmt_dim(a)} {what} but "
                f"weight {fmt_shape(weight.shape)} (OIHW[x]i[y]o) has {fmt_dim(b)}"
            )
    oh, ow = _conv_hw(call.attrs, h, w, kh, kw)
    _check_out_dim(op, "height", oh, h)
    _check_out_dim(op, "width", ow, w)
    return TensorStructInfo((n, ob, oh, ow, oc), dtype)


def _check_groups(op: str, groups: int, cb: Any, wcb: Any, ob: Any) -> None:
    """Grouped blocked convolution: the data's channel blocks are ``groups`` times the weight's
    (per group), and the output channel blocks split evenly into the groups."""
    cbs, wcbs, obs = const_int(cb), const_int(wcb), const_int(ob)
    if cbs is not None and wcbs is not None and cbs != wcbs * groups:
        raise StructInfoError(
            f"{op}: data has {cbs} channel blocks but the weight expects {wcbs} per group "
            f"x groups={groups}"
        )
    if obs is not None and obs % groups:
        raise StructInfoError(
            f"{op}: {obs} output channel blocks do not split into groups={groups} (each group's "
            "output channels must be a multiple of the output block)"
        )


def _conv2d_nchwc_compute(data: Any, weight: Any, *, attrs: Conv2DNCHWcAttrs) -> Any:
    """``out[n, ob, y, x, oi] = sum_{cb, ry, rx, ci} pad(data)[n, g(ob) + cb, y*sh + ry*dh,
    x*sw + rx*dw, ci] * weight[ob, cb, ry, rx, ci, oi]``, ``g(ob)`` the first channel block of
    output block ``ob``'s group (0 without groups)."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else data.dtype
    n, _, h, w, ic = data.shape
    ob, cb, kh, kw, _, oc = weight.shape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh, ow = _conv_hw(attrs, h, w, kh, kw)
    src = _pad_hw(data, 2, 3, attrs.padding, "conv2d_nchwc_pad")
    rco = te.reduce_axis((0, cb), name="rco")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    rci = te.reduce_axis((0, ic), name="rci")
    groups = attrs.groups
    ob_per_group = ob // groups if groups > 1 else None

    def body(nn, oo, yy, xx, oi):
        chan = rco if ob_per_group is None else (oo // ob_per_group) * cb + rco
        v = src[nn, chan, yy * sh + ry * dh, xx * sw + rx * dw, rci]
        prod = tir.cast(out_dtype, v) * tir.cast(out_dtype, weight[oo, rco, ry, rx, rci, oi])
        return te.sum(prod, axis=[rco, ry, rx, rci])

    op = "nn.conv2d_nchwc"
    checks = equal_dims([
        (data.shape[1], simplify(cb * groups), f"{op}: data has {fmt_dim(data.shape[1])} channel "
                                               f"blocks but the weight expects {fmt_dim(cb)} x "
                                               f"groups={groups}"),
        (ic, weight.shape[4], f"{op}: data's channel block is {fmt_dim(ic)} but the weight's "
                              f"is {fmt_dim(weight.shape[4])}")])
    return te.compute((n, ob, oh, ow, oc), body, name="conv2d_nchwc", attrs=assume(checks))


#: Register tiles of the NCHWc convolution, (output pixels along the row, output channel
#: blocks of one vector), per vector length in float32 lanes: ``(wide, narrow)``. The wide
#: tiles are tried first, in order, each taken when the row splits into such tiles with at
#: most :data:`CONV_TILE_WASTE` of the last one predicated off (loop partitioning gives that
#: last tile its own code, so the cost is a narrower tile, not wasted FMAs); else the first
#: narrow tile whose sizes divide the row and the block count.
#:
#: AVX2 (8 lanes, 16 registers): 6 x 2 = 12 accumulators, which with the 2 weight vectors
#: and the broadcast input fill the registers. The input channels of a block (``rci``) are
#: unrolled under the tile: against a loop of 8, paired-call timing (2 threads, Zen 3) gives
#: 0.90/0.87/0.87/0.72 of the time on ResNet-18's 3x3 convs at 56/28/14/7-pixel rows and
#: 0.89-0.97 on 1x1 convs; unrolling the kernel's width as well made them slower (up to 2.9x,
#: register spills). With that unrolling, against 7 x 1 tiles (which divide the 14/7-pixel
#: rows): 6 x 2 (a 2-pixel tail) 0.84-0.86 on 14-pixel rows (ResNet-18's 3x3 at 256
#: channels, MobileNetV2's 1x1), 5 x 2 0.91-0.97 on 7-pixel rows.
#:
#: With the tile's FMAs in registers (``FMA_IN_REGISTERS``) and small row tails jammed
#: (``JAM_TAILS``), 4 x 2 tiles (which divide 56 and 28) took 1.06 / 1.04 / 0.98 / 1.02 of the
#: time of these at 56 / 28 / 14 / 7-pixel rows.
#:
#: AVX-512 (16 lanes, 32 registers): 7 x 2 = 14 accumulators divides ResNet's 112/56/28/14/7
#: pixel rows. Against the AVX2 tiles (2 threads, Zen 5, conv + bias + ReLU, interleaved
#: runs): 0.95 / 0.95 / 0.84 / 0.70 of the time on the 3x3 convs at 56/28/14/7-pixel rows,
#: 0.92 / 0.84 / 0.78 on the strided ones, 0.94 on the 7x7 stem and on a 1x1 at 14 pixels;
#: 8 x 2 first was 1.10-1.12 at 28 pixels (a 4-pixel tail), 6 x 4 (24 accumulators)
#: 1.06-1.09 there.
CONV_NCHWC_TILES: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {
    8: ([(6, 2), (5, 2)],
        [(6, 2), (8, 1), (7, 1), (6, 1), (5, 1), (4, 1), (3, 1), (2, 1)]),
    16: ([(7, 2), (8, 2), (6, 2)],
         [(7, 2), (8, 1), (7, 1), (6, 1), (5, 1), (4, 1), (3, 1), (2, 1)]),
}
CONV_TILE_WASTE = 0.3


def _nchwc_tile(ow: int | None, ob: int | None, lanes: int = 8) -> tuple[int, int]:
    """The register tile for a row of ``ow`` pixels and ``ob`` output channel blocks of
    ``lanes`` float32 lanes (other vector lengths take the AVX2 tiles)."""
    wide_tiles, tiles = CONV_NCHWC_TILES.get(lanes, CONV_NCHWC_TILES[8])
    if ow is None or ob is None:
        return min(tiles[0][0], ow or tiles[0][0]), 1
    for xt, bt in wide_tiles:
        padded = -(-ow // xt) * xt
        if ob % bt == 0 and ow >= xt and (padded - ow) / padded <= CONV_TILE_WASTE:
            return xt, bt
    for xt, bt in tiles:
        if ow % xt == 0 and ob % bt == 0:
            return xt, bt
    return min(tiles[0][0], ow), 1


def _tail_jam(ow: int | None, xt: int, bt: int) -> int | None:
    """How many rows' tail tiles to run together (``JAM_TAILS``) for a row of ``ow`` pixels in
    tiles of ``xt`` pixels x ``bt`` blocks; None when there is no tail or it has
    :data:`~kiln.op.linalg.TILE_MIN_ACCUMULATORS` already (a 2-pixel x 2-block tail: 4).
    Paired-call timing (2 threads, Zen 3), jammed against not, on ResNet-18's 3x3 convs: 0.91
    of the time at 7 x 7 x 512 (5-pixel tiles and a 2-pixel tail, 2/7 of the work, which had
    taken 44% of the time), 0.94-0.96 at 14 x 14 x 256, 0.95 at 56 x 56 x 64 (rows shared by
    the threads in blocks of 4)."""
    if ow is None or xt < 2 or ow % xt == 0:
        return None
    return tiles_to_fill((ow % xt) * bt)


#: Weight size (bytes) up to which the threads of a convolution share its output rows even
#: when the input is the smaller operand (see :func:`_rows_outer`).
CONV_ROWS_MAX_WEIGHT_BYTES = 1 << 20
CONV_ROW_BLOCK = 4


def _rows_outer(sch: Any, block: Any, rows: int | None, target: Any) -> bool:
    """Whether the threads of a convolution should share its output rows (each running every
    output channel block over its rows) rather than its output channel blocks (each running
    every row for its blocks).

    Sharing channel blocks makes every thread stream the whole input; sharing rows makes
    every thread read the whole weight once per row, and lets the padded input be made row by
    row where it is used (no separate pass over a padded copy). Rows win when there are enough
    of them for every thread and the input is the larger operand or the weight is small
    enough to be re-read from cache (:data:`CONV_ROWS_MAX_WEIGHT_BYTES`). Paired-call timing
    on ResNet-18 (2 threads, Zen 3), rows with the padding made per row against channel
    blocks with a padded copy: 0.90 for the 3x3 conv at 56x56x64 (861 KB of input, 147 KB of
    weight), 0.89 for the strided one, 0.935 at 28x28x128 (590 KB of weight), 1.00 at
    14x14x256 (2.4 MB of weight), 1.44 at 7x7x512 (7 rows for 2 threads). The rows go to the
    threads in blocks of :data:`CONV_ROW_BLOCK` (channel blocks inside a block, so each output
    and residual plane is walked a few rows at a time): in the model's fused 56x56x64 kernels,
    blocks of 1/2/4/8 rows took 0.98/0.94/0.94/0.98 of the channel-block order's time."""
    threads = target_threads(target)
    if rows is None or rows < 4 * threads:
        return False
    blk = sch.get(block)
    sizes = []
    for region in blk.reads[:2]:
        # a symbolic dim (a dynamic batch) counts as 1: the input's size is then a lower bound
        dims = [const_int(simplify(d)) for d in region.buffer.shape]
        size = as_dtype(region.buffer.dtype).bits // 8
        for d in dims:
            size *= 1 if d is None else d
        sizes.append(size)
    return sizes[0] > sizes[1] or sizes[1] <= CONV_ROWS_MAX_WEIGHT_BYTES


def _row_block(rows: int | None, target: Any) -> int | None:
    """Output rows per parallel chunk when the threads share rows: the most, up to
    :data:`CONV_ROW_BLOCK`, that divide the rows and leave every thread a few chunks."""
    if rows is None:
        return None
    threads = target_threads(target)
    for r in range(min(CONV_ROW_BLOCK, rows), 1, -1):
        if rows % r == 0 and rows // r >= 4 * threads:
            return r
    return None


def _schedule_conv2d_nchwc(sch: Any, target: Any) -> None:
    """Register-blocked: parallel over (n, row, pairs of output channel blocks) -- or (n,
    pairs of blocks, row) where :func:`_rows_outer` says so; a tile of a few output pixels x
    output channel blocks (one vector each) accumulates over all the taps in a local buffer --
    compacted to a small array that the C compiler keeps in registers -- then is written out
    and the fused epilogue applied to it while it is in L1. Each weight vector is loaded once
    per tap for the tile's pixels, each input element broadcast once for its channel blocks.
    With rows outermost, the padded input rows an output row needs are made right before it
    (a few KiB that stay in L1/L2) instead of in a pass over a padded copy of the input. The
    tile's FMAs keep their operands in registers (``FMA_IN_REGISTERS``), and a row's tail tile
    too small to fill the FMA pipes runs jammed with the next rows' (``JAM_TAILS``)."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_nchwc_pad", "conv2d_nchwc"})
    block = sch.get_block("conv2d_nchwc")
    work = block_work(sch, block)
    n, ob, y, x, oi, rco, ry, rx, rci = sch.get_loops(block)
    dtype = sch.get(block).writes[0].buffer.dtype
    # rows shared only for input channels in whole vectors: ResNet's stem (3 channels, 7x7
    # taps) took 1.17x the time that way (1.06x with a separate padding pass)
    lanes = target.vector_lanes(dtype)
    rows_outer = ((loop_extent(sch, rci) or 1) % lanes == 0
                  and _rows_outer(sch, block, loop_extent(sch, y), target))
    pad_at_row = rows_outer and "conv2d_nchwc_pad" in names
    if not pad_at_row:
        _schedule_pad(sch, target, "conv2d_nchwc_pad", names)
    ow = loop_extent(sch, x)
    xt, bt = _nchwc_tile(ow, loop_extent(sch, ob), target.vector_lanes("float32"))
    xo, xi = split_off(sch, x, xt if xt > 1 else None)
    obo, obi = split_off(sch, ob, bt if bt > 1 else None)
    co, ci, vec = _vector_channels(sch, target, block, oi)
    tile_at = co if co is not None else xo
    if rows_outer:
        yo, yi = split_off(sch, y, _row_block(loop_extent(sch, y), target))
        outer = [n, yo, obo] + ([yi] if yi is not None else [])
        par = [n, yo]
    else:
        outer = par = [n, obo, y]
    order = outer + [xo] + ([co] if co is not None else []) + [rco, ry, rx, rci]
    order += [lp for lp in (xi, obi, ci) if lp is not None]
    sch.reorder(*order)
    if pad_at_row:
        pad = sch.get_block("conv2d_nchwc_pad")
        sch.compute_at(pad, outer[1])
        vectorize_inner(sch, target, pad)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tile_at)
    init = sch.decompose_reduction(block, rco)
    # the input channels of a block too: a straight run of FMAs at constant offsets per tap
    for lp in (xi, obi, rci):
        if lp is not None:
            sch.unroll(lp)
    if vec:
        sch.vectorize(ci)
    for b in (init, local):
        write_out_tile(sch, target, b, tile_at, dtype)
    # the tile's FMAs keep their weight vectors and broadcasts in registers (see tile_fma)
    sch.annotate(rco, FMA_IN_REGISTERS, 1)
    row = yi if rows_outer else y
    jam = _tail_jam(ow, xt, bt)
    if row is not None and jam is not None:
        sch.annotate(row, JAM_TAILS, jam)
    parallel_outer(sch, par, target, work=work)
    # fused consumers (bias, activation, residual) run on each tile right after it is written
    schedule_epilogue(sch, target, rest, tile_at)


def _conv2d_nchwc_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Unblock data ``[N, C/x, H, W, x]``, weight ``[O/y, C/x, KH, KW, x, y]`` and the gradient
    ``[N, O/y, OH, OW, y]`` to NCHW/OIHW, take the plain convolution's adjoints, and block
    them again."""
    from .grad import fit_to, shape_attr
    from .shape import reshape

    x, w = call.args
    if not (_is_float_arg(x) and _is_float_arg(w)):
        return [None, None]
    n, cb, h, wd, ci = shape_attr(x.struct_info.shape)
    ob, wcb, kh, kw, _, oc = shape_attr(w.struct_info.shape)
    gs = shape_attr(output_grad.struct_info.shape)
    c, cg, o = shape_attr((cb * ci, wcb * ci, ob * oc))
    xn = bb.normalize(reshape(_permute(x, (0, 1, 4, 2, 3)), (n, c, h, wd)))
    wn = bb.normalize(reshape(_permute(w, (0, 5, 1, 4, 2, 3)), (o, cg, kh, kw)))
    g = bb.normalize(reshape(_permute(output_grad, (0, 1, 4, 2, 3)), (gs[0], o, gs[2], gs[3])))
    dx, dw = _conv_adjoints(g, xn, wn, call.attrs, call.attrs.groups)
    dx = _permute(reshape(dx, (n, cb, ci, h, wd)), (0, 1, 3, 4, 2))
    dw = _permute(reshape(dw, (ob, oc, wcb, ci, kh, kw)), (0, 2, 4, 5, 3, 1))
    return [fit_to(bb, dx, x), fit_to(bb, dw, w)]


conv2d_nchwc = register_op(
    "nn.conv2d_nchwc",
    inputs=("data", "weight"),
    attrs=Conv2DNCHWcAttrs,
    infer=_infer_conv2d_nchwc,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_conv2d_nchwc_compute,
    schedules={"c": _schedule_conv2d_nchwc},
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv2d_nchwc_grad,
    doc="2-d convolution of channel-blocked data: data NCHW[x]c ``[N, C/x, H, W, x]``, weight "
    "OIHW[x]i[y]o ``[O/y, C/x, KH, KW, x, y]``, result NCHW[y]c ``[N, O/y, OH, OW, y]`` "
    "(what AlterOpLayout makes of nn.conv2d on CPUs).",
)


# ---- depthwise conv2d on channel-blocked data -------------------------------------------------
@dataclass(frozen=True)
class DepthwiseConv2DNCHWcAttrs(_BlockedConvAttrs):
    """Depthwise convolution of NCHW[x]c data with an OIHW[x]o weight (one input channel per
    output channel, channel multiplier 1) into NCHW[x]c. ``strides``, ``padding``,
    ``dilation``, ``out_dtype`` as in :class:`Conv2DAttrs`."""

    OP: ClassVar[str] = "nn.depthwise_conv2d_nchwc"


def _infer_depthwise_conv2d_nchwc(call: Any) -> Any:
    from ..graph.struct_info import TensorStructInfo

    op = DepthwiseConv2DNCHWcAttrs.OP
    data = tensor_arg(call, 0, op, "data", ndim=5)
    weight = tensor_arg(call, 1, op, "weight", ndim=5)
    dtype = result_dtype(op, attr_out_dtype(call), ("data", data), ("weight", weight))
    if data.shape is None or weight.shape is None:
        return TensorStructInfo(None, dtype, 5)
    n, cb, h, w, c = data.shape
    wcb, one, kh, kw, wc = weight.shape
    checks = (("channel blocks", cb, wcb), ("channel block size", c, wc),
              ("input channels", tir.const(I64, 1), one))
    for what, a, b in checks:
        if provably_unequal(a, b):
            raise StructInfoError(
                f"{op}: data {fmt_shape(data.shape)} (NCHW[x]c) has {fmt_dim(a)} {what} but "
                f"weight {fmt_shape(weight.shape)} (OIHW[x]o, I == 1) has {fmt_dim(b)}"
            )
    oh, ow = _conv_hw(call.attrs, h, w, kh, kw)
    _check_out_dim(op, "height", oh, h)
    _check_out_dim(op, "width", ow, w)
    return TensorStructInfo((n, cb, oh, ow, c), dtype)


def _depthwise_conv2d_nchwc_compute(data: Any, weight: Any, *,
                                    attrs: DepthwiseConv2DNCHWcAttrs) -> Any:
    """``out[n, cb, y, x, ci] = sum_{ry, rx} pad(data)[n, cb, y*sh + ry*dh, x*sw + rx*dw, ci]
    * weight[cb, 0, ry, rx, ci]``: every tap is one contiguous vector of the channel block."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else data.dtype
    n, cb, h, w, c = data.shape
    _, _, kh, kw, _ = weight.shape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh, ow = _conv_hw(attrs, h, w, kh, kw)
    src = _pad_hw(data, 2, 3, attrs.padding, "depthwise_conv2d_nchwc_pad")
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")
    zero = tir.const(I64, 0)

    def body(nn, cc, yy, xx, ci):
        v = src[nn, cc, yy * sh + ry * dh, xx * sw + rx * dw, ci]
        prod = tir.cast(out_dtype, v) * tir.cast(out_dtype, weight[cc, zero, ry, rx, ci])
        return te.sum(prod, axis=[ry, rx])

    op = DepthwiseConv2DNCHWcAttrs.OP
    checks = equal_dims([(d, wd, f"{op}: data {fmt_shape(data.shape)} and weight "
                                 f"{fmt_shape(weight.shape)} disagree on {what}")
                         for what, d, wd in (("channel blocks", cb, weight.shape[0]),
                                             ("the channel block", c, weight.shape[4]))])
    return te.compute((n, cb, oh, ow, c), body, name="depthwise_conv2d_nchwc",
                      attrs=assume(checks))


#: Largest kernel whose taps the depthwise schedule unrolls.
DEPTHWISE_UNROLL_TAPS = 7


def _schedule_depthwise_conv2d_nchwc(sch: Any, target: Any) -> None:
    """Parallel over (n, channel block[, row]); a row segment of output pixels of one channel
    block (one SIMD vector each) is accumulated over the taps (unrolled), every tap one
    contiguous vector load of the input and of the weight.

    Loops: parallel(n, cb[, y]) / y / x_outer / ry, rx (unrolled) / x_inner (unrolled) / lanes
    (vectorized). The padded input is copied one channel block at a time inside the parallel
    loop (vectorized along the lanes), so the copy is parallel and still in cache when read.
    """
    pad, name = "depthwise_conv2d_nchwc_pad", "depthwise_conv2d_nchwc"
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {pad, name})
    block = sch.get_block(name)
    work = block_work(sch, block)
    n, cb, y, x, ci, ry, rx = sch.get_loops(block)
    xo, xi = split_off(sch, x, pick_factor(loop_extent(sch, x), CONV_X_TILES))
    _, ci, vec = _vector_channels(sch, target, block, ci)
    sch.reorder(*[lp for lp in (n, cb, y, xo, ry, rx, xi, ci) if lp is not None])
    init = sch.decompose_reduction(block, ry)
    for lp in (ry, rx):
        if (loop_extent(sch, lp) or DEPTHWISE_UNROLL_TAPS + 1) <= DEPTHWISE_UNROLL_TAPS:
            sch.unroll(lp)
    if xi is not None:
        sch.unroll(xi)
    if vec:
        sch.vectorize(ci)
        sch.vectorize(sch.get_loops(init)[-1])
    # the padded copy of a whole channel block goes under (n, cb) when those feed the threads
    # (measured faster than copying the rows of each output row); else under (n, cb, y)
    per_block = pad in names and _enough_blocks(sch, target, [n, cb])
    at = parallel_outer(sch, [n, cb] if per_block else [n, cb, y], target, work=work)
    if pad in names:
        pb = sch.get_block(pad)
        sch.compute_at(pb, at if at is not None else cb if per_block else y)
        vectorize_inner(sch, target, pb)
    schedule_epilogue(sch, target, rest, at)


def _enough_blocks(sch: Any, target: Any, loops: list[Any]) -> bool:
    """Whether ``loops`` have at least two iterations per thread of ``target``."""
    total = 1
    for lp in loops:
        ext = loop_extent(sch, lp)
        if ext is None:
            return False
        total *= ext
    return total >= 2 * (target_threads(target) or 1)


def _depthwise_conv2d_nchwc_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Unblock data ``[N, C/x, H, W, x]``, weight ``[C/x, 1, KH, KW, x]`` and the gradient to
    NCHW/OIHW, take the adjoints of the plain convolution with groups = C, block them again."""
    from .grad import fit_to, shape_attr
    from .shape import reshape

    x, w = call.args
    if not (_is_float_arg(x) and _is_float_arg(w)):
        return [None, None]
    n, cb, h, wd, ci = shape_attr(x.struct_info.shape)
    _, _, kh, kw, _ = shape_attr(w.struct_info.shape)
    gs = shape_attr(output_grad.struct_info.shape)
    c = cb * ci
    (cs,) = shape_attr((c,))
    xn = bb.normalize(reshape(_permute(x, (0, 1, 4, 2, 3)), (n, cs, h, wd)))
    wn = bb.normalize(reshape(_permute(w, (0, 4, 1, 2, 3)), (cs, 1, kh, kw)))
    g = bb.normalize(reshape(_permute(output_grad, (0, 1, 4, 2, 3)), (gs[0], cs, gs[2], gs[3])))
    groups = const_int(c)
    if groups is None:
        raise KilnError(f"{DepthwiseConv2DNCHWcAttrs.OP}: the gradient needs a static channel "
                        f"count, got {fmt_dim(c)}")
    dx, dw = _conv_adjoints(g, xn, wn, call.attrs, groups)
    dx = _permute(reshape(dx, (n, cb, ci, h, wd)), (0, 1, 3, 4, 2))
    dw = _permute(reshape(dw, (cb, ci, 1, kh, kw)), (0, 2, 3, 4, 1))
    return [fit_to(bb, dx, x), fit_to(bb, dw, w)]


depthwise_conv2d_nchwc = register_op(
    DepthwiseConv2DNCHWcAttrs.OP,
    inputs=("data", "weight"),
    attrs=DepthwiseConv2DNCHWcAttrs,
    infer=_infer_depthwise_conv2d_nchwc,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_depthwise_conv2d_nchwc_compute,
    schedules={"c": _schedule_depthwise_conv2d_nchwc},
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_depthwise_conv2d_nchwc_grad,
    doc="depthwise 2-d convolution of channel-blocked data (channel multiplier 1): data "
    "NCHW[x]c ``[N, C/x, H, W, x]``, weight OIHW[x]o ``[C/x, 1, KH, KW, x]``, result NCHW[x]c "
    "(what AlterOpLayout makes of a depthwise nn.conv2d on CPUs).",
)


# =============================================================================================
# pooling
# =============================================================================================
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
    data's layout (NCHW, NHWC, NCHW8c...; every axis but H and W is carried through)."""

    pool_size: Any = (1, 1)
    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    ceil_mode: bool = False
    layout: str = "NCHW"

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
    layout: str = "NCHW"

    def __post_init__(self):
        _normalize_pool(self, "nn.avg_pool2d")
        _set(self, "count_include_pad", bool(self.count_include_pad))


def _normalize_pool(attrs: Any, op: str) -> None:
    _set(attrs, "pool_size", _pair(attrs.pool_size, op, "pool_size"))
    _set(attrs, "strides", _pair(attrs.strides, op, "strides"))
    _set(attrs, "padding", _padding(attrs.padding, op))
    _set(attrs, "dilation", _pair(attrs.dilation, op, "dilation"))
    _set(attrs, "ceil_mode", bool(attrs.ceil_mode))
    _set(attrs, "layout", _pool_layout(attrs.layout, op))
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
        _out_dim(shape[hi], kh, sh, dh, pt, pb, attrs.ceil_mode),
        _out_dim(shape[wi], kw, sw, dw, pl, pr, attrs.ceil_mode),
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
        from ..graph.struct_info import TensorStructInfo

        data = _pool_data(call, op, float_only)
        ndim = Layout(call.attrs.layout).ndim
        if data.shape is None:
            return TensorStructInfo(None, data.dtype, ndim)
        shape = _pool_out_shape(call.attrs, data.shape)
        hi, wi = _hw(call.attrs.layout)
        _check_out_dim(op, "height", shape[hi], data.shape[hi])
        _check_out_dim(op, "width", shape[wi], data.shape[wi])
        return TensorStructInfo(shape, data.dtype)

    return infer


def _window(data: Any, attrs: Any, out_shape: tuple, pad_value: Any, name: str, reducer: Any):
    """The reduction of ``data`` over each (padded, dilated) pooling window."""
    hi, wi = _hw(attrs.layout)
    h, w = data.shape[hi], data.shape[wi]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    pt, pl, _, _ = attrs.padding
    glo_h, ghi_h = _needs_guard(h, out_shape[hi], kh, sh, dh, pt)
    glo_w, ghi_w = _needs_guard(w, out_shape[wi], kw, sw, dw, pl)
    ry = te.reduce_axis((0, kh), name="ry")
    rx = te.reduce_axis((0, kw), name="rx")

    def body(*idx):
        hy, wx = idx[hi] * sh + ry * dh - pt, idx[wi] * sw + rx * dw - pl
        conds = (
            ([tir.ge(hy, 0)] if glo_h else []) + ([tir.lt(hy, h)] if ghi_h else [])
            + ([tir.ge(wx, 0)] if glo_w else []) + ([tir.lt(wx, w)] if ghi_w else [])
        )
        src = list(idx)
        src[hi] = _clamp_index(hy, h, glo_h, ghi_h)
        src[wi] = _clamp_index(wx, w, glo_w, ghi_w)
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
        lo_h, hi_h, lo_w, hi_w = -pt, _i64(h) + pb, -pl, _i64(w) + pr
    else:
        lo_h, hi_h, lo_w, hi_w = 0, _i64(h), 0, _i64(w)

    def body(*i):
        cnt = _tap_count(i[hi], sh, pt, kh, dh, _i64(lo_h), hi_h) * _tap_count(
            i[wi], sw, pl, kw, dw, _i64(lo_w), hi_w)
        return tir.cast(data.dtype, acc[i] / tir.cast(ct, cnt))

    return te.compute(shape, body, name="avg_pool2d")


def _schedule_pool(sch: Any, target: Any) -> None:
    """Parallel over the outer output axes; the window loops inside, accumulating in place.

    When the innermost axis is W and the window reads it contiguously (unit stride, no
    padding guard) — or the innermost axis is a channel axis (NHWC, NCHW8c), always contiguous
    — that axis is vectorized: its vector loop goes under the window loops, so every tap is one
    vector load and one vector max/add. An average's division follows each parallel chunk of
    sums.
    """
    red = next(b for b in sch.get_child_blocks(sch.get_block("root")) if any(
        iv.iter_type == tir.IterType.COMM_REDUCE for iv in sch.get(b).iter_vars))
    rest = other_blocks(sch, {sch.get(red).name_hint})
    loops = sch.get_loops(red)
    spatial, (ry, rx) = list(loops[:-2]), loops[-2:]
    blk = sch.get(red)
    work = block_work(sch, red)
    factor = None
    if blk.annotations.get(UNIT_STRIDE_W, False) or blk.annotations.get(CARRIED_INNER, False):
        factor = vector_factor(target, blk.writes[0].buffer.dtype, loop_extent(sch, spatial[-1]))
    if factor is not None:
        xo, xi = split_off(sch, spatial[-1], factor)
        sch.reorder(xo, ry, rx, xi)
        init = sch.decompose_reduction(red, ry)
        sch.vectorize(xi)
        sch.vectorize(sch.get_loops(init)[-1])
    else:
        sch.decompose_reduction(red, ry)
    outer = parallel_outer(sch, spatial[:3], target, work=work)
    # an average's division (and any fused consumer) follows each parallel chunk of sums
    schedule_epilogue(sch, target, rest, outer)


def _pool_fields(attrs: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(attrs, f.name) for f in dataclasses.fields(attrs)}


def _max_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Each window's gradient to the inputs equal to its maximum (the forward result)."""
    from .grad import max_pool2d_backward

    x = call.args[0]
    if not _is_float_arg(x):
        return [None]
    return [max_pool2d_backward(output_grad, x, call, **_pool_fields(call.attrs))]


max_pool2d = register_op(
    "nn.max_pool2d",
    inputs=("data",),
    attrs=MaxPool2DAttrs,
    infer=_make_pool_infer("nn.max_pool2d", float_only=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_max_pool2d_compute,
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_max_pool2d_grad,
    doc="2-d max pooling (data in ``layout``: NCHW by default, NHWC, NCHW8c...).",
)

def _avg_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .grad import avg_pool2d_backward

    return [avg_pool2d_backward(output_grad, call.args[0], **_pool_fields(call.attrs))]


avg_pool2d = register_op(
    "nn.avg_pool2d",
    inputs=("data",),
    attrs=AvgPool2DAttrs,
    infer=_make_pool_infer("nn.avg_pool2d", float_only=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_avg_pool2d_compute,
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_avg_pool2d_grad,
    doc="2-d average pooling (data in ``layout``: NCHW by default, NHWC, NCHW8c...).",
)


# ---- adaptive pooling -------------------------------------------------------------------------
@dataclass(frozen=True)
class AdaptivePool2DAttrs:
    """``output_size``: int or (h, w). Output cell ``i`` of an axis of size ``n`` pools input
    ``[floor(i*n/out), ceil((i+1)*n/out))``; ``(1, 1)`` is global pooling. ``layout``: the
    data's layout (NCHW, NHWC, NCHW8c...)."""

    output_size: Any = (1, 1)
    layout: str = "NCHW"

    def __post_init__(self):
        _set(self, "output_size", _pair(self.output_size, "nn.adaptive_pool2d", "output_size"))
        _set(self, "layout", _pool_layout(self.layout, "nn.adaptive_pool2d"))


def _infer_adaptive(op: str, float_only: bool):
    def infer(call: Any) -> Any:
        from ..graph.struct_info import TensorStructInfo

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
            src[hi] = tir.min(hy, _i64(h) - 1) if vary_h else hy
            src[wi] = tir.min(wx, _i64(w) - 1) if vary_w else wx
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
    from .grad import adaptive_avg_pool2d_backward

    return [adaptive_avg_pool2d_backward(output_grad, call.args[0],
                                         **_pool_fields(call.attrs))]


adaptive_avg_pool2d = register_op(
    "nn.adaptive_avg_pool2d",
    inputs=("data",),
    attrs=AdaptivePool2DAttrs,
    infer=_infer_adaptive("nn.adaptive_avg_pool2d", float_only=True),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_compute("avg"),
    schedules={"c": _schedule_pool},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_adaptive_avg_pool2d_grad,
    doc="Average pooling to a fixed output size (global pooling for (1, 1)); data in "
    "``layout`` (NCHW by default).",
)

def _adaptive_max_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from .grad import adaptive_max_pool2d_backward

    x = call.args[0]
    if not _is_float_arg(x):
        return [None]
    return [adaptive_max_pool2d_backward(output_grad, x, call, **_pool_fields(call.attrs))]


adaptive_max_pool2d = register_op(
    "nn.adaptive_max_pool2d",
    inputs=("data",),
    attrs=AdaptivePool2DAttrs,
    infer=_infer_adaptive("nn.adaptive_max_pool2d", float_only=False),
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_adaptive_compute("max"),
    schedules={"c": _schedule_pool},
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
    row's max/sum/exp are made right before its outputs), the element-wise stages are
    vectorized along the contiguous axis, and the row max/sum accumulate vector partial results
    (``rfactor``, see :func:`_row_reduction`). Otherwise every stage gets the generic
    reduction or injective schedule.
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
            _row_reduction(sch, target, b, outer)
        else:
            vectorize_inner(sch, target, b)
    work = block_work(sch, out)
    if loop_extent(sch, outer) != 1 and getattr(target, "num_threads", 0) != 1 and (
        work is None or work >= PARALLEL_MIN_WORK
    ):
        sch.parallel(outer)
    schedule_epilogue(sch, target, rest, outer)


def _row_reduction(sch: Any, target: Any, block: Any, outer: Any) -> None:
    """Schedule a row's max/sum computed under ``outer``.

    A scalar accumulator is a chain of dependent adds (one per 4 cycles); when the row's
    innermost reduced extent is a known multiple of a vector width, the reduction is split
    ``k -> (ko, ki)`` and ``ki`` rfactored into a vector of partial results (a few registers
    after buffer compaction), then combined by a short scalar loop. Otherwise (symbolic or odd
    lengths, or a refused transformation) the init is just hoisted.
    """
    from ..ir.errors import ScheduleError

    trial = sch.copy()
    try:
        vectorized = _rfactor_row(trial, target, block, outer)
    except ScheduleError:
        vectorized = False
    if vectorized:
        _rfactor_row(sch, target, block, outer)
    else:
        _hoist_init(sch, block, outer)


#: Vector accumulators of a row's max/sum (independent dependency chains), when the row splits
#: into that many vectors: with one, each step waits for the last (a 3-cycle add, a 4-step
#: NaN-propagating max). Paired calls, softmax 64 x 1024 (2 threads, Zen 3): 0.89 of the time
#: with 2 for the max and the sum.
ROW_REDUCTION_CHAINS = 2


def _rfactor_row(sch: Any, target: Any, block: Any, outer: Any) -> bool:
    """The rfactor schedule of :func:`_row_reduction`; False when it does not apply."""
    below = _loops_below(sch, block, outer)
    if not below:
        return False
    extent = loop_extent(sch, below[-1])
    lanes = vector_factor(target, sch.get(block).writes[0].buffer.dtype, extent)
    if lanes is None or extent is None or extent < 2 * lanes:
        return False
    chains = ROW_REDUCTION_CHAINS if extent % (ROW_REDUCTION_CHAINS * lanes) == 0 else 1
    _, ki = sch.split(below[-1], factors=[None, chains * lanes])
    rf = sch.rfactor(ki, len(sch.get(block).writes[0].buffer.shape))
    # the init's copies of these loops (made next) are unrolled and vectorized too
    if chains > 1:
        kc, ki = sch.split(ki, factors=[chains, lanes])
        sch.unroll(kc)
    sch.vectorize(ki)
    sch.decompose_reduction(rf, _loops_below(sch, rf, outer)[0])
    _hoist_init(sch, block, outer)
    return True


def _loops_below(sch: Any, block: Any, outer: Any) -> list[Any]:
    """The loops of ``block`` inside ``outer``."""
    loops = sch.get_loops(block)
    outer_var = sch.get(outer).loop_var
    pos = [k for k, lp in enumerate(loops) if sch.get(lp).loop_var is outer_var]
    return loops[pos[0] + 1:] if pos else []


def _hoist_init(sch: Any, block: Any, outer: Any) -> None:
    """Give a reduction computed under ``outer`` its init before its own (reduction) loops."""
    below = _loops_below(sch, block, outer)
    if below:
        sch.decompose_reduction(block, below[0])


def _schedule_row_op(out_name: str):
    def schedule(sch: Any, target: Any) -> None:
        block = sch.get(sch.get_block(out_name))
        axes = block.annotations.get(ROW_AXES, (len(block.iter_vars) - 1,))
        schedule_rows(sch, target, out_name, tuple(axes))

    return schedule


def _softmax_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``y (g - sum(g y))`` along the axis, ``y`` the forward result."""
    from .elementwise import multiply, subtract
    from .reduce import sum as reduce_sum

    g, y = output_grad, call
    return [multiply(y, subtract(g, reduce_sum(multiply(g, y), call.attrs.axis, True)))]


softmax = register_op(
    "nn.softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_softmax_compute,
    schedules={"c": _schedule_row_op("softmax")},
    mixed_precision=MixedPrecision.NEVER,
    gradient=_softmax_grad,
    doc="Softmax along ``axis`` (max-subtracted for stability).",
)

def _log_softmax_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``g - exp(y) sum(g)`` along the axis, ``y`` the forward result."""
    from .elementwise import exp, multiply, subtract
    from .reduce import sum as reduce_sum

    g = output_grad
    return [subtract(g, multiply(exp(call), reduce_sum(g, call.attrs.axis, True)))]


log_softmax = register_op(
    "nn.log_softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.log_softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_log_softmax_compute,
    schedules={"c": _schedule_row_op("log_softmax")},
    mixed_precision=MixedPrecision.NEVER,
    gradient=_log_softmax_grad,
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

    want = [x.shape[a] for a in axes]
    checks = equal_dims([(d, w, f"nn.layer_norm: {name} {fmt_shape(p.shape)} must have the "
                                f"shape {fmt_shape(want)} of the normalized axes")
                         for name, p in (("gamma", gamma), ("beta", beta))
                         for d, w in zip(p.shape, want)])
    return te.compute(x.shape, body, name="layer_norm",
                      attrs={ROW_AXES: tuple(axes)} | assume(checks))


def _layer_norm_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """With ``xh = (x - mean) rstd`` and ``gh = g gamma``: ``dx = rstd (gh - mean(gh) -
    xh mean(gh xh))``, ``dgamma = sum(g xh)``, ``dbeta = sum(g)`` (sums over the other axes)."""
    from .elementwise import add, multiply, rsqrt, subtract
    from .grad import scalar, shape_attr
    from .reduce import mean
    from .reduce import sum as reduce_sum
    from .shape import reshape

    x, gamma, _ = call.args
    xs = x.struct_info
    if xs.shape is None:
        raise KilnError("nn.layer_norm gradient: needs data of known shape")
    ndim = len(xs.shape)
    axes = tuple(sorted(a % ndim for a in call.attrs.axes))
    others = tuple(d for d in range(ndim) if d not in axes)
    g = output_grad
    mu = bb.emit(mean(x, axes, True))
    xc = bb.emit(subtract(x, mu))
    var = mean(multiply(xc, xc), axes, True)
    rstd = bb.emit(rsqrt(add(var, scalar(call.attrs.epsilon, xs.dtype))))
    xh = bb.emit(multiply(xc, rstd))
    gamma_b = gamma
    if axes != tuple(range(ndim - len(axes), ndim)):  # not trailing: place gamma's axes
        gamma_b = reshape(gamma, shape_attr(xs.shape[d] if d in axes else 1
                                            for d in range(ndim)))
    gh = bb.emit(multiply(g, gamma_b))
    dx = multiply(rstd, subtract(subtract(gh, mean(gh, axes, True)),
                                 multiply(xh, mean(multiply(gh, xh), axes, True))))
    dgamma = multiply(g, xh)
    dbeta = g
    if others:
        dgamma, dbeta = reduce_sum(dgamma, others), reduce_sum(dbeta, others)
    return [dx, dgamma, dbeta]


layer_norm = register_op(
    "nn.layer_norm",
    inputs=("data", "gamma", "beta"),
    attrs=LayerNormAttrs,
    infer=_infer_layer_norm,
    pattern=OpPattern.OPAQUE,
    compute=_layer_norm_compute,
    schedules={"c": _schedule_row_op("layer_norm")},
    mixed_precision=MixedPrecision.NEVER,
    gradient=_layer_norm_grad,
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

    checks = equal_dims([(t.shape[0], x.shape[axis], f"nn.batch_norm: {name} has "
                          f"{fmt_dim(t.shape[0])} elements but data has {fmt_dim(x.shape[axis])} "
                          f"channels") for name, t in zip(_BN_PARAMS, (gamma, beta, mean, var))])
    return te.compute(x.shape, body, name="batch_norm", attrs=assume(checks))


def _batch_norm_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Inference batch norm ``y = (x - m) gamma rstd + beta`` with ``rstd = (v + eps)^-1/2``
    per channel: ``dx = g gamma rstd``, ``dgamma = sum(g (x - m)) rstd``, ``dbeta = sum(g)``,
    ``dm = -sum(g) gamma rstd``, ``dv = -sum(g (x - m)) gamma rstd^3 / 2``."""
    from .elementwise import add, multiply, negative, rsqrt, subtract
    from .grad import scalar
    from .reduce import sum as reduce_sum
    from .shape import reshape

    x, gamma, _, m, v = call.args
    xs = x.struct_info
    if xs.ndim < 0:
        raise KilnError("nn.batch_norm gradient: needs data of known rank")
    ndim = xs.ndim
    axis = call.attrs.axis % ndim
    others = tuple(d for d in range(ndim) if d != axis)

    def chan(t: Any) -> Any:  # a per-channel vector broadcast along the channel axis
        trailing = ndim - axis - 1
        return reshape(t, (-1,) + (1,) * trailing) if trailing else t

    g = output_grad
    rstd = bb.emit(rsqrt(add(v, scalar(call.attrs.epsilon, xs.dtype))))
    scale = bb.emit(multiply(gamma, rstd))
    dx = multiply(g, chan(scale))
    sg = bb.emit(reduce_sum(g, others) if others else g)
    sgx = bb.emit(reduce_sum(multiply(g, subtract(x, chan(m))), others) if others
                  else multiply(g, subtract(x, m)))
    dgamma = multiply(sgx, rstd)
    dmean = negative(multiply(sg, scale))
    dvar = multiply(multiply(sgx, scale), multiply(multiply(rstd, rstd),
                                                   scalar(-0.5, xs.dtype)))
    return [dx, dgamma, sg, dmean, dvar]


batch_norm = register_op(
    "nn.batch_norm",
    inputs=("data", *_BN_PARAMS),
    attrs=BatchNormAttrs,
    infer=_infer_batch_norm,
    pattern=OpPattern.BROADCAST,
    compute=_batch_norm_compute,
    schedules={"c": schedule_injective},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_batch_norm_grad,
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


def _dropout_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Inference dropout is the identity."""
    return [output_grad]


dropout = register_op(
    "nn.dropout",
    inputs=("data",),
    attrs=DropoutAttrs,
    infer=_infer_dropout,
    pattern=OpPattern.ELEMWISE,
    compute=lambda x, *, attrs: te.compute(x.shape, lambda *i: x[i], name="dropout"),
    schedules={"c": schedule_injective},
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_dropout_grad,
    doc="Dropout in inference form: the identity (training-time dropping is not modelled).",
)
