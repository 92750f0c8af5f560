"""Random generators: RandomUniform(Like), RandomNormal(Like), Bernoulli, Multinomial, and
the mask of training-mode Dropout (called from :mod:`.nn`'s Dropout converter).

kiln draws its numbers with Philox-4x32 from a seed (see :mod:`kiln.op.random`): a node's
``seed`` attribute becomes a constant seed (the same model gives the same numbers on every
run), a node without one draws a fresh seed on every run (``random_seed``). The numbers are
not numpy's: models that compare against numpy's generator for a given seed cannot match, only
the distribution does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..importer import onnx_dtype
from ..registry import converter
from .common import dtype_of, scalar, shape_of

_FLOATS = ("float16", "bfloat16", "float32", "float64")


def seed_input(ctx: Any, node: Any) -> Any:
    """The seed tensor of ``node``: its ``seed`` attribute (a float) as the uint64 of its
    float64 bits (distinct seeds stay distinct), else a fresh seed per run."""
    seed = node.attr("seed")
    if seed is None:
        return ctx.emit(op.random_seed())
    return g.const(np.array(float(seed), "float64").view("uint64"))


def _out_dtype(node: Any, default: str) -> str:
    dt = onnx_dtype(node.attr("dtype"), str(node)) if "dtype" in node.attrs else default
    if dt not in _FLOATS:
        raise node.error(f"random values of dtype {dt} are not supported (float types only)")
    return dt


def _like_shape(ctx: Any, node: Any) -> tuple[int, ...]:
    x = node.input(0)
    shape = ctx.static_shape(x)
    if shape is None:
        raise node.error(f"needs a static input shape, got {shape_of(x)}")
    return shape


def _shape_attr(node: Any) -> tuple[int, ...]:
    shape = node.attr("shape")
    if shape is None:
        raise node.error("the shape attribute is required")
    return tuple(int(d) for d in shape)


@converter("RandomUniform")
def random_uniform(ctx: Any, node: Any) -> Any:
    return op.random_uniform(seed_input(ctx, node), shape=_shape_attr(node),
                             dtype=_out_dtype(node, "float32"), low=node.attr("low", 0.0),
                             high=node.attr("high", 1.0))


@converter("RandomNormal")
def random_normal(ctx: Any, node: Any) -> Any:
    return op.random_normal(seed_input(ctx, node), shape=_shape_attr(node),
                            dtype=_out_dtype(node, "float32"), mean=node.attr("mean", 0.0),
                            scale=node.attr("scale", 1.0))


@converter("RandomUniformLike")
def random_uniform_like(ctx: Any, node: Any) -> Any:
    return op.random_uniform(seed_input(ctx, node), shape=_like_shape(ctx, node),
                             dtype=_out_dtype(node, dtype_of(node.input(0))),
                             low=node.attr("low", 0.0), high=node.attr("high", 1.0))


@converter("RandomNormalLike")
def random_normal_like(ctx: Any, node: Any) -> Any:
    return op.random_normal(seed_input(ctx, node), shape=_like_shape(ctx, node),
                            dtype=_out_dtype(node, dtype_of(node.input(0))),
                            mean=node.attr("mean", 0.0), scale=node.attr("scale", 1.0))


@converter("Bernoulli", since=15)
def bernoulli(ctx: Any, node: Any) -> Any:
    p = node.input(0)
    if dtype_of(p) not in _FLOATS:
        raise node.error(f"expects float probabilities, got {dtype_of(p)}")
    dt = onnx_dtype(node.attr("dtype"), str(node)) if "dtype" in node.attrs else dtype_of(p)
    return op.bernoulli(p, seed_input(ctx, node), dtype=dt)


@converter("Multinomial", since=7)
def multinomial(ctx: Any, node: Any) -> Any:
    """Samples of each row's categorical distribution given by unnormalized log-probabilities:
    the row's cumulative ``exp(x - max)`` is searched for ``u * total`` (inverse CDF)."""
    x = node.input(0)
    dt = dtype_of(x)
    shape = ctx.static_shape(x)
    if dt not in _FLOATS or shape is None or len(shape) != 2:
        raise node.error(f"expects a static 2-D float input (batch, classes), got {dt} "
                         f"{shape_of(x)}")
    out = onnx_dtype(node.attr("dtype", 6), str(node))
    if out not in ("int32", "int64"):
        raise node.error(f"dtype must be int32 or int64, got {out}")
    samples = int(node.attr("sample_size", 1))
    if samples < 1 or shape[1] < 1:
        raise node.error(f"needs sample_size >= 1 and classes >= 1, got {samples}, {shape[1]}")
    ct = "float64" if dt == "float64" else "float32"
    logits = x if dt == ct else op.cast(x, ct)
    weights = op.exp(op.subtract(logits, op.max(logits, axis=1, keepdims=True)))
    cdf = ctx.emit(op.cumsum(weights, axis=1))
    u = op.random_uniform(seed_input(ctx, node), shape=(shape[0], samples), dtype=ct)
    return op.categorical_sample(cdf, u, dtype=out)


def training_dropout(ctx: Any, node: Any, training: Any | None) -> list[Any]:
    """Dropout with a random mask: ``y = x * mask / (1 - ratio)``, ``mask`` True with
    probability ``1 - ratio`` (ONNX's ``u >= ratio``). ``training`` is the run-time
    training_mode tensor (None: known to be true), which selects between this and the
    identity."""
    x = node.input(0)
    dt = dtype_of(x)
    if dt not in _FLOATS:
        raise node.error(f"expects a float input, got {dt}")
    ratio = node.input(1) if node.has_input(1) else scalar(0.5, dt)
    ratio_const = node.const_value(1)
    if ratio_const is not None and not 0.0 <= float(np.asarray(ratio_const)) < 1.0:
        raise node.error(f"ratio must be in [0, 1), got {float(np.asarray(ratio_const))}")
    keep = ctx.emit(op.subtract(scalar(1.0, dtype_of(ratio)), ratio))
    if dtype_of(keep) != dt:
        keep = ctx.emit(op.cast(keep, dt))
    probs = op.broadcast_to(keep, shape_of(x))
    mask = ctx.emit(op.bernoulli(probs, seed_input(ctx, node), dtype="bool"))
    y = op.divide(op.multiply(x, op.cast(mask, dt)), keep)
    if training is not None:
        y = op.where(training, y, x)
        mask = op.logical_or(mask, op.logical_not(training))
    outs = [y]
    if node.num_outputs > 1 and node.proto.output[1]:
        outs.append(mask)
    return outs
