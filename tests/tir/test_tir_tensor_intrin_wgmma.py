"""The wgmma shared-operand model (kiln/tir/tensor_intrin/wgmma.py) against the PTX ISA's own
statements: the canonical no-swizzle layouts and the worked examples of "Canonical Layouts"
(written here in CuTe's shape:stride notation and evaluated by a small independent evaluator),
the descriptor's bit fields and encoding, and the wgmma route's shared layouts
(kiln/schedule/gpu/linalg.py, PERMUTE_LAYOUT digits) placing every element where the
operands' descriptors say the instruction reads it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kiln.arith.analyzer import simplify as simplify_expr
from kiln.schedule.gpu.linalg import wgmma_a_layout, wgmma_b_k_major_layout, wgmma_b_layout
from kiln.tir.expr import const
from kiln.tir.tensor_intrin.wgmma import (
    SharedOperand,
    a_operand,
    b_operand,
    b_operand_k_major,
    descriptor_encode,
)
from kiln.tir.transform.permute_layout import permuted_index


def cute(shape, stride, coord):
    """A CuTe layout ``shape:stride`` at the natural coordinate ``coord`` (nested tuples, each
    mode's index split colexicographically: its first sub-mode fastest)."""
    if isinstance(shape, int):
        return coord * stride
    out = 0
    for sub_shape, sub_stride, c in zip(shape, stride, coord):
        out += cute(sub_shape, sub_stride, c)
    return out


def split(shape, index):
    """The natural coordinate of ``index`` in a (possibly nested) mode of ``shape``."""
    if isinstance(shape, int):
        return index
    coords = []
    for s in shape:
        size = int(np.prod(_flat(s)))
        coords.append(split(s, index % size))
        index //= size
    return tuple(coords)


def _flat(shape):
    return [shape] if isinstance(shape, int) else [x for s in shape for x in _flat(s)]


def layout_offset(shape, stride, row, col):
    """Offset of element (row, col) of a rank-2 CuTe layout (mode 0 the rows)."""
    return cute(shape, stride, (split(shape[0], row), split(shape[1], col)))


def test_the_k_major_model_is_the_isa_example():
    """PTX ISA, K-major no-swizzle example (tf32, T = 4 per 16 bytes): exact layout
    ((8,2),(4,4)):((4,32),(1,64)), LBO 64 and SBO 32 elements. The model is written for 16-bit
    elements, so its byte offsets are compared: the same bytes for the same (row, 16-byte
    column chunk, byte) of the canonical form ((8,m),(T,2k)):((1T,SBO),(1,LBO))."""
    op = SharedOperand("k", lbo=64 * 4, sbo=32 * 4)   # bytes
    for row, col in itertools.product(range(16), range(16)):
        # tf32 element (row, col) at byte 4 * offset; as 16-bit elements: column 2 col
        expect = 4 * layout_offset(((8, 2), (4, 4)), ((4, 32), (1, 64)), row, col)
        assert 2 * op.offset(row, 2 * col) == expect


def test_the_mn_major_model_is_the_isa_example():
    """PTX ISA, MN-major no-swizzle example (bf16, T = 8): exact layout
    ((8,1,2),(8,2)):((1,8,64),(8,128)), LBO 128 and SBO 64 elements (K's core matrices 128
    apart, N's 64)."""
    op = SharedOperand("mn", lbo=128 * 2, sbo=64 * 2)
    for n, k in itertools.product(range(16), range(16)):
        assert op.offset(n, k) == layout_offset(((8, 1, 2), (8, 2)), ((1, 8, 64), (8, 128)),
                                                n, k)


@pytest.mark.parametrize("major,lbo,sbo", [("k", 2048, 128), ("mn", 128, 1024),
                                           ("k", 4096, 128), ("mn", 128, 512)])
def test_the_model_is_the_canonical_layout(major, lbo, sbo):
    """The canonical no-swizzle forms (T = 8 for 16-bit elements), K-major
    ((8,m),(T,2k)):((1T,SBO),(1,LBO)) and MN-major ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO)), over
    a 64 x 16 operand; the C text of the model computes the same offsets (numpy arrays too)."""
    op = SharedOperand(major, lbo, sbo)
    L, S = lbo // 2, sbo // 2
    mn, k = np.meshgrid(np.arange(64), np.arange(16), indexing="ij")
    if major == "k":
        shape, stride = ((8, 8), (8, 2)), ((8, S), (1, L))
    else:
        shape, stride = ((8, 1, 8), (8, 2)), ((1, 8, S), (8, L))
    expect = np.vectorize(lambda r, c: layout_offset(shape, stride, r, c))(mn, k)
    np.testing.assert_array_equal(op.offset(mn, k), expect)
    text = op.c_offset("r", "c")  # &, >>, * and + read the same in Python for these ints
    for r, c in ((0, 0), (13, 9), (63, 15), (40, 7)):
        assert eval(text, {"r": r, "c": c}) == expect[r, c]


def test_the_descriptor_packs_the_isa_fields():
    """Bits 0-13 start >> 4, 16-29 LBO >> 4, 32-45 SBO >> 4, swizzle bits 62-63 zero;
    matrix-descriptor-encode(x) = (x & 0x3FFFF) >> 4 (the ISA's examples: LBO 64 tf32
    elements encode as 16, SBO 32 as 8)."""
    assert descriptor_encode(64 * 4) == 16 and descriptor_encode(32 * 4) == 8
    op = SharedOperand("k", lbo=2048, sbo=128)
    d = op.descriptor(0x1230)
    assert d & 0x3FFF == 0x123
    assert (d >> 16) & 0x3FFF == 128 and (d >> 32) & 0x3FFF == 8
    assert d >> 46 == 0
    assert op.descriptor_bits() | descriptor_encode(0x1230) == d
    with pytest.raises(ValueError, match="16-byte"):
        op.descriptor(0x1238)


@pytest.mark.parametrize("major,lbo,sbo", [("k", 24, 128), ("mn", 128, 1 << 18), ("row", 16, 16)])
def test_operands_the_descriptor_cannot_hold_are_refused(major, lbo, sbo):
    with pytest.raises(ValueError):
        SharedOperand(major, lbo, sbo)


def _at(layout, flat):
    _, radices, order = layout
    return int(simplify_expr(permuted_index(const("int64", flat), radices, order)).value)


@pytest.mark.parametrize("warpgroups,mi,bk", [(2, 1, 64), (1, 2, 32), (2, 2, 16)])
def test_a_tiles_are_where_the_descriptors_read_them(warpgroups, mi, bk):
    """Logical row (warpgroup q, warp w, lane group g, product m, h) and column k of A's tile
    is stored at what the K-major operand of the whole tile gives for the accumulator row
    64 (q MI + m) + 16 w + 8 h + g: the instruction's A row for that thread's output."""
    rows = 64 * warpgroups * mi
    layout, op = wgmma_a_layout(warpgroups, mi, bk), a_operand(rows, bk)
    for q, w, g, m, h in itertools.product(range(warpgroups), range(4), range(8), range(mi),
                                           range(2)):
        logical = (((q * 4 + w) * 8 + g) * mi + m) * 2 + h
        physical = 64 * (q * mi + m) + 16 * w + 8 * h + g
        for k in (0, 7, 8, bk - 1):
            assert _at(layout, logical * bk + k) == op.offset(physical, k)


@pytest.mark.parametrize("k_major", [False, True])
@pytest.mark.parametrize("nj,bk", [(16, 64), (32, 32), (1, 16), (8, 64), (32, 16), (1, 32)])
def test_b_tiles_are_where_the_descriptors_read_them(nj, bk, k_major):
    """Logical column (lane t, block j, e) and row k of B's tile is stored at what the
    descriptor's operand gives for the accumulator column 8 j + 2 t + e: matmul's B[k, n]
    MN-major (stored row k after row k), a dense weight's W[n, k] K-major (row n after
    row n)."""
    cols = 8 * nj
    if k_major:
        layout, op = wgmma_b_k_major_layout(nj, bk), b_operand_k_major(cols, bk)
    else:
        layout, op = wgmma_b_layout(nj, bk), b_operand(bk, cols)
    for t, j, e in itertools.product(range(4), range(nj), range(2)):
        logical = (t * nj + j) * 2 + e
        for k in (0, 5, 8, bk - 1):
            at = logical * bk + k if k_major else k * cols + logical
            assert _at(layout, at) == op.offset(8 * j + 2 * t + e, k)
