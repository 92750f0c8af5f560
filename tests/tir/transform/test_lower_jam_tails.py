"""jam_tails: the partitioned tail tiles of a loop annotated JAM_TAILS run k rows at a time in
one loop nest, each row with its own accumulators; numerics do not change."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import te, tir
from kiln.codegen import c as codegen_c
from kiln.tir import stmt as S
from kiln.tir.schedule import Schedule
from kiln.tir.transform.lower import lower

RNG = np.random.default_rng(11)


def _batched(b: int, m: int, n: int = 16, k: int = 8, rows: int = 6, jam: int | None = 2):
    """``C[b, i, :] = A[b, i, :] @ B`` with 6-row register tiles along ``i`` (``m = 20`` leaves
    a 2-row tail in every batch), the batch loop annotated to jam ``jam`` tails."""
    a = te.placeholder((b, m, k), "float32", name="A")
    w = te.placeholder((k, n), "float32", name="B")
    r = te.reduce_axis((0, k), name="r")
    c = te.compute((b, m, n), lambda bb, i, j: te.sum(a[bb, i, r] * w[r, j], axis=r), name="C")
    sch = Schedule(te.create_prim_func([a, w, c]))
    blk = sch.get_block("C")
    bb, i, j, rr = sch.get_loops(blk)
    io, ii = sch.split(i, factors=[None, rows])
    sch.reorder(bb, io, rr, ii, j)
    local = sch.cache_write(blk, 0, "local")
    sch.reverse_compute_at(local, io)
    sch.decompose_reduction(blk, rr)
    sch.unroll(ii)
    sch.vectorize(j)
    if jam:
        sch.annotate(bb, S.JAM_TAILS, jam)
    return sch.func


def _loops(stmt, prefix):
    out = []
    tir.post_order_visit(stmt, lambda n: out.append(n) if isinstance(n, S.For)
                         and n.loop_var.name.startswith(prefix) else None)
    return out


def _allocs(stmt):
    out = []
    tir.post_order_visit(stmt, lambda n: out.append(n.buffer) if isinstance(n, S.Allocate)
                         else None)
    return out


def test_tails_of_two_rows_share_one_reduction_loop():
    low = lower(_batched(5, 20))
    # the rows keep their full tiles; the tails run over row pairs (2 of them) and the fifth
    # row's tail follows on its own
    (jammed,) = _loops(low.body, "bb_j")
    assert int(jammed.extent.value) == 2
    (rows,) = [lp for lp in _loops(low.body, "bb") if lp.loop_var.name == "bb"]
    assert S.JAM_TAILS not in rows.annotations
    inner = _loops(jammed.body, "r")
    assert len(inner) == 1, "the two tails' reduction loops were not merged"
    # two distinct accumulator arrays inside the jammed loop
    names = {buf.data for buf in _allocs(jammed.body)}
    assert len(names) == len(_allocs(jammed.body)) >= 2


@pytest.mark.parametrize("b,m,jam", [(5, 20, 2), (4, 20, 2), (3, 23, 3), (1, 20, 2), (4, 18, 2)])
def test_numerics(b, m, jam):
    mod = codegen_c.build({"mm": _batched(b, m, jam=jam)})
    a = RNG.standard_normal((b, m, 8), dtype=np.float32)
    w = RNG.standard_normal((8, 16), dtype=np.float32)
    c = np.full((b, m, 16), np.nan, np.float32)
    mod["mm"](a, w, c)
    np.testing.assert_allclose(c, a @ w, rtol=1e-5, atol=1e-5)


def test_without_annotation_nothing_is_jammed():
    low = lower(_batched(5, 20, jam=None))
    assert not _loops(low.body, "bb_j")


def test_fewer_rows_than_the_factor_are_left_alone():
    low = lower(_batched(1, 20))
    assert not _loops(low.body, "bb_j")


def test_a_single_statement_body_is_jammed_whole():
    """With no full tiles before it (a tile that is all of its rows) the body is one statement:
    the loop itself runs k iterations at a time, jammed."""
    func = _batched(5, 4, rows=4)  # 4 rows in 4-row tiles: no partition, one tile per batch
    low = lower(func)
    assert not [lp for lp in _loops(low.body, "bb") if lp.loop_var.name == "bb"]
    (jammed,) = _loops(low.body, "bb_j")
    assert len(_loops(jammed.body, "r")) == 1
    mod = codegen_c.build({"mm": func})
    a = RNG.standard_normal((5, 4, 8), dtype=np.float32)
    w = RNG.standard_normal((8, 16), dtype=np.float32)
    c = np.full((5, 4, 16), np.nan, np.float32)
    mod["mm"](a, w, c)
    np.testing.assert_allclose(c, a @ w, rtol=1e-5, atol=1e-5)
