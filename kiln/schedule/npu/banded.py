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
batch runs over every (image, group of ``G`` channels, column block) with its own B
(``b_shared=False``), each entry ``G`` products (``GemmShape.groups``: a channel's band is
its own, so one ``mma`` per channel, but one staging DMA, one gather per kernel row, one
weight DMA and one store for the ``G`` of them -- a step of one channel's small product was
all DMA issue and latency: MobileNetV2's 384 x 7 x 7 layer took 33,410 cycles against the
vector unit's 5,632). Channel groups start every ``G`` channels, the last one ends at the
last channel (overlapping the one before where ``G`` does not divide ``C``), and likewise
:class:`BandedGeometry` places the column blocks (every ``n`` output columns; the last
block ends at the last column, overlapping the one before where ``n`` does not divide the
width: the overlap is computed twice and stored twice with the same values) and each
block's input window (clamped into the image, so the window never reads past a row: columns
outside the image are the padding, which the band simply leaves out). The weights are
compile-time constants ``[C, bands, KH, window, n]`` (:func:`banded_weights`): one band per
distinct offset of a block's window against its outputs (at most the first, the interior and
the last block's), not one per block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...npu.isa import UNIT_DMA_IN
from ...target.npu.config import NPUConfig
from .emit import DramTensor, block, itemsize
from .gemm import (
    GemmShape,
    GemmTiling,
    LoadA,
    LoadB,
    StageA,
    StoreC,
    acc_strides,
    group_strides,
)
from .lowering import LoweringContext

__all__ = ["BandedGeometry", "BandedTransfers", "banded_block_widths", "banded_geometry",
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
    column times the ``kh`` kernel rows, N the block's columns, ``g`` groups)."""

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

    def entry(self, b: int) -> tuple[int, int, int]:
        """Batch entry ``b``'s first channel plane (``image * c + channel``; its ``g``
        channels follow), its block's first output column and first input column."""
        rest, j = divmod(b, len(self.blocks))
        image, gi = divmod(rest, len(self.firsts))
        return image * self.c + self.firsts[gi], self.blocks[j][0], self.blocks[j][1]

    @property
    def band(self) -> int:
        """Elements of one band ``[kh, window, n]``."""
        return self.kh * self.window * self.n

    def weight_offset(self, b: int) -> int:
        """Elements from the start of :func:`banded_weights`'s constant to entry ``b``'s
        first channel's band (the next channel's is :attr:`channel_stride` further)."""
        rest, j = divmod(b, len(self.blocks))
        first = self.firsts[rest % len(self.firsts)]
        return first * self.channel_stride + self.band_of[j] * self.band

    @property
    def channel_stride(self) -> int:
        """Elements between two channels' bands in :func:`banded_weights`'s constant."""
        return len(self.deltas) * self.band


def banded_geometry(cfg: NPUConfig, at: Any, x_shape: tuple[int, ...],
                    w_shape: tuple[int, ...], out_shape: tuple[int, ...], dt: str, n: int,
                    g: int = 1) -> BandedGeometry:
    """The banded products of a depthwise convolution in blocks of ``n`` output columns
    and groups of ``g`` channels (each at most the output's width, the channels; see the
    module docstring)."""
    nb, c, h, wd = x_shape
    kh, kw = w_shape[2:]
    oh, ow = out_shape[2:]
    (sh, sw), (dh, dw) = tuple(at.strides), tuple(at.dilation)
    pt, pl = at.padding[0], at.padding[1]
    n = max(1, min(n, ow))
    g = max(1, min(g, c))
    firsts = tuple(sorted({*range(0, c - g + 1, g), c - g}))
    window = min((n - 1) * sw + (kw - 1) * dw + 1, wd)
    starts = sorted({*range(0, ow - n + 1, n), ow - n})
    blocks = tuple((o0, min(max(o0 * sw - pl, 0), wd - window)) for o0 in starts)
    deltas: list[int] = []
    band_of = []
    for o0, i0 in blocks:
        d = i0 - (o0 * sw - pl)
        if d not in deltas:
            deltas.append(d)
        band_of.append(deltas.index(d))
    l1 = cfg.memory("l1")
    shape = GemmShape(nb * len(firsts) * len(blocks), oh, 1, n, window, kh, dt, a_dmas=kh,
                      b_shared=False, a_elems=h * window, stage_stride=sh,
                      stage_halo=(kh - 1) * dh + 1, stage_row=1, stage_width=1,
                      stage_pad=l1.bank_width, acc_columns=True, stage_columns=True,
                      groups=g)
    return BandedGeometry(nb, c, h, wd, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, n, g, window,
                          firsts, blocks, tuple(band_of), tuple(deltas), shape)


def banded_block_widths(cfg: NPUConfig, at: Any, w_shape: tuple[int, ...],
                        out_shape: tuple[int, ...]) -> list[int]:
    """The block widths worth planning: for each number of the tensor unit's K passes that
    a block's ``KH x window`` takes (each pass ``k`` deep), the widest block that fits in
    them -- a narrower one multiplies as many passes for fewer columns --, and the whole
    output width where it is no wider than the tensor unit's ``n``; at most ``n`` columns
    (one pass of the unit's N)."""
    _, k, tn = cfg.tensor_shape
    kh, kw = w_shape[2:]
    ow = out_shape[3]
    (_, sw), (_, dw) = tuple(at.strides), tuple(at.dilation)
    best: dict[int, int] = {}
    for n in range(1, min(tn, ow) + 1):
        passes = -(-kh * ((n - 1) * sw + (kw - 1) * dw + 1) // k)
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


@dataclass(frozen=True)
class BandedTransfers:
    """The DMAs of a banded depthwise kernel under a tiling (:func:`banded_transfers`), in
    :func:`~.gemm.emit_gemm`'s callback form."""

    stage_a: StageA
    load_a: LoadA
    load_b: LoadB
    store_c: StoreC


def banded_transfers(ctx: LoweringContext, geo: BandedGeometry, tiling: GemmTiling,
                     xa: DramTensor, wl: DramTensor, out: DramTensor) -> BandedTransfers:
    """The DMAs of ``geo`` under ``tiling`` from image ``xa`` (NCHW, in the operand dtype)
    and bands ``wl`` (:func:`banded_weights`) into ``out`` (NCHW): see the nested
    functions. Each moves the entry's ``g`` channels at once (its outermost dim), their
    tiles :func:`~.gemm.group_strides` apart. The tiling must take the whole window in one
    K step (``k_units == window``: a step's band of every kernel row is then one run per
    channel)."""
    if tiling.k_units != geo.window:
        raise ValueError(f"banded products take the window's {geo.window} columns in one K "
                         f"step, not {tiling.k_units}")
    shape, dt = geo.shape, geo.shape.dtype
    h, wd, oh, ow, kh = geo.h, geo.w, geo.oh, geo.ow, geo.kh
    sh, dh, pt, n, window = geo.sh, geo.dh, geo.pt, geo.n, geo.window
    stage_slot = shape.stage_bytes(tiling.m_units, tiling.k_units)
    px = shape.stage_pixel(tiling.k_units)  # elements between staged rows (bank-padded)
    c_row, c_col = acc_strides(ctx.config, shape, tiling, tiling.n)
    ga, gb, gc = group_strides(ctx.config, shape, tiling)
    g, plane_px = geo.g, h * wd
    l1_group = shape.stage_rows(tiling.m_units) * px  # elements between staged channels
    kb = ctx.kb
    isz = itemsize(dt)

    def slot_addr(core: int, slot: int) -> int:
        return (core * kb.nbuf + slot) * stage_slot

    def stage_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, slot: int) -> None:
        """Stage the input rows of the tile's output rows (their window's ``cs`` columns
        from ``c0`` on: one contiguous run of each row) in L1, with the zero rows above and
        below the image: one DMA."""
        plane, _, i0 = geo.entry(b)
        lo, nbox = r0 * sh - pt, shape.stage_rows(rs)
        first = min(nbox, max(0, -lo))
        last = max(first, min(nbox, h - lo))
        dst = block("l1", slot_addr(core, slot), dt, (l1_group, px, 1))
        if kb.nbuf == 1:  # the one slot may still be read by the last step's gathers
            kb.fence(core, UNIT_DMA_IN)
        if last == first:  # only padding rows: the zeros at DRAM address 0, padded
            kb.load(core, shape=(1, 1, 1), dst=dst, src=block("dram", 0, dt, (0, 0, 0)),
                    pad_hi=(g - 1, nbox - 1, cs - 1), fill=0)
            return
        kb.load(core, shape=(g, last - first, cs), dst=dst,
                src=xa.at(plane * plane_px + (lo + first) * wd + i0 + c0, (plane_px, wd, 1)),
                pad_lo=(0, first, 0), pad_hi=(0, nbox - last, 0), fill=0)

    def load_a(core: int, b: int, r0: int, rs: int, c0: int, cs: int, addr: int,
               slot: int) -> None:
        """Gather the A tile (row-major: output row, kernel row, window column) from the
        staged rows: one DMA per kernel row, every output row's run of ``cs`` columns."""
        kt = cs * kh
        base = slot_addr(core, slot)
        for a in range(kh):
            kb.load(core, shape=(g, rs, cs),
                    dst=block("input", addr + a * cs * isz, dt, (ga, kt, 1)),
                    src=block("l1", base + a * dh * px * isz, dt, (l1_group, sh * px, 1)))

    def load_b(core: int, b: int, c0: int, cs: int, n0: int, ns: int, addr: int) -> None:
        kb.load(core, shape=(g, kh * cs, ns),
                dst=block("weight", addr, dt, (gb, ns, 1)),
                src=wl.at(geo.weight_offset(b) + n0, (geo.channel_stride, n, 1)))

    def store_c(core: int, b: int, r0: int, rs: int, n0: int, ns: int, addr: int) -> None:
        plane, o0, _ = geo.entry(b)
        kb.store(core, shape=(g, rs, ns),
                 dst=out.at(plane * oh * ow + r0 * ow + o0 + n0, (oh * ow, ow, 1)),
                 src=block("acc", addr, out.dtype, (gc, c_row, c_col)))

    return BandedTransfers(stage_a, load_a, load_b, store_c)
