"""Lowering pass: turn every multi-dimensional buffer access into a 1-D one.

C sees a buffer as a pointer, so ``A[i, j]`` must become ``A[i * 8 + j]``. Each buffer is
replaced by a flat buffer sharing its ``data`` variable (so parameters keep their identity) and
each index tuple by the row-major offset computed from the buffer's shape -- or, when the buffer
declares ``strides``, by ``sum(index_k * stride_k)`` -- plus ``elem_offset``.

The PrimFunc's ``buffer_map`` keeps the original N-D buffers: they describe the arguments the
generated entry checks. Only the body refers to the flat buffers.
"""

from __future__ import annotations

from ...ir.errors import LoweringError
from ..buffer import Buffer
from ..expr import Broadcast, BufferLoad, IntImm, PrimExpr, Ramp, add, const, mul
from ..function import PrimFunc
from ..functor import Mutator
from ..stmt import Allocate, BufferStore, Stmt


def _vadd(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Addition that keeps Ramp indices as Ramps (vector indices written by hand)."""
    if isinstance(a, Ramp) and b.dtype.lanes == 1:
        return Ramp(add(a.base, b), a.stride, a.lanes)
    if isinstance(b, Ramp) and a.dtype.lanes == 1:
        return Ramp(add(a, b.base), b.stride, b.lanes)
    return add(a, b)


def _vmul(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Multiplication by a scalar that keeps Ramp indices as Ramps."""
    if isinstance(a, Ramp) and b.dtype.lanes == 1:
        return Ramp(mul(a.base, b), mul(a.stride, b), a.lanes)
    if a.dtype.lanes > 1 and b.dtype.lanes == 1:
        b = Broadcast(b, a.dtype.lanes)
    return mul(a, b)


def _is_one(e: PrimExpr) -> bool:
    return isinstance(e, IntImm) and e.value == 1


def _is_zero(e: PrimExpr | None) -> bool:
    return e is None or (isinstance(e, IntImm) and e.value == 0)


def flat_index(buffer: Buffer, indices: tuple[PrimExpr, ...]) -> PrimExpr:
    """The element offset of ``buffer[indices]`` from the buffer's data pointer."""
    if len(indices) != len(buffer.shape):
        raise LoweringError(
            f"buffer {buffer.name!r} has {len(buffer.shape)} dimensions but is indexed with "
            f"{len(indices)} indices"
        )
    if not indices:
        offset: PrimExpr = const("int64", 0)
    elif buffer.strides:
        offset = None  # type: ignore[assignment]
        for idx, stride in zip(indices, buffer.strides):
            term = idx if _is_one(stride) else _vmul(idx, stride)
            offset = term if offset is None else _vadd(offset, term)
    else:
        offset = indices[0]
        for idx, extent in zip(indices[1:], buffer.shape[1:]):
            offset = _vadd(_vmul(offset, extent), idx)
    if not _is_zero(buffer.elem_offset):
        offset = _vadd(offset, buffer.elem_offset)  # type: ignore[arg-type]
    return offset


def flat_size(buffer: Buffer) -> PrimExpr:
    """Number of elements the flat view of ``buffer`` spans."""
    dims = buffer.shape
    if buffer.strides and all(isinstance(x, IntImm) for x in (*dims, *buffer.strides)):
        # constant (padded rows, kiln.tir.transform.compact_buffers.STORAGE_ALIGN)
        size = IntImm("int64", 1 + sum((d.value - 1) * s.value  # type: ignore[attr-defined]
                                       for d, s in zip(dims, buffer.strides)))
    elif buffer.strides:
        # last reachable element + 1
        size: PrimExpr = const("int64", 1)
        for extent, stride in zip(dims, buffer.strides):
            size = add(size, mul(add(extent, const(extent.dtype, -1)), stride))
    else:
        if all(isinstance(d, IntImm) for d in dims):
            total = 1
            for d in dims:
                total *= d.value  # type: ignore[attr-defined]
            size = IntImm("int64", total)
        else:
            size = dims[0] if dims else const("int64", 1)
            for d in dims[1:]:
                size = mul(size, d)
    if not _is_zero(buffer.elem_offset):
        size = add(size, buffer.elem_offset)
    return size


class _Flatten(Mutator):
    def __init__(self) -> None:
        self.flat: dict[Buffer, Buffer] = {}

    def flat_buffer(self, buf: Buffer) -> Buffer:
        fb = self.flat.get(buf)
        if fb is None:
            if len(buf.shape) == 1 and not buf.strides and _is_zero(buf.elem_offset):
                fb = buf
            else:
                fb = Buffer(buf.name, (flat_size(buf),), buf.dtype, buf.data, (), None,
                            buf.scope)
            self.flat[buf] = fb
            self.flat[fb] = fb
        return fb

    def visit_BufferLoad(self, load: BufferLoad) -> PrimExpr:
        indices = tuple(self.visit(i) for i in load.indices)
        fb = self.flat_buffer(load.buffer)
        if fb is load.buffer and all(a is b for a, b in zip(indices, load.indices)):
            return load
        return BufferLoad(fb, (flat_index(load.buffer, indices),))

    def visit_BufferStore(self, store: BufferStore) -> Stmt:
        indices = tuple(self.visit(i) for i in store.indices)
        value = self.visit(store.value)
        fb = self.flat_buffer(store.buffer)
        if (fb is store.buffer and value is store.value
                and all(a is b for a, b in zip(indices, store.indices))):
            return store
        return BufferStore(fb, value, (flat_index(store.buffer, indices),))

    def visit_Allocate(self, alloc: Allocate) -> Stmt:
        fb = self.flat_buffer(alloc.buffer)
        body = self.visit(alloc.body)
        if fb is alloc.buffer and body is alloc.body:
            return alloc
        return Allocate(fb, body)


def flatten_buffers(func: PrimFunc) -> PrimFunc:
    """Return ``func`` whose body only uses 1-D buffers (``buffer_map`` is kept as is)."""
    body = _Flatten().visit(func.body)
    return func if body is func.body else func.with_body(body)
