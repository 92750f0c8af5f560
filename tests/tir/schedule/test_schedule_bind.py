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
