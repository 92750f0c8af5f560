"""blockize: the loop nest under a loop becomes an outer block (IR, numerics, trace, errors)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.ir import ScheduleError, assert_structural_equal, structural_equal
from kiln.testing.tir_testing import check_matmul, matmul_func
from kiln.tir import (
    Block,
    BlockRealize,
    BufferRegion,
    BufferStore,
    For,
    ForKind,
    IterType,
    IterVar,
    PrimFunc,
    Range,
    Schedule,
    Var,
)

RNG = np.random.default_rng(3)


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


def _c(v: int) -> tir.PrimExpr:
    return tir.const("int64", v)


def _scale() -> PrimFunc:
    A = te.placeholder((16,), "float32", name="A")
    B = te.compute((16,), lambda i: A[i] * tir.const("float32", 2.0), name="B")
    return te.create_prim_func([A, B])


def _run_matmul(func: PrimFunc, n: int, m: int, p: int) -> None:
    check_matmul(cg.build({"f": func}, "c"), "f", n, m, p, RNG)


def test_blockize_elementwise_ir():
    sch = Schedule(_scale())
    blk = sch.get_block("B")
    (i,) = sch.get_loops(blk)
    _, i1 = sch.split(i, factors=[None, 4])
    outer = sch.blockize(i1)
    assert sch.get(outer).name_hint == "B_o"

    A = tir.decl_buffer((_c(16),), "float32", "A")
    B = tir.decl_buffer((_c(16),), "float32", "B")
    i0, i1v, vo, v = Var("i_0", "int64"), Var("i_1", "int64"), Var("vo", "int64"), \
        Var("v", "int64")
    inner = Block(
        (IterVar(Range(_c(0), _c(16)), v, IterType.DATA_PAR),),
        (BufferRegion(A, (Range(v, _c(1)),)),), (BufferRegion(B, (Range(v, _c(1)),)),), "B",
        BufferStore(B, A[v] * tir.const("float32", 2.0), (v,)),
    )
    nest = For(i1v, _c(0), _c(4), ForKind.SERIAL,
               BlockRealize((vo * 4 + i1v,), tir.true_predicate(), inner))
    outer_block = Block(
        (IterVar(Range(_c(0), _c(4)), vo, IterType.DATA_PAR),),
        (BufferRegion(A, (Range(vo * 4, _c(4)),)),), (BufferRegion(B, (Range(vo * 4, _c(4)),)),),
        "B_o", nest,
    )
    body = For(i0, _c(0), _c(4), ForKind.SERIAL,
               BlockRealize((i0,), tir.true_predicate(), outer_block))
    root = Block((), (), (), "root", body)
    pa, pb = Var("A", "handle"), Var("B", "handle")
    expected = PrimFunc((pa, pb), {pa: A, pb: B}, BlockRealize((), tir.true_predicate(), root))
    assert_structural_equal(sch.func.body, expected.body)


def test_blockize_moves_reduction_init_to_outer_block():
    sch = Schedule(matmul_func(8, 8, 8))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, factors=[None, 4])
    j0, j1 = sch.split(j, factors=[None, 4])
    sch.reorder(i0, j0, i1, j1, k)
    outer = sch.get(sch.blockize(i1))
    assert [iv.iter_type for iv in outer.iter_vars] == [IterType.DATA_PAR] * 2
    assert [int(iv.dom.extent.value) for iv in outer.iter_vars] == [2, 2]
    assert outer.init is not None
    inner = sch.get(c)
    assert inner.init is None
    assert [r.buffer.name for r in inner.reads] == ["C", "A", "B"]  # accumulator now read
    (w,) = outer.writes
    assert [int(r.extent.value) for r in w.region] == [4, 4]
    (a_read, b_read) = outer.reads
    assert [int(r.extent.value) for r in a_read.region] == [4, 8]
    assert [int(r.extent.value) for r in b_read.region] == [8, 4]
    _run_matmul(sch.func, 8, 8, 8)


def test_blockize_inside_reduction_loop_keeps_outer_reduce_var():
    """k outside the blockized loop: the outer block is itself a reduction over k."""
    sch = Schedule(matmul_func(8, 12, 6))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    j0, j1 = sch.split(j, factors=[None, 4])
    sch.reorder(i, j0, k, j1)
    outer = sch.get(sch.blockize(j1))
    kinds = [iv.iter_type for iv in outer.iter_vars]
    assert kinds == [IterType.DATA_PAR, IterType.DATA_PAR, IterType.COMM_REDUCE]
    _run_matmul(sch.func, 8, 12, 6)


def test_blockize_whole_nest_and_nested_blockize():
    sch = Schedule(matmul_func(6, 10, 4))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    mid = sch.blockize(j)
    top = sch.blockize(i)
    assert sch.get(top).iter_vars == ()
    assert sch.get(mid).name_hint == "C_o"
    assert sch.get(top).name_hint == "C_o_o"
    _run_matmul(sch.func, 6, 10, 4)


def test_blockize_trace_replays():
    sch = Schedule(matmul_func(8, 8, 8))
    c = sch.get_block("C")
    i, _, _ = sch.get_loops(c)
    _, i1 = sch.split(i, factors=[None, 2])
    sch.blockize(i1)
    assert "sch.blockize(loop=" in str(sch.trace)
    replay = sch.trace.apply_to_schedule(Schedule(matmul_func(8, 8, 8)))
    assert structural_equal(replay.func, sch.func)


def test_blockize_parallel_outer_loop_still_allowed():
    sch = Schedule(matmul_func(8, 8, 8))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    i0, i1 = sch.split(i, factors=[None, 4])
    sch.blockize(i1)
    sch.parallel(i0)
    _run_matmul(sch.func, 8, 8, 8)


def test_blockize_errors():
    # two blocks under the loop
    A = te.placeholder((8,), "float32", name="A")
    B = te.compute((8,), lambda i: A[i] + tir.const("float32", 1.0), name="B")
    C = te.compute((8,), lambda i: B[i] * tir.const("float32", 2.0), name="C")
    sch = Schedule(te.create_prim_func([A, C]))
    b, c = sch.get_block("B"), sch.get_block("C")
    (ci,) = sch.get_loops(c)
    sch.compute_at(b, ci)
    with pytest.raises(ScheduleError, match="perfect loop nest around exactly one block"):
        sch.blockize(ci)
    # binding that does not separate (fused loop split again: v = (f // 4) ... )
    sch = Schedule(matmul_func(6, 6, 6))
    c = sch.get_block("C")
    i, j, k = sch.get_loops(c)
    f = sch.fuse(i, j)
    _, f1 = sch.split(f, factors=[None, 4])
    before = sch.func
    with pytest.raises(ScheduleError, match="does not separate"):
        sch.blockize(f1)
    assert sch.func is before  # refused: unchanged
    # a block handle is not a loop
    with pytest.raises(ScheduleError, match="expected a LoopRV"):
        sch.blockize(c)
