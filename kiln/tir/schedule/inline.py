"""compute_inline and reverse_compute_inline: remove an intermediate buffer.

``compute_inline(P)`` replaces every load of the buffer ``P`` writes by ``P``'s value expression
(with ``P``'s iteration variables replaced by the load's indices) and removes ``P``.
``reverse_compute_inline(C)`` folds consumer ``C`` into its only producer ``P``: ``P`` stores
``C``'s value (with the load of ``P``'s buffer replaced by ``P``'s value) straight into ``C``'s
output, and ``C`` is removed. In both cases the intermediate buffer disappears from the root
block's allocations.
"""

from __future__ import annotations

from ...ir.errors import ScheduleError
from ...ir.node import structural_equal
from ..buffer import Buffer
from ..expr import BufferLoad, IterType, PrimExpr, Var
from ..function import PrimFunc
from ..functor import Mutator, post_order_visit, substitute
from ..stmt import Block, BlockRealize, BufferStore
from .analysis import (
    analyzer_at,
    check_block,
    infer_regions,
    is_true,
    plain_store_vars,
    region_buffers,
)
from .state import SRef, TreeIndex, rewrite_func, update_root_allocs


class _InlineLoads(Mutator):
    """Replace loads of ``buffer`` by ``value`` with ``params`` bound to the load's indices."""

    def __init__(self, buffer: Buffer, params: list[Var], value: PrimExpr):
        self.buffer, self.params, self.value = buffer, params, value

    def visit_BufferLoad(self, load: BufferLoad) -> PrimExpr:
        load = self.generic_visit(load)
        if load.buffer is not self.buffer:
            return load
        return substitute(self.value, dict(zip(self.params, load.indices)))


def _complete_store(block: Block, what: str, role: str) -> BufferStore:
    """The single store of a spatial, init-free block (what inlining can move around)."""
    name = block.name_hint
    if block.init is not None or any(iv.iter_type != IterType.DATA_PAR for iv in block.iter_vars):
        raise ScheduleError(f"{what}: {role} block {name!r} is a reduction block")
    if not isinstance(block.body, BufferStore):
        raise ScheduleError(
            f"{what}: the body of {role} block {name!r} is not a single buffer store"
        )
    return block.body


def _is_param_buffer(func: PrimFunc, buffer: Buffer) -> bool:
    return any(b is buffer for b in func.buffer_map.values())


def _loads_of(node: object, buffer: Buffer) -> list[BufferLoad]:
    out: list[BufferLoad] = []

    def visit(n: object) -> None:
        if isinstance(n, BufferLoad) and n.buffer is buffer:
            out.append(n)

    post_order_visit(node, visit)
    return out


def compute_inline(index: TreeIndex, sref: SRef) -> PrimFunc:
    what = "compute_inline"
    check_block(index, sref, what)
    block = sref.block
    name = block.name_hint
    store = _complete_store(block, what, "the")
    buf = store.buffer
    if _is_param_buffer(index.func, buf):
        raise ScheduleError(
            f"{what}: block {name!r} writes {buf.name!r}, an output of the function; only "
            "intermediate buffers can be inlined"
        )
    params = plain_store_vars(block, store, what)
    if len(params) != len(block.iter_vars):
        raise ScheduleError(
            f"{what}: not every iteration variable of block {name!r} indexes the stored "
            f"element of {buf.name!r}"
        )
    if _loads_of(store.value, buf):
        raise ScheduleError(f"{what}: block {name!r} reads the buffer it writes")
    scope = index.scope_of(sref)
    writers = index.writers(buf, scope)
    if any(w is not sref for w in writers):
        other = next(w for w in writers if w is not sref)
        raise ScheduleError(
            f"{what}: {buf.name!r} is also written by block {other.block.name_hint!r}"
        )
    repl = {}
    mutator = _InlineLoads(buf, params, store.value)
    for b in index.child_blocks_deep(scope):
        if b is sref:
            continue
        blk = b.block
        if not any(r.buffer is buf for r in blk.reads) and not _loads_of(
            (blk.body, blk.init), buf
        ):
            continue
        if b.order < sref.order:
            raise ScheduleError(
                f"{what}: block {blk.name_hint!r} reads {buf.name!r} before {name!r} writes it"
            )
        new_block = blk.replace(body=mutator.visit(blk.body), init=mutator.visit(blk.init))
        reads, _ = infer_regions(new_block)
        realize = b.node
        assert isinstance(realize, BlockRealize)
        repl[id(realize)] = realize.replace(block=new_block.replace(reads=reads))
    repl[id(sref.node)] = None
    func = rewrite_func(index.func, repl)
    return update_root_allocs(func, remove=(buf,))


def reverse_compute_inline(index: TreeIndex, sref: SRef) -> PrimFunc:
    what = "reverse_compute_inline"
    check_block(index, sref, what)
    block = sref.block
    name = block.name_hint
    store = _complete_store(block, what, "the")
    realize = sref.node
    assert isinstance(realize, BlockRealize)
    if not is_true(realize.predicate):
        raise ScheduleError(f"{what}: block {name!r} has a predicate")
    scope = index.scope_of(sref)
    producers = []
    for buf in region_buffers(block.reads):
        for w in index.writers(buf, scope):
            if w is not sref and not any(w is p for p in producers):
                producers.append(w)
    if len(producers) != 1:
        raise ScheduleError(
            f"{what}: block {name!r} must have exactly one producer block, it has "
            f"{len(producers)}" + (
                " (" + ", ".join(repr(p.block.name_hint) for p in producers) + ")"
                if producers else ""
            )
        )
    prod = producers[0]
    pblock = prod.block
    pname = pblock.name_hint
    pstore = _complete_store(pblock, what, "producer")
    buf = pstore.buffer
    if not any(r.buffer is buf for r in block.reads):
        raise ScheduleError(  # pragma: no cover - the producer was found through this buffer
            f"{what}: block {name!r} does not read {buf.name!r}"
        )
    if _is_param_buffer(index.func, buf):
        raise ScheduleError(
            f"{what}: {buf.name!r}, written by {pname!r}, is an output of the function"
        )
    others = [r for r in index.readers(buf, scope) if r is not sref]
    if others:
        raise ScheduleError(
            f"{what}: {buf.name!r} is also read by block {others[0].block.name_hint!r}"
        )
    pvars = plain_store_vars(pblock, pstore, what)
    if len(pvars) != len(pblock.iter_vars):
        raise ScheduleError(
            f"{what}: not every iteration variable of producer {pname!r} indexes the stored "
            f"element of {buf.name!r}"
        )
    loads = _loads_of(store.value, buf)
    if not loads:
        raise ScheduleError(f"{what}: block {name!r} does not load {buf.name!r} in its body")
    first = loads[0]
    for ld in loads[1:]:
        if not structural_equal(ld.indices, first.indices, map_free_vars=False):
            raise ScheduleError(
                f"{what}: block {name!r} loads {buf.name!r} at different indices"
            )
    cvars = [iv.var for iv in block.iter_vars]
    seen: list[Var] = []
    for idx in first.indices:
        if not isinstance(idx, Var) or idx not in cvars or idx in seen:
            raise ScheduleError(
                f"{what}: block {name!r} loads {buf.name!r} at indices that are not distinct "
                "iteration variables of the block"
            )
        seen.append(idx)
    if len(seen) != len(cvars):
        raise ScheduleError(
            f"{what}: not every iteration variable of block {name!r} indexes {buf.name!r}; "
            "its iterations cannot be mapped onto the producer's"
        )
    ana = analyzer_at(index, prod)
    pdom = {iv.var: iv.dom for iv in pblock.iter_vars}
    cdom = {iv.var: iv.dom for iv in block.iter_vars}
    for cv, pv in zip(first.indices, pvars):
        a, b = cdom[cv], pdom[pv]
        if not (ana.can_prove(a.min.equal(b.min)) and ana.can_prove(a.extent.equal(b.extent))):
            raise ScheduleError(
                f"{what}: block {name!r} iterates {cv.name} over a range different from the "
                f"one {pname!r} produces along that dimension of {buf.name!r}"
            )
    vmap: dict[Var, PrimExpr] = {cv: pv for cv, pv in zip(first.indices, pvars)}
    # Replace the loads (giving the producer's value in the consumer's variables), then rename
    # the consumer's variables to the producer's.
    value = substitute(_InlineLoads(buf, pvars, pstore.value).visit(store.value), vmap)
    indices = tuple(substitute(i, vmap) for i in store.indices)
    new_store = BufferStore(store.buffer, value, indices)
    new_pblock = pblock.replace(body=new_store)
    reads, writes = infer_regions(new_pblock)
    new_pblock = new_pblock.replace(reads=reads, writes=writes)
    prealize = prod.node
    assert isinstance(prealize, BlockRealize)
    repl = {id(prealize): prealize.replace(block=new_pblock), id(realize): None}
    func = rewrite_func(index.func, repl)
    return update_root_allocs(func, remove=(buf,))
