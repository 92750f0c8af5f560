"""Reductions bound to threadIdx: the per-thread accumulation, the ThreadAllreduce, the write
by one thread, and what the pass refuses."""

from __future__ import annotations

import pytest

from kiln import te, tir
from kiln.ir.errors import LoweringError
from kiln.testing.tir_testing import gpu_row_reduce_func, matmul_func
from kiln.tir import Schedule
from kiln.tir.gpu import ThreadAllreduce
from kiln.tir.transform.cross_thread_reduction import lower_cross_thread_reduction


def _nodes(func, cls):
    out = []
    tir.post_order_visit(func.body, lambda n: out.append(n) if isinstance(n, cls) else None)
    return out


def test_row_reduction_becomes_accumulate_allreduce_write():
    func = lower_cross_thread_reduction(gpu_row_reduce_func(8, 1000, threads=128))
    (red,) = _nodes(func, ThreadAllreduce)
    assert red.tags == ("threadIdx.x",)
    assert type(red.reducer.result).__name__ == "Add"
    text = str(func)
    assert "out_acc[0] = out_acc[0] + x[" in text
    assert "if k_0 * 128 + k_1 < 1000" in text or "k_1 + k_0 * 128 < 1000" in text
    assert "if k_1 == 0:" in text and "out[i] = out_red[0]" in text
    assert not _nodes(func, tir.Block) or all(b.name_hint == "root" for b in _nodes(
        func, tir.Block))


def test_max_reducer_and_its_identity():
    func = lower_cross_thread_reduction(gpu_row_reduce_func(4, 64, threads=32, reducer="max"))
    (red,) = _nodes(func, ThreadAllreduce)
    assert red.reducer.identity.value == float("-inf")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_float_reductions_accumulate_in_float32(dtype):
    """Each thread's partial sum, the threads' combination and the reducer are float32; the
    store rounds once to the output's dtype."""
    func = lower_cross_thread_reduction(gpu_row_reduce_func(8, 1000, dtype, threads=128))
    (red,) = _nodes(func, ThreadAllreduce)
    assert str(red.reducer.result.dtype) == "float32"
    buffers = {n.buffer.name: str(n.buffer.dtype) for n in _nodes(func, tir.Allocate)}
    assert buffers == {"out_acc": "float32", "out_red": "float32"}
    (write,) = [n for n in _nodes(func, tir.BufferStore) if n.buffer.name == "out"]
    assert str(write.value.dtype) == dtype and type(write.value).__name__ == "Cast"
    func32 = lower_cross_thread_reduction(gpu_row_reduce_func(8, 1000, "int32", threads=128))
    assert str(_nodes(func32, ThreadAllreduce)[0].reducer.result.dtype) == "int32"


def test_serial_reduction_loops_above_accumulate_into_the_output():
    x = te.placeholder((4, 8, 64), "float32", name="x")
    a = te.reduce_axis((0, 8), name="a")
    b = te.reduce_axis((0, 64), name="b")
    out = te.compute((4,), lambda i: te.sum(x[i, a, b], axis=[a, b]), name="out")
    sch = Schedule(te.create_prim_func([x, out]))
    i, ra, rb = sch.get_loops(sch.get_block("out"))
    sch.bind(i, "blockIdx.x")
    sch.bind(rb, "threadIdx.x")
    text = str(lower_cross_thread_reduction(sch.func))
    assert "if a == 0:" in text and "out[i] = out[i] + out_red[0]" in text


def test_refusals_name_the_block():
    sch = Schedule(matmul_func(8, 8, 64))
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.reorder(k, j)
    sch.bind(k, "threadIdx.x")
    with pytest.raises(LoweringError, match="block 'C'.*does not run over reduction"):
        lower_cross_thread_reduction(sch.func)
    sch = Schedule(matmul_func(8, 8, 64))
    i, j, k = sch.get_loops(sch.get_block("C"))
    sch.decompose_reduction(sch.get_block("C"), k)
    sch.bind(k, "threadIdx.x")
    with pytest.raises(LoweringError, match="block 'C'.*no init"):
        lower_cross_thread_reduction(sch.func)
