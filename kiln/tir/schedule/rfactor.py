"""rfactor: turn one reduction loop into a spatial axis of partial results.

A reduction ``buf[s] = buf[s] + f(s, r)`` carries a dependency from one iteration to the next,
so its loops cannot be vectorized or run in parallel. ``rfactor(L, factor_axis)`` (TVM's
primitive of the same name) takes a loop ``L`` bound to a reduction variable of the only block
``B`` under it and splits ``B`` in two:

- ``B_rf``, in ``B``'s place and under all of ``B``'s loops, accumulates partial results into a
  new buffer ``buf_rf`` that has one more dimension (inserted at ``factor_axis`` of ``buf``'s
  shape) indexed by ``L``'s variable. ``L`` is now bound to a *spatial* variable of ``B_rf``, so
  it can be vectorized or parallelized; the other reduction loops stay reductions.
- ``B`` (same name, so handles to it stay valid) becomes the write-back block: it combines the
  partial results over the new axis, in its own loops placed right after the outermost
  reduction loop of the original nest, inside the spatial loops above it.

Typical use: split a reduction loop ``k`` into ``(ko, ki)`` with ``ki`` the vector width,
rfactor ``ki`` and vectorize it: the partial sums form a short vector accumulator.

Only sum-like reductions whose update is one of ``+ * min max && ||`` with the accumulator as
one operand are supported (the combiner must be associative and commutative, which is what
makes regrouping the terms legal). Floating-point sums are reassociated, so results may differ
from the serial order by rounding, as with any vectorized reduction.
"""

from __future__ import annotations

from typing import Any

from ...ir.errors import ScheduleError
from ...ir.node import structural_equal
from ..buffer import Buffer
from ..expr import (
    Add,
    And,
    BufferLoad,
    IterType,
    IterVar,
    Max,
    Min,
    Mul,
    Or,
    PrimExpr,
    Range,
    Var,
)
from ..function import PrimFunc
from ..functor import collect_vars, post_order_visit, substitute
from ..stmt import Block, BlockRealize, BufferStore, ForKind, Stmt, true_predicate
from .analysis import (
    analyzer_at,
    as_int,
    bind_loop,
    check_block,
    conjoin,
    conjuncts,
    infer_regions,
)
from .state import (
    SRef,
    TreeIndex,
    buffer_names,
    insert_after,
    rewrite_func,
    unique_name,
    update_root_allocs,
)

_COMBINERS = (Add, Mul, Min, Max, And, Or)


def _is_self_load(e: PrimExpr, store: BufferStore) -> bool:
    return (isinstance(e, BufferLoad) and e.buffer is store.buffer
            and structural_equal(e.indices, store.indices, map_free_vars=False))


def _split_update(block: Block, what: str) -> tuple[BufferStore, type, PrimExpr]:
    """The block's store, its combiner class and the value combined into the accumulator."""
    name = block.name_hint
    store, init = block.body, block.init
    if init is None:
        raise ScheduleError(f"{what}: block {name!r} has no init (it is not a reduction block)")
    if not isinstance(store, BufferStore) or not isinstance(init, BufferStore):
        raise ScheduleError(
            f"{what}: block {name!r} must be a single reduction update with a single init "
            "store (decompose_reduction was already applied, or the body is not a reduction)"
        )
    if init.buffer is not store.buffer or not structural_equal(
        init.indices, store.indices, map_free_vars=False
    ):
        raise ScheduleError(
            f"{what}: the init of block {name!r} does not store to the element its update "
            "accumulates into"
        )
    value = store.value
    if isinstance(value, _COMBINERS):
        for acc, rhs in ((value.a, value.b), (value.b, value.a)):
            if _is_self_load(acc, store) and not _loads(rhs, store.buffer):
                return store, type(value), rhs
    raise ScheduleError(
        f"{what}: the update of block {name!r} is not ``acc = acc OP value`` with OP one of "
        "+, *, min, max, &&, || (no associative combiner to regroup the reduction with)"
    )


def _loads(e: PrimExpr, buffer: Buffer) -> bool:
    found: list[Any] = []
    post_order_visit(e, lambda n: found.append(n) if isinstance(n, BufferLoad)
                     and n.buffer is buffer else None)
    return bool(found)


def _factor_axis(factor_axis: Any, ndim: int, what: str) -> int:
    if not isinstance(factor_axis, int) or isinstance(factor_axis, bool) or not (
        -ndim - 1 <= factor_axis <= ndim
    ):
        raise ScheduleError(
            f"{what}: factor_axis {factor_axis!r} must be an int in [{-ndim - 1}, {ndim}] "
            f"(the accumulator has {ndim} dimension(s))"
        )
    return factor_axis % (ndim + 1)


def _classify(realize: BlockRealize, above: list[SRef], what: str
              ) -> tuple[set[Var], set[Var]]:
    """Loop variables used by the spatial and by the reduction bindings of the block."""
    spatial: set[Var] = set()
    reduce: set[Var] = set()
    block = realize.block
    for iv, value in zip(block.iter_vars, realize.iter_values):
        if iv.iter_type == IterType.DATA_PAR:
            spatial.update(collect_vars(value))
        elif iv.iter_type == IterType.COMM_REDUCE:
            reduce.update(collect_vars(value))
        else:
            raise ScheduleError(
                f"{what}: block {block.name_hint!r} has iteration variable {iv.var.name!r} of "
                f"kind {iv.iter_type.name} (only spatial and reduction variables are supported)"
            )
    loop_vars = {lp.loop.loop_var for lp in above}
    for v in spatial & reduce & loop_vars:
        raise ScheduleError(
            f"{what}: loop {v.name!r} is bound to both spatial and reduction variables of "
            f"block {block.name_hint!r}"
        )
    return spatial & loop_vars, reduce & loop_vars


def rfactor(index: TreeIndex, loop: SRef, factor_axis: int) -> tuple[PrimFunc, str]:
    """Apply rfactor to ``loop``; returns the new function and the rf block's name."""
    what = "rfactor"
    loop_name = loop.loop.loop_var.name
    blocks = index.blocks_under(loop)
    if len(blocks) != 1:
        raise ScheduleError(
            f"{what}: loop {loop_name!r} must hold exactly one block, it holds {len(blocks)}"
        )
    sref = blocks[0]
    check_block(index, sref, what)
    realize = sref.node
    assert isinstance(realize, BlockRealize)
    block = realize.block
    name = block.name_hint
    store, combiner, rhs = _split_update(block, what)
    above = index.loops_above(sref)
    spatial_loops, reduce_loops = _classify(realize, above, what)
    lvar = loop.loop.loop_var
    if lvar not in reduce_loops:
        raise ScheduleError(
            f"{what}: loop {loop_name!r} is not bound to a reduction variable of block {name!r}"
        )
    ana = analyzer_at(index, loop, include_self=False)
    if as_int(ana.simplify(loop.loop.min)) != 0:
        raise ScheduleError(f"{what}: loop {loop_name!r} must start at 0")
    all_loop_vars = {lp.loop.loop_var for lp in above}
    red_srefs = [lp for lp in above if lp.loop.loop_var in reduce_loops]
    for lp in red_srefs:
        if any(v in all_loop_vars for v in collect_vars((lp.loop.min, lp.loop.extent))):
            raise ScheduleError(
                f"{what}: the range of reduction loop {lp.loop.loop_var.name!r} depends on "
                "another loop"
            )
    for c in conjuncts(realize.predicate):
        if any(v in reduce_loops for v in collect_vars(c)):
            raise ScheduleError(
                f"{what}: block {name!r} has a predicate on its reduction loops ({c}), e.g. "
                "from a split that does not divide the extent; the partial results it skips "
                "would never be initialized"
            )
    top = red_srefs[0]
    if index.blocks_under(top) != [sref]:
        raise ScheduleError(
            f"{what}: reduction loop {top.loop.loop_var.name!r} holds other blocks besides "
            f"{name!r}; the write-back block could not be placed after it"
        )
    axis = _factor_axis(factor_axis, len(store.indices), what)
    buf = store.buffer
    extent = loop.loop.extent

    rf_buf = Buffer(
        unique_name(f"{buf.name}_rf", buffer_names(index.func)),
        (*buf.shape[:axis], extent, *buf.shape[axis:]), buf.dtype, None, (), None, buf.scope,
    )
    taken = index.taken_names()
    rf_block, rf_values = _rf_block(realize, store, combiner, rhs, rf_buf, axis, lvar,
                                    red_srefs, unique_name(f"{name}_rf", taken))
    new_rf = BlockRealize(rf_values, realize.predicate, rf_block)
    wb_nest = _write_back(realize, store, combiner, rf_buf, axis, loop, top, above,
                          spatial_loops, ana_at=analyzer_at(index, top, include_self=False))
    func = rewrite_func(index.func, {id(realize): new_rf})
    top2 = TreeIndex(func).lookup(top.key)
    assert top2 is not None
    func = rewrite_func(func, {id(top2.node): insert_after(top2.node, wb_nest)})
    return update_root_allocs(func, add=(rf_buf,)), rf_block.name_hint


def _rf_block(
    realize: BlockRealize, store: BufferStore, combiner: type, rhs: PrimExpr, rf_buf: Buffer,
    axis: int, lvar: Var, red_srefs: list[SRef], rf_name: str,
) -> tuple[Block, tuple[PrimExpr, ...]]:
    """The block of partial results: ``rf[s, v_rf] = rf[s, v_rf] OP value``."""
    block = realize.block
    ivs: list[IterVar] = []
    values: list[PrimExpr] = []
    for iv, value in zip(block.iter_vars, realize.iter_values):
        if iv.iter_type == IterType.DATA_PAR:
            ivs.append(iv)
            values.append(value)
    loop_map: dict[Var, PrimExpr] = {}
    v_rf = None
    for lp in red_srefs:
        lv = lp.loop.loop_var
        is_rf = lv is lvar
        nv = Var(f"v_{lv.name}", lv.dtype)
        kind = IterType.DATA_PAR if is_rf else IterType.COMM_REDUCE
        ivs.append(IterVar(Range(lp.loop.min, lp.loop.extent), nv, kind))
        values.append(lv)
        loop_map[lv] = nv
        if is_rf:
            v_rf = nv
    assert v_rf is not None
    red_map = {
        iv.var: substitute(value, loop_map)
        for iv, value in zip(block.iter_vars, realize.iter_values)
        if iv.iter_type == IterType.COMM_REDUCE
    }
    idx = (*store.indices[:axis], v_rf, *store.indices[axis:])
    acc = BufferLoad(rf_buf, idx)
    body = BufferStore(rf_buf, combiner(acc, substitute(rhs, red_map)), idx)
    assert block.init is not None and isinstance(block.init, BufferStore)
    init = BufferStore(rf_buf, block.init.value, idx)
    rf = Block(iter_vars=tuple(ivs), reads=(), writes=(), name_hint=rf_name, body=body,
               init=init)
    reads, writes = infer_regions(rf)
    return rf.replace(reads=reads, writes=writes), tuple(values)


def _write_back(
    realize: BlockRealize, store: BufferStore, combiner: type, rf_buf: Buffer, axis: int,
    loop: SRef, top: SRef, above: list[SRef], spatial_loops: set[Var], ana_at: Any,
) -> Stmt:
    """The block combining the partial results (``B``'s name, ``B``'s init), in copies of the
    spatial loops below ``top`` and a loop over the rf axis."""
    block = realize.block
    pos = next(k for k, lp in enumerate(above) if lp is top)
    loop_map: dict[Var, PrimExpr] = {}
    copies = []
    for lp in above[pos:]:
        v = lp.loop.loop_var
        if v in spatial_loops:
            nv = Var(f"{v.name}_wb", v.dtype)
            loop_map[v] = nv
            copies.append(lp.loop)
    rv = loop.loop.loop_var
    rv_new = Var(f"{rv.name}_wb", rv.dtype)
    iv_map: dict[Var, PrimExpr] = {}
    ivs: list[IterVar] = []
    values: list[PrimExpr] = []
    for iv, value in zip(block.iter_vars, realize.iter_values):
        if iv.iter_type == IterType.DATA_PAR:
            nv = Var(iv.var.name, iv.var.dtype)
            iv_map[iv.var] = nv
            ivs.append(IterVar(iv.dom, nv, IterType.DATA_PAR))
            values.append(substitute(value, loop_map))
    v_red = Var(f"v_{rv.name}", rv.dtype)
    ivs.append(IterVar(Range(loop.loop.min, loop.loop.extent), v_red, IterType.COMM_REDUCE))
    values.append(rv_new)
    idx = tuple(substitute(i, iv_map) for i in store.indices)
    rf_idx = (*idx[:axis], v_red, *idx[axis:])
    body = BufferStore(store.buffer,
                       combiner(BufferLoad(store.buffer, idx), BufferLoad(rf_buf, rf_idx)), idx)
    assert block.init is not None
    wb = block.replace(iter_vars=tuple(ivs), body=body, init=substitute(block.init, iv_map),
                       reads=(), writes=())
    reads, writes = infer_regions(wb)
    wb = wb.replace(reads=reads, writes=writes)
    # conditions on the copied spatial loops (a non-divisible split) still apply
    known = {lp.loop.loop_var for lp in above[:pos]} | set(loop_map)
    pred: PrimExpr = true_predicate()
    for c in conjuncts(realize.predicate):
        if all(v in known or v not in {lp.loop.loop_var for lp in above}
               for v in collect_vars(c)):
            pred = conjoin(pred, c)
    pred = substitute(pred, loop_map)
    ana = ana_at
    new_loops = []
    for lp in copies:
        nl = lp.replace(loop_var=loop_map[lp.loop_var], min=substitute(lp.min, loop_map),
                        extent=substitute(lp.extent, loop_map), annotations={})
        bind_loop(ana, nl)
        new_loops.append(nl)
    red_loop = loop.loop.replace(loop_var=rv_new, annotations={}, kind=ForKind.SERIAL)
    bind_loop(ana, red_loop)
    nest: Stmt = BlockRealize(tuple(ana.simplify(v) for v in values), ana.simplify(pred), wb)
    nest = red_loop.replace(body=nest)
    for nl in reversed(new_loops):
        nest = nl.replace(body=nest, kind=ForKind.SERIAL)
    return nest
