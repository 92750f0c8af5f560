"""Matrix products on the NPU through TIR: a TE PrimFunc scheduled VTA-style, then generated.

The route (PassContext option ``"npu.lowering": "tir"``, the default; ``"emit"`` emits every
op directly) for ``dense`` and ``matmul`` (2-D weights, constant or computed at run time; a
batched left operand; both operands batched alike) and pointwise ``nn.conv2d`` (1x1, stride 1,
no padding: ``W @ X`` per image); the other convolutions but depthwise ones go through
:mod:`.tir_conv` (:func:`lower_conv2d_tir`), broadcast batch dims stay with the emitter:

1. :func:`gemm_prim_func`: ``C[b, i, j] = sum_k cast(acc, A[b, i, k]) * cast(acc, B[b, k,
   j])`` over the operands padded with zeros to whole tiles (``A_pad``/``B_pad``, ``select``
   of the operand or 0), computed into ``C_acc`` and cropped into ``C``: the padding makes the
   tail tiles full, so that the inner tile has constant extents and tensorizes.
2. :func:`schedule_gemm`: ``M``, ``N``, ``K`` split by the tiling
   :func:`~.gemm.plan_gemm` chooses (its cost model, the same one the emitter uses), loops
   ``b, i_0, j_0, k_0 | i_1, j_1, k_1``; ``cache_write`` of the product into ``npu.l0.acc``
   (the crop reads it directly, under ``j_0``: the store of each output tile);
   ``cache_read`` of ``A_pad``/``B_pad`` into ``npu.l0.input``/``npu.l0.weight`` at ``k_0``
   with the padding inlined into the copy (a DMA with a padded tail); ``k_0`` annotated
   ``software_pipeline = nbuf``; the ``i_1`` tile tensorized onto ``npu.mma``; the copy of an
   operand whose tiles stay on their core (:func:`~.gemm.held_tiles`) annotated ``npu.held``.
3. :func:`~.tir_program.emit_scheduled` turns the scheduled PrimFunc into instructions.

The tiling is the emitter's (:func:`plan_gemm_problem`), so outputs are the emitter's bits; the
program follows :func:`~.gemm.emit_gemm`'s pipeline (held tiles, no reload of what a slot
holds, split stores, the last tile's product in pieces) but does not split leftover tiles over
the cores: the same cycles within a percent (the tests check it).
``kiln show --target npu --stage scheduled`` prints the scheduled PrimFuncs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import te
from ...tir.expr import cast, logical_and, make_const
from ...tir.function import PrimFunc
from ...tir.schedule import Schedule
from ...tir.tensor_intrin.npu import (
    mma_intrin_name,
    register_npu_intrinsics,
)
from .emit import DramTensor, DramView
from .feedback import lower_with_feedback
from .gemm import (
    GemmShape,
    GemmTiling,
    gemm_kernel_info,
    held_tiles,
    kernel_acc_slots,
    plan_candidates,
    store_floor,
)
from .lowering import LoweringContext, NotSupported, register_tir_lowering
from .ops import (
    grouped_conv,
    is_depthwise,
    is_pointwise,
    lower_conv2d,
    lower_dense,
    lower_matmul,
    operand_dtype,
)
from .tir_conv import lower_conv_tir
from .tir_product import annotate_pipeline, tile_product
from .tir_program import emit_scheduled
from .vector import cast_kernel

__all__ = ["GemmProblem", "gemm_prim_func", "plan_gemm_candidates", "plan_gemm_problem",
           "schedule_gemm", "scheduled_gemm"]


class GemmProblem:
    """``batch`` products ``[M, K] @ [K, N]`` of operand dtype ``dtype`` into ``acc``, with
    the DRAM tensors (or strided views) of ``A [batch, M, K]``, ``B [batch, K, N]`` and
    ``C [batch, M, N]``."""

    def __init__(self, batch: int, m: int, n: int, k: int, dtype: str, acc: str,
                 a: Any = None, b: Any = None, c: Any = None, b_shared: bool = True,
                 a_shared: bool = False):
        self.batch, self.m, self.n, self.k = batch, m, n, k
        self.dtype, self.acc = dtype, acc
        self.a, self.b, self.c = a, b, c
        self.b_shared, self.a_shared = b_shared, a_shared

    @property
    def shape(self) -> GemmShape:
        """The planner's view (rows and columns as units of one)."""
        return GemmShape(self.batch, self.m, 1, self.n, self.k, 1, self.dtype,
                         b_shared=self.b_shared, a_shared=self.a_shared)


def gemm_prim_func(p: GemmProblem, tile: tuple[int, int, int]) -> PrimFunc:
    """The padded product (step 1 of the module docstring) for tiles ``(mt, nt, kt)``."""
    mt, nt, kt = tile
    mp, np_, kp = (-(-p.m // mt) * mt, -(-p.n // nt) * nt, -(-p.k // kt) * kt)
    a = te.placeholder((p.batch, p.m, p.k), p.dtype, name="A")
    b = te.placeholder((p.batch, p.k, p.n), p.dtype, name="B")
    zero = make_const(p.dtype, 0)
    a_pad = te.compute((p.batch, mp, kp), lambda s, i, k: te.if_then_else(
        logical_and(i < p.m, k < p.k), a[s, i, k], zero), name="A_pad")
    b_pad = te.compute((p.batch, kp, np_), lambda s, k, j: te.if_then_else(
        logical_and(k < p.k, j < p.n), b[s, k, j], zero), name="B_pad")
    r = te.reduce_axis((0, kp), name="k")
    c_acc = te.compute((p.batch, mp, np_), lambda s, i, j: te.sum(
        cast(p.acc, a_pad[s, i, r]) * cast(p.acc, b_pad[s, r, j]), axis=r), name="C_acc")
    c = te.compute((p.batch, p.m, p.n), lambda s, i, j: c_acc[s, i, j], name="C")
    return te.create_prim_func([a, b, c])


def schedule_gemm(func: PrimFunc, tile: tuple[int, int, int], nbuf: int,
                  intrin: str, held: tuple[bool, bool] = (False, False),
                  out_slots: int = 0, floor: int = 0) -> Schedule:
    """Step 2 of the module docstring on ``gemm_prim_func``'s result; ``held``: A's, B's
    tiles stay on their core (:func:`~.gemm.held_tiles`), their copies are marked so;
    ``out_slots``: accumulator slots of the output tiles (:func:`~.gemm.acc_slots`; 0: the
    pipeline's ``nbuf``); ``floor``: the smallest store piece (:func:`~.gemm.store_floor`)."""
    sch = Schedule(func)
    k0, i1, a_l0, b_l0 = tile_product(sch, tile, "C")
    sch.compute_inline(sch.get_block("A_pad"))
    sch.compute_inline(sch.get_block("B_pad"))
    annotate_pipeline(sch, k0, (a_l0, b_l0), held, nbuf, out_slots, floor)
    sch.tensorize(i1, intrin)
    return sch


def plan_gemm_problem(ctx: LoweringContext, op: str, p: GemmProblem) -> GemmTiling:
    """The emitter's tiling of ``p`` (the same planner, cost model and tuning knob: the same
    K steps, so the same order of additions and the same bits), a tile that stays on its core
    held in one copy per K step as the emitter holds it (:func:`~.gemm.held_tiles`)."""
    return plan_gemm_candidates(ctx, op, p)[0]


def plan_gemm_candidates(ctx: LoweringContext, op: str, p: GemmProblem) -> list[GemmTiling]:
    """:func:`plan_gemm_problem`'s tiling, then the planner's next candidates (what
    :func:`~.feedback.lower_with_feedback` retries)."""
    try:
        return plan_candidates(ctx.config, p.shape, ctx.kb.nbuf, context=ctx.kb.knob_context())
    except ValueError as err:
        raise NotSupported(f"{op}: {err}") from None


def _lower_first(ctx: LoweringContext, op: str, p: GemmProblem, tilings: list[GemmTiling],
                 form: str = "") -> None:
    """:func:`_lower` with the first of ``tilings`` the later checks accept (feedback)."""
    lower_with_feedback(ctx, op, tilings, lambda t: _lower(ctx, op, p, t, form),
                        lambda t: t.describe(p.shape))


def scheduled_gemm(ctx: LoweringContext, p: GemmProblem, tiling: GemmTiling) -> Schedule:
    """The scheduled PrimFunc of ``p`` under ``tiling`` (the tensor intrinsics of the
    context's description registered first)."""
    register_npu_intrinsics(ctx.config)
    tile = (tiling.m_units, tiling.n, tiling.k_units)
    func = gemm_prim_func(p, tile)
    cfg, nbuf = ctx.config, ctx.kb.nbuf
    return schedule_gemm(func, tile, nbuf, mma_intrin_name(p.dtype, p.dtype, p.acc),
                         held_tiles(cfg, p.shape, tiling, nbuf),
                         kernel_acc_slots(ctx.kb, p.shape, tiling),
                         store_floor(cfg, p.shape, tiling, nbuf))


def _lower(ctx: LoweringContext, op: str, p: GemmProblem, tiling: GemmTiling,
           form: str = "") -> None:
    sch = scheduled_gemm(ctx, p, tiling)
    emit_scheduled(ctx.kb, sch.func, {"A": p.a, "B": p.b, "C": p.c}, p.shape)
    ctx.kb.end_kernel(gemm_kernel_info(ctx.config, ctx.label(op), op,
                                       "TIR: " + form + tiling.describe(p.shape),
                                       tiling.estimate, p.shape, tiling.knob,
                                       constant_a=ctx.is_constant(p.a),
                                       constant_b=ctx.is_constant(p.b),
                                       c_itemsize=ctx.kb.result_itemsize(p.c.dtype)))
    ctx.tir.append((op, sch))


def _activation(ctx: LoweringContext, x: Any, dt: str, op: str) -> DramTensor:
    if isinstance(x, np.ndarray):
        return ctx.constant(x, dt)
    return x if x.dtype == dt else cast_kernel(ctx, x, dt, f"{op}.cast")


def _dtype_of(x: Any) -> str:
    return x.dtype if isinstance(x, DramTensor) else str(x.dtype)


def _gemm(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor, op: str,
          w_is_nk: bool) -> bool:
    """Lower through TIR; False when the route does not cover the call (the emitter's
    lowering runs instead)."""
    x, w = args[0], args[1]
    if len(getattr(x, "shape", ())) < 2:
        return False
    dt = operand_dtype(ctx, op, _dtype_of(x), _dtype_of(w), out.dtype)
    acc = str(ctx.config.tensor_dtype(dt, dt).acc)
    if len(w.shape) == 2:
        k = w.shape[1] if w_is_nk else w.shape[0]
        n = w.shape[0] if w_is_nk else w.shape[1]
        m = int(np.prod(out.shape[:-1], dtype=np.int64))
        p = GemmProblem(1, m, n, k, dt, acc)
        tilings = plan_gemm_candidates(ctx, op, p)
        xa = _activation(ctx, x, dt, op)
        p.a = DramView(xa, 0, (1, m, k), (0, k, 1))
        if isinstance(w, np.ndarray):
            wt = ctx.constant(np.ascontiguousarray(w.T if w_is_nk else w), dt)  # [K, N]
            p.b = DramView(wt, 0, (1, k, n), (0, n, 1))
        else:
            wt = _activation(ctx, w, dt, op)
            p.b = DramView(wt, 0, (1, k, n), (0, 1, k) if w_is_nk else (0, n, 1))
        p.c = DramView(out, 0, (1, m, n), (0, n, 1))
        _lower_first(ctx, op, p, tilings)
        return True
    batch = tuple(out.shape[:-2])
    if w_is_nk or tuple(x.shape[:-2]) != batch or tuple(w.shape[:-2]) != batch:
        return False  # broadcast batch dims: the emitter's per-entry offsets
    nb = int(np.prod(batch, dtype=np.int64))
    m, k, n = x.shape[-2], x.shape[-1], w.shape[-1]
    p = GemmProblem(nb, m, n, k, dt, acc, b_shared=False)
    tilings = plan_gemm_candidates(ctx, op, p)
    xa, wa = _activation(ctx, x, dt, op), _activation(ctx, w, dt, op)
    p.a = DramView(xa, 0, (nb, m, k), (m * k, k, 1))
    p.b = DramView(wa, 0, (nb, k, n), (k * n, n, 1))
    p.c = DramView(out, 0, (nb, m, n), (m * n, n, 1))
    _lower_first(ctx, op, p, tilings)
    return True


def _pointwise(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> bool:
    """A 1x1 stride-1 unpadded ungrouped convolution through :func:`_pointwise_gemm`; False
    for any other convolution."""
    at = call.attrs
    x, w = args
    if at.data_layout != "NCHW" or at.kernel_layout != "OIHW" or at.groups != 1 or \
            not isinstance(w, np.ndarray) or not is_pointwise(at, w.shape):
        return False
    dt = operand_dtype(ctx, "nn.conv2d", _dtype_of(x), str(w.dtype), out.dtype)
    _pointwise_gemm(ctx, x, w, out, dt)
    return True


def _pointwise_gemm(ctx: LoweringContext, x: Any, w: np.ndarray, out: DramTensor,
                    dt: str) -> None:
    """A pointwise convolution as ``out[n] = W @ X[n]`` per image (weights ``[O, C]`` shared
    by the batch as A, the image's channel planes ``[C, H*W]`` as B, NCHW's output as C:
    contiguous in DRAM, as the emitter's form)."""
    acc = str(ctx.config.tensor_dtype(dt, dt).acc)
    nb, c, h, wd = x.shape
    o, hw = w.shape[0], h * wd
    p = GemmProblem(nb, o, hw, c, dt, acc, b_shared=False, a_shared=True)
    tilings = plan_gemm_candidates(ctx, "nn.conv2d", p)
    xa = _activation(ctx, x, dt, "nn.conv2d")
    wc = ctx.constant(np.ascontiguousarray(w.reshape(o, c)), dt)
    p.a = DramView(wc, 0, (nb, o, c), (0, c, 1))
    p.b = DramView(xa, 0, (nb, c, hw), (c * hw, hw, 1))
    p.c = DramView(out, 0, (nb, o, hw), (o * hw, hw, 1))
    _lower_first(ctx, "nn.conv2d", p, tilings, "1x1 as W @ X: ")


@register_tir_lowering("nn.conv2d")
def lower_conv2d_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                     ) -> None:
    """Convolutions through TIR: a pointwise one as ``W @ X`` per image, any other NCHW/OIHW
    one with constant weights as the implicit GEMM of :mod:`.tir_conv` (L1 staging with the
    window's padding, per-tap gathers), a grouped one as one such kernel per (image, group).
    Depthwise convolutions (the vector unit's taps, or the tensor unit's block-diagonal or
    banded products: :func:`~.ops.depthwise_route`) and other layouts or run-time weights
    stay with the emitter's :func:`~.ops.lower_conv2d`."""
    if _pointwise(ctx, call, args, out):
        return
    at = call.attrs
    x, w = args
    if at.data_layout != "NCHW" or at.kernel_layout != "OIHW" or \
            not isinstance(w, np.ndarray) or \
            (at.groups != 1 and is_depthwise(at.groups, x.shape, w.shape)):
        return lower_conv2d(ctx, call, args, out)
    dt = operand_dtype(ctx, "nn.conv2d", _dtype_of(x), str(w.dtype), out.dtype)
    if at.groups != 1:
        return grouped_conv(ctx, at, x, w, out, dt, _conv_tir)
    _conv_tir(ctx, at, x, w, out, dt)


def _conv_tir(ctx: LoweringContext, at: Any, x: Any, w: np.ndarray, out: DramTensor,
              dt: str) -> None:
    """One ungrouped convolution: a pointwise one (a group's) as ``W @ X``, another through
    :func:`~.tir_conv.lower_conv_tir`."""
    if is_pointwise(at, w.shape):
        _pointwise_gemm(ctx, x, w, out, dt)
        return
    lower_conv_tir(ctx, at, x, w, out, dt)


@register_tir_lowering("dense")
def lower_dense_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor) -> None:
    if not _gemm(ctx, call, args, out, "dense", w_is_nk=True):
        lower_dense(ctx, call, args, out)


@register_tir_lowering("matmul")
def lower_matmul_tir(ctx: LoweringContext, call: Any, args: list[Any], out: DramTensor
                     ) -> None:
    if not _gemm(ctx, call, args, out, "matmul", w_is_nk=False):
        lower_matmul(ctx, call, args, out)
