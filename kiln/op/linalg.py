"""Linear algebra operators: ``matmul`` and ``dense`` (``linear``).

Both are one reduction over the contracted axis ``k``. On CPUs at opt level 2 a product whose
right operand can be packed becomes ``matmul_packed`` (:mod:`kiln.op.matmul_packed`: ``b``
packed in column panels, a register-tiled micro-kernel; the layout hook and the schedules are
in ``kiln/schedule/cpu/``).

``dense(x, w)`` is ``x @ w.T`` with ``w`` laid out ``[units, in]`` (ONNX Gemm with transB,
torch.nn.Linear). In that layout no output axis is contiguous in ``w``, so the compute reads
the weight through a transposed stage ``dense_weight_t`` (``[in, units]``), which a schedule
may materialize or inline.
A bias is not an input of the op: ``linear(x, w, b)`` emits ``add(dense(x, w), b)`` and
operator fusion merges the add into the dense kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import te, tir
from ..arith import Analyzer
from ..graph.printer import format_shape
from ..graph.shape_utils import broadcast_dim
from ..graph.struct_info import TensorStructInfo, dims_differ
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError, StructInfoError
from .common import assume, broadcast_checks, dims_equal, equal_dims, shape_attr
from .elementwise import add, cast_to, multiply
from .grad import fit_to
from .registry import MixedPrecision, OpPattern, register_op
from .shape import expand_dims, reshape, squeeze, transpose

__all__ = ["dense", "linear", "matmul"]


# ---------------------------------------------------------------------------------------------
# helpers (also used by nn.py)
# ---------------------------------------------------------------------------------------------
def norm_dtype(value: Any, op: str, what: str = "out_dtype") -> str | None:
    """``None`` or a canonical dtype string (attrs hold strings so they print and hash simply)."""
    if value is None:
        return None
    try:
        dt = as_dtype(value)
    except (DTypeError, ValueError, TypeError) as err:
        raise KilnError(f"{op}: {what} {value!r} is not a data type") from err
    if dt.lanes != 1 or dt.is_handle or dt.is_bool:
        raise KilnError(f"{op}: {what} must be a scalar numeric type, got {dt}")
    return str(dt)


def const_int(dim: Any) -> int | None:
    """The python int of a constant dimension, else None."""
    if isinstance(dim, int) and not isinstance(dim, bool):
        return dim
    return dim.value if isinstance(dim, tir.IntImm) else None


def provably_unequal(a: Any, b: Any) -> bool:
    """True when two dimensions are known to differ (distinct symbols get the benefit)."""
    return bool(dims_differ(a, b))


def fmt_shape(shape: Any) -> str:
    return format_shape(shape)


def fmt_dim(dim: Any) -> str:
    return str(const_int(dim)) if const_int(dim) is not None else str(dim)


def simplify(expr: Any) -> Any:
    """Simplify a shape expression (constants stay constants)."""
    if isinstance(expr, tir.IntImm):
        return expr

    return Analyzer().simplify(expr)


def result_dtype(op: str, out_dtype: str | None, *infos: tuple[str, Any]) -> DataType:
    """The result dtype: ``out_dtype`` if given, else the inputs' common (numeric) dtype."""
    for name, info in infos:
        if not (info.dtype.is_float or info.dtype.is_integer):
            raise StructInfoError(f"{op}: {name} has dtype {info.dtype}, expected a numeric type")
    if out_dtype is not None:
        return as_dtype(out_dtype)
    (first_name, first), *rest = infos
    for name, info in rest:
        if info.dtype != first.dtype:
            raise StructInfoError(
                f"{op}: {first_name} has dtype {first.dtype} but {name} has {info.dtype}; "
                "cast one of them or give out_dtype"
            )
    return as_dtype(first.dtype)


def tensor_arg(call: Any, index: int, op: str, name: str, ndim: int | None = None) -> Any:
    """The TensorStructInfo of argument ``index``; StructInfoError naming it otherwise."""
    sinfo = call.args[index].struct_info
    if not isinstance(sinfo, TensorStructInfo):
        raise StructInfoError(f"{op}: {name} must be a tensor, got {sinfo}")
    if ndim is not None and sinfo.ndim >= 0 and sinfo.ndim != ndim:
        shape = fmt_shape(sinfo.shape) if sinfo.shape is not None else f"{sinfo.ndim}-d"
        raise StructInfoError(f"{op}: {name} must be {ndim}-d, got shape {shape}")
    return sinfo


def attr_out_dtype(call: Any) -> str | None:
    return getattr(call.attrs, "out_dtype", None) if call.attrs is not None else None


# ---------------------------------------------------------------------------------------------
# matmul
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MatmulAttrs:
    """``out_dtype``: dtype of the result and of the accumulation (None: the inputs' dtype).

    Mixed precision sets it to float32 for float16 inputs so that products are summed in
    float32.
    """

    out_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "out_dtype", norm_dtype(self.out_dtype, "matmul"))


def broadcast_batch(op: str, a_batch: tuple, b_batch: tuple) -> tuple:
    """numpy broadcasting of the batch dimensions of two matmul operands; a symbolic pair is
    decided while the kernel runs (``kiln.graph.shape_utils.broadcast_dim``)."""
    n = max(len(a_batch), len(b_batch))
    a_pad = (None,) * (n - len(a_batch)) + tuple(a_batch)
    b_pad = (None,) * (n - len(b_batch)) + tuple(b_batch)
    out = []
    for da, db in zip(a_pad, b_pad):
        d = da if db is None else db if da is None else broadcast_dim(da, db)
        if d is None:
            raise StructInfoError(
                f"{op}: batch dimensions {fmt_shape(a_batch)} of a and {fmt_shape(b_batch)} of "
                "b do not broadcast"
            )
        out.append(d)
    return tuple(out)


def matmul_assumptions(op: str, ka: Any, kb: Any, a_batch: tuple = (), b_batch: tuple = (),
                       batch: tuple = ()) -> dict[str, Any]:
    """``te.compute`` attrs with what a product's kernel checks before it runs: the contracted
    dims ``ka`` of a and ``kb`` of b when they are not provably equal, and batch dims that
    broadcasting could not decide at compile time (see ``kiln.tir.function.ASSUME_ATTR``)."""
    return assume(
        broadcast_checks(op, (a_batch, b_batch), ("the batch dims of a", "the batch dims of b"),
                         batch)
        + equal_dims([(ka, kb, f"{op}: a has {fmt_dim(ka)} columns but b has {fmt_dim(kb)} "
                               "rows (the contracted dimensions must agree)")]))


def _matmul_parts(a_shape: tuple, b_shape: tuple) -> dict[str, Any]:
    """Operand shapes split into batch dims, M, K, N (numpy rules for 1-D operands)."""
    a_vec, b_vec = len(a_shape) == 1, len(b_shape) == 1
    return {
        "a_vec": a_vec,
        "b_vec": b_vec,
        "a_batch": () if a_vec else tuple(a_shape[:-2]),
        "b_batch": () if b_vec else tuple(b_shape[:-2]),
        "m": None if a_vec else a_shape[-2],
        "ka": a_shape[-1],
        "kb": b_shape[0] if b_vec else b_shape[-2],
        "n": None if b_vec else b_shape[-1],
    }


def _matmul_out_shape(op: str, p: dict[str, Any]) -> tuple:
    batch = broadcast_batch(op, p["a_batch"], p["b_batch"])
    return batch + (() if p["a_vec"] else (p["m"],)) + (() if p["b_vec"] else (p["n"],))


def _infer_matmul(call: Any) -> Any:
    a = tensor_arg(call, 0, "matmul", "a")
    b = tensor_arg(call, 1, "matmul", "b")
    dtype = result_dtype("matmul", attr_out_dtype(call), ("a", a), ("b", b))
    for name, info in (("a", a), ("b", b)):
        if info.ndim == 0:
            raise StructInfoError(f"matmul: {name} is a scalar; matmul needs at least 1-d operands")
    if a.shape is None or b.shape is None:
        if a.ndim < 0 or b.ndim < 0:
            return TensorStructInfo(None, dtype)
        batch = max(max(a.ndim, 2) - 2, max(b.ndim, 2) - 2)
        return TensorStructInfo(None, dtype, batch + (a.ndim > 1) + (b.ndim > 1))
    p = _matmul_parts(a.shape, b.shape)
    if provably_unequal(p["ka"], p["kb"]):
        raise StructInfoError(
            f"matmul: a {fmt_shape(a.shape)} has {fmt_dim(p['ka'])} columns but b "
            f"{fmt_shape(b.shape)} has {fmt_dim(p['kb'])} rows (the contracted dimensions "
            "must agree)"
        )
    return TensorStructInfo(_matmul_out_shape("matmul", p), dtype)


def batch_index(operand_batch: tuple, out_batch: tuple, idx: tuple) -> list:
    """Indices into an operand's batch dims for output batch indices ``idx`` (broadcasting:
    position 0 along a dim of 1, decided while the kernel runs for a symbolic dim that is not
    provably the output's)."""
    offset = len(out_batch) - len(operand_batch)
    res: list[Any] = []
    for d, dim in enumerate(operand_batch):
        out_dim, i = out_batch[d + offset], idx[d + offset]
        if const_int(dim) == 1 and const_int(out_dim) != 1:
            res.append(0)
        elif const_int(dim) != 1 and not dims_equal(dim, out_dim):
            res.append(tir.select(tir.eq(dim, 1), tir.const(dim.dtype, 0), i))
        else:
            res.append(i)
    return res


def _matmul_compute(a: Any, b: Any, *, attrs: MatmulAttrs) -> Any:
    """``out[..., i, j] = sum_k a[..., i, k] * b[..., k, j]`` (numpy matmul semantics)."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else a.dtype
    p = _matmul_parts(tuple(a.shape), tuple(b.shape))
    shape = _matmul_out_shape("matmul", p)
    batch = shape[: len(shape) - (not p["a_vec"]) - (not p["b_vec"])]
    k = te.reduce_axis((0, p["ka"]), name="k")
    nb = len(batch)

    def body(*idx):
        bidx, rest = idx[:nb], list(idx[nb:])
        i = None if p["a_vec"] else rest.pop(0)
        j = None if p["b_vec"] else rest.pop(0)
        a_idx = batch_index(p["a_batch"], batch, bidx) + ([] if i is None else [i]) + [k]
        b_idx = batch_index(p["b_batch"], batch, bidx) + [k] + ([] if j is None else [j])
        prod = tir.cast(out_dtype, a[tuple(a_idx)]) * tir.cast(out_dtype, b[tuple(b_idx)])
        return te.sum(prod, axis=k)

    return te.compute(shape, body, name="matmul",
                      attrs=matmul_assumptions("matmul", p["ka"], p["kb"], p["a_batch"],
                                               p["b_batch"], batch))


def _swap_last(x: Any, ndim: int) -> Any:
    """``x`` with its last two axes swapped (a batched matrix transpose)."""
    return transpose(x, tuple(range(ndim - 2)) + (ndim - 1, ndim - 2))


def _matmul_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``da = g @ b^T``, ``db = a^T @ g``, each summed over broadcast batch dimensions; 1-d
    operands are handled as the matrices numpy promotes them to. Computed in the result's
    dtype (``out_dtype``) and cast back to each input's."""
    a, b = call.args
    sa, sb = a.struct_info, b.struct_info
    if not (as_dtype(sa.dtype).is_float and as_dtype(sb.dtype).is_float):
        return [None, None]
    if sa.shape is None or sb.shape is None:
        raise KilnError("matmul gradient: needs operands of known shape")
    g = output_grad
    gdt = call.struct_info.dtype
    ac, bc = cast_to(a, gdt, sa.dtype), cast_to(b, gdt, sb.dtype)
    na, nb = len(sa.shape), len(sb.shape)
    if na == 1 and nb == 1:  # dot product: g is a scalar
        return [fit_to(bb, multiply(g, bc), a), fit_to(bb, multiply(g, ac), b)]
    nout = len(call.struct_info.shape)
    if na == 1:  # a is a row vector [1, K]
        g2 = expand_dims(g, nout - 1)
        da = squeeze(matmul(g2, _swap_last(bc, nb)), nout - 1)
        db = matmul(reshape(ac, shape_attr((sa.shape[0], 1))), g2)
    elif nb == 1:  # b is a column vector [K, 1]
        g2 = expand_dims(g, nout)
        da = matmul(g2, reshape(bc, shape_attr((1, sb.shape[0]))))
        db = squeeze(matmul(_swap_last(ac, na), g2), nout)
    else:
        da = matmul(g, _swap_last(bc, nb))
        db = matmul(_swap_last(ac, na), g)
    return [fit_to(bb, da, a), fit_to(bb, db, b)]


matmul = register_op(
    "matmul",
    inputs=("a", "b"),
    attrs=MatmulAttrs,
    infer=_infer_matmul,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_matmul_compute,
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_matmul_grad,
    doc="Matrix product with numpy semantics: a 1-d operand is promoted to a matrix (and the "
    "added dimension removed from the result), leading batch dimensions broadcast. "
    "``out_dtype`` sets the accumulation and result dtype.",
)


# ---------------------------------------------------------------------------------------------
# dense
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DenseAttrs:
    """``out_dtype``: dtype of the result and of the accumulation (None: the inputs' dtype)."""

    out_dtype: str | None = None

    def __post_init__(self):
        object.__setattr__(self, "out_dtype", norm_dtype(self.out_dtype, "dense"))


def _infer_dense(call: Any) -> Any:
    x = tensor_arg(call, 0, "dense", "data")
    w = tensor_arg(call, 1, "dense", "weight")
    dtype = result_dtype("dense", attr_out_dtype(call), ("data", x), ("weight", w))
    if w.ndim not in (-1, 2):
        raise StructInfoError(f"dense: weight must be 2-d [units, in], got {w.ndim}-d")
    if x.ndim == 0:
        raise StructInfoError("dense: data is a scalar; it needs at least 1 dimension")
    if x.shape is None or w.shape is None:
        return TensorStructInfo(None, dtype, x.ndim)
    if provably_unequal(x.shape[-1], w.shape[1]):
        raise StructInfoError(
            f"dense: data {fmt_shape(x.shape)} has {fmt_dim(x.shape[-1])} features but weight "
            f"{fmt_shape(w.shape)} expects {fmt_dim(w.shape[1])} (weight is [units, in])"
        )
    return TensorStructInfo(tuple(x.shape[:-1]) + (w.shape[0],), dtype)


def _dense_compute(x: Any, w: Any, *, attrs: DenseAttrs) -> Any:
    """``out[..., j] = sum_k x[..., k] * w[j, k]``, reading ``w`` through its transpose."""
    out_dtype = as_dtype(attrs.out_dtype) if attrs.out_dtype else x.dtype
    units, in_features = w.shape
    # The transposed copy is made in the accumulation dtype: the inner product loop then reads
    # float32 weights even when they are stored in float16/bfloat16 (converted once, not once
    # per row of ``data``).
    wt = te.compute((in_features, units), lambda k, j: tir.cast(out_dtype, w[j, k]),
                    name="dense_weight_t")
    k = te.reduce_axis((0, x.shape[-1]), name="k")
    shape = tuple(x.shape[:-1]) + (units,)

    def body(*idx):
        xv = x[tuple(idx[:-1]) + (k,)]
        return te.sum(tir.cast(out_dtype, xv) * tir.cast(out_dtype, wt[k, idx[-1]]), axis=k)

    return te.compute(shape, body, name="dense",
                      attrs=matmul_assumptions("dense", x.shape[-1], in_features))


def _dense_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``d data = g @ w`` and ``d w = g^T @ data`` with the leading dimensions of ``data``
    flattened into rows; computed in the result's dtype, cast back to each input's."""
    x, w = call.args
    sx, sw = x.struct_info, w.struct_info
    if not (as_dtype(sx.dtype).is_float and as_dtype(sw.dtype).is_float):
        return [None, None]
    if sx.shape is None or sw.shape is None:
        raise KilnError("dense gradient: needs operands of known shape")
    g = output_grad
    gdt = call.struct_info.dtype
    xc, wc = cast_to(x, gdt, sx.dtype), cast_to(w, gdt, sw.dtype)
    units, in_features = shape_attr(sw.shape)
    dx = matmul(g, wc)
    if len(sx.shape) == 2:
        g2, x2 = g, xc
    else:
        g2, x2 = reshape(g, (-1, units)), reshape(xc, (-1, in_features))
    dw = matmul(transpose(g2, (1, 0)), x2)
    return [fit_to(bb, dx, x), fit_to(bb, dw, w)]


dense = register_op(
    "dense",
    inputs=("data", "weight"),
    attrs=DenseAttrs,
    infer=_infer_dense,
    pattern=OpPattern.OUT_EWISE_FUSABLE,
    compute=_dense_compute,
    mixed_precision=MixedPrecision.ALWAYS,
    gradient=_dense_grad,
    doc="``data @ weight.T`` with weight ``[units, in]``; data may have leading batch "
    "dimensions. ``out_dtype`` sets the accumulation and result dtype.",
)


def linear(data: Any, weight: Any, bias: Any = None, out_dtype: Any = None) -> Any:
    """``data @ weight.T (+ bias)``: a ``dense`` call, plus a separate ``add`` for the bias.

    The bias stays a separate broadcast add so that fusion can merge it (and any activation
    after it) into the dense kernel's output loop.
    """
    out = dense(data, weight, out_dtype=out_dtype)
    if bias is None:
        return out

    return add(out, bias)
