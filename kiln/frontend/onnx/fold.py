"""Import-time evaluation of small ops whose inputs are all known constants.

Models compute shapes with chains like Shape -> Gather -> Sub -> ConstantOfShape; evaluating
them with numpy keeps every shape-determining input constant. ``FOLDERS`` maps an op type to
``fn(node, *arrays) -> array``; the importer uses it before the op's converter whenever every
present input of the node is constant. A folder that numpy cannot evaluate (shapes that do not
broadcast, a squeeze of a dim that is not 1) falls back to the op's converter, which reports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


def _int_div(node: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Div: integers truncate toward zero (the floor quotient plus one where inexact and
    the signs differ: exact at INT_MIN), a zero divisor gives 0, as the compiled kernel does."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if a.dtype.kind in "iu":
            q, r = np.floor_divide(a, b), np.mod(a, b)
            fix = (r != 0) & ((a < 0) != (b < 0))
            return np.asarray(q + fix.astype(q.dtype)).astype(a.dtype)
        return np.asarray(a / b).astype(a.dtype)


def _mod(node: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Mod: ``fmod=1`` is C fmod (sign of the dividend), else the floor modulo; an
    integer modulo by zero gives 0 (as the compiled kernel does)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.fmod(a, b) if node.attr("fmod", 0) else np.mod(a, b)
    return np.asarray(out).astype(a.dtype)


def _binary(fn: Callable[..., Any]) -> Callable[..., Any]:
    def fold(node: Any, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.asarray(fn(a, b))
        return out if out.dtype == bool else out.astype(a.dtype)

    return fold


def _unary(fn: Callable[..., Any]) -> Callable[..., Any]:
    return lambda node, a: np.asarray(fn(a)).astype(a.dtype)


def _variadic(fn: Callable[..., Any]) -> Callable[..., Any]:
    def fold(node: Any, *xs: np.ndarray) -> np.ndarray:
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return np.asarray(out).astype(xs[0].dtype)

    return fold


def _axes(node: Any, axes: np.ndarray | None) -> tuple[int, ...] | None:
    """Squeeze/Unsqueeze axes: the input (opset 13+) or the attribute (before)."""
    if axes is not None:
        return tuple(int(a) for a in np.asarray(axes).reshape(-1))
    attr = node.attr("axes", None)
    return None if attr is None else tuple(int(a) for a in attr)


def _squeeze(node: Any, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    ax = _axes(node, axes)
    return np.squeeze(x) if ax is None else np.squeeze(x, axis=ax)


def _unsqueeze(node: Any, x: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    ax = _axes(node, axes) or ()
    rank = x.ndim + len(ax)
    return np.expand_dims(x, tuple(sorted(a % rank for a in ax)))


FOLDERS: dict[str, Callable[..., np.ndarray]] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Div": _int_div, "Equal": _binary(np.equal), "Less": _binary(np.less),
    "Greater": _binary(np.greater), "LessOrEqual": _binary(np.less_equal),
    "GreaterOrEqual": _binary(np.greater_equal), "And": _binary(np.logical_and),
    "Or": _binary(np.logical_or), "Not": lambda node, a: np.logical_not(a),
    "Neg": _unary(np.negative), "Abs": _unary(np.abs), "Max": _variadic(np.maximum),
    "Min": _variadic(np.minimum), "Identity": lambda node, a: a,
    "Where": lambda node, c, a, b: np.where(c, a, b).astype(a.dtype),
    # element-wise family (helper A)
    "Mod": _mod, "CastLike": lambda node, a, b: a.astype(b.dtype), "Sign": _unary(np.sign),
    "Xor": _binary(np.logical_xor), "BitwiseAnd": _binary(np.bitwise_and),
    "BitwiseOr": _binary(np.bitwise_or), "BitwiseXor": _binary(np.bitwise_xor),
    "BitwiseNot": _unary(np.invert),
    # shape values (attention function bodies squeeze a gathered dim before Range)
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
}
