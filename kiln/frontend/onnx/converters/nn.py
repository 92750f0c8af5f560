"""Neural-network ONNX operators: MatMul/Gemm, Conv, pooling, normalization, softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import op
from ..registry import converter
from .common import dtype_of, ndim_of, prod, reshape, scalar, shape_of, static_int


@converter("MatMul")
def matmul(ctx: Any, node: Any) -> Any:
    return op.matmul(node.input(0), node.input(1))


@converter("Gemm")
def gemm(ctx: Any, node: Any) -> Any:
    a, b, c = node.input(0), node.input(1), node.input(2)
    dt = dtype_of(a)
    if node.attr("transA", 0):
        a = op.transpose(a, (1, 0))
    if node.attr("transB", 0):
        b = op.transpose(b, (1, 0))
    out = op.matmul(a, b)
    alpha, beta = node.attr("alpha", 1.0), node.attr("beta", 1.0)
    if alpha != 1.0:
        out = op.multiply(out, scalar(alpha, dt))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = op.multiply(c, scalar(beta, dt))
        out = op.add(out, c)
    return out


def _spatial_2d(node: Any, x: Any) -> None:
    if ndim_of(x) != 4:
        raise node.error(f"only 1-D and 2-D spatial inputs (rank 3 or 4) are supported, got "
                         f"rank {ndim_of(x)}")


def _lift_1d(ctx: Any, node: Any, x: Any) -> Any:
    """Rewrite a 1-D op as 2-D with a unit height: (N, C, L) -> (N, C, 1, L) and attributes
    [a] -> [1, a] (pads [b, e] -> [0, b, 0, e]); the caller squeezes axis 2 off again."""
    for name in ("kernel_shape", "strides", "dilations"):
        if name in node.attrs:
            node.attrs[name] = [1, *node.attrs[name]]
    if "pads" in node.attrs:
        b, e = node.attrs["pads"]
        node.attrs["pads"] = [0, b, 0, e]
    return ctx.emit(op.expand_dims(x, 2))


def _spatial(convert: Any) -> Any:
    """Run a 2-D converter on 1-D inputs too (see ``_lift_1d``)."""

    def wrapped(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        if ndim_of(x) != 3:
            return convert(ctx, node, x)
        return op.squeeze(convert(ctx, node, _lift_1d(ctx, node, x)), axis=(2,))

    return wrapped


def _pads(node: Any, x: Any, kernel: tuple[int, int], strides: tuple[int, int],
          dilations: tuple[int, int], ceil_mode: bool = False) -> tuple[int, int, int, int]:
    """(top, left, bottom, right) from ``pads`` or ``auto_pad``."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = node.attr("pads", [0, 0, 0, 0])
        return tuple(int(p) for p in pads)  # type: ignore[return-value]
    if auto == "VALID":
        return (0, 0, 0, 0)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise node.error(f"unknown auto_pad {auto!r}")
    begin, end = [], []
    for i in range(2):
        size = static_int(shape_of(x)[2 + i])
        if size is None:
            raise node.error("auto_pad SAME needs static spatial dimensions")
        out = -(-size // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return (begin[0], begin[1], end[0], end[1])


def _pair(node: Any, name: str, default: int = 1) -> tuple[int, int]:
    v = node.attr(name, None)
    if v is None:
        return (default, default)
    if len(v) != 2:
        raise node.error(f"{name} must have 2 entries for a 2-D op, got {list(v)}")
    return (int(v[0]), int(v[1]))


@converter("Conv")
@_spatial
def conv(ctx: Any, node: Any, x: Any) -> Any:
    w, b = node.input(1), node.input(2)
    if ndim_of(w) == 3:
        w = op.expand_dims(w, 2)
    _spatial_2d(node, x)
    kernel = tuple(int(static_int(d) or 0) for d in shape_of(node.input(1))[2:])
    kernel = kernel if len(kernel) == 2 else (1, *kernel)
    strides, dilations = _pair(node, "strides"), _pair(node, "dilations")
    pads = _pads(node, x, kernel, strides, dilations)  # type: ignore[arg-type]
    out = op.nn.conv2d(x, w, strides=strides, padding=pads, dilation=dilations,
                       groups=int(node.attr("group", 1)))
    if b is not None:
        out = op.add(out, reshape(b, (1, -1, 1, 1)))
    return out


def _pool_args(node: Any, x: Any) -> dict[str, Any]:
    _spatial_2d(node, x)
    kernel = _pair(node, "kernel_shape")
    strides, dilations = _pair(node, "strides"), _pair(node, "dilations")
    return dict(pool_size=kernel, strides=strides, dilation=dilations,
                padding=_pads(node, x, kernel, strides, dilations),
                ceil_mode=bool(node.attr("ceil_mode", 0)))


@converter("MaxPool")
@_spatial
def max_pool(ctx: Any, node: Any, x: Any) -> Any:
    if node.num_outputs > 1 and node.proto.output[1]:
        raise node.error("the Indices output of MaxPool is not supported")
    if node.attr("storage_order", 0):
        raise node.error("storage_order=1 is not supported")
    return op.nn.max_pool2d(x, **_pool_args(node, x))


@converter("AveragePool")
@_spatial
def avg_pool(ctx: Any, node: Any, x: Any) -> Any:
    args = _pool_args(node, x)
    if args["dilation"] != (1, 1) and node.opset < 19:
        args["dilation"] = (1, 1)
    return op.nn.avg_pool2d(x, count_include_pad=bool(node.attr("count_include_pad", 0)),
                            **args)


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
    if node.attr("training_mode", 0) or len([o for o in node.proto.output if o]) > 1:
        raise node.error("training-mode batch normalization is not supported")
    x = node.input(0)
    if ndim_of(x) < 2:
        raise node.error("input must have a channel axis")
    # channel-wise (x - mean) / sqrt(var + eps) * scale + bias, broadcast over axis 1
    dt = dtype_of(x)
    shape = (1, -1) + (1,) * (ndim_of(x) - 2)
    scale, bias, mean, var = (reshape(node.input(i), shape) for i in range(1, 5))
    inv = op.divide(scale, op.sqrt(op.add(var, scalar(node.attr("epsilon", 1e-5), dt))))
    return op.add(op.multiply(op.subtract(x, mean), inv), bias)


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
    x = node.input(0)
    if node.opset >= 12:
        training = node.const_input(2, "training_mode")
        if training is not None and bool(np.asarray(training).reshape(())):
            raise node.error("training-mode dropout is not supported")
    outs = [x]
    if node.num_outputs > 1 and node.proto.output[1]:
        shape = ctx.static_shape(x)
        if shape is None:
            raise node.error("the mask output needs a static input shape")
        outs.append(np.ones(shape, dtype=bool))
    return outs


