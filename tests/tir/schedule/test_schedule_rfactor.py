"""rfactor: structure of the two blocks, numerics vs numpy, refusals, trace replay."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as cg
from kiln.ir.errors import ScheduleError
from kiln.ir.node import assert_structural_equal
from kiln.target import Target
from kiln.tir import Schedule

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("KILN_CACHE_DIR", str(tmp_path_factory.mktemp("kiln_cache")))
    yield
    mp.undo()


_REDUCERS = {"sum": (te.sum, np.sum), "max": (te.max, np.max), "min": (te.min, np.min)}


def _row_reduce(n: int, m: int, kind: str = "sum"):
    A = te.placeholder((n, m), "float32", name="A")
    k = te.reduce_axis((0, m), name="k")
    B = te.compute((n,), lambda i: _REDUCERS[kind][0](A[i, k], axis=k), name="B")
    return te.create_prim_func([A, B])


def _blocks(func) -> dict[str, tir.Block]:
    out: dict[str, tir.Block] = {}
    tir.post_order_visit(func.body, lambda n: out.__setitem__(n.name_hint, n)
                         if isinstance(n, tir.Block) else None)
    return out


def _vector_schedule(sch: Schedule, lanes: int = 8, factor_axis: int = 1) -> None:
    """split k -> (ko, ki), rfactor ki, vectorize it, hoist both inits."""
    b = sch.get_block("B")
    _, k = sch.get_loops(b)
    ko, ki = sch.split(k, factors=[None, lanes])
    rf = sch.rfactor(ki, factor_axis)
    sch.vectorize(ki)
    sch.decompose_reduction(rf, ko)
    sch.decompose_reduction(b, sch.get_loops(b)[-1])


def _run(func, *arrays):
    mod = cg.build({"f": func}, "c")
    mod["f"](*arrays)
    return arrays[-1]


def test_structure_of_rf_and_write_back_blocks():
    sch = Schedule(_row_reduce(16, 64))
    b = sch.get_block("B")
    _, k = sch.get_loops(b)
    _, ki = sch.split(k, factors=[None, 8])
    rf = sch.rfactor(ki, 1)
    assert sch.get(rf).name_hint == "B_rf"
    blocks = _blocks(sch.func)
    rf_block, wb = blocks["B_rf"], blocks["B"]
    # rf block: i spatial, ko reduction, ki spatial; writes B_rf[i, ki] of shape (16, 8)
    kinds = [iv.iter_type for iv in rf_block.iter_vars]
    assert kinds == [tir.IterType.DATA_PAR, tir.IterType.COMM_REDUCE, tir.IterType.DATA_PAR]
    (w,) = rf_block.writes
    assert w.buffer.name == "B_rf" and [s.value for s in w.buffer.shape] == [16, 8]
    assert rf_block.init is not None
    # write-back: i spatial, one reduction over the 8 partials, same init as before
    assert [iv.iter_type for iv in wb.iter_vars] == [tir.IterType.DATA_PAR,
                                                     tir.IterType.COMM_REDUCE]
    assert wb.iter_vars[1].dom.extent.value == 8
    assert [r.buffer.name for r in wb.reads] == ["B_rf"]
    assert wb.init is not None and float(wb.init.value.value) == 0.0
    # the old loop handles still name the rf block's loops; ki is now a spatial loop
    sch.vectorize(ki)
    sch.parallel(sch.get_loops(rf)[0])
    root = sch.func.body.block
    assert [b.name for b in root.alloc_buffers] == ["B_rf"]


@pytest.mark.parametrize("kind", ["sum", "max", "min"])
@pytest.mark.parametrize("factor_axis", [0, 1, -1])
def test_vectorized_partials_match_numpy(kind, factor_axis):
    sch = Schedule(_row_reduce(12, 96, kind))
    _vector_schedule(sch, 8, factor_axis)
    a = RNG.standard_normal((12, 96)).astype("float32")
    out = _run(sch.func, a, np.full(12, np.nan, "float32"))
    np.testing.assert_allclose(out, _REDUCERS[kind][1](a, axis=1), rtol=1e-5, atol=1e-5)


def test_rfactor_whole_loop_and_outer_reduction_axis():
    """rfactor of an unsplit loop, and of the outer of two reduction loops."""
    A = te.placeholder((5, 6, 16), "float32", name="A")
    k1 = te.reduce_axis((0, 6), name="k1")
    k2 = te.reduce_axis((0, 16), name="k2")
    B = te.compute((5,), lambda i: te.sum(A[i, k1, k2], axis=[k1, k2]), name="B")
    a = RNG.standard_normal((5, 6, 16)).astype("float32")
    for which in (1, 2):
        sch = Schedule(te.create_prim_func([A, B]))
        loops = sch.get_loops(sch.get_block("B"))
        sch.rfactor(loops[which], 0)
        assert [s.value for s in _blocks(sch.func)["B_rf"].writes[0].buffer.shape] == [
            (6, 16)[which - 1], 5]
        out = _run(sch.func, a, np.full(5, np.nan, "float32"))
        np.testing.assert_allclose(out, a.sum(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_rfactor_under_split_spatial_loop():
    """Spatial loops below the outermost reduction loop are copied for the write-back."""
    sch = Schedule(_row_reduce(16, 32))
    b = sch.get_block("B")
    i, k = sch.get_loops(b)
    io, ii = sch.split(i, factors=[None, 4])
    ko, ki = sch.split(k, factors=[None, 4])
    sch.reorder(io, ko, ii, ki)
    sch.rfactor(ki, 1)
    a = RNG.standard_normal((16, 32)).astype("float32")
    out = _run(sch.func, a, np.full(16, np.nan, "float32"))
    np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_refusals_are_clear_and_leave_the_schedule_unchanged():
    sch = Schedule(_row_reduce(8, 30))
    b = sch.get_block("B")
    i, k = sch.get_loops(b)
    before = sch.func
    with pytest.raises(ScheduleError, match="loop 'i' is not bound to a reduction variable"):
        sch.rfactor(i, 0)
    with pytest.raises(ScheduleError, match="factor_axis 2 must be an int in"):
        sch.rfactor(k, 2)
    with pytest.raises(ScheduleError, match="factor_axis 'x' must be an int"):
        sch.rfactor(k, "x")
    with pytest.raises(ScheduleError, match="expected a LoopRV"):
        sch.rfactor(b, 0)
    assert sch.func is before
    _, ki = sch.split(k, factors=[None, 8])  # 30 is not a multiple of 8: a predicate
    split = sch.func
    with pytest.raises(ScheduleError, match="predicate on its reduction loops"):
        sch.rfactor(ki, 1)
    assert sch.func is split
    assert "rfactor" not in str(sch.trace)


def test_refusals_after_decompose_and_with_two_blocks():
    sch = Schedule(_row_reduce(8, 32))
    b = sch.get_block("B")
    _, k = sch.get_loops(b)
    sch.decompose_reduction(b, k)
    with pytest.raises(ScheduleError, match="has no init"):
        sch.rfactor(k, 0)
    # a loop holding two blocks
    A = te.placeholder((8, 32), "float32", name="A")
    k1 = te.reduce_axis((0, 32), name="k1")
    k2 = te.reduce_axis((0, 32), name="k2")
    S = te.compute((8,), lambda i: te.sum(A[i, k1], axis=k1), name="S")
    T = te.compute((8,), lambda i: te.sum(A[i, k2] * S[i], axis=k2), name="T")
    sch = Schedule(te.create_prim_func([A, T]))
    sch.compute_at(sch.get_block("S"), sch.get_loops(sch.get_block("T"))[0])
    (i,) = sch.get_loops(sch.get_block("S"))[:1]
    with pytest.raises(ScheduleError, match="must hold exactly one block, it holds 2"):
        sch.rfactor(i, 0)


def test_refuses_update_without_associative_combiner():
    A = te.placeholder((4, 16), "float32", name="A")
    k = te.reduce_axis((0, 16), name="k")
    decay = te.comm_reducer(lambda acc, x: acc * tir.const("float32", 0.5) + x,
                            lambda t: tir.const(t, 0.0), name="decay")
    B = te.compute((4,), lambda i: decay(A[i, k], axis=k), name="B")
    sch = Schedule(te.create_prim_func([A, B]))
    _, kl = sch.get_loops(sch.get_block("B"))
    with pytest.raises(ScheduleError, match="no associative combiner"):
        sch.rfactor(kl, 0)


def test_trace_replay_gives_the_same_function():
    sch = Schedule(_row_reduce(16, 64, "max"))
    _vector_schedule(sch)
    assert "sch.rfactor(loop=" in str(sch.trace)
    replayed = sch.trace.apply_to_schedule(Schedule(_row_reduce(16, 64, "max")))
    assert_structural_equal(replayed.func, sch.func)


def test_partials_are_a_stack_vector_in_c():
    """After compaction the partial results are a small local array updated as a vector."""
    lanes = Target("c").vector_lanes("float32")
    sch = Schedule(_row_reduce(16, 8 * lanes))
    _vector_schedule(sch, lanes)
    src = cg.generate_source({"f": sch.func})[0]
    assert f"float B_rf[{lanes}]" in src
    # a stack array, 64-byte aligned: accessed through the aligned vector type
    assert f"*(float32x{lanes}_a*)(B_rf + 0) = (*(float32x{lanes}_a*)(B_rf + 0)) +" in src
    assert "malloc" not in src.split("f__body", 1)[1].split("unchecked entry", 1)[0]
