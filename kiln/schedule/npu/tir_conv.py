"""Convolutions on the NPU through TIR: the implicit GEMM as a TE PrimFunc, scheduled into the
NPU's scopes (L1 staging, L0 gather, weights, accumulators), tensorized, then generated.

The TIR route (:mod:`.tir_gemm`'s ``lower_conv2d_tir``) takes every NCHW/OIHW convolution with
constant weights that is neither pointwise (``W @ X`` per image, :mod:`.tir_gemm`) nor
depthwise (the vector unit's): 3x3, 7x7/2 stems, strided 1x1 shortcuts, padding, dilation;
a grouped one as one such kernel per (image, group), as the emitter does.

1. :func:`conv_prim_func`: the staged image ``X_l1[b, q, p, c]`` (staged row ``q`` is image
   row ``q * rstep - pt``, pixel ``p`` column ``p - pl``; zero outside the image: the
   window's padding, channels innermost -- the emitter's L1 layout), the im2col operand
   ``A[b, i, kk]`` (``i`` = output pixel ``r * ow + x``; ``kk`` = K in the emitter's order:
   channel blocks of the tiling's ``ku``, in each the taps, in each the block's channels --
   a last block of fewer channels packs its taps as densely as the emitter's last K step),
   the weights ``B[kk, j]`` of ``W [taps, C, O]`` in the same order, the product ``C_acc``
   over both padded to whole tiles, and ``Y[b, o, i]``, the NCHW output.
2. :func:`schedule_conv`: ``M``, ``N``, ``K`` split by the emitter's tiling (the planner on
   the one :class:`~.ops.ConvGeometry` both routes build), ``cache_write`` of the product into
   ``npu.l0.acc`` stored under ``j_0``; ``cache_read`` of ``A`` into ``npu.l0.input`` and of
   ``B`` into ``npu.l0.weight`` at ``k_0`` (the gather copy and the weight copy); the gather's
   source ``cache_read`` into ``npu.l1`` (the staging copy, the padding inlined into it),
   marked :data:`~.tir_program.STAGE_KEY`: the generator stages, per pipeline step, the rows
   the step's gather reads (the region is not affine in the loops, so ``compute_at`` cannot
   place it); ``k_0`` annotated with the pipeline's slots, the accumulator slots, whether
   leftover tiles are split over the cores; the ``i_1`` tile tensorized onto ``npu.mma``.
3. :func:`~.tir_program.emit_scheduled_conv` generates the program.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ... import te
from ...tir.expr import cast, logical_and, make_const
from ...tir.function import PrimFunc
from ...tir.schedule import Schedule
from ...tir.tensor_intrin.npu import (
    SCOPE_L1,
    mma_intrin_name,
    register_npu_intrinsics,
)
from .emit import DramTensor, DramView
from .feedback import lower_with_feedback
from .gemm import (
    GemmTiling,
    gemm_kernel_info,
    held_tiles,
    kernel_acc_slots,
    plan_candidates,
    store_floor,
)
from .lowering import LoweringContext, NotSupported
from .ops import (
    ConvGeometry,
    conv_weight_layout,
    planned_geometry,
)
from .tir_product import annotate_pipeline, tile_product
from .tir_program import (
    BALANCE_KEY,
    STAGE_KEY,
    emit_scheduled_conv,
)
from .vector import cast_kernel

__all__ = ["conv_prim_func", "lower_conv_tir", "schedule_conv", "scheduled_conv"]


def conv_prim_func(geo: ConvGeometry, tiling: GemmTiling, acc: str) -> PrimFunc:
    """Step 1 of the module docstring for ``geo`` under ``tiling`` (whose ``k_units`` fixes
    the K order), accumulating in ``acc``."""
    dt, shape = geo.shape.dtype, geo.shape
    nb, c, h, w, o = geo.nb, geo.c, geo.h, geo.w, geo.o
    kw, taps, ow, rstep = geo.kw, geo.taps, geo.ow, geo.rstep
    ss, dh = geo.sh // rstep, geo.dh // rstep  # staged rows per output row, per kernel row
    hq = shape.stage_rows(geo.oh)  # staged rows of the whole image
    m = geo.oh * ow
    mt, nt = tiling.m_units * ow, tiling.n
    ku = tiling.k_units
    kt = ku * taps
    nk = -(-c // ku)
    rest = c - (nk - 1) * ku  # channels of the last K step
    mp, np_, kp = -(-m // mt) * mt, -(-geo.o // nt) * nt, nk * kt
    x = te.placeholder((nb, c, h, w), dt, name="X")
    wt = te.placeholder((taps, c, o), dt, name="W")
    zero = make_const(dt, 0)

    def inside(v: Any, lo: int, n: int) -> Any:
        return logical_and(v >= lo, v < lo + n)

    xs = te.compute((nb, hq, geo.width, c), lambda b, q, p, ch: te.if_then_else(
        logical_and(inside(q * rstep, geo.pt, h), inside(p, geo.pl, w)),
        x[b, ch, q * rstep - geo.pt, p - geo.pl], zero), name="X_l1")

    def k_order(kk: Any) -> tuple[Any, Any, Any]:
        """(tap, channel, valid) of K index ``kk``: block ``kk // kt`` of ``ku`` channels
        (``rest`` in the last), tap-major inside it."""
        blk, pos = kk // kt, kk % kt
        width = ku if rest == ku else te.if_then_else(
            blk >= nk - 1, make_const(kk.dtype, rest), make_const(kk.dtype, ku))
        return pos // width, blk * ku + pos % width, pos < width * taps

    def a_fn(b: Any, i: Any, kk: Any) -> Any:
        t, ch, ok = k_order(kk)
        return te.if_then_else(logical_and(i < m, ok), xs[
            b, (i // ow) * ss + (t // kw) * dh, (i % ow) * geo.sw + (t % kw) * geo.dw, ch], zero)

    def b_fn(kk: Any, j: Any) -> Any:
        t, ch, ok = k_order(kk)
        return te.if_then_else(logical_and(ok, j < o), wt[t, ch, j], zero)

    a = te.compute((nb, mp, kp), a_fn, name="A")
    bm = te.compute((kp, np_), b_fn, name="B")
    r = te.reduce_axis((0, kp), name="k")
    c_acc = te.compute((nb, mp, np_), lambda b, i, j: te.sum(
        cast(acc, a[b, i, r]) * cast(acc, bm[r, j]), axis=r), name="C_acc")
    y = te.compute((nb, o, m), lambda b, j, i: c_acc[b, i, j], name="Y")
    return te.create_prim_func([x, wt, y])


def schedule_conv(func: PrimFunc, geo: ConvGeometry, tiling: GemmTiling, nbuf: int,
                  intrin: str, held: tuple[bool, bool] = (False, False), out_slots: int = 0,
                  floor: int = 0) -> Schedule:
    """Step 2 of the module docstring on :func:`conv_prim_func`'s result (``held``,
    ``out_slots``, ``floor`` as for :func:`~.tir_gemm.schedule_gemm`)."""
    sch = Schedule(func)
    k0, i1, a_l0, b_l0 = tile_product(
        sch, (tiling.m_units * geo.ow, tiling.n, tiling.k_units * geo.taps), "Y")
    sch.compute_inline(sch.get_block("A"))
    sch.compute_inline(sch.get_block("B"))
    x_l1 = sch.cache_read(a_l0, 0, SCOPE_L1)
    sch.compute_inline(sch.get_block("X_l1"))
    sch.annotate(x_l1, STAGE_KEY, True)
    annotate_pipeline(sch, k0, (a_l0, b_l0), held, nbuf, out_slots, floor)
    sch.annotate(k0, BALANCE_KEY, bool(tiling.balance))
    sch.tensorize(i1, intrin)
    return sch


def scheduled_conv(ctx: LoweringContext, geo: ConvGeometry, tiling: GemmTiling) -> Schedule:
    """The scheduled PrimFunc of ``geo`` under ``tiling`` (the description's tensor
    intrinsics registered first); a copy of the one :func:`_schedule` keeps for these
    arguments."""
    register_npu_intrinsics(ctx.config)
    cfg, nbuf, shape = ctx.config, ctx.kb.nbuf, geo.shape
    td = cfg.tensor_dtype(shape.dtype, shape.dtype)
    acc = str(td.acc)
    return _schedule(geo, tiling, acc, nbuf, mma_intrin_name(shape.dtype, shape.dtype, acc),
                     held_tiles(cfg, shape, tiling, nbuf),
                     kernel_acc_slots(ctx.kb, shape, tiling),
                     store_floor(cfg, shape, tiling, nbuf)).copy()


@functools.lru_cache(maxsize=256)
def _schedule(geo: ConvGeometry, tiling: GemmTiling, acc: str, nbuf: int, intrin: str,
              held: tuple[bool, bool], out_slots: int, floor: int) -> Schedule:
    """:func:`schedule_conv` of :func:`conv_prim_func`, kept per arguments (all of what the
    schedule depends on): a build lowers each convolution three times (AnnotateTarget's and
    AnnotateMemoryScope's probes, then the kernel) and ResNet-18 repeats its shapes -- the
    scheduling was half the TIR route's lowering time. Callers get a copy."""
    return schedule_conv(conv_prim_func(geo, tiling, acc), geo, tiling, nbuf, intrin, held,
                         out_slots, floor)


def lower_conv_tir(ctx: LoweringContext, at: Any, x: Any, w: np.ndarray, out: DramTensor,
                   dt: str) -> None:
    """One ungrouped, not pointwise convolution through TIR (an :data:`~.ops.ConvFn`): the
    emitter's geometry and tiling, the scheduled PrimFunc, its program."""
    geo = planned_geometry(ctx, at, x, w.shape, out.shape, dt)
    try:
        tilings = plan_candidates(ctx.config, geo.shape, ctx.kb.nbuf,
                                  context=ctx.kb.knob_context())
    except ValueError as err:
        raise NotSupported(f"nn.conv2d: {err}") from None

    def attempt(tiling: GemmTiling) -> None:
        sch = scheduled_conv(ctx, geo, tiling)
        xa = x if isinstance(x, DramTensor) and x.dtype == dt else (
            ctx.constant(x, dt) if isinstance(x, np.ndarray) else cast_kernel(
                ctx, x, dt, "nn.conv2d.cast"))
        wl = ctx.constant(conv_weight_layout(w), dt)
        m = geo.oh * geo.ow
        dram = {"X": xa, "W": wl,
                "Y": DramView(out, 0, (geo.nb, geo.o, m), (geo.o * m, m, 1))}
        got = emit_scheduled_conv(ctx, sch.func, dram, geo)
        ctx.kb.end_kernel(gemm_kernel_info(ctx.config, ctx.label("nn.conv2d"), "nn.conv2d",
                                           "TIR: " + got.describe(geo.shape), got.estimate,
                                           geo.shape, tiling.knob, constant_b=True,
                                           c_itemsize=ctx.kb.result_itemsize(out.dtype)))
        ctx.tir.append(("nn.conv2d", sch))

    lower_with_feedback(ctx, "nn.conv2d", tilings, attempt, lambda t: t.describe(geo.shape))
