"""Small reference models built with the graph builder API, each with a numpy implementation.

They are the demo, the end-to-end tests and the benchmarks' common ground: the same weights run
through kiln and through plain numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import graph as g
from .. import op
from ..ir.module import IRModule


@dataclass
class Model:
    """An IRModule with function "main", example inputs and a numpy reference of main."""

    name: str
    mod: IRModule
    inputs: list[np.ndarray]
    reference: Any  # callable(*inputs) -> np.ndarray


def mlp(batch: int = 8, sizes: tuple[int, ...] = (784, 1024, 1024, 10), seed: int = 0) -> Model:
    """Dense -> bias -> relu layers, softmax at the end."""
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = (rng.standard_normal((fan_out, fan_in)) / np.sqrt(fan_in)).astype("float32")
        b = (0.1 * rng.standard_normal(fan_out)).astype("float32")
        weights.append((w, b))

    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((batch, sizes[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h: Any = x
            for i, (w, b) in enumerate(weights):
                h = bb.emit(op.dense(h, g.const(w)))
                h = bb.emit(op.add(h, g.const(b)))
                if i < len(weights) - 1:
                    h = bb.emit(op.nn.relu(h))
            out = bb.emit_output(op.nn.softmax(h, axis=-1))
        bb.emit_func_output(out)

    def reference(xv: np.ndarray) -> np.ndarray:
        h = xv.astype("float64")
        for i, (w, b) in enumerate(weights):
            h = h @ w.T.astype("float64") + b
            if i < len(weights) - 1:
                h = np.maximum(h, 0)
        e = np.exp(h - h.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)).astype("float32")

    inputs = [rng.standard_normal((batch, sizes[0])).astype("float32")]
    return Model("mlp", bb.get(), inputs, reference)


def small_cnn(batch: int = 2, channels: int = 16, size: int = 32, classes: int = 10,
              seed: int = 0) -> Model:
    """conv3x3 -> batch_norm -> relu -> max_pool -> conv3x3 -> relu -> global pool -> dense."""
    rng = np.random.default_rng(seed)
    c1 = (rng.standard_normal((channels, 3, 3, 3)) * 0.2).astype("float32")
    gamma = (1 + 0.1 * rng.standard_normal(channels)).astype("float32")
    beta = (0.1 * rng.standard_normal(channels)).astype("float32")
    mean = (0.1 * rng.standard_normal(channels)).astype("float32")
    var = (1 + 0.1 * rng.random(channels)).astype("float32")
    c2 = (rng.standard_normal((2 * channels, channels, 3, 3)) * 0.1).astype("float32")
    wd = (rng.standard_normal((classes, 2 * channels)) * 0.2).astype("float32")
    bd = (0.1 * rng.standard_normal(classes)).astype("float32")

    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((batch, 3, size, size), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.conv2d(x, g.const(c1), padding=(1, 1)))
            h = bb.emit(op.nn.batch_norm(h, g.const(gamma), g.const(beta), g.const(mean),
                                         g.const(var), axis=1, epsilon=1e-5))
            h = bb.emit(op.nn.relu(h))
            h = bb.emit(op.nn.max_pool2d(h, pool_size=(2, 2), strides=(2, 2)))
            h = bb.emit(op.nn.conv2d(h, g.const(c2), padding=(1, 1)))
            h = bb.emit(op.nn.relu(h))
            h = bb.emit(op.nn.global_avg_pool2d(h))
            h = bb.emit(op.reshape(h, (batch, 2 * channels)))
            h = bb.emit(op.dense(h, g.const(wd)))
            out = bb.emit_output(op.add(h, g.const(bd)))
        bb.emit_func_output(out)

    def conv(xv: np.ndarray, w: np.ndarray) -> np.ndarray:
        n, c, hh, ww = xv.shape
        p = np.pad(xv, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((n, w.shape[0], hh, ww))
        for di in range(3):
            for dj in range(3):
                out += np.einsum("nchw,oc->nohw", p[:, :, di:di + hh, dj:dj + ww], w[:, :, di, dj])
        return out

    def reference(xv: np.ndarray) -> np.ndarray:
        h = conv(xv.astype("float64"), c1.astype("float64"))
        sh = (1, -1, 1, 1)
        h = (h - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + 1e-5) * gamma.reshape(sh)
        h = np.maximum(h + beta.reshape(sh), 0)
        n, c, hh, ww = h.shape
        h = h.reshape(n, c, hh // 2, 2, ww // 2, 2).max(axis=(3, 5))
        h = np.maximum(conv(h, c2.astype("float64")), 0)
        h = h.mean(axis=(2, 3))
        return (h @ wd.T + bd).astype("float32")

    inputs = [rng.standard_normal((batch, 3, size, size)).astype("float32")]
    return Model("small_cnn", bb.get(), inputs, reference)


def resnet_block_cnn(batch: int = 2, channels: int = 16, size: int = 16, classes: int = 10,
                     blocks: int = 2, seed: int = 0) -> Model:
    """A small ResNet: conv3x3-bn-relu stem, ``blocks`` residual blocks (conv-bn-relu,
    conv-bn, skip add, relu), global average pool, dense + bias.

    The shape that operator fusion is made for: every conv takes its batch norm, activation
    and skip add as an epilogue.
    """
    rng = np.random.default_rng(seed)

    def conv_w(cout: int, cin: int) -> np.ndarray:
        return (rng.standard_normal((cout, cin, 3, 3)) / np.sqrt(9 * cin)).astype("float32")

    def bn_params() -> tuple[np.ndarray, ...]:
        gamma = (1 + 0.1 * rng.standard_normal(channels)).astype("float32")
        beta = (0.1 * rng.standard_normal(channels)).astype("float32")
        mean = (0.1 * rng.standard_normal(channels)).astype("float32")
        var = (1 + 0.1 * rng.random(channels)).astype("float32")
        return gamma, beta, mean, var

    stem = (conv_w(channels, 3), bn_params())
    layers = [((conv_w(channels, channels), bn_params()), (conv_w(channels, channels), bn_params()))
              for _ in range(blocks)]
    wd = (rng.standard_normal((classes, channels)) / np.sqrt(channels)).astype("float32")
    bd = (0.1 * rng.standard_normal(classes)).astype("float32")

    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo((batch, 3, size, size), "float32"))

    def conv_bn(h: Any, layer: tuple) -> Any:
        w, (gamma, beta, mean, var) = layer
        h = bb.emit(op.nn.conv2d(h, g.const(w), padding=(1, 1)))
        return bb.emit(op.nn.batch_norm(h, g.const(gamma), g.const(beta), g.const(mean),
                                        g.const(var), axis=1, epsilon=1e-5))

    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(op.nn.relu(conv_bn(x, stem)))
            for first, second in layers:
                y = bb.emit(op.nn.relu(conv_bn(h, first)))
                y = conv_bn(y, second)
                h = bb.emit(op.nn.relu(bb.emit(op.add(y, h))))
            h = bb.emit(op.nn.global_avg_pool2d(h))
            h = bb.emit(op.reshape(h, (batch, channels)))
            h = bb.emit(op.dense(h, g.const(wd)))
            out = bb.emit_output(op.add(h, g.const(bd)))
        bb.emit_func_output(out)

    def np_conv_bn(h: np.ndarray, layer: tuple) -> np.ndarray:
        w, (gamma, beta, mean, var) = layer
        n, _, hh, ww = h.shape
        p = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)))
        out = np.zeros((n, w.shape[0], hh, ww))
        for di in range(3):
            for dj in range(3):
                out += np.einsum("nchw,oc->nohw", p[:, :, di:di + hh, dj:dj + ww],
                                 w[:, :, di, dj].astype("float64"))
        sh = (1, -1, 1, 1)
        out = (out - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + 1e-5) * gamma.reshape(sh)
        return out + beta.reshape(sh)

    def reference(xv: np.ndarray) -> np.ndarray:
        h = np.maximum(np_conv_bn(xv.astype("float64"), stem), 0)
        for first, second in layers:
            y = np.maximum(np_conv_bn(h, first), 0)
            h = np.maximum(np_conv_bn(y, second) + h, 0)
        h = h.mean(axis=(2, 3))
        return (h @ wd.T.astype("float64") + bd).astype("float32")

    inputs = [rng.standard_normal((batch, 3, size, size)).astype("float32")]
    return Model("resnet_block_cnn", bb.get(), inputs, reference)


def dense_bias_relu(x_shape: tuple[int, ...], weight: np.ndarray, bias: np.ndarray
                    ) -> IRModule:
    """``relu(dense(x, weight) + bias)`` with ``x`` a parameter of ``x_shape`` (the weight's
    dtype) and the weight and bias constants: a GEMM whose epilogue a schedule folds."""
    bb = g.BlockBuilder()
    x = g.Var("x", g.TensorStructInfo(x_shape, str(weight.dtype)))
    with bb.function("main"):
        with bb.dataflow():
            y = bb.emit_output(op.nn.relu(op.add(op.linalg.dense(x, g.const(weight)),
                                                 g.const(bias))))
        bb.emit_func_output(y, params=[x])
    return bb.get()


def conv_residual_relu(weight: np.ndarray, res_shape: tuple[int, ...]) -> IRModule:
    """``relu(conv2d(x, weight) + r)`` (NCHW, no padding, float32) with ``x`` and the
    residual ``r`` of ``res_shape`` parameters and the weight a constant: a product whose
    fused epilogue loads a residual."""
    bb = g.BlockBuilder()
    xv = g.Var("x", g.TensorStructInfo((res_shape[0], weight.shape[1], *res_shape[2:]),
                                       "float32"))
    rv = g.Var("r", g.TensorStructInfo(res_shape, "float32"))
    with bb.function("main", [xv, rv]):
        with bb.dataflow():
            c = bb.emit(op.nn.conv2d(xv, g.const(weight)), "c")
            a = bb.emit(op.add(c, rv), "a")
            y = bb.emit_output(op.nn.relu(a), "y")
        bb.emit_func_output(y)
    return bb.get()


def model_script(directory: str | Path, call: str) -> Path:
    """A Python model file in ``directory`` whose ``module()`` returns ``models.<call>.mod``
    (e.g. ``call="mlp(batch=2)"``): what the ``kiln`` command line loads in place of an ONNX
    file (``kiln tune model.py``)."""
    path = Path(directory) / "model.py"
    path.write_text(f"from kiln.testing import models\n\n"
                    f"def module():\n    return models.{call}.mod\n")
    return path


#: ResNet-18's distinct convolutions at 224 x 224, ``(data shape, weight shape, stride,
#: padding)``: every layer shape at batch 1, and the last two stages' 3x3s at batch 32 -- the
#: shapes the GPU tests and benchmarks compile one kernel each for.
RESNET18_CONVS = [((1, 3, 224, 224), (64, 3, 7, 7), 2, 3),
                  ((1, 64, 56, 56), (64, 64, 3, 3), 1, 1),
                  ((1, 64, 56, 56), (128, 64, 3, 3), 2, 1),
                  ((1, 64, 56, 56), (128, 64, 1, 1), 2, 0),
                  ((1, 128, 28, 28), (128, 128, 3, 3), 1, 1),
                  ((1, 128, 28, 28), (256, 128, 3, 3), 2, 1),
                  ((1, 256, 14, 14), (256, 256, 3, 3), 1, 1),
                  ((1, 256, 14, 14), (512, 256, 3, 3), 2, 1),
                  ((1, 512, 7, 7), (512, 512, 3, 3), 1, 1),
                  ((32, 256, 14, 14), (512, 256, 3, 3), 2, 1),
                  ((32, 512, 7, 7), (512, 512, 3, 3), 1, 1)]
