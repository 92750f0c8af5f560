"""CPU schedules of the convolutions (``nn.conv2d``, ``nn.conv2d_nchwc``,
``nn.depthwise_conv2d_nchwc``) and ``conv2d``'s layout preference: on CPUs a float32 NCHW
convolution becomes ``nn.conv2d_nchwc`` (output channels in blocks of one SIMD vector), whose
schedule is a register-blocked micro-kernel.
"""

from __future__ import annotations

from typing import Any

from ...ir.dtype import as_dtype
from ...op.layout import LayoutRewrite
from ...op.linalg import const_int, simplify
from ...op.nn.convolution import (
    CONV_LAYOUTS,
    Conv2DAttrs,
    conv2d_nchwc,
    depthwise_conv2d_nchwc,
)
from ...tir.stmt import FMA_IN_REGISTERS, JAM_TAILS
from ..knobs import graph_knob, knob
from ..registry import register_alter_layout, register_schedule
from .generic import schedule_reduction, target_threads
from .loops import (
    block_work,
    loop_extent,
    other_blocks,
    parallel_outer,
    pick_factor,
    schedule_epilogue,
    split_off,
    tiles_to_fill,
    vector_factor,
    vectorize_inner,
    write_out_tile,
)

#: Output channels per register tile of the conv2d schedule.
CONV_OC_TILE = 4


#: Candidate lengths of the output-width register tile of the channel-vectorized schedules.
CONV_X_TILES = [8, 7, 6, 5, 4, 3, 2]


@register_schedule("nn.conv2d", "c")
def _schedule_conv2d(sch: Any, target: Any) -> None:
    """CPU schedule of nn.conv2d, by layout: NCHW data with an OIHW weight
    (:func:`_schedule_conv2d_nchw`), channels-last data with O the weight's last axis (NHWC +
    HWIO, :func:`_schedule_conv2d_nhwc`), else the generic reduction schedule."""
    layouts = sch.get(sch.get_block("conv2d")).annotations.get(CONV_LAYOUTS, ("NCHW", "OIHW"))
    if tuple(layouts) == ("NCHW", "OIHW"):
        _schedule_conv2d_nchw(sch, target)
    elif layouts[0] == "NHWC" and layouts[1][-1] == "O":
        _schedule_conv2d_nhwc(sch, target)
    else:
        schedule_reduction(sch, target)


def _schedule_pad(sch: Any, target: Any, name: str, names: set[str]) -> None:
    """Padded copy of the input: parallel over its three outer axes."""
    if name in names:
        pad = sch.get_block(name)
        parallel_outer(sch, sch.get_loops(pad)[:3], target, work=block_work(sch, pad))


def _schedule_conv2d_nchw(sch: Any, target: Any) -> None:
    """Output-channel tiles, accumulated in place in the outer-product order of the GEMM.

    Loops: parallel(n, oc_outer[, y]) / y / rc, ry, rx / x_outer / oc_inner (unrolled) /
    x_inner (vectorized along the output width when a vector length divides it): each input
    vector is loaded once per tap for OC_TILE output channels, whose row segments stay in L1
    across the taps. The padded input is its own stage, copied in parallel row by row. Where
    a vector length divides the row, :func:`_schedule_conv2d_nchw_tiled` keeps a register tile
    instead.
    """
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_pad", "conv2d"})
    _schedule_pad(sch, target, "conv2d_pad", names)
    block = sch.get_block("conv2d")
    work = block_work(sch, block)
    n, o, y, x, rc, ry, rx = sch.get_loops(block)
    dtype = sch.get(block).writes[0].buffer.dtype
    ow = loop_extent(sch, x)
    xb = vector_factor(target, dtype, ow)
    o_ext = loop_extent(sch, o)
    if xb is not None and o_ext is not None and knob("conv_nchw_register_tile", (False, True),
                                                     True):
        _schedule_conv2d_nchw_tiled(sch, target, block, xb, rest, work)
        return
    vec = xb is not None
    if xb is None:
        xb = pick_factor(ow, list(range(min(16, ow or 0), 1, -1)))
    ob = pick_factor(o_ext, [knob("conv_oc_tile", (2, 4, 8), CONV_OC_TILE), CONV_OC_TILE, 2]
                     ) if o_ext is not None else None
    oo, oi = split_off(sch, o, ob)
    xo, xi = split_off(sch, x, xb)
    order = [n, oo, y, rc, ry, rx, xo] + [lp for lp in (oi, xi) if lp is not None]
    sch.reorder(*order)
    init = sch.decompose_reduction(block, rc)
    if oi is not None:
        sch.unroll(oi)
    if xi is not None:
        if vec:
            sch.vectorize(xi)
            init_loops = sch.get_loops(init)
            sch.vectorize(init_loops[-1])
        else:
            sch.unroll(xi)
    at = parallel_outer(sch, [n, oo, y], target, work=work)
    schedule_epilogue(sch, target, rest, at)


#: Most vector accumulators of the NCHW convolution's register tile, per vector length in
#: float32 lanes (16 registers with AVX2, 32 with AVX-512: the rest hold the input vector
#: and the broadcast weight).
CONV_NCHW_ACCUMULATORS = {8: 12, 16: 20}


def conv_nchw_tile(channels: int, vectors: int, lanes: int) -> tuple[int, int]:
    """The register tile ``(output channels, vectors along the row)`` of the NCHW
    convolution: the most accumulators up to :data:`CONV_NCHW_ACCUMULATORS` with both sizes
    dividing their axes (at most 8 each), the more channels among equals (each input vector
    then serves more of them)."""
    budget = CONV_NCHW_ACCUMULATORS.get(lanes, CONV_NCHW_ACCUMULATORS[8])
    best = (1, 1)
    for ob in range(1, min(8, channels) + 1):
        for xv in range(1, min(8, vectors) + 1):
            if channels % ob or vectors % xv or ob * xv > budget:
                continue
            if (ob * xv, ob) > (best[0] * best[1], best[0]):
                best = (ob, xv)
    return best


def _schedule_conv2d_nchw_tiled(sch: Any, target: Any, block: Any, xb: int, rest: list[str],
                                work: int | None) -> None:
    """NCHW convolution with a register tile of a few output channels x a few vectors along
    the output row (:func:`conv_nchw_tile`), accumulated over every tap in registers and
    written out once, as the NCHWc schedule does; used where the output channels do not fill
    a vector (the 24 -> 6 smoothing convolutions of a text detector's FPN).

    Loops: parallel(n, y[, oc_outer]) / oc_outer / x_outer / rc, ry, rx / x vectors, oc
    (unrolled) / lanes (vectorized). The rows outside the channel blocks keep an output row's
    input rows in cache across the blocks. Against the in-place order (1 thread, AVX-512,
    24 -> 6 channels, 3x3, bias + ReLU; minima): 160x160 1.66 -> 0.67 ms, 80x80 0.26 -> 0.16,
    40x40 0.066 -> 0.042; 3 -> 5 channels at 64x64 0.018 -> 0.012.
    """
    n, o, y, x, rc, ry, rx = sch.get_loops(block)
    dtype = sch.get(block).writes[0].buffer.dtype
    ow, o_ext = loop_extent(sch, x), loop_extent(sch, o)
    lanes = target.vector_lanes(dtype)
    vectors = ow // xb
    domain = tuple((b, v) for b in range(1, min(8, o_ext) + 1) if o_ext % b == 0
                   for v in range(1, min(8, vectors) + 1) if vectors % v == 0)
    ob, xv = knob("conv_nchw_tile", domain, conv_nchw_tile(o_ext, vectors, lanes))
    oo, oi = split_off(sch, o, ob if ob > 1 else None)
    xo, xi = sch.split(x, factors=[None, xb * xv])
    xm, xi = sch.split(xi, factors=[xv, xb])
    order = [n, y, oo, xo, rc, ry, rx, xm] + ([oi] if oi is not None else []) + [xi]
    sch.reorder(*order)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, xo)
    init = sch.decompose_reduction(block, rc)
    for lp in (xm, oi):
        if lp is not None:
            sch.unroll(lp)
    sch.vectorize(xi)
    for b in (init, local):
        write_out_tile(sch, target, b, xo, dtype)
    sch.annotate(rc, FMA_IN_REGISTERS, 1)
    at = parallel_outer(sch, [n, y, oo], target, work=work)
    schedule_epilogue(sch, target, rest, at)


def _vector_channels(sch: Any, target: Any, block: Any, loop: Any) -> tuple[Any, Any, bool]:
    """Split a vector off the contiguous channel ``loop``: ``(outer, inner, vectorizable)``."""
    dtype = sch.get(block).writes[0].buffer.dtype
    ext = loop_extent(sch, loop)
    f = vector_factor(target, dtype, ext)
    if f is None:
        return None, loop, False
    if f == ext:
        return None, loop, True
    outer, inner = sch.split(loop, factors=[None, f])
    return outer, inner, True


def _schedule_channels_last(sch: Any, target: Any, block: Any, spatial: list[Any],
                            c_loop: Any, reduce: list[Any], rest: list[str]) -> None:
    """Shared nest of the channel-vectorized convolutions (NHWC, NCHWc).

    Loops: parallel(spatial outer...) / x_outer / [channel vectors] / reduce... / x_inner
    (unrolled) / channel lanes (vectorized): each weight vector is loaded once per tap for a
    row segment of outputs, each input element broadcast across the lanes. ``spatial`` are the
    outer output loops, the last of them the output width.
    """
    work = block_work(sch, block)
    x = spatial[-1]
    xo, xi = split_off(sch, x, pick_factor(loop_extent(sch, x), CONV_X_TILES))
    co, ci, vec = _vector_channels(sch, target, block, c_loop)
    order = [*spatial[:-1], xo] + ([co] if co is not None else []) + list(reduce)
    order += [lp for lp in (xi, ci) if lp is not None]
    sch.reorder(*order)
    init = sch.decompose_reduction(block, reduce[0])
    if xi is not None:
        sch.unroll(xi)
    if vec:
        sch.vectorize(ci)
        sch.vectorize(sch.get_loops(init)[-1])
    at = parallel_outer(sch, spatial[:-1], target, work=work)
    schedule_epilogue(sch, target, rest, at)


def _schedule_conv2d_nhwc(sch: Any, target: Any) -> None:
    """NHWC data, weight with O innermost (HWIO): vectors along the output channels."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_pad", "conv2d"})
    _schedule_pad(sch, target, "conv2d_pad", names)
    block = sch.get_block("conv2d")
    n, y, x, o, rc, ry, rx = sch.get_loops(block)
    _schedule_channels_last(sch, target, block, [n, y, x], o, [ry, rx, rc], rest)


@register_alter_layout("nn.conv2d", "c")
def _alter_conv2d_c(call: Any, target: Any) -> LayoutRewrite | None:
    """On CPUs, a float32 NCHW/OIHW convolution (groups=1) becomes ``nn.conv2d_nchwc`` with
    output channels in blocks of one SIMD vector (when the vector length divides them) and
    input channels in blocks of the largest divisor of the channel count up to that length;
    depthwise and grouped ones go to :func:`_alter_grouped_conv2d_c`. The block sizes are a
    graph knob (``conv2d_blocks``, keyed by :func:`conv2d_knob_key`): half, one or two
    vectors of output channels, input blocks of the default size or an output block's."""
    attrs: Conv2DAttrs = call.attrs
    data, weight = call.args[0].struct_info, call.args[1].struct_info
    if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW"):
        return None
    if data.shape is None or not weight.is_static or attrs.out_dtype not in (None, "float32"):
        return None
    if data.dtype != "float32" or weight.dtype != "float32":
        return None
    lanes = vector = target.vector_lanes("float32")
    o, c = weight.static_shape()[0], const_int(data.shape[1])
    if attrs.groups == 1 and lanes >= 16 and o % lanes and o % (lanes // 2) == 0:
        # half a vector: MobileNetV2's 24-channel projections on AVX-512, which otherwise
        # stay NCHW between two layout transforms (0.26 ms of its 2.8 ms, 0.11 ms this way)
        lanes //= 2
    if lanes < 2 or o % lanes or c is None:
        return None
    blocks = [b for b in (vector // 2, vector, 2 * vector) if b >= 4 and o % b == 0]
    key = conv2d_knob_key(call)
    if attrs.groups != 1:
        return _alter_grouped_conv2d_c(attrs, c, o, lanes, blocks, key)
    ic = max(d for d in range(1, min(vector, c) + 1) if c % d == 0)
    domain = [(i, b) for i in dict.fromkeys([ic, *(b for b in blocks if c % b == 0)])
              for b in dict.fromkeys([lanes, *blocks])]
    ic, lanes = graph_knob(key, "conv2d_blocks", domain, (ic, lanes))

    def build(d: Any, w: Any) -> Any:
        return conv2d_nchwc(d, w, strides=attrs.strides, padding=attrs.padding,
                            dilation=attrs.dilation, out_dtype=attrs.out_dtype)

    return LayoutRewrite(
        inputs=(("NCHW", f"NCHW{ic}c"), ("OIHW", f"OIHW{ic}i{lanes}o")),
        output=("NCHW", f"NCHW{lanes}c"),
        build=build,
    )


def conv2d_knob_key(call: Any) -> str:
    """The graph-knob key of an ``nn.conv2d`` call: what it computes (shapes, dtypes, window,
    groups), the same for equal convolutions of any model."""
    attrs: Conv2DAttrs = call.attrs
    data, weight = call.args[0].struct_info, call.args[1].struct_info
    dims = "x".join(str(const_int(d) if const_int(d) is not None else d) for d in data.shape)
    wdims = "x".join(str(d) for d in weight.static_shape())
    return (f"nn.conv2d {data.dtype}[{dims}] {weight.dtype}[{wdims}] "
            f"strides={tuple(attrs.strides)} padding={tuple(attrs.padding)} "
            f"dilation={tuple(attrs.dilation)} groups={attrs.groups}")


def _alter_grouped_conv2d_c(attrs: Conv2DAttrs, c: int, o: int, lanes: int,
                            blocks: list[int], key: str) -> LayoutRewrite | None:
    """A float32 grouped convolution with ``c`` input and ``o`` output channels (``o`` a
    multiple of ``lanes``) in blocks of ``lanes`` channels, so it stays in the NCHW[lanes]c of
    its neighbours: a depthwise one (``groups == c == o``) becomes
    ``nn.depthwise_conv2d_nchwc``; one whose groups have a multiple of ``lanes`` input and
    output channels each becomes a grouped ``nn.conv2d_nchwc``; the others stay NCHW. The
    block is the graph knob ``conv2d_blocks`` (one of ``blocks`` that fits, input = output)."""
    g = attrs.groups
    window = {"strides": attrs.strides, "padding": attrs.padding, "dilation": attrs.dilation,
              "out_dtype": attrs.out_dtype}
    depthwise = g == c == o

    def fits(b: int) -> bool:
        return depthwise or not (c % g or (c // g) % b or (o // g) % b)

    if not fits(lanes):
        return None
    domain = [(b, b) for b in dict.fromkeys([lanes, *blocks]) if fits(b)]
    lanes = graph_knob(key, "conv2d_blocks", domain, (lanes, lanes))[1]
    data_layout = ("NCHW", f"NCHW{lanes}c")
    if depthwise:
        return LayoutRewrite(
            inputs=(data_layout, ("OIHW", f"OIHW{lanes}o")),
            output=data_layout,
            build=lambda d, w: depthwise_conv2d_nchwc(d, w, **window),
        )
    return LayoutRewrite(
        inputs=(data_layout, ("OIHW", f"OIHW{lanes}i{lanes}o")),
        output=data_layout,
        build=lambda d, w: conv2d_nchwc(d, w, groups=g, **window),
    )


#: Register tiles of the NCHWc convolution, (output pixels along the row, output channel
#: blocks of one vector), per vector length in float32 lanes: ``(wide, narrow)``. The wide
#: tiles are tried first, in order, each taken when the row splits into such tiles with at
#: most :data:`CONV_TILE_WASTE` of the last one predicated off (loop partitioning gives that
#: last tile its own code, so the cost is a narrower tile, not wasted FMAs); else the first
#: narrow tile whose sizes divide the row and the block count.
#:
#: AVX2 (8 lanes, 16 registers): 6 x 2 = 12 accumulators, which with the 2 weight vectors
#: and the broadcast input fill the registers. The input channels of a block (``rci``) are
#: unrolled under the tile: against a loop of 8, paired-call timing (2 threads, Zen 3) gives
#: 0.90/0.87/0.87/0.72 of the time on ResNet-18's 3x3 convs at 56/28/14/7-pixel rows and
#: 0.89-0.97 on 1x1 convs; unrolling the kernel's width as well made them slower (up to 2.9x,
#: register spills). With that unrolling, against 7 x 1 tiles (which divide the 14/7-pixel
#: rows): 6 x 2 (a 2-pixel tail) 0.84-0.86 on 14-pixel rows (ResNet-18's 3x3 at 256
#: channels, MobileNetV2's 1x1), 5 x 2 0.91-0.97 on 7-pixel rows.
#:
#: With the tile's FMAs in registers (``FMA_IN_REGISTERS``) and small row tails jammed
#: (``JAM_TAILS``), 4 x 2 tiles (which divide 56 and 28) took 1.06 / 1.04 / 0.98 / 1.02 of the
#: time of these at 56 / 28 / 14 / 7-pixel rows.
#:
#: AVX-512 (16 lanes, 32 registers): 7 x 2 = 14 accumulators divides ResNet's 112/56/28/14/7
#: pixel rows. Against the AVX2 tiles (2 threads, Zen 5, conv + bias + ReLU, interleaved
#: runs): 0.95 / 0.95 / 0.84 / 0.70 of the time on the 3x3 convs at 56/28/14/7-pixel rows,
#: 0.92 / 0.84 / 0.78 on the strided ones, 0.94 on the 7x7 stem and on a 1x1 at 14 pixels;
#: 8 x 2 first was 1.10-1.12 at 28 pixels (a 4-pixel tail), 6 x 4 (24 accumulators)
#: 1.06-1.09 there.
CONV_NCHWC_TILES: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {
    8: ([(6, 2), (5, 2)],
        [(6, 2), (8, 1), (7, 1), (6, 1), (5, 1), (4, 1), (3, 1), (2, 1)]),
    16: ([(7, 2), (8, 2), (6, 2)],
         [(7, 2), (8, 1), (7, 1), (6, 1), (5, 1), (4, 1), (3, 1), (2, 1)]),
}


CONV_TILE_WASTE = 0.3


def _nchwc_tile(ow: int | None, ob: int | None, lanes: int = 8) -> tuple[int, int]:
    """The register tile for a row of ``ow`` pixels and ``ob`` output channel blocks of
    ``lanes`` float32 lanes (other vector lengths take the AVX2 tiles)."""
    wide_tiles, tiles = CONV_NCHWC_TILES.get(lanes, CONV_NCHWC_TILES[8])
    if ow is None or ob is None:
        return min(tiles[0][0], ow or tiles[0][0]), 1
    for xt, bt in wide_tiles:
        padded = -(-ow // xt) * xt
        if ob % bt == 0 and ow >= xt and (padded - ow) / padded <= CONV_TILE_WASTE:
            return xt, bt
    for xt, bt in tiles:
        if ow % xt == 0 and ob % bt == 0:
            return xt, bt
    return min(tiles[0][0], ow), 1


def tile_domain(ow: int | None, ob: int | None) -> tuple[tuple[int, int], ...]:
    """The register tiles ``(pixels, channel blocks)`` the NCHWc schedule may take for a row
    of ``ow`` pixels and ``ob`` output channel blocks (a tuning knob's domain)."""
    widths = range(1, min(8, ow or 8) + 1)
    blocks = [b for b in (1, 2, 4) if ob is not None and ob % b == 0] or [1]
    return tuple((x, b) for x in widths for b in blocks)


def _tail_jam(ow: int | None, xt: int, bt: int) -> int | None:
    """How many rows' tail tiles to run together (``JAM_TAILS``) for a row of ``ow`` pixels in
    tiles of ``xt`` pixels x ``bt`` blocks; None when there is no tail or it has
    :data:`~kiln.op.linalg.TILE_MIN_ACCUMULATORS` already (a 2-pixel x 2-block tail: 4).
    Paired-call timing (2 threads, Zen 3), jammed against not, on ResNet-18's 3x3 convs: 0.91
    of the time at 7 x 7 x 512 (5-pixel tiles and a 2-pixel tail, 2/7 of the work, which had
    taken 44% of the time), 0.94-0.96 at 14 x 14 x 256, 0.95 at 56 x 56 x 64 (rows shared by
    the threads in blocks of 4)."""
    if ow is None or xt < 2 or ow % xt == 0:
        return None
    return tiles_to_fill((ow % xt) * bt)


#: Weight size (bytes) up to which the threads of a convolution share its output rows even
#: when the input is the smaller operand (see :func:`_rows_outer`).
CONV_ROWS_MAX_WEIGHT_BYTES = 1 << 20


CONV_ROW_BLOCK = 4


def _rows_outer(sch: Any, block: Any, rows: int | None, target: Any) -> bool:
    """Whether the threads of a convolution should share its output rows (each running every
    output channel block over its rows) rather than its output channel blocks (each running
    every row for its blocks).

    Sharing channel blocks makes every thread stream the whole input; sharing rows makes
    every thread read the whole weight once per row, and lets the padded input be made row by
    row where it is used (no separate pass over a padded copy). Rows win when there are enough
    of them for every thread and the input is the larger operand or the weight is small
    enough to be re-read from cache (:data:`CONV_ROWS_MAX_WEIGHT_BYTES`). Paired-call timing
    on ResNet-18 (2 threads, Zen 3), rows with the padding made per row against channel
    blocks with a padded copy: 0.90 for the 3x3 conv at 56x56x64 (861 KB of input, 147 KB of
    weight), 0.89 for the strided one, 0.935 at 28x28x128 (590 KB of weight), 1.00 at
    14x14x256 (2.4 MB of weight), 1.44 at 7x7x512 (7 rows for 2 threads). The rows go to the
    threads in blocks of :data:`CONV_ROW_BLOCK` (channel blocks inside a block, so each output
    and residual plane is walked a few rows at a time): in the model's fused 56x56x64 kernels,
    blocks of 1/2/4/8 rows took 0.98/0.94/0.94/0.98 of the channel-block order's time."""
    threads = target_threads(target)
    if rows is None or rows < 4 * threads:
        return False
    blk = sch.get(block)
    sizes = []
    for region in blk.reads[:2]:
        # a symbolic dim (a dynamic batch) counts as 1: the input's size is then a lower bound
        dims = [const_int(simplify(d)) for d in region.buffer.shape]
        size = as_dtype(region.buffer.dtype).bits // 8
        for d in dims:
            size *= 1 if d is None else d
        sizes.append(size)
    return sizes[0] > sizes[1] or sizes[1] <= CONV_ROWS_MAX_WEIGHT_BYTES


def _row_block(rows: int | None, target: Any) -> int | None:
    """Output rows per parallel chunk when the threads share rows: the most, up to
    :data:`CONV_ROW_BLOCK`, that divide the rows and leave every thread a few chunks."""
    if rows is None:
        return None
    threads = target_threads(target)
    for r in range(min(CONV_ROW_BLOCK, rows), 1, -1):
        if rows % r == 0 and rows // r >= 4 * threads:
            return r
    return None


@register_schedule("nn.conv2d_nchwc", "c")
def _schedule_conv2d_nchwc(sch: Any, target: Any) -> None:
    """Register-blocked: parallel over (n, row, pairs of output channel blocks) -- or (n,
    pairs of blocks, row) where :func:`_rows_outer` says so; a tile of a few output pixels x
    output channel blocks (one vector each) accumulates over all the taps in a local buffer --
    compacted to a small array that the C compiler keeps in registers -- then is written out
    and the fused epilogue applied to it while it is in L1. Each weight vector is loaded once
    per tap for the tile's pixels, each input element broadcast once for its channel blocks.
    With rows outermost, the padded input rows an output row needs are made right before it
    (a few KiB that stay in L1/L2) instead of in a pass over a padded copy of the input. The
    tile's FMAs keep their operands in registers (``FMA_IN_REGISTERS``), and a row's tail tile
    too small to fill the FMA pipes runs jammed with the next rows' (``JAM_TAILS``)."""
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {"conv2d_nchwc_pad", "conv2d_nchwc"})
    block = sch.get_block("conv2d_nchwc")
    work = block_work(sch, block)
    n, ob, y, x, oi, rco, ry, rx, rci = sch.get_loops(block)
    dtype = sch.get(block).writes[0].buffer.dtype
    # rows shared only for input channels in whole vectors: ResNet's stem (3 channels, 7x7
    # taps) took 1.17x the time that way (1.06x with a separate padding pass)
    lanes = target.vector_lanes(dtype)
    rows_outer = ((loop_extent(sch, rci) or 1) % lanes == 0
                  and knob("conv_rows_outer", (False, True),
                           _rows_outer(sch, block, loop_extent(sch, y), target)))
    pad_at_row = rows_outer and "conv2d_nchwc_pad" in names
    if not pad_at_row:
        _schedule_pad(sch, target, "conv2d_nchwc_pad", names)
    ow = loop_extent(sch, x)
    xt, bt = knob("conv_tile", tile_domain(ow, loop_extent(sch, ob)),
                  _nchwc_tile(ow, loop_extent(sch, ob), target.vector_lanes("float32")))
    xo, xi = split_off(sch, x, xt if xt > 1 else None)
    obo, obi = split_off(sch, ob, bt if bt > 1 else None)
    co, ci, vec = _vector_channels(sch, target, block, oi)
    tile_at = co if co is not None else xo
    if rows_outer:
        yo, yi = split_off(sch, y, _row_block(loop_extent(sch, y), target))
        outer = [n, yo, obo] + ([yi] if yi is not None else [])
        par = [n, yo]
    else:
        outer = par = [n, obo, y]
    order = outer + [xo] + ([co] if co is not None else []) + [rco, ry, rx, rci]
    order += [lp for lp in (xi, obi, ci) if lp is not None]
    sch.reorder(*order)
    if pad_at_row:
        pad = sch.get_block("conv2d_nchwc_pad")
        sch.compute_at(pad, outer[1])
        vectorize_inner(sch, target, pad)
    local = sch.cache_write(block, 0, "local")
    sch.reverse_compute_at(local, tile_at)
    init = sch.decompose_reduction(block, rco)
    # the input channels of a block too: a straight run of FMAs at constant offsets per tap
    for lp in (xi, obi, rci):
        if lp is not None:
            sch.unroll(lp)
    if vec:
        sch.vectorize(ci)
    for b in (init, local):
        write_out_tile(sch, target, b, tile_at, dtype)
    # the tile's FMAs keep their weight vectors and broadcasts in registers (see tile_fma)
    sch.annotate(rco, FMA_IN_REGISTERS, 1)
    row = yi if rows_outer else y
    jam = _tail_jam(ow, xt, bt)
    if row is not None and jam is not None:
        sch.annotate(row, JAM_TAILS, jam)
    parallel_outer(sch, par, target, work=work)
    # fused consumers (bias, activation, residual) run on each tile right after it is written
    schedule_epilogue(sch, target, rest, tile_at)


#: Largest kernel whose taps the depthwise schedule unrolls.
DEPTHWISE_UNROLL_TAPS = 7


@register_schedule("nn.depthwise_conv2d_nchwc", "c")
def _schedule_depthwise_conv2d_nchwc(sch: Any, target: Any) -> None:
    """Parallel over (n, channel block[, row]); a register tile of a few output pixels of one
    channel block (one SIMD vector each) accumulates over the taps (unrolled), every tap one
    contiguous vector load of the input and of the weight, then is written out once with the
    fused epilogue (bias, activation) applied to it while it is in registers.

    Loops: parallel(n, cb[, y]) / y / x_outer / [tile init] / ry, rx (unrolled) / x_inner
    (unrolled) / lanes (vectorized) / [tile write-back + epilogue]. The zero padding is
    inlined: a tap outside the input reads a zero vector instead (the index simplifier drops
    the test where a tile's taps are all inside), so the input is read once, where it is used,
    with no padded copy. Against the padded copy made per channel block (or per output row
    where the blocks do not feed the threads) with the accumulation in the output buffer and
    the epilogue a pass of its own (AVX-512, Zen 4): the kernel alone at 1 thread (CPU time,
    paired) 0.47 / 0.56 / 0.61 of the time for 3x3 at 32 x 112x112 / 96 x 112x112 stride 2 /
    144 x 56x56, 0.71-0.97 for 5x5 ones; in MobileNetV2 at 2 threads (paired per-layer
    rounds, busy machine) 0.36-0.69 on its 17 depthwise layers, the whole model 0.92 at 1
    thread. The register tile alone (padded copy kept) took 0.72-0.98 of the time; inlining
    the padding then 0.39-0.86 of that. Knobs ``depthwise_inline_pad`` and
    ``depthwise_register_tile``; blocks that no vector length divides keep the in-place
    accumulation (:func:`_depthwise_in_place`).
    """
    pad, name = "depthwise_conv2d_nchwc_pad", "depthwise_conv2d_nchwc"
    names = {sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))}
    rest = other_blocks(sch, {pad, name})
    if pad in names and knob("depthwise_inline_pad", (False, True), True):
        sch.compute_inline(sch.get_block(pad))
        names.discard(pad)
    block = sch.get_block(name)
    work = block_work(sch, block)
    dtype = sch.get(block).writes[0].buffer.dtype
    n, cb, y, x, ci, ry, rx = sch.get_loops(block)
    lanes = loop_extent(sch, ci)
    tiled = (lanes is not None and lanes == vector_factor(target, dtype, lanes)
             and knob("depthwise_register_tile", (False, True), True))
    xo, xi = split_off(sch, x, pick_factor(loop_extent(sch, x), CONV_X_TILES))
    if tiled:
        sch.reorder(*[lp for lp in (n, cb, y, xo, ry, rx, xi, ci) if lp is not None])
        local = sch.cache_write(block, 0, "local")
        sch.reverse_compute_at(local, xo)
        init = sch.decompose_reduction(block, ry)
        sch.vectorize(ci)
        for b in (init, local):
            write_out_tile(sch, target, b, xo, dtype)
        sch.annotate(ry, FMA_IN_REGISTERS, 1)
    else:
        init = _depthwise_in_place(sch, target, block, (n, cb, y, xo, xi, ci, ry, rx))
    for lp in (ry, rx):
        if (loop_extent(sch, lp) or DEPTHWISE_UNROLL_TAPS + 1) <= DEPTHWISE_UNROLL_TAPS:
            sch.unroll(lp)
    if xi is not None:
        sch.unroll(xi)
    # the padded copy of a whole channel block goes under (n, cb) when those feed the threads
    # (measured faster than copying the rows of each output row); else under (n, cb, y)
    per_block = pad in names and _enough_blocks(sch, target, [n, cb])
    at = parallel_outer(sch, [n, cb] if per_block else [n, cb, y], target, work=work)
    if pad in names:
        pb = sch.get_block(pad)
        sch.compute_at(pb, at if at is not None else cb if per_block else y)
        vectorize_inner(sch, target, pb)
    schedule_epilogue(sch, target, rest, xo if tiled else at)


def _depthwise_in_place(sch: Any, target: Any, block: Any, loops: tuple[Any, ...]) -> Any:
    """The depthwise nest accumulated in the output buffer: (n, cb, y, x_outer, ry, rx,
    x_inner, lanes), the lanes vectorized where a vector length divides them; returns the
    init block."""
    n, cb, y, xo, xi, ci, ry, rx = loops
    _, ci, vec = _vector_channels(sch, target, block, ci)
    sch.reorder(*[lp for lp in (n, cb, y, xo, ry, rx, xi, ci) if lp is not None])
    init = sch.decompose_reduction(block, ry)
    if vec:
        sch.vectorize(ci)
        sch.vectorize(sch.get_loops(init)[-1])
    return init


def _enough_blocks(sch: Any, target: Any, loops: list[Any]) -> bool:
    """Whether ``loops`` have at least two iterations per thread of ``target``."""
    total = 1
    for lp in loops:
        ext = loop_extent(sch, lp)
        if ext is None:
            return False
        total *= ext
    return total >= 2 * (target_threads(target) or 1)
