"""partition_loops.partition_at_branches: a loop is split at every iteration where an ``if`` on
its variable changes value (both ends of a padding window: three pieces), each piece without
the branch; refusals leave the loop; numerics do not change."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import tir
from kiln.arith import Analyzer
from kiln.ir.node import assert_structural_equal
from kiln.testing.tir_testing import loop_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform import partition_loops as pl
from kiln.tir.transform.simplify import simplify

RNG = np.random.default_rng(23)
H = 8


def _i(v: int) -> tir.IntImm:
    return tir.IntImm("int64", v)


def _bufs():
    return tir.decl_buffer((H,), "float32", "A"), tir.decl_buffer((H + 2,), "float32", "B")


def _padded():
    """``B[i] = A[i - 1] * 2`` inside the window ``0 <= i - 1 < H``, else 0: a padded row."""
    a, b = _bufs()
    i = tir.Var("i", "int64")
    inside = tir.And(tir.le(_i(0), i - 1), tir.lt(i - 1, _i(H)))
    return loop_func([a, b], S.For(i, _i(0), _i(H + 2), S.ForKind.SERIAL, S.IfThenElse(
        inside, S.BufferStore(b, a[i - 1] * 2.0, (i,)),
        S.BufferStore(b, tir.FloatImm("float32", 0.0), (i,)))))


def test_window_gives_three_branch_free_pieces():
    got = simplify(pl.partition_at_branches(_padded()))
    a, b = _bufs()
    i = tir.Var("i", "int64")
    zero = tir.FloatImm("float32", 0.0)
    want = loop_func([a, b], S.seq(
        S.BufferStore(b, zero, (_i(0),)),
        S.For(i, _i(1), _i(H), S.ForKind.SERIAL, S.BufferStore(b, a[i - 1] * 2.0, (i,))),
        S.BufferStore(b, zero, (_i(H + 1),))))
    assert script(got) == script(simplify(want)), script(got)
    assert_structural_equal(got, simplify(want))


def test_equality_splits_around_its_root():
    a, b = _bufs()
    i = tir.Var("i", "int64")
    func = loop_func([a, b], S.For(i, _i(0), _i(H), S.ForKind.SERIAL, S.IfThenElse(
        tir.eq(i, _i(3)), S.BufferStore(b, a[i], (i,)),
        S.BufferStore(b, a[i] + 1.0, (i,)))))
    got = simplify(pl.partition_at_branches(func))
    loops = [s for s in got.body.seq if isinstance(s, S.For)]
    assert [(int(x.min.value), int(x.extent.value)) for x in loops] == [(0, 3), (4, 4)]
    assert "if" not in script(got)


@pytest.mark.parametrize("make,want", [
    (lambda v: tir.lt(v * 2, _i(7)), [4]),
    (lambda v: tir.ge(v, _i(2)), [2]),
    (lambda v: tir.eq(v, _i(0)), [1]),             # the first iteration against the rest
    (lambda v: tir.ne(v, _i(5)), [5, 6]),
    (lambda v: tir.gt(v, _i(20)), []),             # never true in [0, 10)
    (lambda v: tir.lt((v // 3) * 3, _i(4)), None),  # not affine: refused
])
def test_change_points(make, want):
    v = tir.Var("v", "int64")
    assert pl.change_points(make(v), v, 0, 10, Analyzer()) == want


def test_refusals_leave_the_loop(monkeypatch):
    a, b = _bufs()
    i, n = tir.Var("i", "int64"), tir.Var("n", "int64")
    # a condition on another variable (if_promotion's job) and a symbolic extent
    other = loop_func([a, b], S.For(i, _i(0), _i(H), S.ForKind.SERIAL, S.IfThenElse(
        tir.lt(n, _i(3)), S.BufferStore(b, a[i], (i,)))))
    assert pl.partition_at_branches(other) is other
    symbolic = loop_func([a, b], S.For(i, _i(0), n, S.ForKind.SERIAL, S.IfThenElse(
        tir.lt(i, _i(3)), S.BufferStore(b, a[i], (i,)))))
    assert pl.partition_at_branches(symbolic) is symbolic
    monkeypatch.setattr(pl, "MAX_PIECES", 2)
    func = _padded()
    assert pl.partition_at_branches(func) is func


def test_numerics():
    a = RNG.standard_normal(H).astype(np.float32)
    b = np.full(H + 2, np.nan, np.float32)
    func = _padded()
    (_, before), (_, after) = run_c(func, [a, b]), run_c(pl.partition_at_branches(func), [a, b])
    np.testing.assert_allclose(before, np.concatenate([[0], a * 2, [0]]), rtol=1e-6)
    np.testing.assert_array_equal(after, before)
