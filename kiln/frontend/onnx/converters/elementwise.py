"""Elementwise ONNX operators: arithmetic, math functions, activations, comparisons, logic."""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import op
from ..registry import converter
from .common import dtype_of, scalar

_BINARY = {
    "Add": op.add, "Sub": op.subtract, "Mul": op.multiply,
    "Equal": op.equal, "Less": op.less, "Greater": op.greater,
    "LessOrEqual": op.less_equal, "GreaterOrEqual": op.greater_equal,
    "And": op.logical_and, "Or": op.logical_or,
}

_UNARY = {
    "Neg": op.negative, "Abs": op.abs, "Exp": op.exp, "Log": op.log, "Sqrt": op.sqrt,
    "Tanh": op.tanh, "Sigmoid": op.sigmoid, "Erf": op.erf, "Relu": op.relu, "Floor": op.floor,
    "Ceil": op.ceil, "Round": op.round, "Sin": op.sin, "Cos": op.cos, "Not": op.logical_not,
}


def _binary(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return fn(node.input(0), node.input(1))

    return convert


def _unary(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        return fn(node.input(0))

    return convert


for _name, _fn in _BINARY.items():
    converter(_name, since=1)(_binary(_fn))
for _name, _fn in _UNARY.items():
    converter(_name, since=1)(_unary(_fn))


@converter("Div")
def div(ctx: Any, node: Any) -> Any:
    a, b = node.input(0), node.input(1)
    dt = dtype_of(a)
    if not dt.startswith(("int", "uint")):
        return op.divide(a, b)
    if dt.startswith("uint"):
        return op.floor_divide(a, b)
    # ONNX integer division truncates toward zero: |a| // |b| with the quotient's sign
    zero = scalar(0, dt)
    q = op.floor_divide(op.abs(a), op.abs(b))
    return op.where(op.not_equal(op.less(a, zero), op.less(b, zero)), op.negative(q), q)


@converter("Identity")
def identity(ctx: Any, node: Any) -> Any:
    return node.input(0)


@converter("Pow")
def pow_(ctx: Any, node: Any) -> Any:
    x, y = node.input(0), node.input(1)
    if dtype_of(y) != dtype_of(x):
        y = op.cast(y, dtype_of(x))
    return op.power(x, y)


@converter("Reciprocal")
def reciprocal(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.divide(scalar(1.0, dtype_of(x)), x)


def _fold(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        xs = [x for x in node.inputs() if x is not None]
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out

    return convert


converter("Max")(_fold(op.maximum))
converter("Min")(_fold(op.minimum))
converter("Sum")(_fold(op.add))


@converter("Mean")
def mean(ctx: Any, node: Any) -> Any:
    xs = [x for x in node.inputs() if x is not None]
    total = _fold(op.add)(ctx, node)
    return op.divide(total, scalar(len(xs), dtype_of(xs[0])))


@converter("LeakyRelu")
def leaky_relu(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    alpha = scalar(node.attr("alpha", 0.01), dtype_of(x))
    return op.where(op.less(x, scalar(0, dtype_of(x))), op.multiply(x, alpha), x)


def _elu(x: Any, alpha: float) -> Any:
    dt = dtype_of(x)
    neg = op.multiply(scalar(alpha, dt), op.subtract(op.exp(x), scalar(1, dt)))
    return op.where(op.greater(x, scalar(0, dt)), x, neg)


@converter("Elu")
def elu(ctx: Any, node: Any) -> Any:
    return _elu(node.input(0), node.attr("alpha", 1.0))


@converter("Selu")
def selu(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    gamma = node.attr("gamma", 1.05070102214813232421875)
    alpha = node.attr("alpha", 1.67326319217681884765625)
    return op.multiply(scalar(gamma, dtype_of(x)), _elu(x, alpha))


def _hard_sigmoid(x: Any, alpha: float, beta: float) -> Any:
    dt = dtype_of(x)
    lin = op.add(op.multiply(x, scalar(alpha, dt)), scalar(beta, dt))
    return op.clip(lin, 0.0, 1.0)


@converter("HardSigmoid")
def hard_sigmoid(ctx: Any, node: Any) -> Any:
    return _hard_sigmoid(node.input(0), node.attr("alpha", 0.2), node.attr("beta", 0.5))


@converter("HardSwish", since=14)
def hard_swish(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.multiply(x, _hard_sigmoid(x, 1.0 / 6.0, 0.5))


@converter("Gelu", since=20)
def gelu(ctx: Any, node: Any) -> Any:
    return op.gelu(node.input(0), approximate=node.attr("approximate", "none"))


@converter("Softplus")
def softplus(ctx: Any, node: Any) -> Any:
    x = node.input(0)
    return op.log(op.add(op.exp(x), scalar(1, dtype_of(x))))


def _bound(ctx: Any, node: Any, i: int, what: str) -> float | None:
    v = node.const_input(i, what)
    return None if v is None else float(np.asarray(v).reshape(()))


@converter("Clip", since=1)
def clip_v1(ctx: Any, node: Any) -> Any:
    return op.clip(node.input(0), node.attr("min", None), node.attr("max", None))


@converter("Clip", since=11)
def clip_v11(ctx: Any, node: Any) -> Any:
    # min(max(x, lo), hi): ONNX sets every value to ``max`` when min > max
    x = node.input(0)
    lo, hi = _bound(ctx, node, 1, "min"), _bound(ctx, node, 2, "max")
    out = x
    if lo is not None:
        out = op.maximum(out, scalar(lo, dtype_of(x)))
    if hi is not None:
        out = op.minimum(out, scalar(hi, dtype_of(x)))
    return out


@converter("Cast")
def cast(ctx: Any, node: Any) -> Any:
    from ..importer import onnx_dtype

    dtype = onnx_dtype(node.attr("to"), str(node))
    x = node.input(0)
    value = node.const_value(0)
    if value is not None:
        return value.astype(dtype)
    return op.cast(x, dtype)


@converter("Where", since=9)
def where(ctx: Any, node: Any) -> Any:
    return op.where(node.input(0), node.input(1), node.input(2))
