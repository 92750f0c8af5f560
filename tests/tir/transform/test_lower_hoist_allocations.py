"""hoist_allocations: heap scratch leaves the serial loops around it; under a parallel loop each
thread allocates it once."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as codegen_c
from kiln.ir.abi import CHECK_FAILED
from kiln.tir import stmt as S
from kiln.tir.schedule import Schedule
from kiln.tir.transform.hoist_allocations import (
    STACK_LIMIT,
    hoist_allocations,
    invariant_heap_allocations,
    on_stack,
)
from kiln.tir.transform.lower import lower

RNG = np.random.default_rng(5)
B, H, W = 4, 128, 160  # one [H, W] float32 slice is 80 KiB: over the stack limit


def _staged(parallel: bool) -> Schedule:
    """``out[b] = (2 * x[b]).T + 1`` with the doubled slice computed per ``b``."""
    x = te.placeholder((B, H, W), "float32", name="X")
    t = te.compute((B, H, W), lambda b, i, j: x[b, i, j] * 2.0, name="T")
    out = te.compute((B, W, H), lambda b, j, i: t[b, i, j] + 1.0, name="O")
    sch = Schedule(te.create_prim_func([x, out]))
    b = sch.get_loops(sch.get_block("O"))[0]
    sch.compute_at(sch.get_block("T"), b)
    if parallel:
        sch.parallel(b)
    return sch


def _alloc_depths(stmt, depth=0, out=None):
    """``(buffer name, number of enclosing loops)`` of every Allocate."""
    out = [] if out is None else out
    if isinstance(stmt, S.Allocate):
        out.append((stmt.buffer.name, depth))
        _alloc_depths(stmt.body, depth, out)
    elif isinstance(stmt, S.For):
        _alloc_depths(stmt.body, depth + 1, out)
    elif isinstance(stmt, S.SeqStmt):
        for s in stmt.seq:
            _alloc_depths(s, depth, out)
    elif isinstance(stmt, S.IfThenElse):
        _alloc_depths(stmt.then_case, depth, out)
    elif hasattr(stmt, "body"):
        _alloc_depths(stmt.body, depth, out)
    return out


def _run(sch):
    mod = codegen_c.build({"f": sch.func})
    x = RNG.standard_normal((B, H, W), dtype=np.float32)
    out = np.full((B, W, H), np.nan, np.float32)
    mod["f"](x, out)
    np.testing.assert_allclose(out, (2 * x).transpose(0, 2, 1) + 1, rtol=1e-6)
    return mod.source


def test_serial_loop_allocation_is_hoisted():
    low = lower(_staged(parallel=False).func)
    assert _alloc_depths(low.body) == [("T", 0)]  # out of the loop over b
    src = _run(_staged(parallel=False))
    assert src.count("kiln_alloc((int64_t)") == 1


def test_parallel_loop_gets_one_buffer_per_thread():
    low = lower(_staged(parallel=True).func)
    assert _alloc_depths(low.body) == [("T", 1)]  # stays inside the parallel loop
    src = _run(_staged(parallel=True))
    # each task of the thread pool allocates it once for its range of iterations
    task = src[src.index("static void f__par0_task("):]
    task = task[:task.index("\n}")]
    assert task.index("kiln_alloc(") < task.index("for (int64_t kiln_i") < task.rindex("free(")
    assert "KILN_CHECK_ALLOC" in task  # a task without its scratch records it and skips


@pytest.mark.parametrize("parallel", [False, True])
def test_a_failed_allocation_fails_the_call_instead_of_aborting(parallel):
    """A heap buffer whose size the machine cannot give (a symbolic size, here 2^61 floats)
    makes the kernel fail with the buffer and its size, in a serial or a parallel loop."""
    n = tir.Var("n", "int64")
    x = te.placeholder((B, n), "float32", name="X")
    t = te.compute((B, n), lambda b, i: x[b, i] * 2.0, name="T")
    out = te.compute((B, n), lambda b, i: t[b, n - 1 - i] + 1.0, name="O")
    sch = Schedule(te.create_prim_func([x, out]))
    b = sch.get_loops(sch.get_block("O"))[0]
    sch.compute_at(sch.get_block("T"), b)
    if parallel:
        sch.parallel(b)
    mod = codegen_c.build({"f": sch.func})
    size = 2**61
    fn = mod.unchecked_function("f")  # the arrays are never touched: the allocation fails
    tiny = np.zeros(1, np.float32)
    data = (ctypes.c_void_p * 2)(tiny.ctypes.data, tiny.ctypes.data)
    assert fn(data, (ctypes.c_int64 * 1)(size)) == CHECK_FAILED
    assert "f: buffer T: out of memory allocating" in mod.last_error()
    small = np.ones((B, 3), np.float32)
    got = np.zeros((B, 3), np.float32)
    mod["f"](small, got)
    np.testing.assert_array_equal(got, small[:, ::-1] * 2 + 1)


def test_sequence_allocation_is_lifted_then_hoisted():
    """An allocation after another statement of the loop body still leaves the loop."""
    n = tir.Var("n", "int64")
    big = tir.decl_buffer((STACK_LIMIT,), "float32", "big")
    other = tir.decl_buffer((4,), "float32", "other")
    i = tir.Var("i", "int64")
    store = S.BufferStore(big, tir.const("float32", 1.0), (i,))
    body = S.SeqStmt((S.BufferStore(other, tir.const("float32", 0.0), (tir.const("int64", 0),)),
                      S.Allocate(big, store)))
    loop = S.For(i, 0, n, S.ForKind.SERIAL, body)
    func = tir.PrimFunc(params=[n], buffer_map={}, body=S.Allocate(other, loop))
    out = hoist_allocations(func)
    assert _alloc_depths(out.body) == [("other", 0), ("big", 0)]


def test_size_using_the_loop_variable_stays():
    i = tir.Var("i", "int64")
    buf = tir.decl_buffer((i * STACK_LIMIT + 1,), "float32", "grow")
    loop = S.For(i, 0, 8, S.ForKind.SERIAL,
                 S.Allocate(buf, S.BufferStore(buf, tir.const("float32", 1.0), (i,))))
    assert invariant_heap_allocations(loop) == ([], loop.body)


@pytest.mark.parametrize("elems,stack", [(16, True), (STACK_LIMIT // 4, True),
                                         (STACK_LIMIT // 4 + 1, False)])
def test_stack_limit(elems, stack):
    assert on_stack(tir.decl_buffer((elems,), "float32", "b")) is stack
