"""Reductions: ReduceSum/Mean/Max/Min/Prod, ArgMax/ArgMin.

Reduction axes moved from an attribute to an input (ReduceSum at opset 13, the others at 18);
an empty axes list reduces everything unless ``noop_with_empty_axes``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ..registry import converter
from .common import ints, ndim_of, shape_of, static_int

_REDUCE = {
    "ReduceSum": (op.sum, 13), "ReduceMean": (op.mean, 18), "ReduceMax": (op.max, 18),
    "ReduceMin": (op.min, 18), "ReduceProd": (op.prod, 18),
}


def _reduce(fn: Any, axes_from_input: bool) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        keepdims = bool(node.attr("keepdims", 1))
        if axes_from_input:
            value = node.const_input(1, "axes")
            axes = None if value is None else ints(value)
        else:
            axes = node.attr("axes", None)
            axes = None if axes is None else [int(a) for a in axes]
        if not axes:
            if node.attr("noop_with_empty_axes", 0):
                return x
            axes = list(range(ndim_of(x)))
        if ndim_of(x) == 0:
            return x
        return fn(x, axis=tuple(axes), keepdims=keepdims)

    return convert


for _name, (_fn, _since) in _REDUCE.items():
    converter(_name, since=1)(_reduce(_fn, False))
    converter(_name, since=_since)(_reduce(_fn, True))


def _arg(fn: Any) -> Any:
    def convert(ctx: Any, node: Any) -> Any:
        x = node.input(0)
        axis = int(node.attr("axis", 0))
        keepdims = bool(node.attr("keepdims", 1))
        if not node.attr("select_last_index", 0):
            return fn(x, axis=axis, keepdims=keepdims)
        # the last extremum is the first one of the reversed axis: n - 1 - index there
        n = static_int(shape_of(x)[axis])
        if n is None:
            raise node.error("select_last_index=1 needs a static reduced axis")
        rev = op.strided_slice(x, (None,), (None,), (-1,), (axis,))
        idx = fn(rev, axis=axis, keepdims=keepdims)
        return op.subtract(g.const(np.array(n - 1, dtype="int64")), idx)

    return convert


converter("ArgMax")(_arg(op.argmax))
converter("ArgMin")(_arg(op.argmin))
