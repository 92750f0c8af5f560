"""SimplifyInference: rewrite inference-only operators into plain arithmetic.

- ``nn.batch_norm(x, gamma, beta, mean, var)`` -> ``x * scale + shift`` with
  ``scale = gamma / sqrt(var + eps)`` and ``shift = beta - mean * scale``, both reshaped to
  ``[C, 1, ..., 1]`` so they broadcast along the channel axis. When the four statistics are
  constants (the usual case after BindParams), ``scale`` and ``shift`` are computed here, in
  float64, and become constants of x's dtype; otherwise they are computed in the graph with
  ``rsqrt``/``multiply``/``subtract`` ops. The multiply-add form is what FoldConstant and the
  fusion passes can merge into a preceding convolution or dense and its epilogue.
- ``nn.dropout(x)`` -> ``x`` (the inference-form dropout is the identity).

Opt level 1: kiln's ``nn.batch_norm`` and ``nn.dropout`` have kernels of their own, so the pass
is an optimization, not needed for correctness. The rewrite changes rounding slightly
(``x * scale + shift`` instead of ``(x - mean) * scale + beta``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graph import expr as gx
from ..graph.struct_info import TensorStructInfo
from ..ir.module import IRModule
from ..op import registry
from .pass_infra import PassContext, function_pass
from .simplify_expr import RewriteMutator, call_op, op_name

__all__ = ["SimplifyInference", "batch_norm_scale_shift"]


def batch_norm_scale_shift(gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                           var: np.ndarray, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """``(scale, shift)`` of an inference batch norm, computed in float64, in gamma's dtype."""
    g64, b64, m64, v64 = (np.asarray(a, dtype=np.float64) for a in (gamma, beta, mean, var))
    scale = g64 / np.sqrt(v64 + epsilon)
    shift = b64 - m64 * scale
    dtype = np.asarray(gamma).dtype
    return scale.astype(dtype), shift.astype(dtype)


class _Simplifier(RewriteMutator):
    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        name = op_name(value)
        if name == "nn.dropout":
            return value.args[0]
        if name == "nn.batch_norm":
            return self._batch_norm(value)
        return None

    def _batch_norm(self, call: gx.Call) -> gx.Expr | None:
        x, gamma, beta, mean, var = call.args
        xs = x.struct_info
        if not isinstance(xs, TensorStructInfo) or xs.ndim < 0:
            return None
        axis = call.attrs.axis % xs.ndim
        bshape = (-1,) + (1,) * (xs.ndim - axis - 1)  # broadcasts along `axis` (right-aligned)
        reshape_attrs = registry.get_op_def("reshape").make_attrs(bshape)
        consts = [self.constant_of(a) for a in (gamma, beta, mean, var)]
        if all(c is not None for c in consts):
            scale, shift = batch_norm_scale_shift(*(c.data for c in consts), call.attrs.epsilon)
            channels = scale.shape[0]
            shape = (channels,) + (1,) * (xs.ndim - axis - 1)
            scale_e: Any = gx.Constant(scale.reshape(shape))
            shift_e: Any = gx.Constant(shift.reshape(shape))
        else:
            eps = gx.Constant(np.full((1,), call.attrs.epsilon, dtype=xs.dtype.to_numpy()))
            scale = call_op("multiply", [gamma, call_op("rsqrt", [call_op("add", [var, eps])])])
            scale_v = self.builder.emit(scale)
            shift = call_op("subtract", [beta, call_op("multiply", [mean, scale_v])])
            scale_e = call_op("reshape", [scale_v], reshape_attrs)
            shift_e = call_op("reshape", [shift], reshape_attrs)
        return call_op("add", [call_op("multiply", [x, scale_e]), shift_e])


@function_pass(opt_level=1)
class SimplifyInference:
    """Rewrite batch_norm into multiply + add and drop inference-time dropout."""

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        return _Simplifier(mod).visit(func)
