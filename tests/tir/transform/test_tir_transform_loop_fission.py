"""loop_fission: ``for i: S1; S2`` becomes ``for i: S1`` then ``for i: S2`` when no element one
touches at an iteration is touched by the other at another (with a write); otherwise the
statements stay in one loop; numerics do not change."""

from __future__ import annotations

import numpy as np

from kiln import tir
from kiln.ir.node import assert_structural_equal
from kiln.testing.tir_testing import loop_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform.loop_fission import loop_fission

RNG = np.random.default_rng(23)
M, N = 4, 6


def _i(v: int) -> tir.IntImm:
    return tir.IntImm("int64", v)


def _bufs():
    return (tir.decl_buffer((M, N), "float32", "X"), tir.decl_buffer((M * N + 1,), "float32", "Y"),
            tir.decl_buffer((M, N), "float32", "Z"))


def _two_stores(read_offset: int = 0, inner: int = N):
    """``for i: for j: Y[i * N + j] = X[i, j] + 1; Z[i, j] = Y[i * N + j + read_offset] * 2``."""
    x, y, z = _bufs()
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    read = i * N + j + read_offset if read_offset else i * N + j
    body = S.seq(S.BufferStore(y, x[i, j] + 1.0, (i * N + j,)),
                 S.BufferStore(z, y[read] * 2.0, (i, j)))
    return loop_func([x, y, z], S.For(i, _i(0), _i(M), S.ForKind.SERIAL,
                                      S.For(j, _i(0), _i(inner), S.ForKind.SERIAL, body)))


def test_independent_stores_split_at_both_loops():
    got = loop_fission(_two_stores())
    x, y, z = _bufs()

    def nest(make):
        i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
        return S.For(i, _i(0), _i(M), S.ForKind.SERIAL,
                     S.For(j, _i(0), _i(N), S.ForKind.SERIAL, make(i, j)))

    want = loop_func([x, y, z], S.seq(
        nest(lambda i, j: S.BufferStore(y, x[i, j] + 1.0, (i * N + j,))),
        nest(lambda i, j: S.BufferStore(z, y[i * N + j] * 2.0, (i, j)))))
    assert script(got) == script(want), script(got)
    assert_structural_equal(got, want)


def test_reading_what_another_iteration_wrote_stays_fused():
    # Z at (i, j) reads Y[i * N + j + 1], which the next iteration of j (or of i, at j = N - 1)
    # writes: split, the read would see the new value
    func = _two_stores(read_offset=1)
    assert loop_fission(func) is func


def test_overlapping_slices_stay_fused():
    # the inner loop runs past the row (j < N + 1): iteration i touches i * N .. i * N + N,
    # whose last element is iteration i + 1's first: the outer loop cannot split
    got = loop_fission(_two_stores(inner=N + 1))
    assert isinstance(got.body, S.For) and isinstance(got.body.body, S.SeqStmt)


def test_shared_accumulator_stays_fused():
    x, y, z = _bufs()
    i = tir.Var("i", "int64")
    body = S.seq(S.BufferStore(y, y[0] + x[i, 0], (_i(0),)),
                 S.BufferStore(z, y[0], (i, _i(0))))
    func = loop_func([x, y, z], S.For(i, _i(0), _i(M), S.ForKind.SERIAL, body))
    assert loop_fission(func) is func


def test_init_and_update_of_a_reduction_split():
    """``for i: (Z[i, 0] = 0; for r: Z[i, 0] += X[i, r])`` splits: each row's accumulator is
    its own."""
    x, y, z = _bufs()
    i, r = tir.Var("i", "int64"), tir.Var("r", "int64")
    body = S.seq(S.BufferStore(z, tir.FloatImm("float32", 0.0), (i, _i(0))),
                 S.For(r, _i(0), _i(N), S.ForKind.SERIAL,
                       S.BufferStore(z, z[i, 0] + x[i, r], (i, _i(0)))))
    func = loop_func([x, y, z], S.For(i, _i(0), _i(M), S.ForKind.SERIAL, body))
    got = loop_fission(func)
    assert isinstance(got.body, S.SeqStmt) and len(got.body.seq) == 2
    xv = RNG.standard_normal((M, N)).astype(np.float32)
    zv = np.full((M, N), 7.0, np.float32)
    yv = np.zeros(M * N + 1, np.float32)
    (_, _, after) = run_c(got, [xv, yv, zv])
    np.testing.assert_allclose(after[:, 0], xv.sum(1), rtol=1e-5)


def test_numerics():
    xv = RNG.standard_normal((M, N)).astype(np.float32)
    yv, zv = np.zeros(M * N + 1, np.float32), np.full((M, N), np.nan, np.float32)
    func = _two_stores()
    before, after = run_c(func, [xv, yv, zv]), run_c(loop_fission(func), [xv, yv, zv])
    np.testing.assert_allclose(before[2], (xv + 1) * 2, rtol=1e-6)
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
