"""compact_buffers: scheduled caches are allocated inside the loop that uses them, shrunk to
the region one iteration touches, and numerics do not change."""

from __future__ import annotations

import numpy as np

from kiln import te
from kiln.codegen import c as codegen_c
from kiln.testing.tir_testing import allocations, check_matmul, matmul_func
from kiln.tir.schedule import Schedule
from kiln.tir.transform.compact_buffers import compact_buffers

RNG = np.random.default_rng(3)


def _tiled_matmul(m=12, n=32, k=8, rows=4, cols=16):
    sch = Schedule(matmul_func(m, n, k))
    blk = sch.get_block("C")
    i, j, rr = sch.get_loops(blk)
    io, ii = sch.split(i, factors=[None, rows])
    jo, ji = sch.split(j, factors=[None, cols])
    sch.reorder(io, jo, rr, ii, ji)
    local = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(local, jo)
    sch.decompose_reduction(blk, rr)
    return sch


def test_register_tile_becomes_a_small_buffer_inside_its_loop():
    sch = _tiled_matmul()
    assert allocations(compact_buffers(sch.func).body) == [("C_local", (4, 16), ("i_0", "j_0"))]


def test_numerics_and_stack_array():
    sch = _tiled_matmul(m=10)  # 10 rows: the last tile is predicated
    mod = codegen_c.build({"mm": sch.func})
    assert "C_local[64]" in mod.source
    check_matmul(mod, "mm", 10, 32, 8, RNG)


def test_packed_panel_under_parallel_loop():
    """cache_read of B at the column-panel loop: one panel per iteration (and per thread)."""
    sch = Schedule(matmul_func(16, 32, 8))
    blk = sch.get_block("C")
    i, j, rr = sch.get_loops(blk)
    jo, ji = sch.split(j, factors=[None, 8])
    sch.reorder(jo, i, rr, ji)
    panel = sch.cache_read(blk, 1, "global")
    sch.compute_at(panel, jo)
    sch.parallel(jo)
    assert allocations(compact_buffers(sch.func).body) == [("B_global", (8, 8), ("j_0",))]
    check_matmul(codegen_c.build({"mm": sch.func}), "mm", 16, 32, 8, RNG)


def test_top_level_intermediate_is_left_alone():
    a = te.placeholder((8, 8), "float32", name="A")
    t = te.compute((8, 8), lambda i, j: a[i, j] * 2.0, name="T")
    out = te.compute((8, 8), lambda i, j: t[j, i] + 1.0, name="O")
    func = te.create_prim_func([a, out])
    assert compact_buffers(func) is func


def test_lowered_functions_are_unchanged():
    from kiln.tir.transform.lower import lower

    low = lower(_tiled_matmul().func)
    assert compact_buffers(low) is low


def test_cache_of_top_level_stages_is_not_moved():
    n = te.size_var("n")
    a = te.placeholder((n,), "float32", name="A")
    out = te.compute((n,), lambda i: a[i] + 1.0, name="O")
    sch = Schedule(te.create_prim_func([a, out]))
    blk = sch.get_block("O")
    (i,) = sch.get_loops(blk)
    local = sch.cache_write(blk, 0, "local")
    del i, local
    func = sch.func
    # the cache is written and read by two top-level stages: it stays at the root
    assert compact_buffers(func) is func
