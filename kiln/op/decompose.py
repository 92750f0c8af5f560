"""Dense decompositions: Householder QR (``geqrf``, ``ormqr``), the symmetric eigendecomposition
(``eigh``), the singular value decomposition (``svd``), the matrix exponential (``matrix_exp``)
and the symmetric indefinite factorization (``ldl_factor``, ``ldl_solve``), over the trailing
two axes of batched float matrices.

What frameworks build on them (the torch frontend's ``linalg.qr``/``householder_product``/
``eigvalsh``/``svdvals``/``pinv``/``matrix_rank``, the nuclear norm) is graph code around these
kernels: ``Q = ormqr(qr, tau, I)``, ``pinv(a) = V diag(1/s) Uᵀ`` with small ``s`` dropped.

- ``geqrf(a) -> (qr, tau)``: ``a = Q R`` by Householder reflections (LAPACK's geqr2/larfg:
  ``H_i = I - tau_i v_i v_iᵀ``, ``v_i[i] = 1``, ``beta = -sign(alpha) ‖(alpha, x)‖``, so
  ``R`` has LAPACK's signs). ``qr`` holds ``R`` on and above the diagonal and ``v_i`` below it
  (column ``i``); ``tau`` has ``min(m, n)`` entries. ``Q = H_1 H_2 ... H_k``.
- ``ormqr(a, tau, c, left=True, transpose=False) -> Q c`` (``Qᵀ c``, ``c Q``, ``c Qᵀ``) for the
  ``Q`` whose reflectors are the columns of ``a`` below the diagonal (``len(tau)`` of them, as
  ``geqrf`` packs them); ``a``'s rows = ``c``'s rows (``left``) or columns. ``Q``'s first
  columns: ``ormqr(a, tau, eye(m, n))`` (LAPACK's orgqr).
- ``eigh(a, upper=False) -> (w, v)``: ``a = v diag(w) vᵀ`` of the symmetric matrix stored in
  ``a``'s lower (upper) triangle, eigenvalues ascending (LAPACK's order), by cyclic Jacobi
  rotations (Rutishauser's formulas; a pair is rotated while ``|a_pq| > eps sqrt(|a_pp a_qq|)``,
  which gives the small eigenvalues to high relative accuracy) until a sweep rotates nothing,
  at most ``MAX_SWEEPS`` sweeps. Eigenvectors are unique up to sign (and any orthonormal basis
  of a repeated eigenvalue's space).
- ``svd(a, full_matrices=False) -> (u, s, vh)``: ``a = u diag(s) vh``, singular values
  descending, by one-sided (Hestenes) Jacobi: column pairs of the taller side are rotated
  until all are orthogonal to working precision (the same test and bound as ``eigh``), then
  ``s`` are their norms. The columns of ``u`` that zero singular values leave undetermined
  (and the extra ones of ``full_matrices``) are completed to an orthonormal basis by
  Gram-Schmidt (twice) from the unit vector least in the span so far. ``u`` is ``m x m``
  (``full_matrices``) or ``m x k``, ``vh`` ``n x n`` or ``k x n``, ``k = min(m, n)``.
- ``matrix_exp(a)``: ``e^a`` by scaling and squaring: ``a / 2^s`` with ``‖a / 2^s‖₁ <= 1``,
  its degree-18 Taylor polynomial (truncation error below ``1/19! < 2^-55``) by Horner's rule,
  squared ``s`` times.
- ``ldl_factor(a) -> (ld, pivots, info)``: ``P a Pᵀ = L D Lᵀ`` of the symmetric matrix in
  ``a``'s lower triangle by Bunch-Kaufman diagonal pivoting, LAPACK's sytf2 step for step (the
  same 1x1/2x2 pivot choices, interchanges and update order): ``ld`` holds ``D``'s blocks and
  ``L`` below them (upper triangle zero); ``pivots`` (int64, 0-based) is the row interchanged
  with row ``k`` for a 1x1 block, ``~kp = -kp - 1`` on both rows of a 2x2 block (LAPACK's
  1-based ``-kp``); ``info`` (int64, one per matrix) the 1-based index of the first zero
  column, else 0.
- ``ldl_solve(ld, pivots, b) -> x`` with ``a x = b`` (LAPACK's sytrs).

Same design as ``kiln.op.matrix`` (whose ``MatrixKernel`` builds these): one TIR block per
matrix holding the serial steps, the blocks parallel over the batch axes; OPAQUE, no gradient.
Work arrays are the block's own scratch buffers. NaN inputs give NaN outputs (no rotation test
holds for NaN, so the iterations stop).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import tir
from ..graph.struct_info import TupleStructInfo
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import arg_ndim, arg_shape, const_int, dims_equal, kernel_dims, tensor_sinfo
from .matrix import (
    MatrixKernel,
    abs_value,
    emit_kernel,
    matrix_arg,
    matrix_steps,
    operand_dims,
    register_pivoted_solve,
    serial_loop,
)
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, register_op

__all__ = ["eigh", "geqrf", "ldl_factor", "ldl_solve", "matrix_exp", "ormqr", "svd"]

INDEX = DataType("int64")
#: The op names whose kernels are one block per matrix (the CPU schedule lists them).
DECOMPOSE_OPS = ("geqrf", "ormqr", "eigh", "svd", "matrix_exp", "ldl_factor", "ldl_solve")
#: Bound on the Jacobi sweeps of ``eigh`` and ``svd`` (they converge quadratically: a few
#: sweeps for small matrices, some 10 for hundreds of rows).
MAX_SWEEPS = 60
#: Degree of ``matrix_exp``'s Taylor polynomial (of a matrix of 1-norm at most 1).
TAYLOR_DEGREE = 18


# ---- building blocks --------------------------------------------------------------------------
class _Mat:
    """A matrix of the block: a kernel buffer (batch indices added) or scratch, possibly read
    and written transposed."""

    def __init__(self, k: MatrixKernel, buf: tir.Buffer, transposed: bool = False):
        self.k, self.buf, self.transposed = k, buf, transposed
        self.scratch = any(buf is s for s in k.scratches)

    def _idx(self, i: PrimExpr, j: PrimExpr) -> tuple[PrimExpr, ...]:
        i, j = (j, i) if self.transposed else (i, j)
        return (i, j) if self.scratch else self.k.at(i, j)

    def __call__(self, i: PrimExpr, j: PrimExpr) -> PrimExpr:
        return self.buf.load(self._idx(i, j))

    def set(self, i: PrimExpr, j: PrimExpr, value: PrimExpr) -> tir.Stmt:
        return tir.BufferStore(self.buf, value, self._idx(i, j))


class _Vec:
    """A vector output of the block (batch indices added)."""

    def __init__(self, k: MatrixKernel, buf: tir.Buffer):
        self.k, self.buf = k, buf

    def __call__(self, i: PrimExpr) -> PrimExpr:
        return self.buf.load(self.k.at(i))

    def set(self, i: PrimExpr, value: PrimExpr) -> tir.Stmt:
        return tir.BufferStore(self.buf, value, self.k.at(i))


class _Slots:
    """Named scalar registers of the block (one small scratch buffer)."""

    def __init__(self, k: MatrixKernel, name: str, dtype: Any, names: Sequence[str]):
        self.buf = k.scratch(name, (len(names),), dtype)
        self.slot = {s: tx.const(INDEX, i) for i, s in enumerate(names)}

    def __getitem__(self, name: str) -> PrimExpr:
        return self.buf.load((self.slot[name],))

    def set(self, name: str, value: PrimExpr) -> tir.Stmt:
        return tir.BufferStore(self.buf, value, (self.slot[name],))


def _sum_into(r: _Slots, name: str, lo: Any, hi: Any, term: Any, dt: DataType) -> tir.Stmt:
    """``r[name] = sum(term(i) for i in range(lo, hi))``."""
    return tir.seq(r.set(name, tx.const(dt, 0)),
                   serial_loop("e", lo, hi, lambda i: r.set(name, r[name] + term(i))))


def _eye(m: _Mat, rows: Any, cols: Any, dt: DataType) -> tir.Stmt:
    one, zero = tx.const(dt, 1), tx.const(dt, 0)
    return serial_loop("ei", 0, rows, lambda i: serial_loop("ej", 0, cols, lambda j: m.set(
        i, j, tx.Select(tx.eq(i, j), one, zero))))


def _rotate_columns(mats: Sequence[tuple[_Mat, Any]], p: PrimExpr, q: PrimExpr, c: PrimExpr,
                    s: PrimExpr, dt: DataType) -> tir.Stmt:
    """Columns ``p, q`` of each ``(matrix, rows)`` times the rotation ``[[c, s], [-s, c]]``."""
    def rows(m: _Mat, n: Any) -> tir.Stmt:
        def one(r: PrimExpr) -> tir.Stmt:
            x, y = tir.Var("x", dt), tir.Var("y", dt)
            return tir.LetStmt(x, m(r, p), tir.LetStmt(y, m(r, q), tir.seq(
                m.set(r, p, c * x - s * y), m.set(r, q, s * x + c * y))))
        return serial_loop("r", 0, n, one)

    return tir.seq(*(rows(m, n) for m, n in mats))


def _jacobi(r: _Slots, app: PrimExpr, aqq: PrimExpr, apq: PrimExpr, dt: DataType,
            body: tir.Stmt) -> tir.Stmt:
    """When ``[[app, apq], [apq, aqq]]`` is not diagonal to working precision: ``r["c"]``,
    ``r["s"]``, ``r["t"]`` of the Jacobi rotation that diagonalizes it (``t = tan``, the smaller
    angle), then ``body``, and ``r["rotated"]`` set. ``app``/``aqq``/``apq`` are read before
    ``body`` runs."""
    info = np.finfo(dt.to_numpy())
    eps, tiny = tx.const(dt, float(info.eps)), tx.const(dt, float(info.tiny))
    big = tx.const(dt, float(np.sqrt(info.max) / 4))
    one, two, half = tx.const(dt, 1), tx.const(dt, 2), tx.const(dt, 0.5)
    theta = r["theta"]
    mag = abs_value(theta)
    t = tx.Select(tx.gt(mag, big), half / mag, one / (mag + tx.sqrt(one + theta * theta)))
    threshold = tx.max(eps * tx.sqrt(abs_value(app)) * tx.sqrt(abs_value(aqq)), tiny)
    return tir.IfThenElse(tx.gt(abs_value(apq), threshold), tir.seq(
        r.set("theta", (aqq - app) / (two * apq)),
        r.set("t", tx.Select(tx.lt(theta, tx.const(dt, 0)), tx.const(dt, 0) - t, t)),
        r.set("c", one / tx.sqrt(one + r["t"] * r["t"])),
        r.set("s", r["t"] * r["c"]),
        body,
        r.set("rotated", one)))


def _sweeps(r: _Slots, n: Any, dt: DataType, pair: Any) -> tir.Stmt:
    """Cyclic sweeps over the pairs ``p < q`` while the last sweep rotated (at most
    ``MAX_SWEEPS``)."""
    one, zero = tx.const(dt, 1), tx.const(dt, 0)
    sweep = tir.seq(r.set("rotated", zero), serial_loop("p", 0, n, lambda p: serial_loop(
        "q", p + 1, n, lambda q: pair(p, q))))
    return tir.seq(r.set("rotated", one), serial_loop("sweep", 0, MAX_SWEEPS, lambda _: (
        tir.IfThenElse(tx.ne(r["rotated"], zero), sweep))))


def _sort(vals: _Vec, vecs: Sequence[tuple[_Mat, Any]], n: Any, ascending: bool,
          best: _Slots) -> tir.Stmt:
    """Selection sort of ``vals`` (``n``), the columns of each ``(matrix, rows)`` moved along."""
    def place(i: PrimExpr) -> tir.Stmt:
        arg = best["arg"]
        better = tx.lt if ascending else tx.gt
        find = tir.seq(best.set("arg", i), serial_loop("j", i + 1, n, lambda j: tir.IfThenElse(
            better(vals(j), vals(arg)), best.set("arg", j))))

        def swap_rows(m: _Mat, rows: Any) -> tir.Stmt:
            def one(r: PrimExpr) -> tir.Stmt:
                x = tir.Var("x", m.buf.dtype)
                return tir.LetStmt(x, m(r, i), tir.seq(m.set(r, i, m(r, arg)), m.set(r, arg, x)))
            return serial_loop("r", 0, rows, one)

        x = tir.Var("x", vals.buf.dtype)
        swap = tir.seq(tir.LetStmt(x, vals(i), tir.seq(vals.set(i, vals(arg)), vals.set(arg, x))),
                       *(swap_rows(m, rows) for m, rows in vecs))
        return tir.seq(find, tir.IfThenElse(tx.ne(arg, i), swap))

    return serial_loop("i", 0, n, place)


def _matmul(out: _Mat, x: _Mat, y: _Mat, n: Any, acc: _Slots, dt: DataType) -> tir.Stmt:
    """``out = x @ y`` of ``n x n`` matrices (``out`` distinct from both)."""
    return serial_loop("i", 0, n, lambda i: serial_loop("j", 0, n, lambda j: tir.seq(
        _sum_into(acc, "acc", 0, n, lambda e: x(i, e) * y(e, j), dt), out.set(i, j, acc["acc"]))))


# ---- kernels ----------------------------------------------------------------------------------
def geqrf_prim_func(batch: Sequence[Any], m: Any, n: Any, dtype: Any) -> tir.PrimFunc:
    """``(A, QR, TAU)``: the Householder QR factorization of each ``m x n`` matrix."""
    k = MatrixKernel("geqrf", batch)
    dt = as_dtype(dtype)
    steps = matrix_steps(m, n)
    a = _Mat(k, k.buffer("A", (m, n), dt))
    qr = _Mat(k, k.buffer("QR", (m, n), dt, output=True))
    tau = _Vec(k, k.buffer("TAU", (steps,), dt, output=True))
    r = _Slots(k, "reg", dt, ("alpha", "xnorm", "beta", "w"))
    zero, one = tx.const(dt, 0), tx.const(dt, 1)

    def step(i: PrimExpr) -> tir.Stmt:
        alpha, beta = r["alpha"], r["beta"]
        reflect = tir.seq(
            r.set("beta", tx.sqrt(alpha * alpha + r["xnorm"])),
            r.set("beta", tx.Select(tx.ge(alpha, zero), zero - beta, beta)),
            tau.set(i, (beta - alpha) / beta),
            r.set("w", one / (alpha - beta)),
            serial_loop("row", i + 1, m, lambda e: qr.set(e, i, qr(e, i) * r["w"])),
            qr.set(i, i, beta))

        def apply(j: PrimExpr) -> tir.Stmt:  # H_i on column j > i: v_i[i] = 1
            return tir.seq(
                _sum_into(r, "w", i + 1, m, lambda e: qr(e, i) * qr(e, j), dt),
                r.set("w", (r["w"] + qr(i, j)) * tau(i)),
                qr.set(i, j, qr(i, j) - r["w"]),
                serial_loop("row", i + 1, m, lambda e: qr.set(e, j, qr(e, j) - qr(e, i) * r["w"])))

        return tir.seq(
            r.set("alpha", qr(i, i)),
            _sum_into(r, "xnorm", i + 1, m, lambda e: qr(e, i) * qr(e, i), dt),
            tir.IfThenElse(tx.eq(r["xnorm"], zero), tau.set(i, zero), reflect),
            serial_loop("j", i + 1, n, apply))

    copy = serial_loop("ci", 0, m, lambda i: serial_loop("cj", 0, n, lambda j: qr.set(
        i, j, a(i, j))))
    return k.func(tir.seq(copy, serial_loop("i", 0, steps, step)))


def ormqr_prim_func(batch: Sequence[Any], rows: Any, cols: Any, reflectors: Any, m: Any, n: Any,
                    dtype: Any, left: bool, transpose: bool) -> tir.PrimFunc:
    """``(A, TAU, C, OUT)``: ``OUT = Q C`` (``Qᵀ C``, ``C Q``, ``C Qᵀ``), ``Q = H_1 ... H_k``
    from the ``rows x cols`` reflector matrix ``A`` and its ``k = reflectors`` factors ``TAU``."""
    k = MatrixKernel("ormqr", batch)
    dt = as_dtype(dtype)
    a = _Mat(k, k.buffer("A", (rows, cols), dt))
    tau = _Vec(k, k.buffer("TAU", (reflectors,), dt))
    c = _Mat(k, k.buffer("C", (m, n), dt))
    out = _Mat(k, k.buffer("OUT", (m, n), dt, output=True), transposed=not left)
    r = _Slots(k, "reg", dt, ("w",))
    # applying from the right is applying to the transpose from the left: C H = (H Cᵀ)ᵀ
    length, width = (m, n) if left else (n, m)
    forward = left == transpose  # Qᵀ C = H_k ... H_1 C: H_1 first

    def reflector(t: PrimExpr) -> tir.Stmt:
        i = t if forward else reflectors - 1 - t

        def column(j: PrimExpr) -> tir.Stmt:
            return tir.seq(
                _sum_into(r, "w", i + 1, length, lambda e: a(e, i) * out(e, j), dt),
                r.set("w", (r["w"] + out(i, j)) * tau(i)),
                out.set(i, j, out(i, j) - r["w"]),
                serial_loop("row", i + 1, length, lambda e: out.set(
                    e, j, out(e, j) - a(e, i) * r["w"])))

        return serial_loop("j", 0, width, column)

    copy = serial_loop("ci", 0, m, lambda i: serial_loop("cj", 0, n, lambda j: tir.BufferStore(
        out.buf, c(i, j), k.at(i, j))))
    return k.func(tir.seq(copy, serial_loop("t", 0, reflectors, reflector)))


def eigh_prim_func(batch: Sequence[Any], n: Any, dtype: Any, upper: bool) -> tir.PrimFunc:
    """``(A, W, V)``: eigenvalues (ascending) and eigenvectors (columns) of each symmetric
    ``n x n`` matrix stored in ``A``'s lower (``upper``: upper) triangle."""
    k = MatrixKernel("eigh", batch)
    dt = as_dtype(dtype)
    a = _Mat(k, k.buffer("A", (n, n), dt))
    w = _Vec(k, k.buffer("W", (n,), dt, output=True))
    v = _Mat(k, k.buffer("V", (n, n), dt, output=True))
    s = _Mat(k, k.scratch("S", (n, n), dt))
    r = _Slots(k, "reg", dt, ("theta", "t", "c", "s", "rotated"))
    best = _Slots(k, "best", INDEX, ("arg",))

    def load(i: PrimExpr, j: PrimExpr) -> tir.Stmt:
        lo, hi = tx.min(i, j), tx.max(i, j)
        return s.set(i, j, a(lo, hi) if upper else a(hi, lo))

    def pair(p: PrimExpr, q: PrimExpr) -> tir.Stmt:
        c_, s_, t = r["c"], r["s"], r["t"]

        def other(e: PrimExpr) -> tir.Stmt:  # rows/columns e != p, q of S J and Jᵀ S
            x, y = tir.Var("x", dt), tir.Var("y", dt)
            return tir.IfThenElse(tx.logical_and(tx.ne(e, p), tx.ne(e, q)), tir.LetStmt(
                x, s(e, p), tir.LetStmt(y, s(e, q), tir.seq(
                    s.set(e, p, c_ * x - s_ * y), s.set(p, e, c_ * x - s_ * y),
                    s.set(e, q, s_ * x + c_ * y), s.set(q, e, s_ * x + c_ * y)))))

        apq = tir.Var("apq", dt)
        body = tir.LetStmt(apq, s(p, q), tir.seq(
            serial_loop("e", 0, n, other),
            s.set(p, p, s(p, p) - t * apq), s.set(q, q, s(q, q) + t * apq),
            s.set(p, q, tx.const(dt, 0)), s.set(q, p, tx.const(dt, 0)),
            _rotate_columns([(v, n)], p, q, c_, s_, dt)))
        return _jacobi(r, s(p, p), s(q, q), s(p, q), dt, body)

    return k.func(tir.seq(
        serial_loop("ci", 0, n, lambda i: serial_loop("cj", 0, n, lambda j: load(i, j))),
        _eye(v, n, n, dt),
        _sweeps(r, n, dt, pair),
        serial_loop("d", 0, n, lambda i: w.set(i, s(i, i))),
        _sort(w, [(v, n)], n, True, best)))


def svd_prim_func(batch: Sequence[Any], m: int, n: int, dtype: Any,
                  full_matrices: bool) -> tir.PrimFunc:
    """``(A, U, S, VH)``: the singular value decomposition of each ``m x n`` matrix (``m``,
    ``n`` static: the Jacobi rotations work on the columns of the taller side)."""
    k = MatrixKernel("svd", batch)
    dt = as_dtype(dtype)
    steps = min(m, n)
    a_buf = k.buffer("A", (m, n), dt)
    u_buf = k.buffer("U", (m, m if full_matrices else steps), dt, output=True)
    s = _Vec(k, k.buffer("S", (steps,), dt, output=True))
    vh_buf = k.buffer("VH", (n if full_matrices else steps, n), dt, output=True)
    # the tall side B = A (m >= n) or Aᵀ: B = X diag(s) Yᵀ with X rotated from B's columns
    tall = m >= n
    rows, cols = (m, n) if tall else (n, m)
    x = _Mat(k, u_buf) if tall else _Mat(k, vh_buf, transposed=True)
    y = _Mat(k, vh_buf, transposed=True) if tall else _Mat(k, u_buf)
    x_cols = (m if full_matrices else steps) if tall else (n if full_matrices else steps)
    b = _Mat(k, a_buf, transposed=not tall)
    r = _Slots(k, "reg", dt, ("theta", "t", "c", "s", "rotated", "alpha", "beta", "gamma",
                              "acc", "best"))
    best = _Slots(k, "best", INDEX, ("arg",))
    zero, one = tx.const(dt, 0), tx.const(dt, 1)

    def pair(p: PrimExpr, q: PrimExpr) -> tir.Stmt:
        return tir.seq(
            _sum_into(r, "alpha", 0, rows, lambda e: x(e, p) * x(e, p), dt),
            _sum_into(r, "beta", 0, rows, lambda e: x(e, q) * x(e, q), dt),
            _sum_into(r, "gamma", 0, rows, lambda e: x(e, p) * x(e, q), dt),
            _jacobi(r, r["alpha"], r["beta"], r["gamma"], dt, _rotate_columns(
                [(x, rows), (y, cols)], p, q, r["c"], r["s"], dt)))

    def normalize(j: PrimExpr) -> tir.Stmt:
        return tir.seq(
            _sum_into(r, "acc", 0, rows, lambda e: x(e, j) * x(e, j), dt),
            s.set(j, tx.sqrt(r["acc"])),
            tir.IfThenElse(tx.ne(s(j), zero), serial_loop("e", 0, rows, lambda e: x.set(
                e, j, x(e, j) / s(j)))))

    def fill(j: PrimExpr) -> tir.Stmt:
        """Column j of X: orthonormal to the columns before it (all orthonormal)."""
        def residual(i: PrimExpr) -> tir.Stmt:  # |e_i - its projection|² = 1 - Σ x(i, l)²
            return tir.seq(_sum_into(r, "acc", 0, j, lambda e: x(i, e) * x(i, e), dt),
                           tir.IfThenElse(tx.gt(one - r["acc"], r["best"]), tir.seq(
                               r.set("best", one - r["acc"]), best.set("arg", i))))

        def project(_: PrimExpr) -> tir.Stmt:
            return serial_loop("l", 0, j, lambda e: tir.seq(
                _sum_into(r, "acc", 0, rows, lambda i: x(i, e) * x(i, j), dt),
                serial_loop("i", 0, rows, lambda i: x.set(i, j, x(i, j) - r["acc"] * x(i, e)))))

        return tir.seq(
            r.set("best", tx.const(dt, -1)), best.set("arg", tx.const(INDEX, 0)),
            serial_loop("i", 0, rows, residual),
            serial_loop("i", 0, rows, lambda i: x.set(i, j, tx.Select(
                tx.eq(i, best["arg"]), one, zero))),
            serial_loop("twice", 0, 2, project),
            _sum_into(r, "acc", 0, rows, lambda e: x(e, j) * x(e, j), dt),
            r.set("acc", tx.sqrt(r["acc"])),
            serial_loop("i", 0, rows, lambda i: x.set(i, j, x(i, j) / r["acc"])))

    def complete(j: PrimExpr) -> tir.Stmt:
        if x_cols == cols:
            return tir.IfThenElse(tx.eq(s(j), zero), fill(j))
        return tir.IfThenElse(tx.ge(j, cols), fill(j), tir.IfThenElse(tx.eq(s(j), zero), fill(j)))

    return k.func(tir.seq(
        serial_loop("ci", 0, rows, lambda i: serial_loop("cj", 0, cols, lambda j: x.set(
            i, j, b(i, j)))),
        _eye(y, cols, cols, dt),
        _sweeps(r, cols, dt, pair),
        serial_loop("j", 0, cols, normalize),
        _sort(s, [(x, rows), (y, cols)], cols, False, best),
        serial_loop("j", 0, x_cols, complete)))


def matrix_exp_prim_func(batch: Sequence[Any], n: Any, dtype: Any) -> tir.PrimFunc:
    """``(A, E)``: ``e^A`` of each ``n x n`` matrix by scaling, a Taylor polynomial and
    squaring."""
    k = MatrixKernel("matrix_exp", batch)
    dt = as_dtype(dtype)
    a = _Mat(k, k.buffer("A", (n, n), dt))
    e = _Mat(k, k.buffer("E", (n, n), dt, output=True))
    b = _Mat(k, k.scratch("B", (n, n), dt))
    t = _Mat(k, k.scratch("T", (n, n), dt))
    r = _Slots(k, "reg", dt, ("norm", "scale", "acc"))
    count = _Slots(k, "count", INDEX, ("s",))
    zero, one, half = tx.const(dt, 0), tx.const(dt, 1), tx.const(dt, 0.5)
    # halving the largest finite norm to 1 takes log2(max) steps
    max_squarings = int(np.log2(np.finfo(dt.to_numpy()).max)) + 2

    def column_norm(j: PrimExpr) -> tir.Stmt:
        return tir.seq(_sum_into(r, "acc", 0, n, lambda i: abs_value(a(i, j)), dt),
                       r.set("norm", tx.max(r["norm"], r["acc"])))

    def horner(q: PrimExpr) -> tir.Stmt:  # E = I + B E / d, d = DEGREE - q
        d = tx.cast(dt, TAYLOR_DEGREE - q)
        return tir.seq(_matmul(t, b, e, n, r, dt), serial_loop("i", 0, n, lambda i: serial_loop(
            "j", 0, n, lambda j: e.set(i, j, tx.Select(tx.eq(i, j), one, zero) + t(i, j) / d))))

    def square(q: PrimExpr) -> tir.Stmt:
        return tir.IfThenElse(tx.lt(q, count["s"]), tir.seq(
            _matmul(t, e, e, n, r, dt),
            serial_loop("i", 0, n, lambda i: serial_loop("j", 0, n, lambda j: e.set(
                i, j, t(i, j))))))

    return k.func(tir.seq(
        r.set("norm", zero), serial_loop("j", 0, n, column_norm),
        r.set("scale", one), count.set("s", tx.const(INDEX, 0)),
        serial_loop("h", 0, max_squarings, lambda _: tir.IfThenElse(tx.gt(r["norm"], one), tir.seq(
            r.set("norm", r["norm"] * half), r.set("scale", r["scale"] * half),
            count.set("s", count["s"] + 1)))),
        serial_loop("i", 0, n, lambda i: serial_loop("j", 0, n, lambda j: b.set(
            i, j, a(i, j) * r["scale"]))),
        _eye(e, n, n, dt),
        serial_loop("q", 0, TAYLOR_DEGREE, horner),
        serial_loop("q", 0, max_squarings, square)))


def _swap(get: Any, put: Any, dt: DataType) -> tir.Stmt:
    """Exchange two entries: ``get``/``put`` are pairs of (load, store-of-value) closures."""
    x = tir.Var("x", dt)
    return tir.LetStmt(x, get[0], tir.seq(put[0](get[1]), put[1](x)))


def _swap_entries(m: _Mat, i: PrimExpr, j: PrimExpr, p: PrimExpr, q: PrimExpr,
                  dt: DataType) -> tir.Stmt:
    """``m[i, j] <-> m[p, q]``."""
    return _swap((m(i, j), m(p, q)), (lambda v: m.set(i, j, v), lambda v: m.set(p, q, v)), dt)


def _skipping(state: _Slots, n: Any, backward: bool, step: Any) -> tir.Stmt:
    """``step(k)`` for ``k`` over ``range(n)`` (reversed when ``backward``), except right after
    a step that set ``state["skip"]`` (the second row of a 2x2 pivot block)."""
    zero = tx.const(INDEX, 0)

    def one(q: PrimExpr) -> tir.Stmt:
        k = n - 1 - q if backward else q
        return tir.IfThenElse(tx.ne(state["skip"], zero), state.set("skip", zero), step(k))

    return tir.seq(state.set("skip", zero), serial_loop("k", 0, n, one))


def ldl_factor_prim_func(batch: Sequence[Any], n: Any, dtype: Any) -> tir.PrimFunc:
    """``(A, LD, P, INFO)``: the Bunch-Kaufman factorization ``P A Pᵀ = L D Lᵀ`` of each
    symmetric ``n x n`` matrix (lower triangle read), LAPACK's sytf2 step for step."""
    k_ = MatrixKernel("ldl_factor", batch)
    dt = as_dtype(dtype)
    a = _Mat(k_, k_.buffer("A", (n, n), dt))
    ld = _Mat(k_, k_.buffer("LD", (n, n), dt, output=True))
    piv = _Vec(k_, k_.buffer("P", (n,), INDEX, output=True))
    info = k_.buffer("INFO", (), INDEX, output=True)
    r = _Slots(k_, "reg", dt, ("absakk", "colmax", "rowmax", "d11", "d21", "d22", "wk", "wkp1"))
    st = _Slots(k_, "state", INDEX, ("imax", "kp", "kstep", "skip"))
    zero, one = tx.const(dt, 0), tx.const(dt, 1)
    i0, i1, i2 = (tx.const(INDEX, v) for v in (0, 1, 2))
    alpha = tx.const(dt, (1 + np.sqrt(17.0)) / 8)  # the growth bound's optimum

    def step(k: PrimExpr) -> tir.Stmt:
        absakk, colmax, rowmax = r["absakk"], r["colmax"], r["rowmax"]
        imax, kp, kstep = st["imax"], st["kp"], st["kstep"]

        def colmax_of(i: PrimExpr) -> tir.Stmt:  # the first largest below the diagonal
            return tir.IfThenElse(tx.gt(abs_value(ld(i, k)), colmax), tir.seq(
                r.set("colmax", abs_value(ld(i, k))), st.set("imax", i)))

        def row_of_imax(lo: PrimExpr, hi: PrimExpr, entry: Any) -> tir.Stmt:
            return serial_loop("j", lo, hi, lambda j: r.set("rowmax", tx.max(
                rowmax, abs_value(entry(j)))))

        iv = tir.Var("imax", INDEX)
        choose = tir.IfThenElse(tx.ge(absakk, alpha * colmax), st.set("kp", k), tir.LetStmt(
            iv, imax, tir.seq(
                r.set("rowmax", zero),
                row_of_imax(k, iv, lambda j: ld(iv, j)),
                row_of_imax(iv + 1, n, lambda j: ld(j, iv)),
                tir.IfThenElse(
                    tx.ge(absakk, alpha * colmax * (colmax / rowmax)), st.set("kp", k),
                    tir.IfThenElse(tx.ge(abs_value(ld(iv, iv)), alpha * rowmax),
                                   st.set("kp", iv),
                                   tir.seq(st.set("kp", iv), st.set("kstep", i2)))))))

        kkv, kpv = tir.Var("kk", INDEX), tir.Var("kpv", INDEX)
        interchange = tir.LetStmt(kkv, k + kstep - i1, tir.LetStmt(kpv, kp, tir.IfThenElse(
            tx.ne(kpv, kkv), tir.seq(
                serial_loop("i", kpv + 1, n, lambda i: _swap_entries(ld, i, kkv, i, kpv, dt)),
                serial_loop("j", kkv + 1, kpv, lambda j: _swap_entries(ld, j, kkv, kpv, j, dt)),
                _swap_entries(ld, kkv, kkv, kpv, kpv, dt),
                tir.IfThenElse(tx.eq(kstep, i2), _swap_entries(ld, k + 1, k, kpv, k, dt))))))

        one_by_one = tir.IfThenElse(tx.lt(k, n - 1), tir.seq(
            r.set("d11", one / ld(k, k)),
            serial_loop("j", k + 1, n, lambda j: serial_loop("i", j, n, lambda i: ld.set(
                i, j, ld(i, j) - ld(i, k) * (r["d11"] * ld(j, k))))),
            serial_loop("i", k + 1, n, lambda i: ld.set(i, k, ld(i, k) * r["d11"]))))

        def two_column(j: PrimExpr) -> tir.Stmt:
            wk, wkp1 = r["wk"], r["wkp1"]
            return tir.seq(
                r.set("wk", r["d21"] * (r["d11"] * ld(j, k) - ld(j, k + 1))),
                r.set("wkp1", r["d21"] * (r["d22"] * ld(j, k + 1) - ld(j, k))),
                serial_loop("i", j, n, lambda i: ld.set(
                    i, j, ld(i, j) - (ld(i, k) * wk + ld(i, k + 1) * wkp1))),
                ld.set(j, k, wk), ld.set(j, k + 1, wkp1))

        two_by_two = tir.IfThenElse(tx.lt(k, n - 2), tir.seq(
            r.set("d21", ld(k + 1, k)),
            r.set("d11", ld(k + 1, k + 1) / r["d21"]),
            r.set("d22", ld(k, k) / r["d21"]),
            r.set("wk", one / (r["d11"] * r["d22"] - one)),
            r.set("d21", r["wk"] / r["d21"]),
            serial_loop("j", k + 2, n, two_column)))

        singular = tx.logical_or(tx.eq(tx.max(absakk, colmax), zero), tx.isnan(absakk))
        return tir.seq(
            st.set("kstep", i1), st.set("imax", k), r.set("colmax", zero),
            r.set("absakk", abs_value(ld(k, k))),
            serial_loop("i", k + 1, n, colmax_of),
            tir.IfThenElse(singular, tir.seq(
                tir.IfThenElse(tx.eq(info.load(k_.at()), i0), tir.BufferStore(
                    info, k + 1, k_.at())),
                st.set("kp", k)), tir.seq(
                choose, interchange,
                tir.IfThenElse(tx.eq(kstep, i1), one_by_one, two_by_two))),
            tir.IfThenElse(tx.eq(kstep, i1), piv.set(k, kp), tir.seq(
                piv.set(k, i0 - kp - 1), piv.set(k + 1, i0 - kp - 1), st.set("skip", i1))))

    copy = serial_loop("ci", 0, n, lambda i: serial_loop("cj", 0, n, lambda j: ld.set(
        i, j, tx.Select(tx.ge(i, j), a(i, j), zero))))
    return k_.func(tir.seq(copy, tir.BufferStore(info, i0, k_.at()),
                           _skipping(st, n, False, step)))


def ldl_solve_prim_func(batch: Sequence[Any], n: Any, m: Any, dtype: Any) -> tir.PrimFunc:
    """``(LD, P, B, X)``: ``X = A^-1 B`` from ``A``'s ``ldl_factor`` (LAPACK's sytrs)."""
    k_ = MatrixKernel("ldl_solve", batch)
    dt = as_dtype(dtype)
    ld = _Mat(k_, k_.buffer("LD", (n, n), dt))
    piv = _Vec(k_, k_.buffer("P", (n,), INDEX))
    b = _Mat(k_, k_.buffer("B", (n, m), dt))
    x = _Mat(k_, k_.buffer("X", (n, m), dt, output=True))
    r = _Slots(k_, "reg", dt, ("akm1k", "akm1", "ak", "denom", "acc"))
    st = _Slots(k_, "state", INDEX, ("skip",))
    one, i0, i1 = tx.const(dt, 1), tx.const(INDEX, 0), tx.const(INDEX, 1)

    def swap_rows(p: PrimExpr, q: PrimExpr) -> tir.Stmt:
        return tir.IfThenElse(tx.ne(p, q), serial_loop("c", 0, m, lambda c: _swap_entries(
            x, p, c, q, c, dt)))

    def eliminate(lo: PrimExpr, col: PrimExpr) -> tir.Stmt:  # rows >= lo -= L[:, col] x[col]
        return serial_loop("i", lo, n, lambda i: serial_loop("c", 0, m, lambda c: x.set(
            i, c, x(i, c) - ld(i, col) * x(col, c))))

    def gather(row: PrimExpr, col: PrimExpr, lo: PrimExpr) -> tir.Stmt:
        """``x[row] -= L[lo:, col]ᵀ x[lo:]``."""
        return serial_loop("c", 0, m, lambda c: tir.seq(
            _sum_into(r, "acc", lo, n, lambda i: ld(i, col) * x(i, c), dt),
            x.set(row, c, x(row, c) - r["acc"])))

    def forward(k: PrimExpr) -> tir.Stmt:  # L D y = P b
        p = piv(k)
        d = tir.Var("d", dt)
        single = tir.seq(swap_rows(k, p), eliminate(k + 1, k), tir.LetStmt(
            d, one / ld(k, k), serial_loop("c", 0, m, lambda c: x.set(k, c, x(k, c) * d))))
        akm1k, akm1, ak, denom = r["akm1k"], r["akm1"], r["ak"], r["denom"]

        def solve2(c: PrimExpr) -> tir.Stmt:
            bkm1, bk = tir.Var("bkm1", dt), tir.Var("bk", dt)
            return tir.LetStmt(bkm1, x(k, c) / akm1k, tir.LetStmt(
                bk, x(k + 1, c) / akm1k, tir.seq(x.set(k, c, (ak * bkm1 - bk) / denom),
                                                 x.set(k + 1, c, (akm1 * bk - bkm1) / denom))))

        double = tir.seq(
            swap_rows(k + 1, i0 - p - 1), eliminate(k + 2, k), eliminate(k + 2, k + 1),
            r.set("akm1k", ld(k + 1, k)), r.set("akm1", ld(k, k) / akm1k),
            r.set("ak", ld(k + 1, k + 1) / akm1k), r.set("denom", akm1 * ak - one),
            serial_loop("c", 0, m, solve2), st.set("skip", i1))
        return tir.IfThenElse(tx.ge(p, i0), single, double)

    def backward(k: PrimExpr) -> tir.Stmt:  # Lᵀ Pᵀ x = y
        p = piv(k)
        single = tir.seq(gather(k, k, k + 1), swap_rows(k, p))
        double = tir.seq(gather(k, k, k + 1), gather(k - 1, k - 1, k + 1), swap_rows(k, i0 - p - 1),
                         st.set("skip", i1))
        return tir.IfThenElse(tx.ge(p, i0), single, double)

    copy = serial_loop("ci", 0, n, lambda i: serial_loop("cj", 0, m, lambda j: x.set(
        i, j, b(i, j))))
    return k_.func(tir.seq(copy, _skipping(st, n, False, forward),
                           _skipping(st, n, True, backward)))


# ---- ops --------------------------------------------------------------------------------------
def _static(shape: Any, op_name: str) -> tuple[int, int]:
    m, n = const_int(shape[-2]), const_int(shape[-1])
    if m is None or n is None:
        raise StructInfoError(f"{op_name}: needs matrices of static size, got shape "
                              f"{tuple(shape)}")
    return m, n


def _geqrf_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "geqrf", "a", square=False)
    shape = arg_shape(a)
    if shape is None:
        ndim = arg_ndim(a)
        return TupleStructInfo((tensor_sinfo(None, a.dtype, ndim=ndim),
                                tensor_sinfo(None, a.dtype, ndim=ndim - 1 if ndim > 0 else -1)))
    return TupleStructInfo((tensor_sinfo(shape, a.dtype),
                            tensor_sinfo((*shape[:-2], matrix_steps(*shape[-2:])), a.dtype)))


def _geqrf_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    return emit_kernel(bb, call, geqrf_prim_func(dims[:-2], dims[-2], dims[-1],
                                                 call.args[0].struct_info.dtype))


geqrf = register_op(
    "geqrf", inputs=("a",), infer=_geqrf_infer, pattern=OpPattern.OPAQUE,
    legalize=_geqrf_legalize, mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="``(qr, tau)``: Householder QR in LAPACK's packed form (see kiln.op.decompose).")


@dataclass(frozen=True)
class OrmqrAttrs:
    """``left``: ``Q c`` (else ``c Q``); ``transpose``: with ``Qᵀ`` instead of ``Q``."""

    left: bool = True
    transpose: bool = False

    def __post_init__(self):
        for name in ("left", "transpose"):
            if not isinstance(getattr(self, name), bool):
                raise KilnError(f"ormqr: {name} must be a bool, got {getattr(self, name)!r}")


def _ormqr_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "ormqr", "a", square=False)
    tau = call.args[1].struct_info
    c = matrix_arg(call, 2, "ormqr", "c", square=False)
    for what, x in (("tau", tau), ("c", c)):
        if as_dtype(x.dtype) != as_dtype(a.dtype):
            raise StructInfoError(f"ormqr: a is {a.dtype} but {what} is {x.dtype}")
    sa, st, sc = arg_shape(a), arg_shape(tau), arg_shape(c)
    if sa is not None and st is not None and sc is not None:
        side = sc[-2] if call.attrs.left else sc[-1]
        ok = (len(sa) == len(sc) == len(st) + 1
              and all(dims_equal(x, y) for x, y in zip(sa[:-2], sc[:-2]))
              and all(dims_equal(x, y) for x, y in zip(sa[:-2], st[:-1]))
              and dims_equal(sa[-2], side))
        kt, ka, ra = const_int(st[-1]), const_int(sa[-1]), const_int(sa[-2])
        if not ok or (kt is not None and ka is not None and ra is not None
                      and kt > min(ka, ra)):
            raise StructInfoError(
                f"ormqr: reflectors a {tuple(sa)} and tau {tuple(st)} do not fit c {tuple(sc)} "
                f"(same batch axes, a's rows = c's {'rows' if call.attrs.left else 'columns'}, "
                "len(tau) <= a's columns and rows)")
    return tensor_sinfo(sc, c.dtype, ndim=arg_ndim(c))


def _ormqr_legalize(bb: Any, call: Any) -> Any:
    shape_a, shape_t, shape_c = (operand_dims(call, i) for i in range(3))
    dims = kernel_dims([*shape_c, *shape_a[-2:], shape_t[-1]])
    batch, (m, n, rows, cols, refl) = dims[:len(shape_c) - 2], dims[len(shape_c) - 2:]
    return emit_kernel(bb, call, ormqr_prim_func(
        batch, rows, cols, refl, m, n, call.args[0].struct_info.dtype, call.attrs.left,
        call.attrs.transpose))


ormqr = register_op(
    "ormqr", inputs=("a", "tau", "c"), attrs=OrmqrAttrs, infer=_ormqr_infer,
    pattern=OpPattern.OPAQUE, legalize=_ormqr_legalize, mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="``c`` times the orthogonal ``Q`` of Householder reflectors (see kiln.op.decompose).")


@dataclass(frozen=True)
class EighAttrs:
    """``upper``: the symmetric matrix is read from the upper triangle (else the lower)."""

    upper: bool = False

    def __post_init__(self):
        if not isinstance(self.upper, bool):
            raise KilnError(f"eigh: upper must be a bool, got {self.upper!r}")


def _eigh_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "eigh", "a", square=True)
    shape = arg_shape(a)
    if shape is None:
        ndim = arg_ndim(a)
        return TupleStructInfo((tensor_sinfo(None, a.dtype, ndim=ndim - 1 if ndim > 0 else -1),
                                tensor_sinfo(None, a.dtype, ndim=ndim)))
    return TupleStructInfo((tensor_sinfo(shape[:-1], a.dtype), tensor_sinfo(shape, a.dtype)))


def _eigh_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    return emit_kernel(bb, call, eigh_prim_func(dims[:-2], dims[-1],
                                                call.args[0].struct_info.dtype,
                                                call.attrs.upper))


eigh = register_op(
    "eigh", inputs=("a",), attrs=EighAttrs, infer=_eigh_infer, pattern=OpPattern.OPAQUE,
    legalize=_eigh_legalize, mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="``(w, v)``: eigenvalues (ascending) and eigenvectors of symmetric matrices by Jacobi "
        "rotations (see kiln.op.decompose).")


@dataclass(frozen=True)
class SvdAttrs:
    """``full_matrices``: ``u`` is ``m x m`` and ``vh`` ``n x n`` (else ``m x k``, ``k x n``)."""

    full_matrices: bool = False

    def __post_init__(self):
        if not isinstance(self.full_matrices, bool):
            raise KilnError(f"svd: full_matrices must be a bool, got {self.full_matrices!r}")


def _svd_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "svd", "a", square=False)
    shape = arg_shape(a)
    if shape is None:
        raise StructInfoError("svd: needs matrices of static size, got an unknown shape")
    m, n = _static(shape, "svd")
    batch, k = tuple(shape[:-2]), min(m, n)
    full = call.attrs.full_matrices
    return TupleStructInfo((tensor_sinfo((*batch, m, m if full else k), a.dtype),
                            tensor_sinfo((*batch, k), a.dtype),
                            tensor_sinfo((*batch, n if full else k, n), a.dtype)))


def _svd_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    m, n = _static(dims, "svd")
    return emit_kernel(bb, call, svd_prim_func(dims[:-2], m, n, call.args[0].struct_info.dtype,
                                               call.attrs.full_matrices))


svd = register_op(
    "svd", inputs=("a",), attrs=SvdAttrs, infer=_svd_infer, pattern=OpPattern.OPAQUE,
    legalize=_svd_legalize, mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="``(u, s, vh)``: the singular value decomposition, singular values descending, by "
        "one-sided Jacobi rotations (see kiln.op.decompose).")


def _matrix_exp_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "matrix_exp", "a", square=True)
    return tensor_sinfo(arg_shape(a), a.dtype, ndim=arg_ndim(a))


def _matrix_exp_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    return emit_kernel(bb, call, matrix_exp_prim_func(dims[:-2], dims[-1],
                                                      call.args[0].struct_info.dtype))


matrix_exp = register_op(
    "matrix_exp", inputs=("a",), infer=_matrix_exp_infer, pattern=OpPattern.OPAQUE,
    legalize=_matrix_exp_legalize, mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="The matrix exponential by scaling and squaring (see kiln.op.decompose).")



def _ldl_factor_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "ldl_factor", "a", square=True)
    shape = arg_shape(a)
    if shape is None:
        ndim = arg_ndim(a)
        return TupleStructInfo((tensor_sinfo(None, a.dtype, ndim=ndim),
                                tensor_sinfo(None, INDEX, ndim=ndim - 1 if ndim > 0 else -1),
                                tensor_sinfo(None, INDEX, ndim=ndim - 2 if ndim > 0 else -1)))
    return TupleStructInfo((tensor_sinfo(shape, a.dtype), tensor_sinfo(shape[:-1], INDEX),
                            tensor_sinfo(shape[:-2], INDEX)))


def _ldl_factor_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    return emit_kernel(bb, call, ldl_factor_prim_func(dims[:-2], dims[-1],
                                                      call.args[0].struct_info.dtype))


ldl_factor = register_op(
    "ldl_factor", inputs=("a",), infer=_ldl_factor_infer, pattern=OpPattern.OPAQUE,
    legalize=_ldl_factor_legalize, mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="``(ld, pivots, info)``: the Bunch-Kaufman LDLᵀ factorization of symmetric matrices "
        "(see kiln.op.decompose).")


ldl_solve = register_pivoted_solve("ldl_solve", "ld", "ldl_factor", ldl_solve_prim_func,
                                   "kiln.op.decompose")
