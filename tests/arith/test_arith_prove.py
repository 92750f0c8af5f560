"""Tests of Analyzer.can_prove / can_prove_equal, including symbolic ranges and constraints."""

from __future__ import annotations

from kiln import tir
from kiln.arith import Analyzer

i, j, x, y = tir.Var("i"), tir.Var("j"), tir.Var("x"), tir.Var("y")
n, m = tir.Var("n", "int64"), tir.Var("m", "int64")
io, ii = tir.Var("io", "int64"), tir.Var("ii", "int64")


def c64(v):
    return tir.const("int64", v)


def _ana() -> Analyzer:
    ana = Analyzer()
    ana.bind(i, tir.Range(0, 16))
    ana.bind(j, tir.Range(0, 8))
    return ana


def test_constant_bounds():
    ana = _ana()
    assert ana.can_prove(i < 16)
    assert ana.can_prove(i * 8 + j < 128)
    assert ana.can_prove(i * 8 + j <= 127)
    assert not ana.can_prove(i * 8 + j < 127)
    assert ana.can_prove((i * 8 + j) // 8 <= 15)
    assert ana.can_prove(tir.eq((i * 8 + j) % 8, j))
    assert not ana.can_prove(x < 16)
    assert ana.can_prove(tir.ne(i, 16) & (j >= 0))
    assert ana.can_prove((i < 0) | (j < 8))
    assert not ana.can_prove((i < 0) | (x < 8))


def test_can_prove_is_false_for_unknown():
    ana = Analyzer()
    assert not ana.can_prove(x < y)
    assert not ana.can_prove(x * x >= 0)  # true, but beyond this analysis: must say False
    assert ana.can_prove(x <= x)
    assert ana.can_prove(True)
    assert not ana.can_prove(False)


def test_symbolic_extents():
    ana = Analyzer()
    ana.bind(io, tir.Range(c64(0), n))
    ana.bind(ii, tir.Range(c64(0), c64(4)))
    assert ana.can_prove(io < n)
    assert ana.can_prove(io <= n - 1)
    assert ana.can_prove(io * 4 + ii < n * 4)
    assert not ana.can_prove(io < n - 1)
    assert not ana.can_prove(io * 4 + ii < n * 4 - 1)
    assert not ana.can_prove(io < m)


def test_floordiv_against_a_symbolic_extent():
    """A loop fused over a symbolic batch, ``for f in range(n * 28)``, reads its batch index as
    ``f // 28``: that index is provably below ``n`` (the guard a schedule over such a loop
    would otherwise keep in every store)."""
    ana = Analyzer()
    f = tir.Var("f", "int64")
    ana.bind(f, tir.Range(c64(0), n * 28))
    assert ana.can_prove(tir.floordiv(f, 28) < n)
    assert ana.can_prove(tir.floordiv(f, 28) <= n - 1)
    assert ana.can_prove(tir.floordiv(f, 28) + 1 <= n)
    assert not ana.can_prove(tir.floordiv(f, 28) < n - 1)
    assert not ana.can_prove(tir.floordiv(f, 14) < n)  # f = 28n - 1 gives 2n - 1
    assert not ana.can_prove(tir.floordiv(f, 28) < m)


def test_symbolic_min():
    ana = Analyzer()
    ana.bind(io, tir.Range(n, c64(8)))
    assert ana.can_prove(io >= n)
    assert ana.can_prove(io < n + 8)
    assert ana.can_prove(io - n < 8)
    assert not ana.can_prove(io > n)


def test_constraint_scope():
    ana = _ana()
    with ana.constraint_scope(x < y):
        assert ana.can_prove(x < y)
        assert ana.can_prove(x <= y)
        assert ana.can_prove(x < y + 1)
        assert ana.can_prove(x + j < y + 8)
        assert not ana.can_prove(x + j < y)
        assert ana.can_prove(~(x >= y))
    assert not ana.can_prove(x < y)
    with ana.constraint_scope(tir.Var("flag", "bool")):
        pass
    cond = tir.eq(x % 4, 0)
    with ana.constraint_scope(cond):
        assert ana.can_prove(cond)
        assert ana.can_prove(~tir.ne(x % 4, 0))
    assert not ana.can_prove(cond)


def test_constraint_scope_nested_and_symbolic():
    ana = Analyzer()
    ana.bind(io, tir.Range(c64(0), c64(1000)))
    with ana.constraint_scope(io * 8 < n):
        assert ana.can_prove(io * 8 + 7 < n + 7)
        with ana.constraint_scope(io >= 10):
            assert ana.can_prove(io * 8 < n)
            assert ana.can_prove(io > 5)
        assert not ana.can_prove(io > 5)


def test_assumption_simplified_under_the_bounds_it_implies_stays_known():
    """Assuming ``i // (max(x, 0) % 7 + 1 + j) < x // 3 - 2x`` bounds x above (the left side
    is >= 0), which turns ``max(x, 0) % 7`` into ``max(x, 0)``, whose fact bounds x to <= 0,
    which turns it into 0: every round's form is assumed (Hypothesis found a case where the
    assumption itself was no longer provable inside its scope)."""
    ana = _ana()
    ana.bind(x, tir.Range(-40, 41))
    cond = i // (tir.max(x, 0) % 7 + 1 + j) < x // 3 + x * -2
    with ana.constraint_scope(cond):
        assert ana.can_prove(cond)
        assert ana.can_prove(x <= 0)
    assert not ana.can_prove(cond)


def test_can_prove_equal():
    ana = _ana()
    assert ana.can_prove_equal((i * 8 + j) // 8, i)
    assert ana.can_prove_equal(x * 2 + x, x * 3)
    assert ana.can_prove_equal(tir.cast("int64", i) * 2, i * 2)
    assert not ana.can_prove_equal(x, y)
    assert ana.can_prove_equal(3, 3)
    assert not ana.can_prove_equal(3, 4)
    assert ana.can_prove_equal(i // 16, 0)
    f = tir.Var("f", "float32")
    assert ana.can_prove_equal(f * 2.0, f * 2.0)
    assert not ana.can_prove_equal(f * 2.0, f * 3.0)


def test_products_of_variables_commute():
    """``a*b`` and ``b*a`` are one term (the merged dims ``batch*seq`` of a reshape written
    either way round), also regrouped and with constant factors."""
    ana = Analyzer()
    assert ana.can_prove_equal(n * m, m * n)
    assert ana.can_prove_equal(n * m * 4, (m * 2) * (n * 2))
    assert ana.can_prove_equal((n * m) * x, n * (x * m))
    assert ana.can_prove_equal(n * m + m * n, n * m * 2)
    assert ana.can_prove(n * m - m * n <= 0)
    assert not ana.can_prove_equal(n * m, n * n)
    f, h = tir.Var("f", "float32"), tir.Var("h", "float32")
    assert not ana.can_prove_equal((f * h) * f, f * (h * f))  # float products do not regroup


def test_schedule_style_split_check():
    """split(i, [None, 8]) of a loop of extent 60 needs a guard; of extent 64 it does not."""
    ana = Analyzer()
    o, inner = tir.Var("o", "int64"), tir.Var("in", "int64")
    ana.bind(o, tir.Range(c64(0), c64(8)))
    ana.bind(inner, tir.Range(c64(0), c64(8)))
    assert ana.can_prove(o * 8 + inner < 64)
    assert not ana.can_prove(o * 8 + inner < 60)


def test_facts_survive_key_table_reset(monkeypatch):
    import kiln.arith.analyzer as mod

    monkeypatch.setattr(mod, "_KEY_TABLE_LIMIT", 50)
    ana = Analyzer()
    ana.bind(io, tir.Range(c64(0), n))
    with ana.constraint_scope(x < y):
        for q in range(200):  # grows the key table past the limit many times
            ana.simplify(x * q + y * (q + 1) + i)
        assert ana.can_prove(io < n)
        assert ana.can_prove(x < y)
    assert not ana.can_prove(x < y)
    assert ana.can_prove(io * 2 < n * 2)


def test_rebinding_forgets_old_symbolic_range():
    ana = Analyzer()
    ana.bind(io, tir.Range(c64(0), n))
    assert ana.can_prove(io < n)
    ana.bind(io, tir.Range(c64(0), m))
    assert not ana.can_prove(io < n)
    assert ana.can_prove(io < m)
    ana.bind(io, c64(3) + n)  # now a value, no range at all
    assert not ana.can_prove(io < m)
    assert ana.can_prove(io > n)
