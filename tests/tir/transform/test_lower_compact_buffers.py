"""compact_buffers: scheduled caches are allocated inside the loop that uses them, shrunk to
the region one iteration touches, and numerics do not change."""

from __future__ import annotations

import numpy as np

from kiln import te
from kiln.codegen import c as codegen_c
from kiln.tir import stmt as S
from kiln.tir.schedule import Schedule
from kiln.tir.transform.compact_buffers import compact_buffers

RNG = np.random.default_rng(3)


def _allocs(func):
    """``(buffer name, shape, enclosing loop var names)`` of every Allocate, outermost first."""
    out = []

    def walk(stmt, loops):
        if isinstance(stmt, S.Allocate):
            out.append((stmt.buffer.name, tuple(int(d.value) for d in stmt.buffer.shape),
                        tuple(loops)))
            walk(stmt.body, loops)
        elif isinstance(stmt, S.For):
            walk(stmt.body, [*loops, stmt.loop_var.name])
        elif isinstance(stmt, S.SeqStmt):
            for s in stmt.seq:
                walk(s, loops)
        elif isinstance(stmt, S.BlockRealize):
            walk(stmt.block.body, loops)
        elif isinstance(stmt, S.IfThenElse):
            walk(stmt.then_case, loops)
            if stmt.else_case is not None:
                walk(stmt.else_case, loops)
        elif hasattr(stmt, "body"):
            walk(stmt.body, loops)

    walk(func.body, [])
    return out


def _tiled_matmul(m=12, n=32, k=8, rows=4, cols=16):
    a = te.placeholder((m, k), "float32", name="A")
    b = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    sch = Schedule(te.create_prim_func([a, b, c]))
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
    assert _allocs(compact_buffers(sch.func)) == [("C_local", (4, 16), ("i_0", "j_0"))]


def test_numerics_and_stack_array():
    sch = _tiled_matmul(m=10)  # 10 rows: the last tile is predicated
    mod = codegen_c.build({"mm": sch.func})
    assert "C_local[64]" in mod.source
    a = RNG.standard_normal((10, 8), dtype=np.float32)
    b = RNG.standard_normal((8, 32), dtype=np.float32)
    c = np.full((10, 32), np.nan, np.float32)
    mod["mm"](a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_packed_panel_under_parallel_loop():
    """cache_read of B at the column-panel loop: one panel per iteration (and per thread)."""
    a = te.placeholder((16, 8), "float32", name="A")
    b = te.placeholder((8, 32), "float32", name="B")
    r = te.reduce_axis((0, 8), name="r")
    c = te.compute((16, 32), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="C")
    sch = Schedule(te.create_prim_func([a, b, c]))
    blk = sch.get_block("C")
    i, j, rr = sch.get_loops(blk)
    jo, ji = sch.split(j, factors=[None, 8])
    sch.reorder(jo, i, rr, ji)
    panel = sch.cache_read(blk, 1, "global")
    sch.compute_at(panel, jo)
    sch.parallel(jo)
    assert _allocs(compact_buffers(sch.func)) == [("B_global", (8, 8), ("j_0",))]
    mod = codegen_c.build({"mm": sch.func})
    x = RNG.standard_normal((16, 8), dtype=np.float32)
    y = RNG.standard_normal((8, 32), dtype=np.float32)
    out = np.full((16, 32), np.nan, np.float32)
    mod["mm"](x, y, out)
    np.testing.assert_allclose(out, x @ y, rtol=1e-5, atol=1e-5)


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
