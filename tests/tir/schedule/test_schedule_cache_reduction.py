"""cache_read, cache_write and decompose_reduction."""

import pytest
from tir_schedule_builders import (
    block,
    buf,
    chain,
    copy_block,
    ew_block,
    f32,
    loops,
    matmul,
    matmul_relu,
    mm_block,
    point,
    prim_func,
    realize,
    vars_,
)

from kiln import tir
from kiln.ir import ScheduleError, assert_structural_equal
from kiln.tir import BufferStore, Schedule


def _swap(blk, old, new):
    """``blk`` reading/writing ``new`` wherever it used ``old`` (what a cache stage does)."""
    class M(tir.Mutator):
        def visit_Buffer(self, b):
            return new if b is old else b

    m = M()
    return blk.replace(body=m.visit(blk.body), init=m.visit(blk.init),
                       reads=m.visit(blk.reads), writes=m.visit(blk.writes))


def _mm_nest(A, B, C, blk=None, n=16):
    i, j, k = vars_("i j k")
    return loops([(i, n), (j, n), (k, n)], realize([i, j, k], blk or mm_block(A, B, C, n, n, n)))


def _copy_nest(name, src, dst, n=16):
    a0, a1 = vars_("a0 a1")
    return loops([(a0, n), (a1, n)], realize([a0, a1], copy_block(name, src, dst, (n, n))))


# ---- cache_read / cache_write -------------------------------------------------------------------
def test_cache_read():
    f, (A, B, C) = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    copy = sch.cache_read(cb, 0, "local")
    assert sch.get(copy).name_hint == "A_local"
    A_local = buf("A_local", (16, 16), "local")
    expected = prim_func([A, B], [C], [
        _copy_nest("A_local", A, A_local),
        _mm_nest(A, B, C, _swap(mm_block(A, B, C, 16, 16, 16), A, A_local)),
    ], allocs=[A_local])
    assert_structural_equal(sch.func, expected)
    assert [sch.get(b).name_hint for b in sch.get_producers(cb)] == ["A_local"]


def test_cache_write():
    f, (A, B, C) = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    copy = sch.cache_write(cb, 0, "local")
    C_local = buf("C_local", (16, 16), "local")
    expected = prim_func([A, B], [C], [
        _mm_nest(A, B, C, _swap(mm_block(A, B, C, 16, 16, 16), C, C_local)),
        _copy_nest("C_local", C_local, C),
    ], allocs=[C_local])
    assert_structural_equal(sch.func, expected)
    assert [sch.get(b).name_hint for b in sch.get_consumers(cb)] == ["C_local"]
    assert sch.get_consumers(copy) == []


def test_cache_names_are_unique():
    f, _ = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    sch.cache_read(cb, 0, "local")
    second = sch.cache_read(cb, 1, "local")
    assert sch.get(second).name_hint == "B_local"
    third = sch.cache_read(sch.get_block("A_local"), 0, "local")
    assert sch.get(third).name_hint == "A_local_1"
    names = [b.name for b in sch.func.body.block.alloc_buffers]
    assert names == ["A_local", "B_local", "A_local_1"]


def test_cache_write_then_reverse_compute_at():
    f, (A, B, C) = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j, k = sch.get_loops(cb)
    copy = sch.cache_write(cb, 0, "local")
    sch.reverse_compute_at(copy, j)
    C_local = buf("C_local", (16, 16), "local")
    i_, j_, k_ = vars_("i j k")
    mm = loops([(k_, 16)], realize([i_, j_, k_],
                                   _swap(mm_block(A, B, C, 16, 16, 16), C, C_local)))
    wb = realize([i_, j_], copy_block("C_local", C_local, C, (16, 16)))
    expected = prim_func([A, B], [C], [loops([(i_, 16), (j_, 16)], tir.seq(mm, wb))],
                         allocs=[C_local])
    assert_structural_equal(sch.func, expected)


def test_cache_write_inside_consumer_tile():
    # After compute_at, the write-back goes next to the block inside the shared tile loop and
    # copies just the tile.
    f, (A, B, C, D) = matmul_relu()
    sch = Schedule(f)
    cb, db = sch.get_block("C"), sch.get_block("D")
    i, j = sch.get_loops(db)
    i0, i1 = sch.split(i, factors=[None, 4])
    sch.compute_at(cb, i0)
    sch.cache_write(cb, 0, "local")
    C_local = buf("C_local", (16, 16), "local")
    o, x0, x1, x2, y0, y1, a1, jj = vars_("o x0 x1 x2 y0 y1 a1 jj")
    mm = loops([(x0, 4), (x1, 16), (x2, 16)], realize(
        [o * 4 + x0, x1, x2], _swap(mm_block(A, B, C, 16, 16, 16), C, C_local)))
    wb = loops([(y0, 4), (y1, 16)], realize([o * 4 + y0, y1],
                                            copy_block("C_local", C_local, C, (16, 16))))
    relu = loops([(a1, 4), (jj, 16)], realize(
        [o * 4 + a1, jj], ew_block("D", C, D, (16, 16), lambda x: tir.max(x, f32(0.0)))))
    expected = prim_func([A, B], [D], [loops([(o, 4)], tir.seq(mm, wb, relu))],
                         allocs=[C, C_local])
    assert_structural_equal(sch.func, expected)


def test_cache_errors():
    f, _ = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    for bad in (2, -1, True, "0"):
        with pytest.raises(ScheduleError, match=r"read_buffer_index .* range.*\(0: A, 1: B\)"):
            sch.cache_read(cb, bad, "local")
    with pytest.raises(ScheduleError, match="write_buffer_index 1 is out of range"):
        sch.cache_write(cb, 1, "local")
    with pytest.raises(ScheduleError, match="storage scope"):
        sch.cache_read(cb, 0, "")
    with pytest.raises(ScheduleError, match="storage scope"):
        sch.cache_write(cb, 0, "no such scope")
    i, j, k = sch.get_loops(cb)
    sch.decompose_reduction(cb, k)
    with pytest.raises(ScheduleError, match="block 'C' also writes 'C'"):
        sch.cache_read(cb, 0, "local")  # the update now reads its accumulator
    with pytest.raises(ScheduleError, match="also written by block 'C_init'"):
        sch.cache_write(cb, 0, "local")


# ---- decompose_reduction ------------------------------------------------------------------------
def _init_block(C, name="C_init", n=16):
    vi, vj = vars_("vi vj")
    from tir_schedule_builders import iv

    return block(name, [iv(vi, n), iv(vj, n)], [], [point(C, vi, vj)],
                 BufferStore(C, f32(0.0), (vi, vj)))


def _update_block(A, B, C, n=16):
    blk = mm_block(A, B, C, n, n, n)
    return blk.replace(init=None, reads=(blk.writes[0], *blk.reads))


def test_decompose_reduction_at_reduction_loop():
    f, (A, B, C) = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j, k = sch.get_loops(cb)
    init = sch.decompose_reduction(cb, k)
    assert sch.get(init).name_hint == "C_init"
    i_, j_, k_ = vars_("i j k")
    body = tir.seq(realize([i_, j_], _init_block(C)),
                   loops([(k_, 16)], realize([i_, j_, k_], _update_block(A, B, C))))
    expected = prim_func([A, B], [C], [loops([(i_, 16), (j_, 16)], body)])
    assert_structural_equal(sch.func, expected)
    assert [sch.get(b).name_hint for b in sch.get_producers(cb)] == ["C_init"]


def test_decompose_reduction_at_outer_loop_copies_spatial_loops():
    f, (A, B, C) = matmul()
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j, k = sch.get_loops(cb)
    sch.parallel(i)
    sch.decompose_reduction(cb, i)
    a, b, i_, j_, k_ = vars_("a b i j k")
    init = loops([(a, 16, tir.ForKind.PARALLEL), (b, 16)], realize([a, b], _init_block(C)))
    upd = loops([(i_, 16, tir.ForKind.PARALLEL), (j_, 16), (k_, 16)],
                realize([i_, j_, k_], _update_block(A, B, C)))
    assert_structural_equal(sch.func, prim_func([A, B], [C], [init, upd]))


def test_decompose_reduction_keeps_spatial_predicate():
    f, (A, B, C) = matmul(10, 10, 10)
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j, k = sch.get_loops(cb)
    i0, i1 = sch.split(i, factors=[None, 4])
    k0, k1 = sch.split(k, factors=[None, 4])
    sch.decompose_reduction(cb, i1)
    init = sch.get_block("C_init")
    (i0_, i1_init, j_init) = [sch.get(lp) for lp in sch.get_loops(init)]
    realize_init = j_init.body
    assert "k" not in str(realize_init.predicate)
    assert "< 10" in str(realize_init.predicate)


def test_decompose_reduction_errors():
    f, _ = chain()
    sch = Schedule(f)
    bb = sch.get_block("B")
    (bi, bj) = sch.get_loops(bb)
    with pytest.raises(ScheduleError, match="has no init"):
        sch.decompose_reduction(bb, bi)
    f, _ = matmul_relu()
    sch = Schedule(f)
    cb = sch.get_block("C")
    i, j, k = sch.get_loops(cb)
    di, _ = sch.get_loops(sch.get_block("D"))
    with pytest.raises(ScheduleError, match="not an ancestor of block 'C'"):
        sch.decompose_reduction(cb, di)
    sch.reorder(k, i)
    with pytest.raises(ScheduleError, match="loop 'k', above 'j', is bound to a reduction"):
        sch.decompose_reduction(cb, j)
    sch.decompose_reduction(cb, k)
    with pytest.raises(ScheduleError, match="has no init"):
        sch.decompose_reduction(cb, k)


def test_decomposed_init_can_move_but_not_into_the_reduction():
    f, (A, B, C, D) = matmul_relu()
    sch = Schedule(f)
    cb, db = sch.get_block("C"), sch.get_block("D")
    i, j, k = sch.get_loops(cb)
    init = sch.decompose_reduction(cb, i)
    with pytest.raises(ScheduleError, match="loop 'k' carries the reduction of block 'C'"):
        sch.compute_at(init, k)
    with pytest.raises(ScheduleError, match="not an ancestor of consumer block 'D'"):
        sch.compute_at(init, j)
    sch.reverse_compute_at(db, j)
    sch.compute_at(init, j)  # once per (i, j), before the k loop
    i_, j_, k_ = vars_("i j k")
    body = tir.seq(
        realize([i_, j_], _init_block(C)),
        loops([(k_, 16)], realize([i_, j_, k_], _update_block(A, B, C))),
        realize([i_, j_], ew_block("D", C, D, (16, 16), lambda x: tir.max(x, f32(0.0)))),
    )
    expected = prim_func([A, B], [D], [loops([(i_, 16), (j_, 16)], body)], allocs=[C])
    assert_structural_equal(sch.func, expected)
