"""Table-driven before/after tests of Analyzer.simplify (compared with structural_equal)."""

from __future__ import annotations

import math

import pytest

from kiln import tir
from kiln.arith import Analyzer, simplify
from kiln.ir import assert_structural_equal

i, j, k = tir.Var("i"), tir.Var("j"), tir.Var("k")
x, y, z = tir.Var("x"), tir.Var("y"), tir.Var("z")
n = tir.Var("n", "int64")
m = tir.Var("m", "int64")
f = tir.Var("f", "float32")
b = tir.Var("b", "bool")


def c32(v):
    return tir.const("int32", v)


def c64(v):
    return tir.const("int64", v)


def f32(v):
    return tir.FloatImm("float32", v)


def T():
    return tir.const("bool", True)


def F():
    return tir.const("bool", False)


def _ana() -> Analyzer:
    ana = Analyzer()
    ana.bind(i, tir.Range(0, 16))
    ana.bind(j, tir.Range(0, 8))
    ana.bind(k, tir.Range(0, 4))
    return ana


CASES = [
    # constant folding (floor vs trunc semantics)
    (c32(3) + c32(4), c32(7)),
    (c32(7) - c32(10), c32(-3)),
    (c32(6) * c32(-7), c32(-42)),
    (tir.FloorDiv(c32(-7), c32(2)), c32(-4)),
    (tir.FloorMod(c32(-7), c32(2)), c32(1)),
    (tir.truncdiv(c32(-7), c32(2)), c32(-3)),
    (tir.truncmod(c32(-7), c32(2)), c32(-1)),
    (tir.FloorDiv(c32(7), c32(-2)), c32(-4)),
    (tir.FloorMod(c32(7), c32(-2)), c32(-1)),
    (tir.min(c32(3), c32(-2)), c32(-2)),
    (tir.max(c64(3), c64(-2)), c64(3)),
    (c32(3) < c32(4), T()),
    (tir.eq(c32(3), c32(4)), F()),
    (T() & F(), F()),
    (T() | b, T()),
    (F() | b, b),
    (~F(), T()),
    # identities
    (x * 1, x),
    (x + 0, x),
    (x * 0, c32(0)),
    (x - x, c32(0)),
    (x // 1, x),
    (x % 1, c32(0)),
    (tir.FloorDiv(c32(0), x), c32(0)),
    # linear forms
    ((i * 8 + j) - i * 8, j),
    (x * 2 + x * 3, x * 5),
    (x + y - x, y),
    ((x + 3) * 4 - x * 4, c32(12)),
    (x * 3 - (x * 2 + 5), x - 5),
    (y - x * 2, y - x * 2),
    (c32(5) - x, c32(5) - x),
    (-(x + 1) + x, c32(-1)),
    ((x + y) * 2 - y, x * 2 + y),
    (x * y - y * 0, x * y),
    ((x * 2) * (y * 3), (x * y) * 6),
    # floordiv / floormod by constants
    ((i * 8 + j) // 8, i),
    ((i * 8 + j) % 8, j),
    ((i * 16) % 8, c32(0)),
    ((x * 16) % 8, c32(0)),
    ((x * 8 + 5) // 8, x),
    ((x // 4) * 4 + x % 4, x),
    (x - (x // 4) * 4, x % 4),
    ((x // 4) // 2, x // 8),
    ((x % 16) % 4, x % 4),
    ((x % 4) % 16, x % 4),
    ((i * 8 + j) // 16, i // 2),
    ((i * 8 + j) % 16, (i % 2) * 8 + j),
    ((x * 4 + k) // 8, x // 2),
    ((x * 6) // 4, (x * 3) // 2),
    ((x * 6) % 4, (x * 3 % 2) * 2),
    ((x + 8) // 8, x // 8 + 1),
    ((x + 7) // 8, (x + 7) // 8),
    (k // 4, c32(0)),
    (k % 4, k),
    ((k + 4) // 4, c32(1)),
    ((x // 12) * 3 + (x % 12) // 4, x // 4),
    ((x // 12) * 12 + ((x % 12) // 4) * 4 + x % 4, x),
    (tir.truncdiv(i * 8 + j, 8), i),
    (tir.truncmod(i * 8 + j, 8), j),
    (tir.truncdiv(x, 4), tir.truncdiv(x, 4)),  # x may be negative: not a floordiv
    # min / max
    (tir.min(i, 20), i),
    (tir.max(i, 20), c32(20)),
    (tir.min(x, x + 1), x),
    (tir.max(x, x + 1), x + 1),
    (tir.min(x, x), x),
    (tir.min(i * 8 + 7, i * 8 + j), i * 8 + j),
    (tir.min(x * 8 + 7, x * 8 + y), x * 8 + tir.min(y, 7)),
    (tir.min(tir.min(x, 5), 3), tir.min(x, 3)),
    (tir.max(tir.max(x, 5), 3), tir.max(x, 5)),
    (tir.min(c32(4), x), tir.min(x, 4)),
    # comparisons decided by bounds or by cancellation
    (i < 16, T()),
    (i < 15, i < 15),
    (i >= 0, T()),
    (i > 15, F()),
    (tir.eq(i * 2, 7), F()),
    (tir.ne(x * 4, 2), T()),
    (i * 8 + j < i * 8 + 16, T()),
    (x * 8 + y < x * 8 + 16, y < 16),
    (x + 1 < 5, x < 4),
    (tir.eq(x, x), T()),
    (x < x, F()),
    # logic
    (~~(x < 3), x < 3),
    (~(x < 3), x >= 3),
    (~tir.eq(x, 3), tir.ne(x, 3)),
    (b & b, b),
    (b & ~b, F()),
    (b | ~b, T()),
    ((i < 16) & (x < 3), x < 3),
    # select
    (tir.select(T(), x, y), x),
    (tir.select(F(), x, y), y),
    (tir.select(i < 16, x, y), x),
    (tir.select(x < y, x + 1, 1 + x), x + 1),
    # casts
    (tir.cast("int64", c32(5)), c64(5)),
    (tir.cast("int32", c64(-3)), c32(-3)),
    (tir.cast("float32", c32(3)), f32(3.0)),
    (tir.cast("int32", f32(-2.7)), c32(-2)),
    (tir.cast("bool", c32(2)), T()),
    (tir.cast("int32", tir.cast("int64", x)), x),
    (tir.cast("int8", tir.cast("int32", tir.Var("s", "int8"))), None),  # checked below
    (tir.Cast("int32", x), x),
    # floats: only exact constant folding
    (f32(1.5) + f32(2.25), f32(3.75)),
    (f32(0.1) * f32(3.0), f32(float(__import__("numpy").float32(0.1) * 3))),
    (f + f32(0.0), f + f32(0.0)),
    (f * f32(1.0), f),
    (f - f, f - f),
    (tir.min(f32(1.0), f32(-2.0)), f32(-2.0)),
    (f32(1.0) < f32(2.0), T()),
]


@pytest.mark.parametrize("before,after", [c for c in CASES if c[1] is not None],
                         ids=lambda e: str(e)[:60])
def test_simplify_table(before, after):
    assert_structural_equal(_ana().simplify(before), after)


def test_double_narrowing_cast_is_removed():
    s = tir.Var("s", "int8")
    e = tir.cast("int8", tir.cast("int32", s))
    assert _ana().simplify(e) is s


def test_shortcut_without_context():
    assert_structural_equal(simplify(x * 2 + x * 3), x * 5)
    assert_structural_equal(simplify(i < 16), i < 16)  # nothing known about i
    assert_structural_equal(simplify(3), c32(3))


def test_int64_mixing_keeps_operand_dtypes_equal():
    ana = _ana()
    e = tir.cast("int64", i * 8 + j) + n - tir.cast("int64", j)
    out = ana.simplify(e)
    assert_structural_equal(out, tir.cast("int64", i) * c64(8) + n)
    e2 = (n * 8 + tir.cast("int64", j)) // 8
    assert_structural_equal(ana.simplify(e2), n)
    # an int32 expression compared with an int64 one
    assert ana.can_prove(tir.cast("int64", i) < n + 16 - n)


def test_malformed_mixed_operands_are_repaired():
    # built directly (bypassing tir's widening): the simplifier must not keep mixed operands
    e = tir.Add(tir.Var("q", "int64"), tir.Mul(j, c32(2)))
    out = _ana().simplify(e)
    assert out.dtype == "int64"

    def check(node):
        if isinstance(node, tir.BinaryOp):
            assert node.a.dtype == node.b.dtype, node

    tir.post_order_visit(out, check)


def test_float_zero_sign_is_preserved():
    nz = f32(-0.0)
    out = simplify(nz + f32(0.0))
    assert isinstance(out, tir.FloatImm) and out.value == 0.0
    assert math.copysign(1.0, out.value) == 1.0
    out2 = simplify(nz * f32(1.0))
    assert math.copysign(1.0, out2.value) == -1.0


def test_float32_folding_rounds_to_float32():
    out = simplify(f32(1.0) / f32(3.0))
    import numpy as np

    assert out.value == float(np.float32(1.0) / np.float32(3.0))
    # division by zero is left for the hardware
    assert isinstance(simplify(f32(1.0) / f32(0.0)), tir.Div)


def test_int_overflow_is_not_folded():
    big = tir.const("int32", 2**31 - 1)
    out = simplify(big + c32(1))
    assert isinstance(out, tir.Add)
    assert out.dtype == "int32"


def test_buffer_load_indices_are_simplified():
    buf = tir.decl_buffer((16, 8), "float32", "A")
    load = tir.BufferLoad(buf, ((i * 8 + j) // 8, (i * 8 + j) % 8))
    out = _ana().simplify(load)
    assert_structural_equal(out, tir.BufferLoad(buf, (i, j)))


def test_untouched_expressions_keep_identity():
    e = x * y + tir.exp(f).astype("int32")
    ana = _ana()
    assert ana.simplify(e) is ana.simplify(e)
    load_free = tir.exp(f)
    assert ana.simplify(load_free) is load_free


def test_let_value_bounds_are_used():
    v = tir.Var("v")
    e = tir.Let(v, k + 4, (v * 2) // 16)
    out = _ana().simplify(e)
    assert isinstance(out, tir.Let)
    assert_structural_equal(out.body, c32(0))


def test_bind_to_expression_substitutes():
    ana = Analyzer()
    ana.bind(x, y * 4 + 1)
    assert_structural_equal(ana.simplify(x - y * 4), c32(1))
    assert_structural_equal(ana.simplify(x % 4), c32(1))


def test_many_calls_are_fast():
    import time

    ana = Analyzer()
    io, ii = tir.Var("io", "int64"), tir.Var("ii", "int64")
    ana.bind(io, tir.Range(c64(0), c64(8)))
    ana.bind(ii, tir.Range(c64(0), c64(16)))
    fused = io * 16 + ii
    exprs = [(fused // 12) * 12 * n + (fused % 12) // 4 * 4 + fused % 4 + q for q in range(1000)]
    t0 = time.perf_counter()
    for e in exprs:
        ana.simplify(e)
    per_call = (time.perf_counter() - t0) / len(exprs)
    assert per_call < 0.01, f"{per_call * 1e6:.0f} us per simplify"
    assert_structural_equal(ana.simplify(exprs[0]), (fused // 12) * n * 12 + fused % 12)


def test_unsigned_identities():
    u = tir.Var("u", "uint32")
    assert_structural_equal(simplify(u - u), tir.const("uint32", 0))
    assert_structural_equal(simplify(u * 1 + 0), u)
    assert_structural_equal(simplify(tir.const("uint8", 200) + tir.const("uint8", 55)),
                            tir.const("uint8", 255))
    # 255 + 1 does not fit uint8: left alone (no wraparound folding)
    assert isinstance(simplify(tir.const("uint8", 255) + tir.const("uint8", 1)), tir.Add)


def test_very_deep_expression_does_not_crash():
    e = x
    for q in range(3000):
        e = tir.Add(e, c32(q % 3))
    out = simplify(e)
    assert out.dtype == "int32"


def test_non_expression_is_rejected_with_kiln_error():
    from kiln.ir import KilnError

    with pytest.raises(KilnError):
        simplify(object())
