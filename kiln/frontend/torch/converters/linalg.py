"""Matrix factorizations and solves (``torch.linalg``): inv, solve, det, slogdet, LU,
Cholesky, triangular solves, from kiln's ``lu_factor``, ``lu_solve``, ``cholesky`` and
``triangular_solve`` kernels (``kiln.op.matrix``); QR (``geqrf``, ``linalg_qr``, ``ormqr``,
``householder_product``), eigh, SVD, pinv (torch's atol/rtol rules), LDL and matrix_exp from
``kiln.op.decompose`` (svdvals, matrix_rank and the nuclear norm are torch's decompositions
into ``_linalg_svd``/``_linalg_eigh``).

``torch.linalg.inv``/``solve``/``cholesky``/``lu_factor`` (not the ``*_ex`` forms) raise for a
singular or indefinite matrix: the exported program checks ``info`` in a ``with_effects`` node
(``aten._linalg_check_errors``), which becomes a ``check_info`` on the values computed with that
``info`` (a RuntimeCheckError naming the function when it is not 0).

torch's conventions kept: LU pivots are int32 and 1-based (LAPACK's), ``info`` outputs are
int32 (0, or the 1-based index of the first zero pivot / the first column where Cholesky
fails), ``linalg.lu`` returns ``P, L, U`` with ``A = P L U``. Errors are not raised for
singular or indefinite matrices (the ``*_ex`` forms the decompositions produce report them in
``info``; their values are then inf/NaN, as LAPACK's). The matrices' order must be static.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .... import graph as g
from .... import op
from ....op.matrix import determinant, matrix_diagonal, pivot_sign
from ..importer import EFFECT_TOKEN, overload_name
from ..registry import converter
from .common import dtype_of, ndim_of, scalar, shape_of, static_int


def _order(node: Any, a: Any) -> int:
    n = static_int(shape_of(a)[-1])
    if n is None or ndim_of(a) < 2 or static_int(shape_of(a)[-2]) != n:
        raise node.error(f"needs square matrices of static order, got shape {shape_of(a)}")
    return n


def _mT(x: Any) -> Any:
    """The matrices of ``x`` transposed (its last two axes swapped)."""
    nd = ndim_of(x)
    return op.transpose(x, axes=(*range(nd - 2), nd - 1, nd - 2))


def _first_bad(bad: Any) -> Any:
    """int32 ``info``: 1 + the index of the first true entry along the last axis, else 0."""
    flags = op.cast(bad, "int32")
    first = op.add(op.cast(op.argmax(flags, axis=-1), "int32"), scalar(1, "int32"))
    return op.where(op.greater(op.max(flags, axis=(-1,)), scalar(0, "int32")), first,
                    scalar(0, "int32"))


def _lu(ctx: Any, a: Any) -> tuple[Any, Any]:
    out = ctx.emit(op.lu_factor(a))
    return g.TupleGetItem(out, 0), ctx.emit(g.TupleGetItem(out, 1))


def _torch_pivots(piv: Any) -> Any:
    return op.cast(op.add(piv, scalar(1, "int64")), "int32")


def _kiln_pivots(piv: Any) -> Any:
    return op.subtract(op.cast(piv, "int64"), scalar(1, "int64"))


def _broadcast_batch(node: Any, a: Any, b: Any) -> tuple[Any, Any]:
    """``a`` ([..., n, n]) and ``b`` ([..., n, k]) with their batch axes broadcast."""
    sa, sb = shape_of(a), shape_of(b)
    batch_a, batch_b = [static_int(d) for d in sa[:-2]], [static_int(d) for d in sb[:-2]]
    if None in batch_a or None in batch_b:
        if len(sa) == len(sb):
            return a, b
        raise node.error("needs static batch sizes to broadcast the operands")
    batch = tuple(np.broadcast_shapes(tuple(batch_a), tuple(batch_b)))
    if tuple(batch_a) != batch:
        a = op.broadcast_to(a, (*batch, *sa[-2:]))
    if tuple(batch_b) != batch:
        b = op.broadcast_to(b, (*batch, *sb[-2:]))
    return a, b


def _solve(ctx: Any, node: Any, a: Any, b: Any, left: bool) -> tuple[Any, Any, Any]:
    """``(x, lu, pivots)`` with ``a x = b`` (``x a = b`` when not ``left``); ``b`` a batch of
    vectors when its rank is one less than ``a``'s."""
    _order(node, a)
    vector = ndim_of(b) == ndim_of(a) - 1
    if vector:
        b = op.expand_dims(b, -1 if left else -2)
    if not left:
        a, b = _mT(a), _mT(b)
    a, b = _broadcast_batch(node, a, b)
    lu, piv = _lu(ctx, a)
    x = op.lu_solve(lu, piv, b)
    if not left:
        x = _mT(x)
    if vector:
        x = op.squeeze(x, axis=(-1 if left else -2,))
    return x, lu, piv


def _rectangle(node: Any, a: Any) -> tuple[int, int]:
    m, n = (static_int(d) for d in shape_of(a)[-2:]) if ndim_of(a) >= 2 else (None, None)
    if m is None or n is None:
        raise node.error(f"needs matrices of static size, got shape {shape_of(a)}")
    return m, n


def _lu_diagonal(ctx: Any, lu_: Any, m: int, n: int) -> Any:
    """The diagonal of ``U`` (``min(m, n)`` entries) of an ``m x n`` LU factorization."""
    k = min(m, n)
    square = lu_ if m == n else ctx.emit(op.strided_slice(lu_, (0, 0), (k, k), axes=(-2, -1)))
    return matrix_diagonal(square, k)


def _pivoted_lu(ctx: Any, node: Any) -> tuple[Any, int, int, Any, Any]:
    """``(a, m, n, lu, pivots)`` of an LU node's ``m x n`` input (pivoting is required)."""
    a = node.arg(0)
    if not node.arg("pivot", True):
        raise node.error("LU without pivoting is not supported")
    m, n = _rectangle(node, a)
    lu_, piv = _lu(ctx, a)
    return a, m, n, ctx.emit(lu_), piv


@converter("aten.linalg_lu_factor_ex.default")
def lu_factor_ex(ctx: Any, node: Any) -> Any:
    a, m, n, lu_, piv = _pivoted_lu(ctx, node)
    info = _first_bad(op.equal(_lu_diagonal(ctx, lu_, m, n), scalar(0, dtype_of(a))))
    return [lu_, _torch_pivots(piv), info]


@converter("aten.linalg_lu.default")
def lu(ctx: Any, node: Any) -> Any:
    _, m, n, lu_, piv = _pivoted_lu(ctx, node)
    return _unpack(lu_, piv, m, n)


@converter("aten.lu_unpack.default")
def lu_unpack(ctx: Any, node: Any) -> Any:
    lu_ = node.arg(0)
    m, n = _rectangle(node, lu_)
    return _unpack(lu_, _kiln_pivots(node.arg(1)), m, n)


def _unpack(lu_: Any, piv: Any, m: int, n: int) -> list[Any]:
    """``[P, L, U]`` of an ``m x n`` LU factorization (0-based pivots), ``A = P L U``."""
    k = min(m, n)
    dt = dtype_of(lu_)
    batch = shape_of(lu_)[:-2]
    if k < m:  # the rows below the last step are not swapped
        rest = op.broadcast_to(g.const(np.arange(k, m, dtype=np.int64)), (*batch, m - k))
        piv = op.concat([piv, rest], axis=-1)
    # P^T = the row swaps applied to I (lu_solve with L = U = I): P = (P^T)^T
    eye = op.broadcast_to(g.const(np.eye(m, dtype=dt)), (*batch, m, m))
    p = _mT(op.lu_solve(eye, piv, eye))
    lower = lu_ if k == n else op.strided_slice(lu_, (0,), (k,), axes=(-1,))
    upper = lu_ if k == m else op.strided_slice(lu_, (0,), (k,), axes=(-2,))
    keep_l = np.tril(np.ones((m, k), bool), -1)
    keep_u = np.triu(np.ones((k, n), bool))
    zero = scalar(0, dt)
    return [p, op.add(op.where(g.const(keep_l), lower, zero), g.const(np.eye(m, k, dtype=dt))),
            op.where(g.const(keep_u), upper, zero)]


@converter("aten.linalg_lu_solve.default")
def lu_solve(ctx: Any, node: Any) -> Any:
    lu_, piv, b = node.arg(0), _kiln_pivots(node.arg(1)), node.arg(2)
    n = _order(node, lu_)
    left, adjoint = node.arg("left", True), node.arg("adjoint", False)
    if left and not adjoint:
        lu_, b = _broadcast_batch(node, lu_, b)
        return op.lu_solve(lu_, piv, b)
    # A^T x = b with A = P L U: x = P^-T ... solved as U^T y = b, L^T z = y, x = P z
    if not left:  # x A = b  <=>  A^T x^T = b^T  (and x A^H = b <=> A x^T = b^T)
        b, adjoint = _mT(b), not adjoint
    if not adjoint:
        lu_, b = _broadcast_batch(node, lu_, b)
        x = op.lu_solve(lu_, piv, b)
    else:
        lu_, b = _broadcast_batch(node, lu_, b)
        y = op.triangular_solve(_mT(lu_), b, upper=False)
        z = op.triangular_solve(_mT(lu_), y, upper=True, unit_diagonal=True)
        # x = P z: undo the swaps in reverse order = P applied to z
        dt = dtype_of(b)
        eye = op.broadcast_to(g.const(np.eye(n, dtype=dt)), shape_of(lu_))
        x = op.matmul(_mT(op.lu_solve(eye, piv, eye)), z)
    return _mT(x) if not left else x


@converter("aten.linalg_inv_ex.default")
def inv_ex(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    n = _order(node, a)
    lu_, piv = _lu(ctx, a)
    lu_ = ctx.emit(lu_)
    eye = op.broadcast_to(g.const(np.eye(n, dtype=dtype_of(a))), shape_of(a))
    info = _first_bad(op.equal(matrix_diagonal(lu_, n), scalar(0, dtype_of(a))))
    return [op.lu_solve(lu_, piv, eye), info]


@converter("aten._linalg_solve_ex.default")
def solve_ex(ctx: Any, node: Any) -> Any:
    a, b = node.arg(0), node.arg(1)
    n = _order(node, a)
    left = node.arg("left", True)
    x, lu_, piv = _solve(ctx, node, a, b, left)
    lu_ = ctx.emit(lu_)
    info = _first_bad(op.equal(matrix_diagonal(lu_, n), scalar(0, dtype_of(a))))
    if not left and (node.output_used(1) or node.output_used(2)):
        raise node.error("the LU factors of a right-side solve are not supported")
    return [x, lu_, _torch_pivots(piv), info]


@converter("aten._linalg_det.default")
def det(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    n = _order(node, a)
    dt = dtype_of(a)
    if n == 0:
        ones = op.broadcast_to(scalar(1, dt), shape_of(a)[:-2])
        return [ones, a, op.broadcast_to(scalar(0, "int32"), shape_of(a)[:-1])]
    if node.output_used(1) or node.output_used(2):
        lu_, piv = _lu(ctx, a)
        lu_ = ctx.emit(lu_)
        value = op.multiply(op.prod(matrix_diagonal(lu_, n), axis=(-1,)),
                            pivot_sign(piv, n, dt))
        return [value, lu_, _torch_pivots(piv)]
    value = determinant(ctx.emit, a, n)
    return [value, value, value]  # the factors are not used


@converter("aten._linalg_slogdet.default")
def slogdet(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    n = _order(node, a)
    dt = dtype_of(a)
    if n == 0:
        batch = shape_of(a)[:-2]
        return [op.broadcast_to(scalar(1, dt), batch), op.broadcast_to(scalar(0, dt), batch),
                a, op.broadcast_to(scalar(0, "int32"), shape_of(a)[:-1])]
    lu_, piv = _lu(ctx, a)
    lu_ = ctx.emit(lu_)
    diag = ctx.emit(matrix_diagonal(lu_, n))
    zero = scalar(0, dt)
    signs = op.where(op.greater(diag, zero), scalar(1, dt),
                     op.where(op.less(diag, zero), scalar(-1, dt), zero))
    sign = op.multiply(op.prod(signs, axis=(-1,)), pivot_sign(piv, n, dt))
    logabs = op.sum(op.log(op.abs(diag)), axis=(-1,))
    return [sign, logabs, lu_, _torch_pivots(piv)]


@converter("aten.linalg_cholesky_ex.default")
def cholesky_ex(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    n = _order(node, a)
    upper = bool(node.arg("upper", False))
    factor = ctx.emit(op.cholesky(a, upper=upper))
    diag = matrix_diagonal(factor, n)
    # a failed column has a NaN (or zero) pivot: info = its 1-based index
    info = _first_bad(op.logical_not(op.greater(diag, scalar(0, dtype_of(a)))))
    return [factor, info]


@converter("aten.cholesky.default")
def cholesky(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    _order(node, a)
    return op.cholesky(a, upper=bool(node.arg("upper", False)))


@converter("aten.cholesky_solve.default")
def cholesky_solve(ctx: Any, node: Any) -> Any:
    b, factor = node.arg(0), node.arg(1)
    upper = bool(node.arg("upper", False))
    _order(node, factor)
    factor, b = _broadcast_batch(node, factor, b)
    lower = _mT(factor) if upper else factor  # a = L L^T
    y = op.triangular_solve(lower, b, upper=False)
    return op.triangular_solve(_mT(lower), y, upper=True)


@converter("aten.cholesky_inverse.default")
def cholesky_inverse(ctx: Any, node: Any) -> Any:
    factor = node.arg(0)
    n = _order(node, factor)
    upper = bool(node.arg("upper", False))
    lower = ctx.emit(_mT(factor) if upper else factor)
    eye = op.broadcast_to(g.const(np.eye(n, dtype=dtype_of(factor))), shape_of(factor))
    y = op.triangular_solve(lower, eye, upper=False)
    return op.triangular_solve(_mT(lower), y, upper=True)


@converter("aten.linalg_solve_triangular.default")
def solve_triangular(ctx: Any, node: Any) -> Any:
    a, b = node.arg(0), node.arg(1)
    _order(node, a)
    upper = bool(node.arg("upper"))
    left, unit = node.arg("left", True), bool(node.arg("unitriangular", False))
    if not left:  # x A = b  <=>  A^T x^T = b^T, A^T triangular the other way
        a, b, upper = _mT(a), _mT(b), not upper
    a, b = _broadcast_batch(node, a, b)
    x = op.triangular_solve(a, b, upper=upper, unit_diagonal=unit)
    return x if left else _mT(x)


@converter("aten.triangular_solve.default")
def triangular_solve(ctx: Any, node: Any) -> Any:
    b, a = node.arg(0), node.arg(1)
    _order(node, a)
    upper = bool(node.arg("upper", True))
    transpose, unit = bool(node.arg("transpose", False)), bool(node.arg("unitriangular", False))
    if transpose:
        a, upper = _mT(a), not upper
    a, b = _broadcast_batch(node, a, b)
    return [op.triangular_solve(a, b, upper=upper, unit_diagonal=unit), node.arg(1)]


@converter("torch.ops.higher_order.with_effects")
def with_effects(ctx: Any, node: Any) -> Any:
    """A side effect ordered by an effect token. The one exported programs carry is torch's
    error check of a factorization's ``info`` (``aten._linalg_check_errors``): it becomes a
    ``check_info`` on each value computed with that ``info`` (the other results of the same
    node), so the check runs before those values are used and is never dead code."""
    effect = node.raw(1)
    if overload_name(effect) != "aten._linalg_check_errors.default":
        raise node.error(f"the side-effecting operator {overload_name(effect)} is not "
                         "supported")
    info_node, api = node.raw(2), node.raw(3)
    info = ctx.values.get(info_node)
    producer = info_node.args[0] if getattr(info_node, "target", None) is operator.getitem \
        else None
    guarded = [u for u in (producer.users if producer is not None else ())
               if u is not info_node and u.target is operator.getitem
               and isinstance(ctx.values.get(u), g.Expr)]
    if not guarded or not isinstance(info, g.Expr):
        raise node.error(f"the error check of {api} guards no value kiln computes")
    what = (f"torch.{api}: the input is singular or not positive definite (info, the 1-based "
            "index of the first zero pivot or failing column")
    for value_node in guarded:
        if any(user in ctx.values for user in value_node.users):
            raise node.error(f"the error check of {api} comes after a use of its result")
        ctx.values[value_node] = ctx.emit(op.check_info(ctx.values[value_node], info,
                                                        what=what + ", must be 0)"))
    return [EFFECT_TOKEN, None]  # the new token, and the check's own result (None)


# ---- decompositions (kiln.op.decompose) ---------------------------------------------------------
def _zeros(shape: Any, dtype: str) -> Any:
    """Zeros of ``shape`` (the result of a decomposition of empty matrices)."""
    return op.broadcast_to(scalar(0, dtype), tuple(shape))


def _eye(batch: Any, rows: int, cols: int, dtype: str) -> Any:
    return op.broadcast_to(g.const(np.eye(rows, cols, dtype=dtype)), (*batch, rows, cols))


def _items(ctx: Any, call: Any, count: int) -> list[Any]:
    out = ctx.emit(call)
    return [ctx.emit(g.TupleGetItem(out, i)) for i in range(count)]


def _nothing(dtype: str) -> Any:
    """The empty tensor torch returns for a result not asked for (``compute_uv=False``...)."""
    return g.const(np.zeros((0,), dtype=dtype))


def _triu(x: Any, rows: int, cols: int) -> Any:
    keep = g.const(np.triu(np.ones((rows, cols), bool)))
    return op.where(keep, x, scalar(0, dtype_of(x)))


@converter("aten.geqrf.default")
def geqrf(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    m, n = _rectangle(node, a)
    if m * n == 0:
        return [a, _zeros((*shape_of(a)[:-2], min(m, n)), dtype_of(a))]
    return _items(ctx, op.geqrf(a), 2)


@converter("aten.linalg_householder_product.default")
def householder_product(ctx: Any, node: Any) -> Any:
    """``Q``'s first ``n`` columns (LAPACK's orgqr): the reflectors applied to ``eye(m, n)``."""
    a, tau = node.arg(0), node.arg(1)
    m, n = _rectangle(node, a)
    if m * n == 0 or static_int(shape_of(tau)[-1]) == 0:
        return _eye(shape_of(a)[:-2], m, n, dtype_of(a))
    return op.ormqr(a, tau, _eye(shape_of(a)[:-2], m, n, dtype_of(a)))


@converter("aten.ormqr.default")
def ormqr(ctx: Any, node: Any) -> Any:
    a, tau, c = node.arg(0), node.arg(1), node.arg(2)
    _rectangle(node, c)
    if static_int(shape_of(tau)[-1]) == 0 or 0 in (static_int(d) for d in shape_of(c)):
        return c
    return op.ormqr(a, tau, c, left=bool(node.arg("left", True)),
                    transpose=bool(node.arg("transpose", False)))


@converter("aten.linalg_qr.default")
def qr(ctx: Any, node: Any) -> Any:
    """``Q, R`` from ``geqrf``: ``R`` its upper triangle, ``Q`` its reflectors applied to the
    identity's first ``k`` (``complete``: all ``m``) columns; ``mode='r'`` gives no ``Q``."""
    a = node.arg(0)
    mode = node.arg("mode", "reduced")
    if mode not in ("reduced", "complete", "r"):
        raise node.error(f"unknown mode {mode!r}")
    m, n = _rectangle(node, a)
    k, dt, batch = min(m, n), dtype_of(a), shape_of(a)[:-2]
    q_cols = m if mode == "complete" else k
    r_rows = m if mode == "complete" else k
    if k == 0:
        q = _nothing(dt) if mode == "r" else _eye(batch, m, q_cols, dt)
        return [q, _zeros((*batch, r_rows, n), dt)]
    packed, tau = _items(ctx, op.geqrf(a), 2)
    rows = packed if r_rows == m else op.strided_slice(packed, (0,), (k,), axes=(-2,))
    r = _triu(rows, r_rows, n)
    if mode == "r":
        return [_nothing(dt), r]
    reflectors = packed if k == n else op.strided_slice(packed, (0,), (k,), axes=(-1,))
    return [op.ormqr(reflectors, tau, _eye(batch, m, q_cols, dt)), r]


@converter("aten._linalg_eigh.default")
def eigh(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    n = _order(node, a)
    uplo = node.arg("UPLO", "L")
    if uplo not in ("L", "U"):
        raise node.error(f"UPLO must be 'L' or 'U', got {uplo!r}")
    dt = dtype_of(a)
    compute_v = bool(node.arg("compute_v", True))
    if n == 0:
        return [_zeros(shape_of(a)[:-1], dt), a if compute_v else _nothing(dt)]
    w, v = _items(ctx, op.eigh(a, upper=uplo == "U"), 2)
    return [w, v if compute_v else _nothing(dt)]


@converter("aten._linalg_svd.default")
def svd(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    m, n = _rectangle(node, a)
    full = bool(node.arg("full_matrices", False))
    compute_uv = bool(node.arg("compute_uv", True))
    k, dt, batch = min(m, n), dtype_of(a), shape_of(a)[:-2]
    if k == 0:
        u, s = _eye(batch, m, m if full else k, dt), _zeros((*batch, 0), dt)
        vh = _eye(batch, n if full else k, n, dt)
    else:
        u, s, vh = _items(ctx, op.svd(a, full_matrices=full and compute_uv), 3)
    if not compute_uv:
        return [_nothing(dt), s, _nothing(dt)]
    return [u, s, vh]


def _tolerances(node: Any, a: Any, m: int, n: int) -> tuple[Any, Any]:
    """torch's ``(atol, rtol)`` of pinv/matrix_rank, in ``a``'s dtype, each with a trailing
    axis: ``atol`` 0 unless given; ``rtol`` given, else ``eps * max(m, n)`` -- or 0 where a
    given ``atol`` is positive."""
    dt = dtype_of(a)
    default = scalar(float(np.finfo(dt).eps) * max(m, n), dt)
    zero = scalar(0, dt)
    atol = op.cast(node.arg("atol"), dt) if node.has("atol") else None
    if node.has("rtol"):
        rtol = op.cast(node.arg("rtol"), dt)
    elif atol is not None:
        rtol = op.where(op.greater(atol, zero), zero, default)
    else:
        rtol = default
    atol = zero if atol is None else atol
    return op.expand_dims(atol, -1), op.expand_dims(rtol, -1)


@converter("aten.linalg_pinv.atol_rtol_tensor")
def pinv(ctx: Any, node: Any) -> Any:
    """The pseudoinverse ``V diag(1/s) Uᵀ`` of the SVD (of ``eigh`` for ``hermitian``), the
    values not above ``max(atol, rtol * largest)`` dropped, as torch."""
    a = node.arg(0)
    m, n = _rectangle(node, a)
    dt, batch = dtype_of(a), shape_of(a)[:-2]
    if m * n == 0:
        return _zeros((*batch, n, m), dt)
    atol, rtol = _tolerances(node, a, m, n)
    zero = scalar(0, dt)
    if node.arg("hermitian", False):
        if m != n:
            raise node.error(f"hermitian needs square matrices, got shape {shape_of(a)}")
        w, v = _items(ctx, op.eigh(a), 2)
        size = ctx.emit(op.abs(w))
        tol = op.maximum(atol, op.multiply(rtol, op.max(size, axis=(-1,), keepdims=True)))
        inv = op.where(op.greater(size, tol), op.divide(scalar(1, dt), w), zero)
        return op.matmul(op.multiply(v, op.expand_dims(inv, -2)), _mT(v))
    u, s, vh = _items(ctx, op.svd(a), 3)
    largest = op.strided_slice(s, (0,), (1,), axes=(-1,))
    tol = op.maximum(atol, op.multiply(rtol, largest))
    inv = op.where(op.greater(s, tol), op.divide(scalar(1, dt), s), zero)
    return op.matmul(op.multiply(_mT(vh), op.expand_dims(inv, -2)), _mT(u))


@converter("aten.linalg_matrix_exp.default")
def matrix_exp(ctx: Any, node: Any) -> Any:
    a = node.arg(0)
    n = _order(node, a)
    return a if n == 0 else op.matrix_exp(a)


@converter("aten.linalg_ldl_factor_ex.default")
def ldl_factor_ex(ctx: Any, node: Any) -> Any:
    """Bunch-Kaufman ``LD, pivots, info`` as LAPACK's sytrf (lower): ``LD``'s upper triangle
    zero, pivots 1-based, negative for the two rows of a 2x2 block; ``info`` the first zero
    column (1-based) or 0. Real matrices: ``hermitian`` changes nothing."""
    a = node.arg(0)
    n = _order(node, a)
    batch = shape_of(a)[:-2]
    if n == 0:
        return [a, _zeros((*batch, 0), "int32"), _zeros(batch, "int32")]
    ld, piv, info = _items(ctx, op.ldl_factor(a), 3)
    lapack = op.where(op.greater_equal(piv, scalar(0, "int64")),
                      op.add(piv, scalar(1, "int64")), piv)
    return [ld, op.cast(lapack, "int32"), op.cast(info, "int32")]


@converter("aten.linalg_ldl_solve.default")
def ldl_solve(ctx: Any, node: Any) -> Any:
    ld, piv, b = node.arg(0), op.cast(node.arg(1), "int64"), node.arg(2)
    n = _order(node, ld)
    if n == 0 or 0 in (static_int(d) for d in shape_of(b)):
        return b
    kiln_piv = op.where(op.greater(piv, scalar(0, "int64")),
                        op.subtract(piv, scalar(1, "int64")), piv)
    wide, b = _broadcast_batch(node, ld, b)
    if shape_of(wide) != shape_of(ld):
        kiln_piv = op.broadcast_to(kiln_piv, shape_of(wide)[:-1])
    return op.ldl_solve(wide, kiln_piv, b)
