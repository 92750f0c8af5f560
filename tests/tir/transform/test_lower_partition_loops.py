"""partition_loops: a tile loop whose last iteration is guarded is split into full iterations
(guards gone) and a guarded tail; numerics do not change."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.arith import Analyzer
from kiln.codegen import c as codegen_c
from kiln.testing.tir_testing import check_matmul, matmul_func
from kiln.tir import stmt as S
from kiln.tir.schedule import Schedule
from kiln.tir.transform import partition_loops as pl
from kiln.tir.transform.lower import lower

RNG = np.random.default_rng(9)


def _tiled(m=20, n=16, k=8, rows=6):
    """C = A @ B with 6-row register tiles: 20 rows leave a tail of 2 rows."""
    sch = Schedule(matmul_func(m, n, k))
    blk = sch.get_block("C")
    i, j, rr = sch.get_loops(blk)
    io, ii = sch.split(i, factors=[None, rows])
    sch.reorder(io, rr, ii, j)
    local = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(local, io)
    sch.decompose_reduction(blk, rr)
    sch.unroll(ii)
    sch.vectorize(j)
    return sch


def _loops_named(stmt, prefix):
    out = []

    def visit(n):
        if isinstance(n, S.For) and n.loop_var.name.startswith(prefix):
            out.append(n)

    tir.post_order_visit(stmt, visit)
    return out


def _has_if(stmt):
    found = []
    tir.post_order_visit(stmt, lambda n: found.append(n) if isinstance(n, S.IfThenElse) else None)
    return bool(found)


def test_full_tiles_lose_their_guards():
    low = lower(_tiled().func)
    # the full tiles loop over i_0 in [0, 3) without a guard; the one-iteration tail loop is
    # simplified into straight code that keeps its guards
    (main,) = _loops_named(low.body, "i_0")
    assert (int(main.min.value), int(main.extent.value)) == (0, 3)
    assert not _has_if(main.body)
    assert _has_if(low.body)


@pytest.mark.parametrize("m", [18, 20, 23])
def test_numerics(m):
    mod = codegen_c.build({"mm": _tiled(m=m).func})
    check_matmul(mod, "mm", m, 16, 8, RNG)


def test_divisible_tiles_are_left_alone():
    low = lower(_tiled(m=18).func)
    assert [int(lp.extent.value) for lp in _loops_named(low.body, "i_0")] == [3]


def test_large_body_is_not_copied(monkeypatch):
    monkeypatch.setattr(pl, "MAX_NODES", 10)
    low = lower(_tiled().func)
    assert [int(lp.extent.value) for lp in _loops_named(low.body, "i_0")] == [4]


def _var():
    return tir.Var("v", "int64")


@pytest.mark.parametrize("make,first", [
    (lambda v: v * 6 < 54, 9),          # 6v < 54 until v = 9
    (lambda v: v * 6 + 5 < 56, 9),      # 6v + 5 < 56 until v = 9 (8: 53 < 56, 9: 59)
    (lambda v: v * 4 <= 12, 4),         # LE: 12 <= 12 at v = 3, fails at 4
    (lambda v: 10 - v < 3, None),       # holds on a suffix: not partitioned
    (lambda v: (v // 2) * 2 < 7, None),  # not affine: refused by the check at the boundary
])
def test_first_failure(make, first):
    v = _var()
    assert pl._first_failure(make(v), v, 0, Analyzer()) == first
