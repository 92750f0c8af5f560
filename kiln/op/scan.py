"""Scans: ``cumsum`` and ``cumprod`` (numpy semantics, plus ONNX CumSum's exclusive/reverse).

``cumsum(x, axis=None, dtype=None, exclusive=False, reverse=False)``:

- ``axis``: the axis to scan along; ``None`` scans the flattened tensor (row-major) and the
  result is 1-D, as ``numpy.cumsum`` does;
- ``dtype``: the result (and accumulation) dtype; ``None`` keeps the input dtype, except that a
  bool input counts in ``int64`` (like kiln's ``sum``; numpy would also widen small integers to
  int64, ONNX keeps them — kiln keeps them, pass ``dtype`` to widen);
- ``exclusive``: element ``i`` combines the elements *before* ``i`` (the first is 0 for
  cumsum, 1 for cumprod);
- ``reverse``: scan from the end of the axis towards the start.

float16/bfloat16 results accumulate in float32 and round each element once.

Why the scan is written in TIR instead of ``te.compute``: a tensor expression describes each
output element independently, so a scan would be ``y[i] = sum(x[k] for k <= i)`` — a reduction
per element, O(n²) work along the axis. A scan's natural form is a sequential loop carrying an
accumulator, O(n). The op therefore declares ``legalize`` (not ``compute``): it builds the block
TIR directly — one block per scan line, iterating over the non-scanned axes (spatial, so the
schedule can fuse and parallelize them), whose body is the serial loop along the axis with a
one-element ``local`` accumulator. The CPU schedule (``kiln/schedule/cpu/scan.py``) fuses the
outer loops into one parallel loop when there is enough work. Lines are independent, so
threads never share an accumulator.

Gradients (one declaration each, ``gradient=``): cumsum's is a cumsum of the output gradient
in the opposite direction; cumprod's handles zeros in the input exactly (see
:func:`_cumprod_grad`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..graph import shape_utils
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError, StructInfoError
from ..tir import expr as tx
from .common import arg_ndim, arg_shape, as_dim, kernel_dims, scalar, shape_of, tensor_sinfo
from .elementwise import cast_to, divide, equal, logical_and, multiply, where
from .registry import MixedPrecision, OpPattern, get_op_def, register_op
from .shape import reshape

__all__ = ["cumprod", "cumsum"]

INDEX = DataType("int64")


# ---- attributes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ScanAttrs:
    """``axis`` (int or None: flattened), ``dtype`` (result dtype or None), ``exclusive``,
    ``reverse`` (see the module docstring)."""

    axis: int | None = None
    dtype: str | None = None
    exclusive: bool = False
    reverse: bool = False

    def __post_init__(self):
        if self.axis is not None and (isinstance(self.axis, bool)
                                      or not isinstance(self.axis, int)):
            raise KilnError(f"cumsum/cumprod: axis must be an int or None, got {self.axis!r}")
        if self.dtype is not None:
            try:
                dt = as_dtype(self.dtype)
            except (DTypeError, TypeError, ValueError) as err:
                raise KilnError(f"cumsum/cumprod: bad dtype {self.dtype!r}: {err}") from err
            if dt.lanes != 1 or dt.is_handle or dt.is_bool:
                raise KilnError(f"cumsum/cumprod: dtype must be a numeric scalar type, got {dt}")
            object.__setattr__(self, "dtype", str(dt))
        for flag in ("exclusive", "reverse"):
            value = getattr(self, flag)
            if not isinstance(value, bool):
                raise KilnError(f"cumsum/cumprod: {flag} must be a bool, got {value!r}")


def result_dtype(x_dtype: Any, attrs: ScanAttrs) -> DataType:
    """The output dtype: ``attrs.dtype``, else the input's (bool counts in int64)."""
    if attrs.dtype is not None:
        return as_dtype(attrs.dtype)
    dt = as_dtype(x_dtype)
    return INDEX if dt.is_bool else dt


def _accumulator(dtype: DataType) -> DataType:
    return DataType("float32") if dtype.is_float and dtype.bits < 32 else dtype


# ---- StructInfo inference -----------------------------------------------------------------
def _make_infer(op: str) -> Callable[[Any], Any]:
    def infer(call: Any) -> Any:
        x = shape_utils.tensor_sinfo(call, 0)
        attrs = call.attrs or ScanAttrs()
        if as_dtype(x.dtype).is_handle:
            raise StructInfoError(f"{op}: x must be a tensor of numbers, got dtype {x.dtype}")
        dtype = result_dtype(x.dtype, attrs)
        shape, ndim = arg_shape(x), arg_ndim(x)
        if attrs.axis is None:  # flattened: a 1-D result
            return tensor_sinfo(None if shape is None else (shape_utils.prod(shape),), dtype,
                                ndim=1)
        if ndim >= 0:
            shape_utils.normalize_axis(attrs.axis, ndim, op)
        return tensor_sinfo(shape, dtype, ndim=ndim)

    return infer


# ---- the scan as block TIR ----------------------------------------------------------------
def _unravel(flat: tir.PrimExpr, shape: Sequence[tir.PrimExpr]) -> list[tir.PrimExpr]:
    """Row-major indices of position ``flat`` in a tensor of ``shape``."""
    idx: list[tir.PrimExpr] = []
    for d in reversed(shape[1:]):
        idx.append(tx.floormod(flat, d))
        flat = tx.floordiv(flat, d)
    idx.append(flat)
    return idx[::-1]


def scan_prim_func(
    shape: Sequence[Any], in_dtype: Any, attrs: ScanAttrs, combine: Callable[..., Any],
    identity: float, name: str,
) -> tir.PrimFunc:
    """The PrimFunc ``(X, Y)`` scanning ``X`` of ``shape`` with ``combine`` (see module doc).

    Symbolic dimensions must be plain ``tir.Var``\\ s (they are bound from the arguments).
    """
    shape = tuple(as_dim(d) for d in shape)
    out_dtype = result_dtype(in_dtype, attrs)
    acc_dtype = _accumulator(out_dtype)
    x = tir.decl_buffer(shape, in_dtype, "X")
    if attrs.axis is None:
        total = shape_utils.prod(shape)
        y = tir.decl_buffer((total,), out_dtype, "Y")
        spatial: list[int] = []
        n = total
    else:
        axis = shape_utils.normalize_axis(attrs.axis, len(shape), name)
        y = tir.decl_buffer(shape, out_dtype, "Y")
        spatial = [d for d in range(len(shape)) if d != axis]
        n = shape[axis]

    loop_vars = [tir.Var(f"i{d}", INDEX) for d in spatial]
    iter_vars = [tx.IterVar(tx.Range(tx.const(INDEX, 0), shape[d]), tir.Var(f"v{d}", INDEX),
                            tx.IterType.DATA_PAR) for d in spatial]
    k = tir.Var("k", INDEX)
    pos = (n - 1 - k) if attrs.reverse else k

    def index(p: tir.PrimExpr) -> tuple[list[tir.PrimExpr], list[tir.PrimExpr]]:
        """(X indices, Y indices) of element ``p`` of the current scan line."""
        if attrs.axis is None:
            return _unravel(p, shape), [p]
        it = iter(iv.var for iv in iter_vars)
        full = [p if d == axis else next(it) for d in range(len(shape))]
        return full, full

    def region(buf: tir.Buffer) -> tir.BufferRegion:
        if attrs.axis is None:
            return buf.full_region()
        it = iter(iv.var for iv in iter_vars)
        ranges = [tx.Range(tx.const(INDEX, 0), shape[d]) if d == axis
                  else tx.Range(next(it), tx.const(INDEX, 1)) for d in range(len(shape))]
        return tir.BufferRegion(buf, tuple(ranges))

    acc = tir.decl_buffer((1,), acc_dtype, "acc", scope="local")
    zero = tx.const(INDEX, 0)
    xi, yi = index(pos)
    value = tx.cast(acc_dtype, x.load(xi))
    update = tir.BufferStore(acc, combine(acc[zero], value), (zero,))
    emit = tir.BufferStore(y, tx.cast(out_dtype, acc[zero]), tuple(yi))
    step = tir.seq(emit, update) if attrs.exclusive else tir.seq(update, emit)
    body = tir.seq(
        tir.BufferStore(acc, tx.const(acc_dtype, identity), (zero,)),
        tir.For(k, zero, n, tir.ForKind.SERIAL, step),
    )
    block = tir.Block(tuple(iter_vars), (region(x),), (region(y),), name, body,
                      alloc_buffers=(acc,))
    stmt: tir.Stmt = tir.BlockRealize(tuple(loop_vars), tir.true_predicate(), block)
    for lv, iv in reversed(list(zip(loop_vars, iter_vars))):
        stmt = tir.For(lv, iv.dom.min, iv.dom.extent, tir.ForKind.SERIAL, stmt)
    root = tir.Block((), (), (), "root", stmt)
    params = (tir.Var("X", "handle"), tir.Var("Y", "handle"))
    return tir.PrimFunc(params, {params[0]: x, params[1]: y},
                        tir.BlockRealize((), tir.true_predicate(), root),
                        {"global_symbol": name, "num_outputs": 1})


def _make_legalize(op: str, combine: Callable[..., Any], identity: float) -> Callable:
    def legalize(bb: Any, call: Any) -> Any:
        x = call.args[0].struct_info
        if getattr(x, "shape", None) is None:
            raise StructInfoError(f"LegalizeOps: {op} needs an input of known rank, got {x}")
        attrs = call.attrs or ScanAttrs()
        func = scan_prim_func(kernel_dims(x.shape), x.dtype, attrs, combine, identity, op)
        pattern = int(get_op_def(op).pattern)
        func = func.with_attr("op_name", op).with_attr("op_pattern", pattern)
        gvar = bb.add_func(func, op)
        return gx.call_tir(gvar, [call.args[0]], call.struct_info)

    return legalize


# ---- gradients ----------------------------------------------------------------------------
def _cumsum_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """``dx[k]`` sums ``g[i]`` over every ``i`` whose scan includes ``k``: the same scan of
    ``g`` run in the opposite direction (exclusive stays exclusive)."""
    x = call.args[0]
    if not as_dtype(x.struct_info.dtype).is_float:
        return [None]
    attrs = call.attrs or ScanAttrs()
    g = cast_to(output_grad, x.struct_info.dtype, call.struct_info.dtype)
    axis = 0 if attrs.axis is None else attrs.axis  # the flattened form scans a 1-D view
    dx = cumsum(g, axis=axis, exclusive=attrs.exclusive, reverse=not attrs.reverse)
    return [reshape(dx, shape_of(x)) if attrs.axis is None else dx]


def _cumprod_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """Gradient of ``y = cumprod(x)``, exact when ``x`` has zeros.

    ``dx[k] = sum_{i covers k} g[i] * prod_{j covered by i, j != k} x[j]``. Along one line
    (in scan order), let ``z`` be the first zero of ``x``:

    - before ``z`` (``x[k] != 0``): ``dx[k] = rcumsum(g * y)[k] / x[k]`` — ``rcumsum`` is the
      cumsum in the opposite direction (exclusive when the op is);
    - at ``z``: ``dx[z] = rcumsum(g * y1)[z]`` with ``y1 = cumprod(x with x[z] set to 1)``:
      every product that contains ``x[z]``, without it;
    - after ``z``: 0 (every product there contains the zero ``x[z]``).

    Zeros are located with an inclusive cumsum of ``x == 0`` in scan order (count 0: before
    ``z``; count 1 at a zero: ``z``). All of it is O(n) scans and element-wise ops.
    """
    x = call.args[0]
    dt = x.struct_info.dtype
    if not as_dtype(dt).is_float:
        return [None]
    attrs = call.attrs or ScanAttrs()
    flat = attrs.axis is None
    if flat:  # work on the 1-D view the op scanned
        x = bb.emit(reshape(x, (-1,)))
    g = cast_to(output_grad, dt, call.struct_info.dtype)
    y = cast_to(call, dt, call.struct_info.dtype)  # the forward result (not recomputed)
    scan = {"axis": 0 if flat else attrs.axis, "reverse": attrs.reverse}
    back = {**scan, "exclusive": attrs.exclusive, "reverse": not attrs.reverse}
    one, zero = scalar(1, dt), scalar(0, dt)
    is_zero = bb.emit(equal(x, zero))
    count = bb.emit(cumsum(is_zero, **scan))  # zeros up to here (int64, inclusive)
    before = bb.emit(equal(count, scalar(0, "int64")))
    first = bb.emit(logical_and(is_zero, equal(count, scalar(1, "int64"))))
    part = divide(cumsum(multiply(g, y), **back), where(before, x, one))
    y1 = cumprod(where(first, one, x), exclusive=attrs.exclusive, **scan)
    at_zero = cumsum(multiply(g, y1), **back)
    dx = where(before, part, where(first, at_zero, zero))
    return [reshape(dx, shape_of(call.args[0])) if flat else dx]


# ---- declarations -------------------------------------------------------------------------
cumsum = register_op(
    "cumsum",
    inputs=("x",),
    attrs=ScanAttrs,
    infer=_make_infer("cumsum"),
    pattern=OpPattern.OPAQUE,
    legalize=_make_legalize("cumsum", lambda a, b: a + b, 0),
    mixed_precision=MixedPrecision.NEVER,
    gradient=_cumsum_grad,
    doc="Cumulative sum along ``axis`` (None: of the flattened tensor).",
)

cumprod = register_op(
    "cumprod",
    inputs=("x",),
    attrs=ScanAttrs,
    infer=_make_infer("cumprod"),
    pattern=OpPattern.OPAQUE,
    legalize=_make_legalize("cumprod", lambda a, b: a * b, 1),
    mixed_precision=MixedPrecision.NEVER,
    gradient=_cumprod_grad,
    doc="Cumulative product along ``axis`` (None: of the flattened tensor).",
)
