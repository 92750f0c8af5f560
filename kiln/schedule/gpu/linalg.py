"""GPU schedules of the matrix products (``matmul``, batched or not, and ``dense``): tiles in
shared memory, a register tile per thread.

Each block of ``TILE_THREADS x TILE_THREADS`` threads computes a ``BM x BN`` tile of the
output (``BM = TILE_THREADS * REG_M``, the register tile ``REG_M x REG_N`` the largest of
:data:`REGISTER_TILES` that divides the product): every step of the reduction, the threads copy the
``BM x BK`` tile of A and the ``BK x BN`` tile of B into shared memory together (each element
loaded once per block, in vectors of up to 4: :func:`cooperative_copy`; lowering inserts the
barriers; with two stages each thread loads its part of the next step's tiles into registers
while the block computes, ``kiln.tir.transform.prefetch_copies``), then each thread
accumulates its ``REG_M x REG_N`` outputs in registers (``local`` scope; float32 for
float16/bfloat16 products, :func:`accumulator_dtype`), reading each shared value once per
``REG_N``/``REG_M`` products instead of once per product: the arithmetic intensity a GPU
needs where one thread per output (the generic rule) re-reads A and B from global memory for
every output. Batch dimensions of a
``matmul`` go to ``blockIdx.z``, as do the leading rows of a ``dense`` whose last row axis
fills whole tiles (else all its rows are fused into one ``i``).
Element-wise epilogues of a fused function (bias, activation) are folded into the write-back
of the accumulators. Shapes the tiles do not divide, or symbolic ones, are refused
(ScheduleError) and get the generic rules (:mod:`kiln.schedule.gpu`'s next attempt).
Knobs (:mod:`kiln.schedule.knobs`): ``gpu_gemm_threads``, ``gpu_gemm_register_tile``,
``gpu_gemm_bk``, ``gpu_gemm_stages``.
"""

from __future__ import annotations

import math
from typing import Any

from ...ir.errors import ScheduleError
from ...tir.schedule.analysis import as_int
from ...tir.transform.prefetch_copies import PREFETCH
from ..cpu.generic import inline_injective_stages
from ..knobs import knob
from ..registry import register_schedule
from . import rules

#: Threads per block along each of the tile's two axes.
TILE_THREADS = 16
#: Outputs per thread along the rows (M) and the columns (N) of the tile, largest first (8 x 8:
#: 128 x 128 tiles, half the shared loads per multiply-add of 4 x 4). The first that divides the
#: product and still gives every multiprocessor a block is used (see :func:`register_tile`).
#: On an H100: 8 x 8 made the 4096^3 fp16 GEMM 1.3x faster than 4 x 4 (11.7 against 15.4 ms),
#: and the encoder (seq 128, batch 8) 1.5x slower when its products of 48 to 96 blocks took it
#: (21.8 against 14.8 ms).
REGISTER_TILES = ((8, 8), (8, 4), (4, 8), (4, 4))
#: Reduction elements staged in shared memory per step.
BK = 16
#: The domains of the knobs ``gpu_gemm_threads`` (threads per block along each tile axis) and
#: ``gpu_gemm_bk`` (reduction elements per shared step); the defaults are TILE_THREADS and BK.
THREAD_CHOICES = (8, 16)
BK_CHOICES = (8, 16, 32)
#: Pipeline stages of the reduction loop (knob ``gpu_gemm_stages``): 2 loads the next step's
#: tiles into registers while the block computes on this step's (``prefetch_copies``), 1
#: copies, waits, computes.
STAGES = 2
STAGE_CHOICES = (1, 2)


def _extents(sch: Any, loops: list[Any]) -> list[int]:
    out = [as_int(sch.get(lp).extent) for lp in loops]
    if any(e is None for e in out):
        raise ScheduleError("tiled GEMM: symbolic extents (the generic rules take them)")
    return out  # type: ignore[return-value]


def register_tile(m: int, n: int, batch: int = 1, multiprocessors: int = 1,
                  threads: int = TILE_THREADS) -> tuple[int, int] | None:
    """The register tile (outputs per thread along M and N) of ``batch`` ``m x n`` products
    on blocks of ``threads x threads``: the largest of :data:`REGISTER_TILES` that divides
    them into at least ``multiprocessors`` blocks, else the dividing one with the most blocks;
    None when none divides them."""
    t = threads
    fits = [(rm, rn) for rm, rn in REGISTER_TILES if m % (t * rm) == 0 and n % (t * rn) == 0]
    if not fits:
        return None

    def blocks(tile: tuple[int, int]) -> int:
        return batch * (m // (t * tile[0])) * (n // (t * tile[1]))

    return next((f for f in fits if blocks(f) >= multiprocessors), max(fits, key=blocks))


def schedule_tiled_gemm(sch: Any, target: Any, block: Any, rows_fused: bool) -> None:
    """Tile ``block`` (spatial loops ``[batch..., i, j]`` or, ``rows_fused``, ``[rows..., j]``,
    then one reduction loop) as the module docstring says. Knobs: ``gpu_gemm_threads``
    (threads per block along each axis), ``gpu_gemm_register_tile`` and ``gpu_gemm_bk``."""
    t = knob("gpu_gemm_threads", THREAD_CHOICES, TILE_THREADS)
    if t * t > target.gpu.max_threads_per_block:
        raise ScheduleError("tiled GEMM: the target's blocks are too small")
    loops = rules.perfect_loops(sch, block)
    if loops is None or len(loops) < 3:
        raise ScheduleError("tiled GEMM: not a perfect nest of >= 3 loops")
    roles = rules.loop_roles(sch, block, loops)
    if roles[-1] != "reduce" or any(r != "spatial" for r in roles[:-1]):
        raise ScheduleError("tiled GEMM: expected spatial loops, then one reduction loop")
    ext = _extents(sch, loops)
    *spatial, k = loops
    if rows_fused and len(spatial) > 2 and register_tile(ext[-3], ext[-2], threads=t) is not None:
        rows_fused = False  # the last row axis alone fills the tiles: no div/mod in indices
    if rows_fused:
        batch, i, j = [], (sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]), \
            spatial[-1]
        m = math.prod(ext[:-2])
    else:
        batch, i, j = spatial[:-2], spatial[-2], spatial[-1]
        m = ext[-3]
    n, kk = ext[-2], ext[-1]
    tile = register_tile(m, n, math.prod(ext[:len(batch)]), target.gpu.multiprocessors, t)
    if tile is None:
        raise ScheduleError(f"tiled GEMM: {m}x{n} is not a multiple of a tile")
    reg_m, reg_n = knob("gpu_gemm_register_tile", REGISTER_TILES, tile)
    bk = knob("gpu_gemm_bk", BK_CHOICES, BK)
    bm, bn = t * reg_m, t * reg_n
    if m % bm or n % bn or kk % bk:
        raise ScheduleError(f"tiled GEMM: {m}x{n}x{kk} is not a multiple of the tile "
                            f"{bm}x{bn}x{bk}")
    itemsize = max(1, sch.get(block).writes[0].buffer.dtype.element.itemsize)
    shared = (bm + bn) * bk * max(itemsize, 4)
    if shared > target.gpu.shared_memory_per_block:
        raise ScheduleError("tiled GEMM: the tiles exceed the target's shared memory")
    io, ty, ii = sch.split(i, [None, t, reg_m])
    jo, tx, ji = sch.split(j, [None, t, reg_n])
    ko, ki = sch.split(k, [None, bk])
    sch.reorder(io, jo, ty, tx, ko, ki, ii, ji)
    if batch:
        bz = sch.fuse(*batch) if len(batch) > 1 else batch[0]
        sch.bind(bz, "blockIdx.z")
    sch.bind(io, "blockIdx.y")
    sch.bind(jo, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    acc = sch.cache_write(block, 0, "local", accumulator_dtype(sch.get(block)))
    sch.reverse_compute_at(acc, tx)
    for index in (0, 1):
        cache = sch.cache_read(block, index, "shared")
        sch.compute_at(cache, ko)
        cooperative_copy(sch, cache, ko, t, t)
    sch.decompose_reduction(block, ko)
    if knob("gpu_gemm_stages", STAGE_CHOICES, STAGES) == 2:
        sch.annotate(ko, PREFETCH, 1)
    for lp in sch.get_loops(block)[-2:]:
        sch.unroll(lp)
    _fold_epilogues(sch, target, acc)


def accumulator_dtype(block: Any) -> str | None:
    """float32 for a product of 16-bit floats (float16, bfloat16): its sums stay in float32
    registers and are rounded once, at the store, as cuBLAS and torch do; None (the output's
    dtype) otherwise."""
    dt = block.writes[0].buffer.dtype
    return "float32" if dt.is_float and dt.bits < 32 else None


def cooperative_copy(sch: Any, copy: Any, at: Any, threads_y: int, threads_x: int) -> None:
    """Divide ``copy``, a copy of a tile into shared memory computed at loop ``at`` under the
    ``threadIdx.y/x`` loops of a ``threads_y x threads_x`` block (so covering what all the
    threads read), among the threads: its loops fused, split over ``threadIdx.y`` x
    ``threadIdx.x`` x :func:`copy_lanes` elements, the lanes vectorized. Each element of the
    tile is then loaded once per block instead of once per thread that reads it."""
    loops = sch.get_loops(copy)
    at_var = sch.get(at).loop_var
    own = loops[[sch.get(lp).loop_var for lp in loops].index(at_var) + 1:]
    if not own:
        raise ScheduleError("tiled GEMM: the shared tile's copy has no loop")
    inner = as_int(sch.get(own[-1]).extent)
    fused = sch.fuse(*own) if len(own) > 1 else own[0]
    total = as_int(sch.get(fused).extent)
    lanes = copy_lanes(inner, total, threads_y * threads_x, sch.get(copy).writes[0].buffer)
    _, ty, tx, vec = sch.split(fused, [None, threads_y, threads_x, lanes])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if lanes > 1:
        sch.vectorize(vec)


def copy_lanes(inner: int | None, total: int | None, threads: int, buffer: Any) -> int:
    """Elements per vector load of a cooperative copy: 4 (a ``float4``; 16 bytes at most,
    the widest vector the dialects spell) when the tile's rows and the whole tile split into
    such vectors, else fewer, down to 1."""
    lanes = min(4, 16 // max(1, buffer.dtype.element.itemsize))
    while lanes > 1 and (inner is None or total is None or inner % lanes
                         or total % (lanes * threads)):
        lanes //= 2
    return lanes


def _fold_epilogues(sch: Any, target: Any, write_back: Any) -> None:
    """Fold element-wise consumers of the product into the accumulators' write-back; what
    cannot be folded gets the generic element-wise rule."""
    name = sch.get(write_back).name_hint
    for b in rules.stages(sch):
        if sch.get(b).name_hint == name:
            continue
        loops = sch.get_loops(b)
        if loops and sch.get(loops[0]).kind.name == "THREAD_BINDING":
            continue
        try:
            sch.reverse_compute_inline(b)
            continue
        except ScheduleError:
            pass
        rules.schedule_injective_block(sch, target, b)


def _prepare(sch: Any) -> None:
    """Inline the element-wise producers (casts, the dense weight's transposition) into the
    product, as the generic rules would."""
    inline_injective_stages(sch)
    for name in ("dense_weight_t",):
        try:
            sch.compute_inline(sch.get_block(name))
        except ScheduleError:
            pass


@register_schedule("matmul", "gpu")
def schedule_matmul(sch: Any, target: Any) -> None:
    """``matmul`` (2-D or batched): the tiled GEMM."""
    a, b = (sch.func.buffer_map[p] for p in sch.func.params[:2])
    if a.ndim < 2 or b.ndim < 2:
        raise ScheduleError("tiled GEMM: a matrix-vector product (the generic rules take it)")
    _prepare(sch)
    schedule_tiled_gemm(sch, target, sch.get_block("matmul"), rows_fused=False)


@register_schedule("dense", "gpu")
def schedule_dense(sch: Any, target: Any) -> None:
    """``dense`` (``x @ W.T``, every leading axis of ``x`` a row): the tiled GEMM."""
    _prepare(sch)
    schedule_tiled_gemm(sch, target, sch.get_block("dense"), rows_fused=True)
