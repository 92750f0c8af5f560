"""Loop primitives: split, fuse, reorder, parallel/vectorize/unroll, annotate."""

import pytest
from tir_schedule_builders import (
    buf,
    c,
    ew_block,
    f32,
    loops,
    matmul,
    mm_block,
    prim_func,
    realize,
    var,
    vars_,
)

from kiln import tir
from kiln.ir import ScheduleError, assert_structural_equal
from kiln.tir import ForKind, Schedule


def _mm_sched(n=16, m=16, p=16):
    f, bufs = matmul(n, m, p)
    sch = Schedule(f)
    b = sch.get_block("C")
    return sch, b, sch.get_loops(b), bufs


def test_split_divisible():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    outs = sch.split(i, factors=[None, 4])
    assert len(outs) == 2
    i0, i1, j_, k_ = vars_("i0 i1 j k")
    expected = prim_func([A, B], [C], [loops(
        [(i0, 4), (i1, 4), (j_, 16), (k_, 16)],
        realize([i0 * 4 + i1, j_, k_], mm_block(A, B, C, 16, 16, 16)),
    )])
    assert_structural_equal(sch.func, expected)
    assert [sch.get(lp).extent.value for lp in sch.get_loops(b)] == [4, 4, 16, 16]


def test_split_three_way_explicit_factors():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    sch.split(j, factors=[2, 2, 4])
    i_, j0, j1, j2, k_ = vars_("i j0 j1 j2 k")
    expected = prim_func([A, B], [C], [loops(
        [(i_, 16), (j0, 2), (j1, 2), (j2, 4), (k_, 16)],
        realize([i_, j0 * 8 + j1 * 4 + j2, k_], mm_block(A, B, C, 16, 16, 16)),
    )])
    assert_structural_equal(sch.func, expected)


def test_split_non_divisible_adds_predicate():
    A, B = buf("A", (10,)), buf("B", (10,))
    i = var("i")
    f = prim_func([A], [B], [loops([(i, 10)], realize([i], ew_block("B", A, B, (10,),
                                                                    lambda x: x + f32(1.0))))])
    sch = Schedule(f)
    (lp,) = sch.get_loops(sch.get_block("B"))
    sch.split(lp, factors=[None, 4])
    i0, i1 = vars_("i0 i1")
    expected = prim_func([A], [B], [loops(
        [(i0, 3), (i1, 4)],
        realize([i0 * 4 + i1], ew_block("B", A, B, (10,), lambda x: x + f32(1.0)),
                pred=i0 * 4 + i1 < c(10)),
    )])
    assert_structural_equal(sch.func, expected)


def test_split_symbolic_extent():
    n = var("n")
    A, B = buf("A", (n,)), buf("B", (n,))
    i = var("i")
    f = prim_func([A], [B], [loops([(i, n)], realize([i], ew_block("B", A, B, (n,),
                                                                   lambda x: x * f32(2.0))))])
    sch = Schedule(f)
    (lp,) = sch.get_loops(sch.get_block("B"))
    outer, inner = sch.split(lp, factors=[None, 8])
    assert sch.get(inner).extent.value == 8
    blk_realize = sch.get(inner).body
    assert "n" in str(sch.get(outer).extent)
    assert not isinstance(blk_realize.predicate, tir.IntImm)  # i0 * 8 + i1 < n


def test_fuse_two_loops():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    fused = sch.fuse(i, j)
    assert sch.get(fused).extent.value == 256
    f_, k_ = vars_("f k")
    expected = prim_func([A, B], [C], [loops(
        [(f_, 256), (k_, 16)],
        realize([f_ // 16, f_ % 16, k_], mm_block(A, B, C, 16, 16, 16)),
    )])
    assert_structural_equal(sch.func, expected)


def test_fuse_three_loops():
    sch, b, (i, j, k), (A, B, C) = _mm_sched(4, 4, 4)
    sch.fuse(i, j, k)
    f_ = var("f")
    expected = prim_func([A, B], [C], [loops(
        [(f_, 64)],
        realize([f_ // 16, f_ // 4 % 4, f_ % 4], mm_block(A, B, C, 4, 4, 4)),
    )])
    assert_structural_equal(sch.func, expected)


def test_split_then_fuse_back_is_identity_binding():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    i0, i1 = sch.split(i, factors=[4, 4])
    sch.fuse(i0, i1)
    f_, j_, k_ = vars_("f j k")
    expected = prim_func([A, B], [C], [loops(
        [(f_, 16), (j_, 16), (k_, 16)], realize([f_, j_, k_], mm_block(A, B, C, 16, 16, 16)),
    )])
    assert_structural_equal(sch.func, expected)


def test_reorder():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    sch.reorder(k, i)
    i_, j_, k_ = vars_("i j k")
    expected = prim_func([A, B], [C], [loops(
        [(k_, 16), (j_, 16), (i_, 16)], realize([i_, j_, k_], mm_block(A, B, C, 16, 16, 16)),
    )])
    assert_structural_equal(sch.func, expected)
    # The handles follow their loops.
    assert [sch.get(lp).loop_var for lp in sch.get_loops(b)] == [
        sch.get(k).loop_var, sch.get(j).loop_var, sch.get(i).loop_var
    ]


def test_reorder_after_split():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    i0, i1 = sch.split(i, factors=[None, 4])
    j0, j1 = sch.split(j, factors=[None, 8])
    sch.reorder(i0, j0, k, i1, j1)
    a0, a1, b0, b1, k_ = vars_("i0 i1 j0 j1 k")
    expected = prim_func([A, B], [C], [loops(
        [(a0, 4), (b0, 2), (k_, 16), (a1, 4), (b1, 8)],
        realize([a0 * 4 + a1, b0 * 8 + b1, k_], mm_block(A, B, C, 16, 16, 16)),
    )])
    assert_structural_equal(sch.func, expected)


def test_loop_kinds_and_annotate():
    sch, b, (i, j, k), (A, B, C) = _mm_sched()
    sch.parallel(i)
    sch.vectorize(j)
    sch.unroll(k)
    sch.annotate(i, "pragma_auto_unroll", 16)
    sch.annotate(b, "schedule_rule", "mm")
    i_, j_, k_ = vars_("i j k")
    blk = mm_block(A, B, C, 16, 16, 16).replace(annotations={"schedule_rule": "mm"})
    expected = prim_func([A, B], [C], [loops(
        [(i_, 16, ForKind.PARALLEL, {"pragma_auto_unroll": 16}), (j_, 16, ForKind.VECTORIZED),
         (k_, 16, ForKind.UNROLLED)],
        realize([i_, j_, k_], blk),
    )])
    assert_structural_equal(sch.func, expected)


# ---- errors -------------------------------------------------------------------------------------
def test_split_errors():
    sch, b, (i, j, k), _ = _mm_sched()
    before = sch.func
    with pytest.raises(ScheduleError, match="at most one factor may be None"):
        sch.split(i, factors=[None, None])
    with pytest.raises(ScheduleError, match="must be positive"):
        sch.split(i, factors=[0, 16])
    with pytest.raises(ScheduleError, match="must be positive"):
        sch.split(i, factors=[None, -2])
    with pytest.raises(ScheduleError, match="at least two"):
        sch.split(i, factors=[16])
    with pytest.raises(ScheduleError, match="not an integer"):
        sch.split(i, factors=[None, 2.5])
    with pytest.raises(ScheduleError, match="not provably >= its extent"):
        sch.split(i, factors=[2, 4])
    with pytest.raises(ScheduleError, match="expected a LoopRV"):
        sch.split(b, factors=[None, 4])
    assert sch.func is before
    assert len(sch.trace) == 2  # get_block, get_loops: failed calls are not recorded


def test_fuse_errors():
    sch, b, (i, j, k), _ = _mm_sched()
    with pytest.raises(ScheduleError, match="nested deeper"):
        sch.fuse(i, k)
    with pytest.raises(ScheduleError, match="not nested under"):
        sch.fuse(j, i)
    with pytest.raises(ScheduleError, match="at least two"):
        sch.fuse(i)
    with pytest.raises(ScheduleError, match="listed twice"):
        sch.fuse(i, i)


def test_fuse_loops_of_different_nests():
    A, B, C = buf("A", (8,)), buf("B", (8,)), buf("C", (8,))
    x, y = var("x"), var("y")
    f = prim_func([A], [C], [
        loops([(x, 8)], realize([x], ew_block("B", A, B, (8,), lambda v: v + f32(1.0)))),
        loops([(y, 8)], realize([y], ew_block("C", B, C, (8,), lambda v: v * f32(2.0)))),
    ], allocs=[B])
    sch = Schedule(f)
    (lb,) = sch.get_loops(sch.get_block("B"))
    (lc,) = sch.get_loops(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="not nested under"):
        sch.fuse(lb, lc)
    with pytest.raises(ScheduleError, match="not in one chain"):
        sch.reorder(lb, lc)


def test_reorder_errors():
    sch, b, (i, j, k), _ = _mm_sched()
    with pytest.raises(ScheduleError, match="listed twice"):
        sch.reorder(i, i)
    with pytest.raises(ScheduleError, match="at least two"):
        sch.reorder(i)


def test_reorder_non_perfect_nest():
    # for i: { for j: B ; for k: C } -- i and j cannot be swapped past the sibling
    A, B, C = buf("A", (4, 4)), buf("B", (4, 4)), buf("C", (4, 4))
    i, j, k = vars_("i j k")
    inner_b = loops([(j, 4)], realize([i, j], ew_block("B", A, B, (4, 4), lambda v: v)))
    inner_c = loops([(k, 4)], realize([i, k], ew_block("C", B, C, (4, 4), lambda v: v)))
    f = prim_func([A], [C], [loops([(i, 4)], tir.seq(inner_b, inner_c))], allocs=[B])
    sch = Schedule(f)
    li, lj = sch.get_loops(sch.get_block("B"))
    with pytest.raises(ScheduleError, match="body other than a single loop"):
        # j is inside i, but i has two children: swapping would change the program
        sch.reorder(lj, li)


def test_reorder_dependent_bounds():
    # triangular: for i in 8: for j in i + 1
    A, B = buf("A", (8, 8)), buf("B", (8, 8))
    i, j = vars_("i j")
    nest = tir.For(i, c(0), c(8), ForKind.SERIAL, tir.For(
        j, c(0), i + c(1), ForKind.SERIAL,
        realize([i, j], ew_block("B", A, B, (8, 8), lambda v: v))))
    sch = Schedule(prim_func([A], [B], [nest]))
    li, lj = sch.get_loops(sch.get_block("B"))
    with pytest.raises(ScheduleError, match="would be defined inside it"):
        sch.reorder(lj, li)


def test_parallel_vectorize_reduction_loop_refused():
    sch, b, (i, j, k), _ = _mm_sched()
    with pytest.raises(ScheduleError, match="parallel: loop 'k' is bound to a reduction"):
        sch.parallel(k)
    with pytest.raises(ScheduleError, match="vectorize: loop 'k' is bound to a reduction"):
        sch.vectorize(k)
    fused = sch.fuse(j, k)
    with pytest.raises(ScheduleError, match="reduction"):
        sch.parallel(fused)
    sch.unroll(fused)  # unrolling a reduction is fine
    assert sch.get(fused).kind == ForKind.UNROLLED


def test_vectorize_symbolic_extent_refused():
    n = var("n")
    A, B = buf("A", (n,)), buf("B", (n,))
    i = var("i")
    f = prim_func([A], [B], [loops([(i, n)], realize([i], ew_block("B", A, B, (n,),
                                                                   lambda x: x)))])
    sch = Schedule(f)
    (lp,) = sch.get_loops(sch.get_block("B"))
    with pytest.raises(ScheduleError, match="not a constant"):
        sch.vectorize(lp)
    sch.parallel(lp)


def test_annotate_errors():
    sch, b, (i, j, k), _ = _mm_sched()
    with pytest.raises(ScheduleError, match="non-empty string"):
        sch.annotate(i, "", 1)
    with pytest.raises(ScheduleError, match="must be a str"):
        sch.annotate(i, "k", object())
