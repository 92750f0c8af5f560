"""Linear algebra operators: ``matmul`` and ``dense`` (``linear``).

Both are one reduction over the contracted axis ``k``. Their CPU schedule
(:func:`schedule_gemm`) walks the output in blocks of a few rows and, for each ``k``, adds
``A[i, k] * B[k, :]`` to those rows with SIMD vectors along the columns (each vector of ``B``
is loaded once for all rows of the block); the row blocks run in parallel. That schedule is
what runs when the right operand cannot be packed: on CPUs at opt level 2 both ops declare an
``alter_layout`` hook that turns a product into ``matmul_packed``
(:mod:`kiln.op.matmul_packed`: ``b`` packed in column panels, a register-tiled micro-kernel).

``dense(x, w)`` is ``x @ w.T`` with ``w`` laid out ``[units, in]`` (ONNX Gemm with transB,
torch.nn.Linear). In that layout no output axis is contiguous in ``w``, so the compute reads
the weight through a transposed stage ``dense_weight_t`` (``[in, units]``); the CPU schedule
materializes it when there are enough rows to amortize the copy (then the matmul schedule
applies unchanged) and inlines it otherwise (matrix-vector products are memory bound anyway).
A bias is not an input of the op: ``linear(x, w, b)`` emits ``add(dense(x, w), b)`` and
operator fusion merges the add into the dense kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import te, tir
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError, StructInfoError
from .registry import MixedPrecision, OpPattern, register_op

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
    from ..graph.struct_info import dims_differ

    return bool(dims_differ(a, b))


def fmt_shape(shape: Any) -> str:
    from ..graph.printer import format_shape

    return format_shape(shape)


def fmt_dim(dim: Any) -> str:
    return str(const_int(dim)) if const_int(dim) is not None else str(dim)


def simplify(expr: Any) -> Any:
    """Simplify a shape expression (constants stay constants)."""
    if isinstance(expr, tir.IntImm):
        return expr
    from ..arith import Analyzer

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
    from ..graph.struct_info import TensorStructInfo

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


def _broadcast_batch(op: str, a_batch: tuple, b_batch: tuple) -> tuple:
    """numpy broadcasting of the batch dimensions of two matmul operands; a symbolic pair is
    decided while the kernel runs (``kiln.graph.shape_utils.broadcast_dim``)."""
    from ..graph.shape_utils import broadcast_dim

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
    from .elementwise import assume, broadcast_checks, equal_dims

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
    batch = _broadcast_batch(op, p["a_batch"], p["b_batch"])
    return batch + (() if p["a_vec"] else (p["m"],)) + (() if p["b_vec"] else (p["n"],))


def _infer_matmul(call: Any) -> Any:
    from ..graph.struct_info import TensorStructInfo

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


def _batch_index(operand_batch: tuple, out_batch: tuple, idx: tuple) -> list:
    """Indices into an operand's batch dims for output batch indices ``idx`` (broadcasting:
    position 0 along a dim of 1, decided while the kernel runs for a symbolic dim that is not
    provably the output's)."""
    from .elementwise import dims_equal

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
        a_idx = _batch_index(p["a_batch"], batch, bidx) + ([] if i is None else [i]) + [k]
        b_idx = _batch_index(p["b_batch"], batch, bidx) + [k] + ([] if j is None else [j])
        prod = tir.cast(out_dtype, a[tuple(a_idx)]) * tir.cast(out_dtype, b[tuple(b_idx)])
        return te.sum(prod, axis=k)

    return te.compute(shape, body, name="matmul",
                      attrs=matmul_assumptions("matmul", p["ka"], p["kb"], p["a_batch"],
                                               p["b_batch"], batch))


def _schedule_matmul(sch: Any, target: Any) -> None:
    a, b = (sch.func.buffer_map[p] for p in sch.func.params[:2])
    rest = other_blocks(sch, {"matmul"})
    at = schedule_gemm(sch, target, sch.get_block("matmul"), has_i=a.ndim > 1, has_j=b.ndim > 1)
    schedule_epilogue(sch, target, rest, at)


def _alter_matmul_c(call: Any, target: Any) -> Any:
    from .matmul_packed import alter_to_packed

    return alter_to_packed(call, target, "matmul")


def _swap_last(x: Any, ndim: int) -> Any:
    """``x`` with its last two axes swapped (a batched matrix transpose)."""
    from .shape import transpose

    return transpose(x, tuple(range(ndim - 2)) + (ndim - 1, ndim - 2))


def _matmul_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``da = g @ b^T``, ``db = a^T @ g``, each summed over broadcast batch dimensions; 1-d
    operands are handled as the matrices numpy promotes them to. Computed in the result's
    dtype (``out_dtype``) and cast back to each input's."""
    from .elementwise import multiply
    from .grad import cast_to, fit_to, shape_attr
    from .shape import expand_dims, reshape, squeeze

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
    schedules={"c": _schedule_matmul},
    alter_layout={"c": _alter_matmul_c},
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
    from ..graph.struct_info import TensorStructInfo

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


#: Rows of ``data`` from which materializing the transposed weight pays for itself.
DENSE_TRANSPOSE_MIN_ROWS = 8


def _schedule_dense(sch: Any, target: Any) -> None:
    x = sch.func.buffer_map[sch.func.params[0]]
    rows: int | None = 1
    for d in x.shape[:-1]:
        rows = rows * const_int(d) if rows is not None and const_int(d) is not None else None
    rest = other_blocks(sch, {"dense", "dense_weight_t"})
    wt = sch.get_block("dense_weight_t")
    block = sch.get_block("dense")
    if rows is not None and rows < DENSE_TRANSPOSE_MIN_ROWS:
        sch.compute_inline(wt)
        at = schedule_gemv(sch, target, block)
    else:
        schedule_transpose(sch, target, wt)
        at = schedule_gemm(sch, target, block, has_i=x.ndim > 1, has_j=True)
    schedule_epilogue(sch, target, rest, at)


def _alter_dense_c(call: Any, target: Any) -> Any:
    from .matmul_packed import alter_to_packed

    return alter_to_packed(call, target, "dense")


def _dense_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``d data = g @ w`` and ``d w = g^T @ data`` with the leading dimensions of ``data``
    flattened into rows; computed in the result's dtype, cast back to each input's."""
    from .grad import cast_to, fit_to, shape_attr
    from .shape import reshape, transpose

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
    schedules={"c": _schedule_dense},
    alter_layout={"c": _alter_dense_c},
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
    from .elementwise import add

    return add(out, bias)


# ---------------------------------------------------------------------------------------------
# CPU schedules
# ---------------------------------------------------------------------------------------------
#: Rows of A that share each vector load of B in the GEMM inner loop.
GEMM_ROWS = 4
#: Vectors of C per column chunk: ``GEMM_ROWS`` rows of a chunk (16 KiB of float32 with AVX2)
#: stay in L1 while the rows of B stream past (measured best for 1024^3 on a Zen 3 core).
GEMM_CHUNK_VECTORS = 128


def loop_extent(sch: Any, loop: Any) -> int | None:
    return const_int(sch.get(loop).extent)


def pick_factor(extent: int | None, candidates: list[int]) -> int | None:
    """The first candidate that divides ``extent`` (None if none does or it is symbolic)."""
    if extent is None:
        return None
    for c in candidates:
        if 1 < c <= extent and extent % c == 0:
            return c
    return None


def vector_factor(target: Any, dtype: Any, extent: int | None) -> int | None:
    """A vector length that divides ``extent``: one SIMD register of ``dtype``, or half of one.

    Longer vectors (two registers) are not used: GCC lowers over-wide vector types poorly.
    """
    lanes = target.vector_lanes(dtype)
    return pick_factor(extent, [c for c in (lanes, lanes // 2) if c >= 4])


def split_off(sch: Any, loop: Any, factor: int | None) -> tuple[Any, Any]:
    """``(outer, inner)`` with ``inner`` of ``factor`` iterations, or ``(loop, None)``."""
    if factor is None:
        return loop, None
    outer, inner = sch.split(loop, factors=[None, factor])
    return outer, inner


def block_work(sch: Any, block: Any) -> int | None:
    """Iterations of ``block`` (product of its iteration domains), None when symbolic."""
    total = 1
    for iv in sch.get(block).iter_vars:
        ext = const_int(iv.dom.extent)
        if ext is None:
            return None
        total *= ext
    return total


def parallel_outer(sch: Any, loops: list[Any], target: Any, min_chunks: int = 0,
                   work: int | None = None) -> Any | None:
    """Fuse leading ``loops`` into one parallel loop, enough of them to feed every thread
    whatever the symbolic extents among them turn out to be.

    Nothing is parallelized for a single-threaded target or when ``work`` (scalar operations,
    when known) is below the size at which a parallel region pays for itself.
    """
    from .schedule_helpers import PARALLEL_MIN_WORK, target_threads

    if not loops or getattr(target, "num_threads", 0) == 1:
        return None
    if work is not None and work < PARALLEL_MIN_WORK:
        return None
    threads = target_threads(target)
    want = max(min_chunks, 4 * threads)
    # a symbolic extent (a dynamic batch) may be 1 at run time: only the constant extents
    # count towards ``want``, so the loops after it are fused in too
    take, total, symbolic = 0, 1, False
    for lp in loops:
        take += 1
        ext = loop_extent(sch, lp)
        if ext is None:
            symbolic = True
        else:
            total *= ext
        if total >= want:
            break
    if total <= 1 and not symbolic:
        return None
    fused = sch.fuse(*loops[:take]) if take > 1 else loops[0]
    sch.parallel(fused)
    return fused


#: Least share of the threads' time a matrix-vector product's column chunks must keep busy
#: (chunks / (threads x the chunks of the busiest thread)).
GEMV_CHUNK_BALANCE = 0.9


def _column_chunk(n: int, lanes: int, want: int, threads: int, outer: int = 1) -> int | None:
    """The widest chunk of whole vectors (at most :data:`GEMM_CHUNK_VECTORS`) that splits ``n``
    columns evenly into at least ``want`` chunks, which ``outer`` x chunks parallel iterations
    share among ``threads`` with at least :data:`GEMV_CHUNK_BALANCE` of them busy (else the
    best-balanced). ``n = 1000`` on 8 lanes and 2 threads: 25 chunks of 5 vectors; 5 chunks
    of 25 left one thread 3 of them, and a 1280 x 1000 classifier at batch 1 took 1.5x ORT's
    time."""
    if n % lanes:
        return None
    vectors = n // lanes
    best: tuple[float, int] | None = None
    for v in range(min(GEMM_CHUNK_VECTORS, vectors // want), 0, -1):
        if vectors % v:
            continue
        total = outer * (vectors // v)
        balance = total / (threads * -(-total // threads))
        if balance >= GEMV_CHUNK_BALANCE:
            return v * lanes
        if best is None or balance > best[0]:
            best = (balance, v)
    return None if best is None else best[1] * lanes


def schedule_gemm(sch: Any, target: Any, block: Any, *, has_i: bool, has_j: bool) -> Any:
    """CPU schedule of ``C[..., i, j] += A[..., i, k] * B[..., k, j]`` (B contiguous in j).

    ``block`` has loops ``batch..., [i], [j], k`` (``i``/``j`` absent for 1-d operands). The
    nest becomes::

        parallel for (batch, io)               # fused
          for jc                               # column chunk of C (128 vectors)
            C[rows, chunk] = 0                 # vectorized
            for k
              for jv                           # vectors of the chunk
                for ii in ROWS (unrolled)      # B[k, jv] loaded once for ROWS rows
                  for ji in LANES (vector)
                    C[i, j] += A[i, k] * B[k, j]

    C accumulates in place. This is the fallback for products AlterOpLayout did not pack
    (a column count 16 does not divide, a computed B with few rows, opt level < 2,
    non-float32): with B
    unpacked, each ``k`` strides a whole row of B, which defeats the register tile that
    ``matmul_packed`` uses. An extent that no vector length divides is not vectorized (a predicated
    vector loop falls back to scalar code anyway); symbolic extents are not split. Returns
    the parallel loop (or None).
    """
    from .schedule_helpers import target_threads

    if not has_j:
        return schedule_gemv(sch, target, block)
    blk = sch.get(block)
    work = block_work(sch, block)
    loops = sch.get_loops(block)
    n_sp = sum(iv.iter_type == tir.IterType.DATA_PAR for iv in blk.iter_vars)
    spatial, red = loops[:n_sp], loops[n_sp:]
    dtype = blk.writes[0].buffer.dtype
    n_batch = n_sp - int(has_i) - 1
    batch, j = spatial[:n_batch], spatial[-1]
    io, ii = (spatial[n_batch], None) if has_i else (None, None)
    if io is not None:
        m_ext = loop_extent(sch, io)
        if m_ext is not None and m_ext > 1:
            io, ii = sch.split(io, factors=[None, min(GEMM_ROWS, m_ext)])
    n_ext = loop_extent(sch, j)
    lanes = vector_factor(target, dtype, n_ext)
    jc = jv = ji = None
    if lanes is not None:
        chunk = pick_factor(n_ext, [lanes * GEMM_CHUNK_VECTORS])
        outer_ext = 1
        for lp in [*batch] + ([io] if io is not None else []):
            # a symbolic extent (a dynamic batch) may be 1 at run time
            outer_ext *= loop_extent(sch, lp) or 1
        if getattr(target, "num_threads", 0) != 1:
            # few rows (a matrix-vector product): the column chunks are what the threads
            # share, so make enough of them (a classifier at a dynamic batch of 1 ran on one
            # thread: 1.6x the time of the static build's)
            threads = target_threads(target)
            want = -(-2 * threads // outer_ext)
            if want > 1 and (chunk is None or n_ext // chunk < want):
                chunk = _column_chunk(n_ext, lanes, want, threads, outer_ext) or chunk
        if chunk is not None and chunk < n_ext:
            jc, j = sch.split(j, factors=[None, chunk])
        jv, ji = sch.split(j, factors=[None, lanes])
    else:
        jv = j
    k_outer = red[0]
    order = [*batch, *(lp for lp in (io, jc) if lp is not None), *red, jv]
    order += [lp for lp in (ii, ji) if lp is not None]
    sch.reorder(*order)
    init = sch.decompose_reduction(block, k_outer)
    if ii is not None:
        sch.unroll(ii)
    if ji is not None:
        sch.vectorize(ji)
        sch.vectorize(sch.get_loops(init)[-1])
    # batch, row blocks, then column chunks (adjacent in the nest): as many as the threads need
    outer = [*batch] + [lp for lp in (io, jc) if lp is not None]
    return parallel_outer(sch, outer, target, work=work)


#: Side of the square tiles a transposition copies (both sides touch TILE cache lines).
TRANSPOSE_TILE = 16


def schedule_transpose(sch: Any, target: Any, block: Any) -> None:
    """CPU schedule of a 2-d transposition ``out[k, j] = in[j, k]``: square tiles, so reads
    and writes both stay within a few cache lines, parallel over rows of tiles."""
    k, j = sch.get_loops(block)
    ko, ki = split_off(sch, k, pick_factor(loop_extent(sch, k), [TRANSPOSE_TILE]))
    jo, ji = split_off(sch, j, pick_factor(loop_extent(sch, j), [TRANSPOSE_TILE]))
    if ki is not None and ji is not None:
        sch.reorder(ko, jo, ki, ji)
    parallel_outer(sch, [ko], target, work=block_work(sch, block))


def schedule_gemv(sch: Any, target: Any, block: Any) -> Any:
    """CPU schedule of a reduction whose output axes are not contiguous in both operands.

    The spatial loops are fused and run in parallel; the reduction runs innermost, serially,
    with its init hoisted out of the reduction loop. Returns the parallel loop (or None).
    """
    blk = sch.get(block)
    work = block_work(sch, block)
    loops = sch.get_loops(block)
    n_sp = sum(iv.iter_type == tir.IterType.DATA_PAR for iv in blk.iter_vars)
    spatial, red = loops[:n_sp], loops[n_sp:]
    if red and spatial:
        sch.decompose_reduction(block, red[0])
    if not spatial:
        return None
    return parallel_outer(sch, spatial, target, min_chunks=1 << 30, work=work)


def vectorize_inner(sch: Any, target: Any, block: Any) -> None:
    """Vectorize the innermost loop of an element-wise block when a vector length divides it
    (splitting a vector loop off a longer one)."""
    loops = sch.get_loops(block)
    if not loops:
        return
    inner = loops[-1]
    if sch.get(inner).kind != tir.ForKind.SERIAL:
        return
    extent = loop_extent(sch, inner)
    factor = vector_factor(target, sch.get(block).writes[0].buffer.dtype, extent)
    if factor is None:
        return
    if factor == extent:
        sch.vectorize(inner)
    else:
        _, vi = sch.split(inner, factors=[None, factor])
        sch.vectorize(vi)


def _tile_loops(sch: Any, block: Any, io: Any) -> list[Any]:
    """The loops of ``block`` below the row-block loop ``io`` (those of one tile)."""
    loops = sch.get_loops(block)
    io_node = sch.get(io)
    for n, lp in enumerate(loops):
        if sch.get(lp) is io_node:
            return loops[n + 1:]
    return []


#: Fewest vector accumulators a register tile needs to keep both FMA pipes busy (an FMA takes
#: 4 cycles and two start per cycle, Zen 3 and Intel cores alike). Smaller tiles -- a
#: convolution row's tail, a GEMM tile of one row -- run several at once, jammed (``JAM_TAILS``).
TILE_MIN_ACCUMULATORS = 8


def tiles_to_fill(accumulators: int) -> int | None:
    """How many tiles of ``accumulators`` vector accumulators to run at once to have
    :data:`TILE_MIN_ACCUMULATORS`; None when one is enough."""
    if accumulators >= TILE_MIN_ACCUMULATORS:
        return None
    return -(-TILE_MIN_ACCUMULATORS // accumulators)


def write_out_tile(sch: Any, target: Any, block: Any, io: Any, dtype: Any) -> None:
    """Unroll the loops of a tile-sized block (the tile's init or write-back) and vectorize
    its innermost loop in register-sized pieces: with every index constant the C compiler can
    keep the tile in registers."""
    loops = _tile_loops(sch, block, io)
    if not loops:
        return
    *outer, inner = loops
    ext = loop_extent(sch, inner)
    lanes = target.vector_lanes(dtype)
    if ext is not None and lanes > 1 and ext % lanes == 0:
        if ext > lanes:
            lo, inner = sch.split(inner, factors=[None, lanes])
            outer.append(lo)
        sch.vectorize(inner)
    for lp in outer:
        if loop_extent(sch, lp) is not None:
            sch.unroll(lp)


def other_blocks(sch: Any, known: set[str]) -> list[str]:
    """Names of the top-level blocks not in ``known`` (call before scheduling: primitives such
    as decompose_reduction add blocks of their own)."""
    names = [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_block("root"))]
    return [n for n in names if n not in known]


def schedule_epilogue(sch: Any, target: Any, names: list[str], at: Any | None) -> None:
    """Schedule the blocks ``names`` that an op's schedule did not handle itself.

    After fusion an op's PrimFunc also holds the element-wise consumers merged into it (a bias
    add, an activation). Each is computed under ``at`` (the op's parallel loop, so it reads the
    tile while it is in cache) with its inner loop vectorized; a block that cannot move there
    gets the generic injective schedule, and stray reductions the generic reduction schedule.
    """
    from ..ir.errors import ScheduleError
    from .schedule_helpers import schedule_injective, schedule_reduction

    for name in names:
        b = sch.get_block(name)
        blk = sch.get(b)
        if any(iv.iter_type == tir.IterType.COMM_REDUCE for iv in blk.iter_vars):
            schedule_reduction(sch, target, b)
            continue
        if at is not None:
            try:
                sch.reverse_compute_at(b, at)
            except ScheduleError:
                pass
            else:
                vectorize_inner(sch, target, b)
                continue
        schedule_injective(sch, target, b)
