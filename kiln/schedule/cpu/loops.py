"""Loop-nest tools shared by the CPU schedules of the GEMM, convolution, pooling and row-wise
ops: vector lengths that divide an extent, splitting, the parallel outer loop, register tiles
written out in registers, and the fused element-wise consumers (epilogues) computed under an
op's parallel loop.
"""

from __future__ import annotations

from typing import Any

from ... import tir
from ...ir.errors import ScheduleError
from ...op.linalg import const_int
from ..knobs import knob
from .generic import PARALLEL_MIN_WORK, schedule_injective, schedule_reduction, target_threads


def loop_extent(sch: Any, loop: Any) -> int | None:
    return const_int(sch.get(loop).extent)


def pick_factor(extent: int | None, candidates: list[int]) -> int | None:
    """The first candidate that divides ``extent`` (None if none does or it is symbolic)."""
    if extent is None:
        return None
    for c in candidates:
        if 1 < c <= extent and extent % c == 0:
            return c
    return None


def vector_factor(target: Any, dtype: Any, extent: int | None) -> int | None:
    """A vector length that divides ``extent``: one SIMD register of ``dtype``, or half of one.

    Longer vectors (two registers) are not used: GCC lowers over-wide vector types poorly.
    """
    lanes = target.vector_lanes(dtype)
    options = [c for c in (lanes, lanes // 2) if c >= 4]
    first = knob("vector_lanes", options, options[0]) if options else None
    return pick_factor(extent, sorted(options, key=lambda c: c != first))


def split_off(sch: Any, loop: Any, factor: int | None) -> tuple[Any, Any]:
    """``(outer, inner)`` with ``inner`` of ``factor`` iterations, or ``(loop, None)``."""
    if factor is None:
        return loop, None
    outer, inner = sch.split(loop, factors=[None, factor])
    return outer, inner


def block_work(sch: Any, block: Any) -> int | None:
    """Iterations of ``block`` (product of its iteration domains), None when symbolic."""
    total = 1
    for iv in sch.get(block).iter_vars:
        ext = const_int(iv.dom.extent)
        if ext is None:
            return None
        total *= ext
    return total


def parallel_outer(sch: Any, loops: list[Any], target: Any, min_chunks: int = 0,
                   work: int | None = None) -> Any | None:
    """Fuse leading ``loops`` into one parallel loop, enough of them to feed every thread
    whatever the symbolic extents among them turn out to be.

    Nothing is parallelized for a single-threaded target or when ``work`` (scalar operations,
    when known) is below the size at which a parallel region pays for itself.
    """
    if not loops or getattr(target, "num_threads", 0) == 1:
        return None
    if work is not None and work < PARALLEL_MIN_WORK:
        return None
    threads = target_threads(target)
    want = max(min_chunks, knob("parallel_chunks", (1, 2, 4, 8, 16), 4) * threads)
    # a symbolic extent (a dynamic batch) may be 1 at run time: only the constant extents
    # count towards ``want``, so the loops after it are fused in too
    take, total, symbolic = 0, 1, False
    for lp in loops:
        take += 1
        ext = loop_extent(sch, lp)
        if ext is None:
            symbolic = True
        else:
            total *= ext
        if total >= want:
            break
    if total <= 1 and not symbolic:
        return None
    fused = sch.fuse(*loops[:take]) if take > 1 else loops[0]
    sch.parallel(fused)
    return fused


def vectorize_inner(sch: Any, target: Any, block: Any) -> None:
    """Vectorize the innermost loop of an element-wise block when a vector length divides it
    (splitting a vector loop off a longer one)."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    if sch.get(inner).kind != tir.ForKind.SERIAL:
        return
    extent = loop_extent(sch, inner)
    factor = vector_factor(target, sch.get(block).writes[0].buffer.dtype, extent)
    if factor is None:
        return
    if factor == extent:
        sch.vectorize(inner)
    else:
        _, vi = sch.split(inner, factors=[None, factor])
        sch.vectorize(vi)


def _tile_loops(sch: Any, block: Any, io: Any) -> list[Any]:
    """The loops of ``block`` below the row-block loop ``io`` (those of one tile)."""
    loops = sch.get_loops(block)
    io_node = sch.get(io)
    for n, lp in enumerate(loops):
        if sch.get(lp) is io_node:
            return loops[n + 1:]
    return []


#: Fewest vector accumulators a register tile needs to keep both FMA pipes busy (an FMA takes
#: 4 cycles and two start per cycle, Zen 3 and Intel cores alike). Smaller tiles -- a
#: convolution row's tail, a GEMM tile of one row -- run several at once, jammed (``JAM_TAILS``).
TILE_MIN_ACCUMULATORS = 8


def tiles_to_fill(accumulators: int) -> int | None:
    """How many tiles of ``accumulators`` vector accumulators to run at once to have
    :data:`TILE_MIN_ACCUMULATORS`; None when one is enough."""
    if accumulators >= TILE_MIN_ACCUMULATORS:
        return None
    return -(-TILE_MIN_ACCUMULATORS // accumulators)


def write_out_tile(sch: Any, target: Any, block: Any, io: Any, dtype: Any) -> None:
    """Unroll the loops of a tile-sized block (the tile's init or write-back) and vectorize
    its innermost loop in register-sized pieces: with every index constant the C compiler can
    keep the tile in registers."""
    loops = _tile_loops(sch, block, io)
    if not loops:
        return
    *outer, inner = loops
    ext = loop_extent(sch, inner)
    lanes = target.vector_lanes(dtype)
    if ext is not None and lanes > 1 and ext % lanes == 0:
        if ext > lanes:
            lo, inner = sch.split(inner, factors=[None, lanes])
            outer.append(lo)
        sch.vectorize(inner)
    for lp in outer:
        if loop_extent(sch, lp) is not None:
            sch.unroll(lp)


def other_blocks(sch: Any, known: set[str]) -> list[str]:
    """Names of the top-level blocks not in ``known`` (call before scheduling: primitives such
    as decompose_reduction add blocks of their own)."""
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))]
    return [n for n in names if n not in known]


def schedule_epilogue(sch: Any, target: Any, names: list[str], at: Any | None) -> None:
    """Schedule the blocks ``names`` that an op's schedule did not handle itself.

    After fusion an op's PrimFunc also holds the element-wise consumers merged into it (a bias
    add, an activation). Each is computed under ``at`` (the op's parallel loop, so it reads the
    tile while it is in cache) with its inner loop vectorized; a block that cannot move there
    gets the generic injective schedule, and stray reductions the generic reduction schedule.
    """
    for name in names:
        b = sch.get_block(name)
        blk = sch.get(b)
        if any(iv.iter_type == tir.IterType.COMM_REDUCE for iv in blk.iter_vars):
            schedule_reduction(sch, target, b)
            continue
        if at is not None:
            try:
                sch.reverse_compute_at(b, at)
            except ScheduleError:
                pass
            else:
                vectorize_inner(sch, target, b)
                continue
        schedule_injective(sch, target, b)
