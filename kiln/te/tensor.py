"""Tensors and the operations that produce them.

A :class:`Tensor` is the output of an :class:`Operation`: a :class:`PlaceholderOp` (a function
input) or a :class:`ComputeOp` (one scalar expression per output element). Each tensor owns a
``tir.Buffer``, so indexing a tensor (``A[i, j]`` or ``A(i, j)``) builds a ``tir.BufferLoad``
directly and compute bodies are ordinary TIR expressions. The tensor behind a buffer is found
again through a weak registry (``tensor_of_buffer``) when a compute body is analysed.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import field
from typing import Any

from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError
from ..ir.node import Node, node
from ..tir.buffer import Buffer
from ..tir.expr import (
    BufferLoad,
    IntImm,
    IterVar,
    PrimExpr,
    SizeVar,
    Var,
    cast,
    const,
    convert,
)

INDEX_DTYPE = DataType("int64")

# id(buffer) -> the Tensor owning it. Weak values: an entry dies with its tensor, and while the
# tensor lives it keeps its buffer alive, so the id cannot be reused by another buffer.
_TENSOR_OF_BUFFER: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()


class Operation(Node):
    """Base of the operations that produce tensors."""

    name: str

    @property
    def input_tensors(self) -> tuple[Tensor, ...]:
        return ()


@node
class PlaceholderOp(Operation):
    """An input of the computation: a tensor whose values come from outside."""

    name: str
    shape: tuple[PrimExpr, ...]
    dtype: DataType


@node
class ComputeOp(Operation):
    """``output[axis] = body`` for every point of the output domain.

    ``axis`` are the spatial IterVars (one per output dimension, int64 vars over
    ``[0, dim)``); ``reduce_axis`` the IterVars of the top-level ``tir.Reduce`` of ``body`` (empty
    for element-wise computes). ``inputs`` are the tensors the body reads, in first-use order.
    """

    name: str
    tag: str
    attrs: dict[str, Any]
    axis: tuple[IterVar, ...]
    reduce_axis: tuple[IterVar, ...]
    body: PrimExpr
    inputs: tuple[Tensor, ...]
    dtype: DataType

    @property
    def input_tensors(self) -> tuple[Tensor, ...]:
        return self.inputs

    @property
    def shape(self) -> tuple[PrimExpr, ...]:
        return tuple(iv.dom.extent for iv in self.axis)


@node
class Tensor(Node):
    """The output of an operation, backed by ``buffer`` (name, shape and dtype live there)."""

    op: Operation
    buffer: Buffer
    value_index: int = field(default=0)

    def __post_init__(self):
        _TENSOR_OF_BUFFER[id(self.buffer)] = self

    # ---- description ----------------------------------------------------------------------
    @property
    def shape(self) -> tuple[PrimExpr, ...]:
        return self.buffer.shape

    @property
    def dtype(self) -> DataType:
        return self.buffer.dtype

    @property
    def name(self) -> str:
        return self.buffer.name

    @property
    def ndim(self) -> int:
        return len(self.buffer.shape)

    # ---- indexing -------------------------------------------------------------------------
    def __getitem__(self, indices: Any) -> BufferLoad:
        if isinstance(indices, list):
            indices = tuple(indices)
        elif not isinstance(indices, tuple):
            indices = (indices,)
        return self._load(indices)

    def __call__(self, *indices: Any) -> BufferLoad:
        if len(indices) == 1 and isinstance(indices[0], (list, tuple)):
            indices = tuple(indices[0])
        return self._load(indices)

    def _load(self, indices: Sequence[Any]) -> BufferLoad:
        if len(indices) != self.ndim:
            raise KilnError(
                f"tensor {self.name!r} has {self.ndim} dimension(s) but was indexed with "
                f"{len(indices)} index(es)"
            )
        return BufferLoad(self.buffer, tuple(_index(i, self.name) for i in indices))

    def __bool__(self) -> bool:
        return True

    def __iter__(self):
        raise KilnError(f"tensor {self.name!r} is not iterable; index it with A[i, j]")


def _index(value: Any, tensor_name: str) -> PrimExpr:
    """An index expression; python ints become int64 immediates (te index arithmetic is int64)."""
    if isinstance(value, bool) or not isinstance(value, (int, PrimExpr)):
        if isinstance(value, IterVar):
            return value.var
        if hasattr(value, "__index__") and not isinstance(value, bool):
            value = int(value)
        else:
            raise KilnError(
                f"index {value!r} of tensor {tensor_name!r} is not an integer expression"
            )
    if isinstance(value, int):
        return const(INDEX_DTYPE, value)
    if not value.dtype.element.is_integer:
        raise KilnError(
            f"index {value} of tensor {tensor_name!r} has dtype {value.dtype}; indices must be "
            "integers"
        )
    return value


def tensor_of_buffer(buffer: Buffer) -> Tensor | None:
    """The te Tensor that owns ``buffer`` (None for buffers not made by te)."""
    t = _TENSOR_OF_BUFFER.get(id(buffer))
    return t if t is not None and t.buffer is buffer else None


def normalize_shape(shape: Any, what: str) -> tuple[PrimExpr, ...]:
    """Shape entries as int64 PrimExprs (python ints -> IntImm, integer exprs widened)."""
    if isinstance(shape, (int, PrimExpr)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (list, tuple)):
        raise KilnError(f"{what}: shape must be a tuple of ints or PrimExprs, got {shape!r}")
    dims: list[PrimExpr] = []
    for d in shape:
        if isinstance(d, IterVar):
            d = d.var
        if isinstance(d, bool) or not isinstance(d, (int, PrimExpr)):
            if hasattr(d, "__index__"):
                d = int(d)
            else:
                raise KilnError(f"{what}: shape entry {d!r} is not an int or PrimExpr")
        if isinstance(d, int):
            if d < 0:
                raise KilnError(f"{what}: negative dimension {d} in shape {tuple(shape)}")
            dims.append(const(INDEX_DTYPE, d))
            continue
        if not d.dtype.is_integer or d.dtype.lanes != 1:
            raise KilnError(f"{what}: shape entry {d} has dtype {d.dtype}, expected an integer")
        if isinstance(d, IntImm):
            if d.value < 0:
                raise KilnError(f"{what}: negative dimension {d.value}")
            dims.append(const(INDEX_DTYPE, d.value))
        else:
            dims.append(d if d.dtype == INDEX_DTYPE else cast(INDEX_DTYPE, d))
    return tuple(dims)


def var(name: str = "v", dtype: Any = "int64") -> Var:
    """A scalar variable (e.g. a symbolic dimension ``n = te.var("n")``)."""
    return Var(name, as_dtype(dtype))


def size_var(name: str = "n", dtype: Any = "int64") -> SizeVar:
    """A variable known to be non-negative: the usual kind for a symbolic dimension."""
    return SizeVar(name, as_dtype(dtype))


def placeholder(shape: Any, dtype: Any = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor of the given shape (ints or int PrimExprs) and dtype."""
    dims = normalize_shape(shape, f"placeholder {name!r}")
    try:
        dt = as_dtype(dtype)
    except (DTypeError, ValueError, TypeError) as err:
        raise DTypeError(f"placeholder {name!r}: bad dtype {dtype!r}: {err}") from err
    if dt.is_handle:
        raise DTypeError(f"placeholder {name!r}: a tensor cannot have dtype {dt}")
    op = PlaceholderOp(name, dims, dt)
    return Tensor(op, Buffer(name, dims, dt))


def as_expr(value: Any) -> PrimExpr:
    """Convert what a compute body may contain (IterVar, number, expr) into a PrimExpr."""
    if isinstance(value, IterVar):
        return value.var
    if isinstance(value, Tensor):
        if value.ndim == 0:
            return value()
        raise KilnError(
            f"tensor {value.name!r} was used as a value; index it (e.g. {value.name}[i, j])"
        )
    return convert(value)
