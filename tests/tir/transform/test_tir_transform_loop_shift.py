"""loop_shift: ``for i in [a, b)`` becomes ``for i in [0, b - a)`` with ``i + a`` in the body;
loops already at 0 are left alone; numerics do not change."""

from __future__ import annotations

import numpy as np

from kiln import tir
from kiln.ir.node import assert_structural_equal
from kiln.testing.tir_testing import loop_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform.loop_shift import loop_shift
from kiln.tir.transform.simplify import simplify

RNG = np.random.default_rng(23)


def _i(v: int) -> tir.IntImm:
    return tir.IntImm("int64", v)


def _bufs():
    return tir.decl_buffer((12,), "float32", "A"), tir.decl_buffer((8,), "float32", "B")


def _offset_loop():
    """``for i in [2, 10): B[i - 2] = A[i] * 2``, with an inner loop from 1 as well."""
    a, b = _bufs()
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    inner = S.For(j, _i(1), _i(2), S.ForKind.SERIAL,
                  S.BufferStore(b, b[i - 2] + a[i + j - 1] * 2.0, (i - 2,)))
    body = S.For(i, _i(2), _i(8), S.ForKind.SERIAL,
                 S.seq(S.BufferStore(b, tir.FloatImm("float32", 0.0), (i - 2,)), inner))
    return loop_func([a, b], body)


def test_loops_start_at_zero():
    got = simplify(loop_shift(_offset_loop()))
    a, b = _bufs()
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    inner = S.For(j, _i(0), _i(2), S.ForKind.SERIAL,
                  S.BufferStore(b, b[i] + a[i + j + 2] * 2.0, (i,)))
    want = simplify(loop_func([a, b], S.For(
        i, _i(0), _i(8), S.ForKind.SERIAL,
        S.seq(S.BufferStore(b, tir.FloatImm("float32", 0.0), (i,)), inner))))
    assert script(got) == script(want), script(got)
    assert_structural_equal(got, want)


def test_loops_from_zero_are_left_alone():
    a, b = _bufs()
    i = tir.Var("i", "int64")
    func = loop_func([a, b], S.For(i, _i(0), _i(8), S.ForKind.SERIAL,
                                   S.BufferStore(b, a[i], (i,))))
    assert loop_shift(func) is func


def test_symbolic_start_is_shifted():
    a, b = _bufs()
    i, s = tir.Var("i", "int64"), tir.Var("s", "int64")
    func = loop_func([a, b], S.For(i, s, _i(4), S.ForKind.SERIAL,
                                   S.BufferStore(b, a[i], (i - s,))))
    (loop,) = [loop_shift(func).body]
    assert isinstance(loop, S.For) and int(loop.min.value) == 0
    assert "s" in script(loop.body)


def test_numerics():
    a = RNG.standard_normal(12).astype(np.float32)
    b = np.full(8, np.nan, np.float32)
    func = _offset_loop()
    (_, before), (_, after) = run_c(func, [a, b]), run_c(loop_shift(func), [a, b])
    want = sum(a[np.arange(2, 10) + k] * 2.0 for k in range(2))
    np.testing.assert_allclose(before, want, rtol=1e-6)
    np.testing.assert_array_equal(after, before)
