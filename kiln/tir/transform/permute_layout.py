"""Lowering pass: permute one axis of a (compacted) buffer's layout, for every access alike.

A block writing a buffer may ask for its elements to be stored in another order along one axis
(a restricted ``transform_layout``): the annotation :data:`PERMUTE_LAYOUT`
``= (axis, radices, order)`` on it splits an index ``x`` of dimension ``axis`` (negative:
counted from the last) into mixed-radix digits ``d_0 .. d_n-1`` (``radices`` outermost first,
their product the axis' extent) and stores element ``x`` at the index whose digits are the same
ones taken in ``order`` (outermost first): ``(wy, 8, MI, 2)`` in order ``(0, 2, 3, 1)`` puts the
rows ``g * 2 MI + 2 m + h`` that the 8 lane groups of a warp give one ``mma`` (``g``) next to
each other. Every load and store of the buffer -- the copies that fill it, the tensorized
operands' ``kiln.address_of`` / ``kiln.elem_offset`` (so an intrinsic's row strides become the
permuted ones) -- is rewritten, so the program computes the same values whatever the layout:
only the addresses change. ``axis`` may also be a tuple of consecutive axes (``(-2, -1)``):
their index, flattened row-major (``x = i * extent_-1 + j``), is the one permuted and the
stored index is split back over them -- a layout that mixes rows and columns, such as the
wgmma route's panels of 8 columns (``[bk / 8][rows][8]``). Runs right after
``compact_buffers`` (the indices are the tile's own, ``[0, extent)``), on block TIR; the
buffer's regions in blocks become the whole axis.
"""

from __future__ import annotations

import math
from typing import Any

from ...ir.errors import LoweringError
from ..buffer import Buffer, BufferRegion
from ..expr import BufferLoad, PrimExpr, Range, Var, const, floordiv, floormod
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit
from ..schedule.analysis import as_int
from ..stmt import Block, BufferStore, Stmt

#: Block annotation: permute an axis of the buffer the block writes (module docstring).
PERMUTE_LAYOUT = "kiln.permute_layout"


def permuted_index(x: PrimExpr, radices: tuple[int, ...], order: tuple[int, ...]) -> PrimExpr:
    """The index where element ``x`` of a permuted axis is stored (module docstring)."""
    weights = [math.prod(radices[i + 1:]) for i in range(len(radices))]
    digits = [floormod(floordiv(x, const(x.dtype, w)), const(x.dtype, r))
              for w, r in zip(weights, radices)]
    out: PrimExpr = const(x.dtype, 0)
    for pos, d in enumerate(order):
        scale = math.prod(radices[o] for o in order[pos + 1:])
        out = out + digits[d] * const(x.dtype, scale)
    return out


def _int(v: Any, buf: Buffer) -> int:
    out = as_int(v) if isinstance(v, PrimExpr) else v
    if not isinstance(out, int):
        raise LoweringError(f"permute_layout of {buf.name!r}: {v!r} is not an integer")
    return out


Plan = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def _check(ask: Any, buf: Buffer) -> Plan:
    asked = tuple(ask[0]) if isinstance(ask[0], (tuple, list)) else (ask[0],)
    axes = tuple(_int(a, buf) for a in asked)
    radices = tuple(_int(r, buf) for r in ask[1])
    order = tuple(_int(o, buf) for o in ask[2])
    for axis in axes:
        if not buf.shape or not -len(buf.shape) <= axis < len(buf.shape):
            raise LoweringError(f"permute_layout: {buf.name!r} has no axis {axis}")
    axes = tuple(a % len(buf.shape) for a in axes)
    if list(axes) != list(range(axes[0], axes[0] + len(axes))):
        raise LoweringError(f"permute_layout of {buf.name!r}: axes {asked} are not "
                            "consecutive")
    extent = math.prod(as_int(buf.shape[a]) or 0 for a in axes)
    if sorted(order) != list(range(len(radices))) or any(r < 1 for r in radices):
        raise LoweringError(f"permute_layout of {buf.name!r}: order {order} is not a "
                            f"permutation of the {len(radices)} digits {radices}")
    if extent != math.prod(radices):
        raise LoweringError(f"permute_layout of {buf.name!r}: the digits {radices} do not "
                            f"make its axis {asked[0] if len(asked) == 1 else asked} of extent "
                            f"{extent}")
    return axes, radices, order


class _Permute(Mutator):
    def __init__(self, plans: dict[Var, Plan]):
        self.plans = plans

    def _indices(self, buf: Buffer, indices: tuple[PrimExpr, ...]) -> tuple[PrimExpr, ...]:
        axes, radices, order = self.plans[buf.data]
        out = list(indices)
        extents = [as_int(buf.shape[a]) or 1 for a in axes]
        flat = out[axes[0]]
        for a, e in zip(axes[1:], extents[1:]):
            flat = flat * const(flat.dtype, e) + out[a]
        stored = permuted_index(flat, radices, order)
        for pos, a in enumerate(axes):
            inner = math.prod(extents[pos + 1:])
            part = floordiv(stored, const(stored.dtype, inner)) if inner > 1 else stored
            out[a] = floormod(part, const(stored.dtype, extents[pos])) if pos else part
        return tuple(out)

    def visit_BufferLoad(self, n: BufferLoad) -> PrimExpr:
        n = self.generic_visit(n)
        if n.buffer.data not in self.plans:
            return n
        return BufferLoad(n.buffer, self._indices(n.buffer, n.indices))

    def visit_BufferStore(self, n: BufferStore) -> Stmt:
        n = self.generic_visit(n)
        if n.buffer.data not in self.plans:
            return n
        return BufferStore(n.buffer, n.value, self._indices(n.buffer, n.indices))

    def _regions(self, regions: tuple[BufferRegion, ...]) -> tuple[BufferRegion, ...]:
        out = []
        for r in regions:
            if r.buffer.data in self.plans:
                ranges = list(r.region)
                for axis in self.plans[r.buffer.data][0]:
                    ranges[axis] = Range(const("int64", 0), r.buffer.shape[axis])
                r = BufferRegion(r.buffer, tuple(ranges))
            out.append(r)
        return tuple(out)

    def visit_Block(self, n: Block) -> Stmt:
        n = self.generic_visit(n)
        return n.replace(reads=self._regions(n.reads), writes=self._regions(n.writes))


def permute_layouts(func: PrimFunc) -> PrimFunc:
    """Return ``func`` with the layouts :data:`PERMUTE_LAYOUT` asks for (module docstring)."""
    plans: dict[Var, Plan] = {}

    def visit(n: Any) -> None:
        if isinstance(n, Block) and PERMUTE_LAYOUT in n.annotations:
            if len(n.writes) != 1:
                raise LoweringError(f"permute_layout: block {n.name_hint!r} writes "
                                    f"{len(n.writes)} buffers, not one")
            buf = n.writes[0].buffer
            plan = _check(n.annotations[PERMUTE_LAYOUT], buf)
            if plans.get(buf.data, plan) != plan:
                raise LoweringError(f"permute_layout: {buf.name!r} is asked two layouts")
            plans[buf.data] = plan

    post_order_visit(func.body, visit, exprs=False)
    if not plans:
        return func
    return func.with_body(_Permute(plans).visit(func.body))
