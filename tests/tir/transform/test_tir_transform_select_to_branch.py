"""select_to_branch: a store's index-only select, min and max become ``if`` branches (innermost
first); a select on loaded data stays; too many branches leave the store; numerics do not
change (the C target runs before and after)."""

from __future__ import annotations

import numpy as np

from kiln import tir
from kiln.ir.node import assert_structural_equal
from kiln.testing.tir_testing import loop_func, run_c
from kiln.tir import stmt as S
from kiln.tir.printer import script
from kiln.tir.transform.select_to_branch import MAX_LEAVES, select_to_branch
from kiln.tir.transform.simplify import simplify

RNG = np.random.default_rng(23)


def _i(v: int) -> tir.IntImm:
    return tir.IntImm("int64", v)


def _loop(i, n, body):
    return S.For(i, _i(0), _i(n), S.ForKind.SERIAL, body)


def test_window_select_becomes_a_branch():
    """``B[i] = select(1 <= i and i < 5, A[i - 1], 0)`` -> ``if ..: B[i] = A[i - 1] else:
    B[i] = 0`` (the pad's window)."""
    a, b = tir.decl_buffer((4,), "float32", "A"), tir.decl_buffer((7,), "float32", "B")
    i = tir.Var("i", "int64")
    cond = tir.all_of([i >= _i(1), i < _i(5)])
    zero = tir.FloatImm("float32", 0.0)
    func = loop_func([a, b], _loop(i, 7, S.BufferStore(b, tir.select(cond, a[i - 1], zero),
                                                       (i,))))
    got = select_to_branch(func)
    want = loop_func([a, b], _loop(i, 7, S.IfThenElse(cond, S.BufferStore(b, a[i - 1], (i,)),
                                                      S.BufferStore(b, zero, (i,)))))
    assert_structural_equal(got, want)
    x = RNG.standard_normal(4).astype(np.float32)
    out = np.zeros(7, np.float32)
    ref = np.concatenate([[0], x, [0, 0]]).astype(np.float32)
    np.testing.assert_array_equal(run_c(func, [x, out])[1], ref)
    np.testing.assert_array_equal(run_c(got, [x, out])[1], ref)


def test_clamped_index_branches_innermost_first():
    """An edge pad's ``A[max(min(i - 2, 3), 0)]``: the min is branched on first (its sides
    are plain), then the max in its true arm; its false arm's ``max(3, 0)`` has no variable
    (``simplify`` folds it): three stores, each index plain."""
    a, b = tir.decl_buffer((4,), "float32", "A"), tir.decl_buffer((9,), "float32", "B")
    i = tir.Var("i", "int64")
    idx = tir.max(tir.min(i - 2, _i(3)), _i(0))
    func = loop_func([a, b], _loop(i, 9, S.BufferStore(b, a[idx], (i,))))
    got = select_to_branch(func)
    text = script(simplify(got))
    assert "max(" not in text and "min(" not in text, text
    assert text.count("B[i] =") == 3, text
    branch = got.body.body
    assert isinstance(branch, S.IfThenElse) and isinstance(branch.condition, tir.LE)
    x = RNG.standard_normal(4).astype(np.float32)
    out = np.zeros(9, np.float32)
    ref = np.pad(x, (2, 3), mode="edge")
    np.testing.assert_array_equal(run_c(func, [x, out])[1], ref)
    np.testing.assert_array_equal(run_c(got, [x, out])[1], ref)


def test_select_on_data_stays():
    """``where``'s select reads its condition from a buffer: data, not a branch point; a
    relu's ``max(A[i], 0)`` is no index arithmetic either."""
    m = tir.decl_buffer((6,), "int8", "M")
    a, b = tir.decl_buffer((6,), "float32", "A"), tir.decl_buffer((6,), "float32", "B")
    i = tir.Var("i", "int64")
    zero = tir.FloatImm("float32", 0.0)
    body = S.seq(S.BufferStore(b, tir.select(m[i] != tir.IntImm("int8", 0), a[i], zero), (i,)),
                 S.BufferStore(b, tir.max(a[i], zero), (i,)))
    func = loop_func([m, a, b], _loop(i, 6, body))
    assert select_to_branch(func) is func


def test_too_many_branches_leave_the_store():
    """Seven independent windows would make 2**7 > MAX_LEAVES stores: left as it is."""
    a, b = tir.decl_buffer((8,), "float32", "A"), tir.decl_buffer((8,), "float32", "B")
    i = tir.Var("i", "int64")
    value = a[i]
    for k in range(7):
        value = tir.select(i < _i(k + 1), value + tir.FloatImm("float32", 1.0), value)
    assert 2 ** 7 > MAX_LEAVES
    func = loop_func([a, b], _loop(i, 8, S.BufferStore(b, value, (i,))))
    assert select_to_branch(func) is func


def test_floor_modulo_branches_by_window():
    """A reflect pad's ``A[select(r < 4, r, 6 - r)]`` with ``r = (i + 5) % 6`` over ``i in
    [0, 8)``: ``i + 5`` spans two windows of 6, each branch a plain index; then the select;
    nothing modular or selected is left once simplified, and the C target computes numpy's
    reflect pad before and after."""
    a, b = tir.decl_buffer((4,), "float32", "A"), tir.decl_buffer((8,), "float32", "B")
    i = tir.Var("i", "int64")
    r = tir.floormod(i + _i(5), _i(6))
    func = loop_func([a, b], _loop(i, 8, S.BufferStore(
        b, a[tir.select(r < _i(4), r, _i(6) - r)], (i,))))
    got = simplify(select_to_branch(func))
    text = script(got)
    assert "%" not in text and "select" not in text, text
    x = RNG.standard_normal(4).astype(np.float32)
    out = np.zeros(8, np.float32)
    ref = np.pad(x, (1, 3), mode="reflect")
    np.testing.assert_array_equal(run_c(func, [x, out])[1], ref)
    np.testing.assert_array_equal(run_c(got, [x, out])[1], ref)
