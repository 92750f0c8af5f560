"""Barrier insertion: where threads exchange data through shared memory, none where they do
not, and the errors for data exchanged where not every thread can wait."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.codegen.gpu.build import build
from kiln.ir.errors import LoweringError
from kiln.target import Target
from kiln.testing.tir_testing import elementwise_func, gpu_tiled_matmul_func
from kiln.tir import Schedule
from kiln.tir.gpu import KernelLaunch, is_barrier
from kiln.tir.transform import lower
from kiln.tir.transform.thread_sync import insert_thread_sync

OPENCL = Target("opencl")


def _barriers(func) -> int:
    n = [0]
    tir.post_order_visit(func.body, lambda s: n.__setitem__(0, n[0] + 1) if is_barrier(s)
                         else None)
    return n[0]


def test_tiled_matmul_gets_a_barrier_after_the_loads_and_one_before_the_next_tile():
    func = lower(gpu_tiled_matmul_func(32, 32, 64), OPENCL)
    assert _barriers(func) == 2
    text = str(func)
    loads = text.index("B_shared[ax0_1 * 16 + ax1_1] =")
    first = text.index("evaluate(gpu.barrier())")
    assert loads < first < text.index("A_shared[i_1 * 16")
    assert text.rstrip().endswith("evaluate(gpu.barrier())")  # end of the tile loop


def test_tiled_matmul_runs_correctly_on_opencl():
    rng = np.random.default_rng(0)
    mod = build({"mm": gpu_tiled_matmul_func(48, 32, 80)}, OPENCL)
    a = rng.standard_normal((48, 80)).astype("float32")
    b = rng.standard_normal((80, 32)).astype("float32")
    c = np.full((48, 32), np.nan, "float32")
    mod["mm"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-4)


def test_no_barrier_without_shared_memory():
    sch = Schedule(elementwise_func((64, 64), "float32", lambda x: x * x))
    i, j = sch.get_loops(sch.get_block("out"))
    sch.bind(i, "blockIdx.x")
    sch.bind(j, "threadIdx.x")
    assert _barriers(lower(sch.func, OPENCL)) == 0


def _kernel(body_of, loop: bool = False):
    """A one-block kernel of 64 threads whose body ``body_of(tx, S, out)`` uses a shared
    buffer ``S`` and writes ``out``; with ``loop``, inside a serial loop of 4 steps."""
    tx = tir.Var("threadIdx.x", "int32")
    t = tx.astype("int64")
    shared = tir.decl_buffer((64,), "float32", "S", scope="shared")
    out = tir.decl_buffer((64,), "float32", "out")
    body = body_of(t, shared, out)
    if loop:
        body = tir.For(tir.Var("s", "int64"), 0, 4, tir.ForKind.SERIAL, body)
    launch = KernelLaunch("k", (1, 1, 1), (64, 1, 1), ((tx, "threadIdx.x"),), body, (shared,))
    handle = tir.Var("out", "handle")
    return tir.PrimFunc((handle,), {handle: out}, launch)


def _exchange(t, shared, out):
    return tir.seq(tir.BufferStore(shared, t.astype("float32"), (t,)),
                   tir.BufferStore(out, shared[tir.const("int64", 63) - t], (t,)))


def test_exchange_gets_a_barrier_between_write_and_read():
    func = insert_thread_sync(_kernel(_exchange))
    seq = func.body.body.seq
    assert [is_barrier(x) for x in seq] == [False, True, False]


def test_exchange_in_a_loop_also_waits_before_the_next_write():
    func = insert_thread_sync(_kernel(_exchange, loop=True))
    body = func.body.body.body.seq
    assert [is_barrier(x) for x in body] == [False, True, False, True]


def test_same_thread_accesses_need_no_barrier():
    def own(t, shared, out):
        return tir.seq(tir.BufferStore(shared, t.astype("float32"), (t,)),
                       tir.BufferStore(out, shared[t] * 2.0, (t,)))

    assert _barriers(insert_thread_sync(_kernel(own, loop=True))) == 0


def test_exchange_under_a_thread_dependent_branch_is_an_error():
    def guarded(t, shared, out):
        return tir.IfThenElse(tir.lt(t, tir.const("int64", 48)), _exchange(t, shared, out))

    with pytest.raises(LoweringError, match="kernel k: threads exchange data under a branch"):
        insert_thread_sync(_kernel(guarded))


def test_kernels_are_launches_of_the_lowered_function():
    func = lower(gpu_tiled_matmul_func(32, 32, 32), OPENCL)
    assert isinstance(func.body, KernelLaunch)
