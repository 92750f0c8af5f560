"""The decompositions (kiln.op.decompose): geqrf, ormqr, eigh, svd, matrix_exp -- inference and
errors, and numerics against numpy/scipy (LAPACK) on random batched matrices: square, tall and
wide, 1x1, rank-deficient, repeated eigenvalues, float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.linalg.lapack

from kiln import graph as g
from kiln import op
from kiln.ir.errors import KilnError, StructInfoError
from kiln.op.registry import OpPattern, get_op_def
from kiln.schedule import lookup_schedule
from kiln.testing.op_testing import dims, infer, run_graph, tvar

RNG = np.random.default_rng(11)
TOL = {"float32": 2e-5, "float64": 1e-12}


def _run(fn, *arrays):
    """Build ``main(*arrays) = fn(*vars)`` for the CPU and run it."""
    return run_graph(lambda bb, *params: fn(*params), *arrays)


def _orthonormal_columns(q, tol):
    eye = np.eye(q.shape[-1])
    np.testing.assert_allclose(q.swapaxes(-1, -2) @ q,
                               np.broadcast_to(eye, q.shape[:-2] + eye.shape), atol=tol)


def _same_up_to_sign(x, y, tol):
    """Columns of ``x`` equal to ``y``'s up to each column's sign."""
    sign = np.where(np.sum(x * y, axis=-2, keepdims=True) < 0, -1, 1)
    np.testing.assert_allclose(x * sign, y, atol=tol)


def test_declarations_and_inference():
    for name in ("geqrf", "ormqr", "eigh", "svd", "matrix_exp"):
        d = get_op_def(name)
        assert d.pattern == OpPattern.OPAQUE and d.legalize is not None
        assert lookup_schedule(name, "c") is not None
    s = infer(op.geqrf(tvar("a", (2, 5, 3))))
    assert dims(s.fields[0]) == (2, 5, 3) and dims(s.fields[1]) == (2, 3)
    s = infer(op.ormqr(tvar("a", (2, 5, 3)), tvar("t", (2, 2)), tvar("c", (2, 4, 5)), left=False))
    assert dims(s) == (2, 4, 5)
    s = infer(op.eigh(tvar("a", (3, 4, 4))))
    assert dims(s.fields[0]) == (3, 4) and dims(s.fields[1]) == (3, 4, 4)
    s = infer(op.svd(tvar("a", (2, 5, 3))))
    assert [dims(f) for f in s.fields] == [(2, 5, 3), (2, 3), (2, 3, 3)]
    s = infer(op.svd(tvar("a", (3, 5)), full_matrices=True))
    assert [dims(f) for f in s.fields] == [(3, 3), (3,), (5, 5)]
    assert dims(infer(op.matrix_exp(tvar("a", (2, 3, 3))))) == (2, 3, 3)


def test_errors_name_the_op():
    with pytest.raises(StructInfoError, match="eigh: a must hold square matrices"):
        infer(op.eigh(tvar("a", (4, 3))))
    with pytest.raises(StructInfoError, match="matrix_exp: a must hold square matrices"):
        infer(op.matrix_exp(tvar("a", (4, 3))))
    with pytest.raises(StructInfoError, match="svd: a must be a float tensor"):
        infer(op.svd(tvar("a", (4, 4), "int32")))
    with pytest.raises(StructInfoError, match="geqrf: a must have rank >= 2"):
        infer(op.geqrf(tvar("a", (4,))))
    with pytest.raises(StructInfoError, match="ormqr: reflectors a"):  # a's rows != c's rows
        infer(op.ormqr(tvar("a", (5, 3)), tvar("t", (3,)), tvar("c", (4, 4))))
    with pytest.raises(StructInfoError, match="ormqr: reflectors a"):  # more tau than columns
        infer(op.ormqr(tvar("a", (5, 3)), tvar("t", (4,)), tvar("c", (5, 2))))
    with pytest.raises(StructInfoError, match="svd: needs matrices of static size"):
        infer(op.svd(tvar("a", None, ndim=2)))
    with pytest.raises(KilnError, match="eigh: upper must be a bool"):
        op.eigh(tvar("a", (4, 4)), upper=1)
    with pytest.raises(KilnError, match="ormqr: transpose must be a bool"):
        op.ormqr(tvar("a", (4, 4)), tvar("t", (4,)), tvar("c", (4, 4)), transpose="yes")


@pytest.mark.parametrize("shape", [(3, 6, 6), (2, 5, 3), (4, 7), (1, 1)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_geqrf_matches_lapack(shape, dtype):
    a = RNG.standard_normal(shape).astype(dtype)
    if shape[-1] >= 3:  # rank-deficient: a zero column (tau = 0, no reflection)
        a[..., :, 1] = 0
    qr, tau = _run(lambda x: op.geqrf(x), a)
    tol = 10 * TOL[dtype]
    for i in np.ndindex(shape[:-2]):
        (want_qr, want_tau), _ = scipy.linalg.qr(a[i].astype(np.float64), mode="raw")
        np.testing.assert_allclose(qr[i], want_qr, atol=tol)
        np.testing.assert_allclose(tau[i], want_tau, atol=tol)


@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("transpose", [False, True])
def test_ormqr_applies_q(left, transpose):
    a = RNG.standard_normal((2, 5, 3))
    a[1, :, 2] = a[1, :, 0]  # rank-deficient: the reflectors still make an orthogonal Q
    c = RNG.standard_normal((2, 5, 4) if left else (2, 4, 5))
    out, q_cols, qr, tau = _run(lambda x, y: g.Tuple([
        op.ormqr(g.TupleGetItem(op.geqrf(x), 0), g.TupleGetItem(op.geqrf(x), 1), y, left=left,
                 transpose=transpose),
        # LAPACK's orgqr (Q's first columns): the reflectors applied to the identity's columns
        op.ormqr(g.TupleGetItem(op.geqrf(x), 0), g.TupleGetItem(op.geqrf(x), 1),
                 g.const(np.broadcast_to(np.eye(5, 3), (2, 5, 3)).copy())),
        g.TupleGetItem(op.geqrf(x), 0), g.TupleGetItem(op.geqrf(x), 1)]), a, c)
    np.testing.assert_allclose(q_cols @ np.triu(qr[:, :3]), a, atol=1e-12)
    _orthonormal_columns(q_cols, 1e-12)
    for i in range(2):  # LAPACK's ormqr on the same reflectors
        lwork = 64 * max(c.shape)
        want = scipy.linalg.lapack.dormqr("L" if left else "R", "T" if transpose else "N",
                                          qr[i], tau[i], c[i], lwork)[0]
        np.testing.assert_allclose(out[i], want, atol=1e-12)
    np.testing.assert_allclose(q_cols[0], scipy.linalg.qr(a[0], mode="economic")[0], atol=1e-12)


def _symmetric(n, batch=(), eigenvalues=None):
    q = np.linalg.qr(RNG.standard_normal((*batch, n, n)))[0]
    w = RNG.standard_normal((*batch, n)) if eigenvalues is None else np.broadcast_to(
        np.asarray(eigenvalues, float), (*batch, n))
    return (q * w[..., None, :]) @ q.swapaxes(-1, -2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("upper", [False, True])
def test_eigh_matches_lapack(dtype, upper):
    a = _symmetric(6, (3,)).astype(dtype)
    # only the triangle in use is read: garbage in the other one changes nothing
    other = np.tril(np.ones((6, 6), bool), -1) if upper else np.triu(np.ones((6, 6), bool), 1)
    w, v = _run(lambda x: op.eigh(x, upper=upper), np.where(other, np.float32(99), a))
    want_w, want_v = np.linalg.eigh(a.astype(np.float64))
    tol = 10 * TOL[dtype]
    np.testing.assert_allclose(w, want_w, atol=tol)
    _same_up_to_sign(v, want_v, 100 * tol)
    _orthonormal_columns(v, tol)


def test_eigh_repeated_rank_deficient_and_1x1():
    cases = [_symmetric(5, eigenvalues=[2.0, 2.0, -1.0, 2.0, 0.5]),  # a triple eigenvalue
             _symmetric(5, eigenvalues=[0.0, 3.0, 0.0, 0.0, -2.0]),  # rank 2
             np.zeros((5, 5)), np.diag([3.0, 1.0, 2.0, 1.0, 0.0])]
    a = np.stack(cases)
    w, v = _run(lambda x: op.eigh(x), a)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(a), atol=1e-12)
    _orthonormal_columns(v, 1e-12)  # the repeated eigenvalues' vectors: any orthonormal basis
    np.testing.assert_allclose((v * w[:, None, :]) @ v.swapaxes(-1, -2), a, atol=1e-12)
    w1, v1 = _run(lambda x: op.eigh(x), np.array([[[-3.5]]]))
    assert w1.tolist() == [[-3.5]] and v1.tolist() == [[[1.0]]]


def _check_svd(a, u, s, vh, full, tol):
    m, n = a.shape[-2:]
    k = min(m, n)
    assert u.shape[-2:] == (m, m if full else k) and vh.shape[-2:] == (n if full else k, n)
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False),
                               atol=tol)
    assert np.all(np.diff(s, axis=-1) <= 0)  # descending
    _orthonormal_columns(u, tol)
    _orthonormal_columns(vh.swapaxes(-1, -2), tol)
    np.testing.assert_allclose((u[..., :k] * s[..., None, :]) @ vh[..., :k, :], a, atol=tol)


@pytest.mark.parametrize("shape", [(2, 6, 4), (2, 4, 6), (5, 5), (1, 1)])
@pytest.mark.parametrize("full", [False, True])
def test_svd_matches_lapack(shape, full):
    a = RNG.standard_normal(shape)
    u, s, vh = _run(lambda x: op.svd(x, full_matrices=full), a)
    _check_svd(a, u, s, vh, full, 1e-12)
    # distinct singular values: the vectors are LAPACK's up to sign (U column with V row)
    want_u, _, want_vh = np.linalg.svd(a, full_matrices=False)
    k = min(shape[-2:])
    sign = np.where(np.sum(u[..., :k] * want_u, axis=-2) < 0, -1.0, 1.0)
    np.testing.assert_allclose(u[..., :k] * sign[..., None, :], want_u, atol=1e-10)
    np.testing.assert_allclose(vh[..., :k, :] * sign[..., :, None], want_vh, atol=1e-10)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_svd_rank_deficient_and_zero(dtype):
    low = RNG.standard_normal((6, 2)) @ RNG.standard_normal((2, 4))  # rank 2
    a = np.stack([low, np.zeros((6, 4)), np.outer(np.ones(6), [1.0, 0, 0, 2])]).astype(dtype)
    for full in (False, True):
        for x in (a, a.swapaxes(-1, -2).copy()):  # tall and wide
            u, s, vh = _run(lambda y, full=full: op.svd(y, full_matrices=full), x)
            _check_svd(x, u, s, vh, full, 20 * TOL[dtype])


def test_svd_of_nan_is_nan_and_stops():
    a = RNG.standard_normal((2, 4, 3))
    a[1, 2, 1] = np.nan
    u, s, vh = _run(lambda x: op.svd(x), a)
    assert np.isnan(s[1]).any() and not np.isnan(s[0]).any()
    _check_svd(a[:1], u[:1], s[:1], vh[:1], False, 1e-12)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_matrix_exp_matches_scipy(dtype):
    a = np.stack([RNG.standard_normal((4, 4)) * 0.1,  # no squaring
                  RNG.standard_normal((4, 4)) * 3,  # some squarings
                  np.zeros((4, 4)),
                  np.array([[0, 6.0, 0, 0], [-6.0, 0, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1]])])
    a = a.astype(dtype)
    got = _run(lambda x: op.matrix_exp(x), a)
    want = np.stack([scipy.linalg.expm(x.astype(np.float64)) for x in a])
    scale = np.abs(want).max(axis=(-1, -2), keepdims=True)
    np.testing.assert_allclose(got / scale, want / scale, atol=50 * TOL[dtype])
    one = _run(lambda x: op.matrix_exp(x), np.array([[2.0]], dtype))
    np.testing.assert_allclose(one, [[np.exp(2.0)]], rtol=TOL[dtype])


def _indefinite(batch, n):
    a = RNG.standard_normal((batch, n, n))
    a = a + a.swapaxes(-1, -2)
    a[1][np.diag_indices(n)] = 0  # 2x2 pivots
    a[2, :, 3] = a[2, 3, :] = 0  # a zero column: info > 0 (where the interchanges put it)
    a[3] = np.diag(np.arange(n, dtype=float))
    a[3, 0, -1] = a[3, -1, 0] = 1e-3  # a tiny off-diagonal entry: a far interchange
    return a


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ldl_factor_and_solve_match_lapack(dtype):
    a = _indefinite(5, 7).astype(dtype)
    b = RNG.standard_normal((5, 7, 3)).astype(dtype)
    # only the lower triangle is read
    noisy = np.where(np.triu(np.ones((7, 7), bool), 1), np.asarray(99, dtype), a)
    ld, piv, info, x = _run(lambda m, y: g.Tuple([
        *(g.TupleGetItem(op.ldl_factor(m), i) for i in range(3)),
        op.ldl_solve(g.TupleGetItem(op.ldl_factor(m), 0), g.TupleGetItem(op.ldl_factor(m), 1),
                     y)]), noisy, b)
    assert piv.dtype == np.int64 and info.dtype == np.int64 and info.shape == (5,)
    sytrf = scipy.linalg.lapack.dsytrf if dtype == "float64" else scipy.linalg.lapack.ssytrf
    sytrs = scipy.linalg.lapack.dsytrs if dtype == "float64" else scipy.linalg.lapack.ssytrs
    tol = 10 * TOL[dtype]
    for i in range(5):
        want, want_piv, want_info = sytrf(a[i], lower=1)
        # kiln's pivots are 0-based, ~k (= -k - 1) for both rows of a 2x2 block: LAPACK's
        np.testing.assert_array_equal(np.where(piv[i] >= 0, piv[i] + 1, piv[i]), want_piv)
        assert info[i] == want_info
        np.testing.assert_allclose(ld[i], np.tril(want), atol=tol)
        if want_info == 0:
            np.testing.assert_allclose(x[i], sytrs(want, want_piv, b[i], lower=1)[0],
                                       atol=100 * tol)
    assert (piv[1] < 0).any() and info[2] > 0 and piv[3][0] == 6


def test_ldl_errors_name_the_op():
    with pytest.raises(StructInfoError, match="ldl_factor: a must hold square matrices"):
        infer(op.ldl_factor(tvar("a", (4, 3))))
    with pytest.raises(StructInfoError, match="ldl_solve: pivots must be int64"):
        infer(op.ldl_solve(tvar("a", (4, 4)), tvar("p", (4,), "int32"), tvar("b", (4, 1))))
    with pytest.raises(StructInfoError, match="ldl_solve: b of shape"):
        infer(op.ldl_solve(tvar("a", (4, 4)), tvar("p", (4,), "int64"), tvar("b", (3, 1))))
    s = infer(op.ldl_factor(tvar("a", (2, 4, 4))))
    assert [dims(f) for f in s.fields] == [(2, 4, 4), (2, 4), (2,)]
