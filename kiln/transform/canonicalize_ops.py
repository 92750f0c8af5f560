"""CanonicalizeOps: give equivalent operator calls one spelling.

Frontends and hand-written models say the same thing in different ways; later passes (CSE,
fusion, layout and combine passes, schedules) match one form. The rewrites, all exact:

- **Axis attributes** are made explicit and non-negative (the input rank must be known):
  reductions (``sum mean max min prod``) get a sorted tuple of axes (``None`` when they cover
  every axis); ``argmax``/``argmin``, ``concat``, ``split``, ``take``, ``nn.softmax``,
  ``nn.log_softmax`` and ``nn.batch_norm`` a non-negative axis; ``transpose`` an explicit
  permutation; ``squeeze`` the sorted tuple of removed axes; ``expand_dims`` the sorted tuple of
  inserted positions; ``nn.layer_norm`` non-negative axes (order kept: it is gamma's layout).
  So ``sum(x, axis=-1)`` and ``sum(x, axis=1)`` on a 2-d x become the same call, which CSE then
  merges.
- ``matmul(x, transpose(w))`` with a 2-d ``w`` -> ``dense(x, w)``: the weight-transposed matrix
  product (ONNX ``MatMul`` of a ``Transpose``, PyTorch ``linear``) is kiln's ``dense``, whose
  schedule reads the ``[units, in]`` weight directly; the transpose is left for DCE.
- A **constant** weight goes the other way: ``dense(x, W)`` and ``matmul(x, transpose(W))``
  with a constant 2-d ``W`` -> ``matmul(x, W.T)`` with ``W.T`` stored transposed at compile
  time (once per weight, shared by all its products). ``dense`` must transpose (or read
  across) its weight on every call, while matmul's schedule streams the ``[in, units]`` rows
  contiguously and vectorizes along the units, also for a single row (GEMV); so ``dense`` is
  kept for weights known only at run time.
- ``multiply(x, sigmoid(x))`` (either order) -> ``silu(x)``: SiLU/swish as exported by
  frameworks, one fused element-wise op.
- ``split(x, ...)[i]`` with static pieces -> ``strided_slice(x, ...)``: each piece becomes an
  injective op of its own that fuses into its consumer (a Q/K/V split followed by reshapes and
  transposes becomes three single-pass kernels instead of a copy per piece first); the split
  is left for DCE when nothing else uses the tuple.
- ``power(x, 2)`` with a float x and a constant exponent of 2 that does not broadcast x ->
  ``multiply(x, x)`` (exact, and no ``pow`` call per element; LayerNorm decompositions square
  this way).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ..graph import const
from ..graph import expr as gx
from ..graph.struct_info import TensorStructInfo, TupleStructInfo
from ..ir.module import IRModule
from ..op.registry import get_op_def
from ..op.shape import split_ranges
from ..tir import IntImm
from ..tir import expr as tir_expr
from .pass_infra import PassContext, function_pass
from .simplify_expr import RewriteMutator, call_op, is_identity_constant, op_name, same_tensor_type

__all__ = ["CanonicalizeOps", "canonical_attrs"]

_REDUCE = ("sum", "mean", "max", "min", "prod")
_ONE_AXIS = ("argmax", "argmin", "split", "take", "nn.softmax", "nn.log_softmax",
             "nn.batch_norm")


def _ndim(e: gx.Expr) -> int:
    s = e.struct_info
    if isinstance(s, TensorStructInfo):
        return s.ndim
    if isinstance(s, TupleStructInfo) and s.fields and isinstance(s.fields[0], TensorStructInfo):
        return s.fields[0].ndim  # concat: the fields share the rank
    return -1


def _in_range(axes: tuple[int, ...], ndim: int) -> bool:
    return all(-ndim <= a < ndim for a in axes)


def canonical_attrs(call: gx.Call) -> Any:
    """The canonical attrs of an op call (the same object when already canonical or when the
    rank is unknown). Out-of-range axes are left alone for inference to report."""
    name, attrs = op_name(call), call.attrs
    if name is None or attrs is None or not call.args:
        return attrs
    ndim = _ndim(call.args[0])
    if ndim < 0:
        return attrs
    new: dict[str, Any] = {}
    if name in _REDUCE:
        axis = attrs.axis
        items = (axis,) if isinstance(axis, int) else axis
        if items is not None and _in_range(items, ndim):
            axes = tuple(sorted({a % ndim for a in items}))
            new["axis"] = None if axes == tuple(range(ndim)) else axes
    elif name in _ONE_AXIS:
        if attrs.axis is not None and _in_range((attrs.axis,), ndim):
            new["axis"] = attrs.axis % ndim
    elif name == "concat":
        if _in_range((attrs.axis,), ndim):
            new["axis"] = attrs.axis % ndim
    elif name == "transpose":
        axes = attrs.axes
        if axes is None:
            new["axes"] = tuple(range(ndim - 1, -1, -1))
        elif len(axes) == ndim and _in_range(axes, ndim):
            new["axes"] = tuple(a % ndim for a in axes)
    elif name == "squeeze":
        axis = attrs.axis
        if axis is None:
            shape = call.args[0].struct_info.shape
            if shape is not None:
                new["axis"] = tuple(i for i, d in enumerate(shape)
                                    if isinstance(d, IntImm) and d.value == 1)
        else:
            items = (axis,) if isinstance(axis, int) else axis
            if _in_range(items, ndim):
                new["axis"] = tuple(sorted(a % ndim for a in items))
    elif name == "expand_dims":
        items = (attrs.axis,) if isinstance(attrs.axis, int) else attrs.axis
        out_ndim = ndim + len(items)
        if _in_range(items, out_ndim):
            new["axis"] = tuple(sorted(a % out_ndim for a in items))
    elif name == "nn.layer_norm":
        if _in_range(attrs.axes, ndim):
            new["axes"] = tuple(a % ndim for a in attrs.axes)
    changed = {k: v for k, v in new.items() if getattr(attrs, k) != v}
    return dataclasses.replace(attrs, **changed) if changed else attrs


class _Canonicalizer(RewriteMutator):
    def __init__(self, mod: IRModule):
        super().__init__(mod)
        #: id of a constant weight -> (its transposed Constant, the weight)
        self.transposed: dict[int, tuple[gx.Constant, gx.Constant]] = {}

    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        if isinstance(value, gx.TupleGetItem):
            return self._split_piece(value)
        name = op_name(value)
        if name is None:
            return None
        attrs = canonical_attrs(value)
        if attrs is not value.attrs:
            return value.replace(attrs=attrs)
        if name == "matmul":
            return self._dense(value)
        if name == "dense":
            return self._constant_dense(value)
        if name == "multiply":
            return self._silu(value)
        if name == "power":
            return self._square(value)
        return None

    def _dense(self, call: gx.Call) -> gx.Expr | None:
        x, b = call.args
        t = self.producer(b)
        if op_name(t) != "transpose" or _ndim(t.args[0]) != 2 or _ndim(x) < 1:
            return None
        axes = t.attrs.axes if t.attrs is not None else None
        if axes is not None and tuple(a % 2 for a in axes) != (1, 0):
            return None
        out_dtype = call.attrs.out_dtype if call.attrs is not None else None
        if self.constant_of(t.args[0]) is not None:
            return self._matmul_transposed_const(x, t.args[0], out_dtype)

        return call_op("dense", [x, t.args[0]], get_op_def("dense").make_attrs(out_dtype))

    def _constant_dense(self, call: gx.Call) -> gx.Expr | None:
        x, w = call.args
        if self.constant_of(w) is None or _ndim(w) != 2:
            return None
        out_dtype = call.attrs.out_dtype if call.attrs is not None else None
        return self._matmul_transposed_const(x, w, out_dtype)

    def _matmul_transposed_const(self, x: gx.Expr, w: gx.Expr, out_dtype: Any) -> gx.Expr:
        """``matmul(x, W.T)`` with the transposed constant made now (see the module doc), once
        per constant: every product with ``W`` (each time step of an unrolled RNN) shares one
        ``W.T``, so later passes see one weight, not a copy per call."""
        c = self.constant_of(w)
        made = self.transposed.get(id(c))
        if made is None:  # the source is kept with its transpose, so its id stays unique
            made = self.transposed[id(c)] = (const(np.ascontiguousarray(c.data.T)), c)
        return call_op("matmul", [x, made[0]], get_op_def("matmul").make_attrs(out_dtype))

    def _split_piece(self, item: gx.TupleGetItem) -> gx.Expr | None:
        """``split(x, ...)[i]`` -> ``strided_slice(x, ...)`` when the pieces are static."""
        p = self.producer(item.tuple_value)
        if op_name(p) != "split" or p.attrs is None:
            return None
        xs = p.args[0].struct_info
        if not isinstance(xs, TensorStructInfo) or xs.shape is None:
            return None
        axis = p.attrs.axis % xs.ndim
        start, length = split_ranges(xs.shape[axis], p.attrs)[item.index]
        if not (isinstance(start, tir_expr.IntImm) and isinstance(length, tir_expr.IntImm)):
            return None
        begin, end = start.value, start.value + length.value
        attrs = get_op_def("strided_slice").make_attrs(begin=(begin,), end=(end,), axes=(axis,))
        return call_op("strided_slice", [p.args[0]], attrs)

    def _silu(self, call: gx.Call) -> gx.Expr | None:
        a, b = call.args
        xs = a.struct_info
        if not isinstance(xs, TensorStructInfo) or not xs.dtype.is_float:
            return None
        for x, s in ((a, b), (b, a)):
            p = self.producer(s)
            if op_name(p) == "sigmoid" and p.args[0] is x:
                return call_op("silu", [x])
        return None

    def _square(self, call: gx.Call) -> gx.Expr | None:
        x, e = call.args
        xs = x.struct_info
        c = self.constant_of(e)
        if (
            isinstance(xs, TensorStructInfo) and xs.dtype.is_float and c is not None
            and is_identity_constant(c, 2.0, xs.dtype) and same_tensor_type(xs, call.struct_info)
        ):
            return call_op("multiply", [x, x])
        return None


@function_pass(opt_level=1)
class CanonicalizeOps:
    """Rewrite operator calls into the canonical forms later passes expect."""

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        return _Canonicalizer(mod).visit(func)
