"""A depthwise convolution on the tensor unit as banded (Toeplitz) products.

Per channel, a 2-D depthwise convolution is a 1-D convolution over the rows whose input
"channels" are the input columns and whose output "channels" the output columns::

    out[c, oh, ow] = sum_kh sum_iw in[c, oh*sh + kh*dh - pt, iw] * T[c, kh][iw, ow]
    T[c, kh][iw, ow] = w[c, kh, kx]   where iw = ow*sw - pl + kx*dw, 0 <= kx < KW (else 0)

``T`` is banded: for a block of ``n`` output columns only a window of ``(n - 1)*sw +
(KW - 1)*dw + 1`` input columns is non-zero, so the product's K is that window (per kernel
row) and its N the block. The A operand is whole input rows of one channel plane -- each a
contiguous run of the window's columns in NCHW, staged in L1 with the window's zero rows above
and below, one staging DMA per step and one gather per kernel row -- instead of the
block-diagonal route's per-tap gathers of ``g`` channels (:func:`.ops.depthwise_parts`), and
the tensor unit multiplies ``KW x n`` useful weights per ``K x n`` (stride 1, 3 x 3, ``n`` =
14 of a 16-wide K: 16%, against the diagonal's 1/16).

The kernel is one implicit GEMM (:func:`~.gemm.emit_gemm`, :func:`banded_transfers`) whose
batch runs over every (image, group of ``G`` channels) with its own B (``b_shared=False``),
each entry ``G x blocks`` products (``GemmShape.groups``: a channel's band is its own, so
one ``mma`` per channel and column block): one staging DMA of the ``G`` planes' rows, whole
(contiguous in DRAM: no partial bursts), one gather per kernel row and column block, one
weight DMA of the ``G`` channels' bands, one store per column block. A step of one
channel's block was all DMA issue and latency (MobileNetV2's 384 x 7 x 7 layer: 33,410
cycles against the vector unit's 5,632), and staging each block's window alone read the
input in 32-byte runs. :class:`BandedGeometry` places the column blocks (every ``n``
output columns; where ``n`` does not divide the width the last block computes columns past
it, which are not stored: the output tile holds each channel's rows of every block side by
side, stored whole), the channel groups (every ``G`` channels; the last ends at the last
channel, overlapping the one before where ``G`` does not divide ``C``: the overlap is
computed twice and stored twice with the same values), and each
block's input window (clamped into the image, so the window never reads past a row:
columns outside the image are the padding, which the band simply leaves out). The weights
are compile-time constants ``[C, bands, KH, window, n]`` (:func:`banded_weights`): one band
per distinct offset of a block's window against its outputs (at most the first, the
interior and the last block's), not one per block; the interior blocks' products read the
same band in L0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...npu.isa import UNIT_DMA_IN
from ...target.npu.config import DRAM, NPUConfig
from .emit import DramTensor, block, itemsize
from .gemm import (
    GemmShape,
    GemmTiling,
    GemmTransfers,
    acc_strides,
    group_strides,
    output_tiles,
)
from .lowering import LoweringContext

__all__ = ["BandedGeometry", "banded_block_widths", "banded_geometry", "banded_rows",
           "banded_transfers", "banded_weights"]


@dataclass(frozen=True)
class BandedGeometry:
    """A depthwise convolution (NCHW input ``[nb, c, h, w]``, weights ``[c, 1, kh, kw]``,
    output ``[nb, c, oh, ow]``) as banded products in blocks of ``n`` output columns and
    groups of ``g`` channels: ``window`` input columns per block, ``blocks`` (first output
    column, first input column) per block, ``band_of`` each block's index into the distinct
    ``deltas`` (the window's first column minus the first output column's first tap: what
    fixes a block's band), ``firsts`` the first channel of each channel group, and the
    planner's :class:`~.gemm.GemmShape` (an M unit is one output row, a K unit one window
    column times the ``kh`` kernel rows, N the block's columns; ``g x blocks`` products per
    batch entry, product ``i * blocks + j`` channel ``i``'s block ``j``)."""

    nb: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int
    n: int
    g: int
    window: int
    firsts: tuple[int, ...]
    blocks: tuple[tuple[int, int], ...]
    band_of: tuple[int, ...]
    deltas: tuple[int, ...]
    shape: GemmShape
    in_place: bool = False
    compact: bool = False

    @property
    def u_min(self) -> int:
        """The least tap offset ``u = i + d - j*sw`` (window column ``i``, band ``d``,
        block column ``j``) a band reads: where :func:`banded_rows`' rows start."""
        return min(self.deltas) - (self.n - 1) * self.sw

    @property
    def row_len(self) -> int:
        """Elements of one compact row (:func:`banded_rows`): every ``u`` a band reads."""
        return self.window + max(self.deltas) - self.u_min

    @property
    def row_px(self) -> int:
        """Elements between two staged rows (the L1 slot's rows bank-padded; in place, in
        L0, packed: a whole-row window is then one run of the kernel rows)."""
        return self.shape.stage_pixel(self.w)

    @property
    def whole_rows(self) -> bool:
        """In place, a block's window is its staged rows whole (one block as wide as the
        image, dilation 1 along the rows): the kernel rows' windows are one contiguous run
        of ``KH x window`` elements, so one ``mma`` takes them all (``k_split`` 1)."""
        return self.in_place and self.window == self.row_px and self.dh == 1

    def a_parts(self, tiling: GemmTiling) -> tuple[tuple[tuple[int, int, int], ...], ...]:
        """In place: each product's ``mma`` instructions (``emit_gemm``'s ``a_parts``,
        product ``i * blocks + j``: channel ``i``'s block ``j``) -- per kernel row ``a`` its
        A the channel's staged rows from row ``a * dh`` at the window's first column (rows
        :attr:`a_row` apart: ``sh`` staged rows a output row) and its B the band's kernel
        row ``a``; with :attr:`whole_rows` one instruction over every kernel row."""
        plane = self.shape.stage_rows(tiling.m_units) * self.row_px
        out = []
        for i in range(self.g):
            for _, i0 in self.blocks:
                if self.whole_rows:
                    out.append(((i * plane, 0, self.kh * self.window),))
                else:
                    out.append(tuple((i * plane + a * self.dh * self.row_px + i0,
                                      a * self.window * self.n, self.window)
                                     for a in range(self.kh)))
        return tuple(out)

    @property
    def a_row(self) -> int:
        """Elements between the A rows of two output rows, in place (``sh`` staged rows)."""
        return self.sh * self.row_px

    def plane(self, b: int) -> int:
        """Batch entry ``b``'s first channel plane (``image * c + channel``; its ``g``
        channels follow)."""
        image, gi = divmod(b, len(self.firsts))
        return image * self.c + self.firsts[gi]

    @property
    def band(self) -> int:
        """Elements of one band ``[kh, window, n]``."""
        return self.kh * self.window * self.n

    @property
    def channel_stride(self) -> int:
        """Elements between two channels' bands in :func:`banded_weights`'s constant."""
        return len(self.deltas) * self.band

    def weight_offset(self, b: int) -> int:
        """Elements from the start of :func:`banded_weights`'s constant to entry ``b``'s
        first channel's bands (the next channel's are :attr:`channel_stride` further)."""
        return self.firsts[b % len(self.firsts)] * self.channel_stride

    def c_groups(self, tiling: GemmTiling) -> tuple[int, ...]:
        """Each product's place in the output tile (``emit_gemm``'s ``c_groups``): channel
        ``i``'s rows of ``blocks x n`` elements (``shape.acc_row``), block ``j`` at its
        first column -- the tile holds whole output rows, and the columns a last block
        computes past the output's width are not stored."""
        rows = tiling.m_units * self.shape.acc_row
        return tuple(i * rows + o0 for i in range(self.g) for o0, _ in self.blocks)

    @property
    def b_groups(self) -> tuple[int, ...]:
        """Each product's band in the B tile (``emit_gemm``'s ``b_groups``): channel ``i``'s
        bands are slots ``i * bands ..``, block ``j`` reads its ``band_of``."""
        nd = len(self.deltas)
        return tuple(i * nd + d for i in range(self.g) for d in self.band_of)


def banded_geometry(cfg: NPUConfig, at: Any, x_shape: tuple[int, ...],
                    w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str, n: int,
                    g: int = 1, in_place: bool = False, compact: bool = False
                    ) -> BandedGeometry:
    """The banded products of a depthwise convolution in blocks of ``n`` output columns
    and groups of ``g`` channels (each at most the output's width, the channels; see the
    module docstring); ``in_place``: the rows staged straight into L0 and read there by
    one ``mma`` per kernel row (:meth:`BandedGeometry.a_parts`) instead of gathered;
    ``compact``: the bands built on chip from :func:`banded_rows` (see
    :func:`banded_transfers`) instead of read whole from DRAM every step."""
    nb, c, h, wd = x_shape
    kh, kw = w_shape[2:]
    oh, ow = out_shape[2:]
    (sh, sw), (dh, dw) = tuple(at.strides), tuple(at.dilation)
    pt, pl = at.padding[0], at.padding[1]
    n = max(1, min(n, ow))
    g = max(1, min(g, c))
    firsts = tuple(sorted({*range(0, c - g + 1, g), c - g}))
    window = min((n - 1) * sw + (kw - 1) * dw + 1, wd)
    starts = range(0, ow, n)
    blocks = tuple((o0, min(max(o0 * sw - pl, 0), wd - window)) for o0 in starts)
    deltas: list[int] = []
    band_of = []
    for o0, i0 in blocks:
        d = i0 - (o0 * sw - pl)
        if d not in deltas:
            deltas.append(d)
        band_of.append(deltas.index(d))
    nblk = len(blocks)
    l1 = cfg.memory("l1")
    whole = in_place and window == wd and dh == 1  # BandedGeometry.whole_rows
    u_min = min(deltas) - (n - 1) * sw
    row_len = window + max(deltas) - u_min
    td = cfg.tensor_dtype(dt, dt)
    acc_size = itemsize(str(td.acc)) if td is not None else 4
    shape = GemmShape(nb * len(firsts), oh, 1, n, window, kh, dt,
                      a_dmas=1 if in_place else kh * nblk,
                      b_shared=False, a_elems=-(-h * wd // nblk), stage_stride=sh,
                      stage_halo=(kh - 1) * dh + 1, stage_row=wd,
                      stage_pad=0 if in_place else l1.bank_width,
                      stage_columns=True, groups=g * nblk, stage_share=nblk,
                      acc_row=nblk * n, b_groups=g * len(deltas), stage_l0=in_place,
                      k_split=1 if whole or not in_place else kh,
                      stage_onchip=nb * c * h * wd * itemsize(dt) <= l1.size,
                      store_onchip=nb * c * oh * ow * acc_size <= l1.size,
                      b_rows=g * kh * row_len if compact else 0,
                      b_dmas=(1 if len(deltas) == 1 else len(deltas) * kh) if compact else 1)
    return BandedGeometry(nb, c, h, wd, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, n, g, window,
                          firsts, blocks, tuple(band_of), tuple(deltas), shape, in_place,
                          compact)


def banded_block_widths(cfg: NPUConfig, at: Any, w_shape: tuple[int, ...],
                        out_shape: tuple[int, ...], in_place: bool = False,
                        width: int = 0) -> list[int]:
    """The block widths worth planning: for each number of the tensor unit's K passes that
    a block's ``KH x window`` takes (each pass ``k`` deep), the widest block that fits in
    them -- a narrower one multiplies as many passes for fewer columns --, and the whole
    output width where it is no wider than the tensor unit's ``n``; at most ``n`` columns
    (one pass of the unit's N). ``in_place`` (:func:`banded_geometry`'s; ``width``: the
    input's): one ``mma`` per kernel row, each its own passes over the window (clamped into
    the image), or one over them all where the window is the whole row."""
    _, k, tn = cfg.tensor_shape
    kh, kw = w_shape[2:]
    ow = out_shape[3]
    (dh, sw), (_, dw) = tuple(at.strides), tuple(at.dilation)
    dh = tuple(at.dilation)[0]
    best: dict[int, int] = {}
    for n in range(1, min(tn, ow) + 1):
        window = (n - 1) * sw + (kw - 1) * dw + 1
        if not in_place:
            passes = -(-kh * window // k)
        elif min(window, width) == width and dh == 1:
            passes = -(-kh * width // k)
        else:
            passes = kh * -(-min(window, width) // k)
        best[passes] = max(best.get(passes, 0), n)
    return sorted(set(best.values()))


def banded_weights(w: np.ndarray, geo: BandedGeometry) -> np.ndarray:
    """The bands ``[C, len(deltas), KH, window, n]``: ``T[c, d, a, i, j]`` = channel ``c``'s
    weight of kernel row ``a`` and column ``kx`` where ``d + i - j*sw = kx*dw`` (zero
    elsewhere: the band). ``KH x window x n`` elements per channel and band against the
    depthwise weights' ``KH x KW`` -- the DRAM bytes the route pays for its zeros."""
    c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    out = np.zeros((c, len(geo.deltas), kh, geo.window, geo.n), dtype=w.dtype)
    for di, d in enumerate(geo.deltas):
        for j in range(geo.n):
            for kx in range(kw):
                i = kx * geo.dw + j * geo.sw - d  # the window column of tap kx, column j
                if 0 <= i < geo.window:
                    out[:, di, :, i, j] = w[:, 0, :, kx]
    return out


def _compact_bands(ctx: LoweringContext, geo: BandedGeometry, tiling: GemmTiling,
                   rows: DramTensor) -> Any:
    """``geo.compact``: emit now, ahead of the products, each core's loads of the compact
    rows (:func:`banded_rows`) of the channel groups its output tiles take
    (:func:`~.gemm.output_tiles`, dealt round-robin) into L1 -- one DMA a group, then one
    fence --, and return the ``load_b`` that builds a step's bands from them: per band (and,
    with several, per kernel row) one L1 -> L0 DMA of the overlapping view ``R[i + d -
    j*sw]`` (strides ``+1`` and ``-sw``). The bands' zeros are the rows' zeros: DRAM moves
    ``KH x row_len`` elements a channel instead of ``bands x KH x window x n``."""
    cfg, kb, shape = ctx.config, ctx.kb, geo.shape
    dt, isz = shape.dtype, itemsize(shape.dtype)
    kh, n, window, nd, g, rl = geo.kh, geo.n, geo.window, len(geo.deltas), geo.g, geo.row_len
    ngroups = len(geo.firsts)
    per_core: list[list[int]] = [[] for _ in range(cfg.cores)]
    for j, (b, *_rest) in enumerate(output_tiles(cfg, shape, tiling, kb.nbuf)):
        gi = b % ngroups
        if gi not in per_core[j % cfg.cores]:
            per_core[j % cfg.cores].append(gi)
    line = cfg.memory("l1").bank_width
    slot = -(-g * kh * rl * isz // line) * line
    most = max(len(gis) for gis in per_core)
    where: dict[tuple[int, int], int] = {}
    for core, gis in enumerate(per_core):
        for k, gi in enumerate(gis):
            addr = (core * most + k) * slot
            where[core, gi] = addr
            kb.load(core, shape=(1, g * kh, rl), dst=block("l1", addr, dt, (0, rl, 1)),
                    src=rows.at(geo.firsts[gi] * kh * rl, (0, rl, 1)))
        if gis:
            kb.fence(core, UNIT_DMA_IN)  # the bands' DMAs read what these write
    band = kh * window * n

    def load_b(core: int, b: int, c0: int, cs: int, n0: int, ns: int, addr: int) -> None:
        """Build the entry's ``g`` channels' bands in the B tile from its rows in L1."""
        base = where[core, b % ngroups]
        for di, d in enumerate(geo.deltas):
            off = d - geo.u_min
            if nd == 1:  # channels and kernel rows in one dim: rows rl, bands band apart
                kb.load(core, shape=(g * kh, window, n),
                        dst=block("weight", addr, dt, (window * n, n, 1)),
                        src=block("l1", base + off * isz, dt, (rl, 1, -geo.sw)))
                continue
            for a in range(kh):
                kb.load(core, shape=(g, window, n),
                        dst=block("weight", addr + ((di * kh + a) * window * n) * isz, dt,
                                  (nd * band, n, 1)),
                        src=block("l1", base + (a * rl + off) * isz, dt,
                                  (kh * rl, 1, -geo.sw)))

    return load_b


def banded_rows(w: np.ndarray, geo: BandedGeometry) -> np.ndarray:
    """The compact rows ``[C, KH, row_len]`` the bands are built from on chip:
    ``R[c, a, u - u_min]`` = channel ``c``'s weight of kernel row ``a`` and column ``kx``
    where ``u = kx*dw`` (zero elsewhere). Band ``d``'s element ``[a, i, j]`` (see
    :func:`banded_weights`) is ``R[c, a, i + d - j*sw - u_min]``: a view of the row with
    strides ``+1`` along ``i`` and ``-sw`` along ``j``, which one DMA copies -- ``row_len``
    elements a kernel row (13 for a 7-column block at stride 1) for the band's
    ``window x n`` (49)."""
    c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    out = np.zeros((c, kh, geo.row_len), dtype=w.dtype)
    for kx in range(kw):
        u = kx * geo.dw - geo.u_min
        if 0 <= u < geo.row_len:  # else no band reads the tap (it falls in the padding)
            out[:, :, u] = w[:, 0, :, kx]
    return out


def banded_transfers(ctx: LoweringContext, geo: BandedGeometry, tiling: GemmTiling,
                     xa: DramTensor, wl: DramTensor, out: DramTensor) -> GemmTransfers:
    """The DMAs of ``geo`` under ``tiling`` from image ``xa`` (NCHW, in the operand dtype)
    and bands ``wl`` (:func:`banded_weights`) into ``out`` (NCHW): see the nested
    functions. Each moves the entry's ``g`` channels at once (its outermost dim); the
    products' tiles are :func:`~.gemm.group_strides` apart. The tiling must take the whole
    window in one K step (``k_units == window``: every kernel row's band is then one run of
    a channel's bands, loaded with the others in one DMA). In place (``geo.in_place``)
    ``load_a`` stages the rows straight into the L0 slot and there is no ``stage_a``."""
    if tiling.k_units != geo.window:
        raise ValueError(f"banded products take the window's {geo.window} columns in one K "
                         f"step, not {tiling.k_units}")
    shape, dt = geo.shape, geo.shape.dtype
    h, wd, oh, ow, kh = geo.h, geo.w, geo.oh, geo.ow, geo.kh
    sh, dh, pt, n, g = geo.sh, geo.dh, geo.pt, geo.n, geo.g
    nblk, nd = len(geo.blocks), len(geo.deltas)
    stage_slot = shape.stage_bytes(tiling.m_units, tiling.k_units)
    row_px = shape.stage_pixel(wd)  # elements between staged rows (bank-padded)
    l1_plane = shape.stage_rows(tiling.m_units) * row_px  # between staged channels
    c_row, c_col = acc_strides(ctx.config, shape, tiling, tiling.n)
    ga, gb, gc = group_strides(ctx.config, shape, tiling)
    kb = ctx.kb
    isz = itemsize(dt)

    def slot_addr(core: int, slot: int) -> int:
        return (core * kb.nbuf + slot) * stage_slot

    def stage_rows(core: int, b: int, r0: int, rs: int, dst: Any) -> None:
        """Stage the input rows of the tile's output rows of the entry's ``g`` channels
        into ``dst``, whole (one contiguous run of each plane), with the zero rows above and
        below the image: one DMA (into L1: :meth:`~.emit.KernelBuilder.stage_begin` first;
        in place, the L0 slot the pipeline's tokens have freed)."""
        lo, nbox = r0 * sh - pt, shape.stage_rows(rs)
        first = min(nbox, max(0, -lo))
        last = max(first, min(nbox, h - lo))
        if geo.in_place and last == first:  # padding only: zeros from DRAM address 0
            kb.load(core, shape=(1, 1, 1), dst=dst, src=block(DRAM, 0, dt, (0, 0, 0)),
                    pad_hi=(g - 1, nbox - 1, wd - 1), fill=0)
            return
        if not geo.in_place and kb.stage_begin(core, dst, (g, nbox, wd), last == first):
            return
        kb.load(core, shape=(g, last - first, wd), dst=dst,
                src=xa.at(geo.plane(b) * h * wd + (lo + first) * wd, (h * wd, wd, 1)),
                pad_lo=(0, first, 0), pad_hi=(0, nbox - last, 0), fill=0)

    def stage_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, slot: int) -> None:
        """The L1 slot's staging (``stage_rows``)."""
        stage_rows(core, b, r0, rs, block("l1", slot_addr(core, slot), dt,
                                          (l1_plane, row_px, 1)))

    def load_in_place(core: int, b: int, r0: int, rs: int, c0: int, cs: int, addr: int,
                      slot: int) -> None:
        """In place: the staged rows are the A tile (``stage_rows`` into the L0 slot)."""
        stage_rows(core, b, r0, rs, block("input", addr, dt, (l1_plane, row_px, 1)))

    def load_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, addr: int,
               slot: int) -> None:
        """Gather the A tiles (each row-major: output row, kernel row, window column) from
        the staged rows: per kernel row and column block one DMA of every channel's rows'
        window."""
        kt = cs * kh
        base = slot_addr(core, slot)
        for j, (_, i0) in enumerate(geo.blocks):
            for a in range(kh):
                kb.load(core, shape=(g, rs, cs),
                        dst=block("input", addr + (j * ga + a * cs) * isz, dt,
                                  (nblk * ga, kt, 1)),
                        src=block("l1", base + (a * dh * row_px + i0 + c0) * isz, dt,
                                  (l1_plane, sh * row_px, 1)))

    def load_b(core: int, b: int, c0: int, cs: int, n0: int, ns: int, addr: int) -> None:
        """The ``g`` channels' bands (columns ``n0 ..`` of each): one DMA."""
        kb.load(core, shape=(g * nd, kh * cs, ns),
                dst=block("weight", addr, dt, (gb, ns, 1)),
                src=wl.at(geo.weight_offset(b) + n0, (geo.band, n, 1)))

    def store_c(core: int, b: int, r0: int, rs: int, n0: int, ns: int, addr: int) -> None:
        """The ``g`` channels' whole output rows (every column block's products, side by
        side in the tile): one DMA, a contiguous run per channel. The last channel group
        overlaps the one before when ``g`` does not divide the channels (``firsts``): it
        stores only the channels past that group's, so no two DMAs write one byte -- two
        cores storing the same values at once are still a write-after-write hazard where
        residency puts the output in L1."""
        if (n0, ns) != (0, n):
            raise ValueError(f"banded products store whole rows: columns {n0}..{n0 + ns} "
                             f"of a block of {n}")
        gi = b % len(geo.firsts)
        skip = max(0, geo.firsts[gi - 1] + g - geo.firsts[gi]) if gi else 0
        kb.store(core, shape=(g - skip, rs, ow),
                 dst=out.at((geo.plane(b) + skip) * oh * ow + r0 * ow, (oh * ow, ow, 1)),
                 src=block("acc", addr + skip * gc * itemsize(out.dtype), out.dtype,
                           (gc, c_row, c_col)))

    if geo.compact:
        load_b = _compact_bands(ctx, geo, tiling, wl)
    if geo.in_place:
        return GemmTransfers(None, load_in_place, load_b, store_c)
    return GemmTransfers(stage_a, load_a, load_b, store_c)
