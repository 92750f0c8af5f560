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

from ... import te, tir
from ...ir.dtype import DataType, as_dtype
from ...ir.errors import KilnError, StructInfoError
from ..elementwise import gelu, relu, sigmoid, silu, tanh  # noqa: F401  (kiln.op.nn.relu ...)
from ..layout import Layout, as_layout
from ..linalg import (
    attr_out_dtype,
    const_int,
    fmt_dim,
    fmt_shape,
    norm_dtype,
    provably_unequal,
    result_dtype,
    simplify,
    tensor_arg,
)
from ..registry import MixedPrecision, OpPattern, register_op

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
    from ...graph.struct_info import TensorStructInfo

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
    return te.compute(shape, body, name="conv2d", attrs=ann)


def _is_float_arg(x: Any) -> bool:
    return as_dtype(x.struct_info.dtype).is_float


def _permute(x: Any, perm: Sequence[int]) -> Any:
    """``x`` transposed by ``perm`` (nothing for the identity)."""
    from ..shape import transpose

    return x if list(perm) == list(range(len(perm))) else transpose(x, tuple(perm))


def _inverse(perm: Sequence[int]) -> list[int]:
    return [list(perm).index(d) for d in range(len(perm))]


def _conv_adjoints(g: Any, x: Any, w: Any, attrs: Any, groups: int) -> tuple[Any, Any]:
    """(d data, d weight) of an NCHW/OIHW convolution, computed in ``g``'s dtype (``g``,
    ``x`` and ``w`` are normalized expressions)."""
    from ..elementwise import cast_to
    from ..grad import conv2d_backward_data, conv2d_backward_weight

    gdt = g.struct_info.dtype
    kw = {"strides": attrs.strides, "padding": attrs.padding, "dilation": attrs.dilation,
          "groups": groups}
    xc, wc = cast_to(x, gdt, x.struct_info.dtype), cast_to(w, gdt, w.struct_info.dtype)
    return conv2d_backward_data(g, wc, x, **kw), conv2d_backward_weight(g, xc, w, **kw)


def _conv2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Adjoints through ``nn.conv2d_backward_data``/``_weight`` (NCHW/OIHW; other layouts
    are transposed there and back), computed in the result's dtype and cast back."""
    from ..grad import fit_to

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
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_conv2d_grad,
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
    from ...graph.struct_info import TensorStructInfo

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

    return te.compute((n, ob, oh, ow, oc), body, name="conv2d_nchwc")


def _conv2d_nchwc_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Unblock data ``[N, C/x, H, W, x]``, weight ``[O/y, C/x, KH, KW, x, y]`` and the gradient
    ``[N, O/y, OH, OW, y]`` to NCHW/OIHW, take the plain convolution's adjoints, and block
    them again."""
    from ..common import shape_attr
    from ..grad import fit_to
    from ..shape import reshape

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
    from ...graph.struct_info import TensorStructInfo

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

    return te.compute((n, cb, oh, ow, c), body, name="depthwise_conv2d_nchwc")


def _depthwise_conv2d_nchwc_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Unblock data ``[N, C/x, H, W, x]``, weight ``[C/x, 1, KH, KW, x]`` and the gradient to
    NCHW/OIHW, take the adjoints of the plain convolution with groups = C, block them again."""
    from ..common import shape_attr
    from ..grad import fit_to
    from ..shape import reshape

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
        from ...graph.struct_info import TensorStructInfo

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


def _pool_fields(attrs: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(attrs, f.name) for f in dataclasses.fields(attrs)}


def _max_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Each window's gradient to the inputs equal to its maximum (the forward result)."""
    from ..grad import max_pool2d_backward

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
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_max_pool2d_grad,
    doc="2-d max pooling (data in ``layout``: NCHW by default, NHWC, NCHW8c...).",
)

def _avg_pool2d_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    from ..grad import avg_pool2d_backward

    return [avg_pool2d_backward(output_grad, call.args[0], **_pool_fields(call.attrs))]


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
        from ...graph.struct_info import TensorStructInfo

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
    from ..grad import adaptive_avg_pool2d_backward

    return [adaptive_avg_pool2d_backward(output_grad, call.args[0],
                                         **_pool_fields(call.attrs))]


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
    from ..grad import adaptive_max_pool2d_backward

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
        from ...graph.shape_utils import normalize_axis
        from ...graph.struct_info import TensorStructInfo

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


def _softmax_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``y (g - sum(g y))`` along the axis, ``y`` the forward result."""
    from ..elementwise import multiply, subtract
    from ..reduce import sum as reduce_sum

    g, y = output_grad, call
    return [multiply(y, subtract(g, reduce_sum(multiply(g, y), call.attrs.axis, True)))]


softmax = register_op(
    "nn.softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_softmax_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=_softmax_grad,
    doc="Softmax along ``axis`` (max-subtracted for stability).",
)

def _log_softmax_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``g - exp(y) sum(g)`` along the axis, ``y`` the forward result."""
    from ..elementwise import exp, multiply, subtract
    from ..reduce import sum as reduce_sum

    g = output_grad
    return [subtract(g, multiply(exp(call), reduce_sum(g, call.attrs.axis, True)))]


log_softmax = register_op(
    "nn.log_softmax",
    inputs=("data",),
    attrs=SoftmaxAttrs,
    infer=_float_like_infer("nn.log_softmax"),
    pattern=OpPattern.OPAQUE,
    compute=_log_softmax_compute,
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
    from ...graph.shape_utils import normalize_axes
    from ...graph.struct_info import TensorStructInfo

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


def _layer_norm_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """With ``xh = (x - mean) rstd`` and ``gh = g gamma``: ``dx = rstd (gh - mean(gh) -
    xh mean(gh xh))``, ``dgamma = sum(g xh)``, ``dbeta = sum(g)`` (sums over the other axes)."""
    from ..common import scalar, shape_attr
    from ..elementwise import add, multiply, rsqrt, subtract
    from ..reduce import mean
    from ..reduce import sum as reduce_sum
    from ..shape import reshape

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
    from ...graph.shape_utils import normalize_axis
    from ...graph.struct_info import TensorStructInfo

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


def _batch_norm_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Inference batch norm ``y = (x - m) gamma rstd + beta`` with ``rstd = (v + eps)^-1/2``
    per channel: ``dx = g gamma rstd``, ``dgamma = sum(g (x - m)) rstd``, ``dbeta = sum(g)``,
    ``dm = -sum(g) gamma rstd``, ``dv = -sum(g (x - m)) gamma rstd^3 / 2``."""
    from ..common import scalar
    from ..elementwise import add, multiply, negative, rsqrt, subtract
    from ..reduce import sum as reduce_sum
    from ..shape import reshape

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
    from ...graph.struct_info import TensorStructInfo

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
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_dropout_grad,
    doc="Dropout in inference form: the identity (training-time dropping is not modelled).",
)
