"""Data movement on the NPU: transpose, strided_slice and concat as DMAs through L0.

Each is a copy kernel (:func:`copy_kernel`) whose source or destination is a
:class:`~.emit.DramView`: a transpose reads its operand with permuted strides, a slice with
its start as an offset and its steps as strides, and each input of a concatenation is written
to its place in the result (one kernel per input). No unit computes: per block, the DMA-in
engine loads the source into a slot of an L0 buffer and the DMA-out engine stores the slot to
the destination, ``nbuf`` slots so that the next block's load runs under this block's store
(tokens between the two DMA queues; the vector unit is not involved).

Adjacent dims that stay contiguous on both sides are merged first. A copy that keeps the
innermost axis moves whole rows both ways. A transpose that moves it (BERT's ``K^T``: rows of
the source become columns of the result) is *tiled*: the load reads source rows -- long DRAM
bursts, or L1 lines across the banks -- and scatters them into the slot as columns of a tile
whose row pitch is padded so that the scattered elements fall on distinct banks of the L0
buffer (the simulator's :func:`~kiln.npu.simulator.stream_cycles`, from the description's
banks and ports, picks the buffer and the pitch); the store then reads the tile's rows and
writes rows of the result. Reading the source column by column instead costs a DRAM burst
per element, or, resident in L1 with a row pitch of a power of two, every element of a DMA
beat on one bank (BERT's K transpose: 25,843 cycles against a 1,536 bound).

The blocks are chosen by a cost model written from the description (:func:`copy_cost`):
per block each engine's issue overhead, its data at the on-chip bandwidth slowed by bank
conflicts (or the DRAM side's whole bursts over the channel the cores share) and the wait for
the data to land; the loads pipelined under the stores; candidates are refused by
:func:`~.feedback.lower_with_feedback`'s checks like every other kernel's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...npu.isa import UNIT_DMA_IN, UNIT_DMA_OUT
from ...npu.simulator import stream_cycles
from ...target.npu.config import DRAM, L0_NAMES, NPUConfig
from .emit import DramTensor, DramView, KernelInfo, block, itemsize
from .feedback import lower_with_feedback
from .lowering import LoweringContext, NotSupported, register_lowering
from .nest_analysis import COPY_TILING

__all__ = ["CopyPlan", "copy_cost", "copy_kernel", "plan_copy_candidates"]

#: How many block sizes :func:`plan_copy_candidates` tries (the slot's bytes halved each time
#: from the most that ``nbuf`` slots leave).
_SIZES = 12
#: How many plans it offers (the cheapest, then the next: what the feedback falls back on).
COPY_CANDIDATES = 4


@dataclass(frozen=True)
class CopyPlan:
    """The blocks of a copy kernel: ``dims`` the copy's dims (merged, extent-1 dims dropped,
    padded to three; a transpose's source-contiguous dim next to last and the result's
    contiguous dim last), ``dst_strides`` / ``src_strides`` each side's element strides over
    them, ``tile`` the block over the last three; ``transposed``: the load scatters source rows
    into columns of the slot; ``mem`` the L0 buffer of the slots, ``pitch`` the slot's row
    pitch in elements (at least ``tile[2]``), ``slot_stride`` the bytes from one slot to the
    next, ``estimate`` :func:`copy_cost`'s cycles."""

    dims: tuple[int, ...]
    dst_strides: tuple[int, ...]
    src_strides: tuple[int, ...]
    tile: tuple[int, int, int]
    transposed: bool
    mem: str
    pitch: int
    slot_stride: int
    estimate: float

    @property
    def blocks(self) -> int:
        return math.prod(self.dims[:-3]) * math.prod(
            -(-d // t) for d, t in zip(self.dims[-3:], self.tile))

    def slot_bytes(self, dtype: str) -> int:
        t0, t1, _ = self.tile
        return t0 * t1 * self.pitch * itemsize(dtype)

    def describe(self) -> str:
        how = f"transposed into L0 {self.mem} (pitch {self.pitch})" if self.transposed \
            else f"through L0 {self.mem}"
        return (f"{COPY_TILING}: block {self.tile} of {self.dims}, {how}; "
                f"est {self.estimate:.0f} cycles")


def copy_dims(shape: tuple[int, ...], dst_strides: tuple[int, ...],
              src_strides: tuple[int, ...]) -> tuple[list[int], list[int], list[int], bool]:
    """``(dims, dst strides, src strides, transposed)`` of a copy: extent-1 dims dropped,
    adjacent dims merged where both sides stay contiguous across them, and -- when the
    source's unit-stride dim is not the result's innermost one -- the dims reordered so that
    it comes next to last and the result's innermost last (``transposed``); padded to three
    dims in front."""
    dims: list[tuple[int, int, int]] = []
    for e, d, s in zip(shape, dst_strides, src_strides):
        if e == 1:
            continue
        if dims and dims[-1][1] == d * e and dims[-1][2] == s * e:
            dims[-1] = (dims[-1][0] * e, d, s)
        else:
            dims.append((e, d, s))
    transposed = False
    if dims:
        a = min(range(len(dims)), key=lambda i: (abs(dims[i][1]), -i))
        b = next((i for i in range(len(dims) - 1, -1, -1) if dims[i][2] == 1), None)
        if b is not None and b != a and abs(dims[a][1]) == 1:
            transposed = True
            dims = [x for i, x in enumerate(dims) if i not in (a, b)] + [dims[b], dims[a]]
    while len(dims) < 3:
        dims.insert(0, (1, 0, 0))
    return [e for e, _, _ in dims], [d for _, d, _ in dims], [s for _, _, s in dims], transposed


def _pitch(cfg: NPUConfig, isz: int, tile: tuple[int, int, int], nbuf: int
           ) -> tuple[str, int, float]:
    """``(L0 buffer, row pitch, cycles)`` for a transposed block: the load writes the slot
    with stride ``pitch`` (one source row becomes a column); the buffer and pitch (from
    ``tile[2]`` up to a full turn of the banks further) whose scattered writes the DMA streams
    fastest (:func:`~kiln.npu.simulator.stream_cycles`: the banks, their width and ports) and
    whose ``nbuf`` slots fit, the narrower pitch on a tie."""
    n = math.prod(tile)
    best: tuple[float, int, int, str] | None = None
    for order, mem in enumerate(L0_NAMES[::-1]):  # acc first on a tie: no operand lives there
        spec = cfg.memory(mem)
        turn = max(1, spec.banks * spec.bank_width // isz)
        fastest = stream_cycles(n, isz, 1, cfg.dma_onchip_bandwidth, spec)
        for p in range(tile[2], tile[2] + turn + 1):
            if nbuf * tile[0] * tile[1] * p * isz > spec.size:
                break
            c = stream_cycles(n, isz, p, cfg.dma_onchip_bandwidth, spec)
            key = (c, p, order, mem)
            if best is None or key < best:
                best = key
            if c <= fastest:  # as fast as a contiguous row: no wider pitch does better
                break
    if best is None:
        raise NotSupported(f"{nbuf} slots of block {tile} do not fit any L0 buffer")
    return best[3], best[1], best[0]


def _side_cycles(cfg: NPUConfig, shape: tuple[int, ...], strides: tuple[int, ...], isz: int,
                 onchip: bool) -> tuple[float, float]:
    """``(engine cycles, channel cycles)`` of one DMA side of a block: in L1, its elements at
    the on-chip bandwidth slowed by bank conflicts; in DRAM, its contiguous runs in whole
    bursts over the chip's bandwidth (also the channel's share)."""
    n = math.prod(shape)
    inner = next((s for e, s in zip(reversed(shape), reversed(strides)) if e > 1), 1)
    if onchip:
        return stream_cycles(n, isz, inner, cfg.dma_onchip_bandwidth, cfg.memory("l1")), 0.0
    dims = [(e, s) for e, s in zip(shape, strides) if e > 1]
    run = 1
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    runs = math.prod(e for e, _ in dims)
    dram = cfg.memory(DRAM)
    moved = runs * -(-run * isz // dram.burst) * dram.burst
    return moved / dram.bandwidth, moved / dram.bandwidth


def copy_cost(cfg: NPUConfig, nbuf: int, plan: CopyPlan, isz: int, src_onchip: bool,
              dst_onchip: bool) -> float:
    """Estimated cycles of a copy kernel of ``plan``'s blocks, from the description: per
    block, the load (issue, the slower of its source side and its scattered or plain writes
    into the slot, the wait for the data to land before the store may start) and the store
    (issue, the slower of the slot's rows and its destination side, the wait before the slot
    is loaded again); a core's loads pipelined under its stores over ``nbuf`` slots, so the
    busier engine's blocks plus one step of the other, at least the DRAM channel's cycles
    for every block of every core. A side in L1 (``*_onchip``: a tensor that on-chip
    residency may keep there) at the engine's on-chip bandwidth, one in DRAM in whole
    bursts."""
    t = plan.tile
    n = math.prod(t)
    spec = cfg.memory(plan.mem)
    bw = cfg.dma_onchip_bandwidth
    ld_shape = (t[0], t[2], t[1]) if plan.transposed else t
    s = plan.src_strides[-3:]
    ld_strides = (s[0], s[2], s[1]) if plan.transposed else tuple(s)
    src_eng, src_ch = _side_cycles(cfg, ld_shape, ld_strides, isz, src_onchip)
    dst_eng, dst_ch = _side_cycles(cfg, t, tuple(plan.dst_strides[-3:]), isz, dst_onchip)
    slot_in = stream_cycles(n, isz, plan.pitch if plan.transposed else 1, bw, spec)
    slot_out = stream_cycles(n, isz, 1, bw, spec)
    lat = {True: cfg.memory("l1").latency, False: cfg.memory(DRAM).latency}
    load = cfg.dma_latency + max(src_eng, slot_in) + max(lat[src_onchip], spec.latency)
    store = cfg.dma_latency + max(dst_eng, slot_out) + max(lat[dst_onchip], spec.latency)
    per_core = -(-plan.blocks // cfg.cores)
    channel = plan.blocks * (src_ch + dst_ch)  # every core's blocks share the channel
    if nbuf < 2:
        return max(per_core * (load + store), channel)
    return max(per_core * load + store, load + per_core * store, channel)


def plan_copy_candidates(cfg: NPUConfig, nbuf: int, dst: DramTensor | DramView,
                         src: DramTensor | DramView) -> list[CopyPlan]:
    """Up to :data:`COPY_CANDIDATES` plans of the copy ``dst = src``, cheapest first by
    :func:`copy_cost`: blocks of every size from the largest whose ``nbuf`` slots fit an L0
    buffer down by halves (the innermost dim whole first, then the next), each balanced
    (equal blocks, no short tail), a transposed block's buffer and pitch by :func:`_pitch`;
    slots a bank group apart where they fit so (the two engines then work on different
    groups). Raises NotSupported (not one element fits)."""
    isz = itemsize(src.dtype)
    dims, dstr, sstr, transposed = copy_dims(tuple(dst.shape), tuple(dst.strides),
                                             tuple(src.strides))
    d0, d1, d2 = dims[-3:]
    max_ext = cfg.encoding.max_extent
    largest = max(cfg.memory(m).size for m in L0_NAMES) // (nbuf * isz)
    l1 = cfg.memory("l1").size
    nbytes = math.prod(dims) * isz
    onchip = (src.tensor if isinstance(src, DramView) else src, dst.tensor
              if isinstance(dst, DramView) else dst)
    src_onchip, dst_onchip = (math.prod(t.shape) * isz <= l1 for t in onchip)
    plans: dict[tuple[int, int, int], CopyPlan] = {}
    for k in range(_SIZES):
        cap = largest >> k
        if cap < 1:
            break
        t2 = min(d2, cap, max_ext)
        t1 = min(d1, cap // t2, max_ext) if t2 == d2 else 1
        t0 = min(d0, cap // (t2 * t1), max_ext) if t1 == d1 and t2 == d2 else 1
        tile = tuple(-(-d // -(-d // t)) for d, t in zip((d0, d1, d2), (t0, t1, t2)))
        if tile in plans:
            continue
        if transposed:
            try:
                mem, pitch, _ = _pitch(cfg, isz, tile, nbuf)  # type: ignore[arg-type]
            except NotSupported:
                continue
        else:
            slot = math.prod(tile) * isz
            fits = [m for m in L0_NAMES[::-1] if nbuf * slot <= cfg.memory(m).size]
            if not fits:
                continue
            mem, pitch = fits[0], tile[2]
        spec = cfg.memory(mem)
        slot = tile[0] * tile[1] * pitch * isz
        aligned = -(-slot // 64) * 64
        group = spec.size // max(1, spec.bank_groups)
        stride = group if aligned <= group and nbuf * group <= spec.size else aligned
        if nbuf * stride > spec.size:
            continue
        plan = CopyPlan(tuple(dims), tuple(dstr), tuple(sstr), tile,  # type: ignore[arg-type]
                        transposed, mem, pitch, stride, 0.0)
        est = copy_cost(cfg, nbuf, plan, isz, src_onchip, dst_onchip)
        plans[tile] = CopyPlan(plan.dims, plan.dst_strides, plan.src_strides, plan.tile,
                               transposed, mem, pitch, stride, est)  # type: ignore[arg-type]
    if not plans:
        raise NotSupported(f"not one element of a {nbytes}-byte copy fits the L0 buffers")
    ranked = sorted(plans.values(), key=lambda p: (p.estimate, -math.prod(p.tile)))
    return ranked[:COPY_CANDIDATES]


def copy_kernel(ctx: LoweringContext, op: str, dst: DramTensor | DramView,
                src: DramTensor | DramView) -> None:
    """``dst = src`` element by element (both of one shape and dtype), by DMAs through L0
    (see the module docstring)."""
    if not ctx.config.supports_vector_dtype(src.dtype):
        raise NotSupported(f"{op}: the vector unit does not move {src.dtype}")
    limit = ctx.config.encoding.max_stride
    for t in (dst, src):
        if any(abs(s) > limit for s in t.strides):
            raise NotSupported(f"{op}: a stride of {t.strides} exceeds the encoding's "
                               f"{limit}")
    plans = plan_copy_candidates(ctx.config, ctx.kb.nbuf, dst, src)
    lower_with_feedback(ctx, op, plans, lambda plan: _emit_copy(ctx, op, dst, src, plan),
                        CopyPlan.describe)


def _emit_copy(ctx: LoweringContext, op: str, dst: DramTensor | DramView,
               src: DramTensor | DramView, plan: CopyPlan) -> None:
    """:func:`copy_kernel` with ``plan``'s blocks: per block on its core (round robin), the
    DMA-in engine waits for a free slot (a token from DMA-out), loads the block into it and
    hands it over (a token to DMA-out), which stores it and frees the slot."""
    kb, cfg = ctx.kb, ctx.config
    nbuf = kb.nbuf
    if nbuf * plan.slot_stride > cfg.memory(plan.mem).size:
        raise NotSupported(f"{nbuf} slots of {plan.slot_stride} B do not fit L0 {plan.mem}")
    dt = src.dtype
    t0, t1, t2 = plan.tile
    p = plan.pitch
    slot_strides = (t1 * p, p, 1)
    outer, last = plan.dims[:-3], plan.dims[-3:]
    n_done = [0] * cfg.cores
    blocks = [(idx, o) for idx in np.ndindex(*outer)
              for o in np.ndindex(*(-(-d // t) for d, t in zip(last, plan.tile)))]
    for j, (idx, o) in enumerate(blocks):
        core = j % cfg.cores
        origin = [oi * ti for oi, ti in zip(o, plan.tile)]
        e0, e1, e2 = (min(ti, d - oi) for ti, d, oi in zip(plan.tile, last, origin))

        def offset(s: tuple[int, ...], idx: tuple[int, ...] = idx,
                   origin: list[int] = origin) -> int:
            return sum(i * st for i, st in zip(idx, s[:-3])) + \
                sum(a * st for a, st in zip(origin, s[-3:]))

        if n_done[core] >= nbuf:
            kb.pop(core, UNIT_DMA_OUT, UNIT_DMA_IN)
        at = (n_done[core] % nbuf) * plan.slot_stride
        s0, s1, s2 = plan.src_strides[-3:]
        if plan.transposed:  # source rows (dim 1) become the slot's columns
            kb.load(core, shape=(e0, e2, e1), dst=block(plan.mem, at, dt, (t1 * p, 1, p)),
                    src=src.at(offset(plan.src_strides), (s0, s2, s1)))
        else:
            kb.load(core, shape=(e0, e1, e2), dst=block(plan.mem, at, dt, slot_strides),
                    src=src.at(offset(plan.src_strides), (s0, s1, s2)))
        kb.push(core, UNIT_DMA_IN, UNIT_DMA_OUT)
        kb.pop(core, UNIT_DMA_IN, UNIT_DMA_OUT)
        kb.emit(core, "dma.store", shape=(e0, e1, e2),
                dst=dst.at(offset(plan.dst_strides), tuple(plan.dst_strides[-3:])),
                src=block(plan.mem, at, dt, slot_strides))
        kb.push(core, UNIT_DMA_OUT, UNIT_DMA_IN)
        n_done[core] += 1
    for core in range(cfg.cores):
        for _ in range(min(n_done[core], nbuf)):
            kb.pop(core, UNIT_DMA_OUT, UNIT_DMA_IN)
    # the bytes copied, read once and written once: a slice's source may be a larger tensor,
    # of which on-chip residency must not take more off the bound than the slice reads
    nbytes = math.prod(plan.dims) * itemsize(dt)
    traffic = 2 * nbytes / cfg.memory(DRAM).bandwidth
    kb.end_kernel(KernelInfo(ctx.label(op), op, plan.describe(), plan.estimate, traffic,
                             traffic=traffic, reads=nbytes, writes=nbytes))


@register_lowering("transpose")
def lower_transpose(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    x = ctx.tensor(args[0])
    rank = len(x.shape)
    axes = call.attrs.axes
    perm = tuple(range(rank - 1, -1, -1)) if axes is None else tuple(a % rank for a in axes)
    view = DramView(x, 0, out.shape, tuple(x.strides[a] for a in perm))
    copy_kernel(ctx, "transpose", out, view)
@register_lowering("strided_slice")
def lower_strided_slice(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                        ) -> None:
    """``x[begin:end:step]`` per axis: the first element's offset and the steps as strides
    (negative steps read backwards)."""
    x = ctx.tensor(args[0])
    at = call.attrs
    rank = len(x.shape)
    axes = at.axes if at.axes is not None else tuple(range(len(at.begin)))
    steps = at.strides or (1,) * len(at.begin)
    offset = 0
    strides = list(x.strides)
    for a, b, e, s in zip(axes, at.begin, at.end, steps):
        a %= rank
        start, _, _ = slice(b, e if e is None or abs(e) < 2 ** 31 - 1 else None, s).indices(
            x.shape[a])
        offset += start * x.strides[a]
        strides[a] *= s
    copy_kernel(ctx, "strided_slice", out, DramView(x, offset, out.shape, tuple(strides)))


@register_lowering("concat")
def lower_concat(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    """One copy kernel per input into its slice of the result (a constant input is uploaded
    to DRAM first)."""
    parts = args[0]
    rank = len(out.shape)
    axis = call.attrs.axis % rank
    if any(p.dtype != out.dtype for p in parts if isinstance(p, DramTensor)):
        raise NotSupported("concat: inputs of different dtypes")
    offset = 0
    for p in parts:
        t = ctx.tensor(p)
        if t.shape[axis]:
            copy_kernel(ctx, "concat", DramView(out, offset * out.strides[axis], t.shape,
                                                out.strides), t)
        offset += t.shape[axis]
