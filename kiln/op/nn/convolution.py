"""Convolutions: ``nn.conv2d`` (any data/kernel layout permutation, groups, depthwise), the
channel-blocked forms ``nn.conv2d_nchwc`` and ``nn.depthwise_conv2d_nchwc`` that the CPU's
layout hook turns NCHW convolutions into, and the two adjoints ``nn.conv2d_backward_data`` /
``nn.conv2d_backward_weight`` (NCHW data, OIHW weight) every convolution's gradient uses.

Convolutions are OUT_EWISE_FUSABLE: element-wise consumers such as bias-add and relu fuse into
their output loop. Padding is a separate ``*_pad`` stage whose out-of-bounds taps clamp their
index and select zero, so a load never leaves its buffer (vector code evaluates both sides).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ... import te, tir
from ...graph.struct_info import TensorStructInfo
from ...ir.dtype import as_dtype
from ...ir.errors import KilnError, StructInfoError
from ...tir import expr as tx
from ...tir.expr import PrimExpr
from ..common import (
    arg_ndim,
    arg_shape,
    assume,
    attr_fields,
    equal_dims,
    is_float_arg,
    shape_attr,
    simplify,
    tensor_sinfo,
)
from ..elementwise import cast_to
from ..grad import check_grad_shape, clamp_into, fit_to, masked
from ..layout import Layout, as_layout
from ..linalg import (
    attr_out_dtype,
    const_int,
    fmt_dim,
    fmt_shape,
    norm_dtype,
    provably_unequal,
    result_dtype,
    tensor_arg,
)
from ..registry import MixedPrecision, OpPattern, register_op
from ..shape import reshape, transpose
from .window import (
    I64,
    check_out_dim,
    clamp_index,
    norm_padding,
    norm_pair,
    out_dim,
    set_frozen,
    window_source,
)

#: ``(data_layout, kernel_layout)`` of a convolution not in NCHW/OIHW, for its schedule.
CONV_LAYOUTS = "kiln.conv_layouts"


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
        set_frozen(self, "strides", norm_pair(self.strides, "nn.conv2d", "strides"))
        set_frozen(self, "padding", norm_padding(self.padding, "nn.conv2d"))
        set_frozen(self, "dilation", norm_pair(self.dilation, "nn.conv2d", "dilation"))
        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups < 1:
            raise KilnError(f"nn.conv2d: groups must be a positive int, got {self.groups!r}")
        set_frozen(self, "out_dtype", norm_dtype(self.out_dtype, "nn.conv2d"))
        set_frozen(self, "data_layout", _plain_layout(self.data_layout, "nn.conv2d", "data_layout",
                                                "NCHW"))
        set_frozen(self, "kernel_layout", _plain_layout(self.kernel_layout, "nn.conv2d",
                                                  "kernel_layout", "OIHW"))


def _conv_hw(attrs: Any, h: Any, w: Any, kh: Any, kw: Any) -> tuple[Any, Any]:
    """Output height and width of a convolution window."""
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return out_dim(h, kh, sh, dh, pt, pb), out_dim(w, kw, sw, dw, pl, pr)


def _conv2d_out_shape(attrs: Conv2DAttrs, dshape: Sequence[Any], wshape: Sequence[Any]) -> tuple:
    dl, kl = Layout(attrs.data_layout), Layout(attrs.kernel_layout)
    n, _, h, w = _pick(dshape, dl, "NCHW")
    o, _, kh, kw = _pick(wshape, kl, "OIHW")
    oh, ow = _conv_hw(attrs, h, w, kh, kw)
    return _place(dl, {"N": n, "C": o, "H": oh, "W": ow})


def _infer_conv2d(call: Any) -> Any:
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
    check_out_dim(op, "height", shape[dl.index("H")], h)
    check_out_dim(op, "width", shape[dl.index("W")], w)
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
        src[hi] = clamp_index(y, h, pt > 0, pb > 0)
        src[wi] = clamp_index(x, w, pl > 0, pr > 0)
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


def _permute(x: Any, perm: Sequence[int]) -> Any:
    """``x`` transposed by ``perm`` (nothing for the identity)."""
    return x if list(perm) == list(range(len(perm))) else transpose(x, tuple(perm))


def _inverse(perm: Sequence[int]) -> list[int]:
    return [list(perm).index(d) for d in range(len(perm))]


def _conv_adjoints(g: Any, x: Any, w: Any, attrs: Any, groups: int) -> tuple[Any, Any]:
    """(d data, d weight) of an NCHW/OIHW convolution, computed in ``g``'s dtype (``g``,
    ``x`` and ``w`` are normalized expressions)."""
    gdt = g.struct_info.dtype
    kw = {"strides": attrs.strides, "padding": attrs.padding, "dilation": attrs.dilation,
          "groups": groups}
    xc, wc = cast_to(x, gdt, x.struct_info.dtype), cast_to(w, gdt, w.struct_info.dtype)
    return conv2d_backward_data(g, wc, x, **kw), conv2d_backward_weight(g, xc, w, **kw)


def _conv2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Adjoints through ``nn.conv2d_backward_data``/``_weight`` (NCHW/OIHW; other layouts
    are transposed there and back), computed in the result's dtype and cast back."""
    x, w = call.args
    if not (is_float_arg(x) and is_float_arg(w)):
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
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv2d_grad,
    doc="2-d convolution with strides, padding (int, (v, h) or (top, left, bottom, right)), "
    "dilation and groups (depthwise when groups == channels); NCHW data and OIHW weight by "
    "default (``data_layout``/``kernel_layout``: e.g. NHWC and HWIO).",
)


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
        set_frozen(self, "strides", norm_pair(self.strides, op, "strides"))
        set_frozen(self, "padding", norm_padding(self.padding, op))
        set_frozen(self, "dilation", norm_pair(self.dilation, op, "dilation"))
        set_frozen(self, "out_dtype", norm_dtype(self.out_dtype, op))


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
    check_out_dim(op, "height", oh, h)
    check_out_dim(op, "width", ow, w)
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


def _conv2d_nchwc_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Unblock data ``[N, C/x, H, W, x]``, weight ``[O/y, C/x, KH, KW, x, y]`` and the gradient
    ``[N, O/y, OH, OW, y]`` to NCHW/OIHW, take the plain convolution's adjoints, and block
    them again."""
    x, w = call.args
    if not (is_float_arg(x) and is_float_arg(w)):
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
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv2d_nchwc_grad,
    doc="2-d convolution of channel-blocked data: data NCHW[x]c ``[N, C/x, H, W, x]``, weight "
    "OIHW[x]i[y]o ``[O/y, C/x, KH, KW, x, y]``, result NCHW[y]c ``[N, O/y, OH, OW, y]`` "
    "(what AlterOpLayout makes of nn.conv2d on CPUs).",
)


@dataclass(frozen=True)
class DepthwiseConv2DNCHWcAttrs(_BlockedConvAttrs):
    """Depthwise convolution of NCHW[x]c data with an OIHW[x]o weight (one input channel per
    output channel, channel multiplier 1) into NCHW[x]c. ``strides``, ``padding``,
    ``dilation``, ``out_dtype`` as in :class:`Conv2DAttrs`."""

    OP: ClassVar[str] = "nn.depthwise_conv2d_nchwc"


def _infer_depthwise_conv2d_nchwc(call: Any) -> Any:
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
    check_out_dim(op, "height", oh, h)
    check_out_dim(op, "width", ow, w)
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


def _depthwise_conv2d_nchwc_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Unblock data ``[N, C/x, H, W, x]``, weight ``[C/x, 1, KH, KW, x]`` and the gradient to
    NCHW/OIHW, take the adjoints of the plain convolution with groups = C, block them again."""
    x, w = call.args
    if not (is_float_arg(x) and is_float_arg(w)):
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
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_depthwise_conv2d_nchwc_grad,
    doc="depthwise 2-d convolution of channel-blocked data (channel multiplier 1): data "
    "NCHW[x]c ``[N, C/x, H, W, x]``, weight OIHW[x]o ``[C/x, 1, KH, KW, x]``, result NCHW[x]c "
    "(what AlterOpLayout makes of a depthwise nn.conv2d on CPUs).",
)


@dataclass(frozen=True)
class Conv2DGradAttrs:
    """The forward convolution's ``strides``, ``padding`` (top, left, bottom, right),
    ``dilation`` and ``groups`` (NCHW data, OIHW weight)."""

    strides: Any = (1, 1)
    padding: Any = (0, 0, 0, 0)
    dilation: Any = (1, 1)
    groups: int = 1

    def __post_init__(self):
        op = "nn.conv2d_backward"
        object.__setattr__(self, "strides", norm_pair(self.strides, op, "strides"))
        object.__setattr__(self, "padding", norm_padding(self.padding, op))
        object.__setattr__(self, "dilation", norm_pair(self.dilation, op, "dilation"))
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
    n, _, h, w = dshape
    o, _, kh, kw = wshape
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    return (n, o, out_dim(h, kh, sh, dh, pt, pb), out_dim(w, kw, sw, dw, pl, pr))


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
        qy, cy = window_source(y, ry.var, sh, dh, pt, oh)
        qx, cx = window_source(x, rx.var, sw, dw, pl, ow)
        # the product is masked, not the gradient: a tap with no output position adds 0, even
        # with an inf/NaN weight (0 * inf would make the sum NaN)
        value = masked(tx.all_of(cy + cx), grad[n, oo, qy, qx] * weight[oo, ci, ry, rx])
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
        value = data[rn, chan, clamp_into(hy, h), clamp_into(wx, w)]
        return te.sum(masked(inside, grad[rn, oo, ry, rx] * value), axis=[rn, ry, rx])

    return te.compute(weight.shape, body, name="conv2d_backward_weight")


def _conv_bwd_data_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``<h, bd(g, W)> = <conv(h, W), g>``: linear in g and in W."""
    g, w, _ = call.args
    a = call.attrs
    return [
        conv2d(output_grad, w, **attr_fields(a)),
        conv2d_backward_weight(g, output_grad, w, **attr_fields(a)),
        None,
    ]


def _conv_bwd_weight_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``<H, bw(g, x)> = <conv(x, H), g>``."""
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
