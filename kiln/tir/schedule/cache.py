"""cache_read and cache_write: stage a buffer through a copy in another storage scope.

``cache_read(B, i, scope)`` makes block ``B`` read its ``i``-th read buffer from a new buffer of
``scope`` (same shape), filled by a new copy block placed before ``B``. ``cache_write(B, i,
scope)`` makes ``B`` (body and init) write its ``i``-th write buffer into a new buffer, copied
back to the original by a new block placed after ``B``. Both return the copy block's name.

Placement: when ``B`` and the blocks on the other side of the copy (the writers of the buffer
for cache_read, its readers for cache_write) share no loop, the copy is a stage of its own next
to ``B``'s top-level loop nest and covers the whole buffer; ``compute_at`` /
``reverse_compute_at`` of the copy block then shrink what each iteration copies. When they
share loops (``B`` was already moved under a consumer), the copy goes inside the deepest shared
loop, next to the subtree holding ``B``, and covers what ``B`` accesses in one iteration of it.

``cache_write(B, i, scope, dtype)`` with a wider float ``dtype`` also makes ``B`` compute what
it stores in that dtype (:func:`widen`), converted once by the copy back: a float16 GEMM's
accumulator in float32 registers.

``cache_inplace(B, i, scope, L)`` stages a buffer that ``B`` both reads and writes (a reduction's
update after ``decompose_reduction``): inside loop ``L`` the region ``B`` touches in one
iteration is copied into a ``scope`` buffer before the subtree holding ``B`` and back after it.
That is how a K-blocked GEMM keeps its register tile: the tile is reloaded from the output and
stored back once per block of the reduction, while the reduction loop stays outside the tile.
"""

from __future__ import annotations

from typing import Any

from ...ir.dtype import DataType, as_dtype
from ...ir.errors import ScheduleError
from ..buffer import Buffer, BufferRegion
from ..expr import (
    Add,
    BufferLoad,
    Cast,
    FloatImm,
    IntImm,
    IterType,
    IterVar,
    Max,
    Min,
    Mul,
    PrimExpr,
    Range,
    Sub,
    Var,
    cast,
    const,
)
from ..function import PrimFunc
from ..functor import Mutator
from ..stmt import Block, BlockRealize, BufferStore, SeqStmt, Stmt
from .analysis import analyzer_at, check_block, new_analyzer, point_region
from .compute_location import accessed_region, iter_var_ranges, regenerate
from .state import (
    SRef,
    TreeIndex,
    buffer_names,
    rewrite_func,
    unique_name,
    update_root_allocs,
)


class _SwapBuffer(Mutator):
    def __init__(self, old: Buffer, new: Buffer):
        self.old, self.new = old, new

    def visit_Buffer(self, b: Buffer) -> Buffer:
        return self.new if b is self.old else b


def _check_scope(scope: object, what: str) -> str:
    if not isinstance(scope, str) or not scope or not scope.replace(".", "_").isidentifier():
        raise ScheduleError(f"{what}: storage scope {scope!r} is not a valid scope name")
    return scope


def _copy_block(src: Buffer, dst: Buffer, name: str) -> Block:
    """A block copying ``src`` to ``dst`` element-wise over the whole buffer (converting the
    elements where their dtypes differ)."""
    iter_vars = [
        IterVar(Range(const(e.dtype, 0), e), Var(f"v{d}", e.dtype), IterType.DATA_PAR)
        for d, e in enumerate(src.shape)
    ]
    idx = tuple(iv.var for iv in iter_vars)
    return Block(
        iter_vars=tuple(iter_vars),
        reads=(point_region(src, idx),),
        writes=(point_region(dst, idx),),
        name_hint=name,
        body=BufferStore(dst, cast(dst.dtype, BufferLoad(src, idx)), idx),
    )


def _place_copy(
    index: TreeIndex, sref: SRef, others: list[SRef], buf: Buffer, copy: Block,
    writes: bool, what: str,
) -> tuple[Stmt, SRef]:
    """The copy block's loop nest and the statement it goes next to.

    The copy goes next to the subtree holding ``sref`` inside the deepest loop shared with
    ``others`` (the blocks on the other side of the copy); it covers what ``sref`` accesses of
    ``buf`` in one iteration of that loop, or the whole buffer at the top level.
    """
    scope = index.scope_of(sref)
    lca = index.lowest_common_ancestor([sref, *others]) if others else scope
    if lca.is_block:
        anchor = index.child_containing(scope, sref)
        return regenerate(copy, {}, False, new_analyzer()), anchor
    ana = analyzer_at(index, lca)
    region = accessed_region(index, lca, [sref], buf, writes, ana, what)
    ranges = iter_var_ranges(copy, [(buf, region)], writes, ana, what)
    return regenerate(copy, ranges, False, ana), index.child_containing(lca, sref)


def _commit(index: TreeIndex, realize: BlockRealize, new_realize: BlockRealize, anchor: SRef,
            before: Stmt | None = None, after: Stmt | None = None) -> PrimFunc:
    """Replace ``realize`` by ``new_realize`` and put ``before``/``after`` around ``anchor``."""
    func = rewrite_func(index.func, {id(realize): new_realize})
    anchor2 = TreeIndex(func).lookup(anchor.key)
    assert anchor2 is not None
    seq = tuple(x for x in (before, anchor2.node, after) if x is not None)
    return rewrite_func(func, {id(anchor2.node): SeqStmt(seq)})


def _new_cache(index: TreeIndex, buf: Buffer, scope: str, dtype: DataType | None = None
               ) -> tuple[Buffer, str]:
    cache = Buffer(
        unique_name(f"{buf.name}_{scope.replace('.', '_')}", buffer_names(index.func)),
        buf.shape, dtype or buf.dtype, None, (), None, scope,
    )
    name = unique_name(cache.name, index.taken_names())
    return cache, name


def _swap_in_block(block: Block, old: Buffer, new: Buffer) -> Block:
    m = _SwapBuffer(old, new)
    return block.replace(
        body=m.visit(block.body),
        init=m.visit(block.init),
        reads=tuple(
            BufferRegion(new, r.region) if r.buffer is old else r for r in block.reads
        ),
        writes=tuple(
            BufferRegion(new, r.region) if r.buffer is old else r for r in block.writes
        ),
    )


_WIDENED_OPS = (Add, Sub, Mul, Min, Max)


class _Narrow(Mutator):
    """Loads of ``old``, the buffer a wider ``cache`` replaces, made loads of the cache
    converted back to ``old``'s dtype."""

    def __init__(self, old: Buffer, cache: Buffer):
        self.old, self.cache = old, cache

    def visit_BufferLoad(self, n: BufferLoad) -> PrimExpr:
        if n.buffer is not self.old:
            return self.generic_visit(n)
        return cast(self.old.dtype, BufferLoad(self.cache, self.visit(n.indices)))


def widen(e: PrimExpr, old: Buffer, cache: Buffer) -> PrimExpr:
    """``e``, an expression stored into ``old``, computed in the wider dtype of ``cache``
    (which replaces ``old``): the additions, products, min and max of ``old``'s dtype
    (an accumulation ``acc + a * b``) widened down to their leaves, the leaves converted.
    This is what makes a float16 GEMM sum its products in float32."""
    narrow = _Narrow(old, cache)
    if isinstance(e, BufferLoad) and e.buffer is old:
        return BufferLoad(cache, narrow.visit(e.indices))
    if e.dtype != old.dtype:
        return narrow.visit(e)
    if isinstance(e, _WIDENED_OPS):
        return type(e)(widen(e.a, old, cache), widen(e.b, old, cache))
    if isinstance(e, Cast):
        return cast(cache.dtype, narrow.visit(e.value))
    if isinstance(e, (FloatImm, IntImm)):
        return const(cache.dtype, e.value)
    return cast(cache.dtype, narrow.visit(e))


class _Widen(Mutator):
    """Stores into ``old`` made stores into the wider ``cache``, their values computed in its
    dtype (:func:`widen`); every other load of ``old`` a converted load of the cache."""

    def __init__(self, old: Buffer, cache: Buffer):
        self.old, self.cache = old, cache

    def visit_BufferStore(self, n: BufferStore) -> Stmt:
        if n.buffer is not self.old:
            return self.generic_visit(n)
        return BufferStore(self.cache, widen(n.value, self.old, self.cache),
                           _Narrow(self.old, self.cache).visit(n.indices))

    def visit_BufferLoad(self, n: BufferLoad) -> PrimExpr:
        return _Narrow(self.old, self.cache).visit(n)


def _check_widening(buf: Buffer, dtype: Any, what: str) -> DataType | None:
    """The cache's dtype: None (``buf``'s) or a float dtype at least as wide as ``buf``'s
    float dtype."""
    if dtype is None:
        return None
    try:
        dt = as_dtype(dtype)
    except Exception as e:  # noqa: BLE001 - any unparsable dtype is the caller's error
        raise ScheduleError(f"{what}: {dtype!r} is not a dtype ({e})") from None
    old = buf.dtype
    if dt == old:
        return None
    if not (old.is_float and dt.is_float and dt.lanes == old.lanes == 1 and dt.bits >= old.bits):
        raise ScheduleError(
            f"{what}: {buf.name!r} ({old}) cannot be accumulated in {dt}: only a float buffer, "
            "in a float dtype at least as wide")
    return dt


def _region_buffer(regions: Any, index: Any, kind: str, what: str, block_name: str) -> Any:
    """The buffer of ``regions[index]`` (a block's reads or writes), or a ScheduleError."""
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(regions):
        listing = ", ".join(f"{k}: {r.buffer.name}" for k, r in enumerate(regions))
        raise ScheduleError(
            f"{what}: {kind}_buffer_index {index!r} is out of range for block "
            f"{block_name!r}, which {kind}s {len(regions)} region(s) ({listing})"
        )
    return regions[index].buffer


def _staged_buffer(index: TreeIndex, sref: SRef, regions: str, buffer_index: Any,
                   scope: str, what: str) -> tuple[Block, str, Buffer]:
    """The checks every cache primitive starts with; returns ``sref``'s block, its name and
    the buffer of its ``regions`` (``"reads"`` or ``"writes"``) at ``buffer_index``."""
    check_block(index, sref, what)
    _check_scope(scope, what)
    block = sref.block
    name = block.name_hint
    kind = regions[:-1]
    return block, name, _region_buffer(getattr(block, regions), buffer_index, kind, what, name)


def _swap_and_commit(index: TreeIndex, sref: SRef, buf: Buffer, cache: Buffer, anchor: Any,
                     before: Any = None, after: Any = None) -> PrimFunc:
    """``sref``'s block reading and writing ``cache`` instead of ``buf``, the copy nests
    ``before``/``after`` placed around ``anchor``, and ``cache`` allocated at the root."""
    realize = sref.node
    assert isinstance(realize, BlockRealize)
    block = sref.block
    if cache.dtype != buf.dtype:
        m = _Widen(buf, cache)
        block = block.replace(body=m.visit(block.body), init=m.visit(block.init))
    block = _swap_in_block(block, buf, cache)
    new_realize = realize.replace(block=block)
    func = _commit(index, realize, new_realize, anchor, before=before, after=after)
    return update_root_allocs(func, add=(cache,))


def cache_read(index: TreeIndex, sref: SRef, read_buffer_index: int, scope: str
               ) -> tuple[PrimFunc, str]:
    what = "cache_read"
    block, name, buf = _staged_buffer(index, sref, "reads", read_buffer_index, scope, what)
    if any(w.buffer is buf for w in block.writes):
        raise ScheduleError(f"{what}: block {name!r} also writes {buf.name!r}")
    writers = [w for w in index.writers(buf, index.scope_of(sref)) if w is not sref]
    for w in writers:
        if w.order > sref.order:
            raise ScheduleError(
                f"{what}: {buf.name!r} is written by block {w.block.name_hint!r} after "
                f"{name!r} reads it"
            )
    cache, cname = _new_cache(index, buf, scope)
    nest, anchor = _place_copy(index, sref, writers, buf, _copy_block(buf, cache, cname),
                               False, what)
    return _swap_and_commit(index, sref, buf, cache, anchor, before=nest), cname


def cache_write(index: TreeIndex, sref: SRef, write_buffer_index: int, scope: str,
                dtype: Any = None) -> tuple[PrimFunc, str]:
    what = "cache_write"
    _, name, buf = _staged_buffer(index, sref, "writes", write_buffer_index, scope, what)
    scope_sref = index.scope_of(sref)
    for w in index.writers(buf, scope_sref):
        if w is not sref:
            raise ScheduleError(
                f"{what}: {buf.name!r} is also written by block {w.block.name_hint!r} (apply "
                "cache_write before decompose_reduction)"
            )
    readers = [r for r in index.readers(buf, scope_sref) if r is not sref]
    for r in readers:
        if r.order < sref.order:
            raise ScheduleError(
                f"{what}: block {r.block.name_hint!r} reads {buf.name!r} before {name!r} "
                "writes it"
            )
    cache, cname = _new_cache(index, buf, scope, _check_widening(buf, dtype, what))
    nest, anchor = _place_copy(index, sref, readers, buf, _copy_block(cache, buf, cname),
                               True, what)
    return _swap_and_commit(index, sref, buf, cache, anchor, after=nest), cname


def cache_inplace(index: TreeIndex, sref: SRef, read_buffer_index: int, scope: str, loop: SRef
                  ) -> tuple[PrimFunc, str, str]:
    """Stage the buffer ``sref`` reads and writes through a ``scope`` copy inside ``loop``;
    returns the new function and the names of the read and the write copy blocks."""
    what = "cache_inplace"
    block, name, buf = _staged_buffer(index, sref, "reads", read_buffer_index, scope, what)
    if not any(w.buffer is buf for w in block.writes):
        raise ScheduleError(f"{what}: block {name!r} reads {buf.name!r} but does not write it")
    if not any(lp is loop for lp in index.loops_above(sref)):
        raise ScheduleError(
            f"{what}: loop {loop.loop.loop_var.name!r} is not a loop above block {name!r}"
        )
    scope_sref = index.scope_of(sref)
    for other in index.readers(buf, scope_sref) + index.writers(buf, scope_sref):
        if other is not sref and loop.is_ancestor_of(other):
            raise ScheduleError(
                f"{what}: block {other.block.name_hint!r} also accesses {buf.name!r} inside "
                f"loop {loop.loop.loop_var.name!r}; the copy would hide its accesses"
            )
    ana = analyzer_at(index, loop)
    region = accessed_region(index, loop, [sref], buf, True, ana, what)
    read_region = accessed_region(index, loop, [sref], buf, False, ana, what)
    if any(not (ana.can_prove(r[0] >= w[0]) and ana.can_prove(r[1] <= w[1]))
           for r, w in zip(read_region, region)):
        raise ScheduleError(
            f"{what}: block {name!r} reads a part of {buf.name!r} it does not write; "
            "cache_inplace stages an accumulator updated in place"
        )
    cache, rname = _new_cache(index, buf, scope)
    wname = unique_name(f"{rname}_wb", index.taken_names() | {rname})
    read_copy = _copy_block(buf, cache, rname)
    write_copy = _copy_block(cache, buf, wname)
    read_nest = regenerate(
        read_copy, iter_var_ranges(read_copy, [(buf, region)], False, ana, what), False, ana)
    write_nest = regenerate(
        write_copy, iter_var_ranges(write_copy, [(buf, region)], True, ana, what), False, ana)
    anchor = index.child_containing(loop, sref)
    func = _swap_and_commit(index, sref, buf, cache, anchor, before=read_nest, after=write_nest)
    return func, rname, wname
