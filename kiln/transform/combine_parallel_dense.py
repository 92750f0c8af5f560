"""CombineParallelDense: several ``dense`` (or weight ``matmul``) calls on the same input become
one.

``dense(x, W1)``, ``dense(x, W2)``... with weights of the same input size, dtype and
``out_dtype`` become ``split(dense(x, concat([W1, W2...], axis=0)), axis=-1)``; a bias add or
an activation that every branch applies is combined too (``add(dense(x, W), concat(biases))``).
Typical sources: the query/key/value projections of attention, multi-head outputs. Constant
weights are concatenated at compile time. ``matmul(x, W)`` with a 2-d ``[in, units]`` weight --
the form CanonicalizeOps gives constant weights -- combines the same way along the weight's
axis 1. The engine is
:class:`kiln.transform.combine_parallel.ParallelCombiner` (shared with CombineParallelConv2D).
"""

from __future__ import annotations

from ..graph import expr as gx
from ..graph.struct_info import TensorStructInfo
from ..ir.module import IRModule
from .combine_parallel import BranchInfo, ParallelCombiner
from .pass_infra import PassContext, function_pass

__all__ = ["CombineParallelDense"]


def analyze_dense(call: gx.Call) -> BranchInfo | None:
    """Combinability of one ``dense`` call (weight ``[units, in]``) or ``matmul`` call with a
    2-d weight (``[in, units]``): same input variable, input size, dtypes, attrs."""
    if call.op.name not in ("dense", "matmul"):
        return None
    x, w = call.args
    xs, ws = x.struct_info, w.struct_info
    if not isinstance(x, gx.Var) or not isinstance(xs, TensorStructInfo) or xs.ndim < 1:
        return None
    if not isinstance(ws, TensorStructInfo) or not ws.is_static or ws.ndim != 2:
        return None
    weight_axis = 0 if call.op.name == "dense" else 1
    units, in_features = ws.static_shape()[weight_axis], ws.static_shape()[1 - weight_axis]
    return BranchInfo(key=(call.op.name, x, call.attrs, str(ws.dtype), in_features),
                      weight_axis=weight_axis, out_axis=xs.ndim - 1, units=units)


@function_pass(opt_level=2)
class CombineParallelDense:
    """Combine dense ops that share their input into one dense on concatenated weights."""

    def __init__(self, min_num_branches: int = 2):
        self.min_num_branches = max(2, int(min_num_branches))

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        return ParallelCombiner(mod, func, analyze_dense, self.min_num_branches).visit(func)
