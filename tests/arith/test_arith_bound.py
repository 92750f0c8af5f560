"""Tests of Analyzer.const_int_bound."""

from __future__ import annotations

import pytest

from kiln import tir
from kiln.arith import NEG_INF, POS_INF, Analyzer, ConstIntBound
from kiln.ir import KilnError

i, j, x = tir.Var("i"), tir.Var("j"), tir.Var("x")
n = tir.Var("n", "int64")
s = tir.SizeVar("s", "int64")


def _ana() -> Analyzer:
    ana = Analyzer()
    ana.bind(i, tir.Range(0, 16))
    ana.bind(j, tir.Range(-4, 8))  # [-4, 4)
    return ana


@pytest.mark.parametrize(
    "expr,lo,hi",
    [
        (i, 0, 15),
        (j, -4, 3),
        (i + j, -4, 18),
        (i - j, -3, 19),
        (i * j, -60, 45),
        (i * 8 + 7, 7, 127),
        (i // 4, 0, 3),
        (j // 4, -1, 0),
        (i % 4, 0, 3),
        (j % 16, 0, 15),
        (x % 8, 0, 7),
        (tir.truncdiv(j, 2), -2, 1),
        (tir.truncmod(j, 3), -2, 2),
        (tir.truncmod(i, 100), 0, 15),
        (tir.min(i, j), -4, 3),
        (tir.max(i, j), 0, 15),
        (tir.max(i, 20), 20, 20),
        (tir.select(x < 3, i, j + 100), 0, 103),
        (tir.cast("int64", i) * 2, 0, 30),
        (tir.cast("int8", i * 100), -128, 127),
        (tir.cast("int32", x < 3), 0, 1),
        (i * 8 + j - i * 8, -4, 3),  # tighter after canonicalization
        (x - x, 0, 0),
        (tir.const("int32", 7), 7, 7),
        (tir.Var("u", "uint8"), 0, 255),
        (x, -(2**31), 2**31 - 1),
        (x // i, -(2**31), 2**31 - 1),
    ],
    ids=lambda v: str(v)[:40],
)
def test_const_int_bound_table(expr, lo, hi):
    assert _ana().const_int_bound(expr) == ConstIntBound(lo, hi)


def test_int64_unbounded_uses_sentinels():
    ana = Analyzer()
    assert ana.const_int_bound(n) == (NEG_INF, POS_INF)
    assert ana.const_int_bound(n * 2 + 1) == (NEG_INF, POS_INF)
    assert ana.const_int_bound(s) == (0, POS_INF)
    assert ana.const_int_bound(s + 3) == (3, POS_INF)
    assert ana.const_int_bound(s % 8) == (0, 7)
    assert ana.const_int_bound(-s) == (NEG_INF, 0)
    b = ana.const_int_bound(s)
    assert b.is_bounded is False and b.is_const is False


def test_symbolic_range_bounds():
    ana = Analyzer()
    k = tir.Var("k", "int64")
    ana.bind(s, tir.Range(tir.const("int64", 1), tir.const("int64", 100)))
    ana.bind(k, tir.Range(tir.const("int64", 0), s))
    assert ana.const_int_bound(k) == (0, 99)
    assert ana.const_int_bound(k // 10) == (0, 9)


def test_vector_bounds_cover_all_lanes():
    ana = _ana()
    r = tir.Ramp(i * 4, tir.const("int32", 1), 4)
    assert ana.const_int_bound(r) == (0, 63)
    r2 = tir.Ramp(i, tir.const("int32", -2), 4)
    assert ana.const_int_bound(r2) == (-6, 15)
    assert ana.const_int_bound(tir.Broadcast(j, 8)) == (-4, 3)


def test_constraint_scope_tightens_and_restores():
    ana = _ana()
    with ana.constraint_scope(x < 10):
        assert ana.const_int_bound(x) == (-(2**31), 9)
        with ana.constraint_scope(x >= 2):
            assert ana.const_int_bound(x) == (2, 9)
            assert ana.const_int_bound(x * 3) == (6, 27)
        assert ana.const_int_bound(x).min_value == -(2**31)
    assert ana.const_int_bound(x) == (-(2**31), 2**31 - 1)
    with ana.constraint_scope(tir.eq(x, 5) & (i < 4)):
        assert ana.const_int_bound(x) == (5, 5)
        assert ana.const_int_bound(i) == (0, 3)
    assert ana.const_int_bound(i) == (0, 15)


def test_constraint_scope_with_coefficients():
    ana = _ana()
    with ana.constraint_scope(x * 4 + i < 40):
        assert ana.const_int_bound(x).max_value == 9
    with ana.constraint_scope(x * -3 <= 6):
        assert ana.const_int_bound(x).min_value == -2


def test_bind_rejects_non_var_and_double_bind_when_asked():
    ana = Analyzer()
    with pytest.raises(KilnError, match="tir.Var"):
        ana.bind(x + 1, tir.Range(0, 4))
    ana.bind(x, tir.Range(0, 4))
    with pytest.raises(KilnError, match="already bound"):
        ana.bind(x, tir.Range(0, 8), allow_override=False)
    ana.bind(x, tir.Range(0, 8))
    assert ana.const_int_bound(x) == (0, 7)


def test_float_expression_is_unbounded():
    f = tir.Var("f", "float32")
    assert Analyzer().const_int_bound(f + 1.0) == (NEG_INF, POS_INF)
