"""``matmul_packed``: a matrix product whose right operand is packed in column panels.

``matmul_packed(a, bp)`` computes ``a @ b`` with ``b [..., K, N]`` stored as
``bp [..., N / nb, K, nb]`` (layout ``"KN" -> "NK{nb}n"``): the ``nb`` columns that one register
tile of the product needs are contiguous for every ``k``, so the inner loop streams through
memory instead of striding by a row of ``b`` (with ``N`` a power of two that stride also maps
every row to the same cache set). It is what ``matmul`` and ``dense`` become on CPUs through
their layout hooks (AlterOpLayout, opt level 2): a constant weight is packed once at compile
time; a computed operand gets a ``layout_transform`` (one pass over ``b``, O(K*N) against the
product's O(M*K*N)). Its CPU schedule, a register-blocked GEMM micro-kernel, and the hooks are
in ``kiln/schedule/cpu/matmul_packed.py``.

``matmul_vnni(a, bp)`` is the AMX form: bfloat16 (int8) operands with ``b`` in the VNNI layout
``[K / P, N, P]`` (``"KN" -> "KN{P}k"``, P = 2 for bfloat16, 4 for int8) that the tile
instructions read, accumulated in float32 (int32); its CPU schedule tensorizes the product
onto 16x16 AMX tiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import te, tir
from ..graph.struct_info import TensorStructInfo
from ..ir.dtype import as_dtype
from ..ir.errors import StructInfoError
from .linalg import (
    attr_out_dtype,
    batch_index,
    broadcast_batch,
    fmt_dim,
    fmt_shape,
    matmul_assumptions,
    norm_dtype,
    provably_unequal,
    result_dtype,
    simplify,
    tensor_arg,
)
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["matmul_packed", "matmul_vnni"]


@dataclass(frozen=True)
class MatmulPackedAttrs:
    """``out_dtype``: dtype of the result and of the accumulation (None: the inputs' dtype)."""

    out_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "out_dtype", norm_dtype(self.out_dtype, "matmul_packed"))


def _infer(call: Any) -> Any:
    op = "matmul_packed"
    a = tensor_arg(call, 0, op, "a")
    bp = tensor_arg(call, 1, op, "bp")
    dtype = result_dtype(op, attr_out_dtype(call), ("a", a), ("bp", bp))
    if 0 <= a.ndim < 2 or 0 <= bp.ndim < 3:
        raise StructInfoError(
            f"{op}: a must have at least 2 dimensions and bp (packed [..., N/nb, K, nb]) at least "
            f"3; got {a.ndim} and {bp.ndim}"
        )
    if a.shape is None or bp.shape is None:
        if a.ndim < 0 or bp.ndim < 0:
            return TensorStructInfo(None, dtype)
        return TensorStructInfo(None, dtype, max(a.ndim - 2, bp.ndim - 3) + 2)
    if provably_unequal(a.shape[-1], bp.shape[-2]):
        raise StructInfoError(
            f"{op}: a {fmt_shape(a.shape)} has {fmt_dim(a.shape[-1])} columns but bp "
            f"{fmt_shape(bp.shape)} packs {fmt_dim(bp.shape[-2])} rows"
        )
    batch = broadcast_batch(op, tuple(a.shape[:-2]), tuple(bp.shape[:-3]))
    return TensorStructInfo(batch + (a.shape[-2], simplify(bp.shape[-3] * bp.shape[-1])), dtype)


def _compute(a: Any, bp: Any, *, attrs: MatmulPackedAttrs) -> Any:
    """``out[..., i, j] = sum_k a[..., i, k] * bp[..., j // nb, k, j % nb]``."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else a.dtype
    a_batch, b_batch = tuple(a.shape[:-2]), tuple(bp.shape[:-3])
    batch = broadcast_batch("matmul_packed", a_batch, b_batch)
    nb = bp.shape[-1]
    k = te.reduce_axis((0, a.shape[-1]), name="k")
    nbatch = len(batch)

    def body(*idx):
        bidx, i, j = idx[:nbatch], idx[nbatch], idx[nbatch + 1]
        av = a[tuple(batch_index(a_batch, batch, bidx)) + (i, k)]
        bv = bp[tuple(batch_index(b_batch, batch, bidx)) + (j // nb, k, j % nb)]
        return te.sum(tir.cast(out_dtype, av) * tir.cast(out_dtype, bv), axis=k)

    shape = batch + (a.shape[-2], simplify(bp.shape[-3] * nb))
    return te.compute(shape, body, name="matmul_packed",
                      attrs=matmul_assumptions("matmul_packed", a.shape[-1], bp.shape[-2],
                                               a_batch, b_batch, batch))


matmul_packed = register_op(
    "matmul_packed",
    inputs=("a", "bp"),
    attrs=MatmulPackedAttrs,
    infer=_infer,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_compute,
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=NON_DIFFERENTIABLE,
    doc="``a @ b`` with ``b [..., K, N]`` packed as ``bp [..., N/nb, K, nb]`` (layout "
    "``NK{nb}n``); batch dimensions broadcast. Made by AlterOpLayout from matmul/dense on CPUs.",
)


# ---------------------------------------------------------------------------------------------
# matmul_vnni: the AMX tile form
# ---------------------------------------------------------------------------------------------
def _infer_vnni(call: Any) -> Any:
    op = "matmul_vnni"
    a = tensor_arg(call, 0, op, "a", ndim=2)
    bp = tensor_arg(call, 1, op, "bp", ndim=3)
    dtype = result_dtype(op, attr_out_dtype(call), ("a", a), ("bp", bp))
    if a.shape is None or bp.shape is None:
        return TensorStructInfo(None, dtype, 2)
    k = simplify(bp.shape[0] * bp.shape[2])
    if provably_unequal(a.shape[1], k):
        raise StructInfoError(
            f"{op}: a {fmt_shape(a.shape)} has {fmt_dim(a.shape[1])} columns but bp "
            f"{fmt_shape(bp.shape)} (VNNI [K/P, N, P]) packs {fmt_dim(k)} rows"
        )
    return TensorStructInfo((a.shape[0], bp.shape[1]), dtype)


def _compute_vnni(a: Any, bp: Any, *, attrs: MatmulPackedAttrs) -> Any:
    """``out[i, j] = sum_k acc(a[i, k]) * acc(bp[k // P, j, k % P])``."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else a.dtype
    pack = bp.shape[2]
    k = te.reduce_axis((0, a.shape[1]), name="k")
    return te.compute(
        (a.shape[0], bp.shape[1]),
        lambda i, j: te.sum(tir.cast(out_dtype, a[i, k])
                            * tir.cast(out_dtype, bp[k // pack, j, k % pack]), axis=k),
        name="matmul_vnni",
        attrs=matmul_assumptions("matmul_vnni", a.shape[1], simplify(bp.shape[0] * pack)))


matmul_vnni = register_op(
    "matmul_vnni",
    inputs=("a", "bp"),
    attrs=MatmulPackedAttrs,
    infer=_infer_vnni,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_compute_vnni,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="``a @ b`` for bfloat16/int8 ``a [M, K]`` with ``b`` in the VNNI layout ``[K/P, N, P]`` "
    "(P = 2 for bfloat16, 4 for int8), accumulated in ``out_dtype``: AMX tiles on targets "
    "with AMX. Made by AlterOpLayout from matmul/dense.",
)
