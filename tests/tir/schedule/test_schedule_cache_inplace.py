"""cache_inplace: a K-blocked GEMM's register tile staged through the output per reduction
block."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.codegen import c as codegen_c
from kiln.ir import ScheduleError
from kiln.testing.tir_testing import allocations, check_matmul, matmul_func
from kiln.tir import Schedule
from kiln.tir.transform.compact_buffers import compact_buffers

RNG = np.random.default_rng(11)


def _k_blocked(m=10, n=32, k=24, rows=4, cols=16, kc=8):
    """Loops ``i_0, j_0, r_0, i_1, j_1, r_1``... with the tile loops inside the reduction
    block loop ``r_0``: the accumulator is reloaded from C once per block of ``kc``."""
    sch = Schedule(matmul_func(m, n, k))
    blk = sch.get_block("C")
    i, j, r = sch.get_loops(blk)
    io, ii = sch.split(i, factors=[None, rows])
    jo, ji = sch.split(j, factors=[None, cols])
    ro, ri = sch.split(r, factors=[None, kc])
    sch.reorder(io, jo, ro, ri, ii, ji)
    sch.decompose_reduction(blk, ro)
    read, write = sch.cache_inplace(blk, 0, "local", ro)
    return sch, read, write


def test_copies_surround_the_update_inside_the_loop():
    sch, read, write = _k_blocked()
    assert sch.get(read).name_hint == "C_local"
    assert sch.get(write).name_hint == "C_local_wb"
    # read copy, update, write copy: in that order under the reduction-block loop
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_loops(sch.get_block(
        "C"))[2])]
    assert names == ["C_local", "C", "C_local_wb"]
    # compaction shrinks the accumulator to one tile, allocated inside the reduction-block loop
    allocs = allocations(compact_buffers(sch.func).body)
    assert allocs == [("C_local", (4, 16), ("i_0", "j_0", "r_0"))]


@pytest.mark.parametrize("m", [8, 10])  # 10 rows: the last row tile is predicated
def test_numerics(m):
    sch, _, _ = _k_blocked(m=m)
    mod = codegen_c.build({"mm": sch.func})
    assert "C_local[64]" in mod.source  # the tile is a stack array
    check_matmul(mod, "mm", m, 32, 24, RNG)


def test_trace_replays():
    sch, _, _ = _k_blocked()
    again = sch.trace.apply_to_schedule(Schedule(matmul_func(10, 32, 24)))
    from kiln.ir import assert_structural_equal

    assert_structural_equal(again.func, sch.func)


def test_errors():
    sch = Schedule(matmul_func(8, 16, 8))
    blk = sch.get_block("C")
    i, j, r = sch.get_loops(blk)
    with pytest.raises(ScheduleError, match="does not write"):
        sch.cache_inplace(blk, 0, "local", i)  # read 0 is A (before decompose_reduction)
    sch.decompose_reduction(blk, r)  # the update now reads C first
    with pytest.raises(ScheduleError, match="storage scope"):
        sch.cache_inplace(blk, 0, "no scope!", i)
    with pytest.raises(ScheduleError, match="out of range"):
        sch.cache_inplace(blk, 7, "local", i)
    # the init block writes C inside loop i too: staging C there would hide its stores
    with pytest.raises(ScheduleError, match="also accesses"):
        sch.cache_inplace(blk, 0, "local", i)
    other = Schedule(matmul_func(8, 16, 8))
    (oi, _, _) = other.get_loops(other.get_block("C"))
    with pytest.raises(ScheduleError):
        sch.cache_inplace(blk, 0, "local", oi)  # a loop of another schedule
