"""if_promotion: an ``if`` whose condition a loop does not change leaves the loop
(``for i: if c: S`` -> ``if c: for i: S``; among other statements, the loop is unswitched);
conditions on the loop's variable, on inner variables or on what the loop writes stay."""

from __future__ import annotations

import numpy as np

from kiln import tir
from kiln.ir.node import assert_structural_equal
from kiln.testing.tir_testing import loop_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform import if_promotion as ip
from kiln.tir.transform.simplify import simplify

RNG = np.random.default_rng(23)
K, N = 3, 6


def _i(v: int) -> tir.IntImm:
    return tir.IntImm("int64", v)


def _bufs():
    return (tir.decl_buffer((K, N), "float32", "A"), tir.decl_buffer((N,), "float32", "C"),
            tir.decl_buffer((N,), "float32", "D"))


def _first_step():
    """``for k: for i: (if k == 0: C[i] = A[k, i] else C[i] += A[k, i]); D[i] = C[i] * 2``:
    a reduction's first step inside its loops, next to another store."""
    a, c, d = _bufs()
    k, i = tir.Var("k", "int64"), tir.Var("i", "int64")
    step = S.IfThenElse(tir.eq(k, _i(0)), S.BufferStore(c, a[k, i], (i,)),
                        S.BufferStore(c, c[i] + a[k, i], (i,)))
    body = S.seq(step, S.BufferStore(d, c[i] * 2.0, (i,)))
    return loop_func([a, c, d], S.For(k, _i(0), _i(K), S.ForKind.SERIAL,
                                      S.For(i, _i(0), _i(N), S.ForKind.SERIAL, body)))


def test_invariant_branch_unswitches_the_inner_loop():
    got = ip.if_promotion(_first_step())
    a, c, d = _bufs()
    k, i = tir.Var("k", "int64"), tir.Var("i", "int64")

    def loop(store):
        return S.For(i, _i(0), _i(N), S.ForKind.SERIAL,
                     S.seq(store, S.BufferStore(d, c[i] * 2.0, (i,))))

    want = loop_func([a, c, d], S.For(k, _i(0), _i(K), S.ForKind.SERIAL, S.IfThenElse(
        tir.eq(k, _i(0)), loop(S.BufferStore(c, a[k, i], (i,))),
        loop(S.BufferStore(c, c[i] + a[k, i], (i,))))))
    assert script(got) == script(want), script(got)
    assert_structural_equal(got, want)


def test_whole_body_branch_climbs_every_invariant_loop():
    a, c, d = _bufs()
    i, j, n = tir.Var("i", "int64"), tir.Var("j", "int64"), tir.Var("n", "int64")
    func = loop_func([a, c, d], S.For(i, _i(0), _i(K), S.ForKind.SERIAL, S.For(
        j, _i(0), _i(N), S.ForKind.SERIAL,
        S.IfThenElse(tir.lt(n, _i(4)), S.BufferStore(c, a[i, j], (j,))))))
    got = ip.if_promotion(func)
    assert isinstance(got.body, S.IfThenElse) and got.body.else_case is None
    assert "if" not in script(got.body.then_case)


def test_variant_conditions_stay():
    a, c, d = _bufs()
    i, j = tir.Var("i", "int64"), tir.Var("j", "int64")
    on_loop = loop_func([a, c, d], S.For(i, _i(0), _i(N), S.ForKind.SERIAL, S.IfThenElse(
        tir.lt(i, _i(2)), S.BufferStore(c, a[0, i], (i,)))))
    assert ip.if_promotion(on_loop) is on_loop
    # reads C, which the loop writes: may change between iterations
    on_written = loop_func([a, c, d], S.For(i, _i(0), _i(N), S.ForKind.SERIAL, S.IfThenElse(
        tir.lt(c[0], tir.FloatImm("float32", 0.5)), S.BufferStore(c, a[0, i], (i,)))))
    assert ip.if_promotion(on_written) is on_written
    # on an inner loop's variable: stays inside i (j's loop hoists nothing either)
    on_inner = loop_func([a, c, d], S.For(i, _i(0), _i(K), S.ForKind.SERIAL, S.For(
        j, _i(0), _i(N), S.ForKind.SERIAL,
        S.IfThenElse(tir.lt(j, _i(2)), S.BufferStore(c, a[i, j], (j,))))))
    assert ip.if_promotion(on_inner) is on_inner


def test_large_body_is_not_copied(monkeypatch):
    monkeypatch.setattr(ip, "MAX_NODES", 3)
    func = _first_step()
    assert ip.if_promotion(func) is func


def test_numerics():
    a = RNG.standard_normal((K, N)).astype(np.float32)
    c, d = np.full(N, np.nan, np.float32), np.full(N, np.nan, np.float32)
    func = _first_step()
    before = run_c(func, [a, c, d])
    after = run_c(simplify(ip.if_promotion(func)), [a, c, d])
    np.testing.assert_allclose(before[1], a.sum(0), rtol=1e-5)
    np.testing.assert_allclose(before[2], a.sum(0) * 2, rtol=1e-5)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
