"""Buffer: a multi-dimensional view of memory, the thing TIR loads from and stores to."""

from __future__ import annotations

from dataclasses import field
from typing import Any

from ..ir.dtype import DataType, as_dtype
from ..ir.node import Node, node, set_field
from .expr import BufferLoad, PrimExpr, Range, Var, convert


@node
class Buffer(Node):
    """A typed, shaped region of memory backed by the pointer variable ``data``.

    ``strides`` empty means compact row-major. ``scope`` is "global" (function arguments and
    heap storage) or "local" (a kernel-private temporary). Buffers are compared like variables:
    two buffers pair up when their shape, dtype, strides, offset and scope agree.
    """

    name: str
    shape: tuple[PrimExpr, ...]
    dtype: DataType = field(default_factory=lambda: DataType("float32"))
    data: Var | None = None
    strides: tuple[PrimExpr, ...] = ()
    elem_offset: PrimExpr | None = None
    scope: str = "global"

    _is_var = True
    _type_fields = ("shape", "dtype", "strides", "elem_offset", "scope")

    def __post_init__(self):
        set_field(self, "dtype", as_dtype(self.dtype))
        set_field(self, "shape", tuple(convert(s) for s in self.shape))
        set_field(self, "strides", tuple(convert(s) for s in self.strides))
        if self.elem_offset is not None:
            set_field(self, "elem_offset", convert(self.elem_offset))
        if self.data is None:
            set_field(self, "data", Var(self.name, DataType("handle")))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, indices: Any) -> BufferLoad:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return BufferLoad(self, tuple(convert(i) for i in indices))

    def load(self, indices: Any) -> BufferLoad:
        return self[tuple(indices) if isinstance(indices, (list, tuple)) else indices]

    def full_region(self) -> BufferRegion:
        return BufferRegion(self, tuple(Range(0, s) for s in self.shape))


def decl_buffer(shape: Any, dtype: Any = "float32", name: str = "buf", scope: str = "global",
                strides: Any = ()) -> Buffer:
    """Declare a new buffer (TVM's ``tir.decl_buffer``)."""
    if not isinstance(shape, (list, tuple)):
        shape = (shape,)
    return Buffer(name, tuple(shape), as_dtype(dtype), None, tuple(strides), None, scope)


@node
class BufferRegion(Node):
    """The part of a buffer a block reads or writes: one Range per dimension."""

    buffer: Buffer
    region: tuple[Range, ...]

    def __post_init__(self):
        set_field(self, "region", tuple(self.region))

    @staticmethod
    def full(buffer: Buffer) -> BufferRegion:
        return buffer.full_region()
