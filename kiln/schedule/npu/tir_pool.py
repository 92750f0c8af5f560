"""Pooling and depthwise convolutions on the NPU through TIR: max / average pooling and the
depthwise convolution (NCHW) as TE PrimFuncs whose every window tap is a strided view of the
staged input block, scheduled into the L0 scopes and tensorized onto the vector intrinsics
(a tap: ``npu.l0.input`` read ``X[c, i * sh + a * dh, j * sw + b * dw]``), then generated.

1. :func:`pool_prim_func`: the input padded as the windows see it (``Xp``: the padding rows
   and columns and the channels and rows of whole blocks filled with ``-inf`` for max
   pooling, 0 else); one stage per tap -- the first a ``vmov`` (``vmul`` by the channel's
   weight for a depthwise convolution), each next one ``vmax`` / ``vadd`` of the running
   value and the tap (``vmac`` of the tap and the weight) --, then the average's ``vmul`` by
   ``1 / divisor`` or by the map of reciprocal window counts (``S``, broadcast across the
   channels); ``C``, the crop.
2. :func:`schedule_pool`: the last stage's channels and rows split by the emitter's block
   (:func:`~.vector.plan_pool2d`), the stages ``cache_write``'d into ``npu.l0.acc`` and
   ``compute_at``'ed under the block loop; ``Xp`` staged into ``npu.l0.input`` there (its
   write-back inlined into every tap: one copy that the taps view), the weights and the
   count map into ``npu.l0.weight``; the block loops fused and pipelined; each stage
   tensorized.
3. :class:`PoolGenerator`: :class:`~.tir_vector.VectorGenerator`'s walk; the input copy is
   one DMA of the box where its condition holds, the rest of the block filled by the DMA
   (``pad_lo``/``pad_hi``, the fill), a block of padding only loaded from DRAM's zeros; a
   tail block's input rows are those its valid output rows read.

The emitter's bits and cycles (the tests compare the instruction streams). Not covered
(the emitter's kernel runs): a staged row wider than the windows read (``W + pad_left``
beyond the last window: the emitter stages it whole).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from ... import te
from ...ir.errors import KilnError
from ...tir import expr as E
from ...tir.buffer import Buffer
from ...tir.function import PrimFunc
from ...tir.schedule import Schedule
from ...tir.stmt import Stmt
from ...tir.tensor_intrin.npu import SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT
from ...tir.tensor_intrin.npu_vector import VecOperand, vector_intrin, vector_value
from .emit import DramTensor, DramView, KernelBuilder, Pipeline, block, itemsize
from .feedback import lower_with_feedback
from .lowering import LoweringContext, NotSupported
from .tir_program import PIPELINE_KEY, evaluate
from .tir_vector import Staged, VectorGenerator, is_tensorized, loop_nest, pad3
from .vector import (
    POOL_TAP_OPCODES,
    emit_pool2d,
    pool2d_blocks,
    pool2d_kernel_info,
    pool_fill,
    register_pool2d_kernel,
)

__all__ = ["PoolGenerator", "PoolKernel", "emit_pool_scheduled", "pool2d_tir", "pool_prim_func",
           "schedule_pool", "scheduled_pool"]


@dataclass(frozen=True)
class PoolKernel:
    """A pooling (``kind`` ``"max"``/``"maxnm"``/``"avg"``) or depthwise (``"dw"``) kernel of NCHW
    ``x_shape`` -> ``(oh, ow)``: window, strides, padding, dilation, ``divisor`` or a
    ``scaled`` average, blocks of ``ct`` channels x ``rt`` rows, staged rows ``wp`` wide."""

    kind: str
    x_shape: tuple[int, int, int, int]
    out_hw: tuple[int, int]
    pool: tuple[int, int]
    strides: tuple[int, int]
    pad: tuple[int, int, int, int]
    dilation: tuple[int, int]
    divisor: float | None
    scaled: bool
    dtype: str
    ct: int
    rt: int
    wp: int

    @property
    def lead(self) -> tuple[int, ...]:
        """The dims outside the channel blocks: the images of a depthwise convolution (its
        channel blocks stay within one image), none for pooling (images x channels)."""
        return (self.x_shape[0],) if self.kind == "dw" else ()

    @property
    def channels(self) -> int:
        n, c = self.x_shape[:2]
        return c if self.kind == "dw" else n * c

    def rows_in(self, r: int) -> int:
        return (r - 1) * self.strides[0] + (self.pool[0] - 1) * self.dilation[0] + 1

    @property
    def taps(self) -> list[tuple[int, int]]:
        return [(a, b) for a in range(self.pool[0]) for b in range(self.pool[1])]


def pool_prim_func(k: PoolKernel) -> PrimFunc:
    """Step 1 of the module docstring."""
    n, c, h, w = k.x_shape
    oh, ow = k.out_hw
    (sh, sw), (dh, dw) = k.strides, k.dilation
    pt, pl = k.pad[0], k.pad[1]
    ch = k.channels
    cp = -(-ch // k.ct) * k.ct
    ohp = -(-oh // k.rt) * k.rt
    lead = k.lead
    nl = len(lead)
    x = te.placeholder(lead + (ch, h, w), k.dtype, name="X0")
    fill = E.make_const(k.dtype, pool_fill(k.kind))

    def padded(*i: Any) -> Any:
        cc, r, q = i[nl:]
        cond = E.logical_and(E.logical_and(cc < ch, r >= pt), E.logical_and(
            E.logical_and(r < pt + h, q >= pl), q < pl + w))
        return te.if_then_else(cond, x[(*i[:nl], cc, r - pt, q - pl)], fill)

    xp = te.compute(lead + (cp, k.rows_in(ohp), k.wp), padded, name="Xp")
    params = [x]
    wt = s_pad = None
    if k.kind == "dw":
        wts = te.placeholder((ch, len(k.taps)), k.dtype, name="W")
        params.append(wts)
        wt = te.compute((cp, len(k.taps)), lambda cc, t: te.if_then_else(
            cc < ch, wts[cc, t], E.make_const(k.dtype, 0)), name="Wp")
    if k.scaled:
        s = te.placeholder((oh, ow), k.dtype, name="S")
        params.append(s)
        s_pad = te.compute((ohp, ow), lambda i, j: te.if_then_else(
            i < oh, s[i, j], E.make_const(k.dtype, 0)), name="Sp")
    shape = lead + (cp, ohp, ow)
    prev = None
    for t, (a, b) in enumerate(k.taps):
        def value(*i: Any, a: int = a, b: int = b, t: int = t, prev: Any = prev) -> Any:
            cc, r, q = i[nl:]
            tap = xp[(*i[:nl], cc, r * sh + a * dh, q * sw + b * dw)]
            if k.kind == "dw":
                wv = wt[cc, t]  # type: ignore[index]
                if prev is None:
                    return vector_value("vmul", k.dtype, [tap, wv])
                return vector_value("vmac", k.dtype, [prev[i], tap, wv])
            if prev is None:
                return vector_value("vmov", k.dtype, [tap])
            return vector_value(POOL_TAP_OPCODES[k.kind], k.dtype, [prev[i], tap])

        prev = te.compute(shape, value, name=f"T{t}")
    if k.divisor is not None:
        last = prev
        prev = te.compute(shape, lambda *i: vector_value(
            "vmul", k.dtype, [last[i], E.make_const(k.dtype, 1.0 / k.divisor)]), name="Avg")
    elif k.scaled:
        last = prev
        prev = te.compute(shape, lambda *i: vector_value(
            "vmul", k.dtype, [last[i], s_pad[i[nl + 1], i[nl + 2]]]),  # type: ignore[index]
            name="Avg")
    final = prev
    out = te.compute(lead + (ch, oh, ow), lambda *i: final[i], name="C")
    return te.create_prim_func([*params, out])


def _stage_names(k: PoolKernel) -> list[str]:
    names = [f"T{t}" for t in range(len(k.taps))]
    return names + (["Avg"] if k.divisor is not None or k.scaled else [])


def _forms(k: PoolKernel, name: str) -> tuple[str, tuple[VecOperand, ...]]:
    sh, sw = k.strides
    tap = VecOperand(SCOPE_INPUT, index=((0, 1), (1, sh), (2, sw)))
    run = VecOperand(SCOPE_ACC)
    if name == "Avg":
        if k.divisor is not None:
            return "vmul", (run, VecOperand(None, value=1.0 / k.divisor))
        return "vmul", (run, VecOperand(SCOPE_WEIGHT, index=((1, 1), (2, 1))))
    t = int(name[1:])
    if k.kind == "dw":
        wv = VecOperand(SCOPE_WEIGHT, index=((0, 1), (-1, 0)))
        return ("vmul", (tap, wv)) if t == 0 else ("vmac", (run, tap, wv))
    if t == 0:
        return "vmov", (tap,)
    return POOL_TAP_OPCODES[k.kind], (run, tap)


def schedule_pool(func: PrimFunc, k: PoolKernel, nbuf: int) -> Schedule:
    """Step 2 of the module docstring on :func:`pool_prim_func`'s result."""
    sch = Schedule(func)
    names = _stage_names(k)
    nl = len(k.lead)
    last = sch.get_block(names[-1])
    loops = sch.get_loops(last)
    co, ci = sch.split(loops[nl], [None, k.ct])
    ro, ri = sch.split(loops[nl + 1], [None, k.rt])
    sch.reorder(*loops[:nl], co, ro, ci, ri, loops[nl + 2])
    sch.compute_inline(sch.cache_write(last, 0, SCOPE_ACC))
    sch.reverse_compute_at(sch.get_block("C"), ro)
    for name in reversed(names[:-1]):
        blk = sch.get_block(name)
        sch.compute_inline(sch.cache_write(blk, 0, SCOPE_ACC))
        sch.compute_at(blk, ro, preserve_unit_loops=True)
    for name, scope in (("Xp", SCOPE_INPUT), ("Wp", SCOPE_WEIGHT), ("Sp", SCOPE_WEIGHT)):
        if name == "Wp" and k.kind != "dw" or name == "Sp" and not k.scaled:
            continue
        blk = sch.get_block(name)
        sch.compute_inline(sch.cache_write(blk, 0, scope))
        sch.compute_at(blk, ro, preserve_unit_loops=True)
    fused = sch.fuse(*loops[:nl], co, ro)
    sch.annotate(fused, PIPELINE_KEY, nbuf)
    for name in names:
        opcode, operands = _forms(k, name)
        intrin = vector_intrin(opcode, k.dtype, k.dtype, operands)
        blk = sch.get_block(name)
        sch.tensorize(sch.get_loops(blk)[-3], intrin)
    return sch


@functools.lru_cache(maxsize=256)
def scheduled_pool(k: PoolKernel, nbuf: int) -> Schedule:
    """The scheduled PrimFunc of ``k``, kept per kernel (see
    :func:`~.tir_vector.scheduled_elementwise`)."""
    return schedule_pool(pool_prim_func(k), k, nbuf)


class PoolGenerator(VectorGenerator):
    """:class:`~.tir_vector.VectorGenerator` with the input copy as one padded DMA (module
    docstring, step 3)."""

    def __init__(self, kb: KernelBuilder, dram: dict[Buffer, Any], k: PoolKernel):
        super().__init__(kb, dram)
        self.k = k

    def step(self, body: list[Stmt]) -> None:
        core = self.blocks % self.cfg.cores
        self.blocks += 1
        p: Pipeline = self.pipes[core]
        loads, computes, stores = [], [], []
        for s in body:
            loops, realize = loop_nest(s)
            if realize is None:
                raise NotSupported("a pipelined step holds neither copies nor stages")
            if is_tensorized(realize):
                if any(evaluate(lp.extent, self.env) != 1 for lp in loops):
                    raise NotSupported(f"stage {realize.block.name_hint!r} is tensorized "
                                        "inside a loop")
                computes.append((loops, realize))
                continue
            if realize.block.name_hint.startswith("Xp"):
                loads.append(("box", self.match_copy(loops, realize, prefix=False)))
            elif realize.block.body.buffer.scope == "global":
                stores.append(self.match_copy(loops, realize))
            else:
                loads.append(("prefix", self.match_copy(loops, realize)))
        if len(stores) != 1 or not computes or not loads or loads[0][0] != "box":
            raise NotSupported("a pooling step stages its input, computes and stores")
        store = stores[0]
        valid = store.per_dim(store.valid)
        slot = p.load_slot()
        self.staged = {}
        for kind, c in loads:
            if kind == "box":
                self.load_box(core, c, slot, store, valid)
            else:
                self.load(core, c, slot)
        p.loaded()
        p.compute_begin()
        nbytes = math.prod(store.extents) * itemsize(str(store.src.dtype))
        base = p.out_slot() * nbytes
        for _, r in computes:
            dst = self.call(r).args[2].args[0].buffer
            self.staged[dst] = Staged("acc", base, store.base_s, valid)
        self.compute_and_store(core, p, computes, store, valid)

    def load_box(self, core: int, c: Any, slot: int, store: Any, valid: tuple[int, ...]
                 ) -> None:
        """The staged input block: its rows cut to what the valid output rows read in a
        tail block; the box where the data is one DMA, the rest filled; no box: zeros."""
        k = self.k
        ext = list(c.per_dim(c.extents)[-3:])
        out_full = pad3(tuple(store.per_dim(store.extents)))
        if valid[-2] < out_full[-2]:
            ext[1] = k.rows_in(valid[-2])
        if valid[-3] < out_full[-3]:
            ext[0] = valid[-3]
        isz = itemsize(str(c.dst.dtype))
        full = math.prod(c.per_dim(c.extents))
        mem = "input"
        if c.dst not in self.region:
            self.region[c.dst] = (mem, self.used.get(mem, 0), full * isz)
            self.used[mem] = self.used.get(mem, 0) + self.kb.nbuf * full * isz
            if self.used[mem] > self.cfg.memory(mem).size:
                raise NotSupported(f"{self.kb.nbuf} slots of {full * isz} B exceed {mem}")
        _, rbase, slot_bytes = self.region[c.dst]
        lead = len(c.base_d) - 3
        origin = c.base_d
        tile = Staged(mem, rbase + slot * slot_bytes, origin, (1,) * lead + tuple(ext))
        self.staged[c.dst] = tile
        dst = block(mem, tile.addr, str(c.dst.dtype), tile.dense())
        # loops of the copy over the block's last three dims, in order
        dims = [cf.index(1) for cf in c.coef_d]
        loop_ext = [ext[d - lead] if d >= lead else 1 for d in dims]
        found = self.box(c, loop_ext)
        if found is None:
            self.kb.load(core, shape=tuple(ext), dst=dst,
                         src=block("dram", 0, str(c.dst.dtype), (0, 0, 0)))
            return
        lo_l, hi_l = found
        lo, hi = [0, 0, 0], list(ext)
        for d, a, b in zip(dims, lo_l, hi_l):
            if d >= lead:
                lo[d - lead], hi[d - lead] = a, b
        # the source element at the box's first point
        point = [lo[d - lead] if d >= lead else 0 for d in dims]
        src_idx = tuple(x + sum(cf[i] * p for cf, p in zip(c.coef_s, point))
                        for i, x in enumerate(c.base_s))
        t, offset, strides = self.dram_at(c.src, src_idx)
        self.kb.load(core, shape=tuple(b - a for a, b in zip(lo, hi)), dst=dst,
                     src=t.at(offset, strides), pad_lo=tuple(lo),
                     pad_hi=tuple(e - b for e, b in zip(ext, hi)), fill=c.fill)


def emit_pool_scheduled(kb: KernelBuilder, func: PrimFunc, k: PoolKernel,
                        dram: dict[str, DramTensor | DramView]) -> None:
    """Emit scheduled pooling PrimFunc ``func`` into ``kb``'s streams (module docstring)."""
    by_buffer = {}
    for buf in func.buffer_map.values():
        if buf.name not in dram:
            raise KilnError(f"NPU pooling generator: no DRAM tensor for {buf.name!r}")
        by_buffer[buf] = dram[buf.name]
    gen = PoolGenerator(kb, by_buffer, k)
    gen.walk(func.body)
    gen.finish()


@register_pool2d_kernel("tir")
def pool2d_tir(ctx: LoweringContext, op: str, x: DramTensor, out: DramTensor, kind: str,
               pool: tuple[int, int], strides: tuple[int, int],
               pad: tuple[int, int, int, int], dilation: tuple[int, int],
               divisor: float | None, weights: DramTensor | None = None,
               scale: DramTensor | None = None) -> None:
    """The TIR route's pooling and depthwise kernels (the signature of
    :func:`~.vector.emit_pool2d`); a staged row wider than the windows read is emitted."""
    kb = ctx.kb
    n, c, h, w = x.shape
    oh, ow = out.shape[2:]
    blocks = pool2d_blocks(ctx.config, kb.nbuf, x.shape, out.shape, x.dtype, pool, strides,
                           pad, dilation, weights is not None, scale is not None)
    wp = blocks[0][2]
    if wp != (ow - 1) * strides[1] + (pool[1] - 1) * dilation[1] + 1:
        return emit_pool2d(ctx, op, x, out, kind, pool, strides, pad, dilation, divisor,
                           weights, scale)

    def attempt(blk: tuple[int, int, int]) -> None:
        ct, rt, _ = blk
        k = PoolKernel("dw" if weights is not None else kind, tuple(x.shape), (oh, ow),
                       tuple(pool), tuple(strides), tuple(pad), tuple(dilation), divisor,
                       scale is not None, x.dtype, ct, rt, wp)
        sch = scheduled_pool(k, kb.nbuf)
        if weights is not None:
            dram: dict[str, Any] = {
                "X0": DramView(x, 0, (n, c, h, w), (c * h * w, h * w, w, 1)),
                "C": DramView(out, 0, (n, c, oh, ow), (c * oh * ow, oh * ow, ow, 1)),
                "W": DramView(weights, 0, (c, len(k.taps)), (len(k.taps), 1))}
        else:
            dram = {"X0": DramView(x, 0, (n * c, h, w), (h * w, w, 1)),
                    "C": DramView(out, 0, (n * c, oh, ow), (oh * ow, ow, 1))}
            if scale is not None:
                dram["S"] = DramView(scale, 0, (oh, ow), (ow, 1))
        emit_pool_scheduled(kb, sch.func, k, dram)
        kb.end_kernel(pool2d_kernel_info(ctx, op, x, out, len(k.taps), weights is not None,
                                         ct, rt, "TIR: "))
        ctx.tir.append((op, sch))

    # a block the program generator refuses (its slots as scheduled) takes the next one
    lower_with_feedback(ctx, op, blocks, attempt,
                        lambda blk: f"TIR: {blk[0]} channels x {blk[1]} rows")
