"""Building tensor expressions: ``compute``, ``reduce_axis`` and the reducers.

A compute body is an ordinary TIR expression over the output axis variables (int64 vars, one
per output dimension). A reduction (``te.sum/max/min`` or a ``comm_reducer``) builds a
``tir.Reduce``; it may only be the whole body, because the block form made by
``create_prim_func`` turns it into an init store plus an accumulate store of the output element.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

from ..ir.dtype import DataType
from ..ir.errors import DTypeError, KilnError
from ..ir.node import Node
from ..tir import expr as _e
from ..tir.buffer import Buffer
from ..tir.expr import (
    BufferLoad,
    CommReducer,
    IterType,
    IterVar,
    PrimExpr,
    Range,
    Reduce,
    Var,
    cast,
    const,
)
from ..tir.functor import post_order_visit
from .tensor import INDEX_DTYPE, ComputeOp, Tensor, as_expr, normalize_shape, tensor_of_buffer

# Vars made by reduce_axis: a body that uses one outside a reduction over it is an error.
_REDUCE_VARS: weakref.WeakSet[Var] = weakref.WeakSet()


# ---------------------------------------------------------------------------------------------
# axes
# ---------------------------------------------------------------------------------------------
def _bound(value: Any, what: str) -> PrimExpr:
    if isinstance(value, IterVar):
        value = value.var
    if isinstance(value, bool) or not isinstance(value, (int, PrimExpr)):
        raise KilnError(f"{what}: bound {value!r} is not an int or integer PrimExpr")
    if isinstance(value, int):
        return const(INDEX_DTYPE, value)
    if not value.dtype.is_integer or value.dtype.lanes != 1:
        raise KilnError(f"{what}: bound {value} has dtype {value.dtype}, expected an integer")
    if isinstance(value, _e.IntImm):
        return const(INDEX_DTYPE, value.value)
    return value if value.dtype == INDEX_DTYPE else cast(INDEX_DTYPE, value)


def reduce_axis(dom: Any, name: str = "rv") -> IterVar:
    """A reduction axis over ``dom``: ``(begin, end)`` or a ``tir.Range``; its var is int64."""
    what = f"reduce_axis {name!r}"
    if isinstance(dom, Range):
        lo, extent = _bound(dom.min, what), _bound(dom.extent, what)
    elif isinstance(dom, (list, tuple)) and len(dom) == 2:
        lo, hi = _bound(dom[0], what), _bound(dom[1], what)
        extent = hi - lo
        if isinstance(lo, _e.IntImm) and isinstance(hi, _e.IntImm):
            extent = const(INDEX_DTYPE, hi.value - lo.value)
            if extent.value < 0:
                raise KilnError(f"{what}: empty domain ({lo.value}, {hi.value})")
        elif isinstance(lo, _e.IntImm) and lo.value == 0:
            extent = hi
    else:
        raise KilnError(f"{what}: dom must be (begin, end) or a Range, got {dom!r}")
    v = Var(name, INDEX_DTYPE)
    _REDUCE_VARS.add(v)
    return IterVar(Range(lo, extent), v, IterType.COMM_REDUCE)


def _axis_names(fcompute: Callable[..., Any], ndim: int, name: str) -> list[str]:
    """Names of the output axis vars: fcompute's parameter names, or i0, i1... for *args."""
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):
        return [f"i{d}" for d in range(ndim)]
    positional = [
        p for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        if len(positional) > ndim:
            raise KilnError(
                f"compute {name!r}: fcompute takes at least {len(positional)} arguments but the "
                f"shape has {ndim} dimension(s)"
            )
        return [p.name for p in positional] + [f"i{d}" for d in range(len(positional), ndim)]
    optional = [
        p for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is not p.empty
    ]
    if not len(positional) <= ndim <= len(positional) + len(optional):
        raise KilnError(
            f"compute {name!r}: fcompute takes {len(positional)} argument(s) but the shape has "
            f"{ndim} dimension(s)"
        )
    return [p.name for p in (positional + optional)[:ndim]]


# ---------------------------------------------------------------------------------------------
# compute
# ---------------------------------------------------------------------------------------------
def compute(
    shape: Any,
    fcompute: Callable[..., Any],
    name: str = "compute",
    tag: str = "",
    attrs: dict[str, Any] | None = None,
) -> Tensor:
    """The tensor ``out[i...] = fcompute(i...)`` over ``shape``.

    ``fcompute`` receives one int64 loop variable per output dimension and returns a single
    expression (a multi-output operator is several computes). A reduction (``te.sum`` ...) may
    only be the whole body.
    """
    if not callable(fcompute):
        raise KilnError(f"compute {name!r}: fcompute must be callable, got {fcompute!r}")
    dims = normalize_shape(shape, f"compute {name!r}")
    names = _axis_names(fcompute, len(dims), name)
    axis = tuple(
        IterVar(Range(const(INDEX_DTYPE, 0), d), Var(n, INDEX_DTYPE), IterType.DATA_PAR)
        for n, d in zip(names, dims)
    )
    result = fcompute(*[iv.var for iv in axis])
    if isinstance(result, (list, tuple)):
        raise KilnError(
            f"compute {name!r}: fcompute returned {len(result)} values; a compute has one "
            "output (make one compute per output)"
        )
    try:
        body = as_expr(result)
    except KilnError as err:
        raise KilnError(f"compute {name!r}: {err}") from err
    if body.dtype.lanes != 1 or body.dtype.is_handle:
        raise DTypeError(f"compute {name!r}: body has dtype {body.dtype}, expected a scalar")
    reduce_axes = _check_body(body, name)
    inputs = _input_tensors(body, name)
    op = ComputeOp(name, tag, dict(attrs or {}), axis, reduce_axes, body, inputs, body.dtype)
    return Tensor(op, Buffer(name, dims, body.dtype))


def _check_body(body: PrimExpr, name: str) -> tuple[IterVar, ...]:
    """Reject nested reductions and stray reduce axes; return the reduce axes of the body."""
    top = body if isinstance(body, Reduce) else None
    parts: list[Any] = (
        [top.source, top.condition, top.combiner.identity] if top is not None else [body]
    )
    for part in parts:
        if part is None:
            continue

        def no_reduce(n: Node) -> None:
            if isinstance(n, Reduce):
                raise KilnError(
                    f"compute {name!r}: a reduction (te.sum/max/min/comm_reducer) must be the "
                    "whole body of a compute, not part of an expression; compute it as its own "
                    "tensor first"
                )

        post_order_visit(part, no_reduce)
    reduced = {id(iv.var) for iv in top.axis} if top is not None else set()
    for part in parts:
        if part is None:
            continue

        def stray(n: Node) -> None:
            if isinstance(n, Var) and n in _REDUCE_VARS and id(n) not in reduced:
                raise KilnError(
                    f"compute {name!r}: reduce axis {n.name!r} is used outside a reduction over "
                    "it (pass it in axis=...)"
                )

        post_order_visit(part, stray)
    return tuple(top.axis) if top is not None else ()


def _input_tensors(body: PrimExpr, name: str) -> tuple[Tensor, ...]:
    found: dict[int, Tensor] = {}

    def f(n: Node) -> None:
        if isinstance(n, BufferLoad) and id(n.buffer) not in found:
            t = tensor_of_buffer(n.buffer)
            if t is None:
                raise KilnError(
                    f"compute {name!r}: the body loads buffer {n.buffer.name!r}, which is not a "
                    "te tensor (use te.placeholder for inputs)"
                )
            found[id(n.buffer)] = t

    post_order_visit(body, f)
    return tuple(found.values())


# ---------------------------------------------------------------------------------------------
# reductions
# ---------------------------------------------------------------------------------------------
def _axes(axis: Any, who: str) -> tuple[IterVar, ...]:
    axes = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    seen: set[int] = set()
    for a in axes:
        if not isinstance(a, IterVar) or a.iter_type != IterType.COMM_REDUCE:
            raise KilnError(f"{who}: axis {a!r} is not a reduce axis (make it with te.reduce_axis)")
        if id(a) in seen:
            raise KilnError(f"{who}: reduce axis {a.var.name!r} given twice")
        seen.add(id(a))
    return axes


def _typed(value: Any, dtype: DataType) -> PrimExpr:
    if isinstance(value, (bool, int, float)):
        return const(dtype, value)
    value = as_expr(value)
    return value if value.dtype == dtype else cast(dtype, value)


def _make_reducer(
    fcombine: Callable[[PrimExpr, PrimExpr], Any], fidentity: Callable[[DataType], Any], name: str
) -> Callable[..., PrimExpr]:
    def reducer(
        expr: Any, axis: Any, where: Any = None, init: Any = None
    ) -> PrimExpr:
        source = as_expr(expr)
        dtype = source.dtype
        axes = _axes(axis, f"te.{name}")
        lhs, rhs = Var("x", dtype), Var("y", dtype)
        combined = fcombine(lhs, rhs)
        if isinstance(combined, (int, float)):
            result = _typed(combined, dtype)
        else:
            result = as_expr(combined)
        if result.dtype != dtype:
            raise DTypeError(f"te.{name}: combiner gives {result.dtype}, expected {dtype}")
        start = fidentity(dtype) if init is None else init
        identity = _typed(start, dtype)
        condition = None
        if where is not None:
            _no_python_bool(where, f"te.{name}: where=")
            condition = as_expr(where)
            if not condition.dtype.is_bool:
                raise DTypeError(f"te.{name}: where= must be a bool expression, got {condition}")
        return Reduce(CommReducer(lhs, rhs, result, identity), source, axes, condition)

    reducer.__name__ = name
    reducer.__doc__ = (
        f"Reduce ``expr`` over ``axis`` (one reduce axis or a list) with the {name} reducer. "
        "``where`` restricts the reduction to points where it holds; ``init`` is the starting "
        "value of the accumulator (the reducer's identity by default)."
    )
    return reducer


def comm_reducer(
    fcombine: Callable[[PrimExpr, PrimExpr], Any],
    fidentity: Callable[[DataType], Any],
    name: str = "reduce",
) -> Callable[..., PrimExpr]:
    """A commutative reducer like ``te.sum``: ``fcombine(x, y)`` and ``fidentity(dtype)``."""
    return _make_reducer(fcombine, fidentity, name)


sum = comm_reducer(lambda x, y: x + y, lambda t: 0, name="sum")  # noqa: A001
max = comm_reducer(  # noqa: A001
    lambda x, y: _e.max(x, y), lambda t: const(t, t.min_value()), name="max"
)
min = comm_reducer(  # noqa: A001
    lambda x, y: _e.min(x, y), lambda t: const(t, t.max_value()), name="min"
)


def _no_python_bool(value: Any, what: str) -> None:
    """``i == 0`` on PrimExprs is identity (a Python bool), a classic slip: say so."""
    if isinstance(value, bool):
        raise KilnError(
            f"{what} is the Python bool {value}; '==' / '!=' on expressions compare identity, "
            "build the test with tir.eq(a, b) / tir.ne(a, b)"
        )


def if_then_else(cond: Any, true_value: Any, false_value: Any) -> PrimExpr:
    """``true_value`` where ``cond`` holds, else ``false_value`` (a ``tir.Select``)."""
    _no_python_bool(cond, "te.if_then_else: the condition")
    c = as_expr(cond)
    if not c.dtype.is_bool:
        raise DTypeError(f"te.if_then_else: condition {c} has dtype {c.dtype}, expected bool")
    a, b = true_value, false_value
    a = a if isinstance(a, (bool, int, float)) else as_expr(a)
    b = b if isinstance(b, (bool, int, float)) else as_expr(b)
    return _e.select(c, a, b)


__all__ = [
    "comm_reducer", "compute", "if_then_else", "max", "min", "reduce_axis", "sum",
]

