"""blockize: make the loop nest under a loop the body of a new outer block.

``blockize(L)`` takes a loop ``L`` whose body is a perfect loop nest around one block ``B``
and puts an outer block ``B_o`` where ``L`` was; ``B_o``'s body is the loop nest (``L`` and
the loops under it) around ``B``. Each binding of ``B`` is split into a part that depends on
the loops outside ``L`` and a part that depends on the loops inside (``v = i_0 * 8 + i_1`` ->
``outer i_0``, ``inner i_1``); the outer part becomes an iteration variable of ``B_o`` (of the
same kind, scaled down by the inner extent when it divides: ``v_o = i_0`` with ``v = v_o * 8 +
i_1``), so ``B_o`` is a block in its own right: its regions are ``B``'s regions relaxed over the
inner loops. A reduction's ``init`` moves to ``B_o`` (a loop nest over the inner spatial loops),
so ``B`` keeps only the update -- the form a tensor intrinsic describes (see
:mod:`.tensorize`). This is why blockize exists: it cuts out the piece of computation an
intrinsic will replace.
"""

from __future__ import annotations

from typing import Any

from ...ir.errors import ScheduleError
from ...ir.node import structural_equal
from ..buffer import BufferRegion
from ..expr import IterType, IterVar, PrimExpr, Range, Var, const
from ..function import PrimFunc
from ..functor import collect_vars, substitute
from ..stmt import Block, BlockRealize, For, IfThenElse, Stmt, true_predicate
from .analysis import (
    analyzer_at,
    as_int,
    bind_loop,
    eval_bound,
    is_true,
    loop_domains,
    region_bounds,
)
from .state import SRef, TreeIndex, rewrite_func, unique_name


def _perfect_nest(loop: SRef, what: str) -> tuple[list[For], BlockRealize]:
    chain = [loop.loop]
    stmt: Stmt = loop.loop.body
    while isinstance(stmt, For):
        chain.append(stmt)
        stmt = stmt.body
    if not isinstance(stmt, BlockRealize):
        raise ScheduleError(
            f"{what}: the body of loop {chain[-1].loop_var.name!r} is a {type(stmt).__name__}; "
            f"the subtree of loop {loop.loop.loop_var.name!r} must be a perfect loop nest around "
            "exactly one block"
        )
    return chain, stmt


def _split_binding(value: PrimExpr, inner: set[Var], dom: dict, ana: Any, what: str,
                   name: str) -> tuple[PrimExpr, PrimExpr, PrimExpr]:
    """``value = outer + inner_part`` with ``inner_part`` in ``[0, extent)``: (outer, inner,
    extent)."""
    outer = ana.simplify(substitute(value, {v: const(v.dtype, 0) for v in inner}))
    rest = ana.simplify(value - outer)
    if any(v not in inner for v in collect_vars(rest)):
        raise ScheduleError(
            f"blockize: the binding {value} of iteration variable {name!r} does not separate "
            f"into a part outside and a part inside the blockized loops ({what})"
        )
    bound = eval_bound(rest, dom, ana)
    if bound is None:
        raise ScheduleError(f"blockize: cannot bound the inner part {rest} of {name!r}")
    lo, hi = bound
    return ana.simplify(outer + lo), ana.simplify(rest - lo), ana.simplify(hi - lo + 1)


def blockize(index: TreeIndex, loop: SRef) -> tuple[PrimFunc, str]:
    """Return the function with an outer block at ``loop`` and the new block's name."""
    what = f"loop {loop.loop.loop_var.name!r}"
    chain, realize = _perfect_nest(loop, "blockize")
    block = realize.block
    inner_vars = {lp.loop_var for lp in chain}
    ana = analyzer_at(index, loop, include_self=False)
    for lp in chain:
        bind_loop(ana, lp)
    dom = loop_domains([index.loops[lp.loop_var] for lp in chain], ana)
    if dom is None:
        raise ScheduleError(f"blockize: cannot bound the loops under {what}")

    outer_ivs: list[IterVar] = []
    outer_values: list[PrimExpr] = []
    inner_values: list[PrimExpr] = []
    for iv, value in zip(block.iter_vars, realize.iter_values):
        if not any(v in inner_vars for v in collect_vars(value)):
            ov = Var(f"{iv.var.name}_o", iv.var.dtype)
            outer_ivs.append(IterVar(iv.dom, ov, iv.iter_type))
            outer_values.append(value)
            inner_values.append(ov)
            continue
        o, r, extent = _split_binding(value, inner_vars, dom, ana, what, iv.var.name)
        if not collect_vars(o) and as_int(o) == 0:
            inner_values.append(r)  # wholly inside: no outer iteration variable
            continue
        ov = Var(f"{iv.var.name}_o", iv.var.dtype)
        divides = (as_int(iv.dom.min) == 0 and as_int(extent) is not None
                   and ana.can_prove((o % extent).equal(0)))
        if divides:
            ext = ana.simplify((iv.dom.extent + extent - 1) // extent)
            outer_ivs.append(IterVar(Range(const(ext.dtype, 0), ext), ov, iv.iter_type))
            outer_values.append(ana.simplify(o // extent))
            inner_values.append(ov * extent + r)
        else:
            outer_ivs.append(IterVar(iv.dom, ov, iv.iter_type))
            outer_values.append(o)
            inner_values.append(ov + r)

    new_inner = realize.replace(iter_values=tuple(inner_values))
    init = _outer_init(block, new_inner, chain, what) if block.init is not None else None
    if init is not None:
        acc = tuple(
            w for w in block.writes
            if not any(r.buffer is w.buffer and structural_equal(r.region, w.region,
                                                                 map_free_vars=False)
                       for r in block.reads)
        )
        new_inner = new_inner.replace(block=block.replace(init=None, reads=acc + block.reads))
    body: Stmt = new_inner
    for lp in reversed(chain):
        body = lp.replace(body=body)

    def relax(regions: tuple[BufferRegion, ...]) -> tuple[BufferRegion, ...]:
        out = []
        for reg in regions:
            bounds = region_bounds(reg, new_inner, dom, ana)
            if bounds is None:
                raise ScheduleError(
                    f"blockize: cannot bound the region of {reg.buffer.name!r} accessed under "
                    f"{what}"
                )
            out.append(BufferRegion(reg.buffer, tuple(
                Range(lo, ana.simplify(hi - lo + 1)) for lo, hi in bounds)))
        return tuple(out)

    outer_block = Block(
        iter_vars=tuple(outer_ivs),
        reads=relax(block.reads),
        writes=relax(block.writes),
        name_hint=unique_name(f"{block.name_hint}_o", index.taken_names()),
        body=body,
        init=init,
    )
    outer = BlockRealize(tuple(outer_values), true_predicate(), outer_block)
    return rewrite_func(index.func, {id(loop.node): outer}), outer_block.name_hint


def _outer_init(block: Block, inner: BlockRealize, chain: list[For], what: str) -> Stmt:
    """The reduction's init as a loop nest over the inner loops that feed spatial variables."""
    spatial: set[Var] = set()
    reduce: set[Var] = set()
    for iv, value in zip(block.iter_vars, inner.iter_values):
        (spatial if iv.iter_type == IterType.DATA_PAR else reduce).update(collect_vars(value))
    vmap: dict[Var, PrimExpr] = {}
    kept: list[For] = []
    for lp in chain:
        v = lp.loop_var
        if v in spatial and v in reduce:
            raise ScheduleError(
                f"blockize: loop {v.name!r} under {what} feeds both spatial and reduction "
                f"variables of block {block.name_hint!r}; its init cannot be separated"
            )
        if v in spatial:
            nv = Var(f"{v.name}_init", v.dtype)
            vmap[v] = nv
            kept.append(lp)
        elif v in reduce:
            vmap[v] = lp.min  # the init does not iterate over reduction loops
    ivmap = {
        iv.var: substitute(value, vmap)
        for iv, value in zip(block.iter_vars, inner.iter_values)
        if iv.iter_type == IterType.DATA_PAR
    }
    stmt: Stmt = substitute(block.init, ivmap)
    if not is_true(inner.predicate):
        if any(v in reduce for v in collect_vars(inner.predicate)):
            raise ScheduleError(
                f"blockize: the predicate of block {block.name_hint!r} depends on a reduction "
                f"loop under {what}; its init cannot be moved out"
            )
        stmt = IfThenElse(substitute(inner.predicate, vmap), stmt)
    for lp in reversed(kept):
        stmt = For(vmap[lp.loop_var], substitute(lp.min, vmap), substitute(lp.extent, vmap),
                   lp.kind, stmt, dict(lp.annotations))
    return stmt
