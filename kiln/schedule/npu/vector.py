"""Element-wise, broadcast, pooling and softmax kernels on the vector unit.

All of them are tiled the same way: the output is cut into blocks that fit ``nbuf`` slots of
the L0 buffers (inputs in L0 input and weight, the result in the accumulators), each block is
DMAed in, computed by a few vector instructions on 1-3-D blocks, and DMAed out, in the
double-buffered pipeline of :class:`~.emit.Pipeline`.

- element-wise: the blocks are the instruction form :mod:`.isel` picks (the dims merged,
  kept apart or split into rows; the block's rank and extents; checked against the
  description's limits and ranked by its cost model); a broadcast operand is loaded once per
  block at its own extent and read by the vector unit with stride 0;
- pooling (NCHW): a block of channels and output rows is loaded with its padding filled by the
  DMA (-inf for max, 0 for average); every tap is a strided view of it, combined with
  ``vmax``/``vadd``; global average pooling is a ``vred.sum``;
- softmax over the last axis: ``vred.max``, ``vsub`` (the max broadcast), ``vexp``,
  ``vred.sum``, ``vdiv``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...ir.errors import KilnError
from ...npu.isa import UNIT_VECTOR, Block
from ...target.npu.config import DRAM
from .emit import (
    DramTensor,
    DramView,
    KernelBuilder,
    KernelInfo,
    Pipeline,
    block,
    itemsize,
    row_major,
)
from .feedback import lower_with_feedback
from .isel import select_forms
from .lowering import LoweringContext, NotSupported
from .nest_analysis import analyse_elementwise

__all__ = ["ElementwiseKernel", "ElementwisePlan", "VecStep", "acc_layout", "compact_block",
           "emit_steps",
           "POOL_TAP_OPCODES", "elementwise_kernel", "emit_elementwise", "plan_elementwise",
           "plan_elementwise_candidates", "plan_pool2d", "pool2d_blocks", "pool2d_cost",
           "pool_block_cost", "POOL_CANDIDATES",
           "pool_fill",
           "plan_rows", "pool2d_kernel", "pool2d_kernel_info", "register_pool2d_kernel",
           "rows_bound",
           "register_elementwise_kernel", "emit_layer_norm", "emit_row_mean", "emit_pool2d",
           "NARROW_FLOATS", "cast_kernel", "in_float32",
           "emit_softmax", "traffic_cycles"]

L0_INPUTS = ("input", "weight")


@dataclass(frozen=True)
class VecStep:
    """One vector instruction of an element-wise kernel: ``dst = opcode(srcs...)`` on the
    output block; a source is ``("in", k)`` (operand k), ``("imm", value)`` or ``("out",)``
    (the output block, for chains); ``extra`` holds other fields (a cast's ``mode``)."""

    opcode: str
    srcs: tuple[tuple[Any, ...], ...]
    extra: tuple[tuple[str, Any], ...] = ()


def traffic_cycles(kb: KernelBuilder, nbytes: int) -> float:
    """DRAM cycles of ``nbytes`` at the chip's bandwidth (a vector kernel's roofline)."""
    return nbytes / kb.config.memory(DRAM).bandwidth


def _fit(dims: list[int], fits: Callable[[tuple[int, int, int]], bool]) -> tuple[int, int, int]:
    """The largest block (t0, t1, t2), innermost first, that ``fits`` (halving)."""
    t = [1, 1, 1]
    for axis in (2, 1, 0):
        e = dims[axis]
        while e > 1 and not fits(tuple(e if i == axis else t[i] for i in range(3))):
            e = math.ceil(e / 2)
        t[axis] = e
        if e < dims[axis]:
            break
    if not fits(tuple(t)):
        raise NotSupported("not even one element of each operand fits the L0 buffers")
    return tuple(t)  # type: ignore[return-value]


@dataclass(frozen=True)
class ElementwisePlan:
    """The tiling of an element-wise kernel (both routes use it, so both compute the same
    blocks): ``dims`` the result's dims collapsed to at most three plus the outer ones the
    blocks iterate over; ``out_strides`` and ``in_strides`` each operand's element strides over
    them (0: broadcast); ``tile`` the block ``(t0, t1, t2)`` of the last three; ``mem_of`` the
    L0 memory of each operand (alternately input and weight)."""

    dims: tuple[int, ...]
    out_strides: tuple[int, ...]
    in_strides: tuple[tuple[int, ...], ...]
    tile: tuple[int, int, int]
    mem_of: tuple[str, ...]
    nbytes: int
    #: the instruction selection's record: the form, the forms considered and rejected
    selection: str = ""

    def describe(self) -> str:
        return f"block {self.tile} of {self.dims}" + \
            (f" [{self.selection}]" if self.selection else "")


def plan_elementwise(cfg: Any, nbuf: int, out: DramTensor | DramView,
                     inputs: list[DramTensor | DramView], cdt: str,
                     steps: tuple[VecStep, ...] | list[VecStep] = ()) -> ElementwisePlan:
    """The blocks of ``out = steps(inputs)`` computed in ``cdt``: the instruction form
    :func:`~.isel.select_form` picks for the nest (:func:`~.nest_analysis.analyse_elementwise`)
    -- the reshape, the block's rank and extents -- among those whose ``nbuf`` slots of every
    operand and of the result (plus its compute block when ``cdt`` is not ``out.dtype``) fit
    the L0 buffers, ranked by the description's cost model (``steps``: the vector
    instructions per block it counts). Raises NotSupported."""
    return plan_elementwise_candidates(cfg, nbuf, out, inputs, cdt, steps)[0]


def plan_elementwise_candidates(cfg: Any, nbuf: int, out: DramTensor | DramView,
                                inputs: list[DramTensor | DramView], cdt: str,
                                steps: tuple[VecStep, ...] | list[VecStep] = ()
                                ) -> list[ElementwisePlan]:
    """:func:`plan_elementwise`'s plan, then those of the next legal forms by the cost
    model (:func:`~.isel.select_forms`): what the kernel builders fall back on when a later
    check refuses a block (:func:`~.feedback.lower_with_feedback`)."""
    rank = len(out.shape)
    if any(len(t.shape) > rank for t in inputs):
        raise NotSupported("an operand has more dims than the result")
    nest = analyse_elementwise(cfg, out, inputs, cdt, tuple(st.opcode for st in steps))
    mem_of = [L0_INPUTS[k % 2] for k in range(len(inputs))]
    # the DRAM bytes of the roofline: every operand once and the result in its own dtype
    # (a compute block in another dtype stays in the accumulators: no traffic)
    nbytes = sum(int(np.prod(x.shape)) * itemsize(x.dtype) for x in inputs) + \
        int(np.prod(out.shape)) * itemsize(out.dtype)
    return [ElementwisePlan(sel.form.dims, sel.form.strides[0], sel.form.strides[1:],
                            sel.form.tile, tuple(mem_of), nbytes, sel.describe())
            for sel in select_forms(cfg, nbuf, nest)]


def compact_block(t: tuple[int, ...], s: Any) -> tuple[int, int, int]:
    """The part of block ``t`` an operand of strides ``s`` holds: 1 in its broadcast dims."""
    return tuple(n if st else 1 for n, st in zip(t, tuple(s)[-3:]))  # type: ignore[return-value]


def acc_layout(tile: tuple[int, int, int], out_dtype: str, cdt: str) -> tuple[int, int]:
    """``(slot bytes, offset of the compute block)`` of an element-wise kernel's accumulator
    slot: the result's block, then (computing in another dtype) the compute block, 8-byte
    aligned (an int32 block after int8s); 8 bytes of slack per slot."""
    n = int(np.prod(tile))
    osz = itemsize(out_dtype) + (itemsize(cdt) if cdt != out_dtype else 0)
    return -(-(n * osz + 8) // 8) * 8, -(-n * itemsize(out_dtype) // 8) * 8


ElementwiseKernel = Callable[..., None]
_ROUTED: dict[str, ElementwiseKernel] = {}


def register_elementwise_kernel(route: str) -> Callable[[ElementwiseKernel], ElementwiseKernel]:
    """Decorator: ``fn`` builds the element-wise kernels (the signature of
    :func:`emit_elementwise`) of contexts whose ``route`` is ``route`` -- for the kernels
    that are no graph op of their own (a fused chain, a product's operand cast), which
    :func:`~.lowering.register_tir_lowering` cannot reach."""
    def register(fn: ElementwiseKernel) -> ElementwiseKernel:
        if route in _ROUTED:
            raise KilnError(f"route {route!r} already has an element-wise kernel builder")
        _ROUTED[route] = fn
        return fn

    return register


def elementwise_kernel(ctx: LoweringContext, op: str, out: DramTensor | DramView,
                       inputs: list[DramTensor | DramView], steps: list[VecStep],
                       compute_dtype: str | None = None) -> None:
    """The element-wise kernel ``out = steps(inputs)`` on the context's route: the builder
    registered for it (:func:`register_elementwise_kernel`), else :func:`emit_elementwise`."""
    _ROUTED.get(ctx.route, emit_elementwise)(ctx, op, out, inputs, steps, compute_dtype)


def emit_elementwise(ctx: LoweringContext, op: str, out: DramTensor | DramView,
                     inputs: list[DramTensor | DramView], steps: list[VecStep],
                     compute_dtype: str | None = None) -> None:
    """``out = steps(inputs)`` with numpy broadcasting (see the module docstring); with a
    ``compute_dtype`` other than ``out.dtype`` the steps compute in it and a final ``vcast``
    converts the block (the cast a consumer's product needs, fused into its producer).
    ``out`` and the inputs may be :class:`~.emit.DramView` s (a transpose, a slice, a place in
    a concatenation): their strides go to the DMAs as they are."""
    cdt = compute_dtype or out.dtype
    plans = plan_elementwise_candidates(ctx.config, ctx.kb.nbuf, out, inputs, cdt, steps)
    lower_with_feedback(ctx, op, plans,
                        lambda plan: _emit_elementwise(ctx, op, out, inputs, steps, cdt, plan),
                        ElementwisePlan.describe)


def _emit_elementwise(ctx: LoweringContext, op: str, out: DramTensor | DramView,
                      inputs: list[DramTensor | DramView], steps: list[VecStep], cdt: str,
                      plan: ElementwisePlan) -> None:
    """:func:`emit_elementwise` with ``plan``'s blocks; NotSupported (nothing emitted) when
    its slots do not fit L0."""
    kb, cfg = ctx.kb, ctx.config
    nbuf = kb.nbuf
    dims_all, t, mem_of = list(plan.dims), plan.tile, plan.mem_of
    outer_dims, dims = dims_all[:-3], dims_all[-3:]
    o_str, in_str = list(plan.out_strides), [list(s) for s in plan.in_strides]
    compact = compact_block
    # L0 layout: per memory, the operands' regions one after the other, each nbuf slots
    region: list[int] = []
    used = {m: 0 for m in L0_INPUTS}
    for x, s, m in zip(inputs, in_str, mem_of):
        isz = itemsize(x.dtype)  # aligned to its elements (a float block after a uint8 mask)
        used[m] = -(-used[m] // isz) * isz
        region.append(used[m])
        used[m] += nbuf * int(np.prod(compact(t, s))) * itemsize(x.dtype)
    # the compute block after the result; both 8-byte aligned (an int32 block after int8s)
    out_slot_bytes, cast_at = acc_layout(t, out.dtype, cdt)
    for m, n in [*used.items(), ("acc", nbuf * out_slot_bytes)]:
        if n > cfg.memory(m).size:
            raise NotSupported(f"{nbuf} slots of block {t} take {n} B, more than {m} holds")
    pipes = [Pipeline(kb, c, UNIT_VECTOR) for c in range(cfg.cores)]
    blocks = [(idx, o) for idx in np.ndindex(*outer_dims)
              for o in np.ndindex(*(math.ceil(d / b) for d, b in zip(dims, t)))]
    for j, (idx, o) in enumerate(blocks):
        core = j % cfg.cores
        p = pipes[core]
        origin = [oi * ti for oi, ti in zip(o, t)]
        ext = tuple(min(ti, d - oi) for ti, d, oi in zip(t, dims, origin))

        def offset(s: list[int], idx: tuple[int, ...] = idx, origin: list[int] = origin) -> int:
            return sum(i * st for i, st in zip(idx, s[:-3])) + \
                sum(a * st for a, st in zip(origin, s[-3:]))

        slot = p.load_slot()
        l0 = []
        for k, (x, s) in enumerate(zip(inputs, in_str)):
            e = compact(ext, s)
            cst = row_major(e)
            addr = region[k] + slot * int(np.prod(compact(t, s))) * itemsize(x.dtype)
            kb.load(core, shape=e, dst=block(mem_of[k], addr, x.dtype, cst),
                    src=x.at(offset(s), tuple(s[-3:])))
            l0.append(block(mem_of[k], addr, x.dtype,
                            tuple(c if st else 0 for c, st in zip(cst, s[-3:]))))
        p.loaded()
        p.compute_begin()
        dst = block("acc", p.out_slot() * out_slot_bytes, out.dtype, row_major(ext))
        result = dst
        if cdt != out.dtype:
            dst = dst._replace(addr=dst.addr + cast_at, dtype=cdt)
        emit_steps(kb, core, steps, ext, dst, l0)
        if result is not dst:
            kb.fence(core, UNIT_VECTOR)
            kb.emit(core, "vcast", shape=ext, mode="rne", dst=result, a=dst)
        p.computed()
        p.produced()
        p.store_begin()
        kb.emit(core, "dma.store", shape=ext, dst=out.at(offset(o_str), tuple(o_str[-3:])),
                src=result)
        p.stored()
    for p in pipes:
        p.finish()
    bound = traffic_cycles(kb, plan.nbytes)
    kb.end_kernel(KernelInfo(ctx.label(op), op, plan.describe(), bound, bound))


def emit_steps(kb: KernelBuilder, core: int, steps: list[VecStep], shape: tuple[int, ...],
               dst: Block, operands: list[Block], out: Block | None = None,
               wait: tuple[int, int] | None = None) -> None:
    """A chain's vector instructions on one block, in order, each overwriting ``dst`` (its
    running value; a fence between two: the unit pipelines): a step's sources are operand
    blocks (``("in", k)``: ``operands[k]``), immediates or the running value. ``out``: the
    last step writes there instead (a fused epilogue's staged result; ``dst`` keeps the
    value before it). ``wait``: a token ``(source unit, this unit)`` popped just before the
    last step (that the buffer it writes is free)."""
    for i, st in enumerate(steps):
        if i:
            kb.fence(core, UNIT_VECTOR)
        if wait is not None and i == len(steps) - 1:
            kb.pop(core, *wait)
        srcs = [operands[s[1]] if s[0] == "in" else s[1] if s[0] == "imm" else dst
                for s in st.srcs]
        names = ("mask", "a", "b") if st.opcode == "vsel" else ("a", "b")
        to = out if out is not None and i == len(steps) - 1 else dst
        kb.emit(core, st.opcode, shape=shape, dst=to, **dict(zip(names, srcs)),
                **dict(st.extra))


def plan_pool2d(cfg: Any, nbuf: int, x_shape: tuple[int, ...], out_shape: tuple[int, ...],
                dtype: str, pool: tuple[int, int], strides: tuple[int, int],
                pad: tuple[int, int, int, int], dilation: tuple[int, int], depthwise: bool,
                scaled: bool) -> tuple[int, int, int]:
    """``(channels, output rows, staged row width)`` of a pooling / depthwise block (both
    routes use it): the most whose ``nbuf`` slots of input rows (with the windows' padding),
    of weights or the reciprocal-count rows, and of output rows fit L0; a depthwise
    convolution's channel blocks stay within one image. Raises NotSupported."""
    n, c, h, w = x_shape
    oh, ow = out_shape[2:]
    (kh, kw), (sh, sw), (dh, dw) = pool, strides, dilation
    wp = max(w + pad[1], (ow - 1) * sw + (kw - 1) * dw + 1)
    isz = itemsize(dtype)
    taps = kh * kw

    def fits(t: tuple[int, int, int]) -> bool:
        ct, r = t[0], t[1]
        side = ct * taps if depthwise else r * ow if scaled else 0
        return (nbuf * ct * ((r - 1) * sh + (kh - 1) * dh + 1) * wp * isz <=
                cfg.memory("input").size and
                nbuf * side * isz <= cfg.memory("weight").size and
                nbuf * ct * r * ow * isz <= cfg.memory("acc").size)

    ct, rt, _ = _fit([c if depthwise else n * c, oh, 1], fits)
    return ct, rt, wp


def pool2d_cost(cfg: Any, nbuf: int, x_shape: tuple[int, ...], out_shape: tuple[int, ...],
                dtype: str, pool: tuple[int, int], strides: tuple[int, int],
                pad: tuple[int, int, int, int], dilation: tuple[int, int],
                depthwise: bool, out_onchip: bool = False) -> float:
    """Estimated cycles of :func:`emit_pool2d`'s kernel (both routes emit the same), from the
    description: per block of :func:`plan_pool2d` one vector instruction per tap (a ``vmul``
    / ``vmac`` or ``vmax``, each over the block, a fence between two), its loads (the
    input rows, a depthwise block's weights) and its store; a core's blocks pipelined over
    ``nbuf`` slots, so the busiest of its vector work, its DMA queue (issue overhead, the
    data at the chip's bandwidth, each step's wait for its loads to land) and the chip's
    DRAM channel, plus the first load and the last store. An input that fits L1 is counted
    there (see below; :func:`~.gemm.gemm_cost`, the tensor route's estimate, counts every
    operand in DRAM: where the two are close this favours the vector unit). What
    :func:`.ops.depthwise_route` weighs against the tensor unit's product.
    ``out_onchip``: count the output's stores in L1 too (at the DMA engine's on-chip
    bandwidth, off the channel: an intermediate residency keeps there -- the depthwise
    route counts both routes' outputs so where they fit L1). Raises NotSupported (no block
    fits)."""
    ct, rt, _ = plan_pool2d(cfg, nbuf, x_shape, out_shape, dtype, pool, strides, pad, dilation,
                            depthwise, False)
    return pool_block_cost(cfg, nbuf, x_shape, out_shape, dtype, pool, strides, dilation,
                            depthwise, ct, rt, out_onchip)


#: How many blocks :func:`pool2d_blocks` offers.
POOL_CANDIDATES = 4


def pool2d_blocks(cfg: Any, nbuf: int, x_shape: tuple[int, ...], out_shape: tuple[int, ...],
                  dtype: str, pool: tuple[int, int], strides: tuple[int, int],
                  pad: tuple[int, int, int, int], dilation: tuple[int, int], depthwise: bool,
                  scaled: bool) -> list[tuple[int, int, int]]:
    """:func:`plan_pool2d`'s block, then up to ``POOL_CANDIDATES - 1`` smaller ones (its
    channels and rows halved or quartered: each fits where it does), cheapest first by the
    cost model (:func:`pool2d_cost`'s): what the pooling kernel builders fall back on when a
    later check refuses a block (:func:`~.feedback.lower_with_feedback`). Raises
    NotSupported (no block fits)."""
    ct, rt, wp = plan_pool2d(cfg, nbuf, x_shape, out_shape, dtype, pool, strides, pad,
                             dilation, depthwise, scaled)
    smaller = {(-(-ct // a), -(-rt // b)) for a in (1, 2, 4) for b in (1, 2, 4)} - {(ct, rt)}
    ranked = sorted(smaller, key=lambda blk: (pool_block_cost(
        cfg, nbuf, x_shape, out_shape, dtype, pool, strides, dilation, depthwise, *blk),
        -blk[0] * blk[1], blk))
    return [(ct, rt, wp)] + [(c, r, wp) for c, r in ranked[:POOL_CANDIDATES - 1]]


def pool_block_cost(cfg: Any, nbuf: int, x_shape: tuple[int, ...], out_shape: tuple[int, ...],
                     dtype: str, pool: tuple[int, int], strides: tuple[int, int],
                     dilation: tuple[int, int], depthwise: bool, ct: int, rt: int,
                     out_onchip: bool = False) -> float:
    """:func:`pool2d_cost` of blocks of ``ct`` channels and ``rt`` output rows
    (``out_onchip``: see there)."""
    n, c, h, w = x_shape
    oh, ow = out_shape[2:]
    (kh, kw), (sh, _), (dh, _) = pool, strides, dilation
    isz = itemsize(dtype)
    taps = kh * kw
    dram = cfg.memory(DRAM)
    blocks = (n * -(-c // ct) if depthwise else -(-(n * c) // ct)) * -(-oh // rt)
    per_core = -(-blocks // cfg.cores)
    rows_in = min(h, (rt - 1) * sh + (kh - 1) * dh + 1)
    load = ct * rows_in * w * isz + (ct * taps * isz if depthwise else 0)
    store = ct * rt * ow * isz
    vec = taps * (cfg.vector_ops_cycles(ct * rt * ow * isz) + cfg.vector_latency)
    loads = 1 + int(depthwise)
    # an input that fits L1 is read at the DMA engine's on-chip bandwidth, off the shared
    # channel: where on-chip residency (decided once the program is emitted) keeps a
    # producer's result -- every depthwise input of MobileNetV2 at 112 px on "default"
    # (counted in DRAM, the estimate was twice the simulated cycles: 16026 against 7760
    # for its 96-channel 3x3/2)
    on_chip = n * c * h * w * isz <= cfg.memory("l1").size
    in_bw = cfg.dma_onchip_bandwidth if on_chip else dram.bandwidth
    dma = loads * cfg.dma_latency + load / in_bw
    wait = (cfg.memory("l1").latency if on_chip else dram.latency) + loads * cfg.dma_latency
    channel = blocks * ((0 if on_chip else load) + (0 if out_onchip else store)) / \
        dram.bandwidth
    first = dma + wait
    last = cfg.dma_latency + store / dram.bandwidth + dram.latency
    dma_out = 0.0
    if out_onchip:  # a core's stores at its engine's on-chip bandwidth
        last = cfg.dma_latency + store / cfg.dma_onchip_bandwidth + cfg.memory("l1").latency
        dma_out = per_core * (cfg.dma_latency + store / cfg.dma_onchip_bandwidth)
    if nbuf < 2:
        return per_core * (dma + wait + vec) + channel / cfg.cores + last
    return max(per_core * vec, per_core * max(dma, wait / nbuf), channel, dma_out) + \
        first + last


def pool2d_kernel_info(ctx: LoweringContext, op: str, x: Any, out: Any, taps: int,
                       depthwise: bool, ct: int, rt: int, prefix: str = "") -> KernelInfo:
    """The pooling kernel's record: its roofline, the larger of its DRAM traffic and (a
    depthwise convolution) the vector unit's passes over the output, one per tap."""
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    nc, isz = n * c, itemsize(x.dtype)
    traffic = traffic_cycles(ctx.kb, (nc * h * w + nc * oh * ow) * isz)
    macs = nc * oh * ow * isz * taps / ctx.config.vector_width / ctx.config.cores \
        if depthwise else 0.0
    return KernelInfo(ctx.label(op), op, f"{prefix}{ct} channels x {rt} rows of {nc} x {oh}",
                      max(traffic, macs), max(traffic, macs), macs, traffic)


#: A pooling kind's instruction for each tap after the first: ``"maxnm"`` is ONNX MaxPool's
#: maximum that skips NaNs (``nn.max_pool2d(ignore_nan=True)``; ``vmaxnm``, IEEE maxNum),
#: ``"max"`` one that propagates them.
POOL_TAP_OPCODES = {"max": "vmax", "maxnm": "vmaxnm", "avg": "vadd"}


def pool_fill(kind: str) -> float:
    """What a pooling kind's padded taps hold: -inf for a maximum, 0 for a sum."""
    return float("-inf") if kind in ("max", "maxnm") else 0.0


PoolKernelFn = Callable[..., None]
_ROUTED_POOL: dict[str, PoolKernelFn] = {}


def register_pool2d_kernel(route: str) -> Callable[[PoolKernelFn], PoolKernelFn]:
    """Decorator: ``fn`` builds the pooling and depthwise kernels (the signature of
    :func:`emit_pool2d`) of contexts whose ``route`` is ``route`` (a depthwise convolution is
    reached from ``nn.conv2d``'s lowering, pooling from three ops'; one hook serves all)."""
    def register(fn: PoolKernelFn) -> PoolKernelFn:
        if route in _ROUTED_POOL:
            raise KilnError(f"route {route!r} already has a pooling kernel builder")
        _ROUTED_POOL[route] = fn
        return fn

    return register


def pool2d_kernel(ctx: LoweringContext, *args: Any, **kwargs: Any) -> None:
    """The pooling / depthwise kernel (:func:`emit_pool2d`'s arguments) on the context's
    route: the builder registered for it, else :func:`emit_pool2d`."""
    _ROUTED_POOL.get(ctx.route, emit_pool2d)(ctx, *args, **kwargs)


def emit_pool2d(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor,
                kind: str, pool: tuple[int, int], strides: tuple[int, int],
                pad: tuple[int, int, int, int], dilation: tuple[int, int],
                divisor: float | None, weights: DramTensor | None = None,
                scale: DramTensor | None = None) -> None:
    """Max (``kind="max"``, or ``"maxnm"`` skipping NaNs) or average pooling of NCHW ``x``
    (``divisor``: the window size an average divides by when every window counts the same
    taps; else ``scale``, ``(OH,
    OW)`` in ``x``'s dtype: each window's reciprocal count, loaded per block of rows and
    multiplied in with stride 0 across the channels), or with ``weights``
    (``(C, KH * KW)`` in ``x``'s dtype) a depthwise convolution: each tap's strided view times
    its channel's weight (a stride-0 block), accumulated with ``vmac``."""
    blocks = pool2d_blocks(ctx.config, ctx.kb.nbuf, x.shape, out.shape, x.dtype, pool,
                           strides, pad, dilation, weights is not None, scale is not None)
    lower_with_feedback(ctx, op, blocks, lambda blk: _emit_pool2d(
        ctx, op, x, out, kind, pool, strides, pad, dilation, divisor, weights, scale, blk),
        lambda blk: f"{blk[0]} channels x {blk[1]} rows")


def _emit_pool2d(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor,
                 kind: str, pool: tuple[int, int], strides: tuple[int, int],
                 pad: tuple[int, int, int, int], dilation: tuple[int, int],
                 divisor: float | None, weights: DramTensor | None,
                 scale: DramTensor | None, blk: tuple[int, int, int]) -> None:
    """:func:`emit_pool2d` in blocks ``blk`` (channels, output rows, staged row width);
    NotSupported (nothing emitted) when their slots do not fit L0."""
    kb, cfg = ctx.kb, ctx.config
    nbuf = kb.nbuf
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    (kh, kw), (sh, sw), (dh, dw) = pool, strides, dilation
    pt, pl, _, _ = pad
    isz = itemsize(x.dtype)
    nc = n * c
    ct, rt, wp = blk

    def rows_in(r: int) -> int:
        return (r - 1) * sh + (kh - 1) * dh + 1

    taps = kh * kw
    fill = pool_fill(kind)
    w_slot = (ct * taps if weights is not None else rt * ow) * isz
    pipes = [Pipeline(kb, core, UNIT_VECTOR) for core in range(cfg.cores)]
    in_slot = ct * rows_in(rt) * wp * isz
    out_slot = ct * rt * ow * isz
    side = w_slot if weights is not None or scale is not None else 0
    for mem, size in (("input", in_slot), ("weight", side), ("acc", out_slot)):
        if nbuf * size > cfg.memory(mem).size:
            raise NotSupported(f"{nbuf} slots of {size} B exceed {mem}")
    if weights is None:
        blocks = [(c0, r0, min(ct, nc - c0)) for c0 in range(0, nc, ct)
                  for r0 in range(0, oh, rt)]
    else:
        blocks = [(i * c + c0, r0, min(ct, c - c0)) for i in range(n)
                  for c0 in range(0, c, ct) for r0 in range(0, oh, rt)]
    for j, (c0, r0, cs) in enumerate(blocks):
        core = j % cfg.cores
        p = pipes[core]
        rs = min(rt, oh - r0)
        ih0 = r0 * sh - pt
        ihn = rows_in(rs)
        lo, hi = max(ih0, 0), min(ih0 + ihn, h)
        slot = p.load_slot()
        base = slot * in_slot
        tile_st = (ihn * wp, wp, 1)
        if lo < hi:
            kb.load(core, shape=(cs, hi - lo, w),
                    dst=block("input", base, x.dtype, tile_st),
                    src=x.at(c0 * h * w + lo * w, (h * w, w, 1)),
                    pad_lo=(0, lo - ih0, pl), pad_hi=(0, ih0 + ihn - hi, wp - pl - w),
                    fill=fill)
        else:
            kb.load(core, shape=(cs, ihn, wp),
                    dst=block("input", base, x.dtype, tile_st),
                    src=block("dram", 0, x.dtype, (0, 0, 0)))
        if weights is not None:
            kb.load(core, shape=(1, cs, taps),
                    dst=block("weight", slot * w_slot, x.dtype, (0, taps, 1)),
                    src=weights.at((c0 % c) * taps, (0, taps, 1)))
        if scale is not None:
            kb.load(core, shape=(1, rs, ow), dst=block("weight", slot * w_slot, x.dtype,
                                                       (0, ow, 1)),
                    src=scale.at(r0 * ow, (0, ow, 1)))
        p.loaded()
        p.compute_begin()
        dst = block("acc", p.out_slot() * out_slot, out.dtype, (rs * ow, ow, 1))
        first = True
        for a in range(kh):
            for b in range(kw):
                tap = block("input", base + (a * dh * wp + b * dw) * isz, x.dtype,
                            (ihn * wp, sh * wp, sw))
                if not first:
                    kb.fence(core, UNIT_VECTOR)
                if weights is not None:
                    wt = block("weight", slot * w_slot + (a * kw + b) * isz, x.dtype,
                               (taps, 0, 0))
                    kb.emit(core, "vmul" if first else "vmac", shape=(cs, rs, ow), dst=dst,
                            a=tap, b=wt)
                elif first:
                    kb.emit(core, "vmov", shape=(cs, rs, ow), dst=dst, a=tap)
                else:
                    kb.emit(core, POOL_TAP_OPCODES[kind], shape=(cs, rs, ow),
                            dst=dst, a=dst, b=tap)
                first = False
        if divisor is not None:
            kb.fence(core, UNIT_VECTOR)
            kb.emit(core, "vmul", shape=(cs, rs, ow), dst=dst, a=dst, b=1.0 / divisor)
        elif scale is not None:
            kb.fence(core, UNIT_VECTOR)
            kb.emit(core, "vmul", shape=(cs, rs, ow), dst=dst, a=dst,
                    b=block("weight", slot * w_slot, x.dtype, (0, ow, 1)))
        p.computed()
        p.produced()
        p.store_begin()
        kb.emit(core, "dma.store", shape=(cs, rs, ow), src=dst,
                dst=out.at(c0 * oh * ow + r0 * ow, (oh * ow, ow, 1)))
        p.stored()
    for p in pipes:
        p.finish()
    kb.end_kernel(pool2d_kernel_info(ctx, op, x, out, taps, weights is not None, ct, rt))


def plan_rows(cfg: Any, nbuf: int, isz: int, rows: int, length: int, out_len: int,
              consts: int = 0) -> int:
    """Rows per block of a row kernel (both routes use it): the most whose ``nbuf`` slots of
    input rows, of four per-row values (L0 weight, after them ``consts`` rows of ``length``
    loaded once) and of output rows fit. Raises NotSupported."""
    const_bytes = consts * length * isz

    def fits(t: tuple[int, int, int]) -> bool:
        r = t[1]
        return (max(r, length) <= cfg.encoding.max_extent and
                nbuf * r * length * isz <= cfg.memory("input").size and
                nbuf * r * 4 * isz + const_bytes <= cfg.memory("weight").size and
                nbuf * r * out_len * isz <= cfg.memory("acc").size)

    if length * isz * nbuf > cfg.memory("input").size or \
            nbuf * 4 * isz + const_bytes > cfg.memory("weight").size:
        raise NotSupported(f"a row of {length} elements does not fit L0")
    return _fit([1, rows, 1], fits)[1]


def rows_bound(kb: KernelBuilder, isz: int, rows: int, length: int, out_len: int,
               consts: int = 0) -> float:
    """The DRAM roofline of a row kernel: its rows in and out, its constant rows once."""
    return traffic_cycles(kb, (rows * length + rows * out_len + consts * length) * isz)


def _rows_kernel(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor, rows: int,
                 length: int, out_len: int, body: Callable[..., None],
                 consts: tuple[DramTensor, ...] = ()) -> None:
    """Blocks of whole rows of a (rows, length) view -> (rows, out_len); ``body(core, r,
    src, dst, tmp, *consts)`` emits the vector work of ``r`` rows (``tmp``: room for four
    values per row, one after the other; ``consts``: each a row of ``length`` values loaded
    once per core into L0 weight, read with stride 0 across the rows)."""
    kb, cfg = ctx.kb, ctx.config
    nbuf = kb.nbuf
    isz = itemsize(x.dtype)
    rt = plan_rows(cfg, nbuf, isz, rows, length, out_len, len(consts))
    const_base = nbuf * rt * 4 * isz
    const_blocks = [block("weight", const_base + i * length * isz, x.dtype, (0, 0, 1))
                    for i in range(len(consts))]
    pipes = [Pipeline(kb, core, UNIT_VECTOR) for core in range(cfg.cores)]
    for j, r0 in enumerate(range(0, rows, rt)):
        core = j % cfg.cores
        p = pipes[core]
        rs = min(rt, rows - r0)
        if j < cfg.cores:  # ordered before the compute by the first step's token
            for c, cb in zip(consts, const_blocks):
                kb.load(core, shape=(1, 1, length), dst=cb, src=c.at(0, (0, 0, 1)))
        slot = p.load_slot()
        src = block("input", slot * rt * length * isz, x.dtype, (0, length, 1))
        kb.load(core, shape=(1, rs, length), dst=src,
                src=x.at(r0 * length, (0, length, 1)))
        p.loaded()
        p.compute_begin()
        oslot = p.out_slot()
        dst = block("acc", oslot * rt * out_len * isz, out.dtype, (0, out_len, 1))
        tmp = block("weight", oslot * rt * 4 * isz, x.dtype, (0, 1, 0))
        body(core, rs, src, dst, tmp, *const_blocks)
        p.computed()
        p.produced()
        p.store_begin()
        kb.emit(core, "dma.store", shape=(1, rs, out_len), src=dst,
                dst=out.at(r0 * out_len, (0, out_len, 1)))
        p.stored()
    for p in pipes:
        p.finish()
    bound = rows_bound(kb, isz, rows, length, out_len, len(consts))
    kb.end_kernel(KernelInfo(ctx.label(op), op, f"{rt} rows of {rows} x {length}", bound, bound))


#: Float types a reduction does not accumulate in: ``vred.sum`` rounds to its destination's
#: type after every element (docs/npu.md, "Numerics"), so a float16 sum of a 64 x 64 plane
#: loses a third of its value once the sum outgrows the addends' precision.
NARROW_FLOATS = ("float16", "bfloat16")


def cast_kernel(ctx: LoweringContext, x: DramTensor, dtype: str, op: str = "cast",
                out: DramTensor | None = None) -> DramTensor:
    """``x`` converted to ``dtype`` (rounding to nearest even) on the vector unit, into
    ``out`` or a new DRAM tensor."""
    out = out if out is not None else ctx.alloc(x.shape, dtype)
    elementwise_kernel(ctx, op, out, [x], [VecStep("vcast", (("in", 0),), (("mode", "rne"),))])
    return out


def in_float32(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor,
               compute: Callable[[DramTensor, DramTensor], None]) -> None:
    """``compute(x, out)`` on float32 copies: a cast kernel widens ``x`` (exactly), ``compute``
    runs in float32 and another cast kernel rounds its result once to ``out``'s type -- for
    the sums of :data:`NARROW_FLOATS` (row means, average pooling windows)."""
    wide_out = ctx.alloc(out.shape, "float32")
    compute(cast_kernel(ctx, x, "float32", f"{op}.cast"), wide_out)
    cast_kernel(ctx, wide_out, out.dtype, f"{op}.cast", out)


def emit_row_mean(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor,
                  rows: int, mean: bool = True) -> None:
    """Mean of each of the ``rows`` rows of ``x`` (its trailing dims: H x W of a global average
    pool): one ``vred.sum`` and one ``vmul`` per block of rows (``mean=False``: the sum).
    float16/bfloat16 rows are summed in float32 (:data:`NARROW_FLOATS`): a cast kernel widens
    ``x``, the float32 result is rounded once to ``out``'s type by another."""
    if x.dtype in NARROW_FLOATS:
        return in_float32(ctx, op, x, out,
                          lambda wx, wo: emit_row_mean(ctx, op, wx, wo, rows, mean))
    length = int(np.prod(x.shape, dtype=np.int64)) // rows

    def body(core: int, rs: int, src: Any, dst: Any, tmp: Any) -> None:
        ctx.kb.emit(core, "vred.sum", shape=(1, rs, length), dst=dst, a=src, acc=0)
        if mean:
            ctx.kb.fence(core, UNIT_VECTOR)
            ctx.kb.emit(core, "vmul", shape=(1, rs, 1), dst=dst, a=dst, b=1.0 / length)

    _rows_kernel(ctx, op, x, out, rows, length, 1, body)


def emit_softmax(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor) -> None:
    """Softmax over the last axis of ``x``."""
    length = x.shape[-1]
    rows = int(np.prod(x.shape[:-1], dtype=np.int64))

    def body(core: int, rs: int, src: Any, dst: Any, tmp: Any) -> None:
        kb = ctx.kb
        row = tmp._replace(strides=(0, 1, 0))
        shape = (1, rs, length)
        inv = row._replace(addr=row.addr + rs * itemsize(x.dtype))  # the second stat
        kb.emit(core, "vred.max", shape=shape, dst=row, a=src, acc=0)
        # the division by the sum: a vdiv per row of a 1 (sum * 0 + 1) by it, then a vmul
        # of the row -- a vdiv of the row's bits (tir_rows.softmax_stages)
        per_row = (1, rs, 1)
        for op, shp, args in (("vsub", shape, dict(dst=dst, a=src, b=row)),
                              ("vexp", shape, dict(dst=dst, a=dst)),
                              ("vred.sum", shape, dict(dst=row, a=dst, acc=0)),
                              ("vmul", per_row, dict(dst=inv, a=row, b=0.0)),
                              ("vadd", per_row, dict(dst=inv, a=inv, b=1.0)),
                              ("vdiv", per_row, dict(dst=inv, a=inv, b=row)),
                              ("vmul", shape, dict(dst=dst, a=dst, b=inv))):
            kb.fence(core, UNIT_VECTOR)
            kb.emit(core, op, shape=shp, **args)

    _rows_kernel(ctx, op, x, out, rows, length, length, body)


def emit_layer_norm(ctx: LoweringContext, op: str, x: DramTensor, gamma: DramTensor,
                    beta: DramTensor, out: DramTensor, epsilon: float) -> None:
    """Layer normalization over the trailing ``gamma.size`` elements of each row of ``x``:
    two reductions (the mean, then the mean squared deviation, as the CPU computes it),
    ``vrsqrt`` of the variance plus ``epsilon``, then the scale and shift (``gamma``,
    ``beta``: loaded once per core, read with stride 0 across the rows)."""
    length = int(np.prod(gamma.shape, dtype=np.int64))
    rows = int(np.prod(x.shape, dtype=np.int64)) // length
    inv = 1.0 / length

    def body(core: int, rs: int, src: Any, dst: Any, tmp: Any, g: Any, b: Any) -> None:
        kb = ctx.kb
        mean = tmp
        var = tmp._replace(addr=tmp.addr + rs * itemsize(x.dtype))
        full, row = (1, rs, length), (1, rs, 1)
        work = [("vred.sum", full, dict(dst=mean, a=src, acc=0)),
                ("vmul", row, dict(dst=mean, a=mean, b=inv)),
                ("vsub", full, dict(dst=dst, a=src, b=mean)),
                ("vmul", full, dict(dst=src, a=dst, b=dst)),  # the input block is spent
                ("vred.sum", full, dict(dst=var, a=src, acc=0)),
                ("vmul", row, dict(dst=var, a=var, b=inv)),
                ("vadd", row, dict(dst=var, a=var, b=float(epsilon))),
                ("vrsqrt", row, dict(dst=var, a=var)),
                ("vmul", full, dict(dst=dst, a=dst, b=var)),
                ("vmul", full, dict(dst=dst, a=dst, b=g)),
                ("vadd", full, dict(dst=dst, a=dst, b=b))]
        for i, (opcode, shape, args) in enumerate(work):
            if i:
                kb.fence(core, UNIT_VECTOR)
            kb.emit(core, opcode, shape=shape, **args)

    _rows_kernel(ctx, op, x, out, rows, length, length, body, (gamma, beta))
