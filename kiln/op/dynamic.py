"""Operators whose output shapes are only known at run time.

Their output shape is an attribute of symbolic dimensions that a ``match_cast`` of a host shape
function's result binds (see ``kiln.runtime.shape_funcs``); the shape function validates the
run-time values (element counts, broadcasting), so unlike ``reshape`` these ops do not ask for
shapes that are provably compatible at compile time. Values the kernel needs beyond the shape
(a slice's starts and steps, pads, a range's start and delta) are small int64 tensor inputs read
by the kernel: kernels bind symbolic dims only from their tensor arguments' shapes.

They are INJECTIVE with the shared injective schedule, except ``dynamic_col2im`` (a sum over
the block offsets: OPAQUE, reduction schedule). They carry no gradient rule: they appear
where an imported model computes shapes at run time (inference graphs); a gradient through them
would need its own run-time shape steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import te
from ..graph import expr as gx
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import buffer as tir_buffer
from ..tir import expr as tx
from ..tir import functor as tir_functor
from ..tir.expr import PrimExpr
from .common import (
    INDEX_DTYPE,
    arg_shape,
    as_dim,
    shape_attr_value,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .registry import NON_DIFFERENTIABLE, MixedPrecision, OpDef, OpPattern, register_op
from .shape import ravel, unravel

__all__ = [
    "dynamic_reshape", "dynamic_arange", "dynamic_strided_slice", "dynamic_pad", "dynamic_nonzero",
    "dynamic_shape_of", "dynamic_col2im",
]


def _c(v: int) -> PrimExpr:
    return tx.const(INDEX_DTYPE, v)


def _declare(name: str, inputs: tuple[str, ...], infer: Any, compute: Any, attrs: type,
             doc: str) -> OpDef:
    return register_op(
        name, inputs=inputs, infer=infer, pattern=OpPattern.INJECTIVE, attrs=attrs,
        compute=compute,
        mixed_precision=MixedPrecision.FOLLOW, gradient=NON_DIFFERENTIABLE, doc=doc,
    )


def _int_tensor(call: Any, index: int, op: str, arg: str, length: int | None) -> None:
    """Check that argument ``index`` is a 1-d int64 tensor (of ``length`` when given)."""
    s = tensor_arg(call, index, op, arg)
    shape = arg_shape(s)
    if s.dtype != "int64" or shape is None or len(shape) != 1:
        raise StructInfoError(f"{op}: {arg} must be a 1-d int64 tensor, got {s}")
    if length is not None and not (isinstance(shape[0], tx.IntImm) and shape[0].value == length):
        raise StructInfoError(f"{op}: {arg} must have {length} entries, got {s}")


def _out_shape(attrs: Any) -> tuple[PrimExpr, ...]:
    return tuple(as_dim(d) for d in attrs.shape)


# =============================================================================================
# dynamic_reshape
# =============================================================================================
@dataclass(frozen=True)
class DynamicShapeAttrs:
    """``shape``: the output shape (ints or int64 PrimExprs, usually fresh symbolic dims)."""

    shape: tuple[Any, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "dynamic op"))


def _reshape_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "dynamic_reshape", "x")
    return tensor_sinfo(_out_shape(call.attrs), x.dtype)


def _reshape_compute(x: te.Tensor, attrs: DynamicShapeAttrs) -> te.Tensor:
    out = _out_shape(attrs)

    def body(*i: PrimExpr) -> PrimExpr:
        if not x.ndim:
            return x()
        return x(*unravel(simplify(ravel(i, out)), x.shape))

    return te.compute(out, body, name="dynamic_reshape")


dynamic_reshape = _declare(
    "dynamic_reshape", ("x",), _reshape_infer, _reshape_compute, DynamicShapeAttrs,
    "Row-major reshape to a shape bound at run time (the element count is checked by the shape "
    "function that binds it).",
)


# =============================================================================================
# dynamic_arange
# =============================================================================================
def _arange_infer(call: Any) -> Any:
    start = tensor_arg(call, 0, "dynamic_arange", "start")
    delta = tensor_arg(call, 1, "dynamic_arange", "delta")
    if start.dtype != delta.dtype or start.ndim != 0 or delta.ndim != 0:
        raise StructInfoError(f"dynamic_arange: start and delta must be scalars of one dtype, "
                              f"got {start} and {delta}")
    shape = _out_shape(call.attrs)
    if len(shape) != 1:
        raise StructInfoError(f"dynamic_arange: the shape must have one dim, got {shape}")
    return tensor_sinfo(shape, start.dtype)


def _arange_compute(start: te.Tensor, delta: te.Tensor, attrs: DynamicShapeAttrs) -> te.Tensor:
    dt = as_dtype(start.dtype)
    return te.compute(_out_shape(attrs), lambda i: start() + tx.cast(dt, i) * delta(),
                      name="dynamic_arange")


dynamic_arange = _declare(
    "dynamic_arange", ("start", "delta"), _arange_infer, _arange_compute, DynamicShapeAttrs,
    "``start + i * delta`` for ``i`` in ``[0, shape[0])`` (ONNX Range; the length is bound at "
    "run time).",
)


# =============================================================================================
# dynamic_strided_slice
# =============================================================================================
@dataclass(frozen=True)
class DynamicSliceAttrs:
    """``axes``: the sliced axes (normalized); ``shape``: the output shape."""

    axes: tuple[int, ...]
    shape: tuple[Any, ...]

    def __post_init__(self):
        axes = tuple(self.axes)
        if any(isinstance(a, bool) or not isinstance(a, int) or a < 0 for a in axes):
            raise KilnError(f"dynamic_strided_slice: axes must be non-negative ints, got {axes}")
        object.__setattr__(self, "axes", axes)
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "dynamic_strided_slice"))


def _slice_infer(call: Any) -> Any:
    op = "dynamic_strided_slice"
    x = tensor_arg(call, 0, op, "x")
    n = len(call.attrs.axes)
    _int_tensor(call, 1, op, "starts", n)
    _int_tensor(call, 2, op, "steps", n)
    shape = _out_shape(call.attrs)
    if x.ndim >= 0 and (x.ndim != len(shape) or any(a >= x.ndim for a in call.attrs.axes)):
        raise StructInfoError(f"{op}: axes {call.attrs.axes} / shape {shape} do not fit {x}")
    return tensor_sinfo(shape, x.dtype)


def _clip(v: PrimExpr, lo: PrimExpr, hi: PrimExpr) -> PrimExpr:
    return tx.min(tx.max(v, lo), hi)


def _slice_compute(x: te.Tensor, starts: te.Tensor, steps: te.Tensor,
                   attrs: DynamicSliceAttrs) -> te.Tensor:
    where = {a: k for k, a in enumerate(attrs.axes)}

    def body(*i: PrimExpr) -> PrimExpr:
        idx = []
        for a, ia in enumerate(i):
            if a not in where:
                idx.append(ia)
                continue
            k, dim = _c(where[a]), x.shape[a]
            st, sp = starts(k), steps(k)
            # ONNX start normalization (the same as kiln.runtime.shape_funcs.slice_bounds)
            st = tx.select(st < _c(0), st + dim, st)
            st = tx.select(sp > _c(0), _clip(st, _c(0), dim), _clip(st, _c(0), dim - _c(1)))
            idx.append(st + ia * sp)
        return x(*idx)

    return te.compute(_out_shape(attrs), body, name="dynamic_strided_slice")


dynamic_strided_slice = _declare(
    "dynamic_strided_slice", ("x", "starts", "steps"), _slice_infer, _slice_compute,
    DynamicSliceAttrs,
    "ONNX Slice with starts/steps known at run time (int64 tensors, one entry per axis of "
    "``axes``); the output shape is bound at run time.",
)


# =============================================================================================
# dynamic_pad
# =============================================================================================
@dataclass(frozen=True)
class DynamicPadAttrs:
    """``axes``: padded axes; ``shape``: output shape; ``mode``: constant, edge, reflect or
    wrap."""

    axes: tuple[int, ...]
    shape: tuple[Any, ...]
    mode: str = "constant"

    def __post_init__(self):
        object.__setattr__(self, "axes", tuple(int(a) for a in self.axes))
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "dynamic_pad"))
        if self.mode not in ("constant", "edge", "reflect", "wrap"):
            raise KilnError(f"dynamic_pad: mode must be 'constant', 'edge', 'reflect' or "
                            f"'wrap', got {self.mode!r}")


def _pad_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "dynamic_pad", "x")
    _int_tensor(call, 1, "dynamic_pad", "pads", 2 * len(call.attrs.axes))
    value = tensor_arg(call, 2, "dynamic_pad", "value")
    if value.dtype != x.dtype or value.ndim != 0:
        raise StructInfoError(f"dynamic_pad: value must be a scalar of {x.dtype}, got {value}")
    shape = _out_shape(call.attrs)
    if x.ndim >= 0 and x.ndim != len(shape):
        raise StructInfoError(f"dynamic_pad: shape {shape} does not fit {x}")
    return tensor_sinfo(shape, x.dtype)


def _pad_compute(x: te.Tensor, pads: te.Tensor, value: te.Tensor,
                 attrs: DynamicPadAttrs) -> te.Tensor:
    where = {a: k for k, a in enumerate(attrs.axes)}

    def body(*i: PrimExpr) -> PrimExpr:
        idx, conds = [], []
        for a, ia in enumerate(i):
            if a not in where:
                idx.append(ia)
                continue
            dim = x.shape[a]
            m = ia - pads(_c(where[a]))
            if attrs.mode == "constant":
                idx.append(_clip(m, _c(0), dim - _c(1)))
                conds += [m >= _c(0), m < dim]
                continue
            if attrs.mode == "reflect":
                period = tx.max(_c(2) * (dim - _c(1)), _c(1))
                r = tx.floormod(m, period)
                src = tx.select(r < dim, r, period - r)
            elif attrs.mode == "wrap":  # numpy 'wrap': the axis repeats periodically
                src = tx.floormod(m, tx.max(dim, _c(1)))
            else:
                src = _clip(m, _c(0), dim - _c(1))
            # in range whenever the axis has an element; an empty one has no edge to copy
            # (onnxruntime refuses it; the read was out of bounds, fuzz seed 3032582)
            idx.append(tx.check_index(src, dim, f"dynamic_pad: mode {attrs.mode!r} extends "
                                      f"axis {a}, which is empty", allow_negative=False))
        inside = x(*idx)
        if not conds:
            return inside
        return tx.select(tx.all_of(conds), inside, value())

    return te.compute(_out_shape(attrs), body, name="dynamic_pad")


dynamic_pad = _declare(
    "dynamic_pad", ("x", "pads", "value"), _pad_infer, _pad_compute, DynamicPadAttrs,
    "ONNX Pad with pads (an int64 tensor: begins then ends of ``axes``; negative pads crop) and "
    "the constant ``value`` (a scalar tensor) known at run time; the output shape is bound at "
    "run time.",
)


# =============================================================================================
# dynamic_nonzero
# =============================================================================================
def _nonzero_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "dynamic_nonzero", "x")
    _int_tensor(call, 1, "dynamic_nonzero", "counts", None)
    shape = _out_shape(call.attrs)
    if len(shape) != 2 or (x.ndim >= 0 and not (isinstance(shape[0], tx.IntImm)
                                                and shape[0].value == x.ndim)):
        raise StructInfoError(f"dynamic_nonzero: shape {shape} must be (ndim, count) of {x}")
    return tensor_sinfo(shape, "int64")


def lower_bound(sorted_t: te.Tensor, target: PrimExpr, size: PrimExpr) -> PrimExpr:
    """First ``p`` in ``[0, size)`` with ``sorted_t[p] >= target`` (``size`` if none): a binary
    search unrolled into a chain of ``Let``\\ s (one step per bit of ``size``)."""
    steps = 64
    if isinstance(size, tx.IntImm):
        steps = max(int(size.value), 1).bit_length() + 1
    lo: PrimExpr = _c(0)
    hi: PrimExpr = size
    lets: list[tuple[tx.Var, PrimExpr]] = []
    for k in range(steps):
        mid = (lo + hi) // _c(2)
        go_left = tx.all_of([lo < hi, sorted_t(tx.min(mid, size - _c(1))) >= target])
        stay = lo >= hi
        lo_v, hi_v = tx.Var(f"lo{k}", "int64"), tx.Var(f"hi{k}", "int64")
        lets.append((lo_v, tx.select(tx.any_of([go_left, stay]), lo, mid + _c(1))))
        lets.append((hi_v, tx.select(go_left, mid, hi)))
        lo, hi = lo_v, hi_v
    out: PrimExpr = lo
    for var, value in reversed(lets):
        out = tx.Let(var, value, out)
    return out


def _nonzero_compute(x: te.Tensor, counts: te.Tensor, attrs: DynamicShapeAttrs) -> te.Tensor:
    size = counts.shape[0]

    def body(d: PrimExpr, j: PrimExpr) -> PrimExpr:
        pos = tx.Var("pos", "int64")
        coords = unravel(pos, x.shape)
        out: PrimExpr = coords[-1]
        for k in range(x.ndim - 2, -1, -1):
            out = tx.select(tx.eq(d, _c(k)), coords[k], out)
        return tx.Let(pos, lower_bound(counts, j + _c(1), size), out)

    return te.compute(_out_shape(attrs), body, name="dynamic_nonzero")


class _FullReads(tir_functor.Mutator):
    """Blocks read whole buffers: the binary search's loads are indexed by ``Let`` variables,
    which a read region (outside the expression) cannot mention."""

    def visit_Block(self, b: Any) -> Any:
        b = self.generic_visit(b)
        bufs = list(dict.fromkeys(r.buffer for r in b.reads))
        return b.replace(reads=tuple(tir_buffer.BufferRegion.full(buf) for buf in bufs))


def _nonzero_legalize(bb: Any, call: Any) -> Any:
    x, counts = (a.struct_info for a in call.args)
    if x.shape is None or counts.shape is None:
        raise StructInfoError(f"LegalizeOps: dynamic_nonzero needs inputs of known shape, got "
                              f"{x} and {counts}")
    tx_, tc = te.placeholder(x.shape, x.dtype, "A"), te.placeholder(counts.shape, "int64", "B")
    func = te.create_prim_func([tx_, tc, _nonzero_compute(tx_, tc, call.attrs)])
    func = func.replace(body=_FullReads().visit(func.body))
    func = func.with_attr("op_name", "dynamic_nonzero").with_attr(
        "op_pattern", int(OpPattern.INJECTIVE))
    return gx.call_tir(bb.add_func(func, "dynamic_nonzero"), list(call.args), call.struct_info)


dynamic_nonzero = register_op(
    "dynamic_nonzero", inputs=("x", "counts"), infer=_nonzero_infer,
    pattern=OpPattern.INJECTIVE, attrs=DynamicShapeAttrs, legalize=_nonzero_legalize,
    mixed_precision=MixedPrecision.NEVER,
    gradient=NON_DIFFERENTIABLE,
    doc="Coordinates (ndim, count) of the nonzero elements of ``x`` in row-major order, given "
    "``counts``: the inclusive cumsum of the flattened nonzero mask (each output looks its "
    "element up by binary search; ``count`` is bound at run time from the last count).",
)


# =============================================================================================
# dynamic_shape_of
# =============================================================================================
def _shape_of_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "dynamic_shape_of", "x")
    if x.ndim < 0:
        raise StructInfoError(f"dynamic_shape_of: the input rank must be known, got {x}")
    return tensor_sinfo((x.ndim,), "int64")


def _shape_of_compute(x: te.Tensor, attrs: Any = None) -> te.Tensor:
    def body(i: PrimExpr) -> PrimExpr:
        if not x.ndim:
            return _c(0)
        out: PrimExpr = x.shape[-1]
        for k in range(x.ndim - 2, -1, -1):
            out = tx.select(tx.eq(i, _c(k)), x.shape[k], out)
        return out

    return te.compute((x.ndim,), body, name="dynamic_shape_of")


dynamic_shape_of = register_op(
    "dynamic_shape_of", inputs=("x",), infer=_shape_of_infer, pattern=OpPattern.INJECTIVE,
    compute=_shape_of_compute,
    mixed_precision=MixedPrecision.NEVER, gradient=NON_DIFFERENTIABLE,
    doc="The shape of ``x`` as an int64 tensor, read from the (symbolic) dims the kernel binds "
    "from its argument (ONNX Shape of a tensor whose shape is known only at run time).",
)


# =============================================================================================
# dynamic_col2im
# =============================================================================================
@dataclass(frozen=True)
class DynamicCol2ImAttrs:
    """``shape``: the output (N, C, *image) (symbolic dims bound at run time); ``strides``,
    ``dilations``: one per spatial axis; ``pads``: begins then ends."""

    shape: tuple[Any, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "dynamic_col2im"))
        nsp = len(self.shape) - 2
        for name in ("strides", "dilations", "pads"):
            v = tuple(int(a) for a in getattr(self, name))
            want = 2 * nsp if name == "pads" else nsp
            if len(v) != want or any(a < (0 if name == "pads" else 1) for a in v):
                raise KilnError(f"dynamic_col2im: {name} must be {want} "
                                f"{'non-negative' if name == 'pads' else 'positive'} ints, "
                                f"got {v}")
            object.__setattr__(self, name, v)


def _col2im_infer(call: Any) -> Any:
    op = "dynamic_col2im"
    x = tensor_arg(call, 0, op, "x")
    shape = _out_shape(call.attrs)
    nsp = len(shape) - 2
    _int_tensor(call, 1, op, "image_shape", nsp)
    _int_tensor(call, 2, op, "block_shape", nsp)
    if nsp < 1 or (x.ndim >= 0 and x.ndim != 3):
        raise StructInfoError(f"{op}: x must be (N, C*K, L) and the output (N, C, ...), got "
                              f"{x} and {shape}")
    return tensor_sinfo(shape, x.dtype)


def _col2im_compute(x: te.Tensor, image: te.Tensor, block: te.Tensor,
                    attrs: DynamicCol2ImAttrs) -> te.Tensor:
    out = _out_shape(attrs)
    nsp = len(out) - 2
    ck, length = x.shape[1], x.shape[2]
    kk = tx.floordiv(ck, tx.max(out[1], _c(1)))  # K = prod(block): C*K channels hold C
    k = te.reduce_axis((0, kk), name="k")

    def body(n: PrimExpr, c: PrimExpr, *p: PrimExpr) -> PrimExpr:
        conds: list[PrimExpr] = []
        flat: PrimExpr = _c(0)
        for i in range(nsp):
            b = block(_c(i))
            inner: PrimExpr = _c(1)
            for j in range(i + 1, nsp):
                inner = inner * block(_c(j))
            ki = tx.floormod(tx.floordiv(k, inner), b)
            stride, dil = _c(attrs.strides[i]), _c(attrs.dilations[i])
            lo, hi = attrs.pads[i], attrs.pads[nsp + i]
            count = tx.floordiv(image(_c(i)) + _c(lo + hi) - (b - _c(1)) * dil - _c(1),
                                stride) + _c(1)
            q = p[i] + _c(lo) - ki * dil
            pos = tx.floordiv(q, stride)
            conds += [q >= _c(0), tx.eq(tx.floormod(q, stride), _c(0)), pos < count]
            flat = flat * count + pos
        flat = _clip(flat, _c(0), length - _c(1))
        return te.sum(x(n, c * kk + k, flat), axis=k, where=tx.all_of(conds))

    return te.compute(out, body, name="dynamic_col2im")


dynamic_col2im = register_op(
    "dynamic_col2im", inputs=("x", "image_shape", "block_shape"), infer=_col2im_infer,
    pattern=OpPattern.OPAQUE, attrs=DynamicCol2ImAttrs, compute=_col2im_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=NON_DIFFERENTIABLE,
    doc="ONNX Col2Im with image_shape and block_shape known only at run time (int64 tensors; "
    "the output dims are bound by the ``col2im`` shape function): each output element sums "
    "the column entries of the blocks that cover it (the block offset ``k`` of each column "
    "channel ``c*K + k`` decoded row-major over the block shape).",
)
