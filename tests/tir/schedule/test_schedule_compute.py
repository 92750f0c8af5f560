"""compute_inline, reverse_compute_inline, compute_at, reverse_compute_at."""

import pytest
from tir_schedule_builders import (
    block,
    buf,
    c,
    chain,
    ew_block,
    ew_nest,
    f32,
    iv,
    loops,
    matmul_relu,
    mm_block,
    point,
    prim_func,
    realize,
    var,
    vars_,
)

from kiln import tir
from kiln.ir import ScheduleError, assert_structural_equal
from kiln.tir import BufferStore, Schedule


# ---- compute_inline ------------------------------------------------------------------------------
def test_compute_inline_elementwise_chain():
    f, (A, B, C) = chain()
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("B"))
    expected = prim_func([A], [C], [ew_nest("C", A, C, (16, 16),
                                            lambda x: (x + f32(1.0)) * f32(2.0))])
    assert_structural_equal(sch.func, expected)
    assert [b for b in sch.func.body.block.alloc_buffers] == []


def test_compute_inline_into_reduction_and_shifted_index():
    # P[i] = A[i] * 3 ; C[i] = sum_r P[i + r]   ->   C[i] = sum_r A[i + r] * 3
    A, P, C = buf("A", (10,)), buf("P", (10,)), buf("C", (8,))
    x, i, r = vars_("x i r")
    vi, vr = vars_("vi vr")
    red = block("C", [iv(vi, 8), iv(vr, 3, True)], [point(P, vi + vr)], [point(C, vi)],
                BufferStore(C, C[vi] + P[vi + vr], (vi,)), init=BufferStore(C, f32(0.0), (vi,)))
    f = prim_func([A], [C], [
        loops([(x, 10)], realize([x], ew_block("P", A, P, (10,), lambda v: v * f32(3.0)))),
        loops([(i, 8), (r, 3)], realize([i, r], red)),
    ], allocs=[P])
    sch = Schedule(f)
    sch.compute_inline(sch.get_block("P"))
    wi, wr = vars_("wi wr")
    red2 = block("C", [iv(wi, 8), iv(wr, 3, True)], [point(A, wi + wr)], [point(C, wi)],
                 BufferStore(C, C[wi] + A[wi + wr] * f32(3.0), (wi,)),
                 init=BufferStore(C, f32(0.0), (wi,)))
    expected = prim_func([A], [C], [loops([(i, 8), (r, 3)], realize([i, r], red2))])
    assert_structural_equal(sch.func, expected)


def test_compute_inline_errors():
    f, (A, B, C, D) = matmul_relu()
    sch = Schedule(f)
    with pytest.raises(ScheduleError, match="'C' is a reduction block"):
        sch.compute_inline(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="writes 'D', an output of the function"):
        sch.compute_inline(sch.get_block("D"))
    with pytest.raises(ScheduleError, match="root block"):
        sch.compute_inline(sch.get_block("root"))


def test_compute_inline_needs_plain_store_indices():
    A, B, C = buf("A", (8,)), buf("B", (9,)), buf("C", (8,))
    x, y, v = var("x"), var("y"), var("v")
    shifted = block("B", [iv(v, 8)], [point(A, v)], [point(B, v + c(1))],
                    BufferStore(B, A[v], (v + c(1),)))
    f = prim_func([A], [C], [
        loops([(x, 8)], realize([x], shifted)),
        loops([(y, 8)], realize([y], ew_block("C", B, C, (8,), lambda e: e))),
    ], allocs=[B])
    sch = Schedule(f)
    with pytest.raises(ScheduleError, match="not distinct iteration variables"):
        sch.compute_inline(sch.get_block("B"))


def test_compute_inline_self_read_refused():
    A, B, C = buf("A", (8,)), buf("B", (8,)), buf("C", (8,))
    x, y, v = var("x"), var("y"), var("v")
    acc = block("B", [iv(v, 8)], [point(A, v), point(B, v)], [point(B, v)],
                BufferStore(B, A[v] + B[v], (v,)))
    f = prim_func([A], [C], [
        loops([(x, 8)], realize([x], acc)),
        loops([(y, 8)], realize([y], ew_block("C", B, C, (8,), lambda e: e))),
    ], allocs=[B])
    sch = Schedule(f)
    with pytest.raises(ScheduleError, match="reads the buffer it writes"):
        sch.compute_inline(sch.get_block("B"))


# ---- reverse_compute_inline ---------------------------------------------------------------------
def test_reverse_compute_inline_chain():
    f, (A, B, C) = chain()
    sch = Schedule(f)
    sch.reverse_compute_inline(sch.get_block("C"))
    expected = prim_func([A], [C], [ew_nest("B", A, C, (16, 16),
                                            lambda x: (x + f32(1.0)) * f32(2.0))])
    assert_structural_equal(sch.func, expected)


def test_reverse_compute_inline_transposed_consumer():
    # B[i, j] = A[i, j] + 1 ; C[j, i] = B[i, j] (consumer iterates (j, i))
    A, B, C = buf("A", (4, 8)), buf("B", (4, 8)), buf("C", (8, 4))
    x0, x1, y0, y1 = vars_("x0 x1 y0 y1")
    vj, vi = vars_("vj vi")
    tr = block("C", [iv(vj, 8), iv(vi, 4)], [point(B, vi, vj)], [point(C, vj, vi)],
               BufferStore(C, B[vi, vj], (vj, vi)))
    f = prim_func([A], [C], [
        loops([(x0, 4), (x1, 8)],
              realize([x0, x1], ew_block("B", A, B, (4, 8), lambda e: e + f32(1.0)))),
        loops([(y0, 8), (y1, 4)], realize([y0, y1], tr)),
    ], allocs=[B])
    sch = Schedule(f)
    sch.reverse_compute_inline(sch.get_block("C"))
    w0, w1 = vars_("w0 w1")
    fused = block("B", [iv(w0, 4), iv(w1, 8)], [point(A, w0, w1)], [point(C, w1, w0)],
                  BufferStore(C, A[w0, w1] + f32(1.0), (w1, w0)))
    expected = prim_func([A], [C], [loops([(x0, 4), (x1, 8)], realize([x0, x1], fused))])
    assert_structural_equal(sch.func, expected)


def test_reverse_compute_inline_errors():
    f, (A, B, C, D) = matmul_relu()
    sch = Schedule(f)
    with pytest.raises(ScheduleError, match="producer block 'C' is a reduction block"):
        sch.reverse_compute_inline(sch.get_block("D"))
    f, _ = chain()
    sch = Schedule(f)
    with pytest.raises(ScheduleError, match="exactly one producer block, it has 0"):
        sch.reverse_compute_inline(sch.get_block("B"))


def test_reverse_compute_inline_two_producers_and_shared_buffer():
    A, B, B2, C, D = (buf(n, (8,)) for n in ("A", "B", "B2", "C", "D"))
    x, y, z, w, v = vars_("x y z w v")
    add = block("C", [iv(v, 8)], [point(B, v), point(B2, v)], [point(C, v)],
                BufferStore(C, B[v] + B2[v], (v,)))
    f = prim_func([A], [C, D], [
        loops([(x, 8)], realize([x], ew_block("B", A, B, (8,), lambda e: e + f32(1.0)))),
        loops([(y, 8)], realize([y], ew_block("B2", A, B2, (8,), lambda e: e * f32(2.0)))),
        loops([(z, 8)], realize([z], add)),
        loops([(w, 8)], realize([w], ew_block("D", B, D, (8,), lambda e: e))),
    ], allocs=[B, B2])
    sch = Schedule(f)
    with pytest.raises(ScheduleError, match="exactly one producer block, it has 2"):
        sch.reverse_compute_inline(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="'B' is also read by block 'C'"):
        sch.reverse_compute_inline(sch.get_block("D"))


def test_reverse_compute_inline_predicated_consumer_refused():
    f, _ = chain(10, 4)
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, _j = sch.get_loops(cb)
    sch.split(i, factors=[None, 4])
    with pytest.raises(ScheduleError, match="has a predicate"):
        sch.reverse_compute_inline(cb)


# ---- compute_at ---------------------------------------------------------------------------------
def _tiled_relu(sch):
    d = sch.get_block("D")
    i, j = sch.get_loops(d)
    i0, i1 = sch.split(i, factors=[None, 4])
    j0, j1 = sch.split(j, factors=[None, 8])
    sch.reorder(i0, j0, i1, j1)
    return d, (i0, j0, i1, j1)


def test_compute_at_tile():
    f, (A, B, C, D) = matmul_relu()
    sch = Schedule(f)
    cb = sch.get_block("C")
    _, (i0, j0, i1, j1) = _tiled_relu(sch)
    sch.compute_at(cb, j0)
    a0, b0, a1, b1, x0, x1, x2 = vars_("a0 b0 a1 b1 x0 x1 x2")
    mm = loops([(x0, 4), (x1, 8), (x2, 16)],
               realize([a0 * 4 + x0, b0 * 8 + x1, x2], mm_block(A, B, C, 16, 16, 16)))
    relu = loops([(a1, 4), (b1, 8)], realize(
        [a0 * 4 + a1, b0 * 8 + b1],
        ew_block("D", C, D, (16, 16), lambda x: tir.max(x, f32(0.0)))))
    expected = prim_func([A, B], [D], [loops([(a0, 4), (b0, 2)], tir.seq(mm, relu))],
                         allocs=[C])
    assert_structural_equal(sch.func, expected)
    # the block handle still works and sees its new loops
    assert len(sch.get_loops(cb)) == 5


def test_compute_at_innermost_drops_unit_loops():
    f, (A, B, C, D) = matmul_relu(4, 4, 4)
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j = sch.get_loops(sch.get_block("D"))
    sch.compute_at(cb, j)
    a, b, x2 = vars_("a b x2")
    mm = loops([(x2, 4)], realize([a, b, x2], mm_block(A, B, C, 4, 4, 4)))
    relu = realize([a, b], ew_block("D", C, D, (4, 4), lambda x: tir.max(x, f32(0.0))))
    expected = prim_func([A, B], [D], [loops([(a, 4), (b, 4)], tir.seq(mm, relu))], allocs=[C])
    assert_structural_equal(sch.func, expected)


def test_compute_at_preserve_unit_loops():
    f, (A, B, C, D) = matmul_relu(4, 4, 4)
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j = sch.get_loops(sch.get_block("D"))
    sch.compute_at(cb, j, preserve_unit_loops=True)
    loops_c = [sch.get(lp) for lp in sch.get_loops(cb)]
    assert [lp.extent.value for lp in loops_c] == [4, 4, 1, 1, 4]


def test_compute_at_stencil_with_non_divisible_split():
    # P[i] = A[i] (12 elements), C[i] = sum_r P[i + r] over i < 10, r < 3; C's i split by 4
    A, P, C = buf("A", (12,)), buf("P", (12,)), buf("C", (10,))
    x, i, r = vars_("x i r")
    vi, vr = vars_("vi vr")
    red = block("C", [iv(vi, 10), iv(vr, 3, True)], [point(P, vi + vr)], [point(C, vi)],
                BufferStore(C, C[vi] + P[vi + vr], (vi,)), init=BufferStore(C, f32(0.0), (vi,)))
    f = prim_func([A], [C], [
        loops([(x, 12)], realize([x], ew_block("P", A, P, (12,), lambda e: e))),
        loops([(i, 10), (r, 3)], realize([i, r], red)),
    ], allocs=[P])
    sch = Schedule(f)
    io, ii = sch.split(sch.get_loops(sch.get_block("C"))[0], factors=[None, 4])
    sch.compute_at(sch.get_block("P"), io)
    o, ax, i1 = vars_("o ax i1")
    pnest = loops([(ax, 6)], realize([o * 4 + ax], ew_block("P", A, P, (12,), lambda e: e),
                                     pred=o * 4 + ax < c(12)))
    cnest = loops([(i1, 4), (r, 3)], realize([o * 4 + i1, r], red, pred=o * 4 + i1 < c(10)))
    expected = prim_func([A], [C], [loops([(o, 3)], tir.seq(pnest, cnest))], allocs=[P])
    assert_structural_equal(sch.func, expected)


def test_compute_at_errors():
    f, _ = matmul_relu()
    sch = Schedule(f)
    cb, db = sch.get_block("C"), sch.get_block("D")
    ci, cj, ck = sch.get_loops(cb)
    di, dj = sch.get_loops(db)
    with pytest.raises(ScheduleError, match="'D' writes 'D', an output of the function"):
        sch.compute_at(db, ci)
    with pytest.raises(ScheduleError, match="not an ancestor of consumer block 'D'"):
        sch.compute_at(cb, ci)
    with pytest.raises(ScheduleError, match="expected a LoopRV"):
        sch.compute_at(cb, db)
    with pytest.raises(ScheduleError, match="expected a BlockRV"):
        sch.compute_at(di, dj)


def test_compute_at_data_dependent_region_refused():
    # C[u, v] = B[idx[v]]: inside one iteration of u the needed part of B depends on data
    A, B, C = buf("A", (8,)), buf("B", (8,)), buf("C", (4, 8))
    idx = tir.decl_buffer((c(8),), "int64", "idx")
    x, y0, y1, u, v = vars_("x y0 y1 u v")
    gather = block("C", [iv(u, 4), iv(v, 8)], [point(idx, v), point(B, idx[v])],
                   [point(C, u, v)], BufferStore(C, B[idx[v]], (u, v)))
    f = prim_func([A, idx], [C], [
        loops([(x, 8)], realize([x], ew_block("B", A, B, (8,), lambda e: e))),
        loops([(y0, 4), (y1, 8)], realize([y0, y1], gather)),
    ], allocs=[B])
    sch = Schedule(f)
    outer, inner = sch.get_loops(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="cannot determine the region of 'B'"):
        sch.compute_at(sch.get_block("B"), outer)
    # at the innermost loop the index is a single (data-dependent) point: allowed
    sch.compute_at(sch.get_block("B"), inner)
    assert sch.get_loops(sch.get_block("B")) != []


# ---- reverse_compute_at -------------------------------------------------------------------------
def test_reverse_compute_at_tile():
    f, (A, B, C) = chain()
    sch = Schedule(f)
    bb, cb = sch.get_block("B"), sch.get_block("C")
    i, j = sch.get_loops(bb)
    i0, i1 = sch.split(i, factors=[None, 4])
    sch.reverse_compute_at(cb, i0)
    o, a1, jj, x0, x1 = vars_("o a1 jj x0 x1")
    bnest = loops([(a1, 4), (jj, 16)], realize(
        [o * 4 + a1, jj], ew_block("B", A, B, (16, 16), lambda x: x + f32(1.0))))
    cnest = loops([(x0, 4), (x1, 16)], realize(
        [o * 4 + x0, x1], ew_block("C", B, C, (16, 16), lambda x: x * f32(2.0))))
    expected = prim_func([A], [C], [loops([(o, 4)], tir.seq(bnest, cnest))], allocs=[B])
    assert_structural_equal(sch.func, expected)


def test_reverse_compute_at_errors():
    f, _ = matmul_relu()
    sch = Schedule(f)
    cb, db = sch.get_block("C"), sch.get_block("D")
    ci, cj, ck = sch.get_loops(cb)
    di, _ = sch.get_loops(db)
    with pytest.raises(ScheduleError, match="'C' has no producer"):
        sch.reverse_compute_at(cb, di)
    with pytest.raises(ScheduleError, match="not an ancestor of any producer of block 'D'"):
        sch.reverse_compute_at(db, di)
    with pytest.raises(ScheduleError, match="loop 'k' carries the reduction of producer 'C'"):
        sch.reverse_compute_at(db, ck)
    sch.reverse_compute_at(db, cj)  # the reduction is complete inside j
    assert len(sch.get_loops(db)) == 2


def test_compute_at_then_inline_consumer_chain():
    # compute_at keeps the program valid for further primitives
    f, (A, B, C) = chain()
    sch = Schedule(f)
    bb, cb = sch.get_block("B"), sch.get_block("C")
    i, j = sch.get_loops(cb)
    sch.compute_at(bb, i)
    assert [sch.get(lp).extent.value for lp in sch.get_loops(bb)] == [16, 16]
    sch.compute_inline(bb)
    expected = prim_func([A], [C], [ew_nest("C", A, C, (16, 16),
                                            lambda x: (x + f32(1.0)) * f32(2.0))])
    assert_structural_equal(sch.func, expected)


def test_compute_at_dead_block_has_no_consumer():
    A, B, C = buf("A", (8,)), buf("B", (8,)), buf("C", (8,))
    x, y = vars_("x y")
    f = prim_func([A], [C], [
        loops([(x, 8)], realize([x], ew_block("B", A, B, (8,), lambda e: e))),
        loops([(y, 8)], realize([y], ew_block("C", A, C, (8,), lambda e: e))),
    ], allocs=[B])
    sch = Schedule(f)
    (ly,) = sch.get_loops(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="'B' has no consumer"):
        sch.compute_at(sch.get_block("B"), ly)
