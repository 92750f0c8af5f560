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
previous output tile; output tiles are spread round-robin over the cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ...npu.isa import UNIT_TENSOR
from ...target.npu.config import DRAM, NPUConfig
from .emit import KernelBuilder, Pipeline, block, itemsize

__all__ = ["GemmShape", "GemmTiling", "emit_gemm", "gemm_cost", "gemm_roofline", "plan_gemm"]


@dataclass(frozen=True)
class GemmShape:
    """``batch`` GEMMs of ``M = m_units * m_unit`` rows, ``N`` columns and
    ``K = k_units * k_unit`` in ``dtype`` (the tensor unit's operand type);
    ``a_dmas``: DMAs that gather one A tile (1, or ``KH * KW`` for a convolution);
    ``b_shared``: B is the same for every batch entry (weights: loaded once per tile, counted
    once by the roofline; ``a_shared`` likewise for A); ``a_elems``: elements of A's source
    per batch entry (a conv's image: what the roofline counts; 0: M x K).

    A convolution stages its input rows in L1 (one contiguous DMA per step) and gathers the
    taps from there: ``stage_stride`` (rows of input per M unit; 0: no staging),
    ``stage_halo`` (extra rows of the window), ``stage_row`` (elements per input row and
    K unit) and ``stage_pad`` size the L1 slot."""

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

    def stage_bytes(self, mu: int, ku: int) -> int:
        """Bytes of one L1 staging slot for tiles of ``mu`` M units and ``ku`` K units (each
        K unit's rows, plus ``stage_pad`` bytes that keep its start off the previous one's
        banks)."""
        if not self.stage_stride:
            return 0
        rows = (mu - 1) * self.stage_stride + self.stage_halo
        return ku * (rows * self.stage_row * itemsize(self.dtype) + self.stage_pad)

    @property
    def m(self) -> int:
        return self.m_units * self.m_unit

    @property
    def k(self) -> int:
        return self.k_units * self.k_unit


@dataclass(frozen=True)
class GemmTiling:
    """Units of M and K and columns of N per tile, and the cost model's estimate (cycles)."""

    m_units: int
    n: int
    k_units: int
    estimate: float

    def describe(self, shape: GemmShape) -> str:
        return (f"tile M{self.m_units * shape.m_unit} x N{self.n} x K{self.k_units * shape.k_unit}"
                f" of M{shape.m} x N{shape.n} x K{shape.k} (batch {shape.batch}), "
                f"est. {self.estimate:.0f} cycles")


def _acc_dtype(cfg: NPUConfig, dtype: str) -> tuple[str, int]:
    td = cfg.tensor_dtype(dtype, dtype)
    if td is None:
        raise ValueError(f"the tensor unit of {cfg.name!r} does not multiply {dtype}")
    return str(td.acc), td.cycles_per_tile


def _tile_cycles(cfg: NPUConfig, m: int, n: int, k: int, cpt: int) -> int:
    tm, tk, tn = cfg.tensor_shape
    return math.ceil(m / tm) * math.ceil(n / tn) * math.ceil(k / tk) * cpt


def gemm_roofline(cfg: NPUConfig, shape: GemmShape) -> float:
    """The layer's bound: max of the tensor-unit cycles (all cores busy, no partial tiles
    beyond the shape's own) and the DRAM cycles of its minimum traffic (A and B read once, C
    written once)."""
    acc, cpt = _acc_dtype(cfg, shape.dtype)
    isz = itemsize(shape.dtype)
    tensor = shape.batch * _tile_cycles(cfg, shape.m, shape.n, shape.k, cpt) / cfg.cores
    b_bytes = shape.k * shape.n * isz * (1 if shape.b_shared else shape.batch)
    a_elems = shape.a_elems or shape.m * shape.k
    a_bytes = a_elems * isz * (1 if shape.a_shared else shape.batch)
    traffic = a_bytes + shape.batch * shape.m * shape.n * itemsize(acc) + b_bytes
    return max(tensor, traffic / cfg.memory(DRAM).bandwidth)


def _gather_conflicts(cfg: NPUConfig, isz: int) -> int:
    """Slowdown of a tap gather reading one element per L1 channel plane (planes an odd
    number of bank lines apart: the lanes of a cycle spread evenly over the banks)."""
    l1 = cfg.memory("l1")
    lanes = max(1, cfg.dma_onchip_bandwidth // isz)
    return max(1, math.ceil(math.ceil(lanes / l1.banks) / l1.ports))


def gemm_cost(cfg: NPUConfig, shape: GemmShape, mu: int, nt: int, ku: int, nbuf: int) -> float:
    """Estimated cycles of a tiling: the busier of the tensor unit and the DMA (DRAM bytes at
    the chip's bandwidth, per-transfer issue overhead), plus the pipeline's fill; without
    double buffering the two add up instead."""
    acc, cpt = _acc_dtype(cfg, shape.dtype)
    isz = itemsize(shape.dtype)
    mt, kt = mu * shape.m_unit, ku * shape.k_unit
    nm, nn, nk = (math.ceil(shape.m_units / mu), math.ceil(shape.n / nt),
                  math.ceil(shape.k_units / ku))
    steps = shape.batch * nm * nn * nk
    core_steps = math.ceil(shape.batch * nm * nn / cfg.cores) * nk  # the busiest core's
    tensor = core_steps * _tile_cycles(cfg, mt, nt, kt, cpt)
    dram = cfg.memory(DRAM)
    a_bytes = shape.stage_bytes(mu, ku) or mt * kt * isz
    # a tile that stays the same on every step of a core is loaded once per slot
    a_loads, b_loads = (min(core_steps, nbuf) if fixed else core_steps
                        for fixed in _fixed_tiles(cfg, shape, nm, nn, nk))
    scale = steps / core_steps  # the cores' loads over the busiest one's
    traffic = scale * (a_loads * a_bytes + b_loads * kt * nt * isz) + \
        shape.batch * shape.m * shape.n * itemsize(acc)
    a_dmas = shape.a_dmas + (1 if shape.stage_stride else 0)
    issue = (a_loads * a_dmas + b_loads + core_steps / nk) * cfg.dma_latency
    onchip = a_loads * mt * kt * isz / cfg.dma_onchip_bandwidth * _gather_conflicts(cfg, isz) \
        if shape.stage_stride else 0.0
    dma = max(traffic / dram.bandwidth + onchip, issue)
    fill = dram.latency + cfg.tensor_latency + core_steps * cfg.tensor_latency
    if nbuf >= 2:
        return max(tensor, dma) + fill
    return tensor + dma + fill + core_steps * dram.latency


def _fixed_tiles(cfg: NPUConfig, shape: GemmShape, nm: int, nn: int, nk: int
                 ) -> tuple[bool, bool]:
    """Whether every step of a core multiplies the same A tile, and the same B tile
    (:func:`emit_gemm` deals the output tiles ``(batch, m, n)`` round-robin to the cores and
    skips the load of a tile its slot already holds)."""
    if nk != 1:
        return False, False
    cores = cfg.cores
    one_n = nn == 1 or nn == cores  # tile j's n index is j mod nn; its core j mod cores
    one_m = nm == 1 or (nn == 1 and nm == cores)
    a_fixed = one_m and (shape.a_shared or shape.batch == 1)
    b_fixed = one_n and (shape.b_shared or shape.batch == 1)
    return a_fixed, b_fixed


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


def plan_gemm(cfg: NPUConfig, shape: GemmShape, nbuf: int) -> GemmTiling:
    """The cheapest feasible tiling of ``shape`` (ValueError when none fits the buffers)."""
    acc, _ = _acc_dtype(cfg, shape.dtype)
    isz, asz = itemsize(shape.dtype), itemsize(acc)
    tm, tk, tn = cfg.tensor_shape
    max_ext = cfg.encoding.max_extent
    sizes = {n: cfg.memory(n).size for n in ("input", "weight", "acc", "l1")}
    best: GemmTiling | None = None
    for mu in _candidates(shape.m_units, math.ceil(tm / shape.m_unit)):
        mt = mu * shape.m_unit
        for ku in _candidates(shape.k_units, math.ceil(tk / shape.k_unit)):
            kt = ku * shape.k_unit
            if nbuf * mt * kt * isz > sizes["input"] or max(mt, kt) > max_ext or \
                    cfg.cores * nbuf * shape.stage_bytes(mu, ku) > sizes["l1"]:
                continue
            for nt in _candidates(shape.n, tn):
                if nbuf * kt * nt * isz > sizes["weight"] or nbuf * mt * nt * asz > sizes["acc"] \
                        or nt > max_ext:
                    continue
                cost = gemm_cost(cfg, shape, mu, nt, ku, nbuf)
                if best is None or cost < best.estimate:
                    best = GemmTiling(mu, nt, ku, cost)
    if best is None:
        raise ValueError(f"no tiling of a GEMM M{shape.m} x N{shape.n} x K{shape.k} "
                         f"({shape.dtype}, M in units of {shape.m_unit}, K in units of "
                         f"{shape.k_unit}) fits the L0 buffers of {cfg.name!r}")
    return best


#: ``load_a(core, batch, m0, m_units, k0, k_units, addr, slot)``: DMA the A tile (row-major,
#: ``m_units * m_unit`` rows of ``k_units * k_unit``) to L0 input at ``addr`` (``slot``: the
#: pipeline slot, for a staging buffer of its own).
LoadA = Callable[[int, int, int, int, int, int, int, int], None]
#: ``load_b(core, batch, k0, k_units, n0, n, addr)``: DMA the B tile (row-major K x N) to L0
#: weight at ``addr``.
LoadB = Callable[[int, int, int, int, int, int, int], None]
#: ``store_c(core, batch, m0, m_units, n0, n, addr)``: DMA the C tile (row-major M x N in the
#: accumulators at ``addr``) to DRAM.
StoreC = Callable[[int, int, int, int, int, int, int], None]


def emit_gemm(kb: KernelBuilder, shape: GemmShape, tiling: GemmTiling, load_a: LoadA,
              load_b: LoadB, store_c: StoreC) -> None:
    """Emit the tiled product (see the module docstring) into ``kb``'s streams."""
    cfg = kb.config
    acc, _ = _acc_dtype(cfg, shape.dtype)
    isz, asz = itemsize(shape.dtype), itemsize(acc)
    mu, nt, ku = tiling.m_units, tiling.n, tiling.k_units
    in_bytes = mu * shape.m_unit * ku * shape.k_unit * isz
    w_bytes = ku * shape.k_unit * nt * isz
    c_bytes = mu * shape.m_unit * nt * asz
    pipes = [Pipeline(kb, c, UNIT_TENSOR) for c in range(cfg.cores)]
    # what each core's slots hold: a tile already in the step's slot is not loaded again
    held_a: list[list[tuple[int, ...] | None]] = [[None] * kb.nbuf for _ in pipes]
    held_b: list[list[tuple[int, ...] | None]] = [[None] * kb.nbuf for _ in pipes]
    tiles = [(b, m0, n0) for b in range(shape.batch) for m0 in range(0, shape.m_units, mu)
             for n0 in range(0, shape.n, nt)]
    for j, (b, m0, n0) in enumerate(tiles):
        core = j % cfg.cores
        p = pipes[core]
        mus, nts = min(mu, shape.m_units - m0), min(nt, shape.n - n0)
        mts = mus * shape.m_unit
        c_addr = 0
        for step, k0 in enumerate(range(0, shape.k_units, ku)):
            kus = min(ku, shape.k_units - k0)
            kts = kus * shape.k_unit
            slot = p.load_slot()
            a_addr, b_addr = slot * in_bytes, slot * w_bytes
            a_key = (0 if shape.a_shared else b, m0, k0)
            b_key = (0 if shape.b_shared else b, k0, n0, nts)
            if held_a[core][slot] != a_key:
                load_a(core, b, m0, mus, k0, kus, a_addr, slot)
                held_a[core][slot] = a_key
            if held_b[core][slot] != b_key:
                load_b(core, b, k0, kus, n0, nts, b_addr)
                held_b[core][slot] = b_key
            p.loaded()
            p.compute_begin()
            if step == 0:
                c_addr = p.out_slot() * c_bytes
            kb.emit(core, "mma.set" if step == 0 else "mma", shape=(1, mts, nts, kts),
                    c=block("acc", c_addr, acc, (0, nts, 1)),
                    a=block("input", a_addr, shape.dtype, (0, kts, 1)),
                    b=block("weight", b_addr, shape.dtype, (nts, 1, 0)))
            p.computed()
        p.produced()
        p.store_begin()
        store_c(core, b, m0, mus, n0, nts, c_addr)
        p.stored()
    for p in pipes:
        p.finish()
