"""Lowering pass: allocate each scheduled intermediate where it is used, only as large as used.

``cache_read``/``cache_write`` create their buffers at the root block with the full shape of the
buffer they stage, and ``compute_at``/``reverse_compute_at`` then move the copy next to the loop
that consumes it. Left like that, a register tile ``C_local`` of a matmul would be a full
``M x N`` array and a packed panel of ``B`` a full copy of ``B``. This pass (TVM's
PlanAndUpdateBufferAllocationLocation + CompactBufferAllocation in one) does, for every buffer
the root block allocates:

1. find the lowest loop holding every block that reads or writes it;
2. compute the region those blocks touch during one iteration of that loop (the loops inside
   relaxed over their ranges, the loop itself and the ones outside fixed), with the same
   symbolic interval analysis that ``compute_at`` uses;
3. when that region has a constant extent in every dimension, replace the buffer by one of
   that shape, allocated inside the loop's body, and shift every access by the region's start.

An allocation inside a loop is private to each iteration -- and so to each thread of a parallel
loop -- and a small ``local`` one becomes a stack array that the C compiler keeps in registers.
A ``shared`` buffer (GPU shared memory) belongs to a block of threads: it is allocated above
the outermost ``threadIdx`` loop around its users, and its region covers what all the threads
of the block touch.
Buffers used by top-level stages, regions whose extent depends on a loop variable, and blocks
that touch a buffer without declaring it in their regions are left as they are.

A block writing a buffer may ask for padded rows (TVM's ``storage_align``): the annotation
:data:`STORAGE_ALIGN` ``= (axis, factor, offset)`` on it makes the compacted buffer's stride of
dimension ``axis`` (negative: counted from the last, so ``-2`` is a tile's rows whatever batch
dimensions lead) the smallest one at least the dense stride with ``stride % factor ==
offset`` -- shared-memory tiles whose rows would otherwise fall on the same memory banks.
"""

from __future__ import annotations

from typing import Any

from ...ir.errors import ScheduleError
from ..buffer import Buffer, BufferRegion
from ..expr import BufferLoad, IntImm, PrimExpr, Range, Var, sub
from ..function import PrimFunc
from ..functor import Mutator, Visitor, collect_vars, post_order_visit, substitute
from ..gpu import is_thread_tag
from ..schedule.analysis import analyzer_at, union_bound
from ..schedule.compute_location import accessed_region
from ..schedule.state import SRef, TreeIndex, update_root_allocs
from ..stmt import THREAD_TAG, Allocate, Block, BlockRealize, BufferStore, For, ForKind

#: Block annotation: pad the rows of the buffer the block writes (see the module docstring).
STORAGE_ALIGN = "kiln.storage_align"


def _aligned_strides(func: PrimFunc, buf: Buffer, extents: list[int]) -> tuple[IntImm, ...]:
    """The strides :data:`STORAGE_ALIGN` asks for ``buf`` (compacted to ``extents``); () when no
    block writing it asks."""
    asks: list[tuple[int, int, int]] = []

    def visit(n: Any) -> None:
        if isinstance(n, Block) and STORAGE_ALIGN in n.annotations and _touches(n.writes, buf):
            axis, factor, offset = (int(v) for v in n.annotations[STORAGE_ALIGN])
            asks.append((axis, factor, offset))

    post_order_visit(func.body, visit)
    if not asks:
        return ()
    strides = [1] * len(extents)
    for d in range(len(extents) - 2, -1, -1):
        stride = strides[d + 1] * extents[d + 1]
        for axis, factor, offset in asks:
            if axis % len(extents) == d and factor > 0:
                stride += (offset - stride) % factor
        strides[d] = stride
    return tuple(IntImm("int64", v) for v in strides)


def _touches(regions: tuple[BufferRegion, ...], buf: Buffer) -> bool:
    return any(r.buffer is buf for r in regions)


class _Touches(Visitor):
    """Finds a load/store of ``buf`` in a block's own statements (not in nested blocks)."""

    def __init__(self, buf: Buffer):
        self.buf, self.found = buf, False

    def visit_BufferLoad(self, n: BufferLoad) -> None:
        self.found |= n.buffer is self.buf
        self.generic_visit(n)

    def visit_BufferStore(self, n: BufferStore) -> None:
        self.found |= n.buffer is self.buf
        self.generic_visit(n)

    def visit_BlockRealize(self, n: BlockRealize) -> None:
        return


def _body_touches(block: Block, buf: Buffer) -> bool:
    finder = _Touches(buf)
    finder.visit(block.body)
    finder.visit(block.init)
    return finder.found


def _above_thread_loops(index: TreeIndex, sref: SRef) -> SRef:
    """``sref``, or the parent of the outermost ``threadIdx`` loop at or above it: where memory
    shared by the threads of a block is allocated."""
    chain = [*index.ancestors(sref), sref]
    for k, s in enumerate(chain):
        if not s.is_block and s.loop.kind == ForKind.THREAD_BINDING and is_thread_tag(
                str(s.loop.annotations.get(THREAD_TAG))):
            return chain[k - 1] if k > 0 else index.root
    return sref


def _in_scope_vars(index: TreeIndex, lca: SRef) -> set[Var]:
    """Loop variables bound at the body of ``lca`` (its own and those of the loops above)."""
    out = {s.loop.loop_var for s in index.ancestors(lca) if not s.is_block}
    out.add(lca.loop.loop_var)
    return out


def _plan(index: TreeIndex, buf: Buffer) -> tuple[SRef, list[PrimExpr], list[int]] | None:
    """The loop to allocate ``buf`` in, the start and extent of the region used there."""
    readers, writers = [], []
    for b in index.block_list:
        blk = b.block
        reads, writes = _touches(blk.reads, buf), _touches(blk.writes, buf)
        if reads:
            readers.append(b)
        if writes:
            writers.append(b)
        if not (reads or writes) and _body_touches(blk, buf):
            return None  # an access the regions do not declare: cannot reason about it
    users = readers + [w for w in writers if w not in readers]
    if not users:
        return None
    lca = index.lowest_common_ancestor(users)
    place = _above_thread_loops(index, lca) if buf.scope == "shared" else lca
    if lca.is_block or place.is_block:
        return None
    ana = analyzer_at(index, lca)
    try:
        bounds = None
        for blocks, writes in ((readers, False), (writers, True)):
            if not blocks:
                continue
            part = accessed_region(index, lca, blocks, buf, writes, ana, "compact_buffers")
            bounds = part if bounds is None else [
                union_bound(a, b, ana) for a, b in zip(bounds, part)
            ]
    except ScheduleError:  # a region beyond the analysis: keep the buffer as it is
        return None
    assert bounds is not None
    if place is not lca:
        relaxed = _relax_thread_vars(index, lca, bounds, ana)
        if relaxed is None:
            return None
        bounds = relaxed
    allowed = _in_scope_vars(index, lca)
    loop_vars = set(index.loops)
    starts, extents = [], []
    for (lo, hi), dim in zip(bounds, buf.shape):
        ext = ana.simplify(hi - lo + 1)
        if not isinstance(ext, IntImm) or ext.value <= 0:
            return None
        if any(v in loop_vars and v not in allowed for v in collect_vars(lo)):
            return None
        if isinstance(dim, IntImm) and ext.value > dim.value and isinstance(lo, IntImm) \
                and 0 <= lo.value < dim.value:
            # a predicated tail tile reaches past the buffer; its accesses there are guarded
            # off, so the region is clipped to the buffer where it starts at a constant (else
            # the tile's extent stays: larger than the buffer, and every access within it)
            ext = IntImm(ext.dtype, dim.value - lo.value)
        starts.append(lo)
        extents.append(ext.value)
    if all(isinstance(d, IntImm) and d.value == e for d, e in zip(buf.shape, extents)):
        starts = [IntImm(s.dtype, 0) for s in starts]  # whole buffer: only move it
    return place, starts, extents


def _relax_thread_vars(index: TreeIndex, lca: SRef, bounds: list[tuple[PrimExpr, PrimExpr]],
                       ana: Any) -> list[tuple[PrimExpr, PrimExpr]] | None:
    """``bounds`` (the region one thread touches in one iteration of ``lca``) widened to what
    every thread of the block touches: each ``threadIdx`` variable above ``lca`` replaced by
    its first value in the start and its last in the end. The region of a shared tile staged
    once per step of a serial loop under the thread loops (a GEMM's reduction step) is then
    that step's tile, not the whole loop's. None unless each bound grows with each thread
    variable (provably), where the first and last threads bound the region."""
    threads = [s.loop for s in [*index.ancestors(lca), lca] if not s.is_block
               and s.loop.kind == ForKind.THREAD_BINDING
               and is_thread_tag(str(s.loop.annotations.get(THREAD_TAG)))]
    out = []
    for lo, hi in bounds:
        for loop in threads:
            v = loop.loop_var
            if v not in collect_vars(lo) and v not in collect_vars(hi):
                continue
            step = {v: v + 1}
            if not (ana.can_prove(substitute(lo, step) - lo >= 0)
                    and ana.can_prove(substitute(hi, step) - hi >= 0)):
                return None
            lo = ana.simplify(substitute(lo, {v: loop.min}))
            hi = ana.simplify(substitute(hi, {v: loop.min + loop.extent - 1}))
        out.append((lo, hi))
    return out


class _Compact(Mutator):
    """Swap ``old`` for ``new`` with indices shifted by ``starts``; allocate it in ``loop``."""

    def __init__(self, old: Buffer, new: Buffer, starts: list[PrimExpr], loop: For):
        self.old, self.new, self.starts, self.loop = old, new, starts, loop

    def _shift(self, indices: tuple[PrimExpr, ...]) -> tuple[PrimExpr, ...]:
        return tuple(i if _is_zero(s) else sub(i, s) for i, s in zip(indices, self.starts))

    def visit_BufferLoad(self, load: BufferLoad) -> PrimExpr:
        indices = tuple(self.visit(i) for i in load.indices)
        if load.buffer is not self.old:
            return load if all(a is b for a, b in zip(indices, load.indices)) else \
                BufferLoad(load.buffer, indices)
        return BufferLoad(self.new, self._shift(indices))

    def visit_BufferStore(self, store: BufferStore) -> Any:
        indices = tuple(self.visit(i) for i in store.indices)
        value = self.visit(store.value)
        if store.buffer is not self.old:
            if value is store.value and all(a is b for a, b in zip(indices, store.indices)):
                return store
            return BufferStore(store.buffer, value, indices)
        return BufferStore(self.new, value, self._shift(indices))

    def visit_BufferRegion(self, region: BufferRegion) -> BufferRegion:
        if region.buffer is not self.old:
            return region
        return BufferRegion(self.new, tuple(
            r if _is_zero(s) else Range(sub(r.min, s), r.extent)
            for r, s in zip(region.region, self.starts)
        ))

    def visit_For(self, loop: For) -> Any:
        new = self.generic_visit(loop)
        if loop is self.loop:
            new = new.replace(body=Allocate(self.new, new.body))
        return new


def _is_zero(e: PrimExpr) -> bool:
    return isinstance(e, IntImm) and e.value == 0


def compact_buffers(func: PrimFunc) -> PrimFunc:
    """Return ``func`` (in block form) with its root allocations moved and shrunk (see module
    docstring). Functions not in block form are returned unchanged."""
    if not isinstance(func.body, BlockRealize):
        return func
    for buf in func.body.block.alloc_buffers:
        index = TreeIndex(func)
        plan = _plan(index, buf)
        if plan is None:
            continue
        lca, starts, extents = plan
        shape = tuple(IntImm(d.dtype if isinstance(d, PrimExpr) else "int64", e)
                      for d, e in zip(buf.shape, extents))
        strides = _aligned_strides(func, buf, list(extents))
        new = Buffer(buf.name, shape, buf.dtype, None, strides, None, buf.scope)
        func = update_root_allocs(func, remove=(buf,))
        mut = _Compact(buf, new, starts, lca.node)  # update_root_allocs keeps the loops
        func = func.with_body(mut.visit(func.body))
    return func

