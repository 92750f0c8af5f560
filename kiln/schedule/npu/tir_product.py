"""The loop structure of a product on the NPU, shared by the TIR route's GEMM (:mod:`.tir_gemm`)
and its implicit-GEMM convolution (:mod:`.tir_conv`): both compute ``C_acc[b, i, j] = sum_k
A[b, i, k] * B[k, j]`` over operands padded to whole tiles and differ only in what ``A``, ``B``
and the crop read and write."""

from __future__ import annotations

from typing import Any

from ...tir.schedule import Schedule
from ...tir.tensor_intrin.npu import SCOPE_ACC, SCOPE_INPUT, SCOPE_WEIGHT
from .tir_program import HELD_KEY, OUT_SLOTS_KEY, PIPELINE_KEY, STORE_FLOOR_KEY

__all__ = ["annotate_pipeline", "tile_product"]


def tile_product(sch: Schedule, tile: tuple[int, int, int], store: str
                 ) -> tuple[Any, Any, Any, Any]:
    """The NPU product's loop structure, shared by the GEMM and the convolution: ``C_acc[b, i,
    j]``'s loops split by ``tile`` into ``b, i_0, j_0, k_0 | i_1, j_1, k_1``, the product
    ``cache_write`` into ``npu.l0.acc`` with block ``store`` (its crop into DRAM) under
    ``j_0``, the operands ``cache_read`` into ``npu.l0.input``/``npu.l0.weight`` at ``k_0``.
    Returns ``k_0``, ``i_1`` (the tile to tensorize) and the two operand copies."""
    mt, nt, kt = tile
    prod = sch.get_block("C_acc")
    b, i, j, k = sch.get_loops(prod)
    i0, i1 = sch.split(i, [None, mt])
    j0, j1 = sch.split(j, [None, nt])
    k0, k1 = sch.split(k, [None, kt])
    sch.reorder(b, i0, j0, k0, i1, j1, k1)
    sch.compute_inline(sch.cache_write(prod, 0, SCOPE_ACC))
    sch.reverse_compute_at(sch.get_block(store), j0)
    a_l0 = sch.cache_read(prod, 0, SCOPE_INPUT)
    b_l0 = sch.cache_read(prod, 1, SCOPE_WEIGHT)
    sch.compute_at(a_l0, k0)
    sch.compute_at(b_l0, k0)
    return k0, i1, a_l0, b_l0


def annotate_pipeline(sch: Schedule, k0: Any, copies: tuple[Any, Any], held: tuple[bool, bool],
                      nbuf: int, out_slots: int = 0, floor: int = 0) -> None:
    """The pipeline rules the generator follows, as annotations: the operand ``copies`` whose
    tiles stay on their core (``held``) marked so, ``k_0`` pipelined over ``nbuf`` slots,
    with ``out_slots`` accumulator slots and ``floor``, the smallest store piece (0: the
    defaults)."""
    for copy, keep in zip(copies, held):
        if keep:
            sch.annotate(copy, HELD_KEY, True)
    sch.annotate(k0, PIPELINE_KEY, nbuf)
    if out_slots:
        sch.annotate(k0, OUT_SLOTS_KEY, out_slots)
    if floor:
        sch.annotate(k0, STORE_FLOOR_KEY, floor)
