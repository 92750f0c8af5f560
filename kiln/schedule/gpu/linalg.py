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

import logging
import math
from typing import Any

from ...ir.errors import ScheduleError
from ...tir.expr import IterType
from ...tir.functor import post_order_visit
from ...tir.schedule.analysis import as_int
from ...tir.tensor_intrin.gpu import (
    MMA_DTYPES,
    MMA_K,
    register_mma_intrinsic,
    register_mma_tile_intrinsic,
    register_wgmma_intrinsic,
)
from ...tir.tensor_intrin.wgmma import a_operand, b_operand, b_operand_k_major
from ...tir.transform.async_copies import ASYNC_STAGES
from ...tir.transform.compact_buffers import STORAGE_ALIGN
from ...tir.transform.convert_blocks_to_loops import SUBSTITUTE_BINDINGS
from ...tir.transform.cross_thread_reduction import accumulator_dtype as reduction_accumulator
from ...tir.transform.permute_layout import PERMUTE_LAYOUT
from ...tir.transform.prefetch_copies import PREFETCH
from ..cpu.generic import inline_injective_stages
from ..knobs import knob
from ..registry import register_schedule
from . import rules

logger = logging.getLogger(__name__)

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


def gemm_nest(sch: Any, block: Any, what: str) -> tuple[list[Any], Any, list[int]]:
    """The spatial loops, the reduction loop and all the extents of a GEMM ``block``
    (a perfect nest of spatial loops, then one reduction loop), else a ScheduleError."""
    loops = rules.perfect_loops(sch, block)
    if loops is None or len(loops) < 3:
        raise ScheduleError(f"{what}: not a perfect nest of >= 3 loops")
    roles = rules.loop_roles(sch, block, loops)
    if roles[-1] != "reduce" or any(r != "spatial" for r in roles[:-1]):
        raise ScheduleError(f"{what}: expected spatial loops, then one reduction loop")
    *spatial, k = loops
    return spatial, k, _extents(sch, loops)


def gemm_axes(sch: Any, spatial: list[Any], ext: list[int], rows_fused: bool
              ) -> tuple[list[Any], Any, Any, int]:
    """(batch loops, row loop, column loop, rows): a ``dense`` (``rows_fused``) has all its
    leading axes fused into the rows, a ``matmul`` keeps its batch axes for ``blockIdx.z``."""
    if rows_fused:
        i = sch.fuse(*spatial[:-1]) if len(spatial) > 2 else spatial[0]
        return [], i, spatial[-1], math.prod(ext[:-2])
    return spatial[:-2], spatial[-2], spatial[-1], ext[-3]


def bind_blocks(sch: Any, batch: list[Any], rows: Any, cols: Any, group: int = 1) -> None:
    """Bind the batch loops (fused) to ``blockIdx.z``, the row and column tiles to ``y``/``x``.

    ``group`` > 1 (no batch, the row tiles a multiple of it): the blocks run in groups of
    ``group`` row tiles -- ``blockIdx.x`` the row tile within its group, ``y`` the column
    tile, ``z`` the group -- so that the blocks resident at once read ``group`` tiles of A and
    a band of B's column tiles, not one tile of A and every column tile of B (the L2 reuse of
    CUTLASS's threadblock swizzle and Triton's ``GROUP_SIZE_M``; blocks start in ``blockIdx``
    order, x fastest)."""
    if batch:
        sch.bind(sch.fuse(*batch) if len(batch) > 1 else batch[0], "blockIdx.z")
    extent = as_int(sch.get(rows).extent)
    if group > 1 and not batch and extent is not None and extent > group and \
            extent % group == 0:
        outer, inner = sch.split(rows, [None, group])
        sch.reorder(outer, cols, inner)
        sch.bind(outer, "blockIdx.z")
        sch.bind(cols, "blockIdx.y")
        sch.bind(inner, "blockIdx.x")
        return
    sch.bind(rows, "blockIdx.y")
    sch.bind(cols, "blockIdx.x")


#: Knob ``gpu_mma_group_rows``: the tensor-core GEMMs' blocks in groups of this many row
#: tiles (:func:`bind_blocks`); 1 is the plain row-major order of the tiles.
GROUP_ROWS = (8, 4, 16, 1)


def warp_accumulators(sch: Any, block: Any, batch: list[Any], rows: Any, cols: Any,
                      warps: tuple[Any, Any], lanes: tuple[Any, Any]) -> Any:
    """The tensor-core routes' binding: the block tiles to ``blockIdx`` (grouped, knob
    ``gpu_mma_group_rows``: :func:`bind_blocks`), the two ``warps`` loops fused to
    ``threadIdx.y`` (a warp each), the two ``lanes`` loops fused to ``threadIdx.x`` (its 32
    lanes), and each thread's float32 accumulators in registers under its lane; returns their
    write-back block."""
    warp = sch.fuse(*warps)
    lane = sch.fuse(*lanes)
    bind_blocks(sch, batch, rows, cols, knob("gpu_mma_group_rows", GROUP_ROWS, GROUP_ROWS[0]))
    sch.bind(warp, "threadIdx.y")
    sch.bind(lane, "threadIdx.x")
    acc = sch.cache_write(block, 0, "local", "float32")
    sch.reverse_compute_at(acc, lane)
    return acc


def schedule_tiled_gemm(sch: Any, target: Any, block: Any, rows_fused: bool) -> None:
    """Tile ``block`` (spatial loops ``[batch..., i, j]`` or, ``rows_fused``, ``[rows..., j]``,
    then one reduction loop) as the module docstring says. Knobs: ``gpu_gemm_threads``
    (threads per block along each axis), ``gpu_gemm_register_tile`` and ``gpu_gemm_bk``."""
    t = knob("gpu_gemm_threads", THREAD_CHOICES, TILE_THREADS)
    if t * t > target.gpu.max_threads_per_block:
        raise ScheduleError("tiled GEMM: the target's blocks are too small")
    spatial, k, ext = gemm_nest(sch, block, "tiled GEMM")
    if rows_fused and len(spatial) > 2 and register_tile(ext[-3], ext[-2], threads=t) is not None:
        rows_fused = False  # the last row axis alone fills the tiles: no div/mod in indices
    batch, i, j, m = gemm_axes(sch, spatial, ext, rows_fused)
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
    bind_blocks(sch, batch, io, jo)
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    acc = sch.cache_write(block, 0, "local", accumulator_dtype(sch.get(block)))
    sch.reverse_compute_at(acc, tx)
    for index in (0, 1):
        cache = sch.cache_read(block, index, "shared")
        sch.compute_at(cache, ko, cooperative=True)
        cooperative_copy(sch, cache, ko, t, t)
    sch.decompose_reduction(block, ko)
    if knob("gpu_gemm_stages", STAGE_CHOICES, STAGES) == 2:
        sch.annotate(ko, PREFETCH, 1)
    for lp in sch.get_loops(block)[-2:]:
        sch.unroll(lp)
    fold_epilogues(sch, target, acc)


#: Tensor-core GEMM (:func:`schedule_mma_gemm`): warps per block along M and N (knob
#: ``gpu_mma_warps``), ``mma`` tiles per warp along M and N (``gpu_mma_tiles``; a warp computes
#: ``16 MI x 8 NI`` outputs, each thread ``2 MI x 2 NI`` float32 accumulators), reduction
#: elements per shared step (``gpu_mma_bk``) and pipeline stages (``gpu_mma_stages``).
MMA_WARPS = ((2, 2), (4, 2), (2, 4), (1, 1))
#: The tiles, in the order :func:`mma_tile` prefers them. On an H100 (4096^3 float16, 2 x 2
#: warps, ``benchmarks/gpu.py gemm``, cuBLAS 0.18 ms): the default (4 x 4, 32-deep steps, two
#: stages) 1.27-1.53 ms through ``kiln.build``; with knobs (``build_executable``) 4 x 8 with
#: 64-deep steps 0.98 ms (139-141 TFLOP/s, one or two stages alike), 4 x 8 with 32 1.14 ms,
#: 4 x 2 warps 1.10-1.40 ms. The same 4 x 8 / 64 / one-stage kernel measured 6.1 ms once
#: through ``kiln.build`` (the generated source is identical; not understood before the
#: device time ran out), so the default stays on the configuration measured both ways.
#: 2 x 2 (32 columns per block) comes before 1 x 1 for convolutions whose batch's pixels are
#: a multiple of 32 but not of 64 (ResNet-18's 7 x 7 layers at batch 32: 1568); 4 x 2 made
#: ptxas spill (sm_80) in the 3 x 3 / 2 one at 14 x 14, the im2col's index arithmetic taking
#: registers beside the 32 accumulators.
MMA_TILES = ((4, 4), (4, 8), (2, 8), (2, 4), (2, 2), (1, 1))
MMA_BK_CHOICES = (32, 64, 16)
MMA_STAGES = 2
#: Knob ``gpu_mma_async_stages``: 0 (the default: ``gpu_mma_stages``'s register prefetch), or
#: the shared stages of a ``cp.async`` pipeline (:mod:`kiln.tir.transform.async_copies`):
#: 16-byte asynchronous copies, up to ``stages - 1`` steps ahead. Off by default on the
#: per-``mma`` route (on an H100 its best pipeline, 0.94-1.07 ms at 4096^3, was bound by the
#: shared-memory loads, not the copies); the warp-tile route's default is
#: :data:`FRAGMENT_STEPS`'s.
MMA_ASYNC_STAGES = (0, 2, 3, 4)
#: The tiles of the warp-tile route (knob ``gpu_mma_fragments``, the default), in the order
#: :func:`mma_tile` prefers them: 64 x 64 per warp first. On an H100 (4096^3 float16, 2 x 2
#: warps, ``benchmarks/gpu_mma_knobs.py``, two runs): 4 x 8 with 64-deep steps and three
#: ``cp.async`` stages 0.665 / 0.706 ms, with 32-deep steps 0.707 / 0.749 ms, 4 x 4 0.79-1.0 ms;
#: eight warps (128 x 256 or 256 x 128 blocks) 0.87-0.97 ms; the per-``mma`` route's best
#: 0.94-1.07 ms; cuBLAS 0.18-0.23 ms. With the vector write-back the default measured 0.567 ms
#: (0.707 without, same run).
FRAGMENT_TILES = ((4, 8), (4, 4), (2, 8), (2, 4), (2, 2), (1, 1))
#: (reduction elements per step, ``cp.async`` stages) of the warp-tile route without gathered
#: operands: the first whose step divides the reduction and whose stages fit the target's
#: shared memory (sm_89's 99 KB takes 32-deep steps for a 128 x 128 tile).
FRAGMENT_STEPS = ((64, 3), (32, 3), (32, 2), (16, 2))
#: Shared row padding (``STORAGE_ALIGN``: stride = offset mod factor elements) of the tiles
#: of an asynchronous pipeline: rows 16-byte aligned for the copies' chunks, 16 bytes off a
#: multiple of 32 so consecutive rows start in different bank groups. Axis -2: the rows, also
#: under the batch dimension of a batched operand's tile.
ASYNC_ALIGN = (-2, 16, 8)


def mma_row_order(warps_y: int, mi: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The :data:`~kiln.tir.transform.permute_layout.PERMUTE_LAYOUT` of A's shared tile that
    makes each ``mma``'s 16 rows consecutive: the rows of a block tile are the digits (warp,
    lane group ``g`` < 8, ``mma`` ``m`` < MI, ``h`` < 2: the thread's two rows of the ``mma``),
    stored in the order (warp, ``m``, ``h``, ``g``). The 8 lane groups' rows of one ``mma`` are
    then consecutive: with 16-byte rows 8 mod 16 elements apart (:data:`ASYNC_ALIGN`) their
    32-bit fragment loads hit 32 distinct banks and an ``ldmatrix`` phase's 8 rows 8 distinct
    bank groups; unpermuted, the rows are ``2 MI`` apart and share banks (8-way for MI = 4)."""
    return (-2, (warps_y, 8, mi, 2), (0, 2, 3, 1))


def mma_column_chunks(warps_x: int, ni: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The :data:`~kiln.tir.transform.permute_layout.PERMUTE_LAYOUT` of B's shared tile in an
    asynchronous pipeline with ``ni`` (a multiple of 8) mma columns per warp: the columns of a
    block tile are the digits (warp, lane ``t`` < 4, 8-column chunk of the lane, ``j`` mod 4,
    ``e`` < 2), stored with the chunk digit before ``t``: 16-byte chunks stay whole (the
    ``cp.async`` copies), consecutive lanes' columns are 8 apart instead of ``2 NI``, and B's
    16-bit fragment loads at 16-byte rows conflict 2-way instead of 4-way (rows 8 mod 16
    elements apart)."""
    return (-1, (warps_x, 4, ni // 4, 4, 2), (0, 2, 1, 3, 4))


def mma_column_order(warps_x: int, ni: int) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """The :data:`~kiln.tir.transform.permute_layout.PERMUTE_LAYOUT` of B's shared tile under
    the warp-tile intrinsic (knob ``gpu_mma_fragments``): the columns of a block tile are the
    digits (warp, lane ``t`` < 4, ``mma`` column block ``n`` < NI, ``e`` < 2), stored as
    (warp, ``n``, ``t``, ``e``), so each ``mma``'s 8 columns are consecutive -- one 16-byte row
    of an ``ldmatrix.trans`` matrix -- while each thread's accumulators stay one dense tile.
    Pairs of columns stay whole (the copies move 4-byte chunks into it)."""
    return (-1, (warps_x, 4, ni, 2), (0, 2, 1, 3))


def mma_shared_bytes(bm: int, bn: int, bk: int, stages: int, pad_b: bool) -> int:
    """Shared bytes of the padded tiles (rows :data:`ASYNC_ALIGN`: 16-byte aligned, each
    stage rounded up to 16 bytes) of a ``bm x bn x bk`` step in ``stages`` copies (0: one);
    ``pad_b``: B's rows padded the same way, else by 2 elements."""
    pad = ASYNC_ALIGN[2]
    return max(1, stages) * sum(-(-size // 8) * 8 for size in (
        (bm - 1) * (bk + pad) + bk, (bk - 1) * (bn + (pad if pad_b else 2)) + bn)) * 2


#: Knob ``gpu_wgmma_shape`` of the wgmma route (knob ``gpu_mma_wgmma``, off by default):
#: (warpgroups per block along M, 64-row products per warpgroup ``MI``, 8-column blocks ``NJ``
#: of each product: ``wgmma.m64n<8 NJ>k16``), in the order the default takes the first whose
#: block tile (``64 WG MI`` x ``8 NJ``) divides the product. The H100's order (4096^3 float16,
#: 64-deep steps in 4 stages, ``benchmarks/gpu_mma_knobs.py --only wgmma``): 256 x 128 of two
#: warpgroups of two products 0.756 ms, 128 x 128 of two warpgroups 1.04, 128 x 128 of one
#: warpgroup of two 1.09 (3 stages), 128 x 256 1.62 (cuBLAS 0.245); then 64 x 128, 64 x 64.
WGMMA_SHAPES = ((2, 2, 16), (2, 1, 16), (1, 2, 16), (2, 1, 32), (1, 1, 16), (1, 1, 8))
#: (reduction elements per step, ``cp.async`` stages) of the wgmma route: the first whose step
#: divides the reduction and whose stages fit the target's opt-in shared memory (4 stages
#: before 3: with the products of a step left in flight the copies run S - 2 steps ahead).
WGMMA_STEPS = ((64, 4), (64, 3), (64, 2), (32, 4), (32, 3), (32, 2), (16, 2))


def wgmma_refusal(target: Any) -> str | None:
    """Why ``target`` cannot take the wgmma route, or None: CUDA sm_90 (compiled for the
    arch-specific ``sm_90a``: wgmma is an sm_90a instruction, which later architectures do not
    have), or OpenCL -- the view PoCL runs, each thread computing its part through the same
    layouts and descriptor arithmetic."""
    if target.kind == "opencl":
        return None
    if target.kind != "cuda":
        return f"{target.kind} has no wgmma"
    arch = str(target.arch or "")
    if arch.removesuffix("a") != "sm_90":
        return f"wgmma is an sm_90 (sm_90a) instruction, not {arch or 'the default arch'}'s"
    return None


def _last(ndim: int) -> tuple[int, ...]:
    """All ``ndim`` axes of a tile, counted from the last: the wgmma layouts permute a tile's
    whole index flattened -- a batched operand's tile has leading axes of extent 1, a ``dense``
    tile whose rows span batch entries (fused rows) has them as the rows' leading digits."""
    return tuple(range(-ndim, 0))


def wgmma_a_layout(warpgroups: int, mi: int, bk: int, ndim: int = 2
                   ) -> tuple[tuple[int, int], tuple[int, ...], tuple[int, ...]]:
    """The :data:`~kiln.tir.transform.permute_layout.PERMUTE_LAYOUT` of A's shared tile on the
    wgmma route, over its rows and columns together (``ndim``: all the tile's axes, flattened;
    :func:`_last`): rows are the digits (warpgroup, warp
    ``w`` < 4, lane group ``g`` < 8, product ``m`` < MI, ``h`` < 2), columns (panel ``kh``,
    ``kl`` < 8); stored as (``kh``, warpgroup, ``m``, ``w``, ``h``, ``g``, ``kl``), i.e.
    ``[bk / 8][rows][8]`` with the thread's row ``(m, h)`` at row ``16 w + 8 h + g`` of its
    warpgroup's product ``m`` (the accumulator fragment's): the K-major layout
    :func:`~kiln.tir.tensor_intrin.wgmma.a_operand` describes. 16-byte chunks of a row stay
    whole (the ``cp.async`` copies)."""
    return (_last(ndim), (warpgroups, 4, 8, mi, 2, bk // 8, 8), (5, 0, 3, 1, 4, 2, 6))


def wgmma_b_layout(nj: int, bk: int, ndim: int = 2
                   ) -> tuple[tuple[int, int], tuple[int, ...], tuple[int, ...]]:
    """The :data:`~kiln.tir.transform.permute_layout.PERMUTE_LAYOUT` of B's shared tile on the
    wgmma route: rows ``k``, columns the digits (lane ``t`` < 4, column block ``j`` < NJ,
    ``e`` < 2), stored as (``j``, ``k``, ``t``, ``e``), i.e. ``[cols / 8][bk][8]`` with the
    thread's column ``(j, e)`` at column ``8 j + 2 t + e``: the MN-major layout
    :func:`~kiln.tir.tensor_intrin.wgmma.b_operand` describes. Pairs of columns stay whole
    (the copies move 4 bytes)."""
    return (_last(ndim), (bk, 4, nj, 2), (2, 0, 1, 3))


def wgmma_b_k_major_layout(nj: int, bk: int, ndim: int = 2
                           ) -> tuple[tuple[int, int], tuple[int, ...], tuple[int, ...]]:
    """The :data:`~kiln.tir.transform.permute_layout.PERMUTE_LAYOUT` of a ``dense`` weight's
    shared tile (``[cols, bk]``: rows ``n``, the digits (lane ``t`` < 4, column block ``j`` <
    NJ, ``e`` < 2), columns (``kh``, ``kl`` < 8)) on the wgmma route: stored as (``kh``, ``j``,
    ``t``, ``e``, ``kl``), i.e. ``[bk / 8][cols][8]`` with the thread's column ``(j, e)`` at
    ``8 j + 2 t + e``: the K-major layout
    :func:`~kiln.tir.tensor_intrin.wgmma.b_operand_k_major` describes (``imm-trans-b`` 0).
    16-byte chunks along K stay whole."""
    return (_last(ndim), (4, nj, 2, bk // 8, 8), (3, 1, 0, 2, 4))


def _reads_rows_of_b(sch: Any, block: Any) -> bool:
    """Whether the GEMM ``block`` reads its second operand as ``[n, k]`` (a ``dense``
    weight), not ``[k, n]``: its last index is the reduction's."""
    stmt = sch.get(block)
    reduce_vars = [iv.var for iv in stmt.iter_vars if iv.iter_type == IterType.COMM_REDUCE]
    found: list[Any] = []
    post_order_visit(stmt.reads[1].region[-1].min, lambda n: found.append(n) if any(
        n is v for v in reduce_vars) else None)
    return bool(found)


def wgmma_shape(m: int, n: int) -> tuple[int, int, int] | None:
    """The default ``gpu_wgmma_shape``: the first of :data:`WGMMA_SHAPES` whose block tile
    divides ``m x n``, None when none does."""
    return next(((wg, mi, nj) for wg, mi, nj in WGMMA_SHAPES
                 if m % (64 * wg * mi) == 0 and n % (8 * nj) == 0), None)


def wgmma_shared_bytes(bm: int, bn: int, bk: int, stages: int) -> int:
    """Shared bytes of the wgmma route's unpadded tiles in ``stages`` stages."""
    return stages * (bm * bk + bk * bn) * 2


def schedule_wgmma_gemm(sch: Any, target: Any, block: Any, rows_fused: bool) -> None:
    """A float16/bfloat16 GEMM on sm_90's warpgroup tensor-core instruction (knob
    ``gpu_mma_wgmma``, off by default): each warpgroup (4 warps, ``threadIdx.y`` 4 q to
    4 q + 3) computes ``MI`` products of 64 x ``8 NJ`` per 16-deep step with
    ``wgmma.mma_async`` from both operands in shared memory, named by matrix descriptors
    (:mod:`kiln.tir.tensor_intrin.wgmma`), accumulating in float32 registers.

    The output rows of a warpgroup are split (``w``, ``g``, ``2 MI``), its columns (``t``,
    ``2 NJ``), ``g`` and ``t`` fused into ``threadIdx.x``: each thread's accumulators are one
    dense ``2 MI x 2 NJ`` register tile, its part of the accumulator fragment through the
    shared layouts :func:`wgmma_a_layout` and :func:`wgmma_b_layout` (no swizzle: core matrices
    of 8 x 16 bytes). The tiles are copied by the ``cp.async`` pipeline (A in 16-byte chunks,
    B in 4-byte pairs) into ``gpu_mma_async_stages`` stages (at least 2; default
    :data:`WGMMA_STEPS`'s), ``gpu_mma_bk`` deep, one intrinsic call per step (its ``bk / 16 x
    MI`` products in one commit group, one wait); the write-back as the mma route's. Knobs:
    ``gpu_wgmma_shape`` (:data:`WGMMA_SHAPES`, default :func:`wgmma_shape`), ``gpu_mma_bk``,
    ``gpu_mma_async_stages``, ``gpu_mma_vector_stores``. Refused (ScheduleError) on targets
    :func:`wgmma_refusal` names and on shapes the tiles do not divide. A ``dense`` weight
    ``W[n, k]`` is B K-major (:func:`wgmma_b_k_major_layout`, copied 16 bytes at a time)."""
    reason = wgmma_refusal(target)
    if reason:
        raise ScheduleError(f"wgmma GEMM: {reason}")
    spatial, k, ext = gemm_nest(sch, block, "wgmma GEMM")
    dtype = str(sch.get(block).reads[0].buffer.dtype)
    if dtype not in MMA_DTYPES:
        raise ScheduleError(f"wgmma GEMM: {dtype} operands (float16 or bfloat16 only)")
    fused_rows = rows_fused and len(spatial) > 2
    if fused_rows and wgmma_shape(ext[-3], ext[-2]) is not None:
        rows_fused = fused_rows = False  # the last row axis alone fills the tiles
    batch, i, j, m = gemm_axes(sch, spatial, ext, rows_fused)
    n, kk = ext[-2], ext[-1]
    default = wgmma_shape(m, n)
    if default is None:
        raise ScheduleError(f"wgmma GEMM: {m}x{n} is not a multiple of a block tile "
                            f"(rows of 64, columns of 8: {WGMMA_SHAPES})")
    wg, mi, nj = knob("gpu_wgmma_shape", WGMMA_SHAPES, default)
    bm, bn = 64 * wg * mi, 8 * nj
    if 128 * wg > target.gpu.max_threads_per_block:
        raise ScheduleError("wgmma GEMM: the target's blocks are too small")
    limit = target.gpu.shared_memory_per_block_optin
    step = next(((b, st) for b, st in WGMMA_STEPS if kk % b == 0
                 and wgmma_shared_bytes(bm, bn, b, st) <= limit), WGMMA_STEPS[-1])
    bk = knob("gpu_mma_bk", MMA_BK_CHOICES, step[0])
    stages = knob("gpu_mma_async_stages", MMA_ASYNC_STAGES, step[1])
    if m % bm or n % bn or kk % bk or bk % MMA_K:
        raise ScheduleError(f"wgmma GEMM: {m}x{n}x{kk} is not a multiple of the tile "
                            f"{bm}x{bn}x{bk}")
    if fused_rows and ext[-3] % bm and bm % ext[-3]:
        # the shared tile is the box of the rows a block reads: it must be the block's rows
        raise ScheduleError(f"wgmma GEMM: a block's {bm} rows, fused over leading axes of "
                            f"{ext[-3]} rows, are no box of the operand")
    if stages < 2:
        raise ScheduleError("wgmma GEMM: the tiles come through a cp.async pipeline "
                            "(gpu_mma_async_stages 2 or more)")
    shared = wgmma_shared_bytes(bm, bn, bk, stages)
    if shared > limit:
        raise ScheduleError(f"wgmma GEMM: the tiles ({shared} bytes) exceed the target's "
                            f"shared memory ({limit})")
    io, wgo, w, g, ri = sch.split(i, [None, wg, 4, 8, 2 * mi])
    jo, t, rj = sch.split(j, [None, 4, 2 * nj])
    ko, kin = sch.split(k, [None, bk])
    sch.reorder(io, jo, wgo, w, g, t, ko, ri, rj, kin)  # one intrinsic call per stage
    acc = warp_accumulators(sch, block, batch, io, jo, (wgo, w), (g, t))
    # a dense weight W[n, k] is read [n, k]: B K-major, stored and copied like A
    b_k_major = _reads_rows_of_b(sch, block)
    layouts = (wgmma_a_layout(wg, mi, bk),
               wgmma_b_k_major_layout(nj, bk) if b_k_major else wgmma_b_layout(nj, bk))
    for index, layout in enumerate(layouts):
        cache = sch.cache_read(block, index, "shared")
        sch.compute_at(cache, ko, cooperative=True)
        cooperative_copy(sch, cache, ko, 4 * wg, 32, 8 if index == 0 or b_k_major else 2)
        ndim = sch.get(cache).writes[0].buffer.ndim
        sch.annotate(cache, PERMUTE_LAYOUT, (_last(ndim), *layout[1:]))
        # the layouts' digits then simplify against the thread and step loops: a few adds
        # per copy instead of 64-bit divisions of the flattened tile index
        sch.annotate(cache, SUBSTITUTE_BINDINGS, 1)
    sch.decompose_reduction(block, ko)
    sch.annotate(ko, ASYNC_STAGES, stages)
    b_op = b_operand_k_major(bn, bk) if b_k_major else b_operand(bk, bn)
    sch.tensorize(ri, register_wgmma_intrinsic(dtype, mi, nj, a_operand(bm, bk), b_op, bk))
    fold_epilogues(sch, target, acc)
    if knob("gpu_mma_vector_stores", (False, True), True):
        vectorize_write_back(sch, acc, 4)


def mma_supported(target: Any, dtype: Any) -> bool:
    """Whether ``target`` multiplies ``dtype`` operands on tensor cores (``mma.sync``, CUDA
    sm_80 and later: every architecture kiln targets), or -- OpenCL -- runs the same schedule
    with each thread computing its part in float32 (PoCL, in CI)."""
    return str(dtype) in MMA_DTYPES and target.kind in ("cuda", "opencl")


def mma_tile(m: int, n: int, batch: int, warps: tuple[int, int], multiprocessors: int,
             tiles: tuple[tuple[int, int], ...] = MMA_TILES) -> tuple[int, int] | None:
    """The first of ``tiles`` (:data:`MMA_TILES`) whose block tile (``warps`` warps) divides
    ``batch`` ``m x n`` products into at least ``multiprocessors`` blocks, else the dividing
    one with the most blocks; None when none divides them."""
    wy, wx = warps
    fits = [(mi, ni) for mi, ni in tiles if m % (wy * 16 * mi) == 0
            and n % (wx * 8 * ni) == 0]
    if not fits:
        return None

    def blocks(tile: tuple[int, int]) -> int:
        return batch * (m // (wy * 16 * tile[0])) * (n // (wx * 8 * tile[1]))

    return next((f for f in fits if blocks(f) >= multiprocessors), max(fits, key=blocks))


def mma_warps(m: int, n: int, batch: int, multiprocessors: int) -> tuple[int, int]:
    """The default warps per block: the first of :data:`MMA_WARPS` with a tile that divides
    ``batch`` ``m x n`` products (a 16-row product gets 1 x 1), else the first."""
    return next((w for w in MMA_WARPS if mma_tile(m, n, batch, w, multiprocessors)),
                MMA_WARPS[0])


def schedule_mma_gemm(sch: Any, target: Any, block: Any, rows_fused: bool,
                      gathers: tuple[str, ...] = (), substitute_gathers: bool = False
                      ) -> None:
    """A float16/bfloat16 GEMM on tensor cores: each warp computes ``16 MI x 8 NI`` outputs as
    ``MI x NI`` ``mma.sync.m16n8k16`` per 16-deep reduction step, from tiles of A and B that
    the block's threads copy into shared memory together (rows padded so that the lanes'
    fragment loads hit distinct banks), accumulating in float32 registers.

    The output rows of a warp are split ``(g, 2 MI)`` and its columns ``(t, 2 NI)``, ``g`` and
    ``t`` fused into ``threadIdx.x`` (the lane ``4 g + t``), so each thread's accumulators are
    one dense ``2 MI x 2 NI`` register tile and each ``2 x 2 x 16`` piece of it is the lane's
    part of one ``mma`` (:mod:`kiln.tir.tensor_intrin.gpu`, tensorized). Epilogues are folded
    into the write-back as in :func:`schedule_tiled_gemm`. ``gathers`` names element-wise
    blocks that produce A or B (an implicit GEMM's im2col, :mod:`kiln.schedule.gpu.conv_mma`):
    they are computed inside the shared copies, never stored; ``substitute_gathers`` marks
    those copies :data:`~kiln.tir.transform.convert_blocks_to_loops.SUBSTITUTE_BINDINGS` (their
    indices then simplify against the reduction loop). Knobs: ``gpu_mma_warps``
    (default :func:`mma_warps`), ``gpu_mma_tiles`` (default :func:`mma_tile`'s choice),
    ``gpu_mma_bk`` (default the first of :data:`MMA_BK_CHOICES` that divides the reduction),
    ``gpu_mma_stages``, ``gpu_mma_async_stages`` (:data:`MMA_ASYNC_STAGES`; when on, the
    tiles are copied with ``cp.async`` into that many rotating shared stages instead, their
    rows padded by :data:`ASYNC_ALIGN`, A's rows permuted by :func:`mma_row_order`, and with
    ``gpu_mma_b_chunks`` (off: 2-way instead of 4-way bank conflicts, but NVRTC gives 4 x 8
    tiles 255 registers and small spills at bk 64) B's columns by :func:`mma_column_chunks`
    when NI is 8; refused with ``gathers``, whose copies compute),
    ``gpu_mma_ldmatrix`` (off by default: CUDA loads A's fragments with ``ldmatrix.x4``,
    from the same padded, :func:`mma_row_order` tile; one per ``mma``, so each fragment is
    loaded ``NI`` times where the plain loads are shared by the compiler),
    ``gpu_mma_fragments`` (on by default: one warp-tile intrinsic per 16-deep step,
    :func:`~kiln.tir.tensor_intrin.gpu.register_mma_tile_intrinsic`, every fragment loaded
    once by ``ldmatrix``, A in :func:`mma_row_order`, B in :func:`mma_column_order`; its
    defaults :data:`FRAGMENT_TILES` and, without gathers, :data:`FRAGMENT_STEPS`; it replaces
    ``gpu_mma_ldmatrix`` and ``gpu_mma_b_chunks``), ``gpu_mma_vector_stores`` (on: the
    write-back in vectors of 4, :func:`vectorize_write_back`), ``gpu_mma_copy_bindings``
    (off: the copies of permuted tiles marked ``SUBSTITUTE_BINDINGS`` too, their layout's
    digits computed from the thread loops instead of divisions of the flattened index --
    fewer registers, but slower on the H100), ``gpu_mma_group_rows`` (:func:`bind_blocks`)."""
    spatial, k, ext = gemm_nest(sch, block, "mma GEMM")
    sms = target.gpu.multiprocessors
    rows = math.prod(ext[:-2]) if rows_fused else ext[-3]
    batch_size = 1 if rows_fused else math.prod(ext[:-3])
    wy, wx = warps = knob("gpu_mma_warps", MMA_WARPS, mma_warps(rows, ext[-2], batch_size, sms))
    if wy * wx * 32 > target.gpu.max_threads_per_block:
        raise ScheduleError("mma GEMM: the target's blocks are too small")
    fragments = knob("gpu_mma_fragments", (False, True), True)
    tiles = FRAGMENT_TILES if fragments and not gathers else MMA_TILES
    if rows_fused and len(spatial) > 2 and mma_tile(
            ext[-3], ext[-2], math.prod(ext[:-3]), warps, sms, tiles) is not None:
        rows_fused = False  # the last row axis alone fills the tiles: no div/mod in indices
    batch, i, j, m = gemm_axes(sch, spatial, ext, rows_fused)
    n, kk = ext[-2], ext[-1]
    tile = mma_tile(m, n, math.prod(ext[:len(batch)]), warps, sms, tiles)
    if tile is None:
        raise ScheduleError(f"mma GEMM: {m}x{n} is not a multiple of a tile")
    mi, ni = knob("gpu_mma_tiles", MMA_TILES, tile)
    bm, bn = wy * 16 * mi, wx * 8 * ni
    limit = target.gpu.shared_memory_per_block_optin
    step = next((b for b in MMA_BK_CHOICES if kk % b == 0), MMA_BK_CHOICES[-1]), 0
    if fragments and not gathers:
        step = next(((b, st) for b, st in FRAGMENT_STEPS if kk % b == 0 and mma_shared_bytes(
            bm, bn, b, st, True) <= limit), step)
    bk = knob("gpu_mma_bk", MMA_BK_CHOICES, step[0])
    if m % bm or n % bn or kk % bk or bk % MMA_K:
        raise ScheduleError(f"mma GEMM: {m}x{n}x{kk} is not a multiple of the tile "
                            f"{bm}x{bn}x{bk}")
    dtype = str(sch.get(block).reads[0].buffer.dtype)
    async_stages = knob("gpu_mma_async_stages", MMA_ASYNC_STAGES, step[1])
    ldmatrix = not fragments and knob("gpu_mma_ldmatrix", (False, True), False)
    if async_stages and gathers:
        raise ScheduleError("mma GEMM: asynchronous copies move plain loads; the gathered "
                            f"operands ({', '.join(gathers)}) are computed in their copies")
    if async_stages or ldmatrix or fragments:
        shared = mma_shared_bytes(bm, bn, bk, async_stages, bool(async_stages or fragments))
    else:
        shared = (bm * (bk + 2) + bk * (bn + 2)) * 2
        limit = target.gpu.shared_memory_per_block
    if shared > limit:
        raise ScheduleError(f"mma GEMM: the tiles ({shared} bytes) exceed the target's "
                            f"shared memory ({limit})")
    io, wi, g, ri = sch.split(i, [None, wy, 8, 2 * mi])
    jo, wj, t, rj = sch.split(j, [None, wx, 4, 2 * ni])
    ko, kt, k16 = sch.split(k, [None, bk // MMA_K, MMA_K])
    if fragments:  # one intrinsic per warp tile and 16-deep step
        sch.reorder(io, jo, wi, wj, g, t, ko, kt, ri, rj, k16)
    else:
        ri_o, ri_i = sch.split(ri, [mi, 2])
        rj_o, rj_i = sch.split(rj, [ni, 2])
        sch.reorder(io, jo, wi, wj, g, t, ko, kt, ri_o, rj_o, ri_i, rj_i, k16)
    acc = warp_accumulators(sch, block, batch, io, jo, (wi, wj), (g, t))
    # rows of A: stride = 2 mod 4 elements (odd words): the 8 lane groups' rows, 2 MI apart,
    # fall on distinct (MI <= 2) or pairwise-shared banks. A fragment load of B reads the words
    # t * stride / 2 + (g / 2) * NI (t, g / 2 < 4): distinct banks for an odd stride, and for
    # NI >= 8 also for a stride = 2 mod 8, which keeps the rows 4-byte aligned (vector stores)
    b_align = (-2, 8, 2) if ni >= 8 else (-2, 2, 1)
    b_chunks = bool(async_stages) and ni % 8 == 0 and knob("gpu_mma_b_chunks", (False, True),
                                                           False)
    b_chunks = b_chunks and not fragments
    aligns = (ASYNC_ALIGN if async_stages or ldmatrix or fragments else (-2, 4, 2),
              ASYNC_ALIGN if async_stages or fragments else b_align)
    # a permuted tile's copies index it through the layout's digits: with their bindings
    # substituted those simplify against the thread loops (NVRTC: the default 4096^3 float16
    # kernel 232 -> 164 registers) -- but the H100 ran that kernel slower (0.827 against
    # 0.639 ms, one process): off by default on this route (the wgmma route's are on)
    permuted = not gathers and bool(ldmatrix or async_stages or fragments or b_chunks)
    copy_bindings = knob("gpu_mma_copy_bindings", (False, True), False)
    for index, align in enumerate(aligns):
        cache = sch.cache_read(block, index, "shared")
        sch.compute_at(cache, ko, cooperative=True)
        # B's column pairs stay whole under mma_column_order, not 16-byte chunks
        vector = 2 if fragments and async_stages and index == 1 else 8 if async_stages else 4
        cooperative_copy(sch, cache, ko, wy * wx, 32, vector)
        sch.annotate(cache, STORAGE_ALIGN, align)
        if (ldmatrix or async_stages or fragments) and index == 0:
            sch.annotate(cache, PERMUTE_LAYOUT, mma_row_order(wy, mi))
        if b_chunks and index == 1:
            sch.annotate(cache, PERMUTE_LAYOUT, mma_column_chunks(wx, ni))
        if fragments and index == 1:
            sch.annotate(cache, PERMUTE_LAYOUT, mma_column_order(wx, ni))
        if (gathers and substitute_gathers) or (permuted and copy_bindings):
            sch.annotate(cache, SUBSTITUTE_BINDINGS, 1)
    for name in gathers:
        sch.compute_inline(sch.get_block(name))
    sch.decompose_reduction(block, ko)
    if async_stages:
        sch.annotate(ko, ASYNC_STAGES, async_stages)
    elif knob("gpu_mma_stages", STAGE_CHOICES, MMA_STAGES) == 2:
        sch.annotate(ko, PREFETCH, 1)
    if fragments:
        sch.tensorize(ri, register_mma_tile_intrinsic(dtype, mi, ni))
        sch.unroll(kt)
    else:
        lane_cols = 8 if b_chunks else 2 * ni  # lane t's columns from lane t - 1's
        sch.tensorize(ri_i, register_mma_intrinsic(dtype, lane_cols, ldmatrix))
        for lp in (kt, ri_o, rj_o):
            sch.unroll(lp)
    fold_epilogues(sch, target, acc)
    if knob("gpu_mma_vector_stores", (False, True), True):
        vectorize_write_back(sch, acc, 4)


def vectorize_write_back(sch: Any, write_back: Any, lanes: int) -> None:
    """Store each thread's accumulator rows ``lanes`` elements at a time: its ``2 NI``
    columns are adjacent, so the write-back's inner loop splits into vectors (``ushort4`` for
    float16: a warp's store then covers 8 rows x 4 chunks of 8 bytes instead of 32 lone
    elements, each in its own 32-byte sector, as Nsight Compute reported on the H100)."""
    inner = sch.get_loops(write_back)[-1]
    extent = as_int(sch.get(inner).extent)
    if extent is not None and extent % lanes == 0 and extent > lanes:
        _, vec = sch.split(inner, [None, lanes])
        sch.vectorize(vec)
    elif extent == lanes:
        sch.vectorize(inner)


def schedule_gemm(sch: Any, target: Any, name: str, rows_fused: bool) -> None:
    """The GEMM block ``name``: on tensor cores when its operands are float16/bfloat16 and
    its shape fits the tiles (knob ``gpu_gemm_mma``, on by default), else the tiled GEMM."""
    block = sch.get_block(name)
    operands = {str(r.buffer.dtype) for r in sch.get(block).reads}
    if len(operands) == 1 and mma_supported(target, operands.pop()) and \
            knob("gpu_gemm_mma", (True, False), True):
        if knob("gpu_mma_wgmma", (False, True), False):
            trial = sch.copy()
            try:
                schedule_wgmma_gemm(trial, target, trial.get_block(name), rows_fused)
            except ScheduleError as err:
                logger.warning("%s: not on wgmma (the mma.sync route instead): %s", name, err)
            else:
                sch.adopt(trial)
                return
        trial = sch.copy()
        try:
            schedule_mma_gemm(trial, target, trial.get_block(name), rows_fused)
        except ScheduleError:
            pass
        else:
            sch.adopt(trial)
            return
    schedule_tiled_gemm(sch, target, block, rows_fused)


def accumulator_dtype(block: Any) -> str | None:
    """float32 for a product of 16-bit floats (float16, bfloat16): its sums stay in float32
    registers and are rounded once, at the store, as cuBLAS and torch do; None (the output's
    dtype) otherwise."""
    dt = block.writes[0].buffer.dtype
    wide = reduction_accumulator(dt)  # the one policy: float32 for 16-bit floats
    return str(wide) if wide != dt.element else None


def cooperative_copy(sch: Any, copy: Any, at: Any, threads_y: int, threads_x: int,
                     max_lanes: int = 4) -> None:
    """Divide ``copy``, a copy of a tile into shared memory computed at loop ``at`` under the
    ``threadIdx.y/x`` loops of a ``threads_y x threads_x`` block (so covering what all the
    threads read), among the threads: its loops fused, split over ``threadIdx.y`` x
    ``threadIdx.x`` x :func:`copy_lanes` elements, the lanes vectorized. Each element of the
    tile is then loaded once per block instead of once per thread that reads it. ``max_lanes``
    raises the vector's 4 elements (an asynchronous copy moves 16 bytes: 8 float16)."""
    loops = sch.get_loops(copy)
    at_var = sch.get(at).loop_var
    own = loops[[sch.get(lp).loop_var for lp in loops].index(at_var) + 1:]
    if not own:
        raise ScheduleError("tiled GEMM: the shared tile's copy has no loop")
    inner = as_int(sch.get(own[-1]).extent)
    fused = sch.fuse(*own) if len(own) > 1 else own[0]
    total = as_int(sch.get(fused).extent)
    lanes = copy_lanes(inner, total, threads_y * threads_x, sch.get(copy).writes[0].buffer,
                       max_lanes)
    _, ty, tx, vec = sch.split(fused, [None, threads_y, threads_x, lanes])
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    if lanes > 1:
        sch.vectorize(vec)


def copy_lanes(inner: int | None, total: int | None, threads: int, buffer: Any,
               max_lanes: int = 4) -> int:
    """Elements per vector load of a cooperative copy: ``max_lanes`` (4 by default: a
    ``float4``, the widest vector the dialects spell), 16 bytes at most, when the tile's rows and
    the whole tile split into such vectors, else fewer, down to 1."""
    lanes = min(max_lanes, 16 // max(1, buffer.dtype.element.itemsize))
    while lanes > 1 and (inner is None or total is None or inner % lanes
                         or total % (lanes * threads)):
        lanes //= 2
    return lanes


def fold_epilogues(sch: Any, target: Any, write_back: Any) -> None:
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
    schedule_gemm(sch, target, "matmul", rows_fused=False)


@register_schedule("dense", "gpu")
def schedule_dense(sch: Any, target: Any) -> None:
    """``dense`` (``x @ W.T``, every leading axis of ``x`` a row): the tiled GEMM."""
    _prepare(sch)
    schedule_gemm(sch, target, "dense", rows_fused=True)
