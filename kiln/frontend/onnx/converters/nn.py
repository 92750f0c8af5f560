"""Neural-network ONNX operators: MatMul/Gemm, Conv, ConvTranspose, DeformConv, Col2Im,
pooling (Max/Average/Lp, MaxPool's Indices, MaxUnpool), normalization, softmax.

The kiln kernels are 2-D (``nn.conv2d``, ``nn.conv2d_backward_data``, ``nn.max_pool2d``,
``nn.avg_pool2d``): 1-D inputs are lifted to a unit height, 3-D ones are decomposed exactly --
convolutions into a sum over the kernel depth of 2-D convolutions of depth slices, max and
average pooling separably (H and W, then D).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from . import dynamic as rt
from .common import (
    dtype_of,
    ints,
    ndim_of,
    prod,
    reshape,
    scalar,
    shape_of,
    static_int,
    static_kernel,
)
from .random import training_dropout

#: 16-bit floats whose products are summed in float32 and rounded once per node (as numpy,
#: onnxruntime and torch do): a 16-bit running sum loses a bit per few terms.
HALF_ACCUMULATE = {"float16": "float32", "bfloat16": "float32"}


@converter("MatMul")
def matmul(ctx: Any, node: Any) -> Any:
    a, b = node.input(0), node.input(1)
    dt = dtype_of(a)
    wide = HALF_ACCUMULATE.get(dt)
    if wide is None:
        return op.matmul(a, b)
    return op.cast(op.matmul(a, b, out_dtype=wide), dt)


@converter("Gemm")
def gemm(ctx: Any, node: Any) -> Any:
    a, b, c = node.input(0), node.input(1), node.input(2)
    dt = dtype_of(a)
    if node.attr("transA", 0):
        a = op.transpose(a, (1, 0))
    if node.attr("transB", 0):
        b = op.transpose(b, (1, 0))
    # 16-bit floats: alpha A B + beta C in float32, rounded once
    wide = HALF_ACCUMULATE.get(dt)
    out = op.matmul(a, b, out_dtype=wide)
    cdt = wide or dt
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha != 1.0:
        out = op.multiply(out, scalar(alpha, cdt))
    if c is not None and beta != 0.0:
        if wide:
            c = op.cast(c, wide)
        if beta != 1.0:
            c = op.multiply(c, scalar(beta, cdt))
        out = op.add(out, c)
    return op.cast(out, dt) if wide else out


def lift_1d(ctx: Any, node: Any, x: Any) -> Any:
    """Rewrite a 1-D op as 2-D with a unit height: (N, C, L) -> (N, C, 1, L) and attributes
    [a] -> [1, a] (pads [b, e] -> [0, b, 0, e], output_padding [p] -> [0, p]); the caller
    squeezes axis 2 off again."""
    for name in ("kernel_shape", "strides", "dilations", "output_shape"):
        if name in node.attrs:
            if len(node.attrs[name]) != 1:
                raise node.error(f"{name} must have 1 entry for a 1-D input, got "
                                 f"{list(node.attrs[name])}")
            node.attrs[name] = [1, *node.attrs[name]]
    if "output_padding" in node.attrs:
        node.attrs["output_padding"] = [0, *node.attrs["output_padding"]]
    if "pads" in node.attrs:
        if len(node.attrs["pads"]) != 2:
            raise node.error(f"pads must have 2 entries for a 1-D input, got "
                             f"{list(node.attrs['pads'])}")
        b, e = node.attrs["pads"]
        node.attrs["pads"] = [0, b, 0, e]
    return ctx.emit(op.expand_dims(x, 2))


def _spatial(convert: Any) -> Any:
    """Run a 2-D/3-D converter on 1-D inputs too (see ``lift_1d``); other ranks are errors."""

    def wrapped(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        if ndim_of(x) not in (3, 4, 5):
            raise node.error(f"only 1-D, 2-D and 3-D spatial inputs (rank 3, 4 or 5) are "
                             f"supported, got rank {ndim_of(x)}")
        if node.op_type in ("Conv", "ConvTranspose") and node.has_input(1):
            w = node.input(1)
            if ndim_of(w) != ndim_of(x):
                raise node.error(f"the weight (rank {ndim_of(w)}) must have the rank of the "
                                 f"input (rank {ndim_of(x)})")
        if ndim_of(x) != 3:
            return convert(ctx, node, x)
        out = convert(ctx, node, lift_1d(ctx, node, x))
        if isinstance(out, (list, tuple)):
            return [op.squeeze(o, axis=(2,)) for o in out]
        return op.squeeze(out, axis=(2,))

    return wrapped


def _static_spatial(node: Any, x: Any) -> tuple[int, ...]:
    """The spatial sizes of ``x`` (axes 2...), which must be static."""
    sizes = tuple(static_int(d) for d in shape_of(x)[2:])
    if any(s is None for s in sizes):
        raise node.error("this form needs static spatial dimensions")
    return sizes  # type: ignore[return-value]


def window_pads(node: Any, x: Any, kernel: tuple[int, ...], strides: tuple[int, ...],
          dilations: tuple[int, ...]) -> tuple[int, ...]:
    """ONNX-ordered pads ``(begin..., end...)`` from ``pads`` or ``auto_pad``."""
    n = len(kernel)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = tuple(int(p) for p in node.attr("pads", [0] * (2 * n)))
        if len(pads) != 2 * n:
            raise node.error(f"pads must have {2 * n} entries, got {list(pads)}")
        return pads
    if auto == "VALID":
        return (0,) * (2 * n)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise node.error(f"unknown auto_pad {auto!r}")
    sizes = _static_spatial(node, x)
    begin, end = [], []
    for i in range(n):
        out = -(-sizes[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - sizes[i])
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return (*begin, *end)


def _ints_attr(node: Any, name: str, n: int, default: int = 1) -> tuple[int, ...]:
    """An n-entry int attribute (``default`` everywhere when absent)."""
    v = node.attr(name, None)
    if v is None:
        return (default,) * n
    if len(v) != n:
        raise node.error(f"{name} must have {n} entries for a {n}-D op, got {list(v)}")
    return tuple(int(a) for a in v)


Ints = tuple[int, ...]


def pair_attr(node: Any, name: str, default: int = 1) -> tuple[int, int]:
    """A 2-entry int attribute (used by the quantized convolution converters)."""
    return _ints_attr(node, name, 2, default)  # type: ignore[return-value]


def _window_attrs(node: Any, x: Any, kernel: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """``(strides, dilations, pads)`` of a window op with ``kernel``."""
    n = len(kernel)
    strides, dilations = _ints_attr(node, "strides", n), _ints_attr(node, "dilations", n)
    return strides, dilations, window_pads(node, x, kernel, strides, dilations)


def _bias(out: Any, b: Any, ndim: int) -> Any:
    """``out`` (rank ``ndim``) plus a per-channel bias ``b`` (or ``out`` when there is none)."""
    if b is None:
        return out
    return op.add(out, reshape(b, (1, -1) + (1,) * (ndim - 2)))


@converter("Conv")
@_spatial
def conv(ctx: Any, node: Any, x: Any) -> Any:
    w, b = node.input(1), node.input(2)
    if ndim_of(w) == ndim_of(x) - 1:
        w = ctx.emit(op.expand_dims(w, 2))
    kernel = static_kernel(node, w)
    strides, dilations, pads = _window_attrs(node, x, kernel)
    groups = int(node.attr("group", 1))
    if ndim_of(x) == 5:
        return _bias(_conv3d(ctx, x, w, strides, dilations, pads, groups), b, 5)
    return _bias(_conv2d(ctx, x, w, strides, pads, dilations, groups), b, 4)


def _conv2d(ctx: Any, x: Any, w: Any, strides: Ints, pads: Ints, dilations: Ints,
            groups: int) -> Any:
    """``nn.conv2d``; 16-bit floats accumulate in float32 and round once (as onnxruntime
    does)."""
    dt = dtype_of(x)
    wide = HALF_ACCUMULATE.get(dt)
    out = op.nn.conv2d(x, w, strides=strides, padding=pads, dilation=dilations, groups=groups,
                       out_dtype=wide)
    return op.cast(out, dt) if wide else out


def _conv3d(ctx: Any, x: Any, w: Any, strides: tuple[int, ...], dilations: tuple[int, ...],
            pads: tuple[int, ...], groups: int) -> Any:
    """A 3-D convolution as a sum over the kernel depth of 2-D convolutions: tap ``k`` convolves
    the depth slices ``k*dd + od*sd`` (folded into the batch) with ``w[:, :, k]``. Exact, and
    each term runs on the tuned ``nn.conv2d`` (and its NCHWc layout)."""
    if pads[0] or pads[3]:
        x = ctx.emit(op.pad(x, ((0, 0), (0, 0), (pads[0], pads[3]), (0, 0), (0, 0))))
    n, c, d, h, wd = shape_of(x)
    kd = int(static_int(shape_of(w)[2]))
    d = static_int(d)
    od = (d - (kd - 1) * dilations[0] - 1) // strides[0] + 1
    acc = None
    for k in range(kd):
        start = k * dilations[0]
        xs = op.strided_slice(x, (start,), (start + (od - 1) * strides[0] + 1,), (strides[0],),
                              axes=(2,))
        xs = reshape(op.transpose(xs, (0, 2, 1, 3, 4)), (-1, c, h, wd))
        wk = op.squeeze(op.strided_slice(w, (k,), (k + 1,), axes=(2,)), axis=(2,))
        y = op.nn.conv2d(xs, wk, strides=strides[1:], dilation=dilations[1:], groups=groups,
                         padding=(pads[1], pads[2], pads[4], pads[5]))
        acc = y if acc is None else op.add(acc, y)
    acc = ctx.emit(acc)
    o, oh, ow = shape_of(acc)[1:]
    return op.transpose(reshape(acc, (n, od, o, oh, ow)), (0, 2, 1, 3, 4))


def _pool(ctx: Any, node: Any, x: Any, fn: Any, **extra: Any) -> Any:
    """A 2-D pooling op (``fn``) over ``x``; rank-5 inputs pool separably: H and W first (depth
    folded into the channels), then D (H and W folded into one axis). Max and average pooling
    are separable -- a window's count of counted taps is the product of its per-axis counts --
    so this is exact (up to the order of an average's additions)."""
    n = ndim_of(x) - 2
    kernel = _ints_attr(node, "kernel_shape", n)
    strides, dilations, pads = _window_attrs(node, x, kernel)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    if n == 2:
        return fn(x, pool_size=kernel, strides=strides, dilation=dilations, padding=pads,
                  ceil_mode=ceil_mode, **extra)
    nb, c, d, h, w = shape_of(x)
    y = ctx.emit(fn(reshape(x, (nb, -1, h, w)), pool_size=kernel[1:], strides=strides[1:],
                    dilation=dilations[1:], padding=(pads[1], pads[2], pads[4], pads[5]),
                    ceil_mode=ceil_mode, **extra))
    oh, ow = shape_of(y)[2:]
    y = fn(reshape(y, (nb, c, d, -1)), pool_size=(kernel[0], 1), strides=(strides[0], 1),
           dilation=(dilations[0], 1), padding=(pads[0], 0, pads[3], 0), ceil_mode=ceil_mode,
           **extra)
    return reshape(y, (nb, c, -1, oh, ow))


def _pool_out_size(size: int, k: int, s: int, d: int, lo: int, hi: int, ceil_mode: bool) -> int:
    """ONNX pooling output length (ceil_mode: the last window must start inside the input or
    the leading padding)."""
    span = size + lo + hi - (k - 1) * d - 1
    if not ceil_mode:
        return span // s + 1
    out = -(-span // s) + 1
    return out - 1 if (out - 1) * s >= size + lo else out


def _real_taps(sizes: list[int], outs: list[int], kernel: list[int], strides: list[int],
               dil: list[int], pads: list[int], taps: list[tuple[int, ...]]) -> np.ndarray:
    """``[*outs, len(taps)]``: whether tap ``t`` of output position ``o`` reads the input (not
    the padding) -- in every spatial dim ``0 <= o*stride - pad + t*dilation < size``."""
    nsp = len(sizes)
    real = np.ones((*outs, len(taps)), dtype=bool)
    for i in range(nsp):
        o = np.arange(outs[i]).reshape([-1 if d == i else 1 for d in range(nsp)] + [1])
        t = np.array([tap[i] for tap in taps]) * dil[i]
        pos = o * strides[i] - pads[i] + t
        real &= (pos >= 0) & (pos < sizes[i])
    return real


def _max_pool_with_indices(node: Any, x: Any) -> list[Any]:
    """Values and flat Indices of a max pooling, from the stack of its window taps: tap ``t``
    is a strided slice of the padded input, the first maximal tap (``argmax``; ties go to the
    first tap in row-major window order, as in ONNX) gives each output's input coordinates.
    Index = ``(n*C + c) * prod(S) + `` the spatial offset, row-major or, with
    ``storage_order=1``, column-major."""
    nsp = ndim_of(x) - 2
    kernel = _ints_attr(node, "kernel_shape", nsp)
    strides, dil, pads = _window_attrs(node, x, kernel)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    sizes = _static_spatial(node, x)
    nb, ch = (static_int(v) for v in shape_of(x)[:2])
    if nb is None or ch is None:
        raise node.error("the Indices output needs static batch and channel dimensions")
    outs = [_pool_out_size(sizes[i], kernel[i], strides[i], dil[i], pads[i], pads[nsp + i],
                           ceil_mode) for i in range(nsp)]
    width = []
    for i in range(nsp):
        need = (outs[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
        width.append((pads[i], max(pads[nsp + i], need - sizes[i] - pads[i])))
    dt = np.dtype(dtype_of(x))
    is_float = dt.kind == "f"
    lowest = -np.inf if is_float else int(np.iinfo(dt).min)
    xp = op.pad(x, ((0, 0), (0, 0), *width), pad_value=lowest)
    taps = list(itertools.product(*(range(k) for k in kernel)))
    sl = []
    for t in taps:
        begin = tuple(t[i] * dil[i] for i in range(nsp))
        end = tuple(begin[i] + (outs[i] - 1) * strides[i] + 1 for i in range(nsp))
        sl.append(op.expand_dims(op.strided_slice(xp, begin, end, strides,
                                                  axes=tuple(range(2, 2 + nsp))), -1))
    stack = op.concat(sl, axis=-1) if len(sl) > 1 else sl[0]
    low = scalar(lowest, dt.name)
    key = op.where(op.not_equal(stack, stack), low, stack) if is_float else stack
    values = op.max(key, axis=-1)  # NaNs skipped, as in max_pool2d's ignore_nan
    # A window whose maximum is the lowest value (all its inputs -inf or NaN, or the lowest
    # integer) takes its first input tap, a -inf before a NaN, never a padded one (``real``:
    # whether each window's tap reads the input, static).
    real = _real_taps(sizes, outs, kernel, strides, dil, pads, taps)
    if is_float:
        rank = op.where(op.equal(stack, low), scalar(2, "int32"), scalar(1, "int32"))
        first = op.argmax(op.multiply(rank, g.const(real.astype("int32"))), axis=-1)
    else:
        first = g.const(np.argmax(real, axis=-1))
    arg = op.where(op.equal(values, low), first, op.argmax(key, axis=-1))
    total = int(np.prod(sizes))
    base = (np.arange(nb * ch, dtype=np.int64) * total).reshape((nb, ch) + (1,) * nsp)
    index: Any = g.const(base)
    order = range(nsp) if node.attr("storage_order", 0) else range(nsp - 1, -1, -1)
    mult = 1
    for i in order:
        tap = g.const(np.array([t[i] * dil[i] for t in taps], dtype=np.int64))
        shape = [1] * (2 + nsp)
        shape[2 + i] = outs[i]
        start = (np.arange(outs[i], dtype=np.int64) * strides[i] - pads[i]).reshape(shape)
        pos = op.add(op.take(tap, arg, axis=0), g.const(start))
        index = op.add(index, op.multiply(pos, scalar(mult, "int64")))
        mult *= sizes[i]
    return [values, index]


@converter("MaxPool")
@_spatial
def max_pool(ctx: Any, node: Any, x: Any) -> Any:
    if node.num_outputs > 1 and node.proto.output[1]:
        return _max_pool_with_indices(node, x)
    # NaNs are skipped, as onnxruntime and the ONNX reference do (PyTorch propagates them)
    return _pool(ctx, node, x, op.nn.max_pool2d, ignore_nan=True)


@converter("AveragePool")
@_spatial
def avg_pool(ctx: Any, node: Any, x: Any) -> Any:
    if node.opset < 19 and "dilations" in node.attrs:
        node.attrs.pop("dilations")
    return _pool(ctx, node, x, op.nn.avg_pool2d,
                 count_include_pad=bool(node.attr("count_include_pad", 0)))


def _transpose_geometry(node: Any, x: Any, kernel: Ints) -> tuple[Ints, Ints, Ints, Ints]:
    """``(strides, dilations, begin pads, output sizes)`` of a ConvTranspose: from
    ``output_shape`` or ``auto_pad`` SAME (the total padding split as the spec says: SAME_UPPER
    puts the smaller half first, anything else the larger), else from ``pads``."""
    n = len(kernel)
    strides, dil = _ints_attr(node, "strides", n), _ints_attr(node, "dilations", n)
    out_pad = _ints_attr(node, "output_padding", n, 0)
    sizes = _static_spatial(node, x)
    full = [strides[i] * (sizes[i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1
            for i in range(n)]
    auto = node.attr("auto_pad", "NOTSET")
    out_shape = node.attr("output_shape", None)
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        if out_shape is not None and len(out_shape) < n:
            raise node.error(f"output_shape {list(out_shape)} has fewer than the {n} spatial "
                             "sizes")
        outs = (tuple(int(v) for v in out_shape[-n:]) if out_shape is not None
                else tuple(sizes[i] * strides[i] for i in range(n)))
        total = [full[i] - outs[i] for i in range(n)]
        begin = tuple(t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total)
        return strides, dil, begin, outs
    pads = (0,) * (2 * n) if auto == "VALID" else _ints_attr(node, "pads", 2 * n, 0)
    outs = tuple(full[i] - pads[i] - pads[n + i] for i in range(n))
    return strides, dil, pads[:n], outs


def _crop(x: Any, ndim: int, axis: int, full: int, begin: int, out: int) -> Any:
    """Positions ``[begin, begin + out)`` of an axis of length ``full`` of a rank-``ndim``
    tensor, zeros outside it."""
    lo, hi = max(begin, 0), min(begin + out, full)
    if lo or hi < full:
        x = op.strided_slice(x, (lo,), (hi,), axes=(axis,))
    front, back = max(-begin, 0), out - (hi - lo) - max(-begin, 0)
    if front or back:
        width = [(0, 0)] * ndim
        width[axis] = (front, back)
        x = op.pad(x, tuple(width))
    return x


def _conv_transpose2d(ctx: Any, x: Any, w: Any, strides: tuple[int, ...],
                      dil: tuple[int, ...], groups: int, begin: tuple[int, ...],
                      outs: tuple[int, ...]) -> Any:
    """A 2-D transposed convolution: a per-pixel GEMM on the tuned ``nn.conv2d`` and a col2im
    gather (:func:`_gemm_col2im_conv_transpose2d`); where the weight's channel count is known
    only at run time, the data adjoint of a convolution (``nn.conv2d_backward_data``, whose
    weight layout (C, M/group, kh, kw) ONNX shares), a direct gather loop. Both cover the
    positions that receive taps; the rest (negative padding, ``output_padding`` past the last
    tap) are zeros."""
    if static_int(shape_of(w)[0]) is not None:
        return _gemm_col2im_conv_transpose2d(ctx, x, w, strides, dil, groups, begin, outs)
    kernel = tuple(int(static_int(d)) for d in shape_of(w)[2:])  # static: checked
    sizes = tuple(static_int(d) for d in shape_of(x)[2:])
    full = [strides[i] * (sizes[i] - 1) + (kernel[i] - 1) * dil[i] + 1 for i in range(2)]
    lo = [max(b, 0) for b in begin]
    hi = [min(begin[i] + outs[i], full[i]) for i in range(2)]
    span = [hi[i] - lo[i] for i in range(2)]
    m = shape_of(w)[1] * groups
    like = op.broadcast_to(scalar(0, dtype_of(x)), (shape_of(x)[0], m, *span))
    y = op.conv2d_backward_data(x, w, like, strides=strides, dilation=dil, groups=groups,
                                   padding=(lo[0], lo[1], full[0] - hi[0], full[1] - hi[1]))
    for i in range(2):
        y = _crop(y, 4, 2 + i, span[i], begin[i] - lo[i], outs[i])
    return y


def _gemm_col2im_conv_transpose2d(ctx: Any, x: Any, w: Any, strides: tuple[int, ...],
                                  dil: tuple[int, ...], groups: int, begin: tuple[int, ...],
                                  outs: tuple[int, ...]) -> Any:
    """A 2-D transposed convolution as a per-pixel GEMM and a col2im gather, as onnxruntime
    computes it: ``z = W^T x`` (a ``matmul`` of the ``(M*kh*kw, C)`` weight and the ``(C, H*W)``
    image on the tuned GEMM; grouped or 16-bit ones a 1x1 ``nn.conv2d`` per group, accumulating
    16-bit floats in float32), then tap ``(ky, kx)`` of input pixel ``(i, j)`` lands on output
    ``(i*sh + ky*dh, j*sw + kx*dw)``.

    Output ``o = q*s + r`` (phase ``r < s``) sums, over the taps ``k`` with ``k*d % s == r``,
    ``z[k]`` shifted by ``k*d // s``: per phase a few padded slices of ``z`` added, the phases
    stacked to ``(N, M, sh, sw, Qh, Qw)`` and interleaved to ``(N, M, Qh, sh, Qw, sw)`` (a
    depth-to-space shuffle); injective ops that fuse into one kernel with the bias and the
    activation after it. Where ``s`` divides ``k`` (undilated) every phase sums the same ``k/s``
    shifts and needs no stacking; where ``k == s`` (2x2 stride 2, 4x4 stride 4: decoders' and
    detectors' upsampling) each output has exactly one tap and the gather is the shuffle alone.
    Only real products are summed, so an inf/NaN weight reaches only the outputs its tap lands
    on. The ONNX pads and ``output_padding`` then crop or zero-extend the result."""
    kh, kw = (int(static_int(d)) for d in shape_of(w)[2:])  # static: checked
    sh, sw = strides
    c, mg = shape_of(w)[:2]
    cg = static_int(c) // groups
    nb = shape_of(x)[0]
    h, wd = (static_int(d) for d in shape_of(x)[2:])  # static: checked by the geometry
    # (C, Mg, kh, kw) -> (G*Mg*kh*kw, C/G, 1, 1), output channels ordered (g, m, ky, kx)
    wt = op.transpose(reshape(w, (groups, cg, -1)), (0, 2, 1))
    if groups == 1 and dtype_of(x) in ("float32", "float64"):
        # a plain (M*kh*kw, H*W) result: the gather below reads its rows in order, where an
        # NCHWc conv result would be re-read once per lane group (text detector's 24 -> 24
        # 2x2/s2 layer: 0.89x (0.65-0.93) of the model's time with the 1x1 conv, paired rounds)
        z = op.matmul(reshape(wt, (-1, cg)), reshape(x, (nb, cg, h * wd)))
    else:
        z = _conv2d(ctx, x, reshape(wt, (-1, cg, 1, 1)), (1, 1), (0, 0, 0, 0), (1, 1), groups)
    z = ctx.emit(reshape(z, (nb, -1, kh, kw, h, wd)))
    if tuple(dil) == (1, 1) and kh % sh == 0 and kw % sw == 0:
        # tap (t*s + r) is phase r shifted by t: every phase sums the same J = k/s shifts, so
        # the phases need no stacking (one slice and no padding when k == s)
        jh, jw = kh // sh, kw // sw
        qh, qw = h + jh - 1, wd + jw - 1
        z = reshape(z, (nb, -1, jh, sh, jw, sw, h, wd))
        y = None
        for ty, tx in itertools.product(range(jh), range(jw)):
            tap = op.strided_slice(z, (ty, tx), (ty + 1, tx + 1), axes=(2, 4))
            tap = reshape(tap, (nb, -1, sh, sw, h, wd))
            if (jh, jw) != (1, 1):
                tap = op.pad(tap, ((0, 0),) * 4 + ((ty, jh - 1 - ty), (tx, jw - 1 - tx)))
            y = tap if y is None else op.add(y, tap)
    else:
        shift = [[(t * dil[i]) // strides[i] for t in range(k)] for i, k in enumerate((kh, kw))]
        qh, qw = h + max(shift[0]), wd + max(shift[1])
        m = shape_of(z)[1]
        rows = []
        for rh in range(sh):
            row = []
            for rw in range(sw):
                acc = None
                for ky, kx in itertools.product(range(kh), range(kw)):
                    if (ky * dil[0]) % sh != rh or (kx * dil[1]) % sw != rw:
                        continue
                    oy, ox = shift[0][ky], shift[1][kx]
                    tap = op.strided_slice(z, (ky, kx), (ky + 1, kx + 1), axes=(2, 3))
                    tap = op.pad(tap, ((0, 0),) * 4 + ((oy, qh - h - oy), (ox, qw - wd - ox)))
                    acc = tap if acc is None else op.add(acc, tap)
                if acc is None:  # a phase no tap lands on (kernel < stride)
                    acc = op.broadcast_to(scalar(0, dtype_of(x)), (nb, m, 1, 1, qh, qw))
                row.append(acc)
            rows.append(op.concat(row, axis=3) if sw > 1 else row[0])
        y = op.concat(rows, axis=2) if sh > 1 else rows[0]
    y = op.transpose(y, (0, 1, 4, 2, 5, 3))
    y = reshape(y, (nb, -1, qh * sh, qw * sw))
    for i in range(2):
        y = _crop(y, 4, 2 + i, (qh, qw)[i] * strides[i], begin[i], outs[i])
    return y


@converter("ConvTranspose")
@_spatial
def conv_transpose(ctx: Any, node: Any, x: Any) -> Any:
    w, b = node.input(1), node.input(2)
    if ndim_of(w) == ndim_of(x) - 1:
        w = ctx.emit(op.expand_dims(w, 2))
    kernel = static_kernel(node, w)
    strides, dil, begin, outs = _transpose_geometry(node, x, kernel)
    groups = int(node.attr("group", 1))
    if ndim_of(x) == 4:
        return _bias(_conv_transpose2d(ctx, x, w, strides, dil, groups, begin, outs), b, 4)
    return _bias(_conv_transpose3d(ctx, x, w, strides, dil, groups, begin, outs), b, 5)


def _conv_transpose3d(ctx: Any, x: Any, w: Any, strides: Ints, dil: Ints, groups: int,
                      begin: Ints, outs: Ints) -> Any:
    """A 3-D transposed convolution: for each kernel depth tap, a 2-D transposed convolution of
    every input depth slice (folded into the batch), spread to depths ``id*sd + k*dd`` (zeros
    between) and summed."""
    kernel = tuple(int(static_int(d)) for d in shape_of(w)[2:])  # static: checked
    nb, c, d, h, wd = shape_of(x)
    d = static_int(d)
    flat = ctx.emit(reshape(op.transpose(x, (0, 2, 1, 3, 4)), (-1, c, h, wd)))
    full = strides[0] * (d - 1) + (kernel[0] - 1) * dil[0] + 1
    acc = None
    for k in range(kernel[0]):
        wk = ctx.emit(op.squeeze(op.strided_slice(w, (k,), (k + 1,), axes=(2,)), axis=(2,)))
        y = ctx.emit(_conv_transpose2d(ctx, flat, wk, strides[1:], dil[1:], groups, begin[1:],
                                       outs[1:]))
        m, oh, ow = shape_of(y)[1:]
        y = op.transpose(reshape(y, (nb, d, m, oh, ow)), (0, 2, 1, 3, 4))
        if strides[0] > 1:  # zero-insert between depth slices
            y = op.pad(op.expand_dims(y, 3), ((0, 0),) * 3 + ((0, strides[0] - 1),)
                       + ((0, 0),) * 2)
            y = op.strided_slice(reshape(y, (nb, m, -1, oh, ow)), (0,),
                                 ((d - 1) * strides[0] + 1,), axes=(2,))
        start = k * dil[0]
        y = op.pad(y, ((0, 0), (0, 0), (start, full - start - (d - 1) * strides[0] - 1),
                       (0, 0), (0, 0)))
        acc = y if acc is None else op.add(acc, y)
    return _crop(acc, 5, 2, full, begin[0], outs[0])


@converter("Col2Im", since=18)
def col2im(ctx: Any, node: Any) -> Any:
    """Col2Im as a grouped transposed convolution: the columns, viewed as an image of block
    positions, are spread by one-hot kernels (channel ``c*K + k`` to offset ``k`` of channel
    ``c``'s block) and overlapping taps summed."""
    x = node.input(0)
    if not (node.is_const(1) and node.is_const(2)):
        return _col2im_rt(ctx, node, x)
    image, block = node.const_input(1, "image_shape"), node.const_input(2, "block_shape")
    if image is None or block is None:
        raise node.error("image_shape and block_shape must be given")
    image, block = ints(image), ints(block)
    nsp = len(image)
    if len(block) != nsp or nsp not in (1, 2, 3):
        raise node.error(f"image_shape {image} and block_shape {block} must have 1 to 3 "
                         f"equal-length entries")
    strides, dil = _ints_attr(node, "strides", nsp), _ints_attr(node, "dilations", nsp)
    pads = _ints_attr(node, "pads", 2 * nsp, 0)
    lifted = nsp == 1
    if lifted:  # a unit height
        image, block, strides, dil = [1, *image], [1, *block], (1, *strides), (1, *dil)
        pads, nsp = (0, pads[0], 0, pads[1]), 2
    nb, ck, length = shape_of(x)
    k = int(np.prod(block))
    ck, length = static_int(ck), static_int(length)
    counts = [(image[i] + pads[i] + pads[nsp + i] - (block[i] - 1) * dil[i] - 1) // strides[i]
              + 1 for i in range(nsp)]
    if ck is None or ck % k or length != int(np.prod(counts)):
        raise node.error(f"input {list(shape_of(x))} does not hold {counts} blocks of "
                         f"{block} per channel")
    c = ck // k
    weight = np.zeros((ck, 1, k), dtype=dtype_of(x))
    weight[:, 0, :] = np.tile(np.eye(k, dtype=weight.dtype), (c, 1))
    w = g.const(weight.reshape((ck, 1, *block)))
    cols = ctx.emit(reshape(x, (nb, ck, *counts)))
    fn = _conv_transpose2d if nsp == 2 else _conv_transpose3d
    out = fn(ctx, cols, w, strides, dil, c, tuple(pads[:nsp]), tuple(image))
    return op.squeeze(out, axis=(2,)) if lifted else out


def _col2im_rt(ctx: Any, node: Any, x: Any) -> Any:
    """Col2Im with image_shape/block_shape known only at run time: ``dynamic_col2im`` (a
    gather-sum over the block offsets) with its output dims bound by the col2im shape
    function, which also checks the input's channel and column counts against the values."""
    image, block = (rt.int64_tensor(node.input(i)) for i in (1, 2))
    nsp = rt.static_len(node, image, "image_shape")
    if rt.static_len(node, block, "block_shape") != nsp or nsp < 1 or ndim_of(x) != 3:
        raise node.error(f"image_shape and block_shape must have the same number of entries, "
                         f"and the input must be (N, C*K, L), got {x.struct_info}")
    strides, dil = _ints_attr(node, "strides", nsp), _ints_attr(node, "dilations", nsp)
    pads = _ints_attr(node, "pads", 2 * nsp, 0)
    image, block = ctx.emit(image, f"{node.name}_image"), ctx.emit(block, f"{node.name}_block")
    dims = rt.runtime_shape(ctx, node, "col2im", [
        rt.shape_expr(ctx, node, x), image, block, g.ShapeExpr(strides), g.ShapeExpr(dil),
        g.ShapeExpr(pads)], [shape_of(x)[0]] + [None] * (nsp + 1))
    return op.dynamic_col2im(x, image, block, dims, strides, dil, pads)


@converter("MaxUnpool", since=9)
def max_unpool(ctx: Any, node: Any) -> Any:
    """MaxUnpool as a scatter of X into a zero tensor at the flat Indices (they index the whole
    output, as MaxPool's Indices index its input). With ``output_shape`` the indices index a
    tensor of that shape, as in PyTorch's max_unpool and onnxruntime (the ONNX reference
    instead scatters into the inferred shape and zero-pads it); when ``output_shape`` is known
    only at run time its spatial dims are bound by a shape function (N and C are checked
    against X's) and so is the flat size (kernels bind symbolic dims only from plain dims of
    their arguments)."""
    x, idx = node.input(0), node.input(1)
    nsp = ndim_of(x) - 2
    kernel = _ints_attr(node, "kernel_shape", nsp)
    strides = _ints_attr(node, "strides", nsp)
    pads = _ints_attr(node, "pads", 2 * nsp, 0)
    sizes = _static_spatial(node, x)
    nb, ch = (static_int(v) for v in shape_of(x)[:2])
    if nb is None or ch is None:
        raise node.error("MaxUnpool needs static batch and channel dimensions")
    out: tuple[int, ...] = tuple((sizes[i] - 1) * strides[i] + kernel[i] - pads[i] - pads[nsp + i]
                                 for i in range(nsp))
    if node.has_input(2) and not node.is_const(2):
        if rt.static_len(node, node.input(2), "output_shape") != nsp + 2:
            raise node.error(f"output_shape must have {nsp + 2} entries")
        dims = rt.runtime_shape(ctx, node, "values", [node.input(2)], [nb, ch] + [None] * nsp)
        zeros = ctx.emit(op.broadcast_to(scalar(0, dtype_of(x)), dims), f"{node.name}_zeros")
        total = rt.runtime_shape(ctx, node, "reshape", [rt.shape_expr(ctx, node, zeros), g.const(
            np.array([-1], np.int64)), g.PrimValue(0)], [None], "flat")
        flat = op.scatter_elements(op.dynamic_reshape(zeros, total), reshape(idx, (-1,)),
                                   reshape(x, (-1,)), axis=0)
        return op.dynamic_reshape(flat, dims)
    if node.has_input(2):
        out = tuple(ints(node.const_input(2, "output_shape"))[-nsp:])
    total = nb * ch * int(np.prod(out))
    zeros = op.broadcast_to(scalar(0, dtype_of(x)), (total,))
    flat = op.scatter_elements(zeros, reshape(idx, (-1,)), reshape(x, (-1,)), axis=0)
    return reshape(flat, (nb, ch, *out))


@converter("DeformConv", since=19)
def deform_conv(ctx: Any, node: Any) -> Any:
    """DeformConv (2-D): each tap samples the input bilinearly (zeros outside, GridSample's
    align_corners=1 bilinear) at its window position plus its learned offset, optionally scaled
    by the mask; the sampled columns are then a grouped matmul with the weight."""
    x, w, offset, b, mask = (node.input(i) for i in range(5))
    if ndim_of(x) != 4:
        raise node.error(f"only 2-D DeformConv (rank-4 input) is supported, got rank "
                         f"{ndim_of(x)}")
    nb, ch, h, wd = (static_int(d) for d in shape_of(x))
    oc, cg, kh, kw = (static_int(d) for d in shape_of(w))
    oh, ow = (static_int(d) for d in shape_of(offset)[2:])
    if None in (nb, ch, h, wd, oc, cg, kh, kw, oh, ow):
        raise node.error("DeformConv needs static shapes")
    groups, og = int(node.attr("group", 1)), int(node.attr("offset_group", 1))
    (sh, sw), (dh, dw) = _ints_attr(node, "strides", 2), _ints_attr(node, "dilations", 2)
    pads = _ints_attr(node, "pads", 4, 0)
    if ch % og or ch != cg * groups or oc % groups:
        raise node.error(f"channels {ch} do not split into offset_group={og} / group={groups} "
                         f"(weight {[oc, cg, kh, kw]})")
    k, dt = kh * kw, dtype_of(x)
    # window positions of every tap: (1, 1, kh, kw, oh, ow)
    base_y = (np.arange(kh)[:, None, None, None] * dh + np.arange(oh)[None, None, :, None] * sh
              - pads[0]).astype(dt) + np.zeros((kh, kw, oh, ow), dt)
    base_x = (np.arange(kw)[None, :, None, None] * dw + np.arange(ow)[None, None, None, :] * sw
              - pads[1]).astype(dt) + np.zeros((kh, kw, oh, ow), dt)
    off = reshape(offset, (nb, og, kh, kw, 2, oh, ow))
    py = op.add(op.squeeze(op.strided_slice(off, (0,), (1,), axes=(4,)), axis=(4,)),
                g.const(base_y[None, None]))
    px = op.add(op.squeeze(op.strided_slice(off, (1,), (2,), axes=(4,)), axis=(4,)),
                g.const(base_x[None, None]))
    y0, x0 = op.floor(py), op.floor(px)
    ly, lx = op.subtract(py, y0), op.subtract(px, x0)
    one = scalar(1, dt)
    data = reshape(x, (nb, og, ch // og, h * wd))
    cols = None
    for a, bb in itertools.product((0, 1), (0, 1)):
        yy, xx = op.add(y0, scalar(a, dt)), op.add(x0, scalar(bb, dt))
        wgt = op.multiply(ly if a else op.subtract(one, ly), lx if bb else op.subtract(one, lx))
        inside = op.logical_and(
            op.logical_and(op.greater_equal(yy, scalar(0, dt)), op.less(yy, scalar(h, dt))),
            op.logical_and(op.greater_equal(xx, scalar(0, dt)), op.less(xx, scalar(wd, dt))))
        wgt = op.where(inside, wgt, scalar(0, dt))
        yi = op.cast(op.clip(yy, 0, h - 1), "int64")
        xi = op.cast(op.clip(xx, 0, wd - 1), "int64")
        idx = op.add(op.multiply(yi, scalar(wd, "int64")), xi)
        idx = op.broadcast_to(reshape(idx, (nb, og, 1, k * oh * ow)),
                              (nb, og, ch // og, k * oh * ow))
        term = op.multiply(op.gather_elements(data, idx, axis=3),
                           reshape(wgt, (nb, og, 1, k * oh * ow)))
        cols = term if cols is None else op.add(cols, term)
    if mask is not None:
        cols = op.multiply(cols, reshape(mask, (nb, og, 1, k * oh * ow)))
    cols = reshape(cols, (nb, groups, cg * k, oh * ow))  # channel-major, then tap
    out = op.matmul(reshape(w, (1, groups, oc // groups, cg * k)), cols)
    return _bias(reshape(out, (nb, oc, oh, ow)), b, 4)


@converter("LpPool")
@_spatial
def lp_pool(ctx: Any, node: Any, x: Any) -> Any:
    """``(sum over the window of |x|^p)^(1/p)``: the input is zero-padded explicitly (also past
    the end for ceil_mode, so every window is whole) and the sum is a padless average times the
    window size."""
    nsp = ndim_of(x) - 2
    kernel = _ints_attr(node, "kernel_shape", nsp)
    strides, dil, pads = _window_attrs(node, x, kernel)
    sizes = _static_spatial(node, x)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    width = []
    for i in range(nsp):
        out = _pool_out_size(sizes[i], kernel[i], strides[i], dil[i], pads[i], pads[nsp + i],
                             ceil_mode)
        need = (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1
        width.append((pads[i], need - sizes[i] - pads[i]))
    p = float(node.attr("p", 2))
    dt = dtype_of(x)
    xa = op.multiply(x, x) if p == 2 else op.power(op.abs(x), scalar(p, dt))
    xa = op.strided_slice(op.pad(xa, ((0, 0), (0, 0), *((b, max(e, 0)) for b, e in width))),
                          (0,) * nsp, tuple(sizes[i] + b + e for i, (b, e) in enumerate(width)),
                          axes=tuple(range(2, 2 + nsp)))
    xa = ctx.emit(xa)
    for name in ("pads", "auto_pad", "ceil_mode", "count_include_pad"):
        node.attrs.pop(name, None)
    total = op.multiply(_pool(ctx, node, xa, op.nn.avg_pool2d), scalar(int(np.prod(kernel)), dt))
    return op.sqrt(total) if p == 2 else op.power(total, scalar(1.0 / p, dt))


@converter("GlobalLpPool")
def global_lp_pool(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    p = float(node.attr("p", 2))
    dt = dtype_of(x)
    axes = tuple(range(2, ndim_of(x)))
    if p == 2:
        return op.sqrt(op.sum(op.multiply(x, x), axis=axes, keepdims=True))
    total = op.sum(op.power(op.abs(x), scalar(p, dt)), axis=axes, keepdims=True)
    return op.power(total, scalar(1.0 / p, dt))


@converter("GlobalAveragePool")
def global_avg_pool(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.mean(x, axis=tuple(range(2, ndim_of(x))), keepdims=True)


@converter("GlobalMaxPool")
def global_max_pool(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.max(x, axis=tuple(range(2, ndim_of(x))), keepdims=True)


@converter("BatchNormalization")
def batch_norm(ctx: Any, node: Any) -> Any:
    """Inference: the running statistics normalize. ``training_mode`` (opset 14+): the batch
    statistics (mean and biased variance over every axis but 1) normalize, and the running
    statistics are updated, ``running * momentum + batch * (1 - momentum)`` (outputs 1, 2)."""
    training = node.opset >= 14 and bool(node.attr("training_mode", 0))
    outputs = len([o for o in node.proto.output if o])
    if outputs > 1 and not training:
        raise node.error("the saved statistics outputs of BatchNormalization before opset 14 "
                         "(training with is_test=0 / spatial) are not supported")
    x = node.input(0)
    if ndim_of(x) < 2:
        raise node.error("input must have a channel axis")
    # channel-wise (x - mean) / sqrt(var + eps) * scale + bias, broadcast over axis 1
    dt = dtype_of(x)
    shape = (1, -1) + (1,) * (ndim_of(x) - 2)
    scale, bias, mean, var = (reshape(node.input(i), shape) for i in range(1, 5))
    extra: list[Any] = []
    if training:
        axes = (0, *range(2, ndim_of(x)))
        mean = ctx.emit(op.mean(x, axis=axes, keepdims=True))
        centered = ctx.emit(op.subtract(x, mean))
        var = ctx.emit(op.mean(op.multiply(centered, centered), axis=axes, keepdims=True))
        m = float(node.attr("momentum", 0.9))
        running = [op.add(op.multiply(node.input(i), scalar(m, dtype_of(node.input(i)))),
                          op.multiply(op.cast(reshape(batch, (-1,)), dtype_of(node.input(i))),
                                      scalar(1 - m, dtype_of(node.input(i)))))
                   for i, batch in ((3, mean), (4, var))]
        extra = running[:outputs - 1]
    inv = op.divide(scale, op.sqrt(op.add(var, scalar(node.attr("epsilon", 1e-5), dt))))
    y = op.add(op.multiply(op.subtract(x, mean), inv), bias)
    return [y, *extra] if extra else y


@converter("LayerNormalization", since=17)
def layer_norm(ctx: Any, node: Any) -> Any:
    x, scale, bias = node.input(0), node.input(1), node.input(2)
    nd = ndim_of(x)
    axis = int(node.attr("axis", -1))
    axis = axis + nd if axis < 0 else axis
    axes = tuple(range(axis, nd))
    dt = dtype_of(x)
    eps = node.attr("epsilon", 1e-5)
    if len([o for o in node.proto.output if o]) > 1:
        # the Mean and InvStdDev outputs need the statistics themselves
        mean = op.mean(x, axis=axes, keepdims=True)
        centered = op.subtract(x, mean)
        var = op.mean(op.multiply(centered, centered), axis=axes, keepdims=True)
        inv = op.divide(scalar(1, dt), op.sqrt(op.add(var, scalar(eps, dt))))
        y = op.multiply(op.multiply(centered, inv), scale)
        if bias is not None:
            y = op.add(y, bias)
        return [y, mean, inv]
    # a normalized-shape view of scale/bias so that they broadcast like ONNX's
    norm_shape = shape_of(x)[axis:]
    scale = op.broadcast_to(scale, norm_shape)
    bias = (op.broadcast_to(bias, norm_shape) if bias is not None
            else op.multiply(scale, scalar(0, dt)))
    return op.nn.layer_norm(x, scale, bias, axes=axes, epsilon=eps)


def _softmax_v1(fn: Any) -> Any:
    """Opset < 13: the input is coerced to 2-D at ``axis`` and normalized over the second."""

    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        nd = ndim_of(x)
        axis = int(node.attr("axis", 1))
        axis = axis + nd if axis < 0 else axis
        if axis == nd - 1:
            return fn(x, axis=-1)
        shape = shape_of(x)
        flat = reshape(x, (prod(shape[:axis]), prod(shape[axis:])))
        return reshape(fn(flat, axis=-1), shape)

    return convert


def _softmax_v13(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return fn(node.input(0), axis=int(node.attr("axis", -1)))

    return convert


converter("Softmax", since=1)(_softmax_v1(op.nn.softmax))
converter("Softmax", since=13)(_softmax_v13(op.nn.softmax))
converter("LogSoftmax", since=1)(_softmax_v1(op.nn.log_softmax))
converter("LogSoftmax", since=13)(_softmax_v13(op.nn.log_softmax))


@converter("Dropout")
def dropout(ctx: Any, node: Any) -> Any:
    """Inference: the identity (mask all True). Training mode (opset 12+, ``training_mode``
    true or a run-time input): kiln's random converters draw the mask."""
    x = node.input(0)
    if node.opset >= 12 and node.has_input(2):
        training = node.const_value(2)
        if training is None or bool(np.asarray(training).reshape(())):
            return training_dropout(ctx, node, None if training is not None else node.input(2))
    outs = [x]
    if node.num_outputs > 1 and node.proto.output[1]:
        shape = ctx.static_shape(x)
        if shape is None:
            raise node.error("the mask output needs a static input shape")
        outs.append(np.ones(shape, dtype=bool))
    return outs


