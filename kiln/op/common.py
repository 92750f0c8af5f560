"""Helpers shared by the operator families: argument checks, attribute normalization, shapes.

Every family's StructInfo inference and compute use them: ``tensor_arg`` (an argument's
TensorStructInfo, or a StructInfoError naming the op and the argument), ``arg_shape`` /
``arg_ndim``, ``tensor_sinfo``, numpy broadcasting (``broadcast_shape``, ``broadcast_sinfo``,
``broadcast_load`` on the te side), dimensions as int64 PrimExprs (``as_dim``, ``const_int``,
``dims_equal``, ``simplify``), axis and shape attributes (``normalize_axis``, ``reduce_axes``,
``shape_attr_value``, ``shape_attr``, ``shape_of``), ``scalar`` (a 0-d constant, for gradient
rules) and the plain-variable dimensions a hand-written kernel binds (``KernelDims``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import te, tir
from ..arith import Analyzer
from ..graph import shape_utils, struct_info
from ..graph.expr import Constant
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import IntImm, PrimExpr
from ..tir.function import ASSUME_ATTR
from ..tir.functor import collect_vars
from .registry import MixedPrecision, OpDef, OpPattern, register_op

INDEX_DTYPE = DataType("int64")


def _graph_sinfo():
    return struct_info


def as_dim(value: Any) -> PrimExpr:
    """A shape entry as an int64 PrimExpr (python ints and int32 immediates are widened)."""
    if isinstance(value, bool):
        raise KilnError(f"shape entry {value!r} is not an integer")
    if isinstance(value, int):
        return tx.const(INDEX_DTYPE, value)
    if isinstance(value, IntImm):
        return value if value.dtype == INDEX_DTYPE else tx.const(INDEX_DTYPE, value.value)
    if isinstance(value, PrimExpr):
        return value if value.dtype == INDEX_DTYPE else tx.cast(INDEX_DTYPE, value)
    if hasattr(value, "__index__"):
        return tx.const(INDEX_DTYPE, int(value))
    raise KilnError(f"shape entry {value!r} is not an integer or PrimExpr")


def const_int(value: Any) -> int | None:
    """The python int of a constant dimension, else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, IntImm):
        return value.value
    return None


def simplify(expr: PrimExpr) -> PrimExpr:
    """Simplify a shape or index expression with kiln.arith.

    Every free variable of such an expression is a shape dimension or a loop index, so each is
    assumed non-negative (this is what lets ``n - min(n, 0)`` become ``n``).
    """
    if isinstance(expr, IntImm):
        return expr

    analyzer = Analyzer()
    for v in collect_vars(expr):
        if v.dtype.is_int and v.dtype.lanes == 1:
            extent = tx.const(v.dtype, 2 ** (v.dtype.bits - 2))
            analyzer.bind(v, tx.Range(tx.const(v.dtype, 0), extent))
    return analyzer.simplify(expr)


def dims_equal(a: Any, b: Any) -> bool:
    """True when two dimensions are provably equal (distinct symbols are not)."""
    ca, cb = const_int(a), const_int(b)
    if ca is not None and cb is not None:
        return ca == cb
    return bool(_graph_sinfo().dims_equal(as_dim(a), as_dim(b)))


def fmt_shape(shape: Sequence[Any] | None) -> str:
    if shape is None:
        return "(unknown)"
    parts = [str(const_int(d)) if const_int(d) is not None else str(d) for d in shape]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def tensor_sinfo(shape: Sequence[Any] | None, dtype: Any, ndim: int = -1) -> Any:
    """A TensorStructInfo with int64 PrimExpr dims (or unknown shape with a known rank)."""
    si = _graph_sinfo()
    if shape is None:
        return si.TensorStructInfo(None, as_dtype(dtype), ndim=ndim)
    return si.TensorStructInfo(tuple(as_dim(d) for d in shape), as_dtype(dtype))


def tensor_arg(call: Any, index: int, op: str, arg: str) -> Any:
    """The TensorStructInfo of argument ``index`` of ``call``, or a StructInfoError."""
    si = _graph_sinfo()
    sinfo = call.args[index].struct_info
    if not isinstance(sinfo, si.TensorStructInfo):
        raise StructInfoError(f"{op}: {arg} must be a tensor, got {sinfo}")
    return sinfo


def arg_shape(sinfo: Any) -> tuple[PrimExpr, ...] | None:
    """The shape of a TensorStructInfo as int64 dims, or None when unknown."""
    shape = getattr(sinfo, "shape", None)
    if shape is None:
        return None
    values = getattr(shape, "values", shape)  # a ShapeExpr-like holder or a plain tuple
    if values is None:
        return None
    return tuple(as_dim(d) for d in values)


def arg_ndim(sinfo: Any) -> int:
    shape = arg_shape(sinfo)
    if shape is not None:
        return len(shape)
    ndim = getattr(sinfo, "ndim", -1)
    return -1 if ndim is None else ndim


def normalize_axis(axis: int, ndim: int, op: str, what: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` mapped to ``[0, ndim)``; StructInfoError otherwise."""
    return shape_utils.normalize_axis(axis, ndim, op, what)


def broadcast_shape(op: str, shapes: Sequence[Sequence[Any]]) -> tuple[PrimExpr, ...] | None:
    """numpy broadcasting of several shapes; None when symbolic dims make it undecidable.

    Raises StructInfoError naming ``op`` when two constant dimensions disagree.
    """
    result: tuple[PrimExpr, ...] | None = ()
    for s in shapes:
        result = shape_utils.broadcast_shapes(result, tuple(as_dim(d) for d in s), op)
        if result is None:
            return None
    return result


def broadcast_sinfo(call: Any, op: str, names: Sequence[str], dtype: Any) -> Any:
    """Output TensorStructInfo of a broadcasting op over the arguments ``names``."""
    infos = [tensor_arg(call, i, op, n) for i, n in enumerate(names)]
    shapes = [arg_shape(s) for s in infos]
    if any(s is None for s in shapes):
        ndims = [arg_ndim(s) for s in infos]
        return tensor_sinfo(None, dtype, ndim=-1 if -1 in ndims else max(ndims))
    out = broadcast_shape(op, shapes)
    if out is None:
        return tensor_sinfo(None, dtype, ndim=max(len(s) for s in shapes))
    return tensor_sinfo(out, dtype)


def broadcast_load(t: te.Tensor, out_index: Sequence[PrimExpr],
                   out_shape: Sequence[PrimExpr] | None = None) -> PrimExpr:
    """``t`` read at the (right-aligned) broadcast position of an output index. With the
    output's shape, a dim of ``t`` that is neither 1 nor provably the output's is decided
    while the kernel runs: position 0 when it is 1 (see :func:`broadcast_assumptions`)."""
    off = len(out_index) - t.ndim
    zero = tx.const(INDEX_DTYPE, 0)
    idx = []
    for k, d in enumerate(t.shape):
        i = out_index[off + k]
        if const_int(d) == 1:
            idx.append(zero)
        elif out_shape is not None and not dims_equal(d, out_shape[off + k]):
            idx.append(tx.select(tx.eq(d, tx.const(d.dtype, 1)), zero, i))
        else:
            idx.append(i)
    return t(*idx)


def assume(conditions: Sequence[tuple[PrimExpr, str]]) -> dict[str, Any]:
    """``te.compute`` attrs declaring ``(condition, message)`` pairs on symbolic dims that the
    kernel checks before it runs (``kiln.tir.function.ASSUME_ATTR``); empty when none."""
    return {ASSUME_ATTR: tuple(conditions)} if conditions else {}


def equal_dims(pairs: Sequence[tuple[PrimExpr, PrimExpr, str]]) -> list[tuple[PrimExpr, str]]:
    """The conditions (for :func:`assume`) that each ``(a, b, message)`` pair of dims a
    compute relies on being equal is so, for the pairs not provably equal at compile time."""
    return [(tx.eq(a, b), message) for a, b, message in pairs if not dims_equal(a, b)]


def broadcast_assumptions(op: str, shapes: Sequence[Sequence[PrimExpr]], names: Sequence[str],
                          out_shape: Sequence[PrimExpr]) -> dict[str, Any]:
    """``te.compute`` attrs declaring what the kernel checks before it runs: each operand dim
    that broadcasting could not decide when the model was compiled (a symbolic dim against
    another) must be 1 or the output's."""
    return assume(broadcast_checks(op, shapes, names, out_shape))


def broadcast_checks(op: str, shapes: Sequence[Sequence[PrimExpr]], names: Sequence[str],
                     out_shape: Sequence[PrimExpr]) -> list[tuple[PrimExpr, str]]:
    """The conditions of :func:`broadcast_assumptions` (to combine with others)."""
    conds = []
    for shape, name in zip(shapes, names):
        for axis, cond in shape_utils.broadcast_conditions(shape, out_shape):
            out_dim = out_shape[len(out_shape) - len(shape) + axis]
            conds.append((cond, f"{op}: dimension {axis} of {name} {fmt_shape(shape)} must be 1 "
                                f"or {out_dim} to broadcast to {fmt_shape(out_shape)}"))
    return conds


def te_broadcast_shape(op: str, tensors: Sequence[te.Tensor]) -> tuple[PrimExpr, ...]:
    shape = broadcast_shape(op, [t.shape for t in tensors])
    if shape is None:
        raise KilnError(
            f"{op}: cannot decide the broadcast of shapes "
            + " and ".join(fmt_shape(t.shape) for t in tensors)
            + " (distinct symbolic dimensions)"
        )
    return shape


def shape_attr_value(shape: Any, op_name: str) -> tuple[Any, ...]:
    """A target-shape attribute as a tuple of non-negative ints / PrimExprs (or a clear error)."""
    shape = tuple(shape) if isinstance(shape, (list, tuple)) else (shape,)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, PrimExpr)) or (
            isinstance(d, int) and d < 0
        ):
            raise KilnError(f"{op_name}: bad shape {shape!r}")
    return shape


def reduce_axes(axis: Any, ndim: int, op: str) -> tuple[int, ...]:
    """The sorted, normalized axes a reduction runs over; errors name ``op``."""
    if axis is None:
        return tuple(range(ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    axes = tuple(normalize_axis(a, ndim, op) for a in items)
    if len(set(axes)) != len(axes):
        raise StructInfoError(f"{op}: axis {axis!r} names the same dimension twice")
    return tuple(sorted(axes))


def shape_attr(dims: Sequence[Any]) -> tuple[Any, ...]:
    """Dimensions as a shape attribute: python ints for constants, symbolic ones as they are
    (so attributes print and compare like hand-written ones)."""
    return tuple(const_int(d) if const_int(d) is not None else d for d in dims)


def shape_of(expr: Any, what: str = "gradient") -> tuple[Any, ...]:
    """The shape of a normalized tensor expression as a shape attribute (see
    :func:`shape_attr`); KilnError if unknown."""
    shape = arg_shape(expr.struct_info)
    if shape is None:
        raise KilnError(f"{what}: needs a tensor of known shape, got {expr.struct_info}")
    return shape_attr(shape)


def scalar(value: float, dtype: Any) -> Any:
    """A 0-d constant of ``dtype`` (broadcasts against any tensor of that dtype)."""
    return Constant(np.array(value, dtype=as_dtype(dtype).to_numpy()))


class KernelDims:
    """Symbolic sizes as plain variables (a kernel binds its sizes from argument shapes, which
    needs each dimension to be a constant or a variable); shared by all buffers of a kernel."""

    def __init__(self) -> None:
        self.known: dict[str, tir.Var] = {}

    def __call__(self, shape: Sequence[Any]) -> tuple[PrimExpr, ...]:
        out = []
        for d in shape:
            d = as_dim(d)
            if const_int(d) is not None or isinstance(d, tir.Var):
                out.append(d)
            else:
                key = str(d)
                self.known.setdefault(key, tir.Var(f"d{len(self.known)}", INDEX_DTYPE))
                out.append(self.known[key])
        return tuple(out)


def kernel_dims(shape: Sequence[Any]) -> list[Any]:
    """A kernel binds its symbolic sizes from argument shapes, which needs each dimension to be
    a constant or a plain variable: a compound one (``2*n``) becomes a fresh variable."""
    out, known = [], {}
    for d in shape:
        if const_int(d) is not None or isinstance(d, tir.Var):
            out.append(d)
        else:
            key = str(d)
            known.setdefault(key, tir.Var(f"d{len(known)}", INDEX_DTYPE))
            out.append(known[key])
    return out


def index_const(v: int) -> PrimExpr:
    return tx.const(INDEX_DTYPE, v)


def int_tuple(value: Any, op: str, what: str) -> tuple[int, ...]:
    items = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int):
            raise KilnError(f"{op}: {what} must be ints, got {value!r}")
    return items


def declare_injective(name: str, inputs: Sequence[str], infer: Any, compute: Any,
                      attrs: type | None, doc: str, gradient: Any = None) -> OpDef:
    return register_op(
        name,
        inputs=tuple(inputs),
        infer=infer,
        pattern=OpPattern.INJECTIVE,
        attrs=attrs,
        compute=compute,
        mixed_precision=MixedPrecision.FOLLOW,
        gradient=gradient,
        doc=doc,
    )


def known_shape(call: Any, op: str, arg: str = "x", index: int = 0) -> tuple[Any, Any]:
    """(TensorStructInfo, shape or None) of an argument."""
    x = tensor_arg(call, index, op, arg)
    return x, arg_shape(x)


def dims_sum(dims: Sequence[Any]) -> PrimExpr:
    """Sum of dims with the constants folded (``n + 3`` rather than ``0 + n + 1 + 2``)."""
    const, expr = 0, None
    for d in dims:
        v = const_int(d)
        if v is not None:
            const += v
        else:
            expr = as_dim(d) if expr is None else expr + as_dim(d)
    if expr is None:
        return index_const(const)
    return simplify(expr + index_const(const)) if const else simplify(expr)


def clamp_between(v: PrimExpr, lo: PrimExpr | None, hi: PrimExpr | None) -> PrimExpr:
    if hi is not None:
        v = tx.min(v, hi)
    if lo is not None:
        v = tx.max(v, lo)
    return v


def attr_fields(attrs: Any) -> dict[str, Any]:
    return {f.name: getattr(attrs, f.name) for f in dataclasses.fields(attrs)}


def is_float_arg(x: Any) -> bool:
    return as_dtype(x.struct_info.dtype).is_float
