"""Ramp/Broadcast simplification (the forms vectorized loops are lowered to)."""

from __future__ import annotations

import pytest

from kiln import tir
from kiln.arith import Analyzer
from kiln.ir import assert_structural_equal

i, j, x = tir.Var("i"), tir.Var("j"), tir.Var("x")
n = tir.Var("n", "int64")
f = tir.Var("f", "float32")


def c(v):
    return tir.const("int32", v)


def R(base, stride, lanes):
    return tir.Ramp(base, stride, lanes)


def B(v, lanes):
    return tir.Broadcast(v if isinstance(v, tir.PrimExpr) else c(v), lanes)


def _ana() -> Analyzer:
    ana = Analyzer()
    ana.bind(i, tir.Range(0, 16))
    ana.bind(j, tir.Range(0, 8))
    return ana


CASES = [
    (R(i, 1, 4) + B(j, 4), R(i + j, 1, 4)),
    (B(j, 4) + R(i, 1, 4), R(j + i, 1, 4)),
    (R(i, 1, 4) - B(j, 4), R(i - j, 1, 4)),
    (B(j, 4) - R(i, 1, 4), R(j - i, -1, 4)),
    (R(i, 1, 4) + R(j, 2, 4), R(i + j, 3, 4)),
    (R(i, 1, 4) - R(i, 1, 4), B(0, 4)),
    (R(i, 2, 4) * B(3, 4), R(i * 3, 6, 4)),
    (B(3, 4) * R(i, 2, 4), R(i * 3, 6, 4)),
    (R(x, 1, 4) * B(j, 4), R(x * j, j, 4)),
    (B(i, 4) + B(j, 4), B(i + j, 4)),
    (B(i * 8 + j, 4) // B(8, 4), B(i, 4)),
    (B(x, 4) * B(0, 4), B(0, 4)),
    (R(i, 1, 4) + B(0, 4), R(i, 1, 4)),
    (R(i, 1, 4) * B(1, 4), R(i, 1, 4)),
    (R(i, 0, 4), B(i, 4)),
    # floordiv/floormod of ramps by broadcast constants
    (R(x * 4, 1, 4) // B(4, 4), B(x, 4)),
    (R(x * 4, 1, 4) % B(4, 4), R(c(0), 1, 4)),
    (R(i * 4, 1, 4) // B(8, 4), B(i // 2, 4)),
    (R(i * 4, 1, 4) % B(8, 4), R((i % 2) * 4, 1, 4)),
    (R(x * 8, 1, 8) // B(8, 8), B(x, 8)),
    (R(x * 8, 1, 8) // B(16, 8), B(x // 2, 8)),
    (R(x, 4, 4) // B(2, 4), R(x // 2, 2, 4)),
    (R(x, 4, 4) % B(2, 4), B(x % 2, 4)),
    (R(x * 8 + 2, 1, 4) // B(8, 4), B(x, 4)),
    (R(x * 8 + 6, 1, 4) // B(8, 4), R(x * 8 + 6, 1, 4) // B(8, 4)),  # lanes cross 8
    (tir.truncdiv(R(i * 4, 1, 4), B(4, 4)), B(i, 4)),
    # comparisons decided for all lanes
    (R(i * 4, 1, 4) < B(64, 4), B(tir.const("bool", True), 4)),
    (R(i * 4, 1, 4) < B(63, 4), R(i * 4, 1, 4) < B(63, 4)),
    (R(i * 4, 1, 4) >= B(0, 4), B(tir.const("bool", True), 4)),
    (B(i, 4) < B(16, 4), B(tir.const("bool", True), 4)),
    (tir.min(R(i * 4, 1, 4), B(100, 4)), R(i * 4, 1, 4)),
    # float vectors: broadcast folding only
    (B(tir.FloatImm("float32", 1.0), 4) + B(tir.FloatImm("float32", 2.0), 4),
     B(tir.FloatImm("float32", 3.0), 4)),
    (B(f, 4) * B(tir.FloatImm("float32", 1.0), 4), B(f, 4)),
    # casts of vectors
    (tir.cast("int64x4", R(i, 1, 4)), R(tir.cast("int64", i), tir.const("int64", 1), 4)),
    (tir.cast("int64x4", B(c(3), 4)), B(tir.const("int64", 3), 4)),
]


@pytest.mark.parametrize("before,after", CASES, ids=lambda e: str(e)[:60])
def test_vector_table(before, after):
    out = _ana().simplify(before)
    assert out.dtype == before.dtype
    assert_structural_equal(out, after)


def test_select_with_broadcast_condition():
    t = B(tir.const("bool", True), 4)
    e = tir.Select(t, R(i, 1, 4), B(j, 4))
    assert_structural_equal(_ana().simplify(e), R(i, 1, 4))


def test_vector_int64_index_from_int32_base():
    base = tir.cast("int64", i) * tir.const("int64", 4)
    e = R(base, tir.const("int64", 1), 4) + B(n * 64, 4)
    out = _ana().simplify(e)
    assert out.dtype == "int64x4"
    assert isinstance(out, tir.Ramp)
    assert out.base.dtype == "int64" and out.stride.dtype == "int64"
