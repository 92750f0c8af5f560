"""``Schedule``: checked, replayable transformations of a block-form PrimFunc.

A schedule holds the current function (``sch.func``) and hands out handles — :class:`BlockRV`
and :class:`LoopRV` — that keep pointing at the same block or loop while primitives rebuild the
(immutable) IR around it. A handle maps to an identity key (a block's name, a loop's variable;
both unique in the function), looked up in an index of the current tree. A handle becomes
invalid only when its node disappears (a split or fused loop, an inlined block, the old loops
of a block moved by compute_at); using it then raises :class:`~kiln.ir.ScheduleError`.

Every primitive checks its preconditions, builds the new function, and only then commits it, so
a refused request leaves the schedule unchanged. Successful calls (including the ``get_*``
queries that create handles) are recorded in :attr:`Schedule.trace`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ...ir.errors import ScheduleError
from ..function import PrimFunc
from ..stmt import Block, For, ForKind
from . import blockize as _blockize
from . import cache as _cache
from . import compute_location as _at
from . import inline as _inline
from . import loop_transform as _loops
from . import reduction as _reduction
from . import rfactor as _rfactor
from . import tensorize as _tensorize
from .state import Key, SRef, TreeIndex, make_unique
from .trace import RV, BlockRV, Instruction, LoopRV, Trace, make_instruction

F = TypeVar("F", bound=Callable[..., Any])


def _traced(method: F) -> F:
    """Record a successful top-level call of ``method`` in the schedule's trace."""
    sig = inspect.signature(method)
    varargs = next(
        (p.name for p in sig.parameters.values() if p.kind == inspect.Parameter.VAR_POSITIONAL),
        None,
    )

    @functools.wraps(method)
    def wrapper(self: Schedule, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(self, *args, **kwargs)
        except TypeError as e:
            raise ScheduleError(f"{method.__name__}: {e}") from None
        self._depth += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._depth -= 1
        if self._depth == 0:
            arguments = dict(bound.arguments)
            arguments.pop("self", None)
            self._trace.append(make_instruction(method.__name__, arguments, varargs, result))
        return result

    return wrapper  # type: ignore[return-value]


class Schedule:
    """Schedule of one PrimFunc in block form (see docs/internals.md, "kiln.tir.schedule")."""

    def __init__(self, func: PrimFunc):
        if not isinstance(func, PrimFunc):
            raise ScheduleError(f"Schedule needs a tir.PrimFunc, got {type(func).__name__}")
        self._index = TreeIndex(make_unique(func))
        self._names: set[str] = set(self._index.blocks)
        self._rvs: dict[int, tuple[RV, Key]] = {}
        self._trace = Trace()
        self._depth = 0
        #: The tuner's choices for the knobs of the schedule that runs on this one (name ->
        #: value); a knob not named takes its default (see :meth:`knob`).
        self.knob_values: dict[str, Any] = {}

    # -- state ---------------------------------------------------------------------------------
    @property
    def func(self) -> PrimFunc:
        """The current function."""
        return self._index.func

    @property
    def trace(self) -> Trace:
        """The instructions applied so far."""
        return self._trace

    def copy(self) -> Schedule:
        """An independent schedule in the same state; existing handles are valid in both."""
        other = Schedule.__new__(Schedule)
        other._index = self._index
        other._names = set(self._names)
        other._rvs = dict(self._rvs)
        other._trace = self._trace.copy()
        other._depth = 0
        other.knob_values = dict(self.knob_values)
        return other

    def adopt(self, other: Schedule) -> None:
        """Take over the state of ``other``, a :meth:`copy` of this schedule transformed
        further: how a caller tries transformations on a copy and keeps those that worked."""
        self._index = other._index
        self._names = set(other._names)
        self._rvs = dict(other._rvs)
        # knobs asked of this schedule while ``other`` was being transformed (the knob of the
        # active schedule, kiln.schedule.knobs) stay in the trace
        known = {id(inst) for inst in other._trace}
        asked = [inst for inst in self._trace if inst.kind == "knob" and id(inst) not in known]
        self._trace = other._trace.copy()
        for inst in asked:
            self._trace.append(inst)

    # -- knobs -------------------------------------------------------------------------------
    def knob(self, name: str, domain: Sequence[Any], default: Any, decision: Any = None) -> Any:
        """A tunable decision of the schedule: the value of knob ``name`` (one of ``domain``).

        The value is ``decision`` when given (a replayed trace), else the tuner's choice in
        :attr:`knob_values`, else ``default``. The call is recorded in the trace with the
        domain and the decision taken, so a trace says which point of the search space it is
        and replays to the same decisions. A name identifies one decision: asking again (a
        trial run on a copy, then the real one) gives the same value and records nothing new,
        so a helper that decides per block puts the block's name into the knob's.
        """
        domain = tuple(domain)
        if default not in domain:
            raise ScheduleError(f"knob {name!r}: default {default!r} is not in its domain "
                                f"{domain!r}")
        earlier = self.knob_decisions()
        if name in earlier and decision is None:
            return earlier[name]
        if decision is None:
            decision = self.knob_values.get(name, default)
        if decision not in domain:
            raise ScheduleError(f"knob {name!r}: value {decision!r} is not in its domain "
                                f"{domain!r}")
        args = (("name", name), ("domain", domain), ("default", default), ("decision", decision))
        self._trace.append(Instruction("knob", args, ()))
        return decision

    def knob_decisions(self) -> dict[str, Any]:
        """The knobs this schedule's trace took so far: name -> value."""
        return {a["name"]: a["decision"]
                for a in (dict(i.args) for i in self._trace if i.kind == "knob")}

    def _commit(self, func: PrimFunc) -> None:
        self._index = TreeIndex(func)
        self._names.update(self._index.blocks)

    def _index_for_new_names(self) -> TreeIndex:
        """The current index, with every name this schedule ever used reserved."""
        self._index.reserved_names = set(self._names)
        return self._index

    def _new_block_rv(self, name: str) -> BlockRV:
        rv = BlockRV()
        self._rvs[rv.uid] = (rv, ("block", name))
        return rv

    def _new_loop_rv(self, var: Any) -> LoopRV:
        rv = LoopRV()
        self._rvs[rv.uid] = (rv, ("loop", var))
        return rv

    def _rv_of(self, sref: SRef) -> BlockRV | LoopRV:
        if sref.is_block:
            return self._new_block_rv(sref.block.name_hint)
        return self._new_loop_rv(sref.loop.loop_var)

    def _sref(self, rv: Any, what: str, kinds: tuple[type, ...] = (BlockRV, LoopRV)) -> SRef:
        if not isinstance(rv, kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise ScheduleError(f"{what}: expected a {expected}, got {rv!r}")
        entry = self._rvs.get(rv.uid)
        if entry is None:
            raise ScheduleError(f"{what}: {rv!r} does not belong to this schedule")
        kind, ident = entry[1]
        sref = self._index.lookup(entry[1])
        if sref is None:
            desc = f"block {ident!r}" if kind == "block" else f"loop {ident.name!r}"
            raise ScheduleError(
                f"{what}: {rv!r} refers to {desc}, which no longer exists (an earlier "
                "primitive removed or replaced it)"
            )
        return sref

    def _block(self, rv: Any, what: str) -> SRef:
        return self._sref(rv, what, (BlockRV,))

    def _loop(self, rv: Any, what: str) -> SRef:
        return self._sref(rv, what, (LoopRV,))

    # -- queries -------------------------------------------------------------------------------
    def get(self, rv: BlockRV | LoopRV) -> Block | For:
        """The current Block (for a BlockRV) or For (for a LoopRV) node."""
        sref = self._sref(rv, "get")
        return sref.block if sref.is_block else sref.loop

    @_traced
    def get_block(self, name: str) -> BlockRV:
        """The block named ``name`` ("root" is the root block)."""
        if not isinstance(name, str):
            raise ScheduleError(f"get_block: name must be a string, got {name!r}")
        if name not in self._index.blocks:
            known = ", ".join(repr(n) for n in self._index.blocks)
            raise ScheduleError(f"get_block: no block named {name!r}; blocks: {known}")
        return self._new_block_rv(name)

    @_traced
    def get_loops(self, block: BlockRV) -> list[LoopRV]:
        """The loops around ``block`` (inside its enclosing block), outermost first."""
        sref = self._block(block, "get_loops")
        return [self._new_loop_rv(s.loop.loop_var) for s in self._index.loops_above(sref)]

    @_traced
    def get_child_blocks(self, block_or_loop: BlockRV | LoopRV) -> list[BlockRV]:
        """Blocks directly inside a block or a loop (not nested in another block), in order."""
        sref = self._sref(block_or_loop, "get_child_blocks")
        return [self._new_block_rv(b.block.name_hint) for b in self._index.child_blocks(sref)]

    @_traced
    def get_producers(self, block: BlockRV) -> list[BlockRV]:
        """Blocks of the same scope that write a buffer ``block`` reads, in program order."""
        sref = self._block(block, "get_producers")
        return [self._rv_of(b) for b in self._related(sref, producers=True)]  # type: ignore

    @_traced
    def get_consumers(self, block: BlockRV) -> list[BlockRV]:
        """Blocks of the same scope that read a buffer ``block`` writes, in program order."""
        sref = self._block(block, "get_consumers")
        return [self._rv_of(b) for b in self._related(sref, producers=False)]  # type: ignore

    def _related(self, sref: SRef, producers: bool) -> list[SRef]:
        if sref is self._index.root:
            return []
        scope = self._index.scope_of(sref)
        mine = sref.block.reads if producers else sref.block.writes
        bufs = [r.buffer for r in mine]
        out = []
        for b in self._index.child_blocks_deep(scope):
            if b is sref:
                continue
            theirs = b.block.writes if producers else b.block.reads
            if any(any(r.buffer is x for x in bufs) for r in theirs):
                out.append(b)
        return out

    # -- loop primitives -----------------------------------------------------------------------
    @_traced
    def split(self, loop: LoopRV, factors: Sequence[int | None | Any]) -> list[LoopRV]:
        """Split ``loop`` into nested loops of the given extents (one ``None`` is inferred).

        When the factors' product is not provably equal to the extent, the blocks under the
        loop get the predicate ``fused index < extent``.
        """
        sref = self._loop(loop, "split")
        func, new_vars = _loops.split(self._index, sref, list(factors) if isinstance(
            factors, (list, tuple)) else factors)
        self._commit(func)
        return [self._new_loop_rv(v) for v in new_vars]

    @_traced
    def fuse(self, *loops: LoopRV) -> LoopRV:
        """Fuse adjacent, perfectly nested loops (outermost first) into one loop."""
        srefs = [self._loop(lp, "fuse") for lp in loops]
        func, var = _loops.fuse(self._index, srefs)
        self._commit(func)
        return self._new_loop_rv(var)

    @_traced
    def reorder(self, *loops: LoopRV) -> None:
        """Reorder loops of one perfectly nested chain into the given order."""
        srefs = [self._loop(lp, "reorder") for lp in loops]
        self._commit(_loops.reorder(self._index, srefs))

    @_traced
    def parallel(self, loop: LoopRV) -> None:
        """Run ``loop``'s iterations in parallel (it must not carry a reduction)."""
        self._commit(_loops.set_kind(self._index, self._loop(loop, "parallel"),
                                     ForKind.PARALLEL))

    @_traced
    def vectorize(self, loop: LoopRV) -> None:
        """Vectorize ``loop`` (constant extent, no reduction carried)."""
        self._commit(_loops.set_kind(self._index, self._loop(loop, "vectorize"),
                                     ForKind.VECTORIZED))

    @_traced
    def unroll(self, loop: LoopRV) -> None:
        """Unroll ``loop``."""
        self._commit(_loops.set_kind(self._index, self._loop(loop, "unroll"),
                                     ForKind.UNROLLED))

    @_traced
    def bind(self, loop: LoopRV, thread_axis: str) -> None:
        """Run ``loop``'s iterations on GPU blocks or threads: ``thread_axis`` is one of
        ``blockIdx.x/y/z``, ``threadIdx.x/y/z`` (see :func:`loop_transform.bind`)."""
        self._commit(_loops.bind(self._index, self._loop(loop, "bind"), thread_axis))

    @_traced
    def annotate(self, block_or_loop: BlockRV | LoopRV, key: str, value: Any) -> None:
        """Set annotation ``key`` of a block or loop to ``value``."""
        sref = self._sref(block_or_loop, "annotate")
        self._commit(_loops.annotate(self._index, sref, key, value))

    # -- compute location ------------------------------------------------------------------------
    @_traced
    def compute_inline(self, block: BlockRV) -> None:
        """Inline a spatial block's value into every consumer and remove the block."""
        self._commit(_inline.compute_inline(self._index, self._block(block, "compute_inline")))

    @_traced
    def reverse_compute_inline(self, block: BlockRV) -> None:
        """Fold a spatial consumer block into its only producer and remove it."""
        sref = self._block(block, "reverse_compute_inline")
        self._commit(_inline.reverse_compute_inline(self._index, sref))

    @_traced
    def compute_at(self, block: BlockRV, loop: LoopRV, preserve_unit_loops: bool = False
                   ) -> None:
        """Move producer ``block`` under ``loop``, computing what the consumers there need."""
        b = self._block(block, "compute_at")
        lp = self._loop(loop, "compute_at")
        self._commit(_at.compute_at(self._index, b, lp, bool(preserve_unit_loops)))

    @_traced
    def reverse_compute_at(self, block: BlockRV, loop: LoopRV,
                           preserve_unit_loops: bool = False) -> None:
        """Move consumer ``block`` under ``loop``, consuming what the producers there made."""
        b = self._block(block, "reverse_compute_at")
        lp = self._loop(loop, "reverse_compute_at")
        self._commit(_at.reverse_compute_at(self._index, b, lp, bool(preserve_unit_loops)))

    # -- caching -------------------------------------------------------------------------------
    @_traced
    def cache_read(self, block: BlockRV, read_buffer_index: int, storage_scope: str
                   ) -> BlockRV:
        """Read ``block``'s ``read_buffer_index``-th read buffer through a ``storage_scope``
        copy; returns the copy block."""
        sref = self._block(block, "cache_read")
        func, name = _cache.cache_read(
            self._index_for_new_names(), sref, read_buffer_index, storage_scope
        )
        self._commit(func)
        return self._new_block_rv(name)

    @_traced
    def cache_write(self, block: BlockRV, write_buffer_index: int, storage_scope: str,
                    dtype: str | None = None) -> BlockRV:
        """Write ``block``'s ``write_buffer_index``-th write buffer through a
        ``storage_scope`` buffer copied back afterwards; returns the copy block. A wider float
        ``dtype`` for that buffer makes ``block`` compute its stores in it (a float32
        accumulator of a float16 product), converted by the copy back."""
        sref = self._block(block, "cache_write")
        func, name = _cache.cache_write(
            self._index_for_new_names(), sref, write_buffer_index, storage_scope, dtype
        )
        self._commit(func)
        return self._new_block_rv(name)

    @_traced
    def cache_inplace(self, block: BlockRV, read_buffer_index: int, storage_scope: str,
                      loop: LoopRV) -> tuple[BlockRV, BlockRV]:
        """Stage the buffer ``block`` reads (``read_buffer_index``) and updates in place
        through a ``storage_scope`` copy made inside ``loop``: copied in before the subtree
        holding ``block``, back after it. Returns the two copy blocks (read, write)."""
        sref = self._block(block, "cache_inplace")
        lp = self._loop(loop, "cache_inplace")
        func, rname, wname = _cache.cache_inplace(
            self._index_for_new_names(), sref, read_buffer_index, storage_scope, lp
        )
        self._commit(func)
        return self._new_block_rv(rname), self._new_block_rv(wname)

    # -- reduction -----------------------------------------------------------------------------
    @_traced
    def decompose_reduction(self, block: BlockRV, loop: LoopRV) -> BlockRV:
        """Move ``block``'s init into a new block placed before ``loop``; returns it."""
        b = self._block(block, "decompose_reduction")
        lp = self._loop(loop, "decompose_reduction")
        func, name = _reduction.decompose_reduction(self._index_for_new_names(), b, lp)
        self._commit(func)
        return self._new_block_rv(name)

    @_traced
    def rfactor(self, loop: LoopRV, factor_axis: int) -> BlockRV:
        """Turn reduction ``loop`` into a spatial axis of partial results: a new block fills
        a buffer with one more dimension (at ``factor_axis``) and the original block, moved
        after the reduction loops, combines them; returns the new block (see
        :mod:`kiln.tir.schedule.rfactor`)."""
        lp = self._loop(loop, "rfactor")
        func, name = _rfactor.rfactor(self._index_for_new_names(), lp, factor_axis)
        self._commit(func)
        return self._new_block_rv(name)

    # -- tensorization ---------------------------------------------------------------------------
    @_traced
    def blockize(self, loop: LoopRV) -> BlockRV:
        """Make the loop nest under ``loop`` (around one block) the body of a new outer block;
        returns it (see :mod:`kiln.tir.schedule.blockize`)."""
        func, name = _blockize.blockize(self._index_for_new_names(), self._loop(loop, "blockize"))
        self._commit(func)
        return self._new_block_rv(name)

    @_traced
    def tensorize(self, block_or_loop: BlockRV | LoopRV, tensor_intrin: str) -> None:
        """Replace a block (or the loop nest under a loop, blockized first) by the tensor
        intrinsic registered as ``tensor_intrin`` (see :mod:`kiln.tir.tensor_intrin`)."""
        sref = self._sref(block_or_loop, "tensorize")
        if not sref.is_block:
            func, name = _blockize.blockize(self._index_for_new_names(), sref)
            index = TreeIndex(func)
            sref = index.blocks[name]
        else:
            index = self._index
        self._commit(_tensorize.tensorize(index, sref, tensor_intrin))

    def __repr__(self) -> str:
        return f"Schedule({len(self._trace)} instructions)\n{self.func}"
