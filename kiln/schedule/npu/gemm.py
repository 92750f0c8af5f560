"""Matrix products on the tensor unit, tiled from the hardware description.

Every product is a GEMM ``C[M, N] = A[M, K] @ B[K, N]`` (a batch of them for batched matmuls and
for the images of a convolution), described in *units* so that a convolution fits the same
planner: an M unit is one row of A (dense) or one output row of ``OW`` pixels (conv2d), a K unit
one column (dense) or one input channel times the ``KH * KW`` taps (conv2d, whose A tiles are
gathered from the image by strided DMAs with padding: an implicit GEMM, im2col in the DMA).

:func:`plan_gemm` enumerates candidate tilings, keeps the feasible ones (``nbuf`` slots of the
A, B and C tiles fit the L0 input, weight and accumulator buffers; extents fit the encoding)
and ranks them with :func:`gemm_cost` (tensor-unit cycles against DMA cycles, from the
description). :func:`emit_gemm` emits the chosen tiling as a double-buffered pipeline: DMA-in
loads step ``s + 1`` while the tensor unit multiplies step ``s`` and DMA-out stores the
previous output tile; output tiles are spread round-robin over the cores (:func:`output_tiles`:
the tiles left over after the last full round are split into one piece per core), and each
core's last tile is multiplied and stored in pieces so that the kernel ends with one piece's
store.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from ...npu.isa import UNIT_DMA_IN, UNIT_DMA_OUT, UNIT_TENSOR
from ...npu.simulator import stream_cycles
from ...target.npu.config import DRAM, NPUConfig
from ..knobs import graph_knob
from .emit import KernelBuilder, KernelInfo, Pipeline, block, itemsize

__all__ = ["DEFER_STORES", "FIRST_LOADS_TILES", "STAGGER_FIRST_LOADS", "TILING_CANDIDATES",
           "TILING_KNOB", "GemmShape", "GemmTiling",
           "GemmTransfers", "SlotCache",
           "acc_row_stride", "acc_slots", "acc_strides", "core_step_slots", "emit_gemm",
           "feasible_tilings", "fixed_tiles", "gemm_bounds", "gemm_cost", "gemm_kernel_info",
           "gemm_roofline", "gemm_traffic", "group_strides", "held_loads", "held_tiles",
           "kernel_acc_slots", "plan_candidates", "plan_gemm", "prefetch_staging",
           "residual_weights_product", "store_floor", "tail_pieces", "tile_bytes",
           "tiling_domain", "tiling_knob_key", "tiling_value", "used_acc_slots"]


@dataclass(frozen=True)
class GemmShape:
    """``batch`` GEMMs of ``M = m_units * m_unit`` rows, ``N`` columns and
    ``K = k_units * k_unit`` in ``dtype`` (the tensor unit's operand type);
    ``a_dmas``: DMAs that gather one A tile (1, or ``KH * KW`` for a convolution);
    ``b_shared``: B is the same for every batch entry (weights: loaded once per tile, counted
    once by the roofline; ``a_shared`` likewise for A); ``a_elems``: elements of A's source
    per batch entry (a conv's image: what the roofline counts; 0: M x K).

    A convolution stages its input rows in L1 (one DMA per step, contiguous in DRAM) with
    their padding, channels innermost, and gathers the taps from there: ``stage_stride``
    (rows of input per M unit; 0: no staging), ``stage_halo`` (rows of the window),
    ``stage_row`` (elements per input row in DRAM), ``stage_width`` (pixels per staged row,
    its padding included; 0: ``stage_row``) and ``stage_pad`` (bytes of an L1 bank line: each
    pixel's run of channels is padded to an odd number of them, so the staging DMA's writes,
    one element per pixel, spread over the banks) size the L1 slot; ``stage_runs``: each
    staged row is a DRAM run of its own (a strided 1x1 convolution reading every
    ``stride``-th row). ``a_dmas_row``: the gathers of one M unit when a tile of few units
    takes fewer than ``a_dmas`` (a conv row's ``KH`` windows, each ``KW`` taps of contiguous
    channel runs; 0: always ``a_dmas``). ``acc_padded``: the accumulator tile's rows are
    :func:`acc_row_stride` apart (for a store that reads it column by column).
    ``acc_columns``: the accumulator tile is column-major instead (:func:`acc_strides`): each
    column -- a convolution's output channel, stored as a run of its pixels -- is contiguous,
    so a range of columns (a tail piece, a fused epilogue's chunk) is one address range of
    its own, which the bank-group placement (:mod:`kiln.codegen.npu.bank_plan`) can put in
    another group than the next range; rows apart they interleave over the whole tile.
    ``stage_columns``: the K units are columns of one input row (a banded depthwise
    convolution, :mod:`.banded`): a tile stages ``groups // stage_share`` channel planes'
    rows, whole (``stage_row`` elements, one DRAM run per plane), which ``stage_share``
    products each (the column blocks of a channel) gather their columns from. ``acc_row``:
    the output tile's rows are that many elements apart, row-major, and the products of a
    channel sit side by side in them (``emit_gemm``'s ``c_groups``: a banded depthwise
    kernel's column blocks at their columns), so a channel's tile is whole output rows,
    stored as one run; 0: :func:`acc_strides`' layout, one tile per product.
    ``groups``: each batch entry is that many independent products of this shape, each with
    its own A, B and C (a banded depthwise convolution's channels: one band per channel, so
    the tensor unit cannot share B among them); a tile holds all of them, stacked
    (:func:`group_strides`), moved by the same DMAs and multiplied by one ``mma`` each --
    one pipeline step for ``groups`` small products. Every size and count of work per tile
    (bytes, tensor passes, staged rows) is ``groups`` times one product's.
    ``b_groups``: the distinct B tiles among them (0: ``groups``; a banded kernel's column
    blocks share their channel's bands: the B tile holds and DRAM moves only those).
    ``stage_l0``: with ``stage_columns``, the staged rows are the A tile itself -- staged
    straight into the L0 input slot, one DMA per step, and read in place by the products
    (``emit_gemm``'s ``a_parts``), with no L1 slot and no gathers. ``k_split``: each
    product's K is multiplied as that many products of ``K / k_split`` (a banded kernel
    reading its kernel rows in place: one ``mma`` per kernel row, each its own passes of the
    tensor unit's K). ``stage_onchip``: the staged rows' source is counted in L1 (read at
    the DMA engine's on-chip bandwidth and L1's latency, off the shared DRAM channel): an
    intermediate that fits L1, where on-chip residency -- decided once the program is
    emitted -- keeps it (:func:`.vector.pool2d_cost` counts the vector route's input so;
    a banded depthwise kernel's likewise, so the two routes are weighed alike; a strided
    convolution's image, which the lowering predicts residency keeps: :func:`~.ops.onchip_input`,
    so a tiling that stages the input once per core -- the cores splitting N -- is not charged
    the image once per core on the DRAM channel). It changes the cost model alone, never the
    roofline (:func:`gemm_bounds`: the layer's).
    ``store_onchip``: the output likewise (an intermediate that fits L1: its stores at the
    on-chip bandwidth, off the DRAM channel). ``b_rows``: B is built on chip -- each B tile
    by ``b_dmas`` DMAs from L1, where every entry's ``b_rows`` elements (a banded kernel's
    compact rows of its bands) were loaded once ahead of the products -- instead of read
    from DRAM every step (0)."""

    batch: int
    m_units: int
    m_unit: int
    n: int
    k_units: int
    k_unit: int
    dtype: str
    a_dmas: int = 1
    b_shared: bool = True
    a_shared: bool = False
    a_elems: int = 0
    stage_stride: int = 0
    stage_halo: int = 0
    stage_row: int = 0
    stage_pad: int = 0
    acc_padded: bool = False
    stage_runs: bool = False
    acc_columns: bool = False
    stage_width: int = 0
    a_dmas_row: int = 0
    stage_columns: bool = False
    groups: int = 1
    stage_share: int = 1
    acc_row: int = 0
    b_groups: int = 0
    stage_l0: bool = False
    k_split: int = 1
    stage_onchip: bool = False
    store_onchip: bool = False
    b_rows: int = 0
    b_dmas: int = 1

    def stage_source_bandwidth(self, cfg: NPUConfig) -> float:
        """Bytes a cycle the staging reads its source at (``stage_onchip``: the DMA
        engine's on-chip bandwidth; else the chip's DRAM bandwidth)."""
        return cfg.dma_onchip_bandwidth if self.stage_onchip else cfg.memory(DRAM).bandwidth

    @property
    def column_stores(self) -> bool:
        """The tile is stored column by column (a convolution's NCHW output channels)."""
        return self.acc_padded or self.acc_columns

    def stage_pixel(self, ku: int) -> int:
        """Elements between the pixels of an L1 staging slot of ``ku`` K units (channels):
        ``ku``, or when that is more than one ``stage_pad``-byte bank line, rounded up to an
        odd number of them (a stride of an even number of lines would leave banks idle)."""
        isz = itemsize(self.dtype)
        if not self.stage_pad or self.stage_pad % isz or ku * isz <= self.stage_pad:
            return ku
        per_line = self.stage_pad // isz
        lines = -(-ku // per_line)
        return (lines + 1 - lines % 2) * per_line

    def stage_rows(self, mu: int) -> int:
        """Input rows staged for a tile of ``mu`` M units (their windows' rows)."""
        return (mu - 1) * self.stage_stride + self.stage_halo

    def stage_bytes(self, mu: int, ku: int) -> int:
        """Bytes of one L1 staging slot for tiles of ``mu`` M units and ``ku`` K units: the
        window's rows of ``stage_width`` pixels of :meth:`stage_pixel` elements."""
        if not self.stage_stride:
            return 0
        if self.stage_columns:
            return self.groups // self.stage_share * self.stage_rows(mu) * \
                self.stage_pixel(self.stage_row) * itemsize(self.dtype)
        return self.groups * self.stage_rows(mu) * (self.stage_width or self.stage_row) * \
            self.stage_pixel(ku) * itemsize(self.dtype)

    def stage_elems(self, mu: int, ku: int) -> int:
        """Elements one tile's staging writes to L1."""
        if self.stage_columns:
            return self.groups // self.stage_share * self.stage_rows(mu) * self.stage_row
        return self.groups * ku * self.stage_rows(mu) * (self.stage_width or self.stage_row)

    def gathers(self, mu: int) -> int:
        """DMAs that gather one A tile of ``mu`` M units."""
        return min(self.a_dmas, mu * self.a_dmas_row) if self.a_dmas_row else self.a_dmas

    def stage_dram_bytes(self, mu: int, ku: int, burst: int) -> int:
        """Bytes DRAM moves to stage a tile's rows: per K unit one contiguous run of its
        rows, or with ``stage_runs`` (a strided 1x1 convolution's rows, ``stage_stride``
        apart in the image) one run per row, or with ``stage_columns`` one run of each staged
        plane's rows --
        whole bursts of each run. The L1 slot's
        padding is not DRAM traffic."""
        if not self.stage_stride:
            return 0
        rows = self.stage_rows(mu)
        if self.stage_columns:
            run = rows * self.stage_row * itemsize(self.dtype)
            return self.groups // self.stage_share * -(-run // burst) * burst
        row = self.stage_row * itemsize(self.dtype)
        if self.stage_runs:
            return ku * rows * -(-row // burst) * burst
        return ku * -(-rows * row // burst) * burst

    @property
    def m(self) -> int:
        return self.m_units * self.m_unit

    @property
    def k(self) -> int:
        return self.k_units * self.k_unit


@dataclass(frozen=True)
class GemmTiling:
    """Units of M and K and columns of N per tile, and the cost model's estimate (cycles).
    ``balance``: the output tiles left over after a round per core are split into one piece
    per core (:func:`output_tiles`; the planner weighs it against not splitting: a small
    leftover tile saves less than its pieces' extra loads cost)."""

    m_units: int
    n: int
    k_units: int
    estimate: float
    balance: bool = True
    #: the tiling knob key it was planned under (:func:`plan_candidates`; no decision of its
    #: own): the product kernel's :attr:`~.emit.KernelInfo.knob`, by which the tuner finds the
    #: kernels a key decides in a built model
    knob: str = field(default="", compare=False, repr=False)

    def describe(self, shape: GemmShape) -> str:
        return (f"tile M{self.m_units * shape.m_unit} x N{self.n} x K{self.k_units * shape.k_unit}"
                f" of M{shape.m} x N{shape.n} x K{shape.k} (batch {shape.batch}), "
                f"est. {self.estimate:.0f} cycles")


def acc_row_stride(cfg: NPUConfig, shape: GemmShape, nt: int) -> int:
    """Elements between the rows of an accumulator tile of ``nt`` columns: ``nt``, or for
    ``shape.acc_padded`` the next stride whose rows start an odd number of bank lines apart,
    so that a store reading a column (one element per row: a convolution's output channel,
    NCHW in DRAM) spreads over every bank instead of hitting one."""
    if not shape.acc_padded:
        return nt
    asz = itemsize(_acc_dtype(cfg, shape.dtype)[0])
    width = cfg.memory("acc").bank_width
    if width % asz:
        return nt
    per_line = width // asz
    lines = -(-nt // per_line)
    return (lines + 1 - lines % 2) * per_line


def acc_strides(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling, nts: int
                ) -> tuple[int, int]:
    """Elements between the rows and between the columns of an output tile of ``nts``
    columns in the accumulators under ``tiling``: column-major (``shape.acc_columns``: rows
    1, columns the tiling's ``m_units * m_unit`` rows apart, the same for a partial tile so a
    piece's store finds its columns), or row-major with rows :func:`acc_row_stride` apart
    (``acc_padded``) or ``nts`` (packed)."""
    if shape.acc_row:
        return shape.acc_row, 1
    if shape.acc_columns:
        return 1, tiling.m_units * shape.m_unit
    return (acc_row_stride(cfg, shape, tiling.n) if shape.acc_padded else nts), 1


def _acc_dtype(cfg: NPUConfig, dtype: str) -> tuple[str, int]:
    td = cfg.tensor_dtype(dtype, dtype)
    if td is None:
        raise ValueError(f"the tensor unit of {cfg.name!r} does not multiply {dtype}")
    return str(td.acc), td.cycles_per_tile


def _tile_cycles(cfg: NPUConfig, m: int, n: int, k: int, cpt: int) -> int:
    tm, tk, tn = cfg.tensor_shape
    return math.ceil(m / tm) * math.ceil(n / tn) * math.ceil(k / tk) * cpt


def _product_cycles(cfg: NPUConfig, shape: GemmShape, m: int, n: int, k: int, cpt: int
                    ) -> int:
    """Tensor-unit cycles of one product of an ``m x n x k`` tile: ``shape.k_split``
    products of ``k / k_split`` each (each its own passes of the unit's K)."""
    return shape.k_split * _tile_cycles(cfg, m, n, -(-k // shape.k_split), cpt)


def _b_count(shape: GemmShape) -> int:
    """The distinct B tiles of a tile's products (``GemmShape.b_groups``)."""
    return shape.b_groups or shape.groups


def gemm_roofline(cfg: NPUConfig, shape: GemmShape) -> float:
    """The layer's bound: max of the tensor-unit cycles (all cores busy, no partial tiles
    beyond the shape's own) and the DRAM cycles of its minimum traffic (A and B read once, C
    written once)."""
    return max(gemm_bounds(cfg, shape))


def gemm_kernel_info(cfg: NPUConfig, label: str, op: str, tiling: str, estimate: float,
                     shape: GemmShape, knob: str = "", constant_a: bool = False,
                     constant_b: bool = False, c_itemsize: int = 0) -> KernelInfo:
    """The :class:`KernelInfo` of a product kernel: its roofline and whether the DRAM side
    of it binds; ``knob``: the tiling knob key it was planned under (:attr:`GemmTiling.knob`).
    ``constant_a``/``constant_b``: that operand is a constant (weights), which residency
    never keeps in L1, so it is no part of the bytes read that :func:`~.residency.rebound`
    may take off (``KernelInfo.reads``: the roofline's bytes of the other operand alone).
    ``c_itemsize``: the bytes stored per element of the result
    (:meth:`~.emit.KernelBuilder.result_itemsize`; 0: one accumulator element), which C's
    minimum traffic counts."""
    tensor, _ = gemm_bounds(cfg, shape)
    a_bytes, b_bytes, c_bytes = gemm_traffic(cfg, shape, c_itemsize)
    traffic = (a_bytes + b_bytes + c_bytes) / cfg.memory(DRAM).bandwidth
    reads = (0 if constant_a else a_bytes) + (0 if constant_b else b_bytes)
    return KernelInfo(label, op, tiling, estimate, max(tensor, traffic), tensor, traffic,
                      knob=knob, reads=reads, writes=c_bytes)


def gemm_traffic(cfg: NPUConfig, shape: GemmShape, c_itemsize: int = 0
                 ) -> tuple[int, int, int]:
    """The bytes of the roofline's minimum traffic (:func:`gemm_bounds`): A and B, each read
    once, and C, written once at ``c_itemsize`` bytes an element (what the kernel stores; 0:
    the accumulator's type -- more than a narrower store moves)."""
    acc, _ = _acc_dtype(cfg, shape.dtype)
    isz = itemsize(shape.dtype)
    g = shape.groups
    b_bytes = _b_count(shape) * shape.k * shape.n * isz * (1 if shape.b_shared else shape.batch)
    a_elems = shape.a_elems or shape.m * shape.k
    a_bytes = g * a_elems * isz * (1 if shape.a_shared else shape.batch)
    c_bytes = g * shape.batch * shape.m * shape.n * (c_itemsize or itemsize(acc))
    return a_bytes, b_bytes, c_bytes


def gemm_bounds(cfg: NPUConfig, shape: GemmShape) -> tuple[float, float]:
    """The two sides of :func:`gemm_roofline`: tensor-unit cycles, DRAM cycles."""
    _, cpt = _acc_dtype(cfg, shape.dtype)
    tensor = shape.groups * shape.batch * _tile_cycles(cfg, shape.m, shape.n, shape.k, cpt) / \
        cfg.cores
    return tensor, sum(gemm_traffic(cfg, shape)) / cfg.memory(DRAM).bandwidth


def _staged_a_cycles(cfg: NPUConfig, shape: GemmShape, mu: int, ku: int, a_bytes: float,
                     prefetch: bool) -> float:
    """DMA-in cycles of a convolution's A tile: the staging DMA (DRAM bytes at the chip's
    bandwidth, or its L1 writes, one element per pixel, if slower) and the gathers from L1
    (contiguous channel runs at the on-chip bandwidth, an issue overhead each), which wait
    for the staging's DRAM latency: :func:`emit_gemm` stages before the step waits for its
    slot (a tensor-bound pipeline hides that wait), or with ``prefetch`` during the step
    before, ahead of its gathers, which cover it. B's latency hides behind the gathers."""
    isz = itemsize(shape.dtype)
    l1 = cfg.memory("l1")
    px = shape.stage_pixel(ku)
    staged = shape.stage_elems(mu, ku)
    stride = 1 if shape.stage_columns else px  # L1 writes: whole rows, or one per pixel
    stage = cfg.dma_latency + max(a_bytes / shape.stage_source_bandwidth(cfg),
                                  stream_cycles(staged, isz, stride, cfg.dma_onchip_bandwidth,
                                                l1))
    elems = shape.groups * mu * shape.m_unit * ku * shape.k_unit
    gather = shape.gathers(mu) * cfg.dma_latency + \
        stream_cycles(elems, isz, 1, cfg.dma_onchip_bandwidth, cfg.memory("input"))
    wait = (0 if shape.stage_onchip else cfg.memory(DRAM).latency) + l1.latency
    return stage + gather + (max(0.0, wait - gather) if prefetch else wait)


def prefetch_staging(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling, nbuf: int) -> bool:
    """Whether :func:`emit_gemm` stages each step's A rows during the step before (two slots
    or more), by the cost model: that hides a DRAM and an L1 latency per step where the DMA
    is the bottleneck, but delays the tensor unit's second step by one staging (every
    core's, on the shared channel). Edge, ResNet-18's stage-1 3x3 conv (448 steps): 84.9 ->
    92.6% of the roofline; default, stage 2's 3x3/s2 (8 steps a core): it would lose 3%."""
    if nbuf < 2 or not shape.stage_stride:
        return False
    args = (cfg, shape, tiling.m_units, tiling.n, tiling.k_units, nbuf)
    return gemm_cost(*args, balance=tiling.balance, prefetch=True) < \
        gemm_cost(*args, balance=tiling.balance, prefetch=False)


def residual_weights_product(kb: KernelBuilder, shape: GemmShape) -> bool:
    """Whether :data:`STAGGER_FIRST_LOADS` and :data:`DEFER_STORES` apply to a product: an
    activation (A, its own per batch entry) times weights every entry shares (B), whose fused
    epilogue adds a residual (``KernelBuilder.residual_epilogue``) -- a dense layer. Not a
    pointwise convolution's ``W @ X`` (A the weights, from DRAM; B the image: MobileNetV2's
    residual 1x1 at 112 px lost 2287 -> 2349 cycles) nor a batched matmul's."""
    return shape.b_shared and not shape.a_shared and kb.residual_epilogue()


#: A dense layer whose fused epilogue adds a residual (:func:`residual_weights_product`):
#: :func:`emit_gemm` loads an odd core's first B tile before its first A tile. A plain
#: product's A is an activation that residency keeps in L1, B weights from DRAM, and the
#: cores' first steps all began with A from L1 and then queued their B on the DRAM channel
#: behind each other (default, BERT's attention output projection, M128 x N768 x K768 in
#: N32 tiles: core 1's first product at cycle 3239, the channel idle for the first 1544);
#: alternating the order overlaps one core's A with another's B (core 1 at 2341). Not for
#: every product: without a residual the cores then run their steps in lock step and
#: their B loads queue behind each other every step (the FFN's N3072 layer in N64 tiles:
#: 83206 -> 84543 cycles). With DEFER_STORES, 22320 -> 21473 cycles.
STAGGER_FIRST_LOADS = True
#: A dense layer whose fused epilogue adds a residual: :func:`emit_gemm` emits each output
#: tile's store (the residual's chunk loads with it) after the core's next step's loads, as a
#: staged convolution's (see ``pending`` there). Not without a residual (the FFN layer
#: above: 83206 -> 85603 cycles).
DEFER_STORES = True

#: :func:`gemm_cost` charges a core's first step with the other cores' first loads where
#: the product has at most this many output tiles per core.
FIRST_LOADS_TILES = 1


def gemm_cost(cfg: NPUConfig, shape: GemmShape, mu: int, nt: int, ku: int, nbuf: int,
              balance: bool = True, prefetch: bool | None = None) -> float:
    """Estimated cycles of a tiling: the busiest of the tensor unit, the chip's DRAM channel
    (every byte moved, at the chip's bandwidth) and one core's DMA-in queue (its own
    transfers, each holding the channel at full bandwidth, the issue overhead of every DMA, a
    convolution's gathers from L1 and the wait for its staged rows), plus the pipeline's
    fill; without double buffering the tensor unit and the DMA add up instead.
    ``balance``: the output tiles left over after a round per core are split among the cores
    (:func:`emit_gemm` does; the TIR route's generator does not). ``prefetch``: a
    convolution's staging runs a step ahead (:func:`prefetch_staging`; None: the cheaper)."""
    if prefetch is None and shape.stage_stride and not shape.stage_l0 and nbuf >= 2:
        return min(gemm_cost(cfg, shape, mu, nt, ku, nbuf, balance, False),
                   gemm_cost(cfg, shape, mu, nt, ku, nbuf, balance, True))
    acc, cpt = _acc_dtype(cfg, shape.dtype)
    isz = itemsize(shape.dtype)
    mt, kt = mu * shape.m_unit, ku * shape.k_unit
    nm, nn, nk = (math.ceil(shape.m_units / mu), math.ceil(shape.n / nt),
                  math.ceil(shape.k_units / ku))
    steps = shape.batch * nm * nn * nk
    core_steps = math.ceil(shape.batch * nm * nn / cfg.cores) * nk  # the busiest core's
    # the tensor unit's passes over the real extents (a dim's last tile is narrower: N196
    # in tiles of 64 is 25 passes of 8, not 32) of the busiest core's tiles
    tm, tk, tn = cfg.tensor_shape
    g = shape.groups
    ks = shape.k_split
    tensor = g * _busiest_passes(cfg, shape, mt, nt) * ks * \
        _passes(shape.k // ks, -(-kt // ks), tk) * cpt
    dram = cfg.memory(DRAM)
    # DRAM moves whole bursts of each row of a tile narrower than its matrix (every load
    # counted as a whole tile: scaling the last tiles' loads down to their real extents
    # ranked narrow tiles of one K step over one tile of several on the default description,
    # MobileNetV2's 1x1 384 -> 64: 4981 -> 5321 cycles)
    a_bytes = shape.stage_dram_bytes(mu, ku, dram.burst) or \
        g * _burst_bytes(cfg, mt, kt * isz, kt == shape.k)
    b_bytes = _b_count(shape) * _burst_bytes(cfg, kt, nt * isz, nt == shape.n)
    # every core starts with its first step's loads at once, on the one channel: the last
    # core served starts its products after the others' first tiles too (default,
    # ResNet-18's 3x3/s2 of stage 3, one output tile a core: core 0's first product at
    # cycle 3289 of 18884 behind two 74 KB weight tiles; K steps of 144 halve them: 18884
    # -> 17319 cycles). Counted where each core multiplies one output tile, its K steps the
    # whole pipeline (FIRST_LOADS_TILES): with several tiles a core, it made the planner
    # take larger M tiles of fewer K (stage 2's 3x3/1s: M448 x K144) whose fused residual
    # epilogue stalls the tensor unit after every tile, which this model does not see
    # (32831 -> 35143 cycles)
    onchip_a = shape.stage_onchip and bool(shape.stage_stride)  # A staged from L1
    tiles = shape.batch * nm * nn
    first_others = 0 if tiles > FIRST_LOADS_TILES * cfg.cores else \
        (min(cfg.cores, tiles) - 1) * ((0 if onchip_a else a_bytes) +
                                         (0 if shape.b_rows else b_bytes))
    # a tile that a slot already holds is not loaded again (emit_gemm): a tile fixed on a
    # core once per K step; another while one of the core's slots holds it (held_loads)
    a_fixed, b_fixed = fixed_tiles(cfg, shape, nm, nn, nk, nbuf)
    a_held, b_held = held_loads(cfg, shape, nm, nn, nk, nbuf)
    a_loads = min(core_steps, nk) if a_fixed else a_held
    b_loads = min(core_steps, nk) if b_fixed else b_held
    scale = steps / core_steps  # the cores' loads over the busiest one's
    split = _split_axis(cfg, shape, mu, nt, nm, nn, nk, nbuf) if balance else ""
    if split:
        # the tiles left over after a round per core are split among the cores: each core
        # multiplies ``full`` tiles and ``rest`` pieces, and loads a piece's share of the
        # split operand but the whole other one (both cores read that tile's A or B)
        full, rest = divmod(shape.batch * nm * nn, cfg.cores)
        pm, pn = (mt, _split_sizes(nt, cfg.cores, cfg.tensor_shape[2])[0]) if split == "n" \
            else (_split_sizes(mu, cfg.cores, 1)[0] * shape.m_unit, nt)
        tensor = g * nk * (full * _product_cycles(cfg, shape, mt, nt, kt, cpt) +
                           rest * _product_cycles(cfg, shape, pm, pn, kt, cpt))
        held = a_loads < core_steps, b_loads < core_steps
        core_steps = (full + rest) * nk
        a_piece = a_bytes if split == "n" else (
            shape.stage_dram_bytes(pm // shape.m_unit, ku, dram.burst) or
            g * _burst_bytes(cfg, pm, kt * isz, kt == shape.k))
        b_piece = b_bytes if split == "m" else \
            _b_count(shape) * _burst_bytes(cfg, kt, pn * isz, False)
        a_bytes = (full * a_bytes + rest * a_piece) / (full + rest)
        b_bytes = (full * b_bytes + rest * b_piece) / (full + rest)
        # a held tile stays held, but the pieces' own tiles of the split operand are loaded
        a_loads, b_loads = (min(core_steps, loads + (nk * rest if axis == split else 0))
                            if kept else core_steps
                            for loads, kept, axis in zip((a_loads, b_loads), held, "mn"))
        scale = cfg.cores
    a_channel = 0.0 if shape.stage_onchip else a_bytes  # A's bytes on the DRAM channel
    c_bytes = g * shape.batch * shape.m * shape.n * itemsize(acc)
    per_b = cfg.dma_latency + b_bytes / dram.bandwidth  # a B tile's DMA-in cycles
    b_channel = scale * b_loads * b_bytes
    preload = 0.0
    if shape.b_rows:  # built from rows loaded once into L1: the entries' rows on the channel
        per_b = shape.b_dmas * cfg.dma_latency + b_bytes / cfg.dma_onchip_bandwidth
        b_channel = shape.batch * shape.b_rows * isz
        preload = dram.latency + math.ceil(shape.batch / cfg.cores) * cfg.dma_latency + \
            b_channel / dram.bandwidth
    traffic = scale * a_loads * a_channel + b_channel + \
        (0 if shape.store_onchip else c_bytes)
    per_a = shape.a_dmas * cfg.dma_latency + a_bytes / dram.bandwidth
    delay = 0.0  # the tensor unit's second step waits for the third step's staging
    if shape.stage_l0:
        # the staged rows are the A tile: one DMA into L0 input, no gathers, no L1 slot
        per_a = cfg.dma_latency + max(
            a_bytes / shape.stage_source_bandwidth(cfg),
            stream_cycles(shape.stage_elems(mu, ku), isz, 1, cfg.dma_onchip_bandwidth,
                          cfg.memory("input")))
    elif shape.stage_stride:
        prefetch = bool(prefetch) and nbuf >= 2
        per_a = _staged_a_cycles(cfg, shape, mu, ku, a_bytes, prefetch)
        if prefetch:
            delay = shape.stage_dram_bytes(mu, ku, dram.burst) * (
                1 / cfg.dma_onchip_bandwidth if shape.stage_onchip
                else cfg.cores / dram.bandwidth)
    dma_in = preload + a_loads * per_a + b_loads * per_b  # the preload fences DMA-in
    # a pipeline: the first step's loads precede the tensor unit's work, the last step's
    # product follows the DMA's, the last tile's store follows both
    load1 = per_a + per_b + preload + first_others / dram.bandwidth
    step = g * _product_cycles(cfg, shape, mt, nt, kt, cpt)
    store = g * mt * nt * itemsize(acc) / dram.bandwidth + dram.latency
    dma_out = 0.0
    if shape.store_onchip:  # a core's stores at its engine's on-chip bandwidth
        out_bytes = g * mt * nt * itemsize(acc)
        store = out_bytes / cfg.dma_onchip_bandwidth + cfg.memory("l1").latency
        dma_out = core_steps * (cfg.dma_latency + out_bytes / cfg.dma_onchip_bandwidth)
    fill = cfg.tensor_latency * (core_steps + 1) + store + delay
    if nbuf >= 2:
        return max(tensor + load1, dma_in + step, traffic / dram.bandwidth, dma_out) + fill
    return tensor + dma_in + fill + core_steps * dram.latency


def held_loads(cfg: NPUConfig, shape: GemmShape, nm: int, nn: int, nk: int, nbuf: int
                ) -> tuple[int, int]:
    """Loads of A tiles and of B tiles on the busiest core (core 0) when a tile one of its
    ``nbuf`` slots holds is not loaded again (:func:`core_step_slots`: the slots are a
    least-recently-used cache of the core's tiles). Counted on the runs of equal tiles of
    the core's step sequence (:func:`_lru_misses`). With more K steps per tile than slots no
    tile returns while still held."""
    tiles = shape.batch * nm * nn
    steps = math.ceil(tiles / cfg.cores) * nk
    if nk > nbuf:
        return steps, steps
    j = np.arange(0, tiles, cfg.cores, dtype=np.int64)
    k = np.tile(np.arange(nk, dtype=np.int64), j.size)
    j = np.repeat(j, nk)
    b = j // (nm * nn)
    a_key = ((0 if shape.a_shared else 1) * b * nm + (j // nn) % nm) * nk + k
    b_key = ((0 if shape.b_shared else 1) * b * nn + j % nn) * nk + k
    return _lru_misses(a_key, nbuf), _lru_misses(b_key, nbuf)


def _lru_misses(keys: np.ndarray, nbuf: int) -> int:
    """Loads of a least-recently-used cache of ``nbuf`` entries over ``keys``: on the runs of
    equal keys, a run's key is held iff it is among the ``nbuf - 1`` distinct keys read
    before the previous run's (with two entries: the run two back -- vectorized; with more,
    walked run by run)."""
    if keys.size == 0:
        return 0
    runs = keys[np.concatenate(([0], np.flatnonzero(np.diff(keys)) + 1))]
    if nbuf <= 2:
        hit = np.zeros(runs.size, dtype=bool)
        if nbuf == 2:
            hit[2:] = runs[2:] == runs[:-2]
        return int(runs.size - hit.sum())
    recent: list[int] = []  # most recent last
    misses = 0
    for key in runs.tolist():
        if key in recent:
            recent.remove(key)
        else:
            misses += 1
            if len(recent) == nbuf:
                recent.pop(0)
        recent.append(key)
    return misses


def fixed_tiles(cfg: NPUConfig, shape: GemmShape, nm: int, nn: int, nk: int, nbuf: int
                 ) -> tuple[bool, bool]:
    """Whether each slot of a core always holds the same A tile, and the same B tile:
    :func:`emit_gemm` deals the output tiles ``(batch, m, n)`` round-robin to the cores, runs
    the ``nk`` K steps of each in turn and gives step ``t`` of a core slot ``t % nbuf``, so
    with one m (n) index per core and ``nk`` dividing ``nbuf`` a slot sees one A (B) tile."""
    if nbuf % nk:
        return False, False
    cores = cfg.cores
    one_n = nn == 1 or nn == cores  # tile j's n index is j mod nn; its core j mod cores
    one_m = nm == 1 or (nn == 1 and nm == cores)
    return (one_m and (shape.a_shared or shape.batch == 1),
            one_n and (shape.b_shared or shape.batch == 1))


def _split_axis(cfg: NPUConfig, shape: GemmShape, mu: int, nt: int, nm: int, nn: int, nk: int,
                nbuf: int) -> str:
    """How :func:`emit_gemm` splits each output tile left over after a round per core (the
    tile count is not a multiple of the cores: 7 tiles on 2 cores) into one piece per core,
    so that every core multiplies the same amount: ``"m"`` (whole M units; keeps the B tile
    a core holds), ``"n"`` (columns in multiples of the tensor unit's N; keeps the A tile)
    or ``""`` (not split: no remainder, one core, too small, or only along a held operand).
    Each output element is still summed over the same K steps in the same order: the bits
    do not change."""
    cores = cfg.cores
    if cores == 1 or (shape.batch * nm * nn) % cores == 0:
        return ""
    tn = cfg.tensor_shape[2]
    a_fixed, b_fixed = fixed_tiles(cfg, shape, nm, nn, nk, nbuf)
    # the leftover tiles are the last ones: the last m index, the last n indices
    last_mu = shape.m_units - (nm - 1) * mu
    last_nt = shape.n - (nn - 1) * nt
    # a tile held in one copy per K step is never reloaded (its slot is not double-buffered:
    # the pipeline's tokens do not guard it), so the held operand's axis is not split
    can_m = last_mu >= cores and not a_fixed
    can_n = last_nt >= cores * tn and not b_fixed
    if can_m and (b_fixed or not can_n):
        return "m"
    return "n" if can_n else ""


def used_acc_slots(nout: int, tiles: int, cores: int, core: int = 0) -> int:
    """Output slots core ``core`` uses of ``nout`` when ``tiles`` output tiles go round-robin
    over ``cores`` (one with fewer tiles than slots uses as many; core 0 is the busiest;
    ``tiles`` 0: unknown, all of them)."""
    return min(nout, -(-(tiles - core) // cores)) if tiles else nout


def acc_slots(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling, nbuf: int,
              epilogue: Any = None) -> int:
    """Accumulator slots :func:`emit_gemm` rotates a core's output tiles through: ``nbuf``,
    or ``nbuf + 1`` where they fit with double buffering, one K step per tile and the bytes
    loaded a step (the tiles not fixed on the core) at least the output tile's: its store,
    queued behind a step's loads (first come, first served), then has two steps, not one,
    before its slot is taken again (edge, P @ V: 65038 ->
    63989 cycles; default 1 core, ResNet-18's 3x3 of stage 1 in M112 x N32 tiles: 75119 ->
    66609). Not where the stores dominate: more of them in flight only crowd the channel
    (edge, MobileNetV2's 1x1 64 -> 384: 27091 -> 27207 cycles with a third slot; default,
    ResNet-18's 1x1/s2 of stage 2: 11697 -> 11771).

    ``epilogue``: the product's fused epilogue (:class:`~.epilogue.Epilogue`, duck-typed:
    ``chunk_elems``), whose buffers go above the slots: the slot more is taken only where
    it leaves the epilogue chunks as large as ``nbuf`` slots do. Taken regardless, it
    could leave room for a few channels a chunk, each chunk a DMA round trip (edge with 7 KiB
    of accumulators, a 1x1 convolution 128 -> 32 at 14 x 14 with a residual in tiles of 2
    KiB: 76 residual loads and 25413 cycles with a third slot, 28 and 20296 without;
    tested), or for none (the epilogue unfused). Only the banded depthwise kernel was
    guarded before (:data:`~.ops.BANDED_ACC_SHARE`, which also bounds its tiles)."""
    in_bytes, w_bytes, c_bytes = tile_bytes(cfg, shape, tiling)
    a_fixed, b_fixed = held_tiles(cfg, shape, tiling, nbuf)
    streamed = (0 if a_fixed else in_bytes) + (0 if b_fixed else w_bytes)
    nk = math.ceil(shape.k_units / tiling.k_units)
    if nbuf >= 2 and nk == 1 and streamed >= c_bytes and \
            (nbuf + 1) * c_bytes <= cfg.memory("acc").size:
        tile = c_bytes // itemsize(_acc_dtype(cfg, shape.dtype)[0])
        ops = {"input": (nbuf, in_bytes), "weight": (nbuf, w_bytes)}  # as emit_gemm's
        if epilogue is None or \
                epilogue.chunk_elems(cfg, (nbuf + 1) * c_bytes, nbuf, tile, ops) >= \
                epilogue.chunk_elems(cfg, nbuf * c_bytes, nbuf, tile, ops):
            return nbuf + 1
    return nbuf


def kernel_acc_slots(kb: KernelBuilder, shape: GemmShape, tiling: GemmTiling) -> int:
    """:func:`acc_slots` of the product ``kb`` emits: with its fused epilogue
    (``kb.epilogue``), at most ``kb.acc_slot_cap`` (0: no cap; the slot count the build's
    replay chose for the kernel, :mod:`.feedback`'s ``choose_acc_slots``); the count is
    recorded in ``kb.acc_slots_used``."""
    n = acc_slots(kb.config, shape, tiling, kb.nbuf, kb.epilogue)
    n = min(n, kb.acc_slot_cap) if kb.acc_slot_cap else n
    kb.acc_slots_used = max(kb.acc_slots_used, n)
    return n


def store_floor(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling, nbuf: int) -> int:
    """The smallest piece a product's stores are split into (``KernelBuilder.store_floor``).
    A tile's store must be done before its accumulator slot takes the tile after next: with
    one K step per tile that is one step away, and store pieces each served after a whole
    load (the channel is first come, first served) are not, so the tensor unit waits (edge,
    P @ V: 74501 -> 87272 cycles). There the pieces are as large as the loads that stream
    every step. With several K steps the store has their time, and short pieces that slip
    between the loads measure better (edge, BERT's dense layers): no floor."""
    if math.ceil(shape.k_units / tiling.k_units) > 1 or shape.stage_stride:
        return 0
    in_bytes, w_bytes, _ = tile_bytes(cfg, shape, tiling)
    a_fixed, b_fixed = held_tiles(cfg, shape, tiling, nbuf)
    return max(0 if a_fixed else in_bytes, 0 if b_fixed else w_bytes)


def tile_bytes(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling) -> tuple[int, int, int]:
    """Bytes of one A tile (L0 input: with ``shape.stage_l0`` the staged rows), one B tile
    (L0 weight: its distinct B tiles, ``shape.b_groups``) and one output tile (the
    accumulators, rows :func:`acc_row_stride` apart) under ``tiling``."""
    acc, _ = _acc_dtype(cfg, shape.dtype)
    isz = itemsize(shape.dtype)
    a, b, _ = group_strides(cfg, shape, tiling)
    a_bytes = shape.stage_bytes(tiling.m_units, tiling.k_units) if shape.stage_l0 else \
        shape.groups * a * isz
    return a_bytes, _b_count(shape) * b * isz, \
        _acc_tile_elems(cfg, shape, tiling.m_units, tiling.n) * itemsize(acc)


def _acc_tile_elems(cfg: NPUConfig, shape: GemmShape, mu: int, nt: int) -> int:
    """Elements of one output tile of ``mu`` M units and ``nt`` columns in the
    accumulators: every product's (rows :func:`acc_row_stride` apart), or with
    ``shape.acc_row`` each channel's rows of the products side by side."""
    if shape.acc_row:
        return shape.groups // shape.stage_share * mu * shape.m_unit * shape.acc_row
    return shape.groups * mu * shape.m_unit * acc_row_stride(cfg, shape, nt)


def group_strides(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling) -> tuple[int, int, int]:
    """Elements between the products of a tile of ``shape.groups`` (:class:`GemmShape`) in
    its A tile, its B tile and its output tile under ``tiling``: one whole tile of one
    product each (a partial tile keeps the stride, so every step's products are where the
    DMAs and the ``mma`` instructions look); with ``shape.acc_row`` the output's is one
    channel's rows (the products of a channel share them: ``emit_gemm``'s ``c_groups``)."""
    mu, nt, ku = tiling.m_units, tiling.n, tiling.k_units
    return (mu * shape.m_unit * ku * shape.k_unit, ku * shape.k_unit * nt,
            mu * shape.m_unit * (shape.acc_row or acc_row_stride(cfg, shape, nt)))


def _busiest_passes(cfg: NPUConfig, shape: GemmShape, mt: int, nt: int) -> int:
    """Passes of the tensor unit over the M x N extents of the output tiles of the busiest
    core (tiles of ``mt`` x ``nt`` dealt round-robin, :func:`output_tiles` without the split
    of the leftover ones): a narrower last tile is not every core's. Before, the average
    share: default, ResNet-18's 3x3 of stage 2 (M784) in M224 tiles was estimated at the
    roofline's 28224 tensor cycles a core where one core multiplies two whole tiles, 32256
    (the layer alone: estimated 32428 cycles, the best of the ranking; simulated 35836,
    against 32906 for M112 x N64 x K576, estimated 1.6% dearer)."""
    nm, nn = math.ceil(shape.m / mt), math.ceil(shape.n / nt)
    pm = np.full(nm, -(-mt // cfg.tensor_shape[0]), dtype=np.int64)
    pm[-1] = -(-(shape.m - (nm - 1) * mt) // cfg.tensor_shape[0])
    pn = np.full(nn, -(-nt // cfg.tensor_shape[2]), dtype=np.int64)
    pn[-1] = -(-(shape.n - (nn - 1) * nt) // cfg.tensor_shape[2])
    tile = (pm[:, None] * pn[None, :]).ravel()  # (m, n) row-major, as the tiles are dealt
    j = np.arange(shape.batch * tile.size, dtype=np.int64)
    per_core = np.bincount(j % cfg.cores, weights=tile[j % tile.size], minlength=cfg.cores)
    return int(per_core.max())


def _passes(extent: int, tile: int, quantum: int) -> int:
    """Passes of the tensor unit (``quantum`` wide) over ``extent`` in tiles of ``tile``."""
    full, rest = divmod(extent, tile)
    return full * -(-tile // quantum) + -(-rest // quantum)


def _core_tiles(tiles: int, cores: int, balance: bool) -> int:
    """Output tiles of the busiest core: a round-robin share, or with ``balance`` the full
    rounds' share plus one piece of each leftover tile (:func:`output_tiles`)."""
    if balance and tiles % cores:
        return tiles // cores + tiles % cores
    return -(-tiles // cores)


def _split_sizes(extent: int, parts: int, quantum: int) -> list[int]:
    """``extent`` cut into at most ``parts`` sizes, multiples of ``quantum`` but the last,
    as equal as that allows (largest first)."""
    size = -(-extent // (parts * quantum)) * quantum
    return [min(size, extent - i) for i in range(0, extent, size)]


def _burst_bytes(cfg: NPUConfig, rows: int, row_bytes: int, contiguous: bool) -> int:
    """DRAM bytes moved for ``rows`` rows of ``row_bytes`` (whole bursts per row unless the
    rows are contiguous)."""
    if contiguous:
        return rows * row_bytes
    burst = cfg.memory(DRAM).burst
    return rows * -(-row_bytes // burst) * burst


def _copies(cfg: NPUConfig, shape: GemmShape, mu: int, nt: int, ku: int, nbuf: int
            ) -> tuple[int, int]:
    """Tiles of A and of B that L0 holds at once: ``nbuf`` slots, or for a tile that stays
    fixed on a core one copy per K step (never reloaded, so never double-buffered)."""
    nm, nn, nk = (math.ceil(shape.m_units / mu), math.ceil(shape.n / nt),
                  math.ceil(shape.k_units / ku))
    a_fixed, b_fixed = fixed_tiles(cfg, shape, nm, nn, nk, nbuf)
    return (nk if a_fixed else nbuf), (nk if b_fixed else nbuf)


def _candidates(extent: int, quantum: int) -> list[int]:
    """Tile sizes to try along one dim: the whole extent, multiples of the tensor unit's
    quantum by powers of two, and balanced splits of the extent."""
    out = {extent}
    q = max(1, quantum)
    while q < extent:
        out.add(q)
        q *= 2
    d = 2
    while d <= extent:
        out.add(math.ceil(extent / d))
        d *= 2
    return sorted(out)


def feasible_tilings(cfg: NPUConfig, shape: GemmShape, nbuf: int, hold: bool = True,
                     k_units: int | None = None) -> list[GemmTiling]:
    """Every feasible tiling of ``shape``, cheapest first by :func:`gemm_cost` (ties in
    enumeration order, so the first is :func:`plan_gemm`'s default). ``hold=False``: every
    operand tile takes ``nbuf`` slots and no leftover tile is split over the cores (a pipeline
    that does not keep a tile across steps in one copy, as :func:`emit_gemm` does: the TIR
    route's). ``k_units``: only tiles of that many K units (the same K steps as another plan:
    the same order of additions, the same bits)."""
    acc, _ = _acc_dtype(cfg, shape.dtype)
    isz, asz = itemsize(shape.dtype), itemsize(acc)
    tm, tk, tn = cfg.tensor_shape
    max_ext = cfg.encoding.max_extent
    sizes = {n: cfg.memory(n).size for n in ("input", "weight", "acc", "l1")}
    found: list[GemmTiling] = []
    for mu in _candidates(shape.m_units, math.ceil(tm / shape.m_unit)):
        mt = mu * shape.m_unit
        for ku in [k_units] if k_units else \
                _candidates(shape.k_units, math.ceil(tk / shape.k_unit)):
            kt = ku * shape.k_unit
            if max(mt, kt) > max_ext or (not shape.stage_l0 and
                                         cfg.cores * nbuf * shape.stage_bytes(mu, ku) >
                                         sizes["l1"]):
                continue
            for nt in _candidates(shape.n, tn):
                a_copies, b_copies = _copies(cfg, shape, mu, nt, ku, nbuf) if hold \
                    else (nbuf, nbuf)
                # a core's output tiles rotate through nbuf accumulator slots (emit_gemm:
                # Pipeline.out_slot): a core with one tile uses one, so a tile too large for
                # two fits (default, 1 core: ResNet-18's 3x3/s2 of stage 3, N256 whole)
                g = shape.groups
                a_tile = shape.stage_bytes(mu, ku) if shape.stage_l0 else g * mt * kt * isz
                if a_copies * a_tile > sizes["input"] or nt > max_ext or \
                        _b_count(shape) * b_copies * kt * nt * isz > sizes["weight"] or \
                        (1 if hold else nbuf) * _acc_tile_elems(cfg, shape, mu, nt) * asz > \
                        sizes["acc"]:
                    continue
                tiles = shape.batch * math.ceil(shape.m_units / mu) * math.ceil(shape.n / nt)
                leftover = tiles % cfg.cores
                for balance in (False, True) if hold and leftover else (False,):
                    if hold and min(nbuf, _core_tiles(tiles, cfg.cores, balance)) * \
                            _acc_tile_elems(cfg, shape, mu, nt) * asz > sizes["acc"]:
                        continue
                    cost = gemm_cost(cfg, shape, mu, nt, ku, nbuf, balance=balance)
                    found.append(GemmTiling(mu, nt, ku, cost, balance))
    return sorted(found, key=lambda t: t.estimate)


#: The graph knob (:func:`kiln.schedule.knobs.graph_knob`) of a product's tiling: its value is
#: a :func:`tiling_value` (``(m_units, n, k_units)``) of one of the :data:`TILING_CANDIDATES`
#: cheapest feasible tilings by the cost model (the cheapest, the default, first); the tuner
#: (:mod:`kiln.tune.npu_tuning`) measures them on the simulator.
TILING_KNOB = "npu_gemm_tiling"
#: How many of the cost model's best tilings a product's tiling knob offers.
TILING_CANDIDATES = 8


def tiling_knob_key(cfg: NPUConfig, shape: GemmShape, nbuf: int, hold: bool = True,
                    context: str = "") -> str:
    """The graph-knob key of a product's tiling: the description and the planner's whole
    problem (the GEMM's shape in units, its dtype, how A is gathered and staged, the buffers)
    and ``context``, what the product's kernel does besides the product
    (:meth:`~.emit.KernelBuilder.knob_context`: its fused epilogue), so a decision applies to
    the products it was measured for, in the kernel it was measured in, and to no other."""
    key = f"npu.gemm hw={cfg.name} nbuf={nbuf} hold={hold} {shape!r}"
    return f"{key} {context}" if context else key


def tiling_value(tiling: GemmTiling) -> tuple[Any, ...]:
    """A tiling as the knob's value: its decisions (every field but the estimate, in field
    order: ``(m_units, n, k_units, ...)``), JSON-able for the tuning database."""
    return tuple(getattr(tiling, f.name) for f in fields(tiling)
                 if f.name not in ("estimate", "knob"))


def tiling_domain(tilings: list[GemmTiling]) -> tuple[tuple[Any, ...], ...]:
    """The tiling knob's domain over ranked ``tilings``: the first :data:`TILING_CANDIDATES`
    as :func:`tiling_value`."""
    return tuple(tiling_value(t) for t in tilings[:TILING_CANDIDATES])


def plan_gemm(cfg: NPUConfig, shape: GemmShape, nbuf: int, hold: bool = True,
              k_units: int | None = None, context: str = "") -> GemmTiling:
    """The cheapest feasible tiling of ``shape`` by the cost model (ValueError when none fits
    the buffers) -- or, under :func:`kiln.schedule.knobs.graph_knobs` (tuning, or a build with
    a tuning database), the one the :data:`TILING_KNOB` of :func:`tiling_knob_key` (with
    ``context``) names. ``hold``, ``k_units``: see :func:`feasible_tilings`."""
    return plan_candidates(cfg, shape, nbuf, hold, k_units, context)[0]


def plan_candidates(cfg: NPUConfig, shape: GemmShape, nbuf: int, hold: bool = True,
                    k_units: int | None = None, context: str = "") -> list[GemmTiling]:
    """:func:`plan_gemm`'s tiling first, then the knob's other candidates in the cost model's
    order: what a lowering falls back on when a later check refuses a tiling
    (:mod:`.feedback`). Each carries its knob key (:attr:`GemmTiling.knob`). A shape whose
    input is staged from L1 (``stage_onchip``) keeps the K steps of the plan with the input in
    DRAM (the same order of additions): whether residency keeps the input on chip never
    changes a result bit."""
    explicit = k_units
    if shape.stage_onchip and k_units is None:
        dram = feasible_tilings(cfg, replace(shape, stage_onchip=False), nbuf, hold)
        k_units = dram[0].k_units if dram else None
    ranked = feasible_tilings(cfg, shape, nbuf, hold, k_units)
    if not ranked:
        raise ValueError(f"no tiling of a GEMM M{shape.m} x N{shape.n} x K{shape.k} "
                         f"({shape.dtype}, M in units of {shape.m_unit}, K in units of "
                         f"{shape.k_unit}) fits the L0 buffers of {cfg.name!r}")
    domain = tiling_domain(ranked)
    key = tiling_knob_key(cfg, shape, nbuf, hold) + (f" k_units={explicit}" if explicit else "")
    if context:
        key += f" {context}"
    choice = ranked[domain.index(graph_knob(key, TILING_KNOB, domain, domain[0]))]
    return [replace(t, knob=key) for t in
            [choice] + [t for t in ranked[:TILING_CANDIDATES] if t is not choice]]


#: ``load_a(core, batch, m0, m_units, k0, k_units, addr, slot)``: DMA the A tile (row-major,
#: ``m_units * m_unit`` rows of ``k_units * k_unit``) to L0 input at ``addr`` (``slot``: the
#: pipeline slot, for a staging buffer of its own).
LoadA = Callable[[int, int, int, int, int, int, int, int], None]
#: ``load_b(core, batch, k0, k_units, n0, n, addr)``: DMA the B tile (row-major K x N) to L0
#: weight at ``addr``.
LoadB = Callable[[int, int, int, int, int, int, int], None]
#: ``stage_a(core, batch, m0, m_units, k0, k_units, slot)``: DMA what the A tile's gathers
#: read into the core's L1 staging ``slot`` (a convolution's input rows); ``load_a`` then
#: gathers the tile from there.
StageA = Callable[[int, int, int, int, int, int, int], None]
#: ``store_c(core, batch, m0, m_units, n0, n, addr)``: DMA the C tile (row-major M x N in the
#: accumulators at ``addr``) to DRAM.
StoreC = Callable[[int, int, int, int, int, int, int], None]


@dataclass(frozen=True)
class GemmTransfers:
    """The DMAs of a product kernel whose A tile is gathered from staged rows (a convolution's
    implicit GEMM, a banded depthwise convolution) under a tiling, in :func:`emit_gemm`'s
    callback form."""

    stage_a: StageA | None  # None: A is not staged in L1 (a banded kernel's in place)
    load_a: LoadA
    load_b: LoadB
    store_c: StoreC


def tail_pieces(cfg: NPUConfig, shape: GemmShape, m_units: int, n: int
                 ) -> list[tuple[int, int, int, int]]:
    """``(m0, m_units, n0, n)`` (offsets in the tile) of the pieces the last output tile of a
    core is multiplied (at its last K step) and stored in: the store of each piece overlaps
    the product of the next, so the kernel's tail is one piece's store instead of the whole
    tile's. Up to 4 pieces, each whole rows (columns) of the tensor unit (a piece of fewer
    would cost a whole pass of it). A convolution's tile (``column_stores``: stored channel by
    channel, NCHW) that would be cut along M is cut along N instead (up to 8 pieces) where it
    is wide enough, so every piece stores whole
    channel runs of the tile's rows: pieces of M cut each run into short ones, whose whole
    bursts moved 25% more bytes in the tail (default, one core, ResNet-18's 3x3/s2 of stage
    3: 14 x 14 planes of 784 bytes stored as 4 runs of 224)."""
    tn = cfg.tensor_shape[2]
    quantum = -(-cfg.tensor_shape[0] // shape.m_unit)
    rows = _split_sizes(m_units, max(1, min(4, m_units // quantum)), quantum)
    if shape.column_stores and n >= 2 * tn and len(rows) > 1:
        cols = _split_sizes(n, min(8, n // tn), tn)
        return _halves_interleaved([(0, m_units, sum(cols[:i]), c) for i, c in enumerate(cols)])
    return _halves_interleaved([(sum(rows[:i]), r, 0, n) for i, r in enumerate(rows)])


def _halves_interleaved(pieces: list[tuple[int, int, int, int]]
                        ) -> list[tuple[int, int, int, int]]:
    """The pieces of a tile in the order the tensor unit computes them: one from its first
    half, one from its second, in turn (0, 2, 1, 3 of four). The tensor unit writes each
    piece while the vector unit and DMA-out work on the one before; in address order
    consecutive pieces share a bank group of the accumulators wherever the tile lies, in
    this order each pair straddles the tile's middle, which the bank placement puts on a
    group boundary (ResNet-18, default: 13,745 conflict cycles left -> 8,054; 715,864 ->
    715,291 cycles)."""
    half = -(-len(pieces) // 2)
    order = [i for pair in zip(range(half), range(half, 2 * half)) for i in pair]
    return [pieces[i] for i in order if i < len(pieces)]


def output_tiles(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling, nbuf: int
                 ) -> list[tuple[int, int, int, int, int]]:
    """``(batch, m0, m_units, n0, n)`` of the output tiles in the order :func:`emit_gemm`
    deals them round-robin to the cores: row-major over ``(batch, m, n)``, the tiles left over
    after the last full round each split into one piece per core (:func:`_split_axis`)."""
    mu, nt, ku = tiling.m_units, tiling.n, tiling.k_units
    nm, nn, nk = (math.ceil(shape.m_units / mu), math.ceil(shape.n / nt),
                  math.ceil(shape.k_units / ku))
    tiles = [(b, m0, min(mu, shape.m_units - m0), n0, min(nt, shape.n - n0))
             for b in range(shape.batch) for m0 in range(0, shape.m_units, mu)
             for n0 in range(0, shape.n, nt)]
    split = _split_axis(cfg, shape, mu, nt, nm, nn, nk, nbuf) if tiling.balance else ""
    if not split:
        return tiles
    rest = len(tiles) % cfg.cores
    out = tiles[:len(tiles) - rest]
    for b, m0, mus, n0, nts in tiles[len(tiles) - rest:]:
        start = m0 if split == "m" else n0
        for size in (_split_sizes(mus, cfg.cores, 1) if split == "m"
                     else _split_sizes(nts, cfg.cores, cfg.tensor_shape[2])):
            out.append((b, start, size, n0, nts) if split == "m" else (b, m0, mus, start, size))
            start += size
    return out


@dataclass(frozen=True)
class _Step:
    """One K step of a core: its output tile's index, the A and B slots, and whether it
    loads each tile (a tile the slot already holds is not loaded again)."""

    tile: int
    k0: int
    a_slot: int
    b_slot: int
    load_a: bool
    load_b: bool


def core_step_slots(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling,
                tiles: list[tuple[int, int, int, int, int]], nbuf: int) -> list[list[_Step]]:
    """Each core's steps in order (tiles round-robin, the K steps of each in turn). A tile
    fixed on the core takes one slot per K step. Any other operand tile that one of the
    core's ``nbuf`` slots already holds is read from there and not loaded again; a new one
    goes to the least recently read slot (:class:`SlotCache`), which no step still running reads.
    Step ``i`` may overwrite a slot once step ``i - nbuf`` is done (the pipeline's tokens
    order that), and the steps in between read at most ``nbuf - 1`` slots of each operand."""
    ku = tiling.k_units
    nm, nn, nk = (math.ceil(shape.m_units / tiling.m_units), math.ceil(shape.n / tiling.n),
                  math.ceil(shape.k_units / ku))
    a_fixed, b_fixed = fixed_tiles(cfg, shape, nm, nn, nk, nbuf)
    slots_a = [SlotCache(nbuf) for _ in range(cfg.cores)]
    slots_b = [SlotCache(nbuf) for _ in range(cfg.cores)]
    out: list[list[_Step]] = [[] for _ in range(cfg.cores)]
    for j, (b, m0, mus, n0, nts) in enumerate(tiles):
        core = j % cfg.cores
        for step, k0 in enumerate(range(0, shape.k_units, ku)):
            i = len(out[core])
            a_key = (0 if shape.a_shared else b, m0, mus, k0)
            b_key = (0 if shape.b_shared else b, k0, n0, nts)
            a_slot, new_a = slots_a[core].take(a_key, i, step if a_fixed else None)
            b_slot, new_b = slots_b[core].take(b_key, i, step if b_fixed else None)
            out[core].append(_Step(j, k0, a_slot, b_slot, new_a, new_b))
    return out


class SlotCache:
    """One core's ``nbuf`` L0 slots of one operand: which tile each holds, the step that
    last read it. Both lowering routes take their operand slots from it (the TIR route's
    generator, :mod:`.tir_program`, with the DRAM block as the key)."""

    def __init__(self, nbuf: int):
        self.nbuf = nbuf
        self.held: list[tuple[Any, ...] | None] = [None] * nbuf
        self.used = [-nbuf - 1] * nbuf

    def take(self, key: tuple[Any, ...], i: int, fixed: int | None) -> tuple[int, bool]:
        """The slot step ``i`` reads ``key`` from and whether it loads it there (``fixed``:
        the tile's own slot, for a tile held in one copy per K step)."""
        if fixed is not None:
            slot = fixed
        elif key in self.held:
            slot = self.held.index(key)
        else:
            slot = min(range(self.nbuf), key=lambda s: self.used[s])
            # the steps since i - nbuf read at most nbuf - 1 slots: this one is free
            assert self.used[slot] <= i - self.nbuf, (self.used, i)
        new = self.held[slot] != key
        self.held[slot], self.used[slot] = key, i
        return slot, new


def emit_gemm(kb: KernelBuilder, shape: GemmShape, tiling: GemmTiling, load_a: LoadA,
              load_b: LoadB, store_c: StoreC, stage_a: StageA | None = None,
              b_groups: Sequence[int] | None = None,
              c_groups: Sequence[int] | None = None,
              a_parts: Sequence[Sequence[tuple[int, int, int]]] | None = None,
              a_row: int = 0) -> None:
    """Emit the tiled product (see the module docstring) into ``kb``'s streams.

    ``stage_a``: A is gathered from an L1 staging slot that ``stage_a`` fills (a
    convolution). The slot is DMA-in's own (only the gathers read it), so a step stages its
    rows and waits for them before it waits for its L0 slot: while the tensor unit is
    still busy with the step before, the staging's DRAM latency is hidden. Then B, whose
    DRAM latency the gathers (on-chip) cover before the step's closing token waits for it.
    Where :func:`prefetch_staging` says so, each step from a core's second on also stages
    the next step's rows (into the other slot) before its gathers, hiding that latency
    where the DMA is the bottleneck too. ``b_groups``: each product's B in the B tile,
    in :func:`group_strides` units (default: its own, ``0 .. groups - 1``; products that
    multiply by the same B -- a banded depthwise kernel's interior column blocks -- share
    one, which ``load_b`` loads once). ``c_groups``: each product's place in the output
    tile, in elements (default: ``group_strides`` apart; with ``shape.acc_row``, a banded
    kernel's column blocks side by side in their channel's rows). ``a_parts``
    (``shape.stage_l0``: A read in place from the rows ``load_a`` stages): per product its
    ``mma`` instructions, each ``(a_offset, b_offset, k)`` -- its A at that element of the A
    tile with rows ``a_row`` elements apart (a tile's first output row; a piece's rows
    further on), its B at that element past the product's B, ``k`` deep -- accumulating
    into the product's output."""
    cfg = kb.config
    acc, _ = _acc_dtype(cfg, shape.dtype)
    isz, asz = itemsize(shape.dtype), itemsize(acc)
    ku = tiling.k_units
    in_bytes, w_bytes, c_bytes = tile_bytes(cfg, shape, tiling)
    ga, gb, gc = group_strides(cfg, shape, tiling)
    bg = list(b_groups) if b_groups is not None else list(range(shape.groups))
    cg = list(c_groups) if c_groups is not None else [g * gc for g in range(shape.groups)]
    # with one K step per tile, a tile's store has one step to finish before its
    # accumulator slot takes the tile after next: a third slot, where it fits, gives it two
    # (edge, attention's P @ V in tiles of M32 x N32: the tensor unit waited on every other
    # store: 75214 -> 69191 cycles; M32 x N64: 65038 -> 63989)
    nout = kernel_acc_slots(kb, shape, tiling)
    tiles = output_tiles(cfg, shape, tiling, kb.nbuf)
    # a fused epilogue's buffers go above the output slots a core uses (one with fewer
    # tiles than slots uses as many: a single tile too large for two leaves room), or above
    # the operand slots (a held tile's slot is its K step's, nk <= nbuf: fixed_tiles)
    kb.acc_top = used_acc_slots(nout, len(tiles), cfg.cores) * c_bytes
    kb.acc_tile = c_bytes
    kb.l0_slots = {"input": (kb.nbuf, in_bytes), "weight": (kb.nbuf, w_bytes)}
    pipes = [Pipeline(kb, c, UNIT_TENSOR, nout) for c in range(cfg.cores)]
    steps = core_step_slots(cfg, shape, tiling, tiles, kb.nbuf)
    pos = [0] * cfg.cores  # each core's next step
    prefetched = [False] * cfg.cores  # the core's next A tile is staged already
    # (one slot: the next rows would overwrite the rows this step gathers from)
    prefetch = stage_a is not None and kb.nbuf > 1 and \
        prefetch_staging(cfg, shape, tiling, kb.nbuf)
    kb.store_floor = store_floor(cfg, shape, tiling, kb.nbuf)
    last = {j % cfg.cores: j for j in range(len(tiles))}  # each core's last tile
    # a convolution's store of a core's output tile is emitted after the core's next step's
    # loads: a fused epilogue's operand loads (a residual's chunks) go into DMA-in's
    # in-order queue with the store, each waiting for the vector unit to free its slot --
    # ahead of the next step's gathers they held them back, and the tensor unit waited.
    # DMA-out's and the vector unit's streams keep their order (without an epilogue the
    # program is the same). Only where both routes emit through here (the TIR route's
    # generator of dense products walks its own loops): the staged convolutions; and only
    # with double buffering: with one slot the next step's loads wait for this step's
    # product, and the tile's store (which the next tile's product waits for: one
    # accumulator slot) behind them came later (default, ResNet-18's stage-1 3x3 with a
    # residual, one slot: 53619 -> 88101 cycles).
    pending: list[Callable[[], None] | None] = [None] * cfg.cores
    # (a banded kernel reading A in place, a_parts, likewise: its staging is its load_a,
    # and its epilogue's operand loads belong behind the next step's loads as a staged
    # convolution's do; not measured apart -- the pathology it was tried on, edge's
    # 192 x 14 x 14 layer at 161539 cycles, was the accumulators: ops.BANDED_ACC_SHARE)
    residual = residual_weights_product(kb, shape)
    defer = (stage_a is not None or a_parts is not None or (DEFER_STORES and residual)) and \
        kb.nbuf > 1
    for j, (b, m0, mus, n0, nts) in enumerate(tiles):
        core = j % cfg.cores
        p = pipes[core]
        c_row, c_col = acc_strides(cfg, shape, tiling, nts)
        # the last tile's last product runs in pieces, each stored as soon as it is done
        pieces = tail_pieces(cfg, shape, mus, nts) if last[core] == j else \
            [(0, mus, 0, nts)]
        c_addr = 0
        for step, k0 in enumerate(range(0, shape.k_units, ku)):
            kus = min(ku, shape.k_units - k0)
            kts = kus * shape.k_unit
            st = steps[core][pos[core]]
            pos[core] += 1
            if stage_a is not None and st.load_a and not prefetched[core]:
                # the L1 slot is DMA-in's own: stage before waiting for the tensor unit
                stage_a(core, b, m0, mus, k0, kus, st.a_slot)
                kb.fence(core, UNIT_DMA_IN)  # the gathers read what the staging writes
            p.load_slot()
            a_addr, b_addr = st.a_slot * in_bytes, st.b_slot * w_bytes
            # B before the gathers, which cover its DRAM latency (with one slot the step's
            # loads wait for the tensor unit anyway: the gathers first, as they are ready)
            b_first = stage_a is not None and kb.nbuf > 1
            # an odd core's first step loads B first (STAGGER_FIRST_LOADS)
            b_first = b_first or (STAGGER_FIRST_LOADS and residual and kb.nbuf > 1 and
                                  core % 2 == 1 and pos[core] == 1)
            if b_first and st.load_b:
                load_b(core, b, k0, kus, n0, nts, b_addr)
            if stage_a is not None:
                # from a core's second step on, stage the next step's rows before this
                # step's gathers, which then cover the staging's DRAM latency too
                nxt = steps[core][pos[core]] if pos[core] < len(steps[core]) else None
                prefetched[core] = prefetch and pos[core] > 1 and nxt is not None and \
                    nxt.load_a
                if prefetched[core] and nxt is not None:
                    nb_, nm0, nmus, _, _ = tiles[nxt.tile]
                    stage_a(core, nb_, nm0, nmus, nxt.k0, min(ku, shape.k_units - nxt.k0),
                            nxt.a_slot)
            if st.load_a:
                load_a(core, b, m0, mus, k0, kus, a_addr, st.a_slot)
            if not b_first and st.load_b:
                load_b(core, b, k0, kus, n0, nts, b_addr)
            p.loaded()
            if pending[core] is not None:
                pending[core]()
                pending[core] = None
            p.compute_begin()
            if step == 0:
                c_addr = p.out_slot() * c_bytes
            parts = pieces if k0 + ku >= shape.k_units else [(0, mus, 0, nts)]
            for i, (r0, pu, c0, pn) in enumerate(parts):
                # the piece in the acc tile
                at = (r0 * shape.m_unit * c_row + c0 * c_col) * asz
                if a_parts is not None:  # A in place: each product's mma instructions
                    _emit_parts(kb, core, shape, a_parts, step, pu, pn,
                                c_addr + at, cg, c_row, c_col,
                                a_addr + r0 * shape.m_unit * a_row * isz, a_row,
                                b_addr, bg, gb, c0, nts)
                for g in range(shape.groups if a_parts is None else 0):
                    # one product per group, its own operands
                    kb.emit(core, "mma.set" if step == 0 else "mma",
                            shape=(1, pu * shape.m_unit, pn, kts),
                            c=block("acc", c_addr + at + cg[g] * asz, acc, (0, c_row, c_col)),
                            a=block("input", a_addr + (g * ga + r0 * shape.m_unit * kts) * isz,
                                    shape.dtype, (0, kts, 1)),
                            b=block("weight", b_addr + (bg[g] * gb + c0) * isz, shape.dtype,
                                    (nts, 1, 0)))
                if i < len(parts) - 1:  # an early piece: its own token to DMA-out
                    kb.tile_done(core)
                    kb.pop(core, UNIT_TENSOR, UNIT_DMA_OUT)
                    store_c(core, b, m0 + r0, pu, n0 + c0, pn, c_addr + at)
            p.computed()
        p.produced()
        r0, pu, c0, pn = pieces[-1]

        def store(p: Pipeline = p, core: int = core, b: int = b, row: int = m0 + r0,
                  pu: int = pu, col: int = n0 + c0, pn: int = pn,
                  at: int = c_addr + (r0 * shape.m_unit * c_row + c0 * c_col) * asz) -> None:
            p.store_begin()
            store_c(core, b, row, pu, col, pn, at)
            p.stored()
        if defer:  # emitted after the core's next step's loads: see pending
            pending[core] = store
        else:
            store()
    for left in pending:
        if left is not None:
            left()
    for p in pipes:
        p.finish()
    kb.store_floor = 0


def _emit_parts(kb: KernelBuilder, core: int, shape: GemmShape,
                a_parts: Sequence[Sequence[tuple[int, int, int]]], step: int, rows: int,
                cols: int, c_addr: int, cg: Sequence[int], c_row: int, c_col: int,
                a_addr: int, a_row: int, b_addr: int, bg: Sequence[int], gb: int, c0: int,
                nts: int) -> None:
    """:func:`emit_gemm`'s products with A in place (``a_parts``): the ``q``-th
    instruction of every product, then the ``(q + 1)``-th -- each product's instructions
    accumulate into one output, and the tensor unit pipelines its instructions, so one that
    adds to what the one before wrote would read it before it lands (the simulator's
    hazard); the other products' instructions in between cover the unit's latency, or
    where they are too few to, a fence does."""
    cfg = kb.config
    acc, cpt = _acc_dtype(cfg, shape.dtype)
    isz, asz = itemsize(shape.dtype), itemsize(acc)
    m = rows * shape.m_unit
    for q in range(len(a_parts[0])):
        if q:
            between = sum(_tile_cycles(cfg, m, cols, parts[q - 1][2], cpt)
                          for parts in a_parts[1:])
            if between < cfg.tensor_latency:
                kb.fence(core, UNIT_TENSOR)
        for g, parts in enumerate(a_parts):
            ao, bo, kq = parts[q]
            kb.emit(core, "mma.set" if step == 0 and q == 0 else "mma",
                    shape=(1, m, cols, kq),
                    c=block("acc", c_addr + cg[g] * asz, acc, (0, c_row, c_col)),
                    a=block("input", a_addr + ao * isz, shape.dtype, (0, a_row, 1)),
                    b=block("weight", b_addr + (bg[g] * gb + bo + c0) * isz, shape.dtype,
                            (nts, 1, 0)))


def held_tiles(cfg: NPUConfig, shape: GemmShape, tiling: GemmTiling, nbuf: int
               ) -> tuple[bool, bool]:
    """Whether each core keeps its A tiles, and its B tiles, for the whole kernel under
    ``tiling`` (one copy per K step, loaded once: :func:`emit_gemm`'s held tiles; the TIR
    route's schedule marks such a copy for its generator)."""
    nm, nn, nk = (math.ceil(shape.m_units / tiling.m_units), math.ceil(shape.n / tiling.n),
                  math.ceil(shape.k_units / tiling.k_units))
    return fixed_tiles(cfg, shape, nm, nn, nk, nbuf)
