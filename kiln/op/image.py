"""Image operators: separable resampling (resize), grid_sample, roi_align.

``image.resample`` is the kernel of every resize: along one axis, each output position is a
weighted sum of a few input positions, ``y[.., i, ..] = sum_k weight[i, k] * x[.., index[i, k],
..]``. The coordinate rules of a resize (ONNX's coordinate transformation modes, nearest
rounding, cubic coefficients, antialiasing, exclusion of outside taps) only decide the two small
``(out_len, taps)`` tables, so they are computed once when the model is imported, in float64,
and the kernel is the same for all of them. Interpolation is separable, so an N-d resize is one
``resample`` per resized axis (the ONNX reference evaluates it the same way). The taps are
unrolled in the compute (a static count: 1 to a few dozen), which keeps the op INJECTIVE.

``image.resize_axis`` is the same resampling when the scales (or sizes, or roi) are known only
at run time: the kernel computes each output position's source coordinate (a stage of its own),
taps and weights from a float64 scales tensor, in the reference's order of operations, so one
compiled model serves every scale. ``image.resize_axis_antialias`` adds antialiasing, whose tap
count depends on the scale: a reduction over a length bound at run time.

``image.grid_sample`` (ONNX GridSample, PyTorch ``grid_sample``) samples ``x`` at normalized
coordinates given per output position, for any number of spatial dims (usually 2 or 3), with
nearest / linear / cubic interpolation and zeros / border / reflection padding.

Loads never leave their buffer: every computed index is clamped into range, and positions that
the padding rules put outside the input select the padding value instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import te
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    INDEX_DTYPE,
    arg_ndim,
    arg_shape,
    assume,
    const_int,
    equal_dims,
    fmt_shape,
    normalize_axis,
    tensor_arg,
    tensor_sinfo,
)
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["grid_sample", "resample", "resize_axis", "resize_axis_antialias", "roi_align"]


def _c(v: int) -> PrimExpr:
    return tx.const(INDEX_DTYPE, v)


def _clamp_index(i: PrimExpr, n: PrimExpr) -> PrimExpr:
    """``i`` clamped into ``[0, n)`` (the load stays inside the buffer whatever ``i`` is)."""
    return tx.max(tx.min(i, n - 1), _c(0))


def resample_dtype(dtype: Any) -> DataType:
    """The weight/accumulation dtype of ``resample`` for inputs of ``dtype``: float64 for
    float64 and wide integers (exact for their values), float32 otherwise."""
    dt = as_dtype(dtype)
    if dt.bits == 64 or (dt.is_integer and dt.bits >= 32):
        return DataType("float64")
    return DataType("float32")


def _to_output(value: PrimExpr, dtype: DataType) -> PrimExpr:
    """The accumulated ``value`` stored as ``dtype``: integers round half to even and saturate
    (ONNX's ``saturate_cast``), floats are cast."""
    if dtype.is_float or dtype.is_bfloat:
        return tx.cast(dtype, value)
    if dtype.is_bool:
        return tx.ne(value, tx.const(value.dtype, 0))
    lo = tx.const(value.dtype, float(dtype.min_value()))
    hi = tx.const(value.dtype, float(dtype.max_value()))
    return tx.cast(dtype, tx.min(tx.max(tx.round(value), lo), hi))


# =============================================================================================
# resample
# =============================================================================================
@dataclass(frozen=True)
class ResampleAttrs:
    """``axis``: the axis resampled; the tables' first dimension is its new length."""

    axis: int = 0

    def __post_init__(self):
        if isinstance(self.axis, bool) or not isinstance(self.axis, int):
            raise KilnError(f"image.resample: axis must be an int, got {self.axis!r}")


def _resample_infer(call: Any) -> Any:
    name = "image.resample"
    x = tensor_arg(call, 0, name, "x")
    index = tensor_arg(call, 1, name, "index")
    weight = tensor_arg(call, 2, name, "weight")
    if not as_dtype(index.dtype).is_integer:
        raise StructInfoError(f"{name}: index must be an integer tensor, got {index.dtype}")
    if not as_dtype(weight.dtype).is_float:
        raise StructInfoError(f"{name}: weight must be a float tensor, got {weight.dtype}")
    ishape, wshape = arg_shape(index), arg_shape(weight)
    for what, shp in (("index", ishape), ("weight", wshape)):
        if shp is not None and len(shp) != 2:
            raise StructInfoError(f"{name}: {what} must be (out_len, taps), got {fmt_shape(shp)}")
    if ishape is not None and wshape is not None and any(
        const_int(a) is not None and const_int(b) is not None and const_int(a) != const_int(b)
        for a, b in zip(ishape, wshape)
    ):
        raise StructInfoError(f"{name}: index {fmt_shape(ishape)} and weight "
                              f"{fmt_shape(wshape)} differ in shape")
    ndim = arg_ndim(x)
    if ndim < 0:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    axis = normalize_axis(call.attrs.axis, ndim, name)
    shape = arg_shape(x)
    if shape is None or ishape is None:
        return tensor_sinfo(None, x.dtype, ndim=ndim)
    return tensor_sinfo([*shape[:axis], ishape[0], *shape[axis + 1:]], x.dtype)


def _resample_compute(x: te.Tensor, index: te.Tensor, weight: te.Tensor,
                      attrs: ResampleAttrs) -> te.Tensor:
    axis = normalize_axis(attrs.axis, x.ndim, "image.resample")
    taps = const_int(index.shape[1])
    if taps is None:
        raise KilnError("image.resample: the number of taps must be a constant")
    n = x.shape[axis]
    acc_dt = as_dtype(weight.dtype)
    out_dt = as_dtype(x.dtype)
    out_shape = [*x.shape[:axis], index.shape[0], *x.shape[axis + 1:]]

    def body(*i: PrimExpr) -> PrimExpr:
        total: PrimExpr | None = None
        for k in range(taps):
            pos = _clamp_index(tx.cast(INDEX_DTYPE, index(i[axis], _c(k))), n)
            value = tx.cast(acc_dt, x(*i[:axis], pos, *i[axis + 1:]))
            term = weight(i[axis], _c(k)) * value
            total = term if total is None else total + term
        if total is None:
            total = tx.const(acc_dt, 0.0)
        return _to_output(total, out_dt)

    return te.compute(out_shape, body, name="resample")


resample = register_op(
    "image.resample",
    inputs=("x", "index", "weight"),
    attrs=ResampleAttrs,
    infer=_resample_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_resample_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="Weighted gather along ``axis``: ``y[.., i, ..] = sum_k weight[i, k] * x[.., "
        "index[i, k], ..]`` (indices clamped into range; integer results round half to even "
        "and saturate). The kernel of separable resize.",
)


# =============================================================================================
# grid_sample
# =============================================================================================
_GS_MODES = ("nearest", "linear", "cubic")
_GS_PADDING = ("zeros", "border", "reflection")


@dataclass(frozen=True)
class GridSampleAttrs:
    """``mode``: nearest (round half to even), linear or cubic (Keys, a = -0.75);
    ``padding_mode``: zeros, border or reflection; ``align_corners``: whether -1 and 1 are the
    centers of the corner pixels (else their outer edges)."""

    mode: str = "linear"
    padding_mode: str = "zeros"
    align_corners: bool = False

    def __post_init__(self):
        if self.mode not in _GS_MODES:
            raise KilnError(f"image.grid_sample: mode must be one of {_GS_MODES}, got "
                            f"{self.mode!r}")
        if self.padding_mode not in _GS_PADDING:
            raise KilnError(f"image.grid_sample: padding_mode must be one of {_GS_PADDING}, "
                            f"got {self.padding_mode!r}")
        object.__setattr__(self, "align_corners", bool(self.align_corners))


def _grid_sample_infer(call: Any) -> Any:
    name = "image.grid_sample"
    x = tensor_arg(call, 0, name, "x")
    grid = tensor_arg(call, 1, name, "grid")
    for what, s in (("x", x), ("grid", grid)):
        if not as_dtype(s.dtype).is_float:
            raise StructInfoError(f"{name}: {what} must be a float tensor, got {s.dtype}")
    xs, gs = arg_shape(x), arg_shape(grid)
    if xs is None or gs is None:
        return tensor_sinfo(None, x.dtype, ndim=arg_ndim(x))
    spatial = len(xs) - 2
    if spatial < 1:
        raise StructInfoError(f"{name}: x must be (N, C, *spatial), got {fmt_shape(xs)}")
    if len(gs) != spatial + 2 or const_int(gs[-1]) not in (None, spatial):
        raise StructInfoError(f"{name}: grid must be (N, *out_spatial, {spatial}) for x of "
                              f"shape {fmt_shape(xs)}, got {fmt_shape(gs)}")
    if None not in (const_int(xs[0]), const_int(gs[0])) and const_int(xs[0]) != const_int(gs[0]):
        raise StructInfoError(f"{name}: x {fmt_shape(xs)} and grid {fmt_shape(gs)} differ in "
                              "batch size")
    return tensor_sinfo([xs[0], xs[1], *gs[1:-1]], x.dtype)


def _reflect(v: PrimExpr, lo: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """``v`` reflected at the borders ``lo``/``hi`` until it lies between them (PyTorch's
    ``reflect_coordinates``); an empty range maps everything to ``lo``."""
    dt = v.dtype
    zero, one, half = tx.const(dt, 0.0), tx.const(dt, 1.0), tx.const(dt, 0.5)
    span = hi - lo
    safe = tx.select(span > zero, span, one)
    below = v < lo
    dx = tx.select(below, lo - v, v - hi)
    flips = tx.floor(dx / safe)
    r = dx - flips * safe
    even = tx.eq(tx.floor(flips * half), flips * half)
    to_low = tx.eq(below, even)  # below & even, or above & odd: measured from lo
    folded = tx.select(to_low, lo + r, hi - r)
    inside = tx.logical_and(v >= lo, v <= hi)
    return tx.select(span > zero, tx.select(inside, v, folded), lo)


def _cubic_weights(t: PrimExpr) -> list[PrimExpr]:
    """Keys cubic convolution weights (a = -0.75) of taps -1, 0, 1, 2 at fraction ``t``."""
    dt = t.dtype
    a = tx.const(dt, -0.75)

    def c(v: float) -> PrimExpr:
        return tx.const(dt, v)

    def far(d: PrimExpr) -> PrimExpr:  # 1 < |d| < 2
        return ((a * d - c(5.0) * a) * d + c(8.0) * a) * d - c(4.0) * a

    def near(d: PrimExpr) -> PrimExpr:  # |d| <= 1
        return ((a + c(2.0)) * d - (a + c(3.0))) * d * d + c(1.0)

    return [far(t + c(1.0)), near(t), near(c(1.0) - t), far(c(2.0) - t)]


def _grid_sample_compute(x: te.Tensor, grid: te.Tensor, attrs: GridSampleAttrs) -> te.Tensor:
    spatial = x.ndim - 2
    sizes = x.shape[2:]
    ft = DataType("float64") if as_dtype(x.dtype).bits == 64 else DataType("float32")
    out_dt = as_dtype(x.dtype)
    out_shape = [x.shape[0], x.shape[1], *grid.shape[1:-1]]

    def f(v: float) -> PrimExpr:
        return tx.const(ft, v)

    def axis_taps(d: int, n: PrimExpr, o: tuple[PrimExpr, ...]
                  ) -> list[tuple[PrimExpr, PrimExpr | None, PrimExpr | None]]:
        """(index, weight or None, in-range condition or None) per tap along spatial dim d."""
        size_i = sizes[d]
        size = tx.cast(ft, size_i)
        # the grid lists x (the last spatial dim) first
        g = tx.cast(ft, grid(n, *o, _c(spatial - 1 - d)))
        if attrs.align_corners:
            v = (g + f(1.0)) * f(0.5) * (size - f(1.0))
            lo, hi = f(0.0), size - f(1.0)
        else:
            v = ((g + f(1.0)) * size - f(1.0)) * f(0.5)
            lo, hi = f(-0.5), size - f(0.5)
        if attrs.mode == "nearest":
            v = tx.round(v)
        outside = tx.logical_or(v < lo, v > hi)
        if attrs.padding_mode == "border":
            v = tx.select(outside, tx.max(tx.min(v, size - f(1.0)), f(0.0)), v)
        elif attrs.padding_mode == "reflection":
            v = _reflect(v, lo, hi)

        def tap(i: PrimExpr) -> tuple[PrimExpr, PrimExpr | None]:
            """A tap at integer position ``i``: its clamped index and validity (zeros)."""
            if attrs.padding_mode == "zeros":
                return _clamp_index(i, size_i), tx.logical_and(i >= _c(0), i < size_i)
            if attrs.padding_mode == "reflection":
                i = tx.cast(INDEX_DTYPE, _reflect(tx.cast(ft, i), lo, hi))
            return _clamp_index(i, size_i), None

        if attrs.mode == "nearest":
            idx, ok = tap(tx.cast(INDEX_DTYPE, v))  # truncation, as the reference
            return [(idx, None, ok)]
        base = tx.floor(v)
        first = tx.cast(INDEX_DTYPE, base)
        t = v - base
        if attrs.mode == "linear":
            weights, offsets = [f(1.0) - t, t], [0, 1]
        else:
            weights, offsets = _cubic_weights(t), [-1, 0, 1, 2]
        out = []
        for w, off in zip(weights, offsets):
            idx, ok = tap(first + _c(off) if off else first)
            out.append((idx, w, ok))
        return out

    def body(n: PrimExpr, c: PrimExpr, *o: PrimExpr) -> PrimExpr:
        per_axis = [axis_taps(d, n, o) for d in range(spatial)]
        combos: list[tuple[list[PrimExpr], PrimExpr | None, list[PrimExpr]]] = [([], None, [])]
        for taps in per_axis:  # the product of the per-axis taps
            grown = []
            for idx, w, oks in combos:
                for i, wt, ok in taps:
                    weight = wt if w is None else (w if wt is None else w * wt)
                    grown.append(([*idx, i], weight, oks if ok is None else [*oks, ok]))
            combos = grown
        total: PrimExpr | None = None
        for idx, w, oks in combos:
            value = tx.cast(ft, x(n, c, *idx))
            if oks:
                value = tx.select(tx.all_of(oks), value, f(0.0))
            term = value if w is None else w * value
            total = term if total is None else total + term
        assert total is not None
        return tx.cast(out_dt, total)

    return te.compute(out_shape, body, name="grid_sample")


grid_sample = register_op(
    "image.grid_sample",
    inputs=("x", "grid"),
    attrs=GridSampleAttrs,
    infer=_grid_sample_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_grid_sample_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="Sample ``x`` (N, C, *spatial) at the normalized coordinates of ``grid`` (N, "
        "*out_spatial, ndim; the last spatial axis first), ONNX GridSample / PyTorch "
        "``grid_sample``.",
)


# =============================================================================================
# roi_align
# =============================================================================================
#: The most sample points per bin along each axis: ``sampling_ratio ** 2`` bilinear samples
#: per output element (a million at this bound) -- beyond it a run would take hours for any
#: real number of regions (fuzz seed 3031165: 10**6, 10**12 samples a bin, ran "forever");
#: detection models use 0 (adaptive) or 2.
MAX_SAMPLING_RATIO = 1024


@dataclass(frozen=True)
class RoiAlignAttrs:
    """``output_size``: (height, width) of every pooled region; ``sampling_ratio``: sample
    points per bin along each axis (> 0); ``spatial_scale``: maps roi coordinates onto ``x``;
    ``mode``: avg or max; ``half_pixel``: shift pixel centers by -0.5 (ONNX
    ``coordinate_transformation_mode="half_pixel"``; else rois are at least 1x1)."""

    output_size: tuple[int, int] = (1, 1)
    sampling_ratio: int = 1
    spatial_scale: float = 1.0
    mode: str = "avg"
    half_pixel: bool = True

    def __post_init__(self):
        size = tuple(self.output_size)
        if len(size) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1
                                 for v in size):
            raise KilnError(f"image.roi_align: output_size must be two positive ints, got "
                            f"{self.output_size!r}")
        object.__setattr__(self, "output_size", size)
        s = self.sampling_ratio
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise KilnError(f"image.roi_align: sampling_ratio must be a positive int, got {s!r}")
        if s > MAX_SAMPLING_RATIO:
            raise KilnError(f"image.roi_align: sampling_ratio {s} asks for {s}**2 samples per "
                            f"output element; at most {MAX_SAMPLING_RATIO} per axis is "
                            "supported")
        if self.mode not in ("avg", "max"):
            raise KilnError(f"image.roi_align: mode must be 'avg' or 'max', got {self.mode!r}")
        object.__setattr__(self, "spatial_scale", float(self.spatial_scale))
        object.__setattr__(self, "half_pixel", bool(self.half_pixel))


def _roi_align_infer(call: Any) -> Any:
    name = "image.roi_align"
    x = tensor_arg(call, 0, name, "x")
    rois = tensor_arg(call, 1, name, "rois")
    bidx = tensor_arg(call, 2, name, "batch_indices")
    if not as_dtype(x.dtype).is_float or not as_dtype(rois.dtype).is_float:
        raise StructInfoError(f"{name}: x and rois must be float tensors, got {x.dtype} and "
                              f"{rois.dtype}")
    if not as_dtype(bidx.dtype).is_integer:
        raise StructInfoError(f"{name}: batch_indices must be an integer tensor, got "
                              f"{bidx.dtype}")
    xs, rs, bs = arg_shape(x), arg_shape(rois), arg_shape(bidx)
    if xs is not None and len(xs) != 4:
        raise StructInfoError(f"{name}: x must be (N, C, H, W), got {fmt_shape(xs)}")
    if rs is not None and (len(rs) != 2 or const_int(rs[1]) not in (None, 4)):
        raise StructInfoError(f"{name}: rois must be (num_rois, 4), got {fmt_shape(rs)}")
    if bs is not None and len(bs) != 1:
        raise StructInfoError(f"{name}: batch_indices must be (num_rois,), got {fmt_shape(bs)}")
    if (rs is not None and bs is not None and None not in (const_int(rs[0]), const_int(bs[0]))
            and const_int(rs[0]) != const_int(bs[0])):
        raise StructInfoError(f"{name}: batch_indices {fmt_shape(bs)} must give one image per "
                              f"region of rois {fmt_shape(rs)}")
    if xs is None or rs is None:
        return tensor_sinfo(None, x.dtype, ndim=4)
    return tensor_sinfo([rs[0], xs[1], *call.attrs.output_size], x.dtype)


def _roi_align_compute(x: te.Tensor, rois: te.Tensor, batch_indices: te.Tensor,
                       attrs: RoiAlignAttrs) -> te.Tensor:
    n_batch, channels, height, width = x.shape
    out_h, out_w = attrs.output_size
    grid = attrs.sampling_ratio
    f64 = DataType("float64")
    acc_dt = resample_dtype(x.dtype)
    ky = te.reduce_axis((0, grid), name="ky")
    kx = te.reduce_axis((0, grid), name="kx")

    def f(v: float) -> PrimExpr:
        return tx.const(f64, v)

    def axis_sample(r: PrimExpr, p: PrimExpr, k: Any, lo: int, hi: int, out: int,
                    size: PrimExpr) -> tuple[PrimExpr, PrimExpr, PrimExpr, PrimExpr, PrimExpr]:
        """(valid, low index, high index, low weight, high weight) of sample k of bin p."""
        shift = f(0.5 if attrs.half_pixel else 0.0)
        scale = f(attrs.spatial_scale)
        start = tx.cast(f64, rois(r, _c(lo))) * scale - shift
        length = tx.cast(f64, rois(r, _c(hi))) * scale - shift - start
        if not attrs.half_pixel:
            length = tx.max(length, f(1.0))  # malformed rois are forced to 1x1
        bin_len = length / f(float(out))
        pos = start + tx.cast(f64, p) * bin_len + (tx.cast(f64, k) + f(0.5)) * bin_len / f(
            float(grid))
        fsize = tx.cast(f64, size)
        valid = tx.logical_and(pos >= f(-1.0), pos <= fsize)
        pos = tx.max(pos, f(0.0))
        low = tx.cast(INDEX_DTYPE, pos)
        at_end = low >= size - 1
        low = tx.select(at_end, size - 1, low)
        high = tx.select(at_end, size - 1, low + 1)
        frac = tx.select(at_end, f(0.0), pos - tx.cast(f64, low))
        return valid, _clamp_index(low, size), _clamp_index(high, size), f(1.0) - frac, frac

    def body(r: PrimExpr, c: PrimExpr, ph: PrimExpr, pw: PrimExpr) -> PrimExpr:
        b = tx.check_index(batch_indices(r), n_batch, "image.roi_align: batch_indices",
                           allow_negative=False)
        vy, y0, y1, hy, ly = axis_sample(r, ph, ky, 1, 3, out_h, height)
        vx, x0, x1, hx, lx = axis_sample(r, pw, kx, 0, 2, out_w, width)
        terms = [tx.cast(acc_dt, wy * wx) * tx.cast(acc_dt, x(b, c, yi, xi))
                 for wy, yi in ((hy, y0), (ly, y1)) for wx, xi in ((hx, x0), (lx, x1))]
        zero = tx.const(acc_dt, 0.0)
        if attrs.mode == "avg":
            total = terms[0] + terms[1] + terms[2] + terms[3]
            sample = total / tx.const(acc_dt, float(grid * grid))
            return te.sum(tx.select(tx.logical_and(vy, vx), sample, zero), axis=[ky, kx])
        sample = tx.max(tx.max(terms[0], terms[1]), tx.max(terms[2], terms[3]))
        return te.max(tx.select(tx.logical_and(vy, vx), sample, zero), axis=[ky, kx])

    pooled = te.compute([rois.shape[0], channels, out_h, out_w], body, name="roi_align",
                        attrs=assume(equal_dims([(
                            batch_indices.shape[0], rois.shape[0],
                            "image.roi_align: batch_indices must give one image per region "
                            "of rois")])))
    if as_dtype(x.dtype) == acc_dt:
        return pooled
    return te.compute(pooled.shape, lambda *i: tx.cast(x.dtype, pooled(*i)),
                      name="roi_align_cast")


roi_align = register_op(
    "image.roi_align",
    inputs=("x", "rois", "batch_indices"),
    attrs=RoiAlignAttrs,
    infer=_roi_align_infer,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_roi_align_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="RoiAlign (Mask R-CNN): average or max of bilinear samples on a fixed grid in every "
        "bin of every roi (x1, y1, x2, y2) of image ``batch_indices[r]``; ONNX RoiAlign.",
)


# =============================================================================================
# resize_axis: one axis of a resize whose scales / sizes / roi are known only at run time
# =============================================================================================
RESIZE_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                      "align_corners", "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
RESIZE_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


@dataclass(frozen=True)
class ResizeAxisAttrs:
    """One axis of an ONNX Resize whose tables cannot be built at import time.

    ``axis``: the resized axis; ``slot``: its entry in the ``scales`` (k,) and ``roi`` (2k,)
    inputs; ``length``: the output length (usually a symbolic dim bound by the ``resize`` shape
    function); the rest are the Resize attributes (``nearest_mode="simple"`` is Resize-10 /
    Upsample: floor when upsampling, ceil when downsampling).
    """

    axis: int = 0
    slot: int = 0
    length: Any = 1
    mode: str = "nearest"
    coord: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0

    def __post_init__(self):
        name = "image.resize_axis"
        for what in ("axis", "slot"):
            v = getattr(self, what)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise KilnError(f"{name}: {what} must be a non-negative int, got {v!r}")
        if isinstance(self.length, bool) or not isinstance(self.length, (int, PrimExpr)):
            raise KilnError(f"{name}: length must be an int or a PrimExpr, got {self.length!r}")
        if self.mode not in ("nearest", "linear", "cubic"):
            raise KilnError(f"{name}: mode must be nearest, linear or cubic, got {self.mode!r}")
        if self.coord not in RESIZE_COORD_MODES:
            raise KilnError(f"{name}: unknown coordinate mode {self.coord!r}")
        if self.nearest_mode not in RESIZE_NEAREST_MODES:
            raise KilnError(f"{name}: unknown nearest_mode {self.nearest_mode!r}")
        object.__setattr__(self, "cubic_a", float(self.cubic_a))
        object.__setattr__(self, "exclude_outside", bool(self.exclude_outside))
        object.__setattr__(self, "extrapolation_value", float(self.extrapolation_value))


def _resize_axis_infer(call: Any) -> Any:
    name = "image.resize_axis"
    x = tensor_arg(call, 0, name, "x")
    scales = tensor_arg(call, 1, name, "scales")
    roi = tensor_arg(call, 2, name, "roi")
    ss, rs = arg_shape(scales), arg_shape(roi)
    k = const_int(ss[0]) if ss is not None and len(ss) == 1 else None
    if scales.dtype != "float64" or k is None or call.attrs.slot >= k:
        raise StructInfoError(f"{name}: scales must be a 1-d float64 tensor of static length "
                              f"above slot {call.attrs.slot}, got {scales}")
    if not as_dtype(roi.dtype).is_float or rs is None or len(rs) != 1 or \
            const_int(rs[0]) != 2 * k:
        raise StructInfoError(f"{name}: roi must be a float tensor of {2 * k} entries, got "
                              f"{roi}")
    if call.attrs.mode != "nearest" and as_dtype(x.dtype).is_bool:
        raise StructInfoError(f"{name}: mode {call.attrs.mode!r} needs a numeric input")
    ndim = arg_ndim(x)
    if ndim < 0:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    axis = normalize_axis(call.attrs.axis, ndim, name)
    shape = arg_shape(x)
    if shape is None:
        return tensor_sinfo(None, x.dtype, ndim=ndim)
    return tensor_sinfo([*shape[:axis], call.attrs.length, *shape[axis + 1:]], x.dtype)


def resize_source_coord(coord: str, y: PrimExpr, scale: PrimExpr, in_len: PrimExpr,
                        out_len: PrimExpr, roi: tuple[PrimExpr, PrimExpr]) -> PrimExpr:
    """Input coordinate (float64) of output position ``y`` (float64) under ONNX Resize's
    ``coord`` mode, in the reference implementation's order of operations; the roi terms are
    computed in the roi's own dtype (float32 roi values round there, as in numpy, which
    decides ties of nearest rounding)."""
    f64 = DataType("float64")

    def f(v: float) -> PrimExpr:
        return tx.const(f64, v)

    n, m = tx.cast(f64, in_len), tx.cast(f64, out_len)
    width = scale * n  # the "real" output length the coordinate rules use
    single = tx.eq(width, f(1.0))
    if coord == "align_corners":
        return tx.select(single, f(0.0), y * (n - f(1.0)) / (width - f(1.0)))
    if coord == "asymmetric":
        return y / scale
    if coord == "tf_half_pixel_for_nn":
        return (y + f(0.5)) / scale
    if coord == "tf_crop_and_resize":
        start, end = roi
        rdt = as_dtype(start.dtype)
        span = end - start
        n_1 = tx.cast(rdt, in_len - 1)
        x = tx.select(single, tx.cast(f64, span * n_1 / tx.const(rdt, 2.0)),
                      y * tx.cast(f64, span) * (n - f(1.0)) / (width - f(1.0)))
        return x + tx.cast(f64, start * n_1)
    if coord == "pytorch_half_pixel":
        return tx.select(single, f(-0.5), (y + f(0.5)) / scale - f(0.5))
    if coord == "half_pixel_symmetric":
        offset = n / f(2.0) * (f(1.0) - m / width)
        return offset + (y + f(0.5)) / scale - f(0.5)
    return (y + f(0.5)) / scale - f(0.5)  # half_pixel


def _resize_taps(x: PrimExpr, scale: PrimExpr, attrs: ResizeAxisAttrs
                 ) -> list[tuple[PrimExpr, PrimExpr | None]]:
    """(unclamped input index, float64 weight or None) of every tap at source coordinate ``x``,
    as ``converters/image.py``'s constant tables make them."""
    f64 = DataType("float64")

    def f(v: float) -> PrimExpr:
        return tx.const(f64, v)

    base = tx.floor(x)
    if attrs.mode == "nearest":
        frac = x - base
        mode = attrs.nearest_mode
        up = {"round_prefer_floor": frac > f(0.5), "round_prefer_ceil": frac >= f(0.5),
              "floor": None, "ceil": frac > f(0.0)}
        if mode == "simple":  # ceil when downsampling, floor otherwise
            cond: PrimExpr | None = tx.logical_and(scale < f(1.0), frac > f(0.0))
        else:
            cond = up[mode]
        idx = tx.cast(INDEX_DTYPE, base)
        return [(idx if cond is None else tx.select(cond, idx + _c(1), idx), None)]
    # ratio in (0, 1]: an exact integer coordinate counts as the right end of its interval
    base = tx.select(tx.eq(x, base), base - f(1.0), base)
    r = x - base
    first = tx.cast(INDEX_DTYPE, base)
    if attrs.mode == "linear":
        return [(first, f(1.0) - r), (first + _c(1), r)]
    a = f(attrs.cubic_a)

    def near(d: PrimExpr) -> PrimExpr:
        return ((a + f(2.0)) * d - (a + f(3.0))) * d * d + f(1.0)

    def far(d: PrimExpr) -> PrimExpr:
        return ((a * d - f(5.0) * a) * d + f(8.0) * a) * d - f(4.0) * a

    weights = [far(r + f(1.0)), near(r), near(f(1.0) - r), far(f(2.0) - r)]
    return [(first + _c(k - 1) if k != 1 else first, w) for k, w in enumerate(weights)]


@dataclass(frozen=True)
class _AxisFrame:
    """What both run-time resize kernels derive from their inputs and attributes."""

    axis: int
    n: PrimExpr          # input length along the axis
    out_len: PrimExpr
    out_shape: list
    acc_dt: DataType
    out_dt: DataType
    slot: PrimExpr       # this axis' entry in the scales tensor
    coords: te.Tensor    # source coordinate of every output position (float64)


def _axis_frame(x: te.Tensor, scales: te.Tensor, roi: te.Tensor, attrs: ResizeAxisAttrs,
                name: str) -> _AxisFrame:
    axis = normalize_axis(attrs.axis, x.ndim, name)
    n = x.shape[axis]
    k = const_int(scales.shape[0])
    out_len = tx.const(INDEX_DTYPE, attrs.length) if isinstance(attrs.length, int) \
        else attrs.length
    f64 = DataType("float64")
    slot = _c(attrs.slot)
    box = (roi(slot), roi(_c(attrs.slot + k)))
    # the source coordinates are a stage of their own: every tap uses them several times
    coords = te.compute((out_len,), lambda o: resize_source_coord(
        attrs.coord, tx.cast(f64, o), scales(slot), n, out_len, box), name="resize_src")
    return _AxisFrame(axis, n, out_len, [*x.shape[:axis], out_len, *x.shape[axis + 1:]],
                      resample_dtype(x.dtype), as_dtype(x.dtype), slot, coords)


def _resize_axis_compute(x: te.Tensor, scales: te.Tensor, roi: te.Tensor,
                         attrs: ResizeAxisAttrs) -> te.Tensor:
    fr = _axis_frame(x, scales, roi, attrs, "image.resize_axis")
    axis, n, out_len, out_shape = fr.axis, fr.n, fr.out_len, fr.out_shape
    acc_dt, out_dt, slot, coords = fr.acc_dt, fr.out_dt, fr.slot, fr.coords
    f64 = DataType("float64")

    # per output position of the axis: the (clamped) input index and weight of every tap,
    # tables computed once per call like the import-time ones (weights renormalized over the
    # taps inside the input with exclude_outside)
    count = len(_resize_taps(tx.const(f64, 0.0), tx.const(f64, 1.0), attrs))
    exclude = attrs.exclude_outside and attrs.mode != "nearest"

    def pick(t: PrimExpr, values: list[PrimExpr]) -> PrimExpr:
        out = values[-1]
        for q in range(len(values) - 2, -1, -1):
            out = tx.select(tx.eq(t, _c(q)), values[q], out)
        return out

    def index(o: PrimExpr, t: PrimExpr) -> PrimExpr:
        taps = _resize_taps(coords(o), scales(slot), attrs)
        return pick(t, [_clamp_index(j, n) for j, _ in taps])

    def weight(o: PrimExpr, t: PrimExpr) -> PrimExpr:
        zero = tx.const(f64, 0.0)
        taps = _resize_taps(coords(o), scales(slot), attrs)
        if not exclude:
            return pick(t, [w for _, w in taps])
        kept = [tx.select(tx.logical_and(j >= _c(0), j < n), w, zero) for j, w in taps]
        total = kept[0]
        for w in kept[1:]:
            total = total + w
        return pick(t, kept) / tx.select(tx.eq(total, zero), tx.const(f64, 1.0), total)

    indices = te.compute((out_len, count), index, name="resize_index")
    if attrs.mode != "nearest":
        weights = te.compute((out_len, count), weight, name="resize_weight")

    def body(*i: PrimExpr) -> PrimExpr:
        o = i[axis]
        value: PrimExpr | None = None
        for q in range(count):
            v = x(*i[:axis], indices(o, _c(q)), *i[axis + 1:])
            term = v if attrs.mode == "nearest" else \
                tx.cast(acc_dt, weights(o, _c(q))) * tx.cast(acc_dt, v)
            value = term if value is None else value + term
        assert value is not None
        out = value if attrs.mode == "nearest" else _to_output(value, out_dt)
        if attrs.coord == "tf_crop_and_resize":
            src = coords(i[axis])
            outside = tx.logical_or(src < tx.const(f64, 0.0), src > tx.cast(f64, n - _c(1)))
            fill = tx.cast(out_dt, tx.const(f64, attrs.extrapolation_value))
            if out_dt.is_bool:
                fill = tx.const(out_dt, bool(attrs.extrapolation_value))
            out = tx.select(outside, fill, out)
        return out

    return te.compute(out_shape, body, name="resize_axis")


resize_axis = register_op(
    "image.resize_axis",
    inputs=("x", "scales", "roi"),
    attrs=ResizeAxisAttrs,
    infer=_resize_axis_infer,
    pattern=OpPattern.INJECTIVE,
    compute=_resize_axis_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="One axis of an ONNX Resize with run-time scales (float64 (k,): entry ``slot`` is this "
        "axis's scale) and roi (float (2k,): starts then ends): the kernel computes every "
        "output position's source coordinate, taps and weights (nearest, linear, cubic) the "
        "way ``image.resample``'s import-time tables are made.",
)


# =============================================================================================
# resize_axis_antialias: the same with a kernel stretched by 1/scale (its tap count is run-time)
# =============================================================================================
def _resize_aa_infer(call: Any) -> Any:
    name = "image.resize_axis_antialias"
    if call.attrs.mode not in ("linear", "cubic"):
        raise StructInfoError(f"{name}: antialias is defined for linear and cubic modes, got "
                              f"{call.attrs.mode!r}")
    taps = arg_shape(tensor_arg(call, 3, name, "taps"))
    if taps is None or len(taps) != 1:
        raise StructInfoError(f"{name}: taps must be a 1-d tensor (its length is the tap "
                              "count)")
    return _resize_axis_infer(call)


def _antialias_weight(d: PrimExpr, attrs: ResizeAxisAttrs) -> PrimExpr:
    """The antialiasing kernel (triangle or Keys cubic) at float64 distance ``d``."""
    f64 = DataType("float64")

    def f(v: float) -> PrimExpr:
        return tx.const(f64, v)

    d = tx.fabs(d)
    if attrs.mode == "linear":
        return tx.max(f(1.0) - d, f(0.0))
    a = f(attrs.cubic_a)
    d2 = d * d
    d3 = d * d2
    near = (a + f(2.0)) * d3 - (a + f(3.0)) * d2 + f(1.0)
    far = a * d3 - f(5.0) * a * d2 + f(8.0) * a * d - f(4.0) * a
    return tx.select(d <= f(1.0), near, tx.select(d < f(2.0), far, f(0.0)))


def _resize_aa_compute(x: te.Tensor, scales: te.Tensor, roi: te.Tensor, taps: te.Tensor,
                       attrs: ResizeAxisAttrs) -> te.Tensor:
    """Taps ``i`` in ``[1 - T/2, T/2]`` around the source coordinate weigh ``kernel((i - r) *
    min(scale, 1))``, normalized by their sum (a first reduction); ``T`` (even, from the
    ``resize_taps`` shape function) is the length of ``taps``."""
    fr = _axis_frame(x, scales, roi, attrs, "image.resize_axis_antialias")
    axis, n, out_len, out_shape = fr.axis, fr.n, fr.out_len, fr.out_shape
    acc_dt, out_dt, slot, coords = fr.acc_dt, fr.out_dt, fr.slot, fr.coords
    count = taps.shape[0]
    f64 = DataType("float64")
    zero, one = tx.const(f64, 0.0), tx.const(f64, 1.0)

    def tap(o: PrimExpr, j: PrimExpr) -> tuple[PrimExpr, PrimExpr]:
        """(unclamped index, weight) of reduction step ``j`` at output position ``o``."""
        src, s = coords(o), tx.min(scales(slot), one)
        base = tx.floor(src)
        base = tx.select(tx.eq(src, base), base - one, base)
        i = j + _c(1) - tx.floordiv(count, _c(2))
        w = _antialias_weight((tx.cast(f64, i) - (src - base)) * s, attrs)
        idx = tx.cast(INDEX_DTYPE, base) + i
        if attrs.exclude_outside:
            w = tx.select(tx.logical_and(idx >= _c(0), idx < n), w, zero)
        return idx, w

    jw = te.reduce_axis((0, count), name="jw")
    wsum = te.compute((out_len,), lambda o: te.sum(tap(o, jw)[1], axis=jw), name="resize_wsum")
    jx = te.reduce_axis((0, count), name="jx")

    def body(*i: PrimExpr) -> PrimExpr:
        idx, w = tap(i[axis], jx)
        total = wsum(i[axis])
        w = w / tx.select(tx.eq(total, zero), one, total)
        v = x(*i[:axis], _clamp_index(idx, n), *i[axis + 1:])
        return te.sum(tx.cast(acc_dt, w) * tx.cast(acc_dt, v), axis=jx)

    acc = te.compute(out_shape, body, name="resize_antialias")
    crop = attrs.coord == "tf_crop_and_resize"
    if out_dt == acc_dt and not crop:
        return acc

    def finish(*i: PrimExpr) -> PrimExpr:
        out = _to_output(acc(*i), out_dt)
        if crop:
            src = coords(i[axis])
            outside = tx.logical_or(src < zero, src > tx.cast(f64, n - _c(1)))
            out = tx.select(outside, tx.cast(out_dt, tx.const(f64, attrs.extrapolation_value)),
                            out)
        return out

    return te.compute(out_shape, finish, name="resize_antialias_out")


resize_axis_antialias = register_op(
    "image.resize_axis_antialias",
    inputs=("x", "scales", "roi", "taps"),
    attrs=ResizeAxisAttrs,
    infer=_resize_aa_infer,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_resize_aa_compute,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="``image.resize_axis`` with ONNX Resize's antialias (linear or cubic): when "
        "downsampling the kernel is stretched by 1/scale, so the tap count (the length of "
        "``taps``, bound at run time) depends on the scale; weights are normalized.",
)
