"""Analyses shared by the schedule primitives.

- an :class:`~kiln.arith.Analyzer` that knows the ranges of the loops around a point of the tree,
  used to keep the index expressions the primitives create simplified and to prove facts;
- symbolic interval evaluation (:func:`eval_bound`), used to compute the part of a buffer a
  group of blocks needs or produces inside one iteration of a loop (compute_at);
- inference of a block's read/write regions from its body (after a primitive rewrote it);
- small helpers on predicates, bindings and reduction loops.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from ...arith import Analyzer
from ...ir.errors import ScheduleError
from ...ir.node import Node, structural_equal, structural_hash
from ..buffer import Buffer, BufferRegion
from ..expr import (
    Add,
    And,
    BufferLoad,
    Cast,
    FloorDiv,
    FloorMod,
    IntImm,
    IterType,
    Max,
    Min,
    Mul,
    PrimExpr,
    Range,
    Sub,
    Var,
    cast,
    const,
    logical_and,
)
from ..functor import collect_vars, post_order_visit, substitute
from ..stmt import Block, BlockRealize, BufferStore, For, SeqStmt, Stmt
from .state import SRef, TreeIndex

# ---------------------------------------------------------------------------------------------
# arithmetic
# ---------------------------------------------------------------------------------------------


def new_analyzer(loops: Iterable[For] = ()) -> Any:
    """An Analyzer with each loop variable bound to its range."""
    ana = Analyzer()
    for loop in loops:
        bind_loop(ana, loop)
    return ana


def bind_loop(ana: Any, loop: For) -> None:
    ana.bind(loop.loop_var, Range(loop.min, loop.extent))


def analyzer_at(index: TreeIndex, sref: SRef, include_self: bool = True) -> Any:
    """An Analyzer knowing every loop above ``sref`` (and ``sref`` itself if it is a loop)."""
    loops = [a.loop for a in index.ancestors(sref) if not a.is_block]
    if include_self and not sref.is_block:
        loops.append(sref.loop)
    return new_analyzer(loops)


def as_int(e: Any) -> int | None:
    """The Python int of an integer immediate, else None."""
    if isinstance(e, int) and not isinstance(e, bool):
        return e
    if isinstance(e, IntImm) and not e.dtype.is_bool:
        return e.value
    return None


def is_one(e: PrimExpr) -> bool:
    return as_int(e) == 1


def is_true(e: PrimExpr) -> bool:
    return isinstance(e, IntImm) and e.dtype.is_bool and e.value == 1


def conjoin(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """``a && b`` without a redundant literal ``True``."""
    if is_true(a):
        return b
    if is_true(b):
        return a
    return logical_and(a, b)


def conjuncts(e: PrimExpr) -> list[PrimExpr]:
    if isinstance(e, And):
        return conjuncts(e.a) + conjuncts(e.b)
    return [] if is_true(e) else [e]


def uses_any(node: Any, variables: Iterable[Var]) -> bool:
    vs = set(variables)
    return any(v in vs for v in collect_vars(node))


def simplify_stmt(stmt: Stmt, ana: Any) -> Stmt:
    """Simplify loop bounds, block bindings and predicates in ``stmt`` (not block bodies).

    Loop variables are bound in ``ana`` as their loops are entered (each loop variable is unique
    in a scheduled function, so one analyzer serves the whole walk).
    """
    if isinstance(stmt, For):
        lo, ext = ana.simplify(stmt.min), ana.simplify(stmt.extent)
        loop = stmt.replace(min=lo, extent=ext)
        bind_loop(ana, loop)
        return loop.replace(body=simplify_stmt(stmt.body, ana))
    if isinstance(stmt, BlockRealize):
        values = tuple(ana.simplify(v) for v in stmt.iter_values)
        pred = ana.simplify(stmt.predicate)
        block = stmt.block
        if not isinstance(block.body, BufferStore):
            block = block.replace(body=simplify_stmt(block.body, ana))
        return stmt.replace(iter_values=values, predicate=pred, block=block)
    if isinstance(stmt, SeqStmt):
        return SeqStmt(tuple(simplify_stmt(s, ana) for s in stmt.seq))
    return stmt


# ---------------------------------------------------------------------------------------------
# symbolic interval evaluation
# ---------------------------------------------------------------------------------------------
Bound = tuple[PrimExpr, PrimExpr]  # inclusive [lo, hi]


def eval_bound(expr: PrimExpr, dom: dict[Var, Bound], ana: Any) -> Bound | None:
    """Inclusive bounds of ``expr`` when each var of ``dom`` ranges over its bound.

    Variables not in ``dom`` stay symbolic (the result is an expression of them). Returns None
    when the expression is beyond this evaluator (a data-dependent index, a division by a
    non-constant, ...), which callers report as a region they cannot determine.
    """
    if not uses_any(expr, dom):
        return expr, expr
    r = _eval(expr, dom, ana)
    if r is None:
        return None
    return ana.simplify(r[0]), ana.simplify(r[1])


def _eval(e: PrimExpr, dom: dict[Var, Bound], ana: Any) -> Bound | None:
    if isinstance(e, Var):
        return dom.get(e, (e, e))
    if isinstance(e, IntImm) or not uses_any(e, dom):
        return e, e
    if isinstance(e, (Add, Sub)):
        a, b = _eval(e.a, dom, ana), _eval(e.b, dom, ana)
        if a is None or b is None:
            return None
        if isinstance(e, Add):
            return a[0] + b[0], a[1] + b[1]
        return a[0] - b[1], a[1] - b[0]
    if isinstance(e, Mul):
        a, b = _eval(e.a, dom, ana), _eval(e.b, dom, ana)
        if a is None or b is None:
            return None
        for x, c in ((a, e.b), (b, e.a)):
            k = as_int(ana.simplify(c)) if not uses_any(c, dom) else None
            if k is not None:
                return (x[0] * k, x[1] * k) if k >= 0 else (x[1] * k, x[0] * k)
        products = [a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]]
        lo = products[0]
        hi = products[0]
        for p in products[1:]:
            lo, hi = Min(lo, p), Max(hi, p)
        return lo, hi
    if isinstance(e, (FloorDiv, FloorMod)):
        k = as_int(ana.simplify(e.b)) if not uses_any(e.b, dom) else None
        a = _eval(e.a, dom, ana)
        if k is None or k == 0 or a is None:
            return None
        if isinstance(e, FloorDiv):
            lo, hi = FloorDiv(a[0], e.b), FloorDiv(a[1], e.b)
            return (lo, hi) if k > 0 else (hi, lo)
        if k < 0:
            return None
        # One period: the modulo is monotone between the bounds.
        if ana.can_prove(FloorDiv(a[0], e.b).equal(FloorDiv(a[1], e.b))):
            return FloorMod(a[0], e.b), FloorMod(a[1], e.b)
        return const(e.dtype, 0), const(e.dtype, k - 1)
    if isinstance(e, (Min, Max)):
        a, b = _eval(e.a, dom, ana), _eval(e.b, dom, ana)
        if a is None or b is None:
            return None
        op = Min if isinstance(e, Min) else Max
        return op(a[0], b[0]), op(a[1], b[1])
    if isinstance(e, Cast) and e.dtype.is_integer and e.value.dtype.is_integer:
        a = _eval(e.value, dom, ana)
        if a is None:
            return None
        return cast(e.dtype, a[0]), cast(e.dtype, a[1])
    return None


def union_bound(a: Bound, b: Bound, ana: Any) -> Bound:
    """The smallest interval holding both (symbolic min/max when the order is unknown)."""
    if ana.can_prove(a[0] <= b[0]):
        lo = a[0]
    elif ana.can_prove(b[0] <= a[0]):
        lo = b[0]
    else:
        lo = ana.simplify(Min(a[0], b[0]))
    if ana.can_prove(a[1] >= b[1]):
        hi = a[1]
    elif ana.can_prove(b[1] >= a[1]):
        hi = b[1]
    else:
        hi = ana.simplify(Max(a[1], b[1]))
    return lo, hi


def loop_domains(chain: Sequence[SRef], ana: Any) -> dict[Var, Bound] | None:
    """Bounds of the loop variables of ``chain`` (outermost first), each relaxed over the
    loops above it in the chain."""
    dom: dict[Var, Bound] = {}
    for s in chain:
        loop = s.loop
        lo = eval_bound(loop.min, dom, ana)
        last = eval_bound(loop.min + loop.extent - 1, dom, ana)
        if lo is None or last is None:
            return None
        dom[loop.loop_var] = (lo[0], last[1])
    return dom


def region_bounds(
    region: BufferRegion, realize: BlockRealize, dom: dict[Var, Bound], ana: Any
) -> list[Bound] | None:
    """Per dimension, the bounds of ``region`` (stated on the block's iter vars) over ``dom``."""
    vmap = {iv.var: v for iv, v in zip(realize.block.iter_vars, realize.iter_values)}
    out: list[Bound] = []
    for rng in region.region:
        lo = eval_bound(substitute(rng.min, vmap), dom, ana)
        hi = eval_bound(substitute(rng.min + rng.extent - 1, vmap), dom, ana)
        if lo is None or hi is None:
            return None
        out.append((lo[0], hi[1]))
    return out


# ---------------------------------------------------------------------------------------------
# access regions
# ---------------------------------------------------------------------------------------------
def point_region(buffer: Buffer, indices: Sequence[PrimExpr]) -> BufferRegion:
    """The one-element region at ``indices`` (the form of block regions made by ``te``)."""
    region = []
    for idx in indices:
        dt = idx.dtype.element if idx.dtype.element.is_integer else None
        region.append(Range(idx, const(dt or "int64", 1)))
    return BufferRegion(buffer, tuple(region))


def infer_regions(block: Block) -> tuple[tuple[BufferRegion, ...], tuple[BufferRegion, ...]]:
    """Reads and writes of ``block`` from its body: one point region per distinct access.

    Order is first use. As for blocks made by ``te``, a reduction block (one with ``init``) does
    not list the read of its own accumulator (the element it stores to) among its reads.
    """
    stores: list[BufferStore] = []
    loads: list[BufferLoad] = []

    def f(n: Node) -> None:
        if isinstance(n, BufferStore):
            stores.append(n)
        elif isinstance(n, BufferLoad):
            loads.append(n)

    if block.init is not None:
        post_order_visit(block.init, f)
    post_order_visit(block.body, f)
    store_keys = [(s.buffer, s.indices) for s in stores]
    writes = _dedup(store_keys)
    load_keys = [(ld.buffer, ld.indices) for ld in loads]
    if block.init is not None:
        load_keys = [k for k in load_keys if not any(_same_access(k, w) for w in writes)]
    reads = _dedup(load_keys)
    return (
        tuple(point_region(b, idx) for b, idx in reads),
        tuple(point_region(b, idx) for b, idx in writes),
    )


def _same_access(a: tuple[Buffer, tuple], b: tuple[Buffer, tuple]) -> bool:
    return a[0] is b[0] and structural_equal(a[1], b[1], map_free_vars=False)


def _dedup(keys: list[tuple[Buffer, tuple]]) -> list[tuple[Buffer, tuple]]:
    out: list[tuple[Buffer, tuple]] = []
    by_hash: dict[int, list[tuple[Buffer, tuple]]] = {}
    for k in keys:
        h = hash((id(k[0]), structural_hash(k[1])))
        if any(_same_access(k, o) for o in by_hash.get(h, ())):
            continue
        by_hash.setdefault(h, []).append(k)
        out.append(k)
    return out


def region_buffers(regions: Iterable[BufferRegion]) -> list[Buffer]:
    out: list[Buffer] = []
    for r in regions:
        if not any(r.buffer is b for b in out):
            out.append(r.buffer)
    return out


# ---------------------------------------------------------------------------------------------
# loops and iteration kinds
# ---------------------------------------------------------------------------------------------
def bound_iter_types(loop: For, blocks: Iterable[SRef]) -> list[tuple[str, IterType]]:
    """(block name, iter type) of every block iter var whose binding uses ``loop``'s var."""
    out = []
    for b in blocks:
        realize = b.node
        assert isinstance(realize, BlockRealize)
        for iv, value in zip(realize.block.iter_vars, realize.iter_values):
            if loop.loop_var in collect_vars(value):
                out.append((realize.block.name_hint, iv.iter_type))
    return out


def reduction_loops_of(sref: SRef, loops: Iterable[SRef]) -> list[SRef]:
    """The loops among ``loops`` bound to a non-spatial iter var of block ``sref``."""
    realize = sref.node
    assert isinstance(realize, BlockRealize)
    used: set[Var] = set()
    for iv, value in zip(realize.block.iter_vars, realize.iter_values):
        if iv.iter_type != IterType.DATA_PAR:
            used.update(collect_vars(value))
    return [lp for lp in loops if lp.loop.loop_var in used]


def check_block(index: TreeIndex, sref: SRef, what: str) -> None:
    """Primitives never apply to the root block."""
    if sref is index.root:
        raise ScheduleError(f"{what}: cannot be applied to the root block")


def plain_store_vars(block: Block, store: BufferStore, what: str) -> list[Var]:
    """The store indices of ``block`` when each is a distinct iter var of the block."""
    iter_vars = [iv.var for iv in block.iter_vars]
    out: list[Var] = []
    for idx in store.indices:
        if not isinstance(idx, Var) or idx not in iter_vars or idx in out:
            raise ScheduleError(
                f"{what}: block {block.name_hint!r} stores to {store.buffer.name!r} at indices "
                "that are not distinct iteration variables of the block"
            )
        out.append(idx)
    return out
