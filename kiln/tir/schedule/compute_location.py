"""compute_at and reverse_compute_at: move a block under a loop of another stage.

``compute_at(P, L)`` moves producer block ``P`` into loop ``L``, right before the first subtree
of ``L`` holding a consumer, and regenerates ``P``'s loops so that one iteration of ``L``
computes exactly the part of ``P``'s output the consumers under ``L`` read in that iteration.
``reverse_compute_at(C, L)`` is the mirror image: consumer ``C`` moves right after the last
subtree of ``L`` holding one of its producers and computes exactly what those producers wrote.

The region is found by evaluating, with symbolic interval arithmetic, the consumers' read
regions (or the producers' write regions) over the loops *inside* ``L``, keeping ``L`` and the
loops around it symbolic. Each iteration variable of the moved block that indexes the buffer
directly gets a loop over that region; the other iteration variables keep their full domain.
When the region cannot be proven to lie in a variable's domain, the block realize gets a
predicate that keeps it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...ir.errors import ScheduleError
from ..buffer import Buffer
from ..expr import IterType, PrimExpr, Range, Var, const
from ..function import PrimFunc
from ..gpu import is_thread_tag
from ..stmt import THREAD_TAG, Block, BlockRealize, For, ForKind, Stmt
from .analysis import (
    Bound,
    analyzer_at,
    check_block,
    conjoin,
    is_one,
    loop_domains,
    reduction_loops_of,
    region_bounds,
    region_buffers,
    union_bound,
)
from .state import SRef, TreeIndex, insert_after, insert_before, rewrite_func


def _chain_below(index: TreeIndex, loop: SRef, block: SRef) -> list[SRef]:
    """Loops strictly between ``loop`` and ``block``, outermost first."""
    return [a for a in index.ancestors(block) if not a.is_block and loop.is_ancestor_of(a)]


def accessed_region(
    index: TreeIndex,
    loop: SRef,
    blocks: list[SRef],
    buffer: Buffer,
    writes: bool,
    ana: Any,
    what: str,
    relax: Sequence[SRef] = (),
) -> list[Bound]:
    """Union over ``blocks`` (all under ``loop``) of the part of ``buffer`` each reads (or
    writes) during one iteration of ``loop``; the loops ``relax`` (above ``loop``, outermost
    first) count as inside it: the part of all their iterations together."""
    total: list[Bound] | None = None
    for b in blocks:
        realize = b.node
        assert isinstance(realize, BlockRealize)
        regions = realize.block.writes if writes else realize.block.reads
        dom = loop_domains([*relax, *_chain_below(index, loop, b)], ana)
        for region in regions:
            if region.buffer is not buffer:
                continue
            bounds = None if dom is None else region_bounds(region, realize, dom, ana)
            if bounds is None:
                raise ScheduleError(
                    f"{what}: cannot determine the region of {buffer.name!r} that block "
                    f"{b.block.name_hint!r} accesses in one iteration of loop "
                    f"{loop.loop.loop_var.name!r} (an index is not an affine expression of "
                    "the loops)"
                )
            total = bounds if total is None else [
                union_bound(x, y, ana) for x, y in zip(total, bounds)
            ]
    assert total is not None
    return total


def iter_var_ranges(
    block: Block,
    buffer_regions: list[tuple[Buffer, list[Bound]]],
    writes: bool,
    ana: Any,
    what: str,
) -> dict[Var, Bound]:
    """Per iteration variable of ``block``, the range the given buffer regions ask for.

    ``writes`` says whether the regions are matched against the block's writes or its reads.
    """
    spatial = {iv.var for iv in block.iter_vars if iv.iter_type == IterType.DATA_PAR}
    reduce_vars = {iv.var for iv in block.iter_vars if iv.iter_type != IterType.DATA_PAR}
    out: dict[Var, Bound] = {}
    for buffer, bounds in buffer_regions:
        own = block.writes if writes else block.reads
        for region in own:
            if region.buffer is not buffer:
                continue
            for rng, bound in zip(region.region, bounds):
                v = rng.min
                if not (isinstance(v, Var) and is_one(rng.extent)):
                    raise ScheduleError(
                        f"{what}: block {block.name_hint!r} accesses {buffer.name!r} at an "
                        f"index ({rng.min}) that is not a plain iteration variable; its "
                        "loops cannot be derived from the region"
                    )
                if v in reduce_vars:
                    dom = next(iv.dom for iv in block.iter_vars if iv.var is v)
                    if ana.can_prove(bound[0] <= dom.min) and ana.can_prove(
                        bound[1] >= dom.min + dom.extent - 1
                    ):
                        continue  # the whole reduction domain: nothing to restrict
                    raise ScheduleError(
                        f"{what}: the region of {buffer.name!r} would restrict reduction "
                        f"variable {v.name!r} of block {block.name_hint!r}"
                    )
                if v not in spatial:  # pragma: no cover - regions only use the block's vars
                    continue
                out[v] = bound if v not in out else union_bound(out[v], bound, ana)
    return out


def regenerate(
    block: Block, ranges: dict[Var, Bound], preserve_unit_loops: bool, ana: Any
) -> Stmt:
    """A new loop nest for ``block``: a loop per iteration variable over its range in
    ``ranges`` (its whole domain if absent), omitted when that range is a single point."""
    loops: list[tuple[Var, PrimExpr]] = []
    bindings: list[PrimExpr] = []
    predicate = const("bool", True)
    for k, iv in enumerate(block.iter_vars):
        dom = iv.dom
        if iv.var in ranges:
            lo, hi = ranges[iv.var]
            extent = ana.simplify(hi - lo + 1)
            inside = ana.can_prove(lo >= dom.min) and ana.can_prove(hi < dom.min + dom.extent)
        else:
            lo, extent, inside = dom.min, dom.extent, True
        dtype = iv.var.dtype
        if is_one(extent) and not preserve_unit_loops:
            value = ana.simplify(lo)
        else:
            ax = Var(f"ax{k}", dtype)
            ana.bind(ax, Range(const(dtype, 0), extent))
            loops.append((ax, extent))
            value = ana.simplify(lo + ax)
        bindings.append(value)
        if not inside:
            cond = (value >= dom.min) & (value < dom.min + dom.extent)
            predicate = conjoin(predicate, ana.simplify(cond))
    stmt: Stmt = BlockRealize(tuple(bindings), predicate, block)
    for ax, extent in reversed(loops):
        stmt = For(ax, const(ax.dtype, 0), extent, ForKind.SERIAL, stmt)
    return stmt


def thread_loops_above(index: TreeIndex, loop: SRef) -> list[SRef]:
    """The ``threadIdx``-bound loops at or above ``loop``, outermost first."""
    chain = [*[a for a in index.ancestors(loop) if not a.is_block], loop]
    return [s for s in chain if s.loop.kind == ForKind.THREAD_BINDING
            and is_thread_tag(str(s.loop.annotations.get(THREAD_TAG)))]


def _remove_and_reindex(index: TreeIndex, block: SRef) -> TreeIndex:
    return TreeIndex(rewrite_func(index.func, {id(block.node): None}))


def _check_moveable(index: TreeIndex, block: SRef, loop: SRef, what: str) -> None:
    check_block(index, block, what)
    if block.is_ancestor_of(loop):
        raise ScheduleError(
            f"{what}: loop {loop.loop.loop_var.name!r} is inside block {block.block.name_hint!r}"
        )
    if index.scope_of(block) is not index.scope_of(loop):
        raise ScheduleError(
            f"{what}: block {block.block.name_hint!r} and loop {loop.loop.loop_var.name!r} are "
            "in different block scopes"
        )


def compute_at(
    index: TreeIndex, block: SRef, loop: SRef, preserve_unit_loops: bool
) -> PrimFunc:
    what = "compute_at"
    _check_moveable(index, block, loop, what)
    scope = index.scope_of(block)
    name, loop_name = block.block.name_hint, loop.loop.loop_var.name
    outs = region_buffers(block.block.writes)
    params = [b for b in outs if any(b is x for x in index.func.buffer_map.values())]
    if params:
        raise ScheduleError(
            f"{what}: block {name!r} writes {params[0].name!r}, an output of the function; "
            "computed at a consumer's loop it would only produce what that consumer reads"
        )
    consumers = [
        c for c in index.child_blocks_deep(scope)
        if c is not block and any(any(r.buffer is b for r in c.block.reads) for b in outs)
    ]
    if not consumers:
        raise ScheduleError(f"{what}: block {name!r} has no consumer to be computed at")
    # A consumer that accumulates into the block's output (the update of a decomposed
    # reduction) must not see the block re-run between its reduction steps.
    above = [loop, *[a for a in index.ancestors(loop) if not a.is_block]]
    for c in consumers:
        if any(any(w.buffer is b for w in c.block.writes) for b in outs):
            red = reduction_loops_of(c, above)
            if red:
                raise ScheduleError(
                    f"{what}: loop {red[0].loop.loop_var.name!r} carries the reduction of "
                    f"block {c.block.name_hint!r}, which accumulates into the output of "
                    f"{name!r}; {name!r} would be recomputed between reduction steps"
                )
    for c in consumers:
        if not loop.is_ancestor_of(c):
            raise ScheduleError(
                f"{what}: loop {loop_name!r} is not an ancestor of consumer block "
                f"{c.block.name_hint!r}; every consumer of {name!r} must be inside the loop"
            )
    first = min(consumers, key=lambda c: c.order)
    if block.order > first.order:
        raise ScheduleError(
            f"{what}: block {name!r} runs after its consumer {first.block.name_hint!r}"
        )
    anchor = index.child_containing(loop, first)
    # Everything the block reads must still be produced before it runs at its new place.
    for buf in region_buffers(block.block.reads):
        for w in index.writers(buf, scope):
            if w is not block and w.order >= anchor.order:
                raise ScheduleError(
                    f"{what}: block {w.block.name_hint!r}, which produces {buf.name!r} read by "
                    f"{name!r}, would run after {name!r} at loop {loop_name!r}"
                )
    ana = analyzer_at(index, loop)
    # A block writing shared memory under the threadIdx loops of a GPU block produces what
    # all the block's threads read: the threads then share the copy (bind its loops to the
    # same threadIdx tags, see loop_transform.bind).
    shared = all(b.scope == "shared" for b in outs)
    relax = thread_loops_above(index, loop) if shared else []
    needs = [
        (buf, accessed_region(index, loop, [c for c in consumers
                                             if any(r.buffer is buf for r in c.block.reads)],
                               buf, False, ana, what, relax))
        for buf in outs
        if any(any(r.buffer is buf for r in c.block.reads) for c in consumers)
    ]
    ranges = iter_var_ranges(block.block, needs, True, ana, what)
    nest = regenerate(block.block, ranges, preserve_unit_loops, ana)
    anchor_key = anchor.key
    index2 = _remove_and_reindex(index, block)
    anchor2 = index2.lookup(anchor_key)
    assert anchor2 is not None  # it holds a consumer
    return rewrite_func(index2.func, {id(anchor2.node): insert_before(anchor2.node, nest)})


def reverse_compute_at(
    index: TreeIndex, block: SRef, loop: SRef, preserve_unit_loops: bool
) -> PrimFunc:
    what = "reverse_compute_at"
    _check_moveable(index, block, loop, what)
    scope = index.scope_of(block)
    name, loop_name = block.block.name_hint, loop.loop.loop_var.name
    ins = region_buffers(block.block.reads)
    producers = [
        p for p in index.child_blocks_deep(scope)
        if p is not block and any(any(r.buffer is b for r in p.block.writes) for b in ins)
    ]
    if not producers:
        raise ScheduleError(f"{what}: block {name!r} has no producer")
    under = [p for p in producers if loop.is_ancestor_of(p)]
    if not under:
        raise ScheduleError(
            f"{what}: loop {loop_name!r} is not an ancestor of any producer of block {name!r}"
        )
    for p in producers:
        if p not in under and p.order > loop.order:
            raise ScheduleError(
                f"{what}: producer block {p.block.name_hint!r} of {name!r} runs after loop "
                f"{loop_name!r}"
            )
    if block.order < loop.order:
        raise ScheduleError(f"{what}: block {name!r} runs before loop {loop_name!r}")
    outs = region_buffers(block.block.writes)
    for c in index.child_blocks_deep(scope):
        if c is not block and loop.is_ancestor_of(c) and any(
            any(r.buffer is b for r in c.block.reads) for b in outs
        ):
            raise ScheduleError(
                f"{what}: block {c.block.name_hint!r} under loop {loop_name!r} reads the "
                f"output of {name!r}"
            )
    # The producers must be complete within one iteration of the loop.
    above = [loop, *[a for a in index.ancestors(loop) if not a.is_block]]
    for p in under:
        red = reduction_loops_of(p, above)
        if red:
            raise ScheduleError(
                f"{what}: loop {red[0].loop.loop_var.name!r} carries the reduction of producer "
                f"{p.block.name_hint!r}; {name!r} would read partial results"
            )
    last = max(under, key=lambda p: p.order)
    anchor = index.child_containing(loop, last)
    ana = analyzer_at(index, loop)
    provided = []
    for buf in ins:
        writers = [p for p in under if any(r.buffer is buf for r in p.block.writes)]
        if writers:
            provided.append((buf, accessed_region(index, loop, writers, buf, True, ana, what)))
    ranges = iter_var_ranges(block.block, provided, False, ana, what)
    nest = regenerate(block.block, ranges, preserve_unit_loops, ana)
    anchor_key = anchor.key
    index2 = _remove_and_reindex(index, block)
    anchor2 = index2.lookup(anchor_key)
    assert anchor2 is not None  # it holds a producer
    return rewrite_func(index2.func, {id(anchor2.node): insert_after(anchor2.node, nest)})


__all__ = [
    "accessed_region", "compute_at", "iter_var_ranges", "regenerate", "reverse_compute_at",
    "thread_loops_above",
]
