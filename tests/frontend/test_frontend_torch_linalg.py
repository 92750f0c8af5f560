"""torch.linalg through kiln's matrix kernels: inv, solve (left and right, vector right-hand
sides, broadcast batches), det, slogdet, LU (square and rectangular, factor/solve/unpack),
Cholesky (factor, solve, inverse), triangular solves -- one exported program compared with
eager on random matrices, plus the ``info`` outputs of singular and indefinite matrices and
the run-time errors of the raising forms (``torch.linalg.inv`` of a singular matrix)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import kiln
from kiln.frontend.torch import from_exported_program
from kiln.ir.errors import RuntimeCheckError


class Linalg(torch.nn.Module):
    def forward(self, a, b, r, spd):
        lu, piv, info = torch.linalg.lu_factor_ex(a)
        p, lower, upper = torch.linalg.lu(r)
        sign, logabs = torch.linalg.slogdet(a)
        chol, cinfo = torch.linalg.cholesky_ex(spd)
        return (
            torch.linalg.inv_ex(a)[0],
            torch.linalg.solve_ex(a, b)[0],
            torch.linalg.solve_ex(a, b[..., 0])[0],
            torch.linalg.solve_ex(a, b.mT, left=False)[0],
            torch.linalg.solve_ex(a[0], b)[0],  # one matrix, a batch of right-hand sides
            torch.linalg.det(a), sign, logabs, lu, piv, info, p, lower, upper,
            torch.linalg.lu_solve(lu, piv, b), torch.linalg.lu_solve(lu, piv, b, adjoint=True),
            torch.linalg.lu_solve(lu, piv, b.mT, left=False),
            torch.lu_unpack(lu, piv)[1],
            chol, cinfo, torch.linalg.cholesky_ex(spd, upper=True)[0],
            torch.cholesky_solve(b, chol), torch.cholesky_inverse(chol),
            torch.linalg.solve_triangular(a.triu(), b, upper=True),
            torch.linalg.solve_triangular(a.tril(), b.mT, upper=False, left=False,
                                          unitriangular=True),
            torch.triangular_solve(b, a.triu(), upper=True, transpose=True)[0],
        )


def _inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64) + 2 * torch.eye(5)
    b = torch.randn(3, 5, 2, generator=gen, dtype=torch.float64)
    r = torch.randn(3, 4, 6, generator=gen, dtype=torch.float64)
    x = torch.randn(3, 5, 5, generator=gen, dtype=torch.float64)
    return a, b, r, x @ x.mT + 5 * torch.eye(5, dtype=torch.float64)


def test_linalg_matches_eager():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Linalg(), _inputs(0))
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, "c", params=params)
    for seed in (1, 2):
        args = _inputs(seed)
        got, want = exe(*args), Linalg()(*args)
        assert len(got) == len(want)
        for k, (x, y) in enumerate(zip(got, want)):
            y = y.numpy()
            assert x.dtype == y.dtype and x.shape == y.shape, k
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9, err_msg=f"output {k}")
    # singular and indefinite matrices: info names the first bad pivot / column (1-based)
    a, b, r, spd = _inputs(3)
    a[0] = 0
    a[1, 2, :] = a[1, 0, :]  # equal rows stay equal through elimination: an exact zero pivot
    spd[2, 3, 3] = -100
    got, want = exe(a, b, r, spd), Linalg()(a, b, r, spd)
    np.testing.assert_array_equal(got[10], want[10].numpy())  # lu_factor_ex info
    np.testing.assert_array_equal(got[19], want[19].numpy())  # cholesky_ex info
    np.testing.assert_allclose(got[5], want[5].numpy(), atol=1e-9)  # det 0


class Checked(torch.nn.Module):
    """The raising forms: their programs check ``info`` in a with_effects node."""

    def forward(self, a, spd):
        return torch.linalg.inv(a) * 2, torch.linalg.cholesky(spd), torch.linalg.solve(a, spd)


def test_errors_of_the_raising_forms_are_run_time_errors():
    a, _, _, spd = _inputs(4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Checked(), (a, spd))
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, "c", params=params)
    for x, y in zip(exe(a, spd), Checked()(a, spd)):
        np.testing.assert_allclose(x, y.numpy(), rtol=1e-9, atol=1e-9)
    singular = a.clone()
    singular[1, 3] = singular[1, 0]
    with pytest.raises(RuntimeCheckError, match=r"torch\.linalg\.inv: the input is singular"):
        exe(singular, spd)
    spd[2, 1, 1] = -1.0
    with pytest.raises(RuntimeCheckError, match=r"torch\.linalg\.cholesky: .* index 2 is out"):
        exe(a, spd)


class Decompositions(torch.nn.Module):
    """The decompositions torch.export leaves as ATen ops (geqrf, linalg_qr, ormqr,
    householder_product, _linalg_eigh, _linalg_svd, linalg_pinv, matrix_exp), with results
    unique up to sign returned in forms that are not (``Q R``, ``V diag(w) Vᵀ``, ``U S Vh``)."""

    def forward(self, a, r, sym, low):
        packed, tau = torch.geqrf(r)
        q, rr = torch.linalg.qr(r)
        qc, rc = torch.linalg.qr(r, mode="complete")
        w, v = torch.linalg.eigh(sym)
        wu, vu = torch.linalg.eigh(sym.triu(), UPLO="U")
        u, s, vh = torch.linalg.svd(r, full_matrices=False)
        uf, sf, vhf = torch.linalg.svd(r.mT)  # wide, full
        return (
            packed, tau, q, rr, qc, rc, torch.linalg.qr(r, mode="r")[1],
            torch.linalg.householder_product(packed, tau),
            torch.ormqr(packed, tau, r[..., :3], left=True, transpose=True),
            torch.ormqr(packed, tau, r[..., :3].mT, left=False),
            w, (v * w.unsqueeze(-2)) @ v.mT, wu, vu.abs(),
            s, (u * s.unsqueeze(-2)) @ vh, sf, uf.mT @ uf, vhf @ vhf.mT,
            torch.linalg.svdvals(a), torch.linalg.matrix_norm(a, "nuc"),
            torch.linalg.pinv(r), torch.linalg.pinv(low), torch.linalg.pinv(sym, hermitian=True),
            torch.linalg.pinv(low, atol=0.5), torch.linalg.pinv(low, rtol=0.3),
            torch.linalg.matrix_rank(low), torch.linalg.matrix_rank(low, hermitian=True),
            torch.linalg.matrix_exp(a * 0.5),
        )


def _decomposition_inputs(seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(2, 5, 5, generator=gen, dtype=torch.float64)
    r = torch.randn(2, 6, 4, generator=gen, dtype=torch.float64)
    x = torch.randn(2, 5, 5, generator=gen, dtype=torch.float64)
    b = torch.randn(2, 5, 2, generator=gen, dtype=torch.float64)
    return a, r, x + x.mT, b @ b.mT  # a rank-2 (singular) symmetric matrix


def test_decompositions_match_eager():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Decompositions(), _decomposition_inputs(0))
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, "c", params=params)
    for seed in (1, 2):
        args = _decomposition_inputs(seed)
        got, want = exe(*args), Decompositions()(*args)
        assert len(got) == len(want)
        for k, (x, y) in enumerate(zip(got, want)):
            y = y.numpy()
            assert x.dtype == y.dtype and x.shape == y.shape, k
            np.testing.assert_allclose(x, y, rtol=1e-9, atol=1e-9, err_msg=f"output {k}")


class Vectors(torch.nn.Module):
    def forward(self, sym, r):
        return torch.linalg.eigh(sym) + torch.linalg.svd(r) + torch.svd(r)


def test_vectors_match_eager_up_to_sign():
    """Eigenvectors and singular vectors (distinct values) are LAPACK's up to each vector's sign
    (a U column and its V column flip together)."""
    _, r, sym, _ = _decomposition_inputs(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Vectors(), (sym, r))
    mod, params = from_exported_program(ep)
    w, v, u, s, vh, u2, s2, v2 = kiln.build(mod, "c", params=params)(sym, r)
    want = [t.numpy() for t in Vectors()(sym, r)]
    np.testing.assert_allclose(w, want[0], atol=1e-10)
    sign = np.sign(np.sum(v * want[1], axis=-2, keepdims=True))
    np.testing.assert_allclose(v * sign, want[1], atol=1e-10)
    assert u.shape == (2, 6, 6) and vh.shape == (2, 4, 4)  # full_matrices
    sign = np.sign(np.sum(u[..., :4] * want[2][..., :4], axis=-2, keepdims=True))
    np.testing.assert_allclose(u[..., :4] * sign, want[2][..., :4], atol=1e-10)
    np.testing.assert_allclose(vh * sign.mT, want[4], atol=1e-10)
    np.testing.assert_allclose(s, want[3], atol=1e-10)
    sign = np.sign(np.sum(u2 * want[5], axis=-2, keepdims=True))  # torch.svd: V, not Vh
    np.testing.assert_allclose(u2 * sign, want[5], atol=1e-10)
    np.testing.assert_allclose(v2 * sign, want[7], atol=1e-10)


class Ldl(torch.nn.Module):
    def forward(self, sym, b):
        ld, piv, info = torch.linalg.ldl_factor_ex(sym)
        ld2, piv2 = torch.linalg.ldl_factor(sym)  # the raising form: a check of info
        return ld, piv, info, torch.linalg.ldl_solve(ld, piv, b), ld2, piv2


def test_ldl_matches_eager():
    """Bunch-Kaufman as LAPACK's sytrf: the same pivots (1x1 and 2x2 blocks) and factors."""
    _, _, sym, _ = _decomposition_inputs(4)
    b = torch.randn(2, 5, 3, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(Ldl(), (sym, b))
    mod, params = from_exported_program(ep)
    exe = kiln.build(mod, "c", params=params)
    sym2 = sym.clone()
    sym2[1].diagonal().zero_()  # 2x2 pivots
    for args in ((sym, b), (sym2, b)):
        got, want = exe(*args), Ldl()(*args)
        for k, (x, y) in enumerate(zip(got, want)):
            assert x.dtype == y.numpy().dtype, k
            np.testing.assert_allclose(x, y.numpy(), rtol=1e-10, atol=1e-10, err_msg=str(k))
    assert (exe(sym2, b)[1][1] < 0).any()
    sym2[0, :, 2] = 0  # a zero column: info > 0, and ldl_factor raises
    sym2[0, 2, :] = 0
    assert torch.linalg.ldl_factor_ex(sym2)[2][0] > 0
    with pytest.raises(RuntimeCheckError, match=r"torch\.linalg\.ldl_factor"):
        exe(sym2, b)
