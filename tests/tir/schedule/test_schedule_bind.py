"""Schedule.bind: loops on GPU blocks and threads, its checks, trace and printing."""

from __future__ import annotations

import pytest

from kiln import te
from kiln.ir.errors import ScheduleError
from kiln.testing.tir_testing import elementwise_func, matmul_func
from kiln.tir import Schedule
from kiln.tir.stmt import THREAD_TAG, ForKind


def _ew() -> Schedule:
    return Schedule(elementwise_func((64, 32), "float32", lambda x: x + 1.0))


def test_bind_marks_the_loop_and_is_traced_and_printed():
    sch = _ew()
    i, j = sch.get_loops(sch.get_block("out"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    loop = sch.get(i)
    assert loop.kind == ForKind.THREAD_BINDING and loop.annotations[THREAD_TAG] == "blockIdx.x"
    assert 'thread_binding(64, thread="blockIdx.x")' in str(sch.func)
    assert 'sch.bind(loop=l1, thread_axis="blockIdx.x")' in str(sch.trace)
    replay = sch.trace.apply_to_schedule(Schedule(elementwise_func(
        (64, 32), "float32", lambda x: x + 1.0)))
    assert str(replay.func) == str(sch.func)
    sch.bind(i, "blockIdx.x")  # binding again to the same tag changes nothing


def test_bind_checks():
    sch = _ew()
    i, j = sch.get_loops(sch.get_block("out"))
    with pytest.raises(ScheduleError, match="not a thread tag.*threadIdx.x"):
        sch.bind(i, "warp.x")
    sch.bind(i, "threadIdx.x")
    with pytest.raises(ScheduleError, match="already bound to threadIdx.x"):
        sch.bind(i, "threadIdx.y")
    with pytest.raises(ScheduleError, match="same nest is already bound to threadIdx.x"):
        sch.bind(j, "threadIdx.x")
    with pytest.raises(ScheduleError, match="split: loop .* is bound to threadIdx.x"):
        sch.split(i, [None, 4])
    with pytest.raises(ScheduleError, match="vectorize: loop .* is bound"):
        sch.vectorize(i)
    sch2 = _ew()
    a, b = sch2.get_loops(sch2.get_block("out"))
    sch2.parallel(a)
    with pytest.raises(ScheduleError, match="parallel, not serial"):
        sch2.bind(a, "blockIdx.x")


def test_reduction_loops_bind_to_threads_only():
    sch = Schedule(matmul_func(8, 8, 64))
    i, j, k = sch.get_loops(sch.get_block("C"))
    with pytest.raises(ScheduleError, match="only threadIdx loops may carry a reduction"):
        sch.bind(k, "blockIdx.x")
    sch.bind(k, "threadIdx.x")  # a cross-thread reduction, lowered later


def test_bind_keeps_te_semantics_of_an_unbound_function():
    a = te.placeholder((16,), "float32", name="a")
    b = te.compute((16,), lambda i: a[i] * 2.0, name="b")
    sch = Schedule(te.create_prim_func([a, b]))
    (i,) = sch.get_loops(sch.get_block("b"))
    io, ii = sch.split(i, [None, 8])
    sch.bind(io, "blockIdx.x")
    sch.bind(ii, "threadIdx.x")
    assert [sch.get(lp).annotations[THREAD_TAG] for lp in (io, ii)] == ["blockIdx.x",
                                                                        "threadIdx.x"]


def _staged(threads: int) -> tuple[Schedule, object]:
    """out = x + 1 over 64 x 32: rows on blocks, columns on ``threads`` threads (x 32/threads
    each), x staged in shared memory at the thread loop."""
    sch = _ew()
    blk = sch.get_block("out")
    i, j = sch.get_loops(blk)
    jo, ji = sch.split(j, [threads, None])
    sch.bind(i, "blockIdx.x")
    sch.bind(jo, "threadIdx.x")
    copy = sch.cache_read(blk, 0, "shared")
    sch.compute_at(copy, jo)
    return sch, copy


def test_a_shared_copy_under_a_thread_loop_covers_the_block_and_is_shared():
    """compute_at of a shared copy under threadIdx loops copies what all the block's threads
    read (here the whole row of 32), and its loop may be bound to the same tag: the threads
    divide the copy."""
    sch, copy = _staged(32)
    (ax,) = sch.get_loops(copy)[-1:]
    assert sch.get(ax).extent.value == 32
    sch.bind(ax, "threadIdx.x")
    assert sch.get(ax).annotations[THREAD_TAG] == "threadIdx.x"


def test_a_shared_copy_longer_than_the_threads_is_refused():
    sch, copy = _staged(16)
    (ax,) = sch.get_loops(copy)[-1:]
    assert sch.get(ax).extent.value == 32
    with pytest.raises(ScheduleError, match="32 iterations and .* 16 threads"):
        sch.bind(ax, "threadIdx.x")
    a, b = sch.split(ax, [None, 16])
    sch.bind(b, "threadIdx.x")  # 2 elements per thread


def test_a_copy_into_local_memory_is_not_shared():
    sch = _ew()
    blk = sch.get_block("out")
    i, j = sch.get_loops(blk)
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    copy = sch.cache_read(blk, 0, "local")
    sch.compute_at(copy, j, preserve_unit_loops=True)
    (ax,) = sch.get_loops(copy)[-1:]
    with pytest.raises(ScheduleError, match="writes 'x0_local' \\(scope 'local'\\)"):
        sch.bind(ax, "threadIdx.x")
