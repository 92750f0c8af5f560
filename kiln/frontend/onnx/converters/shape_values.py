"""The entries of shape tensors, tracked through the import.

A model exported with a dynamic batch computes its reshape targets at run time::

    Shape(x) -> Gather(0) -> Unsqueeze -> Concat(_, [12], [64]) -> Reshape(q, _)

Each of those nodes makes a real int64 tensor (kernels compute it when the model runs), but
its *entries* are known at import as dims of ``x`` -- symbolic (``batch``) or static. Recording
them per ONNX value lets Reshape emit ``reshape(q, (batch, 128, 12, 64))``: the result keeps a
shape the rest of the graph can plan and schedule for (fusion, packed layouts, the memory
plan), where a run-time reshape would leave fresh dims that later operators cannot relate
(a matmul of two such results knows only its rank). This is what TVM's Relax importer does
with ``ShapeExpr`` values.

Entries are ints or int64 PrimExprs; tracked are Shape, Gather of constant indices, Unsqueeze,
Squeeze, Concat, Identity and integer Cast. Constant int tensors of rank at most 1 count as
known entries.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .common import static_int


def entries(ctx: Any, node: Any, index: int) -> list[Any] | None:
    """The entries of ``node``'s input ``index`` when known at import (a constant int
    tensor of rank <= 1, or a tracked shape value), else None."""
    if not node.has_input(index):
        return None
    const = node.const_value(index)
    if const is not None:
        arr = np.asarray(const)
        if arr.ndim > 1 or arr.dtype.kind not in "iu":
            return None
        return [int(v) for v in arr.reshape(-1)]
    return ctx.shape_dims.get(node.proto.input[index])


def track(ctx: Any, node: Any, values: list[Any]) -> None:
    """Record the entries of ``node``'s first output (static ones as ints)."""
    ctx.shape_dims[node.proto.output[0]] = [_norm(v) for v in values]


def forward(ctx: Any, node: Any) -> None:
    """Pass the known entries of ``node``'s first input on to its first output (an Identity,
    an integer Cast, a Squeeze or Unsqueeze between a scalar and a 1-element vector)."""
    values = entries(ctx, node, 0)
    if values is not None:
        track(ctx, node, values)


def static_entries(values: list[Any]) -> list[int] | None:
    """``values`` as ints when every entry is static."""
    out = [static_int(v) if not isinstance(v, int) else v for v in values]
    return None if any(v is None for v in out) else out


def _norm(value: Any) -> Any:
    if isinstance(value, (int, np.integer)):
        return int(value)
    static = static_int(value)
    return value if static is None else static
