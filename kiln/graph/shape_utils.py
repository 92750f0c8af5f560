"""Shape and StructInfo helpers for operator inference functions (``infer(call)``).

Every helper raises :class:`~kiln.ir.errors.StructInfoError` whose message names the operator
and the argument, so an ``infer`` written with them reports user mistakes clearly::

    def _infer_add(call):
        a, b = tensor_sinfo(call, 0), tensor_sinfo(call, 1)
        dtype = same_dtype(call, a, b)
        return broadcast_sinfo(a, b, dtype, op_name=op_label(call))

Dimensions are ``int64`` PrimExprs; symbolic ones are compared with ``kiln.arith`` when it can
prove equality, otherwise structurally.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import tir
from ..ir.dtype import DataType
from ..ir.errors import StructInfoError
from .op_registry import get_op_def
from .printer import format_shape
from .struct_info import (
    StructInfo,
    TensorStructInfo,
    TupleStructInfo,
    dims_differ,
    dims_equal,
    shapes_equal,
)

__all__ = [
    "broadcast_conditions", "broadcast_dim", "broadcast_shapes", "broadcast_sinfo", "dims_differ",
    "dims_equal", "input_name", "is_one", "normalize_axes", "normalize_axis", "op_label", "prod",
    "same_dtype", "shapes_equal", "tensor_list_sinfo", "tensor_sinfo",
]


def op_label(call: Any) -> str:
    """The name of the called operator (for messages)."""
    op = call.op
    return getattr(op, "name", None) or getattr(op, "symbol", None) or type(op).__name__


def input_name(call: Any, index: int) -> str:
    """``'weight' (input 1)``: the declared input name of argument ``index`` when known."""
    try:
        inputs = get_op_def(call.op.name).inputs
    except Exception:  # noqa: BLE001 - not a registered op: fall back to the position
        inputs = ()
    if index < len(inputs):
        return f"{inputs[index].rstrip('*')!r} (input {index})"
    if inputs and inputs[-1].endswith("*"):
        return f"{inputs[-1].rstrip('*')!r} (input {index})"
    return f"input {index}"


def _describe(sinfo: StructInfo | None) -> str:
    return "nothing (no struct_info)" if sinfo is None else str(sinfo)


def tensor_sinfo(call: Any, index: int, ndim: int | None = None) -> TensorStructInfo:
    """The TensorStructInfo of ``call.args[index]``; checks the rank when ``ndim`` is given."""
    if index >= len(call.args):
        raise StructInfoError(f"{op_label(call)}: missing {input_name(call, index)}")
    sinfo = call.args[index].struct_info
    if not isinstance(sinfo, TensorStructInfo):
        raise StructInfoError(
            f"{op_label(call)}: {input_name(call, index)} must be a tensor, "
            f"got {_describe(sinfo)}"
        )
    if ndim is not None and sinfo.ndim >= 0 and sinfo.ndim != ndim:
        raise StructInfoError(
            f"{op_label(call)}: {input_name(call, index)} must be {ndim}-d, got {sinfo}"
        )
    return sinfo


def tensor_list_sinfo(call: Any, index: int) -> tuple[TensorStructInfo, ...]:
    """The fields of a tuple-of-tensors argument (a variadic input such as concat's)."""
    if index >= len(call.args):
        raise StructInfoError(f"{op_label(call)}: missing {input_name(call, index)}")
    sinfo = call.args[index].struct_info
    if not isinstance(sinfo, TupleStructInfo):
        raise StructInfoError(
            f"{op_label(call)}: {input_name(call, index)} must be a tuple of tensors, "
            f"got {_describe(sinfo)}"
        )
    for k, f in enumerate(sinfo.fields):
        if not isinstance(f, TensorStructInfo):
            raise StructInfoError(
                f"{op_label(call)}: {input_name(call, index)} element {k} must be a tensor, "
                f"got {f}"
            )
    return sinfo.fields  # type: ignore[return-value]


def same_dtype(call: Any, *sinfos: TensorStructInfo) -> DataType:
    """The common dtype of tensor arguments, or an error listing them."""
    dtypes = [s.dtype for s in sinfos]
    if any(d != dtypes[0] for d in dtypes):
        listed = ", ".join(str(d) for d in dtypes)
        raise StructInfoError(f"{op_label(call)}: inputs must have the same dtype, got {listed}")
    return dtypes[0]


def is_one(dim: tir.PrimExpr) -> bool:
    return isinstance(dim, tir.IntImm) and dim.value == 1


def _fmt_shape(shape: Sequence[tir.PrimExpr]) -> str:
    return format_shape(shape)


def broadcast_dim(da: tir.PrimExpr, db: tir.PrimExpr) -> tir.PrimExpr | None:
    """numpy broadcasting of two dimensions, decided at run time where it cannot be now.

    A constant 1 gives the other; provably equal dims give either; two constants that differ
    give None (they do not broadcast). A pair that cannot be decided yet is the dim the result
    has at run time, and the kernels check that the inputs fit it (:func:`broadcast_conditions`):
    a symbolic dim against a constant ``c != 1`` gives ``c`` (the symbolic one must be 1 or
    ``c``), two symbolic dims ``n``, ``m`` give ``max(n, m)`` (each must be 1 or equal to the
    other).
    """
    if is_one(db):
        return da
    if is_one(da) or dims_equal(da, db):
        return db if is_one(da) else da
    if dims_differ(da, db):
        return None
    if isinstance(db, tir.IntImm):
        return db
    if isinstance(da, tir.IntImm):
        return da
    return tir.max(da, db)


def broadcast_shapes(
    a: Sequence[tir.PrimExpr] | None, b: Sequence[tir.PrimExpr] | None, op_name: str = "broadcast"
) -> tuple[tir.PrimExpr, ...] | None:
    """Numpy-style broadcast of two shapes (aligned at the right).

    Returns None when an input shape is unknown; raises StructInfoError when two constant dims
    differ and neither is 1. Symbolic dims that cannot be decided statically broadcast as
    :func:`broadcast_dim` says: the result holds the dim they have at run time, and the kernel
    computing it checks that they fit (``broadcast_conditions``).
    """
    if a is None or b is None:
        return None
    out: list[tir.PrimExpr] = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else None
        db = b[-i] if i <= len(b) else None
        if da is None or db is None:
            out.append(db if da is None else da)
            continue
        d = broadcast_dim(da, db)
        if d is None:
            raise StructInfoError(
                f"{op_name}: shapes {_fmt_shape(a)} and {_fmt_shape(b)} do not broadcast "
                f"(dimension -{i}: {da.value} vs {db.value})"
            )
        out.append(d)
    return tuple(reversed(out))


def broadcast_conditions(shape: Sequence[tir.PrimExpr], out: Sequence[tir.PrimExpr]
                         ) -> list[tuple[int, tir.PrimExpr]]:
    """What an operand of ``shape`` must satisfy at run time to broadcast to ``out`` (both
    right-aligned): ``(axis of the operand, condition)`` for each dim that is neither 1 nor
    provably the output's: it must be 1 or equal to it. Empty when everything is decided."""
    off = len(out) - len(shape)
    conds = []
    for k, d in enumerate(shape):
        o = out[off + k]
        if is_one(d) or dims_equal(d, o):
            continue
        conds.append((k, tir.logical_or(tir.eq(d, 1), tir.eq(d, o))))
    return conds


def broadcast_sinfo(
    a: TensorStructInfo, b: TensorStructInfo, dtype: Any = None, op_name: str = "broadcast"
) -> TensorStructInfo:
    """The result StructInfo of broadcasting ``a`` with ``b`` (dtype defaults to ``a``'s)."""
    dtype = a.dtype if dtype is None else dtype
    shape = broadcast_shapes(a.shape, b.shape, op_name)
    if shape is not None:
        return TensorStructInfo(shape, dtype)
    ndim = max(a.ndim, b.ndim) if a.ndim >= 0 and b.ndim >= 0 else -1
    return TensorStructInfo(None, dtype, ndim)


def normalize_axis(axis: int, ndim: int, op_name: str = "", what: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` made non-negative."""
    prefix = f"{op_name}: " if op_name else ""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise StructInfoError(f"{prefix}{what} must be an int, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise StructInfoError(f"{prefix}{what}={axis} is out of range for a {ndim}-d tensor")
    return axis + ndim if axis < 0 else axis


def normalize_axes(axes: Sequence[int], ndim: int, op_name: str = "", what: str = "axes"
                   ) -> tuple[int, ...]:
    """Several axes made non-negative; duplicates are an error."""
    out = tuple(normalize_axis(a, ndim, op_name, what) for a in axes)
    if len(set(out)) != len(out):
        prefix = f"{op_name}: " if op_name else ""
        raise StructInfoError(f"{prefix}{what} {tuple(axes)} repeat an axis")
    return out


def prod(shape: Sequence[Any]) -> tir.PrimExpr:
    """The product of dimensions as an int64 PrimExpr (constants folded)."""
    const = 1
    sym: tir.PrimExpr | None = None
    for d in shape:
        if isinstance(d, int):
            const *= d
        elif isinstance(d, tir.IntImm):
            const *= d.value
        else:
            sym = d if sym is None else sym * d
    if sym is None:
        return tir.IntImm("int64", const)
    return sym if const == 1 else sym * const
