"""Image ONNX operators: Resize/Upsample, GridSample, AffineGrid, RoiAlign, CenterCropPad.

Resize is separable: for each resized axis, the ONNX coordinate rules give every output
position a few input positions and their weights. Those ``(out_len, taps)`` tables are computed
here, in float64, following the ONNX reference implementation step by step (coordinate
transformation, neighbour selection, coefficients, ``exclude_outside``, antialiasing), and the
model runs one ``image.resample`` per resized axis (``take`` for nearest, which needs no
arithmetic and so works for every dtype) when sizes, scales and roi are known at import time.
When they are graph values, ``resize_rt`` emits the ``resize`` shape function (output lengths
bound at run time) and one ``image.resize_axis`` per axis, whose kernel computes the same
coordinates, taps and weights from a small float64 tensor of scales: one executable serves any
scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....op.image import resample_dtype
from ....runtime.shape_funcs import RESIZE_POLICIES
from ..registry import converter
from . import dynamic as rt
from .common import dtype_of, ints, ndim_of, norm_axis, reshape, scalar, shape_of, static_int

# =============================================================================================
# Resize: per-axis interpolation tables
# =============================================================================================
_COORD_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                "asymmetric", "tf_crop_and_resize", "tf_half_pixel_for_nn")
_NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil", "simple")


@dataclass(frozen=True)
class ResizeSpec:
    """The attributes of one Resize node that decide its tables."""

    mode: str = "nearest"
    coord: str = "half_pixel"
    nearest_mode: str = "round_prefer_floor"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    antialias: bool = False
    extrapolation_value: float = 0.0


@dataclass(frozen=True)
class AxisTable:
    """Resampling of one axis: ``index``/``weight`` are (out_len, taps); ``extrapolated`` marks
    output positions that take the extrapolation value (tf_crop_and_resize), or is None."""

    index: np.ndarray
    weight: np.ndarray
    extrapolated: np.ndarray | None


def _source_coords(out_len: int, in_len: int, scale: float, coord: str,
                   roi: tuple[float, float]) -> np.ndarray:
    """Input coordinate of every output position (float64), per ``coord``."""
    y = np.arange(out_len, dtype=np.float64)
    width = scale * in_len  # the "real" output length the coordinate rules use
    if coord == "align_corners":
        return np.zeros(out_len) if width == 1 else y * (in_len - 1) / (width - 1)
    if coord == "asymmetric":
        return y / scale
    if coord == "tf_half_pixel_for_nn":
        return (y + 0.5) / scale
    if coord == "tf_crop_and_resize":
        start, end = roi
        if width == 1:
            x = np.full(out_len, (end - start) * (in_len - 1) / 2)
        else:
            x = y * (end - start) * (in_len - 1) / (width - 1)
        return x + start * (in_len - 1)
    if coord == "pytorch_half_pixel":
        return np.full(out_len, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    if coord == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / width)
        return offset + (y + 0.5) / scale - 0.5
    return (y + 0.5) / scale - 0.5  # half_pixel


def _coefficients(ratio: np.ndarray, scale: float, spec: ResizeSpec) -> np.ndarray:
    """(out_len, taps) weights of taps ``1 - taps/2 .. taps/2`` around ``ratio`` in (0, 1]."""
    r = ratio[:, None]
    a = spec.cubic_a
    if spec.antialias:  # a kernel stretched by 1/scale when downsampling, normalized
        s = min(scale, 1.0)
        if spec.mode == "linear":
            start = int(np.floor(-1 / s) + 1)
            args = (np.arange(start, 2 - start)[None, :] - r) * s
            w = np.clip(1 - np.abs(args), 0, 1)
        else:
            start = int(np.floor(-2 / s) + 1)
            d = np.abs(s * (np.arange(start, 2 - start)[None, :] - r))
            near = (a + 2) * d**3 - (a + 3) * d**2 + 1
            far = a * d**3 - 5 * a * d**2 + 8 * a * d - 4 * a
            w = np.where(d <= 1, near, np.where(d < 2, far, 0.0))
        return w / w.sum(axis=1, keepdims=True)
    if spec.mode == "linear":
        return np.concatenate([1 - r, r], axis=1)

    def near(d: np.ndarray) -> np.ndarray:
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return np.concatenate([far(r + 1), near(r), near(1 - r), far(2 - r)], axis=1)


def _nearest_index(x: np.ndarray, scale: float, mode: str) -> np.ndarray:
    """The input position nearest output coordinate ``x`` under ``mode`` (exact integers stay;
    ``simple`` is opset-10 Resize / Upsample: floor when upsampling, ceil when downsampling)."""
    base = np.floor(x)
    frac = x - base
    if mode == "simple":
        mode = "ceil" if scale < 1 else "floor"
    up = {"round_prefer_floor": frac > 0.5, "round_prefer_ceil": frac >= 0.5,
          "floor": np.zeros_like(frac, dtype=bool), "ceil": frac > 0}[mode]
    return (base + up).astype(np.int64)


def axis_table(in_len: int, out_len: int, scale: float, spec: ResizeSpec,
               roi: tuple[float, float] = (0.0, 1.0)) -> AxisTable:
    """The resampling tables of one axis (see the module docstring)."""
    x = _source_coords(out_len, in_len, scale, spec.coord, roi)
    extrapolated = None
    if spec.coord == "tf_crop_and_resize":
        extrapolated = (x < 0) | (x > in_len - 1)
    if spec.mode == "nearest":
        index = np.clip(_nearest_index(x, scale, spec.nearest_mode), 0, in_len - 1)
        return AxisTable(index[:, None], np.ones((out_len, 1)), extrapolated)
    # ratio in (0, 1]: an exact integer coordinate counts as the right end of its interval
    base = np.floor(x)
    exact = x == base
    base = np.where(exact, base - 1, base)
    ratio = x - base
    weight = _coefficients(ratio, scale, spec)
    taps = weight.shape[1]
    index = base.astype(np.int64)[:, None] + np.arange(1 - taps // 2, taps // 2 + 1)[None, :]
    if spec.exclude_outside:
        weight = np.where((index < 0) | (index >= in_len), 0.0, weight)
        total = weight.sum(axis=1, keepdims=True)
        weight = weight / np.where(total == 0, 1.0, total)
    return AxisTable(np.clip(index, 0, in_len - 1), weight, extrapolated)


def resize_plan(in_shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None,
                axes: list[int], roi: np.ndarray | None, policy: str = "stretch"
                ) -> list[tuple[int, int, float, tuple[float, float]]]:
    """(axis, out_len, scale, roi) of every axis that changes, following the ONNX reference
    (output lengths, keep_aspect_ratio_policy, the identity axes it skips)."""
    k = len(axes)
    if sizes is not None:
        out = [int(v) for v in sizes]
        factors = [out[i] / in_shape[a] for i, a in enumerate(axes)]
        if policy != "stretch":
            s = min(factors) if policy == "not_larger" else max(factors)
            factors = [s] * k
            out = [int(s * in_shape[a] + 0.5) for a in axes]
    else:
        assert scales is not None
        factors = [float(v) for v in scales]
        out = [int(np.float64(f) * in_shape[a]) for f, a in zip(factors, axes)]
    rois = [(0.0, 1.0)] * k if roi is None else [
        (float(roi[i]), float(roi[k + i])) for i in range(k)]
    plan = []
    for i, a in enumerate(axes):
        identity = (math.isclose(factors[i], 1.0) and out[i] == in_shape[a]
                    and math.isclose(rois[i][0], 0.0) and math.isclose(rois[i][1], 1.0))
        if not identity:
            plan.append((a, out[i], factors[i], rois[i]))
    return plan


def _resize(ctx: Any, node: Any, x: Any, spec: ResizeSpec, scales: np.ndarray | None,
            sizes: np.ndarray | None, roi: np.ndarray | None, axes: list[int] | None,
            policy: str = "stretch") -> Any:
    nd = ndim_of(x)
    axes = list(range(nd)) if axes is None else [norm_axis(a, nd) for a in axes]
    given = sizes if sizes is not None else scales
    if given is None:
        raise node.error("needs scales or sizes")
    if len(given) != len(axes):
        raise node.error(f"{'sizes' if sizes is not None else 'scales'} has {len(given)} "
                         f"entries for {len(axes)} resized axes")
    in_shape = [static_int(d) for d in shape_of(x)]
    if any(in_shape[a] is None for a in axes):
        raise node.error(f"the resized axes {axes} need static lengths, input shape is "
                         f"{shape_of(x)}")
    dt = dtype_of(x)
    if spec.mode != "nearest" and dt == "bool":
        raise node.error(f"mode {spec.mode!r} needs a numeric input, got bool")
    wdt = str(resample_dtype(dt))
    for axis, out_len, scale, axis_roi in resize_plan(tuple(in_shape), scales, sizes, axes,
                                                       roi, policy):
        if out_len <= 0:
            raise node.error(f"output length {out_len} along axis {axis} must be positive")
        t = axis_table(int(in_shape[axis]), out_len, scale, spec, axis_roi)
        if spec.mode == "nearest":
            x = ctx.emit(op.take(x, g.const(t.index[:, 0]), axis=axis))
        else:
            x = ctx.emit(op.image.resample(x, g.const(t.index), g.const(t.weight.astype(wdt)),
                                           axis=axis))
        if t.extrapolated is not None and t.extrapolated.any():
            mask = t.extrapolated.reshape([-1 if i == axis else 1 for i in range(nd)])
            x = ctx.emit(op.where(g.const(mask), scalar(spec.extrapolation_value, dt), x))
    return x


def _check_spec(node: Any, spec: ResizeSpec) -> None:
    if spec.mode not in ("nearest", "linear", "cubic"):
        raise node.error(f"unknown mode {spec.mode!r}")
    if spec.coord not in _COORD_MODES:
        raise node.error(f"unknown coordinate_transformation_mode {spec.coord!r}")
    if spec.nearest_mode not in _NEAREST_MODES:
        raise node.error(f"unknown nearest_mode {spec.nearest_mode!r}")
    if spec.antialias and spec.mode == "nearest":
        raise node.error("antialias is defined for linear and cubic modes only")


def _present(arr: np.ndarray | None) -> np.ndarray | None:
    """An optional tensor input; an empty tensor means absent (opset 11 placeholders)."""
    return None if arr is None or np.asarray(arr).size == 0 else np.asarray(arr)


# =============================================================================================
# Resize with scales / sizes / roi known only at run time
# =============================================================================================
def _given(node: Any, i: int) -> bool:
    """Whether optional input ``i`` is given: present and not an empty tensor (opset-11
    placeholders), whether its value is known at import time or not."""
    if not node.has_input(i):
        return False
    if node.is_const(i):
        return np.asarray(node.const_value(i)).size > 0
    shape = shape_of(node.input(i))
    return not (len(shape) == 1 and static_int(shape[0]) == 0)


def _in_lengths(x: Any, axes: list[int]) -> Any:
    """The input lengths of ``axes`` as a float64 (k,) tensor (read at run time if symbolic)."""
    dims = [static_int(shape_of(x)[a]) for a in axes]
    if None not in dims:
        return g.const(np.array(dims, np.float64))
    picked = op.take(op.dynamic_shape_of(x), g.const(np.array(axes, np.int64)), axis=0)
    return op.cast(picked, "float64")


def resize_rt(ctx: Any, node: Any, x: Any, spec: ResizeSpec, scales: Any, sizes: Any,
              roi: Any, axes: list[int] | None, policy: str = "stretch") -> Any:
    """Resize whose scales, sizes or roi are graph values: the ``resize`` shape function binds
    the output lengths, a float64 tensor carries each axis's scale (``out / in`` for sizes, one
    min/max scale under keep_aspect_ratio_policy) and one ``image.resize_axis`` per axis
    computes coordinates, taps and weights in the kernel. Every listed axis is resampled (an
    identity axis is an exact copy), since which ones change is known only at run time."""
    nd = ndim_of(x)
    axes = list(range(nd)) if axes is None else [norm_axis(a, nd) for a in axes]
    if len(set(axes)) != len(axes):
        raise node.error(f"axes {axes} repeat an axis")
    if policy not in RESIZE_POLICIES:
        raise node.error(f"unknown keep_aspect_ratio_policy {policy!r}")
    if spec.mode != "nearest" and dtype_of(x) == "bool":
        raise node.error(f"mode {spec.mode!r} needs a numeric input, got bool")
    given = sizes if sizes is not None else scales
    k = len(axes)
    glen = shape_of(given)
    if len(glen) != 1 or static_int(glen[0]) != k:
        raise node.error(f"{'sizes' if sizes is not None else 'scales'} must have {k} entries "
                         f"(one per resized axis), got {given.struct_info}")
    known = [None if a in axes else d for a, d in enumerate(shape_of(x))]
    how = [g.ShapeExpr(shape_of(x)), given, g.ShapeExpr(tuple(axes)),
           g.PrimValue(int(sizes is not None)), g.PrimValue(RESIZE_POLICIES.index(policy))]
    dims = rt.runtime_shape(ctx, node, "resize", how, known)
    taps: list[Any] = []
    if spec.antialias:  # the tap count of each axis depends on its scale
        support = g.PrimValue(1 if spec.mode == "linear" else 2)
        counts = rt.runtime_shape(ctx, node, "resize_taps", [*how, support], [None] * k, "taps")
        taps = [ctx.emit(op.broadcast_to(g.const(np.zeros((), np.int8)), (t,)),
                         f"{node.name}_taps{i}") for i, t in enumerate(counts)]
    if sizes is None:
        scale = op.cast(scales, "float64")
    else:
        scale = op.divide(op.cast(sizes, "float64"), _in_lengths(x, axes))
        if policy != "stretch":
            pick = op.min if policy == "not_larger" else op.max
            scale = op.broadcast_to(pick(scale), (k,))
    scale = ctx.emit(scale, f"{node.name}_scales")
    if roi is None:
        roi = g.const(np.array([0.0] * k + [1.0] * k))
    else:
        if len(shape_of(roi)) != 1 or static_int(shape_of(roi)[0]) != 2 * k:
            raise node.error(f"roi must have {2 * k} entries (starts then ends of the resized "
                             f"axes), got {roi.struct_info}")
        if not str(roi.struct_info.dtype).startswith("float"):
            raise node.error(f"roi must be a float tensor, got {roi.struct_info}")
    attrs = dict(mode=spec.mode, coord=spec.coord, nearest_mode=spec.nearest_mode,
                 cubic_a=spec.cubic_a, exclude_outside=spec.exclude_outside,
                 extrapolation_value=spec.extrapolation_value)
    dt = dtype_of(x)
    # interpolate integers in float64 and 16-bit floats in float32 and round once at the end,
    # as the reference does (all axes in float64, one saturating cast)
    work = dt
    if spec.mode != "nearest" and dt not in ("float32", "float64"):
        work = "float32" if dt in ("float16", "bfloat16") else "float64"
        x = ctx.emit(op.cast(x, work), f"{node.name}_{work}")
    for slot, a in enumerate(axes):
        if spec.antialias:
            call = op.image.resize_axis_antialias(x, scale, roi, taps[slot], axis=a, slot=slot,
                                                  length=dims[a], **attrs)
        else:
            call = op.image.resize_axis(x, scale, roi, axis=a, slot=slot, length=dims[a],
                                        **attrs)
        x = ctx.emit(call)
    if work == dt:
        return x
    if work == "float64":  # round half to even and saturate (ONNX saturate_cast)
        info = np.iinfo(dt)
        x = op.clip(op.round(x), min=float(info.min), max=float(info.max))
    return op.cast(x, dt)


@converter("Resize", since=10)
def resize_v10(ctx: Any, node: Any) -> Any:
    spec = ResizeSpec(mode=_mode(node), coord="asymmetric", nearest_mode="simple")
    _check_spec(node, spec)
    if not node.is_const(1):
        return resize_rt(ctx, node, node.input(0), spec, node.input(1), None, None, None)
    return _resize(ctx, node, node.input(0), spec, node.const_input(1, "scales"), None, None,
                   None)


@converter("Resize", since=11)
def resize_v11(ctx: Any, node: Any) -> Any:
    spec = ResizeSpec(
        mode=node.attr("mode", "nearest"),
        coord=node.attr("coordinate_transformation_mode", "half_pixel"),
        nearest_mode=node.attr("nearest_mode", "round_prefer_floor"),
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        antialias=bool(node.attr("antialias", 0)),
        extrapolation_value=float(node.attr("extrapolation_value", 0.0)),
    )
    _check_spec(node, spec)
    axes = node.attr("axes", None)
    axes = None if axes is None else list(axes)
    policy = node.attr("keep_aspect_ratio_policy", "stretch")
    crop = spec.coord == "tf_crop_and_resize"
    used = [i for i in ((1,) if crop else ()) + (2, 3) if _given(node, i)]
    if (2 in used) == (3 in used):
        raise node.error("exactly one of scales and sizes must be given")
    if not all(node.is_const(i) for i in used):  # run-time values: computed in the kernels
        roi, scales, sizes = (node.input(i) if i in used else None for i in (1, 2, 3))
        return resize_rt(ctx, node, node.input(0), spec, scales, sizes, roi, axes, policy)
    roi, scales, sizes = (_present(node.const_input(i, what)) if i in used else None
                          for i, what in ((1, "roi"), (2, "scales"), (3, "sizes")))
    return _resize(ctx, node, node.input(0), spec, scales, sizes, roi, axes, policy)


def _mode(node: Any) -> str:
    mode = node.attr("mode", "nearest")
    return "linear" if mode == "bilinear" else mode


@converter("Upsample", since=7)
def upsample_v7(ctx: Any, node: Any) -> Any:
    spec = ResizeSpec(mode=_mode(node), coord="asymmetric", nearest_mode="simple")
    _check_spec(node, spec)
    return _resize(ctx, node, node.input(0), spec, np.asarray(node.attr("scales"), "float32"),
                   None, None, None)


# Upsample-9 is Resize-10 (scales as an input, asymmetric coordinates; run-time scales too)
converter("Upsample", since=9)(resize_v10)


# =============================================================================================
# GridSample, AffineGrid
# =============================================================================================
_GS_MODE = {"bilinear": "linear", "bicubic": "cubic", "linear": "linear", "cubic": "cubic",
            "nearest": "nearest"}


@converter("GridSample", since=16)
def grid_sample(ctx: Any, node: Any) -> Any:
    mode = node.attr("mode", "linear" if node.opset >= 20 else "bilinear")
    if mode not in _GS_MODE:
        raise node.error(f"unknown mode {mode!r}")
    padding = node.attr("padding_mode", "zeros")
    if padding not in ("zeros", "border", "reflection"):
        raise node.error(f"unknown padding_mode {padding!r}")
    return op.image.grid_sample(node.input(0), node.input(1), mode=_GS_MODE[mode],
                                padding_mode=padding,
                                align_corners=bool(node.attr("align_corners", 0)))


def affine_base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """(prod(spatial), ndim + 1) homogeneous normalized coordinates ``(x, y[, z], 1)`` of
    every output position (the last spatial axis is x), as the ONNX reference makes them."""
    axes = []
    for n in spatial:
        if align_corners:
            a = np.arange(-1, 1 + 0.0001, 2.0 / (n - 1)) if n > 1 else np.array([-1.0])
        else:
            step = 2.0 / n
            a = np.arange(-1 + step / 2, 1, step)
        axes.append(a[:n])
    mesh = np.meshgrid(*axes, indexing="ij")
    cols = [m.reshape(-1) for m in reversed(mesh)]
    return np.stack([*cols, np.ones(int(np.prod(spatial)))], axis=1)


@converter("AffineGrid", since=20)
def affine_grid(ctx: Any, node: Any) -> Any:
    theta = node.input(0)
    if not node.is_const(1):
        return _affine_grid_rt(ctx, node, theta)
    size = ints(node.const_input(1, "size"))
    spatial = size[2:]
    if len(spatial) not in (2, 3):
        raise node.error(f"size {size} must be (N, C, H, W) or (N, C, D, H, W)")
    base = affine_base_grid(spatial, bool(node.attr("align_corners", 0)))
    dt = dtype_of(theta)
    # (P, k+1) @ (N, k+1, k) -> (N, P, k)
    grid = op.matmul(g.const(base.astype(dt)), op.transpose(theta, (0, 2, 1)))
    return reshape(grid, [size[0], *spatial, len(spatial)])


def _affine_grid_rt(ctx: Any, node: Any, theta: Any) -> Any:
    """AffineGrid with ``size`` known only at run time: the output dims are bound by a shape
    function of ``size`` (N checked against theta's), and the base grid is computed in the
    graph from a ``dynamic_arange`` per spatial length instead of a constant table. Each
    output component ``j`` is ``theta[:, j, k] + sum_c theta[:, j, c] * coord_c`` broadcast
    over the spatial axes (coordinate 0 is x: the last spatial axis)."""
    size = node.input(1)
    n_size = rt.static_len(node, size, "size")
    k = n_size - 2
    if k not in (2, 3) or [static_int(d) for d in shape_of(theta)[1:]] != [k, k + 1]:
        raise node.error(f"size of {n_size} entries does not fit theta {theta.struct_info} "
                         "(N, 2, 3) or (N, 3, 4)")
    dims = rt.runtime_shape(ctx, node, "values", [size], [shape_of(theta)[0]] + [None] * (
        n_size - 1))
    spatial = dims[2:]
    dt = dtype_of(theta)
    size_f = ctx.emit(op.cast(size, dt), f"{node.name}_size_f")
    one = g.const(np.ones(1, dt))
    coords = []  # coords[c]: coordinate c (x, y, z) shaped (1, ..., len, ..., 1)
    for a in range(k - 1, -1, -1):
        i = op.dynamic_arange(scalar(0, dt), scalar(1, dt), (spatial[a],))
        n = op.strided_slice(size_f, (2 + a,), (3 + a,))
        if node.attr("align_corners", 0):
            c = op.divide(op.add(i, i), op.maximum(op.subtract(n, one), one))
        else:
            c = op.divide(op.add(op.add(i, i), one), n)
        c = op.subtract(c, one)
        for _ in range(a + 1):
            c = op.expand_dims(c, 0)
        for _ in range(k - 1 - a):
            c = op.expand_dims(c, -1)
        coords.append(ctx.emit(c, f"{node.name}_coord{a}"))
    parts = []
    for j in range(k):
        def coef(c: int, j: int = j) -> Any:
            t = op.strided_slice(theta, (j, c), (j + 1, c + 1), axes=(1, 2))
            return op.reshape(t, (shape_of(theta)[0],) + (1,) * k)

        acc = coef(k)
        for c in range(k):
            acc = op.add(acc, op.multiply(coef(c), coords[c]))
        parts.append(op.expand_dims(acc, -1))
    return op.concat(parts, axis=-1)


# =============================================================================================
# CenterCropPad
# =============================================================================================
@converter("CenterCropPad", since=18)
def center_crop_pad(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    nd = ndim_of(x)
    axes = node.attr("axes", None)
    axes = list(range(nd)) if axes is None else [norm_axis(int(a), nd) for a in axes]
    if not node.is_const(1):
        return _center_crop_pad_rt(ctx, node, x, axes)
    target = ints(node.const_input(1, "shape"))
    if len(target) != len(axes):
        raise node.error(f"shape {target} has {len(target)} entries for axes {axes}")
    dims = [static_int(d) for d in shape_of(x)]
    begin, end, crop_axes, pads = [], [], [], [(0, 0)] * nd
    for a, want in zip(axes, target):
        have = dims[a]
        if have is None:
            raise node.error(f"axis {a} needs a static length, input shape is {shape_of(x)}")
        if want < have:  # crop: the extra element of an odd difference goes at the end
            start = (have - want) // 2
            crop_axes.append(a)
            begin.append(start)
            end.append(start + want)
        elif want > have:
            before = (want - have) // 2
            pads[a] = (before, want - have - before)
    if crop_axes:
        x = ctx.emit(op.strided_slice(x, tuple(begin), tuple(end), axes=tuple(crop_axes)))
    if any(p != (0, 0) for p in pads):
        x = op.pad(x, tuple(pads))
    return x


def _center_crop_pad_rt(ctx: Any, node: Any, x: Any, axes: list[int]) -> Any:
    """CenterCropPad to a shape known only at run time: one ``dynamic_pad`` whose pads are
    computed in the graph (a negative pad crops). Cropping puts the extra element of an odd
    difference at the end and padding puts it at the end too, so the begin pad is the
    difference divided by two rounded toward zero."""
    i64 = "int64"
    dims = [static_int(shape_of(x)[a]) for a in axes]
    have: Any = g.const(np.array(dims, i64)) if None not in dims else op.take(
        op.dynamic_shape_of(x), g.const(np.array(axes, i64)), axis=0)
    diff = ctx.emit(op.subtract(rt.int64_tensor(node.input(1)), have), f"{node.name}_diff")
    zero, two = g.const(np.zeros(1, i64)), g.const(np.full(1, 2, i64))
    grow = op.floor_divide(op.maximum(diff, zero), two)
    shrink = op.floor_divide(op.maximum(op.negative(diff), zero), two)
    begin = ctx.emit(op.subtract(grow, shrink), f"{node.name}_begin")
    pads = ctx.emit(op.concat([begin, op.subtract(diff, begin)], axis=0), f"{node.name}_pads")
    return rt.pad_rt(ctx, node, x, pads, None, axes, "constant")


# =============================================================================================
# RoiAlign
# =============================================================================================
def _roi_align(node: Any, half_pixel: bool) -> Any:
    ratio = int(node.attr("sampling_ratio", 0))
    if ratio <= 0:
        raise node.error("sampling_ratio=0 (an adaptive, data-dependent number of samples per "
                         "bin) is not supported; give a positive sampling_ratio")
    mode = node.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise node.error(f"unknown mode {mode!r}")
    return op.image.roi_align(
        node.input(0), node.input(1), node.input(2),
        output_size=(int(node.attr("output_height", 1)), int(node.attr("output_width", 1))),
        sampling_ratio=ratio, spatial_scale=float(node.attr("spatial_scale", 1.0)), mode=mode,
        half_pixel=half_pixel)


@converter("RoiAlign", since=10)
def roi_align_v10(ctx: Any, node: Any) -> Any:
    return _roi_align(node, half_pixel=False)


@converter("RoiAlign", since=16)
def roi_align_v16(ctx: Any, node: Any) -> Any:
    coord = node.attr("coordinate_transformation_mode", "half_pixel")
    if coord not in ("half_pixel", "output_half_pixel"):
        raise node.error(f"unknown coordinate_transformation_mode {coord!r}")
    return _roi_align(node, half_pixel=coord == "half_pixel")
