"""decompose_reduction: give a reduction's ``init`` a block and loops of its own.

``decompose_reduction(B, L)`` places a new block ``B_init`` (the init statement over ``B``'s
spatial iteration variables) right before loop ``L``, inside copies of the loops from ``L`` down
to ``B`` that are bound to spatial variables. ``B`` keeps only its update and now lists the
accumulator among its reads. ``L`` must be above every loop bound to a reduction variable, so
the init runs once per output element before the update loop nest.
"""

from __future__ import annotations

from ...ir.errors import ScheduleError
from ...ir.node import structural_equal
from ..expr import IterType, IterVar, PrimExpr, Var
from ..function import PrimFunc
from ..functor import collect_vars, substitute
from ..stmt import Block, BlockRealize, Stmt, true_predicate
from .analysis import (
    analyzer_at,
    bind_loop,
    check_block,
    conjoin,
    conjuncts,
    infer_regions,
    reduction_loops_of,
)
from .state import SRef, TreeIndex, insert_before, rewrite_func, unique_name


def decompose_reduction(index: TreeIndex, sref: SRef, loop: SRef) -> tuple[PrimFunc, str]:
    what = "decompose_reduction"
    check_block(index, sref, what)
    realize = sref.node
    assert isinstance(realize, BlockRealize)
    block = realize.block
    name, loop_name = block.name_hint, loop.loop.loop_var.name
    if block.init is None:
        raise ScheduleError(f"{what}: block {name!r} has no init (it is not a reduction block)")
    above = index.loops_above(sref)
    if not any(lp is loop for lp in above):
        raise ScheduleError(
            f"{what}: loop {loop_name!r} is not an ancestor of block {name!r}"
        )
    pos = next(k for k, lp in enumerate(above) if lp is loop)
    red = reduction_loops_of(sref, above[:pos])
    if red:
        raise ScheduleError(
            f"{what}: loop {red[0].loop.loop_var.name!r}, above {loop_name!r}, is bound to a "
            f"reduction variable of {name!r}; the init must be placed outside every "
            "reduction loop"
        )
    spatial_used: set[Var] = set()
    reduce_used: set[Var] = set()
    for iv, value in zip(block.iter_vars, realize.iter_values):
        (spatial_used if iv.iter_type == IterType.DATA_PAR else reduce_used).update(
            collect_vars(value)
        )
    copied = []
    vmap: dict[Var, PrimExpr] = {}
    for lp in above[pos:]:
        v = lp.loop.loop_var
        if v in spatial_used and v in reduce_used:
            raise ScheduleError(
                f"{what}: loop {v.name!r} is bound to both spatial and reduction variables of "
                f"{name!r}"
            )
        if v in spatial_used:
            nv = Var(f"{v.name}_init", v.dtype)
            vmap[v] = nv
            copied.append(lp.loop)
    ivmap: dict[Var, PrimExpr] = {}
    new_ivs, bindings = [], []
    for iv, value in zip(block.iter_vars, realize.iter_values):
        if iv.iter_type == IterType.DATA_PAR:
            nv = Var(iv.var.name, iv.var.dtype)
            ivmap[iv.var] = nv
            new_ivs.append(IterVar(iv.dom, nv, IterType.DATA_PAR))
            bindings.append(substitute(value, vmap))
    known = {lp.loop.loop_var for lp in above[:pos]} | set(vmap)
    # Keep the conditions on the init's own loops (e.g. from a non-divisible split of a spatial
    # loop); those on reduction loops do not apply to the init.
    all_loops = {lp.loop.loop_var for lp in above}
    init_pred: PrimExpr = true_predicate()
    for c in conjuncts(realize.predicate):
        if all(v in known or v not in all_loops for v in collect_vars(c)):
            init_pred = conjoin(init_pred, substitute(c, vmap))
    init_block = Block(
        iter_vars=tuple(new_ivs),
        reads=(),
        writes=(),
        name_hint=unique_name(f"{name}_init", index.taken_names()),
        body=substitute(block.init, ivmap),
    )
    reads, writes = infer_regions(init_block)
    init_block = init_block.replace(reads=reads, writes=writes)
    ana = analyzer_at(index, loop, include_self=False)
    new_loops = []
    for lp in copied:
        nl = lp.replace(
            loop_var=vmap[lp.loop_var],
            min=ana.simplify(substitute(lp.min, vmap)),
            extent=ana.simplify(substitute(lp.extent, vmap)),
        )
        bind_loop(ana, nl)
        new_loops.append(nl)
    nest: Stmt = BlockRealize(
        tuple(ana.simplify(b) for b in bindings), ana.simplify(init_pred), init_block
    )
    for nl in reversed(new_loops):
        nest = nl.replace(body=nest)
    update_reads = tuple(
        w for w in block.writes
        if not any(r.buffer is w.buffer and structural_equal(r.region, w.region,
                                                             map_free_vars=False)
                   for r in block.reads)
    ) + block.reads
    new_realize = realize.replace(block=block.replace(init=None, reads=update_reads))
    func = rewrite_func(index.func, {id(realize): new_realize})
    loop2 = TreeIndex(func).lookup(loop.key)
    assert loop2 is not None
    func = rewrite_func(func, {id(loop2.node): insert_before(loop2.node, nest)})
    return func, init_block.name_hint

