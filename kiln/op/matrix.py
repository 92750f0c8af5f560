"""Dense matrix factorizations and solves: ``lu_factor``, ``lu_solve``, ``cholesky``,
``triangular_solve``, over the trailing two axes of batched matrices.

What frameworks build on them (the torch frontend: ``linalg.inv``/``solve``/``det``/
``slogdet``/``lu``/``cholesky``/``solve_triangular``...; ONNX ``Det`` of any size) is graph
code around these four kernels, e.g. ``inv(a) = lu_solve(lu_factor(a), I)`` and ``det(a)`` is
the product of LU's diagonal times the sign of its row swaps.

- ``lu_factor(a) -> (lu, pivots)``: ``P a = L U`` by Gaussian elimination with partial
  pivoting (LAPACK's getf2) of ``m x n`` matrices: ``lu`` holds ``U`` on and above the
  diagonal and ``L`` (unit diagonal, not stored) below it; ``pivots[k]`` (int64, 0-based,
  ``min(m, n)`` of them) is the row swapped with row ``k`` at step ``k``. A zero pivot leaves
  its column unscaled (the factorization of a singular matrix, whose ``U`` has a zero on the
  diagonal; solves with it give inf/NaN).
- ``lu_solve(lu, pivots, b) -> x`` solves ``a x = b`` for ``b`` of shape ``[..., n, k]``.
- ``cholesky(a, upper=False) -> l`` with ``a = l lᵀ`` (``uᵀ u`` for ``upper``); only the
  lower (upper) triangle of ``a`` is read. A matrix that is not positive definite gives NaN
  from the first failing column on (``cholesky_info`` of the frontends finds it).
- ``triangular_solve(a, b, upper, unit_diagonal=False) -> x`` solves ``a x = b`` with ``a``
  triangular (only that triangle read; ``unit_diagonal`` takes its diagonal as ones).

The batch axes of the operands must be equal (a frontend broadcasts first); floats only.

Why TIR (``legalize`` writes each PrimFunc) instead of ``te.compute``: each is a sequence of
dependent steps (step ``k`` of an elimination reads what step ``k - 1`` wrote), so one block per
matrix holds serial loops, and the blocks are spatial over the batch axes, which the schedule
fuses and runs in parallel (as ``topk`` and the scans do). They are OPAQUE (nothing fuses into
them) and have no gradient.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import te, tir
from ..graph import expr as gx
from ..graph import shape_utils
from ..graph.struct_info import TupleStructInfo
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    arg_ndim,
    arg_shape,
    as_dim,
    const_int,
    dims_equal,
    kernel_dims,
    tensor_sinfo,
)
from .elementwise import cast, equal, mod, multiply, not_equal, where
from .index import take
from .reduce import prod
from .reduce import sum as reduce_sum
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpPattern, get_op_def, register_op
from .shape import reshape

__all__ = ["check_info", "cholesky", "lu_factor", "lu_solve", "triangular_solve"]

INDEX = DataType("int64")
#: The op names whose kernels are one block per matrix (the CPU schedule lists them).
MATRIX_OPS = ("lu_factor", "lu_solve", "cholesky", "triangular_solve")


# ---- shapes -----------------------------------------------------------------------------------
def matrix_arg(call: Any, i: int, op_name: str, what: str, square: bool) -> Any:
    """The StructInfo of argument ``i``: a float tensor of rank >= 2 (square matrices when
    ``square``)."""
    x = shape_utils.tensor_sinfo(call, i)
    dtype = as_dtype(x.dtype)
    if not dtype.is_float or dtype.lanes != 1:
        raise StructInfoError(f"{op_name}: {what} must be a float tensor, got dtype {dtype}")
    ndim = arg_ndim(x)
    if 0 <= ndim < 2:
        raise StructInfoError(f"{op_name}: {what} must have rank >= 2, got rank {ndim}")
    shape = arg_shape(x)
    if square and shape is not None and not dims_equal(shape[-1], shape[-2]):
        raise StructInfoError(f"{op_name}: {what} must hold square matrices, got shape "
                              f"{tuple(shape)}")
    return x


def check_rhs(op_name: str, a: Any, b: Any) -> None:
    """``b`` ([..., n, k]) matches ``a`` ([..., n, n]): same dtype, batch axes and n."""
    if as_dtype(a.dtype) != as_dtype(b.dtype):
        raise StructInfoError(f"{op_name}: the matrices are {a.dtype} but b is {b.dtype}")
    sa, sb = arg_shape(a), arg_shape(b)
    if sa is None or sb is None:
        return
    if len(sa) != len(sb) or not all(dims_equal(x, y) for x, y in zip(sa[:-2], sb[:-2])) or \
            not dims_equal(sa[-1], sb[-2]):
        raise StructInfoError(f"{op_name}: b of shape {tuple(sb)} does not match matrices of "
                              f"shape {tuple(sa)} (same batch axes, b's rows = n)")


# ---- building the kernels ---------------------------------------------------------------------
class MatrixKernel:
    """One PrimFunc of batched matrices: buffers of shape ``batch + trailing``, one block per
    batch index whose body ``at`` addresses by trailing indices; ``scratch`` buffers are the
    block's own (one per matrix, addressed without the batch indices). Shared by the kernels of
    ``kiln.op.decompose``."""

    def __init__(self, name: str, batch: Sequence[PrimExpr]):
        self.name = name
        self.batch = tuple(batch)
        self.loop_vars = [tir.Var(f"i{d}", INDEX) for d in range(len(batch))]
        self.iter_vars = [tx.IterVar(tx.Range(tx.const(INDEX, 0), b), tir.Var(f"v{d}", INDEX),
                                     tx.IterType.DATA_PAR) for d, b in enumerate(batch)]
        self.buffers: list[tuple[tir.Var, tir.Buffer, bool]] = []
        self.scratches: list[tir.Buffer] = []

    def scratch(self, name: str, shape: Sequence[PrimExpr | int], dtype: Any) -> tir.Buffer:
        """A work buffer of one matrix's block (a stack array when small, else heap memory
        allocated once per thread)."""
        buf = tir.decl_buffer(tuple(shape), dtype, name, scope="local")
        self.scratches.append(buf)
        return buf

    def buffer(self, name: str, trailing: Sequence[PrimExpr], dtype: Any,
               output: bool = False) -> tir.Buffer:
        buf = tir.decl_buffer((*self.batch, *trailing), dtype, name)
        self.buffers.append((tir.Var(name, "handle"), buf, output))
        return buf

    def at(self, *idx: PrimExpr) -> tuple[PrimExpr, ...]:
        return (*(iv.var for iv in self.iter_vars), *idx)

    def region(self, buf: tir.Buffer) -> tir.BufferRegion:
        trailing = buf.shape[len(self.batch):]
        zero, one = tx.const(INDEX, 0), tx.const(INDEX, 1)
        return tir.BufferRegion(buf, (*(tx.Range(iv.var, one) for iv in self.iter_vars),
                                      *(tx.Range(zero, d) for d in trailing)))

    def func(self, body: tir.Stmt) -> tir.PrimFunc:
        reads = tuple(self.region(b) for _, b, _ in self.buffers)
        writes = tuple(self.region(b) for _, b, out in self.buffers if out)
        block = tir.Block(tuple(self.iter_vars), reads, writes, self.name, body,
                          alloc_buffers=tuple(self.scratches))
        stmt: tir.Stmt = tir.BlockRealize(tuple(self.loop_vars), tir.true_predicate(), block)
        for lv, iv in reversed(list(zip(self.loop_vars, self.iter_vars))):
            stmt = tir.For(lv, iv.dom.min, iv.dom.extent, tir.ForKind.SERIAL, stmt)
        root = tir.Block((), (), (), "root", stmt)
        params = tuple(v for v, _, _ in self.buffers)
        outputs = sum(1 for _, _, out in self.buffers if out)
        return tir.PrimFunc(params, {v: b for v, b, _ in self.buffers},
                            tir.BlockRealize((), tir.true_predicate(), root),
                            {"global_symbol": self.name, "num_outputs": outputs,
                             "op_name": self.name,
                             "op_pattern": int(get_op_def(self.name).pattern)})


def matrix_steps(m: Any, n: Any) -> PrimExpr:
    """``min(m, n)``: the number of elimination steps (and pivots) of ``m x n`` matrices."""
    if dims_equal(m, n):
        return as_dim(m)
    cm, cn = const_int(as_dim(m)), const_int(as_dim(n))
    if cm is not None and cn is not None:
        return tx.const(INDEX, min(cm, cn))
    return tx.min(as_dim(m), as_dim(n))


def serial_loop(var: str, lo: PrimExpr | int, hi: PrimExpr | int,
                body: Callable[[PrimExpr], tir.Stmt]) -> tir.Stmt:
    """``for v in range(lo, hi): body(v)``, serial."""
    v = tir.Var(var, INDEX)
    lo_e = tx.const(INDEX, lo) if isinstance(lo, int) else lo
    hi_e = tx.const(INDEX, hi) if isinstance(hi, int) else hi
    return tir.For(v, lo_e, hi_e - lo_e, tir.ForKind.SERIAL, body(v))


def copy_matrix(k: MatrixKernel, src: tir.Buffer, dst: tir.Buffer, rows: PrimExpr,
                cols: PrimExpr) -> tir.Stmt:
    """``dst[:rows, :cols] = src[:rows, :cols]`` of the block's matrix."""
    return serial_loop("ci", 0, rows, lambda i: serial_loop("cj", 0, cols, lambda j: (
        tir.BufferStore(dst, src.load(k.at(i, j)), k.at(i, j)))))


def abs_value(x: PrimExpr) -> PrimExpr:
    """``|x|`` as a select (what every target compiles alike)."""
    zero = tx.const(x.dtype, 0)
    return tx.Select(tx.lt(x, zero), zero - x, x)


def lu_factor_prim_func(batch: Sequence[Any], m: Any, n: Any, dtype: Any) -> tir.PrimFunc:
    """``(A, LU, P)``: LU factorization with partial pivoting of each ``m x n`` matrix
    (``min(m, n)`` steps and pivots)."""
    k = MatrixKernel("lu_factor", batch)
    steps = matrix_steps(m, n)
    a = k.buffer("A", (m, n), dtype)
    lu = k.buffer("LU", (m, n), dtype, output=True)
    piv = k.buffer("P", (steps,), INDEX, output=True)
    zero = tx.const(as_dtype(dtype), 0)

    def step(s: PrimExpr) -> tir.Stmt:
        p = piv.load(k.at(s))
        search = serial_loop("r", s + 1, m, lambda r: tir.IfThenElse(
            tx.gt(abs_value(lu.load(k.at(r, s))), abs_value(lu.load(k.at(p, s)))),
            tir.BufferStore(piv, r, k.at(s))))

        def swap(j: PrimExpr) -> tir.Stmt:
            t = tir.Var("t", as_dtype(dtype))
            return tir.LetStmt(t, lu.load(k.at(s, j)), tir.seq(
                tir.BufferStore(lu, lu.load(k.at(p, j)), k.at(s, j)),
                tir.BufferStore(lu, t, k.at(p, j))))

        pivot = lu.load(k.at(s, s))

        def eliminate(r: PrimExpr) -> tir.Stmt:
            scale = tir.IfThenElse(tx.ne(pivot, zero), tir.BufferStore(
                lu, lu.load(k.at(r, s)) / pivot, k.at(r, s)))
            update = serial_loop("c", s + 1, n, lambda c: tir.BufferStore(
                lu, lu.load(k.at(r, c)) - lu.load(k.at(r, s)) * lu.load(k.at(s, c)),
                k.at(r, c)))
            return tir.seq(scale, update)

        return tir.seq(tir.BufferStore(piv, s, k.at(s)), search,
                       tir.IfThenElse(tx.ne(p, s), serial_loop("j", 0, n, swap)),
                       serial_loop("r", s + 1, m, eliminate))

    return k.func(tir.seq(copy_matrix(k, a, lu, m, n), serial_loop("s", 0, steps, step)))


def lu_solve_prim_func(batch: Sequence[Any], n: Any, m: Any, dtype: Any) -> tir.PrimFunc:
    """``(LU, P, B, X)``: ``X = A^-1 B`` from ``A``'s LU factorization."""
    k = MatrixKernel("lu_solve", batch)
    lu = k.buffer("LU", (n, n), dtype)
    piv = k.buffer("P", (n,), INDEX)
    b = k.buffer("B", (n, m), dtype)
    x = k.buffer("X", (n, m), dtype, output=True)

    def permute(s: PrimExpr) -> tir.Stmt:
        p = piv.load(k.at(s))

        def swap(c: PrimExpr) -> tir.Stmt:
            t = tir.Var("t", as_dtype(dtype))
            return tir.LetStmt(t, x.load(k.at(s, c)), tir.seq(
                tir.BufferStore(x, x.load(k.at(p, c)), k.at(s, c)),
                tir.BufferStore(x, t, k.at(p, c))))

        return tir.IfThenElse(tx.ne(p, s), serial_loop("c", 0, m, swap))

    return k.func(tir.seq(copy_matrix(k, b, x, n, m), serial_loop("s", 0, n, permute),
                          _substitution(k, lu, x, n, m, upper=False, unit=True),  # L y = P b
                          _substitution(k, lu, x, n, m, upper=True, unit=False)))  # U x = y


def _substitution(k: MatrixKernel, a: tir.Buffer, x: tir.Buffer, n: PrimExpr, m: PrimExpr,
                  upper: bool, unit: bool) -> tir.Stmt:
    """Solve ``T x = x`` in place, ``T`` the upper (last row first) or lower (first row first)
    triangle of ``a``; ``unit``: T's diagonal is taken as ones."""
    def row(q: PrimExpr) -> tir.Stmt:
        r = n - 1 - q if upper else q
        lo, hi = (r + 1, n) if upper else (0, r)
        sub = serial_loop("j", lo, hi, lambda j: serial_loop("c", 0, m, lambda c: tir.BufferStore(
            x, x.load(k.at(r, c)) - a.load(k.at(r, j)) * x.load(k.at(j, c)), k.at(r, c))))
        if unit:
            return sub
        return tir.seq(sub, serial_loop("c", 0, m, lambda c: tir.BufferStore(
            x, x.load(k.at(r, c)) / a.load(k.at(r, r)), k.at(r, c))))

    return serial_loop("q", 0, n, row)


def triangular_solve_prim_func(batch: Sequence[Any], n: Any, m: Any, dtype: Any, upper: bool,
                               unit_diagonal: bool) -> tir.PrimFunc:
    """``(A, B, X)``: ``X = A^-1 B`` for triangular ``A``."""
    k = MatrixKernel("triangular_solve", batch)
    a = k.buffer("A", (n, n), dtype)
    b = k.buffer("B", (n, m), dtype)
    x = k.buffer("X", (n, m), dtype, output=True)
    solve = _substitution(k, a, x, n, m, upper, unit_diagonal)
    return k.func(tir.seq(copy_matrix(k, b, x, n, m), solve))


def cholesky_prim_func(batch: Sequence[Any], n: Any, dtype: Any, upper: bool) -> tir.PrimFunc:
    """``(A, L)``: the Cholesky factor of each matrix (upper: ``U = Lᵀ``, from the upper
    triangle of ``A``)."""
    k = MatrixKernel("cholesky", batch)
    a = k.buffer("A", (n, n), dtype)
    out = k.buffer("L", (n, n), dtype, output=True)
    dt = as_dtype(dtype)

    def idx(r: PrimExpr, c: PrimExpr) -> tuple[PrimExpr, ...]:  # L[r, c] (r >= c) where stored
        return k.at(c, r) if upper else k.at(r, c)

    def column(j: PrimExpr) -> tir.Stmt:
        diag = tir.seq(
            tir.BufferStore(out, a.load(idx(j, j)), idx(j, j)),
            serial_loop("p", 0, j, lambda p: tir.BufferStore(
                out, out.load(idx(j, j)) - out.load(idx(j, p)) * out.load(idx(j, p)),
                idx(j, j))),
            tir.BufferStore(out, tx.sqrt(out.load(idx(j, j))), idx(j, j)))

        def below(r: PrimExpr) -> tir.Stmt:
            return tir.seq(
                tir.BufferStore(out, a.load(idx(r, j)), idx(r, j)),
                serial_loop("p", 0, j, lambda p: tir.BufferStore(
                    out, out.load(idx(r, j)) - out.load(idx(r, p)) * out.load(idx(j, p)),
                    idx(r, j))),
                tir.BufferStore(out, out.load(idx(r, j)) / out.load(idx(j, j)), idx(r, j)))

        return tir.seq(diag, serial_loop("r", j + 1, n, below))

    clear = serial_loop("ci", 0, n, lambda i: serial_loop("cj", 0, n, lambda j: tir.BufferStore(
        out, tx.const(dt, 0), k.at(i, j))))
    return k.func(tir.seq(clear, serial_loop("j", 0, n, column)))


# ---- ops --------------------------------------------------------------------------------------
def operand_dims(call: Any, i: int) -> list[Any]:
    """The shape of argument ``i`` of ``call`` (known rank and shape, as legalizing needs)."""
    sinfo = call.args[i].struct_info
    if getattr(sinfo, "shape", None) is None:
        raise StructInfoError(f"LegalizeOps: {call.op.name} needs operands of known rank and "
                              f"shape, got {sinfo}")
    return list(sinfo.shape)


def emit_kernel(bb: Any, call: Any, func: tir.PrimFunc) -> Any:
    """``call_tir`` of ``func`` on ``call``'s arguments, with ``call``'s StructInfo."""
    gvar = bb.add_func(func, call.op.name)
    sinfo = call.struct_info
    outs = list(sinfo.fields) if isinstance(sinfo, TupleStructInfo) else sinfo
    return gx.call_tir(gvar, list(call.args), outs)


def _lu_factor_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "lu_factor", "a", square=False)
    shape = arg_shape(a)
    if shape is None:
        ndim = arg_ndim(a)
        return TupleStructInfo((tensor_sinfo(None, a.dtype, ndim=ndim),
                                tensor_sinfo(None, INDEX, ndim=ndim - 1 if ndim > 0 else -1)))
    steps = matrix_steps(*shape[-2:])
    return TupleStructInfo((tensor_sinfo(shape, a.dtype),
                            tensor_sinfo((*shape[:-2], steps), INDEX)))


def _lu_factor_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    return emit_kernel(bb, call, lu_factor_prim_func(dims[:-2], dims[-2], dims[-1],
                                               call.args[0].struct_info.dtype))


lu_factor = register_op(
    "lu_factor", inputs=("a",), infer=_lu_factor_infer, pattern=OpPattern.OPAQUE,
    legalize=_lu_factor_legalize, mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="``(lu, pivots)``: LU factorization with partial pivoting (see kiln.op.matrix).")


def register_pivoted_solve(name: str, factors: str, factor_op: str,
                           prim_func: Callable[..., Any], module: str) -> Any:
    """Register op ``name(factors, pivots, b)``: ``x`` with ``a x = b`` from the factors and
    int64 pivots that op ``factor_op`` made of ``a`` (``lu_solve``, ``ldl_solve``); the kernel
    is ``prim_func(batch dims, n, k, dtype)``."""

    def infer(call: Any) -> Any:
        f = matrix_arg(call, 0, name, factors, square=True)
        piv = shape_utils.tensor_sinfo(call, 1)
        if as_dtype(piv.dtype) != INDEX:
            raise StructInfoError(f"{name}: pivots must be int64, got {piv.dtype}")
        b = matrix_arg(call, 2, name, "b", square=False)
        check_rhs(name, f, b)
        return tensor_sinfo(arg_shape(b), b.dtype, ndim=arg_ndim(b))

    def legalize(bb: Any, call: Any) -> Any:
        dims = kernel_dims(operand_dims(call, 2))
        return emit_kernel(bb, call, prim_func(dims[:-2], dims[-2], dims[-1],
                                               call.args[0].struct_info.dtype))

    return register_op(
        name, inputs=(factors, "pivots", "b"), infer=infer, pattern=OpPattern.OPAQUE,
        legalize=legalize, mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
        doc=f"``x`` with ``a x = b`` from ``a``'s ``{factor_op}`` (see {module}).")


lu_solve = register_pivoted_solve("lu_solve", "lu", "lu_factor", lu_solve_prim_func,
                                  "kiln.op.matrix")


@dataclass(frozen=True)
class CholeskyAttrs:
    """``upper``: ``a = uᵀ u`` with the upper factor ``u`` (read from ``a``'s upper
    triangle), else ``a = l lᵀ``."""

    upper: bool = False

    def __post_init__(self):
        if not isinstance(self.upper, bool):
            raise KilnError(f"cholesky: upper must be a bool, got {self.upper!r}")


def _cholesky_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "cholesky", "a", square=True)
    return tensor_sinfo(arg_shape(a), a.dtype, ndim=arg_ndim(a))


def _cholesky_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 0))
    return emit_kernel(bb, call, cholesky_prim_func(dims[:-2], dims[-1],
                                              call.args[0].struct_info.dtype,
                                              call.attrs.upper))


cholesky = register_op(
    "cholesky", inputs=("a",), attrs=CholeskyAttrs, infer=_cholesky_infer,
    pattern=OpPattern.OPAQUE, legalize=_cholesky_legalize,
    mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="The Cholesky factor of symmetric positive definite matrices (see kiln.op.matrix).")


@dataclass(frozen=True)
class TriangularSolveAttrs:
    """``upper``: ``a`` is upper triangular (else lower); ``unit_diagonal``: its diagonal is
    taken as ones (not read)."""

    upper: bool = True
    unit_diagonal: bool = False

    def __post_init__(self):
        for name in ("upper", "unit_diagonal"):
            if not isinstance(getattr(self, name), bool):
                raise KilnError(f"triangular_solve: {name} must be a bool, got "
                                f"{getattr(self, name)!r}")


def _triangular_solve_infer(call: Any) -> Any:
    a = matrix_arg(call, 0, "triangular_solve", "a", square=True)
    b = matrix_arg(call, 1, "triangular_solve", "b", square=False)
    check_rhs("triangular_solve", a, b)
    return tensor_sinfo(arg_shape(b), b.dtype, ndim=arg_ndim(b))


def _triangular_solve_legalize(bb: Any, call: Any) -> Any:
    dims = kernel_dims(operand_dims(call, 1))
    return emit_kernel(bb, call, triangular_solve_prim_func(
        dims[:-2], dims[-2], dims[-1], call.args[0].struct_info.dtype, call.attrs.upper,
        call.attrs.unit_diagonal))


triangular_solve = register_op(
    "triangular_solve", inputs=("a", "b"), attrs=TriangularSolveAttrs,
    infer=_triangular_solve_infer, pattern=OpPattern.OPAQUE,
    legalize=_triangular_solve_legalize, mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="``x`` with ``a x = b`` for triangular ``a`` (see kiln.op.matrix).")


@dataclass(frozen=True)
class CheckInfoAttrs:
    """``what``: the error's subject, e.g. ``"torch.linalg.inv: the matrix is singular (info
    = the first zero pivot)"``."""

    what: str

    def __post_init__(self):
        if not isinstance(self.what, str) or not self.what:
            raise KilnError(f"check_info: what must be a non-empty str, got {self.what!r}")


def _check_info_infer(call: Any) -> Any:
    x = shape_utils.tensor_sinfo(call, 0)
    info = shape_utils.tensor_sinfo(call, 1)
    if not as_dtype(info.dtype).is_integer:
        raise StructInfoError(f"check_info: info must be an integer tensor, got {info.dtype}")
    sx, si = arg_shape(x), arg_shape(info)
    if sx is not None and si is not None and (
            len(sx) < max(len(si), 1)
            or not all(dims_equal(a, b) for a, b in zip(sx, si))):
        raise StructInfoError(f"check_info: info of shape {tuple(si)} must index the leading "
                              f"axes of x of shape {tuple(sx)} (rank >= 1)")
    return x


def _check_info_compute(x: Any, info: Any, *, attrs: CheckInfoAttrs) -> Any:
    """``x`` copied, each leading index ``i`` read through ``check_index(info[i], 1)``: an
    ``info`` that is not 0 is a RuntimeCheckError (and the read stays in bounds)."""
    k = len(info.shape)

    def body(*i: PrimExpr) -> PrimExpr:
        ok = tx.check_index(info[tuple(i[:k])], 1, attrs.what, allow_negative=False)
        return x[(i[0] + ok, *i[1:])]

    return te.compute(x.shape, body, name="check_info")


check_info = register_op(
    "check_info", inputs=("x", "info"), attrs=CheckInfoAttrs, infer=_check_info_infer,
    pattern=OpPattern.INJECTIVE, compute=_check_info_compute,
    mixed_precision=MixedPrecision.FOLLOW, gradient=NON_DIFFERENTIABLE,
    doc="``x`` once every entry of ``info`` (over x's leading axes) is 0, else a run-time "
        "error naming ``what``: the check of a factorization's ``info`` (a singular or "
        "indefinite matrix) tied to the values computed with it.")


# ---- graph helpers the frontends share ----------------------------------------------------------
def matrix_diagonal(x: Any, n: int) -> Any:
    """``[..., n]``: the diagonals of the ``[..., n, n]`` matrices ``x`` (``n`` static)."""
    shape = x.struct_info.shape
    flat = reshape(x, (*shape[:-2], n * n))
    return take(flat, gx.const(np.arange(n, dtype=np.int64) * (n + 1)), axis=-1)


def pivot_sign(pivots: Any, n: int, dtype: Any) -> Any:
    """``(-1) ** (number of row swaps)`` of ``lu_factor``'s pivots (``n`` of them), in
    ``dtype``: the determinant of the permutation."""
    moved = cast(not_equal(pivots, gx.const(np.arange(n, dtype=np.int64))), "int64")
    two, one_i = gx.const(np.array(2, np.int64)), gx.const(np.array(1, np.int64))
    odd = equal(mod(reduce_sum(moved, axis=(-1,)), two), one_i)
    one = np.array(1, as_dtype(dtype).to_numpy())
    return where(odd, gx.const(-one), gx.const(one))


def determinant(emit: Any, a: Any, n: int) -> Any:
    """``det(a)`` of ``[..., n, n]`` float matrices (``n >= 1`` static): the product of
    ``lu_factor``'s diagonal and the sign of its row swaps. ``emit`` binds a value once (a
    BlockBuilder's ``emit``), as the factorization is used twice."""
    out = emit(lu_factor(a))
    lu, piv = emit(gx.TupleGetItem(out, 0)), emit(gx.TupleGetItem(out, 1))
    return multiply(prod(matrix_diagonal(lu, n), axis=(-1,)),
                    pivot_sign(piv, n, a.struct_info.dtype))
