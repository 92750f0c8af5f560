"""loop_collapse: a perfect nest whose every access walks memory contiguously across its two
loops becomes one loop of the product extent; a per-row access, a transposed one, another use
of a loop variable or an imperfect nest refuse; numerics do not change."""

from __future__ import annotations

import numpy as np

from kiln import tir
from kiln.ir.node import assert_structural_equal
from kiln.testing.tir_testing import loop_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform.loop_collapse import loop_collapse
from kiln.tir.transform.simplify import simplify

RNG = np.random.default_rng(23)
M, N, P = 3, 4, 5


def _i(v: int) -> tir.IntImm:
    return tir.IntImm("int64", v)


def _bufs():
    return (tir.decl_buffer((M, N, P), "float32", "A"), tir.decl_buffer((1,), "float32", "S"),
            tir.decl_buffer((M * N * P,), "float32", "B"))


def _nest(make, extents=(M, N, P)):
    vs = [tir.Var(n, "int64") for n in "ijk"[:len(extents)]]
    body = make(*vs)
    for v, e in reversed(list(zip(vs, extents))):
        body = S.For(v, _i(0), _i(e), S.ForKind.SERIAL, body)
    return body


def _scaled():
    """``B[(i * N + j) * P + k] = A[i, j, k] * S[0]``: three contiguous loops."""
    a, s, b = _bufs()
    return loop_func([a, s, b], _nest(
        lambda i, j, k: S.BufferStore(b, a[i, j, k] * s[0], ((i * N + j) * P + k,))))


def test_three_contiguous_loops_become_one():
    got = simplify(loop_collapse(_scaled()))
    a, s, b = _bufs()
    f = tir.Var("i_j_k", "int64")
    want = simplify(loop_func([a, s, b], S.For(f, _i(0), _i(M * N * P), S.ForKind.SERIAL,
                                               S.BufferStore(b, a[f // (N * P), f % (N * P) // P,
                                                                  f % P] * s[0], (f,)))))
    assert script(got) == script(want), script(got)
    assert "B[i_j_k] = A[i_j_k // 20, i_j_k % 20 // 5, i_j_k % 5] * S[0]" in script(got)
    assert_structural_equal(got, want)


def test_non_contiguous_nests_refuse():
    a, s, b = _bufs()
    bias = tir.decl_buffer((M,), "float32", "R")
    # a per-row value: walks i but not j
    per_row = loop_func([a, bias, b], _nest(
        lambda i, j: S.BufferStore(b, bias[i], (i * N + j,)), (M, N)))
    assert loop_collapse(per_row) is per_row
    # a transposed write
    transposed = loop_func([a, s, b], _nest(
        lambda i, j: S.BufferStore(b, a[i, j, 0], (j * M + i,)), (M, N)))
    assert loop_collapse(transposed) is transposed
    # a loop variable used as a value
    valued = loop_func([a, s, b], _nest(
        lambda i, j: S.BufferStore(b, tir.cast("float32", j), (i * N + j,)), (M, N)))
    assert loop_collapse(valued) is valued


def test_imperfect_nest_and_offset_loops_refuse():
    a, s, b = _bufs()
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    store = S.BufferStore(b, a[i, j, 0], (i * N + j,))
    imperfect = loop_func([a, s, b], S.For(i, _i(0), _i(M), S.ForKind.SERIAL, S.seq(
        S.BufferStore(s, a[i, 0, 0], (_i(0),)),
        S.For(j, _i(0), _i(N), S.ForKind.SERIAL, store))))
    assert loop_collapse(imperfect) is imperfect
    offset = loop_func([a, s, b], S.For(i, _i(0), _i(M), S.ForKind.SERIAL,
                                        S.For(j, _i(1), _i(N - 1), S.ForKind.SERIAL, store)))
    assert loop_collapse(offset) is offset


def test_numerics():
    av = RNG.standard_normal((M, N, P)).astype(np.float32)
    sv = np.array([1.5], np.float32)
    bv = np.full(M * N * P, np.nan, np.float32)
    func = _scaled()
    before = run_c(func, [av, sv, bv])
    after = run_c(simplify(loop_collapse(func)), [av, sv, bv])
    np.testing.assert_allclose(before[2], av.ravel() * 1.5, rtol=1e-6)
    np.testing.assert_array_equal(after[2], before[2])
