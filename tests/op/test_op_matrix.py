"""The matrix kernels (kiln.op.matrix): lu_factor, lu_solve, cholesky, triangular_solve --
inference and errors, the CPU schedule, numerics against numpy/scipy on random batched
matrices (square and rectangular, float32 and float64), and the determinant helper."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from kiln import graph as g
from kiln import op
from kiln.ir.errors import KilnError, RuntimeCheckError, StructInfoError
from kiln.op.matrix import determinant
from kiln.op.registry import OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.testing.op_testing import dims, infer, run_graph, tvar

RNG = np.random.default_rng(5)


def _run(fn, *arrays):
    """Build ``main(*arrays) = fn(bb, *vars)`` for the CPU and run it."""
    return run_graph(fn, *arrays)


def test_declarations_and_inference():
    for name in ("lu_factor", "lu_solve", "cholesky", "triangular_solve"):
        d = get_op_def(name)
        assert d.pattern == OpPattern.OPAQUE and d.legalize is not None
        assert lookup_schedule(name, "c") is not None
    s = infer(op.lu_factor(tvar("a", (2, 5, 3))))
    assert dims(s.fields[0]) == (2, 5, 3) and dims(s.fields[1]) == (2, 3)
    assert s.fields[1].dtype == "int64"
    s = infer(op.lu_solve(tvar("lu", (2, 4, 4)), tvar("p", (2, 4), "int64"), tvar("b", (2, 4, 3))))
    assert dims(s) == (2, 4, 3)
    assert dims(infer(op.cholesky(tvar("a", (4, 4)), upper=True))) == (4, 4)


def test_errors_name_the_op():
    with pytest.raises(StructInfoError, match="cholesky: a must hold square matrices"):
        infer(op.cholesky(tvar("a", (4, 3))))
    with pytest.raises(StructInfoError, match="lu_factor: a must be a float tensor"):
        infer(op.lu_factor(tvar("a", (4, 4), "int32")))
    with pytest.raises(StructInfoError, match="lu_factor: a must have rank >= 2"):
        infer(op.lu_factor(tvar("a", (4,))))
    with pytest.raises(StructInfoError, match="triangular_solve: b of shape"):
        infer(op.triangular_solve(tvar("a", (2, 4, 4)), tvar("b", (3, 4, 1))))
    with pytest.raises(StructInfoError, match="lu_solve: pivots must be int64"):
        infer(op.lu_solve(tvar("a", (4, 4)), tvar("p", (4,), "int32"), tvar("b", (4, 1))))
    with pytest.raises(KilnError, match="cholesky: upper must be a bool"):
        op.cholesky(tvar("a", (4, 4)), upper=1)


@pytest.mark.parametrize("shape", [(3, 6, 6), (2, 5, 3), (4, 7), (1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lu_factor_matches_lapack(shape, dtype):
    a = RNG.standard_normal(shape).astype(dtype)
    lu, piv = _run(lambda bb, x: op.lu_factor(x), a)
    tol = 1e-5 if dtype == "float32" else 1e-12
    for i in np.ndindex(shape[:-2]):
        want_lu, want_piv = scipy.linalg.lu_factor(a[i]) if shape[-1] == shape[-2] else (
            None, None)
        if want_lu is not None:
            np.testing.assert_allclose(lu[i], want_lu, rtol=tol, atol=tol)
            np.testing.assert_array_equal(piv[i], want_piv)
        # P a = L U, for square and rectangular matrices
        m, n = shape[-2:]
        k = min(m, n)
        lower = np.tril(lu[i][:, :k], -1) + np.eye(m, k)
        upper = np.triu(lu[i][:k, :])
        rows = np.arange(m)
        for s, p in enumerate(piv[i]):
            rows[[s, p]] = rows[[p, s]]
        np.testing.assert_allclose(a[i][rows], lower @ upper, rtol=10 * tol, atol=10 * tol)


def test_a_singular_matrix_keeps_a_zero_pivot():
    a = np.array([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [1.0, 0.0, 1.0]], "float64")
    lu, _ = _run(lambda bb, x: op.lu_factor(x), a)
    assert np.count_nonzero(np.abs(np.diag(lu)) < 1e-12) == 1


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lu_solve_and_the_inverse(dtype):
    a = RNG.standard_normal((3, 5, 5)).astype(dtype) + 3 * np.eye(5, dtype=dtype)
    b = RNG.standard_normal((3, 5, 2)).astype(dtype)

    def solve(bb, x, y):
        f = bb.emit(op.lu_factor(x))
        return op.lu_solve(g.TupleGetItem(f, 0), g.TupleGetItem(f, 1), y)

    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(_run(solve, a, b), np.linalg.solve(a, b), rtol=tol, atol=tol)
    eye = np.broadcast_to(np.eye(5, dtype=dtype), a.shape).copy()
    np.testing.assert_allclose(_run(solve, a, eye), np.linalg.inv(a), rtol=tol, atol=tol)


@pytest.mark.parametrize("upper", [False, True])
def test_cholesky(upper):
    x = RNG.standard_normal((2, 6, 6))
    spd = x @ x.transpose(0, 2, 1) + 6 * np.eye(6)
    low = np.linalg.cholesky(spd)
    # only the triangle in use is read: garbage in the other one changes nothing
    noisy = np.where(np.triu(np.ones((6, 6), bool), 1) if not upper else
                     np.tril(np.ones((6, 6), bool), -1), 99.0, spd)
    got = _run(lambda bb, a: op.cholesky(a, upper=upper), noisy)
    np.testing.assert_allclose(got, low.transpose(0, 2, 1) if upper else low, rtol=1e-10,
                               atol=1e-12)
    bad = _run(lambda bb, a: op.cholesky(a), -spd)  # not positive definite: NaN, no crash
    assert np.isnan(bad[:, 0, 0]).all()


@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_triangular_solve(upper, unit):
    a = RNG.standard_normal((2, 5, 5)) + 4 * np.eye(5)
    b = RNG.standard_normal((2, 5, 3))
    tri = np.triu(a) if upper else np.tril(a)
    if unit:
        tri[:, np.arange(5), np.arange(5)] = 1
    got = _run(lambda bb, x, y: op.triangular_solve(x, y, upper=upper, unit_diagonal=unit), a, b)
    np.testing.assert_allclose(got, np.linalg.solve(tri, b), rtol=1e-10, atol=1e-12)


def test_determinant_from_lu():
    a = RNG.standard_normal((4, 7, 7)).astype("float32")
    got = _run(lambda bb, x: determinant(bb.emit, x, 7), a)
    np.testing.assert_allclose(got, np.linalg.det(a.astype(np.float64)), rtol=1e-4)


def test_check_info_passes_values_through_or_raises():
    x = RNG.standard_normal((3, 4, 4)).astype("float32")
    ok = np.zeros(3, "int32")
    got = _run(lambda bb, a, i: op.check_info(a, i, what="test: info must be 0"), x, ok)
    np.testing.assert_array_equal(got, x)
    bad = np.array([0, 2, 0], "int32")
    with pytest.raises(RuntimeCheckError, match=r"test: info must be 0: index 2 is out of range"):
        _run(lambda bb, a, i: op.check_info(a, i, what="test: info must be 0"), x, bad)
    with pytest.raises(StructInfoError, match="check_info: info of shape"):
        infer(op.check_info(tvar("x", (3, 4)), tvar("i", (2,), "int32"), what="w"))
