"""Neural-network ATen ops: matrix products, convolution, pooling, normalization, embedding,
upsampling and attention.

Convolutions and poolings of every rank reuse the ONNX converters' decompositions (1-D lifted
to 2-D, 3-D as sums of 2-D convolutions and separable pooling) through ``onnx_reuse``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....arith import simplify
from ..registry import converter
from .common import (
    as_tensor,
    cast,
    dtype_of,
    ndim_of,
    prod,
    producer,
    reshape,
    same_shape,
    scalar,
    shape_of,
    static_int,
)
from .onnx_reuse import onnx_op


# ---- matrix products ----------------------------------------------------------------------
def _unflatten_rows(ctx: Any, a: Any) -> Any:
    """``a`` (rows x k) when it is a reshape of a tensor of more dims whose leading dims
    multiply to the rows and trailing dims to ``k``: that tensor with its trailing dims merged
    (``(b, s, h, d) -> (b, s, h*d)``), so the product keeps the batch dims as kiln's GEMM
    takes them and the merged row count never appears."""
    inner = producer(ctx, a, "reshape")
    if inner is None or ndim_of(a) != 2:
        return a
    src = inner.args[0]
    dims = shape_of(src)
    rows, k = shape_of(a)
    for p in range(2, len(dims)):
        if same_shape((simplify(prod(dims[:p])),), (rows,)) and same_shape(
                (simplify(prod(dims[p:])),), (k,)):
            return src if p == len(dims) - 1 else ctx.emit(op.reshape(src, (*dims[:p], k)))
    return a


def _shared_weight(ctx: Any, b: Any) -> Any:
    """The 2-D matrix behind ``b`` when ``b`` only repeats it along a batch dim (a linear
    layer on 3-D input decomposes to ``bmm(x, expand(w))``), else ``b``."""
    src = b
    for name in ("reshape", "broadcast_to"):
        call = producer(ctx, src, name)
        if call is not None:
            src = call.args[0]
    if ndim_of(src) == 2 and ndim_of(b) == 3 and same_shape(shape_of(src), shape_of(b)[1:]):
        return src
    return b


def _matmul(ctx: Any, a: Any, b: Any) -> Any:
    """``a @ b`` computed on ``a``'s unflattened rows (see ``_unflatten_rows``) and reshaped
    to the 2-D result the graph expects (a reshape later views fold away). An empty inner
    dimension gives zeros."""
    if static_int(shape_of(a)[-1]) == 0:
        return op.broadcast_to(scalar(0, dtype_of(a)), shape_of(op.matmul(a, b)))
    full = _unflatten_rows(ctx, a)
    if full is a or ndim_of(b) != 2:
        return op.matmul(a, b)
    out = ctx.emit(op.matmul(full, b))
    return op.reshape(out, (shape_of(a)[0], shape_of(b)[1]))


@converter("aten.mm.default", "aten.matmul.default", "aten.mv.default", "aten.dot.default")
def matmul(ctx: Any, node: Any) -> Any:
    return _matmul(ctx, node.arg(0), node.arg(1))


def _merged_batch(ctx: Any, x: Any) -> Any:
    """The 4-D tensor a 3-D ``x`` flattens (``(b, h, s, d) -> (b*h, s, d)``), or None."""
    inner = producer(ctx, x, "reshape")
    if inner is None:
        return None
    src = inner.args[0]
    if ndim_of(src) == 4 and same_shape(shape_of(src)[2:], shape_of(x)[1:]):
        return src
    return None


@converter("aten.bmm.default")
def bmm(ctx: Any, node: Any) -> Any:
    """A batched product; attention's ``(b*h, s, d)`` operands flattened from 4-D tensors are
    multiplied as 4-D (the merged batch size never appears: see ``view``)."""
    a, b = node.arg(0), node.arg(1)
    if static_int(shape_of(a)[-1]) == 0:
        return _matmul(ctx, a, b)
    a4, b4 = _merged_batch(ctx, a), _merged_batch(ctx, b)
    if a4 is not None and b4 is not None and same_shape(shape_of(a4)[:2], shape_of(b4)[:2]):
        out = ctx.emit(op.matmul(a4, b4))
        return op.reshape(out, (shape_of(a)[0], shape_of(a)[1], shape_of(b)[2]))
    return op.matmul(a, _shared_weight(ctx, b))


def _scale(x: Any, k: Any) -> Any:
    return x if k == 1 else op.multiply(x, as_tensor(k, dtype_of(x)))


@converter("aten.addmm.default", "aten.addmv.default", "aten.baddbmm.default",
           "aten.addbmm.default")
def addmm(ctx: Any, node: Any) -> Any:
    """``beta * input + alpha * (a @ b)`` (addbmm sums the batch of products)."""
    c, a, b = node.arg(0), node.arg(1), node.arg(2)
    beta, alpha = node.arg("beta", 1), node.arg("alpha", 1)
    full = _unflatten_rows(ctx, a) if node.op_name == "aten.addmm.default" else a
    if full is not a and alpha == 1 and beta == 1 and ndim_of(c) <= 1:
        # a linear layer on flattened rows: bias added to the product of the unflattened rows
        out = ctx.emit(op.add(op.matmul(full, b), c))
        return op.reshape(out, (shape_of(a)[0], shape_of(b)[1]))
    prod_ = op.matmul(a, _shared_weight(ctx, b) if ndim_of(b) == 3 else b)
    if node.op_name == "aten.addbmm.default":
        prod_ = op.sum(prod_, axis=0)
    out = _scale(prod_, alpha)
    if beta == 0:
        return out
    return op.add(_scale(c, beta), out)


@converter("aten.outer.default")
def outer(ctx: Any, node: Any) -> Any:
    a, b = node.arg(0), node.arg(1)
    return op.multiply(op.expand_dims(a, 1), op.expand_dims(b, 0))


# ---- convolution --------------------------------------------------------------------------
@converter("aten.convolution.default")
def convolution(ctx: Any, node: Any) -> Any:
    x, w, b = node.arg(0), node.arg(1), node.arg(2)
    n = ndim_of(x) - 2
    batched = True
    if ndim_of(x) == ndim_of(w) - 1:  # an unbatched input
        x, batched, n = op.expand_dims(x, 0), False, n + 1
    stride, pad, dil = (list(node.arg(k)) for k in (3, 4, 5))
    transposed, out_pad, groups = bool(node.arg(6)), list(node.arg(7)), int(node.arg(8))
    stride, dil, out_pad = (v * n if len(v) == 1 else v for v in (stride, dil, out_pad))
    pad = pad * n if len(pad) == 1 else pad
    attrs = {"strides": stride, "dilations": dil, "pads": [*pad, *pad], "group": groups}
    if transposed:
        attrs["output_padding"] = out_pad
        out = onnx_op(ctx, node, "ConvTranspose", [ctx.emit(x), w, b], attrs)
    else:
        out = onnx_op(ctx, node, "Conv", [ctx.emit(x), w, b], attrs)
    return out if batched else op.squeeze(out, axis=(0,))


# ---- pooling ------------------------------------------------------------------------------
def _pool_attrs(node: Any, n: int, kernel_key: int = 1) -> dict[str, Any]:
    kernel = list(node.arg(kernel_key))
    kernel = kernel * n if len(kernel) == 1 else kernel
    stride = list(node.arg(kernel_key + 1) or []) or kernel
    stride = stride * n if len(stride) == 1 else stride
    pad = list(node.arg(kernel_key + 2))
    pad = pad * n if len(pad) == 1 else pad
    return {"kernel_shape": kernel, "strides": stride, "pads": [*pad, *pad]}


def _unbatched(x: Any, n: int) -> tuple[Any, bool]:
    if ndim_of(x) == n + 1:
        return op.expand_dims(x, 0), True
    return x, False


@converter("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
           "aten.max_pool1d_with_indices.default")
def max_pool_with_indices(ctx: Any, node: Any) -> Any:
    """Values, and -- when used -- torch's indices (flat offsets within each channel's plane)
    from the ONNX MaxPool Indices (offsets within the whole tensor) modulo the plane size."""
    n = int(node.op_name.split("max_pool")[1][0])
    x, unbatched = _unbatched(node.arg(0), n)
    x = ctx.emit(x)
    attrs = _pool_attrs(node, n)
    dil = list(node.arg(4))
    attrs["dilations"] = dil * n if len(dil) == 1 else dil
    attrs["ceil_mode"] = int(bool(node.arg(5)))
    want_index = node.output_used(1)
    outs = onnx_op(ctx, node, "MaxPool", [x], attrs, num_outputs=2 if want_index else 1)
    values = outs[0] if want_index else outs
    index = None
    if want_index:
        plane = int(np.prod([static_int(d) for d in shape_of(x)[2:]]))
        index = op.mod(outs[1], scalar(plane, "int64"))
    if unbatched:
        values = op.squeeze(values, axis=(0,))
        index = None if index is None else op.squeeze(index, axis=(0,))
    return [values, index if index is not None else values]


@converter("aten.max_pool2d.default", "aten.max_pool1d.default", "aten.max_pool3d.default")
def max_pool(ctx: Any, node: Any) -> Any:
    n = int(node.op_name.split("max_pool")[1][0])
    x, unbatched = _unbatched(node.arg(0), n)
    attrs = _pool_attrs(node, n)
    dil = list(node.arg(4))
    attrs["dilations"] = dil * n if len(dil) == 1 else dil
    attrs["ceil_mode"] = int(bool(node.arg(5)))
    out = onnx_op(ctx, node, "MaxPool", [ctx.emit(x)], attrs)
    return op.squeeze(out, axis=(0,)) if unbatched else out


@converter("aten.avg_pool2d.default", "aten.avg_pool1d.default", "aten.avg_pool3d.default")
def avg_pool(ctx: Any, node: Any) -> Any:
    n = int(node.op_name.split("avg_pool")[1][0])
    x, unbatched = _unbatched(node.arg(0), n)
    x = ctx.emit(x)
    attrs = _pool_attrs(node, n)
    attrs["ceil_mode"] = int(bool(node.arg(4)))
    include = bool(node.arg(5))
    divisor = node.arg(6) if n != 1 else None
    attrs["count_include_pad"] = int(include)
    if divisor:
        out = _window_sums(ctx, node, x, attrs, n, unbatched)
        out = op.divide(out, scalar(float(divisor), dtype_of(x)))
    else:
        out = onnx_op(ctx, node, "AveragePool", [x], attrs)
    return op.squeeze(out, axis=(0,)) if unbatched else out


def _window_sums(ctx: Any, node: Any, x: Any, attrs: dict[str, Any], n: int,
                 unbatched: bool) -> Any:
    """Each pooling window's sum (for ``divisor_override``): the input zero-padded so that
    every window torch makes (ceil_mode's partial ones too) is whole, averaged with every tap
    counted, times the tap count."""
    kernel, stride = attrs["kernel_shape"], attrs["strides"]
    pads = attrs["pads"][:n]
    out = node.out_shape[-n:]
    width = [(0, 0), (0, 0)]
    for i in range(n):
        size = static_int(shape_of(x)[2 + i])
        need = (static_int(out[i]) - 1) * stride[i] + kernel[i]
        width.append((pads[i], max(pads[i], need - size - pads[i])))
    xp = ctx.emit(op.pad(x, tuple(width)))
    mean = onnx_op(ctx, node, "AveragePool", [xp], {"kernel_shape": kernel, "strides": stride,
                                                    "pads": [0] * (2 * n)})
    taps = float(np.prod(kernel))
    return op.multiply(mean, scalar(taps, dtype_of(x)))


@converter("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default",
           "aten._adaptive_avg_pool1d.default", "aten.adaptive_avg_pool1d.default",
           "aten._adaptive_avg_pool3d.default")
def adaptive_avg_pool(ctx: Any, node: Any) -> Any:
    return _adaptive(ctx, node, op.nn.adaptive_avg_pool2d)


@converter("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool1d.default")
def adaptive_max_pool(ctx: Any, node: Any) -> Any:
    if node.output_used(1):
        raise node.error("the indices of adaptive max pooling are not supported")
    out = _adaptive(ctx, node, op.nn.adaptive_max_pool2d)
    return [out, out]


def _adaptive(ctx: Any, node: Any, fn: Any) -> Any:
    x = node.arg(0)
    size = [int(s) for s in node.arg(1)]
    n = len(size)
    x, unbatched = _unbatched(x, n)
    if n == 1:
        out = op.squeeze(fn(op.expand_dims(x, 2), output_size=(1, size[0])), axis=(2,))
    elif n == 2:
        out = fn(x, output_size=tuple(size))
    else:  # 3-D: pool H, W per depth slice, then D (separable for averages)
        nb, c, d, h, w = shape_of(x)
        y = fn(reshape(x, (nb, -1, h, w)), output_size=tuple(size[1:]))
        y = fn(reshape(y, (nb, c, d, size[1] * size[2])), output_size=(size[0], size[1] * size[2]))
        out = reshape(y, (nb, c, *size))
    return op.squeeze(out, axis=(0,)) if unbatched else out


# ---- normalization ------------------------------------------------------------------------
def _channel(v: Any, ndim: int) -> Any:
    return reshape(v, (1, -1) + (1,) * (ndim - 2))


def _ones_or(v: Any, x: Any, value: float) -> Any:
    if v is not None:
        return v
    c = shape_of(x)[1] if ndim_of(x) > 1 else 1
    return g.const(np.full((static_int(c),), value, dtype=np.dtype(dtype_of(x))))


@converter("aten._native_batch_norm_legit_no_training.default")
def batch_norm_inference(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    w, b = _ones_or(node.arg(1), x, 1.0), _ones_or(node.arg(2), x, 0.0)
    mean, var = node.arg(3), node.arg(4)
    eps = float(node.arg(6))
    out = op.nn.batch_norm(x, w, b, mean, var, axis=1, epsilon=eps)
    empty = g.const(np.zeros((0,), dtype=np.dtype(dtype_of(x))))
    return [out, empty, empty]


@converter("aten._native_batch_norm_legit.default", "aten._native_batch_norm_legit.no_stats",
           "aten._native_batch_norm_legit_functional.default",
           "aten.native_batch_norm.default")
def batch_norm_training(ctx: Any, node: Any) -> Any:
    """Training-mode batch norm: batch statistics (biased variance to normalize); returns the
    output, the batch mean and 1/sqrt(var + eps), and for the functional form the updated
    running statistics (unbiased variance)."""
    x = node.arg(0)
    nd = ndim_of(x)
    dt = dtype_of(x)
    axes = tuple(a for a in range(nd) if a != 1)
    name = node.op_name
    if name == "aten.native_batch_norm.default" and not node.arg(5):
        return _eval_native_batch_norm(ctx, node, x)
    w, b = _ones_or(node.arg(1), x, 1.0), _ones_or(node.arg(2), x, 0.0)
    no_stats = name.endswith("no_stats")
    mom_i, eps_i = (4, 5) if no_stats else (6, 7) if "native_batch_norm.default" in name \
        else (6, 7)
    eps = float(node.arg(eps_i))
    mom = float(node.arg(mom_i))
    mean = ctx.emit(op.mean(x, axis=axes, keepdims=True))
    dev = ctx.emit(op.subtract(x, mean))
    var = ctx.emit(op.mean(op.multiply(dev, dev), axis=axes, keepdims=True))
    rstd = ctx.emit(op.rsqrt(op.add(var, scalar(eps, dt))))
    out = op.add(op.multiply(op.multiply(dev, rstd), _channel(w, nd)), _channel(b, nd))
    flat_mean, flat_rstd = reshape(mean, (-1,)), reshape(rstd, (-1,))
    results = [out, flat_mean, flat_rstd]
    if "functional" in name:
        count = int(np.prod([static_int(shape_of(x)[a]) for a in axes]))
        rm, rv = node.arg(3), node.arg(4)
        unbiased = op.multiply(reshape(var, (-1,)), scalar(count / max(count - 1, 1), dt))
        keep = scalar(1.0 - mom, dt)
        results += [op.add(op.multiply(rm, keep), op.multiply(flat_mean, scalar(mom, dt))),
                    op.add(op.multiply(rv, keep), op.multiply(unbiased, scalar(mom, dt)))]
    return results


def _eval_native_batch_norm(ctx: Any, node: Any, x: Any) -> Any:
    w, b = _ones_or(node.arg(1), x, 1.0), _ones_or(node.arg(2), x, 0.0)
    out = op.nn.batch_norm(x, w, b, node.arg(3), node.arg(4), axis=1,
                           epsilon=float(node.arg(7)))
    empty = g.const(np.zeros((0,), dtype=np.dtype(dtype_of(x))))
    return [out, empty, empty]


@converter("aten.native_layer_norm.default")
def layer_norm(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    k = len(node.arg(1))
    nd = ndim_of(x)
    axes = tuple(range(nd - k, nd))
    dt = dtype_of(x)
    eps = float(node.arg(4))
    w, b = node.arg(2), node.arg(3)
    if not (node.output_used(1) or node.output_used(2)) and nd > 0:
        norm_shape = shape_of(x)[nd - k:]
        if w is None:
            w = op.broadcast_to(scalar(1.0, dt), tuple(norm_shape))
        if b is None:
            b = op.broadcast_to(scalar(0.0, dt), tuple(norm_shape))
        out = op.nn.layer_norm(x, w, b, axes=axes, epsilon=eps)
        return [out, out, out]
    mean = ctx.emit(op.mean(x, axis=axes, keepdims=True))
    dev = ctx.emit(op.subtract(x, mean))
    var = op.mean(op.multiply(dev, dev), axis=axes, keepdims=True)
    rstd = ctx.emit(op.rsqrt(op.add(var, scalar(eps, dt))))
    out = op.multiply(dev, rstd)
    if w is not None:
        out = op.multiply(out, w)
    if b is not None:
        out = op.add(out, b)
    return [out, mean, rstd]


@converter("aten.native_group_norm.default")
def group_norm(ctx: Any, node: Any) -> Any:
    x, w, b = node.arg(0), node.arg(1), node.arg(2)
    n, c = (static_int(node.arg(i)) for i in (3, 4))
    groups = int(node.arg(6))
    eps = float(node.arg(7))
    dt = dtype_of(x)
    nd = ndim_of(x)
    xg = ctx.emit(reshape(x, (n, groups, -1)))
    mean = ctx.emit(op.mean(xg, axis=(2,), keepdims=True))
    dev = ctx.emit(op.subtract(xg, mean))
    var = op.mean(op.multiply(dev, dev), axis=(2,), keepdims=True)
    rstd = ctx.emit(op.rsqrt(op.add(var, scalar(eps, dt))))
    out = reshape(op.multiply(dev, rstd), shape_of(x))
    if w is not None:
        out = op.multiply(out, _channel(w, nd))
    if b is not None:
        out = op.add(out, _channel(b, nd))
    return [out, reshape(mean, (n, groups)), reshape(rstd, (n, groups))]


# ---- embedding, upsampling, attention ---------------------------------------------------------
@converter("aten.embedding.default")
def embedding(ctx: Any, node: Any) -> Any:
    return op.take(node.arg(0), node.arg(1), axis=0)


def _upsample_scales(node: Any, x: Any, n: int) -> list[float]:
    out = [static_int(d) for d in node.out_shape[-n:]]
    ins = [static_int(d) for d in shape_of(x)[-n:]]
    scales = node.arg("scale_factors") if "scale_factors" in node._names else None
    if scales:
        return [float(s) for s in scales]
    return [o / i for o, i in zip(out, ins)]


@converter("aten.upsample_nearest2d.vec", "aten.upsample_nearest1d.vec",
           "aten.upsample_nearest3d.vec", "aten.upsample_nearest2d.default")
def upsample_nearest(ctx: Any, node: Any) -> Any:
    """torch 'nearest': source index ``floor(dst * in / out)`` (or ``floor(dst / scale)`` when
    a scale is given): a gather per spatial axis with indices known at import time."""
    x = node.arg(0)
    n = ndim_of(x) - 2
    out = node.out_shape[-n:]
    scales = node.arg("scale_factors") if "scale_factors" in node._names else None
    for i in range(n):
        size_in = static_int(shape_of(x)[2 + i])
        size_out = static_int(out[i])
        if scales:
            idx = np.floor(np.arange(size_out) * (1.0 / float(scales[i]))).astype(np.int64)
        else:
            idx = np.floor(np.arange(size_out) * (size_in / size_out)).astype(np.int64)
        idx = np.minimum(idx, size_in - 1)
        x = op.take(x, g.const(idx), axis=2 + i)
    return x


@converter("aten.upsample_bilinear2d.vec", "aten.upsample_linear1d.vec",
           "aten.upsample_bilinear2d.default", "aten.upsample_trilinear3d.vec")
def upsample_linear(ctx: Any, node: Any) -> Any:
    """Separable linear interpolation: per spatial axis, two gathers weighted by constants
    (torch's source coordinates: align_corners, or half-pixel clamped at 0)."""
    x = node.arg(0)
    n = ndim_of(x) - 2
    out = node.out_shape[-n:]
    align = bool(node.arg("align_corners"))
    scales = node.arg("scale_factors") if "scale_factors" in node._names else None
    dt = dtype_of(x)
    for i in range(n):
        size_in, size_out = static_int(shape_of(x)[2 + i]), static_int(out[i])
        dst = np.arange(size_out, dtype=np.float64)
        if align:
            src = dst * ((size_in - 1) / (size_out - 1)) if size_out > 1 else dst * 0
        else:
            scale = 1.0 / float(scales[i]) if scales else size_in / size_out
            src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
        lo = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
        hi = np.minimum(lo + 1, size_in - 1)
        frac = (src - lo).astype(np.dtype(dt) if dt != "bfloat16" else np.float32)
        shape = (-1,) + (1,) * (n - 1 - i)
        w1 = g.const(frac.reshape(shape))
        w0 = g.const((1 - frac).reshape(shape))
        xe = ctx.emit(x)
        a = op.take(xe, g.const(lo), axis=2 + i)
        b = op.take(xe, g.const(hi), axis=2 + i)
        x = ctx.emit(op.add(op.multiply(a, cast(w0, dt)), op.multiply(b, cast(w1, dt))))
    return x


@converter("aten._scaled_dot_product_flash_attention_for_cpu.default",
           "aten.scaled_dot_product_attention.default",
           "aten._scaled_dot_product_attention_math.default")
def sdpa(ctx: Any, node: Any) -> Any:
    """``softmax(q k^T * scale + mask) v`` (causal: future keys masked; GQA keys repeated)."""
    q, k, v = node.arg(0), node.arg(1), node.arg(2)
    dt = dtype_of(q)
    flash = "flash" in node.op_name
    mask = node.arg("attn_mask")
    causal = bool(node.arg("is_causal", False))
    scale = node.arg("scale")
    d = static_int(shape_of(q)[-1])
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(d)
    hq, hk = static_int(shape_of(q)[-3]) if ndim_of(q) > 2 else 1, \
        static_int(shape_of(k)[-3]) if ndim_of(k) > 2 else 1
    if hq and hk and hq != hk:
        rep = hq // hk
        k = _repeat_heads(k, rep)
        v = _repeat_heads(v, rep)
    kt = op.transpose(k, tuple(range(ndim_of(k) - 2)) + (ndim_of(k) - 1, ndim_of(k) - 2))
    scores = op.multiply(op.matmul(q, kt), scalar(scale, dt))
    lq, lk = shape_of(q)[-2], shape_of(k)[-2]
    if causal:
        tri = np.tril(np.ones((static_int(lq), static_int(lk)), dtype=bool))
        scores = op.where(g.const(tri), scores, scalar(float("-inf"), dt))
    if mask is not None:
        if dtype_of(mask) == "bool":
            scores = op.where(mask, scores, scalar(float("-inf"), dt))
        else:
            scores = op.add(scores, mask)
    probs = op.nn.softmax(scores, axis=-1)
    out = op.matmul(probs, v)
    if flash:
        return [out, out]
    return out


def _repeat_heads(x: Any, rep: int) -> Any:
    shape = shape_of(x)
    b, h, s, d = shape
    y = op.broadcast_to(op.expand_dims(x, 2), (b, h, rep, s, d))
    return reshape(y, (b, h * rep, s, d))


@converter("aten.pixel_shuffle.default")
def pixel_shuffle(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    r = int(node.arg(1))
    *lead, c, h, w = shape_of(x)
    oc = static_int(c) // (r * r)
    y = reshape(x, (*lead, oc, r, r, h, w))
    nl = len(lead)
    perm = tuple(range(nl)) + tuple(nl + i for i in (0, 3, 1, 4, 2))
    return reshape(op.transpose(y, perm), (*lead, oc, h * r, w * r))


@converter("aten.pixel_unshuffle.default")
def pixel_unshuffle(ctx: Any, node: Any) -> Any:
    x = node.arg(0)
    r = int(node.arg(1))
    *lead, c, h, w = shape_of(x)
    oh, ow = static_int(h) // r, static_int(w) // r
    y = reshape(x, (*lead, c, oh, r, ow, r))
    nl = len(lead)
    perm = tuple(range(nl)) + tuple(nl + i for i in (0, 2, 4, 1, 3))
    return reshape(op.transpose(y, perm), (*lead, static_int(c) * r * r, oh, ow))



@converter("aten.mkldnn_rnn_layer.default")
def mkldnn_rnn_layer(ctx: Any, node: Any) -> Any:
    """One LSTM layer (what ``nn.LSTM`` becomes on CPU under AOT Autograd), unrolled over its
    static number of steps: the input projection for all steps in one product, then per step
    ``gates = xw[t] + h @ w_hh^T`` in torch's order (input, forget, cell, output).
    Returns (output, last h, last c, an empty workspace)."""
    x, w_ih, w_hh, b_ih, b_hh, h, c = (node.arg(i) for i in range(7))
    reverse, hidden = bool(node.arg(7)), int(node.arg(10))
    has_bias, batch_first = bool(node.arg(12)), bool(node.arg(14))
    if node.arg(9) != 2:  # mkldnn's mode 2 is LSTM
        raise node.error(f"RNN mode {node.arg(9)} is not supported (LSTM only)")
    if batch_first:
        x = ctx.emit(op.transpose(x, (1, 0, 2)))
    state_shape = shape_of(h)
    h, c = (ctx.emit(op.reshape(v, (-1, hidden))) for v in (h, c))  # (batch, hidden)
    steps = static_int(shape_of(x)[0])
    if steps is None:
        raise node.error("an LSTM over a symbolic number of steps is not supported")
    dt = dtype_of(x)
    xw = op.matmul(x, op.transpose(w_ih, (1, 0)))
    if has_bias:
        xw = op.add(xw, op.add(b_ih, b_hh))
    xw = ctx.emit(xw)
    w_hh_t = ctx.emit(op.transpose(w_hh, (1, 0)))
    outs: list[Any] = [None] * steps
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        step = op.squeeze(op.strided_slice(xw, (t,), (t + 1,), axes=(0,)), axis=(0,))
        gates = ctx.emit(op.add(step, op.matmul(h, w_hh_t)))
        i, f, g_, o = (op.strided_slice(gates, (k * hidden,), ((k + 1) * hidden,), axes=(1,))
                       for k in range(4))
        c = ctx.emit(op.add(op.multiply(op.sigmoid(f), c),
                            op.multiply(op.sigmoid(i), op.tanh(g_))))
        h = ctx.emit(op.multiply(op.sigmoid(o), op.tanh(c)))
        outs[t] = op.expand_dims(h, 0)
    out = op.concat(outs, axis=0) if steps > 1 else outs[0]
    if batch_first:
        out = op.transpose(out, (1, 0, 2))
    empty = g.const(np.zeros((0,), dtype=np.dtype(dt)))
    return [out, op.reshape(h, state_shape), op.reshape(c, state_shape), empty]
