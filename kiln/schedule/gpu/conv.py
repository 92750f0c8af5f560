"""GPU schedules of 2-D convolution (``nn.conv2d`` with NCHW data and OIHW weights, the
layouts the GPU build keeps: AlterOpLayout has no GPU hook): an implicit GEMM for dense and
grouped convolutions, a pixel-tiled schedule for depthwise ones.

Implicit GEMM: the convolution is a matrix product whose rows are output channels (M), whose
columns are output pixels (N) and whose reduction runs over input channels x taps (K). A
block of ``threads_o x threads_y x threads_x`` threads (``threadIdx.z/y/x``) computes
``BM = threads_o * reg_o`` output channels of a 2-D pixel tile of ``threads_y`` rows by
``threads_x * reg_x`` columns (a box, so that the input it reads is a box too: its shared
copy has a constant size); the grid is (tile columns, channel tiles, batch x tile rows). Each
thread keeps its ``reg_o x reg_x`` accumulators in registers (``local``; float32 for a
float16/bfloat16 convolution, rounded once at the store as on the tensor cores:
:func:`kiln.schedule.gpu.linalg.accumulator_dtype`). The reduction is
stepped ``k_channels`` input channels at a time (all ``KH x KW`` taps of each): the step's
weight tile and input box are copied into shared memory, the zero padding computed in the
copy (the padded input is never written to global memory), the threads synchronize and
accumulate from shared memory. Strides, dilation and groups stay in the index expressions.
Element-wise epilogues the fusion gives the convolution (bias, batch-norm scale and shift,
relu, the residual add) are folded into the write-back of the accumulators: one kernel per
fused convolution. Each thread copies the part of the shared tiles it reads itself (as the
tiled GEMM of :mod:`kiln.schedule.gpu.linalg` does: a thread index drives one loop per nest),
so the copies of a step are repeated by the threads that share a part.

Depthwise convolution (one input and one output channel per group): the grid is (tile
columns, channels, batch x tile rows), each thread computes ``reg_x`` outputs of a row; the
input box of the block's pixel tile, halo included, is copied into shared memory once, by
all the block's threads together (a copy nest beside the compute nest, bound to the same
thread indices), and the taps read from it. Its accumulators are float32 for 16-bit data as well.

float16/bfloat16 convolutions with groups 1 go to the tensor cores instead
(:mod:`kiln.schedule.gpu.conv_mma`: an explicit im2col GEMM on mma tiles; knob
``gpu_conv_mma``); what that path refuses is logged (a warning naming the shape and why) and
takes the implicit GEMM here.

Every tunable number is a knob (:func:`kiln.schedule.knobs.knob`) whose default is chosen
from the shape and the target's limits (:func:`conv_tiles`, :func:`depthwise_tiles`).
Symbolic shapes and other layouts are refused (ScheduleError) and get the generic rules.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ...arith.analyzer import simplify
from ...ir.errors import ScheduleError
from ...op.nn.convolution import CONV_LAYOUTS
from ...tir.expr import BufferLoad, IntImm
from ...tir.functor import post_order_visit, substitute
from ...tir.schedule.analysis import as_int
from ...tir.stmt import ForKind
from ..knobs import knob
from ..registry import register_schedule
from . import rules
from .conv_mma import schedule_conv_mma
from .linalg import accumulator_dtype, fold_epilogues, mma_supported

#: Warns of a float16/bfloat16 convolution that does not run on tensor cores, and why.
logger = logging.getLogger(__name__)

#: Threads per block along the output channels, and along an output row and the rows of the
#: pixel tile (the pixel tile is 2-D: the input patch of a tile is then a box of constant size).
THREADS_O = (1, 2, 4, 8, 16)
THREADS_X = (4, 8, 16, 32)
THREADS_Y = (1, 2, 4, 8, 16)
#: The most threads along the output channels the default tiles take (a 16-channel tile):
#: with 8, ptxas (sm_80, sm_90) spilled 4 to 8 bytes in some of ResNet-18's convolutions.
THREADS_O_DEFAULT = 4
#: Outputs per thread along the output channels and along the output row.
REG_O = (1, 2, 4, 8)
REG_X = (1, 2, 4)
#: Input channels per reduction step (all taps of each).
K_CHANNELS = (1, 2, 4, 8, 16)
#: The deepest step the default tiles take: with 8 or 16, ptxas spilled 4 to 8 bytes in
#: some of ResNet-18's convolutions at 224 x 224 (sm_80 and sm_90, 32 registers, e.g. the
#: stride-2 64 -> 128 channel 3 x 3 one); with 4 none did.
K_CHANNELS_DEFAULT = 4
#: Threads per block (a power of two) the default tiles aim at.
BLOCK_THREADS = 256


@dataclass(frozen=True)
class ConvShape:
    """The extents of a conv2d block's loops and the geometry its indices use."""

    n: int
    o: int
    h: int
    w: int
    c: int          # input channels per group (the reduction's channel extent)
    kh: int
    kw: int
    stride: tuple[int, int]
    dilation: tuple[int, int]


@dataclass(frozen=True)
class ConvTiles:
    """One point of the schedules' search space (depthwise: ``threads_o = reg_o = 1``)."""

    threads_o: int
    threads_y: int
    threads_x: int
    reg_o: int
    reg_x: int
    k_channels: int

    @property
    def threads(self) -> int:
        return self.threads_o * self.threads_y * self.threads_x


def _pow2_at_least(n: int, choices: tuple[int, ...]) -> int:
    return next((c for c in choices if c >= n), choices[-1])


def patch_floats(shape: ConvShape, tiles: ConvTiles, groups_in_tile: int = 1) -> int:
    """Floats of the shared input patch of one reduction step: ``k_channels`` channels (of
    each group the tile's output channels span) x the input box the pixel tile reads."""
    # + 1 each way: the interval analysis of a tile's indices may reach one further
    rows = (tiles.threads_y - 1) * shape.stride[0] + (shape.kh - 1) * shape.dilation[0] + 2
    cols = ((tiles.threads_x * tiles.reg_x - 1) * shape.stride[1]
            + (shape.kw - 1) * shape.dilation[1] + 2)
    return groups_in_tile * tiles.k_channels * rows * cols


def shared_bytes(shape: ConvShape, tiles: ConvTiles, groups_in_tile: int = 1) -> int:
    """Shared memory of a block (weight tile + input patch of one step, float32)."""
    weights = tiles.threads_o * tiles.reg_o * tiles.k_channels * shape.kh * shape.kw
    return 4 * (weights + patch_floats(shape, tiles, groups_in_tile))


def pixel_tile(shape: ConvShape, threads: int) -> tuple[int, int, int]:
    """(threads_y, threads_x, reg_x) of a pixel tile of at most ``threads`` threads: an
    output row covered by as few threads as give 2 outputs each, the rest along the rows."""
    reg_x = 2 if shape.w >= 8 else 1
    threads_x = min(_pow2_at_least(-(-shape.w // reg_x), THREADS_X), threads)
    threads_y = max(1, min(_pow2_at_least(shape.h, THREADS_Y), threads // threads_x))
    return threads_y, threads_x, reg_x


def conv_tiles(shape: ConvShape, target: Any, out_per_group: int) -> ConvTiles:
    """The default tiles of the implicit GEMM: 4 output channels per thread where there are
    16 or more (with ``reg_x`` 2, an 8-float accumulator tile: registers stay well under the
    limits), up to ``THREADS_O_DEFAULT`` threads along the output channels (each input value
    in shared memory feeds ``threads_o * reg_o`` outputs), the rest of ``BLOCK_THREADS``
    along the pixels, then the deepest reduction step (up to ``K_CHANNELS_DEFAULT``) the
    target's shared memory holds."""
    most = min(BLOCK_THREADS, target.gpu.max_threads_per_block)
    reg_o = 4 if shape.o >= 16 else 1
    want_o = min(THREADS_O_DEFAULT, -(-shape.o // reg_o), most // THREADS_X[0])
    threads_o = max(t for t in THREADS_O if t <= want_o)
    t_y, t_x, reg_x = pixel_tile(shape, most // threads_o)
    span = _groups_in_tile(threads_o * reg_o, out_per_group)
    for kc in sorted(K_CHANNELS, reverse=True):
        if kc > K_CHANNELS_DEFAULT or (kc > 1 and (kc > shape.c or shape.c % kc)):
            continue
        tiles = ConvTiles(threads_o, t_y, t_x, reg_o, reg_x, kc)
        if shared_bytes(shape, tiles, span) <= target.gpu.shared_memory_per_block:
            return tiles
    return tiles


def _groups_in_tile(bm: int, out_per_group: int) -> int:
    """Groups a tile of ``bm`` output channels spans (at most)."""
    if out_per_group >= bm and out_per_group % bm == 0:
        return 1
    return -(-bm // out_per_group) + 1


def depthwise_tiles(shape: ConvShape, target: Any) -> ConvTiles:
    """The default tiles of the depthwise schedule: the pixel tile alone."""
    most = min(BLOCK_THREADS, target.gpu.max_threads_per_block)
    t_y, t_x, reg_x = pixel_tile(shape, most)
    return ConvTiles(1, t_y, t_x, 1, reg_x, 1)


def _extents(sch: Any, loops: list[Any]) -> list[int]:
    out = [as_int(sch.get(lp).extent) for lp in loops]
    if any(e is None for e in out):
        raise ScheduleError("conv2d GPU schedule: symbolic extents (the generic rules take them)")
    return out  # type: ignore[return-value]


def _conv_nest(sch: Any) -> tuple[Any, list[Any], list[int]]:
    """The conv2d block, its seven loops (n, o, y, x, rc, ry, rx) and their extents."""
    block = sch.get_block("conv2d")
    if sch.get(block).annotations.get(CONV_LAYOUTS):
        raise ScheduleError("conv2d GPU schedule: NCHW data and OIHW weights only (the generic "
                            "rules take other layouts)")
    loops = rules.perfect_loops(sch, block)
    if loops is None or len(loops) != 7:
        raise ScheduleError("conv2d GPU schedule: not a perfect nest of 7 loops")
    roles = rules.loop_roles(sch, block, loops)
    if roles[:4] != ["spatial"] * 4 or any(r not in ("reduce", "unused") for r in roles[4:]):
        raise ScheduleError("conv2d GPU schedule: expected 4 spatial and 3 reduction loops")
    return block, loops, _extents(sch, loops)


def _coefficient(index: Any, var: Any, others: list[Any]) -> int:
    """The constant coefficient of ``var`` in the affine ``index`` (``others`` set to 0)."""
    vmap = {v: IntImm(v.dtype, 0) for v in others if v is not var}
    at = [simplify(substitute(index, {**vmap, var: IntImm(var.dtype, k)})) for k in (0, 1)]
    if not all(isinstance(a, IntImm) for a in at):
        raise ScheduleError("conv2d GPU schedule: the input index is not affine")
    return int(at[1].value - at[0].value)


def _geometry(sch: Any, block: Any, ext: list[int]) -> tuple[ConvShape, int]:
    """The shape of the convolution and its output channels per group, read off the block's
    input access ``src[n, chan, y * sh + ry * dh, x * sw + rx * dw]``."""
    blk = sch.get(block)
    src = blk.reads[0].buffer
    in_c = as_int(simplify(src.shape[1])) if len(src.shape) == 4 else None
    if in_c is None:
        raise ScheduleError("conv2d GPU schedule: a 4-D input of constant shape expected")
    ivs = [iv.var for iv in blk.iter_vars]
    load = _first_load(blk, src)
    hi, wi = load.indices[2], load.indices[3]
    stride = (_coefficient(hi, ivs[2], ivs), _coefficient(wi, ivs[3], ivs))
    dilation = (_coefficient(hi, ivs[5], ivs), _coefficient(wi, ivs[6], ivs))
    n, o, h, w, c, kh, kw = ext
    groups = max(1, in_c // c)
    shape = ConvShape(n, o, h, w, c, kh, kw, stride, dilation)
    return shape, o // groups


def _first_load(blk: Any, buffer: Any) -> Any:
    found: list[Any] = []
    post_order_visit(blk.body, lambda n: found.append(n) if isinstance(n, BufferLoad)
                     and n.buffer is buffer else None)
    if not found:
        raise ScheduleError("conv2d GPU schedule: the block does not load its input")
    return found[0]


def _stage_pad(sch: Any) -> None:
    """Compute the zero padding inside the shared copy (the padded input is never stored)."""
    try:
        sch.compute_inline(sch.get_block("conv2d_pad"))
    except ScheduleError:
        pass


def _tiles_knobs(dflt: ConvTiles, depthwise: bool) -> ConvTiles:
    """The tiles with every number asked of its knob (``dflt``: the defaults)."""
    pre = "gpu_dwconv" if depthwise else "gpu_conv"
    t_y = knob(f"{pre}_threads_y", THREADS_Y, dflt.threads_y)
    t_x = knob(f"{pre}_threads_x", THREADS_X, dflt.threads_x)
    r_x = knob(f"{pre}_reg_x", REG_X, dflt.reg_x)
    if depthwise:
        return ConvTiles(1, t_y, t_x, 1, r_x, 1)
    return ConvTiles(knob(f"{pre}_threads_o", THREADS_O, dflt.threads_o), t_y, t_x,
                     knob(f"{pre}_reg_o", REG_O, dflt.reg_o), r_x,
                     knob(f"{pre}_k_channels", K_CHANNELS, dflt.k_channels))


def _tile_pixels(sch: Any, target: Any, loops: list[Any], tiles: ConvTiles
                 ) -> tuple[Any, ...]:
    """Split y into tile rows x thread rows and x into tile columns x threads x registers:
    (n, tile rows, tile columns, thread rows, thread columns, register columns)."""
    if tiles.threads > target.gpu.max_threads_per_block:
        raise ScheduleError(f"conv2d GPU schedule: {tiles.threads} threads per block exceed "
                            "the target's limit")
    n, _, y, x = loops[:4]
    by, ty = sch.split(y, [None, tiles.threads_y])
    bx, tx, rx = sch.split(x, [None, tiles.threads_x, tiles.reg_x])
    return n, by, bx, ty, tx, rx


def _finish(sch: Any, target: Any, block: Any, init: Any, acc: Any, unrolled: int) -> None:
    """Unroll the compute's innermost ``unrolled`` loops and the register loops of the
    accumulators' initialization and write-back (indexed by constants, the accumulators stay
    in registers: a loop left rolled puts them on the stack), then fold the epilogues."""
    for lp in sch.get_loops(block)[-unrolled:]:
        sch.unroll(lp)
    fold_epilogues(sch, target, acc)
    for b in (init, acc):
        loops = sch.get_loops(b)
        bound = [k for k, lp in enumerate(loops) if sch.get(lp).kind == ForKind.THREAD_BINDING]
        for lp in loops[bound[-1] + 1 if bound else 0:]:
            sch.unroll(lp)


def schedule_implicit_gemm(sch: Any, target: Any, block: Any, loops: list[Any],
                           shape: ConvShape, out_per_group: int) -> None:
    """Tile the conv2d nest as the module docstring's implicit GEMM says."""
    tiles = _tiles_knobs(conv_tiles(shape, target, out_per_group), depthwise=False)
    n, by, bx, ty, tx, rx_reg = _tile_pixels(sch, target, loops, tiles)
    o, rc, ry, rx = loops[1], loops[4], loops[5], loops[6]
    bo, to, ro = sch.split(o, [None, tiles.threads_o, tiles.reg_o])
    kc = min(tiles.k_channels, shape.c)
    rco, rci = sch.split(rc, [None, kc])
    sch.reorder(n, by, bo, bx, to, ty, tx, rco, rci, ry, rx, ro, rx_reg)
    sch.bind(sch.fuse(n, by), "blockIdx.z")
    sch.bind(bo, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(to, "threadIdx.z")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    acc = sch.cache_write(block, 0, "local", accumulator_dtype(sch.get(block)))
    sch.reverse_compute_at(acc, tx)
    for index in (0, 1):
        cache = sch.cache_read(block, index, "shared")
        sch.compute_at(cache, rco)
    _stage_pad(sch)
    init = sch.decompose_reduction(block, rco)
    _finish(sch, target, block, init, acc, 2)


def schedule_depthwise(sch: Any, target: Any, block: Any, loops: list[Any],
                       shape: ConvShape) -> None:
    """The depthwise schedule of the module docstring: the input box of the block's pixel
    tile (halo included) copied into shared memory by all its threads together."""
    tiles = _tiles_knobs(depthwise_tiles(shape, target), depthwise=True)
    if shared_bytes(shape, tiles) > target.gpu.shared_memory_per_block:
        raise ScheduleError("depthwise GPU schedule: the input tile exceeds shared memory")
    n, by, bx, ty, tx, rx_reg = _tile_pixels(sch, target, loops, tiles)
    o, rc, ry, rx = loops[1], loops[4], loops[5], loops[6]
    sch.reorder(n, by, o, bx, ty, tx, rc, ry, rx, rx_reg)
    sch.bind(sch.fuse(n, by), "blockIdx.z")
    sch.bind(o, "blockIdx.y")
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    sch.bind(tx, "threadIdx.x")
    acc = sch.cache_write(block, 0, "local", accumulator_dtype(sch.get(block)))
    sch.reverse_compute_at(acc, tx)
    cache = sch.cache_read(block, 0, "shared")
    sch.compute_at(cache, bx)
    _stage_pad(sch)
    copy = sch.get_loops(cache)[3:]  # under blockIdx.z, y, x: the copy's own loops
    _, c_y, c_x = sch.split(sch.fuse(*copy), [None, tiles.threads_y, tiles.threads_x])
    sch.bind(c_y, "threadIdx.y")
    sch.bind(c_x, "threadIdx.x")
    init = sch.decompose_reduction(block, rc)
    _finish(sch, target, block, init, acc, 3)


@register_schedule("nn.conv2d", "gpu")
def schedule_conv2d(sch: Any, target: Any) -> None:
    """``nn.conv2d`` (NCHW/OIHW): depthwise when each group has one input channel and one
    output channel, float16/bfloat16 with groups 1 on tensor cores (knob ``gpu_conv_mma``),
    else the implicit GEMM."""
    block, loops, ext = _conv_nest(sch)
    shape, out_per_group = _geometry(sch, block, ext)
    if shape.c == 1 and out_per_group == 1 and shape.o > 1:
        schedule_depthwise(sch, target, block, loops, shape)
        return
    # the weight's: a float32-accumulating conv (ToMixedPrecision) pads its input in float32
    dtype = str(sch.get(block).reads[1].buffer.dtype)
    if out_per_group == shape.o and mma_supported(target, dtype) and \
            knob("gpu_conv_mma", (True, False), True):
        trial = sch.copy()
        try:
            schedule_conv_mma(trial, target)
        except ScheduleError as err:
            logger.warning("%s conv2d %s: not on tensor cores (SIMT implicit GEMM): %s",
                           dtype, shape, err)
        else:
            sch.adopt(trial)
            return
    schedule_implicit_gemm(sch, target, block, loops, shape, out_per_group)
