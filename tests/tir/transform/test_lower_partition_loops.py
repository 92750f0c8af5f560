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


# ---- symbolic extents (a dynamic batch) ------------------------------------------------------
def test_symbolic_rows_split_into_full_tiles_and_a_tail():
    """``for i_0 in [0, (m + 5) / 6)`` with guards ``i_0 * 6 + r < m``: the full tiles run
    ``[0, m / 6)`` with no guard left, the tail keeps them."""
    m = tir.Var("m", "int64")
    low = lower(_tiled(m=m).func)
    loops = _loops_named(low.body, "i_0")
    assert len(loops) == 2
    main, tail = loops
    assert not _has_if(main.body) and _has_if(tail.body)
    assert "m" in str(main.extent) and "m" in str(tail.min)


def test_symbolic_tail_is_specialised_per_row_count(monkeypatch):
    """In the tail tile the guards ``6 * i_0_t + r < m`` hold for ``r < m - 6 * i_0_t``: one
    copy of the tile per row count, chosen by an if-chain, none with a guard in its reduction
    loop; too large a body keeps the guarded tail."""
    m = tir.Var("m", "int64")
    low = lower(_tiled(m=m).func)
    _, tail = _loops_named(low.body, "i_0")
    reductions = _loops_named(tail.body, "r")
    assert len(reductions) == 6  # row counts 1..5 and 6 (the none-hold case does no work)
    assert not any(_has_if(r.body) for r in reductions)
    monkeypatch.setattr(pl, "MAX_SPECIALISED_NODES", 10)
    _, tail = _loops_named(lower(_tiled(m=m).func).body, "i_0")
    (reduction,) = _loops_named(tail.body, "r")
    assert _has_if(reduction.body)


@pytest.mark.parametrize("m", [0, 1, 5, 6, 7, 13, 20])
def test_symbolic_numerics(m):
    mod = codegen_c.build({"mm": _tiled(m=tir.Var("m", "int64")).func})
    check_matmul(mod, "mm", m, 16, 8, RNG)


@pytest.mark.parametrize("make,first", [
    (lambda v, n: v * 6 + 5 < n, lambda n: n // 6),
    (lambda v, n: v * 6 < n, lambda n: -(-n // 6)),
    (lambda v, n: v * 4 + 1 <= n, lambda n: (n - 1) // 4 + 1),
])
@pytest.mark.parametrize("n", [0, 1, 5, 6, 7, 12, 13, 100])
def test_symbolic_failure(make, first, n):
    from kiln.tir.functor import substitute

    v, nv = _var(), tir.Var("n", "int64")
    got = pl._symbolic_failure(make(v, nv), v, 0, Analyzer())
    value = Analyzer().simplify(substitute(got, {nv: tir.IntImm("int64", n)}))
    assert int(value.value) == first(n)


def test_symbolic_failure_refuses_non_affine_and_inner_variables():
    v, nv = _var(), tir.Var("n", "int64")
    assert pl._symbolic_failure((v // 2) * 2 < nv, v, 0, Analyzer()) is None
    assert pl._symbolic_failure(nv - v < 3, v, 0, Analyzer()) is None  # holds on a suffix
    # a guard on a variable a let binds inside the loop is not a candidate; one on an inner
    # loop of constant range is, taken at the loop's strictest end
    w = tir.Var("w", "int64")
    let = S.LetStmt(w, nv * 2, S.IfThenElse(v * 6 + w < nv, S.Evaluate(tir.IntImm("int32", 0))))
    assert pl._symbolic_guards(let, v)[0] == []
    loop = S.For(w, tir.IntImm("int64", 0), tir.IntImm("int64", 4), S.ForKind.SERIAL,
                 S.IfThenElse(v * 6 + w < nv, S.Evaluate(tir.IntImm("int32", 0))))
    (atom,), ranges = pl._symbolic_guards(loop, v)
    got = pl._symbolic_failure(atom, v, 0, Analyzer(), ranges)
    for n in (0, 3, 4, 9, 10, 20):  # 6v + 3 < n for every w in [0, 3]
        value = Analyzer().simplify(tir.substitute(got, {nv: tir.IntImm("int64", n)}))
        assert int(value.value) == max(0, -(-(n - 3) // 6))
    # not affine in the inner variable: its strictest value is not known from the ends
    loop = S.For(w, tir.IntImm("int64", 0), tir.IntImm("int64", 4), S.ForKind.SERIAL,
                 S.IfThenElse(v * 6 + (w // 2) * 3 < nv, S.Evaluate(tir.IntImm("int32", 0))))
    (atom,), ranges = pl._symbolic_guards(loop, v)
    assert pl._symbolic_failure(atom, v, 0, Analyzer(), ranges) is None
