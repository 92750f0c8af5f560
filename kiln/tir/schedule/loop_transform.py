"""Loop primitives: split, fuse, reorder, loop kinds (parallel/vectorize/unroll), GPU thread
binding, annotate.

Each takes the :class:`TreeIndex` of the current function and returns the new function (plus
the identity keys of new loops). Block bindings under a transformed loop are rewritten by
substituting the old loop variable and re-simplified, so they stay affine expressions of the new
loops (``v_i = i_0 * 8 + i_1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...ir.dtype import DataType
from ...ir.errors import ScheduleError
from ..expr import IterType, PrimExpr, Var, const
from ..function import PrimFunc
from ..functor import collect_vars, substitute
from ..gpu import check_tag, is_thread_tag
from ..stmt import THREAD_TAG, BlockRealize, For, ForKind, SeqStmt, Stmt
from .analysis import (
    analyzer_at,
    as_int,
    bound_iter_types,
    conjoin,
    simplify_stmt,
    uses_any,
)
from .state import SRef, TreeIndex, rewrite_func


def _loop_name(sref: SRef) -> str:
    return sref.loop.loop_var.name


def _add_predicate(stmt: Stmt, pred: PrimExpr) -> Stmt:
    """Conjoin ``pred`` to the predicate of every block realize in ``stmt`` (not nested ones)."""
    if isinstance(stmt, BlockRealize):
        return stmt.replace(predicate=conjoin(stmt.predicate, pred))
    if isinstance(stmt, For):
        return stmt.replace(body=_add_predicate(stmt.body, pred))
    if isinstance(stmt, SeqStmt):
        return SeqStmt(tuple(_add_predicate(s, pred) for s in stmt.seq))
    if hasattr(stmt, "body"):
        return stmt.replace(body=_add_predicate(stmt.body, pred))  # type: ignore[attr-defined]
    return stmt


def _refuse_bound(what: str, loop: For) -> None:
    """Splitting or fusing a bound loop would silently drop its binding."""
    if loop.kind == ForKind.THREAD_BINDING:
        raise ScheduleError(f"{what}: loop {loop.loop_var.name!r} is bound to "
                            f"{loop.annotations.get(THREAD_TAG)}; {what} before binding")


def _factor_expr(f: Any, dtype: DataType) -> PrimExpr | None:
    if f is None:
        return None
    if isinstance(f, bool):
        raise ScheduleError(f"split: factor {f!r} is not an integer")
    if isinstance(f, int):
        if f <= 0:
            raise ScheduleError(f"split: factor {f} must be positive")
        return const(dtype, f)
    if isinstance(f, PrimExpr) and f.dtype.is_integer and f.dtype.lanes == 1:
        k = as_int(f)
        if k is not None:
            if k <= 0:
                raise ScheduleError(f"split: factor {k} must be positive")
            return const(dtype, k)
        return f if f.dtype == dtype else f.astype(dtype)
    raise ScheduleError(f"split: factor {f!r} is not an integer, an integer PrimExpr or None")


def split(index: TreeIndex, sref: SRef, factors: Sequence[Any]) -> tuple[PrimFunc, list[Var]]:
    """Split a loop into ``len(factors)`` nested loops, outermost first."""
    if not isinstance(factors, (list, tuple)) or len(factors) < 2:
        raise ScheduleError(
            f"split: factors must be a list of at least two entries, got {factors!r}"
        )
    loop = sref.loop
    _refuse_bound("split", loop)
    dtype = loop.loop_var.dtype
    exprs = [_factor_expr(f, dtype) for f in factors]
    if sum(e is None for e in exprs) > 1:
        raise ScheduleError("split: at most one factor may be None (inferred)")
    ana = analyzer_at(index, sref, include_self=False)
    known = const(dtype, 1)
    for e in exprs:
        if e is not None:
            known = known * e
    known = ana.simplify(known)
    if any(e is None for e in exprs):
        # ceil(extent / known) * known >= extent by construction
        inferred = ana.simplify((loop.extent + known - 1) // known)
        exprs = [inferred if e is None else e for e in exprs]
        product = ana.simplify(known * inferred)
        covered = True
    else:
        product = known
        covered = ana.can_prove(product >= loop.extent)
    if not covered:
        raise ScheduleError(
            f"split: the factors {list(factors)} of loop {_loop_name(sref)!r} multiply to "
            f"{product}, which is not provably >= its extent {loop.extent}"
        )
    name = loop.loop_var.name
    new_vars = [Var(f"{name}_{k}", dtype) for k in range(len(exprs))]
    fused: PrimExpr = new_vars[0]
    for v, e in zip(new_vars[1:], exprs[1:]):
        fused = fused * e + v
    body = substitute(loop.body, {loop.loop_var: fused + loop.min})
    if not ana.can_prove(product.equal(loop.extent)):
        body = _add_predicate(body, fused < loop.extent)
    stmt: Stmt = body
    for v, e in reversed(list(zip(new_vars, exprs))):
        stmt = For(v, const(dtype, 0), e, ForKind.SERIAL, stmt)
    stmt = simplify_stmt(stmt, ana)
    return rewrite_func(index.func, {id(loop): stmt}), new_vars


def fuse(index: TreeIndex, srefs: Sequence[SRef]) -> tuple[PrimFunc, Var]:
    """Fuse perfectly nested, adjacent loops (outermost first) into one."""
    if len(srefs) < 2:
        raise ScheduleError("fuse: needs at least two loops")
    names = [_loop_name(s) for s in srefs]
    if len({id(s) for s in srefs}) != len(srefs):
        raise ScheduleError(f"fuse: a loop is listed twice in {names}")
    for outer, inner in zip(srefs, srefs[1:]):
        if outer.loop.body is not inner.node:
            where = (
                "is nested deeper under"
                if outer.is_ancestor_of(inner)
                else "is not nested under"
            )
            raise ScheduleError(
                f"fuse: loop {_loop_name(inner)!r} {where} {_loop_name(outer)!r}; only "
                "adjacent loops, each the whole body of the previous one, can be fused "
                "(list them outermost first)"
            )
    loops = [s.loop for s in srefs]
    for lp in loops:
        _refuse_bound("fuse", lp)
    fused_vars = {lp.loop_var for lp in loops}
    for lp in loops[1:]:
        if uses_any((lp.min, lp.extent), fused_vars):
            raise ScheduleError(
                f"fuse: the bounds of loop {lp.loop_var.name!r} depend on another fused loop"
            )
    dtype = max((lp.loop_var.dtype for lp in loops), key=lambda d: d.bits)
    ana = analyzer_at(index, srefs[0], include_self=False)
    extents = [lp.extent if lp.extent.dtype == dtype else lp.extent.astype(dtype) for lp in loops]
    fused = Var("_".join(names) + "_fused", dtype)
    vmap: dict[Var, PrimExpr] = {}
    inner_prod: PrimExpr = const(dtype, 1)
    for k in range(len(loops) - 1, -1, -1):
        lp = loops[k]
        e: PrimExpr = fused
        if k < len(loops) - 1:
            e = e // inner_prod
        if k > 0:
            e = e % extents[k]
        if lp.loop_var.dtype != dtype:
            e = e.astype(lp.loop_var.dtype)
        vmap[lp.loop_var] = e + lp.min
        inner_prod = ana.simplify(inner_prod * extents[k])
    body = substitute(loops[-1].body, vmap)
    stmt = simplify_stmt(For(fused, const(dtype, 0), inner_prod, ForKind.SERIAL, body), ana)
    return rewrite_func(index.func, {id(loops[0]): stmt}), fused


def reorder(index: TreeIndex, srefs: Sequence[SRef]) -> PrimFunc:
    """Permute loops of one chain into the given order (outermost first)."""
    if len(srefs) < 2:
        raise ScheduleError("reorder: needs at least two loops")
    names = [_loop_name(s) for s in srefs]
    if len({id(s) for s in srefs}) != len(srefs):
        raise ScheduleError(f"reorder: a loop is listed twice in {names}")
    by_order = sorted(srefs, key=lambda s: s.order)
    for a, b in zip(by_order, by_order[1:]):
        if not a.is_ancestor_of(b):
            raise ScheduleError(
                f"reorder: loops {_loop_name(a)!r} and {_loop_name(b)!r} are not in one chain "
                "of nested loops"
            )
    outer, inner = by_order[0], by_order[-1]
    chain: list[For] = [outer.loop]
    while chain[-1] is not inner.node:
        body = chain[-1].body
        if not isinstance(body, For):
            raise ScheduleError(
                f"reorder: loop {chain[-1].loop_var.name!r} between {_loop_name(outer)!r} and "
                f"{_loop_name(inner)!r} has a body other than a single loop; only a perfectly "
                "nested chain can be reordered"
            )
        chain.append(body)
    positions = [i for i, lp in enumerate(chain) if any(lp is s.node for s in srefs)]
    new_chain = list(chain)
    for pos, s in zip(positions, srefs):
        new_chain[pos] = s.loop
    for p, lp in enumerate(new_chain):
        inner_vars = {x.loop_var for x in new_chain[p:]}
        if uses_any((lp.min, lp.extent), inner_vars):
            dep = [v.name for v in collect_vars((lp.min, lp.extent)) if v in inner_vars]
            raise ScheduleError(
                f"reorder: the bounds of loop {lp.loop_var.name!r} use {dep}, which would be "
                "defined inside it"
            )
    stmt: Stmt = inner.loop.body
    for lp in reversed(new_chain):
        stmt = lp.replace(body=stmt)
    return rewrite_func(index.func, {id(outer.node): stmt})


_KIND_NAMES = {
    ForKind.PARALLEL: "parallel",
    ForKind.VECTORIZED: "vectorize",
    ForKind.UNROLLED: "unroll",
    ForKind.SERIAL: "serial",
    ForKind.THREAD_BINDING: "bound to a thread index",
}


def set_kind(index: TreeIndex, sref: SRef, kind: ForKind) -> PrimFunc:
    """Mark a loop parallel / vectorized / unrolled, after checking it may be."""
    loop = sref.loop
    what = _KIND_NAMES[kind]
    if loop.kind == ForKind.THREAD_BINDING:
        raise ScheduleError(f"{what}: loop {loop.loop_var.name!r} is bound to "
                            f"{loop.annotations.get(THREAD_TAG)}")
    if kind in (ForKind.PARALLEL, ForKind.VECTORIZED):
        for block, iter_type in bound_iter_types(loop, index.blocks_under(sref)):
            if iter_type != IterType.DATA_PAR:
                kind_name = (
                    "a reduction" if iter_type == IterType.COMM_REDUCE else iter_type.name
                )
                raise ScheduleError(
                    f"{what}: loop {loop.loop_var.name!r} is bound to {kind_name} iteration "
                    f"variable of block {block!r}; its iterations are not independent"
                )
    if kind == ForKind.VECTORIZED and as_int(loop.extent) is None:
        raise ScheduleError(
            f"vectorize: loop {loop.loop_var.name!r} has extent {loop.extent}, not a constant; "
            "split it by a constant factor first"
        )
    if kind == ForKind.VECTORIZED and as_int(loop.extent) <= 0:  # type: ignore[operator]
        raise ScheduleError(f"vectorize: loop {loop.loop_var.name!r} has an empty extent")
    if loop.kind == kind:
        return index.func
    return rewrite_func(index.func, {id(loop): loop.replace(kind=kind)})


def bind(index: TreeIndex, sref: SRef, tag: str) -> PrimFunc:
    """Run a loop's iterations on GPU threads or blocks (``tag``: ``threadIdx.x``...).

    The loop must be serial. A loop bound to ``blockIdx.*`` must be data parallel (every block
    under it binds its variable to spatial iteration variables only); a loop bound to
    ``threadIdx.*`` may also carry a reduction, which lowering turns into a cross-thread
    reduction (``kiln.tir.transform.cross_thread_reduction``). A thread index drives one loop
    per nest: no loop above or below may be bound to the same tag, except a *cooperative copy*
    below a ``threadIdx`` loop (see :func:`check_shared_copy`). Extents are checked against
    the target's limits when the function is lowered.
    """
    tag = check_tag(tag)
    loop = sref.loop
    name = loop.loop_var.name
    if loop.kind == ForKind.THREAD_BINDING:
        have = loop.annotations.get(THREAD_TAG)
        if have == tag:
            return index.func
        raise ScheduleError(f"bind: loop {name!r} is already bound to {have}")
    if loop.kind != ForKind.SERIAL:
        raise ScheduleError(f"bind: loop {name!r} is {_KIND_NAMES[loop.kind]}, not serial; only "
                            "a serial loop can be bound to a thread index")
    for block, iter_type in bound_iter_types(loop, index.blocks_under(sref)):
        if iter_type == IterType.DATA_PAR:
            continue
        if iter_type == IterType.COMM_REDUCE and is_thread_tag(tag):
            continue  # a cross-thread reduction
        kind_name = "a reduction" if iter_type == IterType.COMM_REDUCE else iter_type.name
        raise ScheduleError(
            f"bind: loop {name!r} is bound to {kind_name} iteration variable of block "
            f"{block!r}; only threadIdx loops may carry a reduction (a cross-thread reduction)")
    above = [s for s in index.ancestors(sref) if not s.is_block]
    below = [s for s in index.loops.values() if sref.is_ancestor_of(s)]
    for other in above + below:
        lp = other.loop
        if lp.kind == ForKind.THREAD_BINDING and lp.annotations.get(THREAD_TAG) == tag:
            if other in above and is_thread_tag(tag):
                check_shared_copy(index, sref, other, tag)
                continue
            raise ScheduleError(
                f"bind: loop {lp.loop_var.name!r} of the same nest is already bound to {tag}; a "
                "thread index drives one loop per nest")
    ann = dict(loop.annotations)
    ann[THREAD_TAG] = tag
    new = loop.replace(kind=ForKind.THREAD_BINDING, annotations=ann)
    return rewrite_func(index.func, {id(loop): new})


def check_shared_copy(index: TreeIndex, sref: SRef, outer: SRef, tag: str) -> None:
    """Allow binding loop ``sref`` to ``tag`` below ``outer``, a loop bound to the same tag.

    Read one after the other, the loops mean: every thread of ``outer`` runs the whole nest
    of ``sref``. When that nest only copies data into ``shared`` memory and does not depend on
    ``outer``'s variable, every thread makes the same copy, so the threads of a GPU block may
    divide it among them instead: bound to the same thread index, each thread copies the
    iterations of ``sref`` matching its index (lowering gives both loops the index, and
    inserts the barrier before the threads read the copy). This is how a GEMM's threads load
    its shared tiles together. ``sref`` must not have more iterations than ``outer`` has
    threads (constant extents), else some iterations would have no thread.
    """
    inner_loop, outer_loop = sref.loop, outer.loop
    name, oname = inner_loop.loop_var.name, outer_loop.loop_var.name
    why = (f"bind: loop {oname!r} of the same nest is already bound to {tag}; a thread index "
           f"drives one loop per nest, except a copy into shared memory the threads share "
           f"(loop {name!r})")
    blocks = index.blocks_under(sref)
    if not blocks:
        raise ScheduleError(f"{why}, and loop {name!r} holds no block")
    for b in blocks:
        realize = b.node
        assert isinstance(realize, BlockRealize)
        bad = [w.buffer for w in realize.block.writes if w.buffer.scope != "shared"]
        if bad:
            raise ScheduleError(f"{why}; block {realize.block.name_hint!r} writes "
                                f"{bad[0].name!r} (scope {bad[0].scope!r})")
        uses = collect_vars((*realize.iter_values, realize.predicate))
        loops = [a.loop for a in index.ancestors(b) if not a.is_block and outer.is_ancestor_of(a)]
        uses += collect_vars(tuple(x for lp in loops for x in (lp.min, lp.extent)))
        if any(v is outer_loop.loop_var for v in uses):
            raise ScheduleError(f"{why}; block {realize.block.name_hint!r} depends on "
                                f"{oname!r}, so the threads' copies differ")
    n_inner, n_outer = as_int(inner_loop.extent), as_int(outer_loop.extent)
    if n_inner is None or n_outer is None or n_inner > n_outer:
        raise ScheduleError(f"{why}; loop {name!r} has {inner_loop.extent} iterations and "
                            f"{oname!r} {outer_loop.extent} threads (constants, the first at "
                            "most the second)")


def annotate(index: TreeIndex, sref: SRef, key: str, value: Any) -> PrimFunc:
    """Attach ``key: value`` to a block's or a loop's annotations."""
    if not isinstance(key, str) or not key:
        raise ScheduleError(f"annotate: key must be a non-empty string, got {key!r}")
    if isinstance(value, (list, tuple)):
        value = tuple(value)
    elif not isinstance(value, (str, int, float, bool, PrimExpr)) and value is not None:
        raise ScheduleError(
            f"annotate: value {value!r} must be a str, int, float, bool, PrimExpr or a tuple"
        )
    if sref.is_block:
        realize = sref.node
        assert isinstance(realize, BlockRealize)
        ann = dict(realize.block.annotations)
        ann[key] = value
        new: Stmt = realize.replace(block=realize.block.replace(annotations=ann))
    else:
        ann = dict(sref.loop.annotations)
        ann[key] = value
        new = sref.loop.replace(annotations=ann)
    return rewrite_func(index.func, {id(sref.node): new})
