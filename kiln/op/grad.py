"""The helpers that gradient rules and adjoint operators are written with.

Gradient rules (the ``gradient=`` of each declaration, signature in ``kiln.op.registry``) are
graph code made of ordinary ops. Most adjoints are expressible with the forward ops themselves
(``relu``'s is a ``where``, ``matmul``'s two matmuls); the ones that are not are operators of
their own, declared next to their forward op: ``collapse_sum_like`` / ``collapse_sum_to`` (the
adjoints of broadcasting, :mod:`kiln.op.shape`), ``take_backward`` (:mod:`kiln.op.index`),
``strided_slice_backward`` and ``pad_backward`` (:mod:`kiln.op.slicing`),
``nn.conv2d_backward_data`` / ``_weight`` (:mod:`kiln.op.nn.convolution`) and the pooling
adjoints (:mod:`kiln.op.nn.pooling`). Adjoints linear in their gradient input declare gradients
themselves (the adjoint of an adjoint is the forward op), so second derivatives through them
work; the max pooling adjoints are marked non-differentiable.

Helpers for rule authors: :func:`zeros`, :func:`fit_to` (sum an adjoint down to a broadcast
input's shape and cast it to the input's dtype), :func:`expand_reduced` (broadcast a
reduction's gradient back); next to what they build on: ``scalar``, ``shape_of``,
``shape_attr`` (:mod:`kiln.op.common`), ``unbroadcast`` (:mod:`kiln.op.shape`), ``cast_to``
(:mod:`kiln.op.elementwise`). For adjoint operators: :func:`float_grad`, :func:`like_result`,
:func:`check_grad_shape` (their ``grad`` argument and result), :func:`clamp_into`,
:func:`all_of_or_none`, :func:`masked` (the index arithmetic of their computes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..graph.struct_info import shapes_equal
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    INDEX_DTYPE,
    arg_ndim,
    arg_shape,
    const_int,
    fmt_shape,
    scalar,
    shape_attr,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .elementwise import cast_to
from .shape import broadcast_to, collapse_sum_like, expand_dims

__all__ = [
    "all_of_or_none", "check_grad_shape", "clamp_into", "expand_reduced", "fit_to", "float_grad",
    "like_result", "masked", "zeros",
]


# =============================================================================================
# helpers for gradient rules (graph level)
# =============================================================================================
def zeros(sinfo: Any, what: str = "gradient") -> Any:
    """An explicit zero tensor of a TensorStructInfo: a broadcast 0-d constant, so no large
    constant is stored and symbolic shapes work."""
    shape = arg_shape(sinfo)
    if shape is None:
        raise KilnError(f"{what}: cannot make zeros of unknown shape ({sinfo})")
    zero = scalar(0, sinfo.dtype)
    return zero if not shape else broadcast_to(zero, shape_attr(shape))


def fit_to(bb: Any, expr: Any, x: Any) -> Any:
    """``expr`` made an adjoint of ``x``: summed down to x's shape if it is a broadcast of it
    (its StructInfo is inferred with ``bb``, nothing is emitted) and cast to x's dtype."""
    sinfo = bb.normalize(expr).struct_info
    if not shapes_equal(arg_shape(sinfo), arg_shape(x.struct_info)):
        expr = collapse_sum_like(expr, x)
    return cast_to(expr, x.struct_info.dtype, sinfo.dtype)


def expand_reduced(grad: Any, x_sinfo: Any, axes: Sequence[int], keepdims: bool) -> Any:
    """A reduction's result (or its gradient) broadcast back over the reduced ``axes`` of a
    tensor ``x_sinfo`` (``keepdims``: whether the reduction kept them as length 1)."""
    shape = arg_shape(x_sinfo)
    if shape is None:
        raise KilnError(f"gradient of a reduction needs a known input shape, got {x_sinfo}")
    if axes and not keepdims and tuple(axes) != tuple(range(len(axes))):
        grad = expand_dims(grad, tuple(axes))  # leading axes need none: broadcasting adds them
    if not axes:
        return grad
    return broadcast_to(grad, shape_attr(shape))


# =============================================================================================
# shared checks of the backward ops: grad and a "like" input that gives the result's shape
# =============================================================================================
def float_grad(call: Any, op: str, index: int = 0) -> Any:
    g = tensor_arg(call, index, op, "grad")
    if not as_dtype(g.dtype).is_float:
        raise StructInfoError(f"{op}: grad must be a float tensor, got dtype {g.dtype}")
    return g


def like_result(call: Any, op: str, g: Any, like_index: int, like_name: str) -> Any:
    like = tensor_arg(call, like_index, op, like_name)
    return tensor_sinfo(arg_shape(like), g.dtype, ndim=arg_ndim(like))


def check_grad_shape(op: str, g: Any, expected: Sequence[Any] | None) -> None:
    shape = arg_shape(g)
    if shape is None or expected is None:
        return
    if len(shape) != len(expected) or any(
        const_int(a) is not None and const_int(b) is not None and const_int(a) != const_int(b)
        for a, b in zip(shape, expected)
    ):
        raise StructInfoError(
            f"{op}: grad has shape {fmt_shape(shape)}, expected {fmt_shape(expected)} (the "
            "shape of the forward op's result)"
        )


def clamp_into(v: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """``v`` clamped into ``[0, hi)`` (loads stay in bounds even when a select discards them)."""
    return tx.max(tx.min(v, simplify(hi - 1)), tx.const(INDEX_DTYPE, 0))


def all_of_or_none(conds: list[PrimExpr]) -> PrimExpr | None:
    return tx.all_of(conds) if conds else None


def masked(cond: PrimExpr | None, value: PrimExpr) -> PrimExpr:
    return value if cond is None else tx.select(cond, value, tx.const(value.dtype, 0))


# =============================================================================================
# conv2d adjoints (NCHW data, OIHW weight)
# =============================================================================================


# =============================================================================================
# pooling adjoints (any layout with unsplit H and W)
# =============================================================================================


