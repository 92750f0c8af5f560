"""Shape operators: reshape, transpose, concat, split, squeeze, expand_dims, broadcast_to,
strided_slice, take, pad (numpy semantics).

All are INJECTIVE (each output element reads one input element, or a pad value), follow their
input's precision under ToMixedPrecision, and get the shared injective CPU schedule. Shapes may be
symbolic: dimensions are int64 PrimExprs and every derived dimension is simplified with
``kiln.arith``; where numpy would check a size at run time (e.g. a reshape's element count) the
check is done at inference and must be provable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import te
from ..graph.expr import Tuple, TupleGetItem
from ..graph.struct_info import TensorStructInfo, TupleStructInfo, shapes_equal
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..tir import expr as tx
from ..tir.expr import PrimExpr
from .common import (
    arg_ndim,
    arg_shape,
    as_dim,
    assume,
    broadcast_assumptions,
    broadcast_load,
    clamp_between,
    const_int,
    declare_injective,
    dims_equal,
    dims_sum,
    equal_dims,
    fmt_shape,
    index_const,
    int_tuple,
    known_shape,
    normalize_axis,
    reduce_axes,
    shape_attr_value,
    shape_of,
    simplify,
    tensor_arg,
    tensor_sinfo,
)
from .registry import MixedPrecision, OpPattern, register_op

__all__ = [
    "reshape", "transpose", "concat", "split", "squeeze", "expand_dims", "broadcast_to",
    "collapse_sum_like", "collapse_sum_to",
]


def _monomial(dims: Sequence[Any]) -> tuple[int, list[PrimExpr]]:
    """A product of dims as (constant factor, symbolic factors); nested products are flattened."""
    const, syms = 1, []
    stack = list(dims)
    while stack:
        d = stack.pop(0)
        v = const_int(d)
        if v is not None:
            const *= v
        elif isinstance(d, tx.Mul):
            stack[:0] = [d.a, d.b]
        else:
            syms.append(as_dim(d))
    return const, syms


def _build(const: int, syms: Sequence[PrimExpr]) -> PrimExpr:
    expr: PrimExpr | None = None
    for s in syms:
        expr = s if expr is None else expr * s
    if expr is None or const == 0:
        return index_const(const)
    return expr if const == 1 else expr * index_const(const)


def dims_product(dims: Sequence[Any]) -> PrimExpr:
    """Product of dims with the constant factors folded (``n * 32`` rather than ``n * 4 * 8``)."""
    return simplify(_build(*_monomial(dims)))


def _remove_factors(syms: Sequence[PrimExpr], drop: Sequence[PrimExpr]) -> list[PrimExpr] | None:
    """``syms`` minus the multiset ``drop`` (provably equal factors); None if one is missing."""
    rest = list(syms)
    for d in drop:
        for k, s in enumerate(rest):
            if dims_equal(s, d):
                del rest[k]
                break
        else:
            return None
    return rest


def _exact_quotient(num: Sequence[Any], den: Sequence[Any]) -> PrimExpr | None:
    """prod(num) / prod(den) when it provably divides exactly, else None."""
    cn, sn = _monomial(num)
    cd, sd = _monomial(den)
    if cd != 0 and cn % cd == 0:
        rest = _remove_factors(sn, sd)
        if rest is not None:
            return simplify(_build(cn // cd, rest))
    total, known = _build(cn, sn), _build(cd, sd)
    if cd == 0 or not (sn or sd):
        return None
    q = simplify(tx.floordiv(total, known))
    return q if dims_equal(simplify(q * known), total) else None


def _products_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    ca, sa = _monomial(a)
    cb, sb = _monomial(b)
    if ca == cb and len(sa) == len(sb) and _remove_factors(sa, sb) == []:
        return True
    if ca == 0 and cb == 0:
        return True
    if not (sa or sb):
        return ca == cb
    return dims_equal(simplify(_build(ca, sa)), simplify(_build(cb, sb)))


# =============================================================================================
# reshape
# =============================================================================================
@dataclass(frozen=True)
class ReshapeAttrs:
    """``shape``: the new shape; one entry may be -1 (inferred). Entries may be PrimExprs.

    As in numpy, 0 is a zero-length dimension (ONNX's "copy this dimension" 0 is resolved by the
    frontend).
    """

    shape: tuple[Any, ...]

    def __post_init__(self):
        shape = tuple(self.shape) if isinstance(self.shape, (list, tuple)) else (self.shape,)
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, (int, PrimExpr)):
                raise KilnError(f"reshape: shape entries must be ints or PrimExprs: {shape!r}")
            if isinstance(d, int) and d < -1:
                raise KilnError(f"reshape: negative dimension {d} in shape {shape!r}")
        if sum(1 for d in shape if isinstance(d, int) and d == -1) > 1:
            raise KilnError(f"reshape: only one dimension may be -1, got {shape!r}")
        object.__setattr__(self, "shape", shape)


def _reshape_target(op: str, in_shape: Sequence[PrimExpr] | None, new: Sequence[Any],
                    check: bool = True) -> tuple[PrimExpr, ...] | None:
    """The new shape with -1 resolved; None when the input shape is unknown and -1 is used.
    ``check=False`` skips proving that the element counts agree (the compute: inference
    proved it on the graph's dims, and a kernel's dims may be LegalizeOps' fresh variables,
    ``(d0, k) -> (b, s, k)``, that no longer show the relation)."""
    infer_at = [k for k, d in enumerate(new) if isinstance(d, int) and d == -1]
    if in_shape is None:
        return None if infer_at else tuple(as_dim(d) for d in new)
    known_dims = [d for k, d in enumerate(new) if k not in infer_at]
    if infer_at:
        dim = _exact_quotient(in_shape, known_dims)
        if dim is None:
            raise StructInfoError(
                f"{op}: cannot reshape {fmt_shape(in_shape)} ({dims_product(in_shape)} elements) "
                f"into {fmt_shape(new)}: the element count is not (provably) a multiple of "
                f"{dims_product(known_dims)}"
            )
        out = [as_dim(d) for d in new]
        out[infer_at[0]] = dim
        return tuple(out)
    out = tuple(as_dim(d) for d in new)
    if check and not _products_equal(out, in_shape):
        raise StructInfoError(
            f"{op}: cannot reshape {fmt_shape(in_shape)} into {fmt_shape(out)}: the element "
            f"counts {dims_product(in_shape)} and {dims_product(out)} differ or are not provably "
            "equal"
        )
    return out


def _reshape_infer(call: Any) -> Any:
    x, shape = known_shape(call, "reshape")
    new = call.attrs.shape
    out = _reshape_target("reshape", shape, new)
    if out is None:
        return tensor_sinfo(None, x.dtype, ndim=len(new))
    return tensor_sinfo(out, x.dtype)


def unravel(flat: PrimExpr, shape: Sequence[PrimExpr]) -> list[PrimExpr]:
    """Row-major multi-index of a flat offset into ``shape``."""
    idx: list[PrimExpr] = []
    for k in range(len(shape) - 1, -1, -1):
        if k == 0:
            idx.append(flat)
        else:
            idx.append(simplify(tx.floormod(flat, shape[k])))
            flat = tx.floordiv(flat, shape[k])
    return [simplify(i) for i in reversed(idx)]


def ravel(index: Sequence[PrimExpr], shape: Sequence[PrimExpr]) -> PrimExpr:
    """Row-major flat offset of a multi-index."""
    flat: PrimExpr = index_const(0)
    for i, d in zip(index, shape):
        flat = flat * d + i
    return flat


def _reshape_groups(ins: Sequence[PrimExpr], outs: Sequence[PrimExpr]
                    ) -> list[tuple[range, range]]:
    """Split a reshape into independent groups of input and output axes with equal sizes.

    Keeping index arithmetic within a group (``(n, 4, 8) -> (n, 32)`` reads ``x[i, j // 8,
    j % 8]``) instead of going through one flat offset keeps indices simple and vectorizable.
    """
    groups: list[tuple[range, range]] = []
    i = j = 0
    while i < len(ins) and j < len(outs):
        ci, cj = const_int(ins[i]), const_int(outs[j])
        if ci == 1 and cj != 1:
            groups.append((range(i, i + 1), range(j, j)))
            i += 1
        elif cj == 1 and ci != 1:
            groups.append((range(i, i), range(j, j + 1)))
            j += 1
        elif dims_equal(ins[i], outs[j]):
            groups.append((range(i, i + 1), range(j, j + 1)))
            i, j = i + 1, j + 1
        else:  # accumulate constant dims on both sides until the sizes meet
            if not ci or not cj:
                break
            i2, j2 = i + 1, j + 1
            while ci != cj:
                side = ins if ci < cj else outs
                k = i2 if ci < cj else j2
                nxt = const_int(side[k]) if k < len(side) else None
                if not nxt:
                    break
                if ci < cj:
                    ci, i2 = ci * nxt, i2 + 1
                else:
                    cj, j2 = cj * nxt, j2 + 1
            if ci != cj:
                break
            groups.append((range(i, i2), range(j, j2)))
            i, j = i2, j2
    if i < len(ins) or j < len(outs):
        groups.append((range(i, len(ins)), range(j, len(outs))))
    return groups


def _reshape_compute(x: te.Tensor, attrs: ReshapeAttrs) -> te.Tensor:
    out = _reshape_target("reshape", x.shape, attrs.shape, check=False)
    groups = _reshape_groups(x.shape, out)

    def body(*i: PrimExpr) -> PrimExpr:
        index: list[PrimExpr] = []
        for gin, gout in groups:
            if len(gin) == 1 and len(gout) == 1:
                index.append(i[gout[0]])
            elif len(gin):
                flat = ravel([i[k] for k in gout], [out[k] for k in gout])
                index += unravel(simplify(flat), [x.shape[k] for k in gin])
        return x(*index)

    return te.compute(out, body, name="reshape")


def _reshape_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [reshape(output_grad, shape_of(call.args[0], "reshape gradient"))]


reshape = declare_injective(
    "reshape", ("x",), _reshape_infer, _reshape_compute, ReshapeAttrs,
    "Reshape to ``shape`` (one -1 is inferred); the element count must be provably equal.",
    gradient=_reshape_grad,
)


# =============================================================================================
# transpose
# =============================================================================================
@dataclass(frozen=True)
class TransposeAttrs:
    """``axes``: the permutation (None reverses the axes)."""

    axes: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.axes is not None:
            object.__setattr__(self, "axes", int_tuple(self.axes, "transpose", "axes"))


def _perm(axes: tuple[int, ...] | None, ndim: int) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim - 1, -1, -1))
    if len(axes) != ndim:
        raise StructInfoError(f"transpose: axes {axes} has {len(axes)} entries for rank {ndim}")
    perm = tuple(normalize_axis(a, ndim, "transpose", "axis") for a in axes)
    if sorted(perm) != list(range(ndim)):
        raise StructInfoError(f"transpose: axes {axes} is not a permutation of 0..{ndim - 1}")
    return perm


def _transpose_infer(call: Any) -> Any:
    x, shape = known_shape(call, "transpose")
    ndim = arg_ndim(x)
    if ndim < 0:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    perm = _perm(call.attrs.axes if call.attrs else None, ndim)
    if shape is None:
        return tensor_sinfo(None, x.dtype, ndim=ndim)
    return tensor_sinfo([shape[p] for p in perm], x.dtype)


def _transpose_compute(x: te.Tensor, attrs: TransposeAttrs | None = None) -> te.Tensor:
    perm = _perm(attrs.axes if attrs else None, x.ndim)
    inv = [perm.index(d) for d in range(x.ndim)]
    return te.compute(
        [x.shape[p] for p in perm], lambda *i: x(*[i[inv[d]] for d in range(x.ndim)]),
        name="transpose",
    )


def _transpose_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """The inverse permutation."""
    perm = _perm(call.attrs.axes if call.attrs else None, arg_ndim(call.args[0].struct_info))
    return [transpose(output_grad, tuple(perm.index(d) for d in range(len(perm))))]


transpose = declare_injective(
    "transpose", ("x",), _transpose_infer, _transpose_compute, TransposeAttrs,
    "Permute axes (numpy ``transpose``; default reverses them).",
    gradient=_transpose_grad,
)


# =============================================================================================
# concat
# =============================================================================================
@dataclass(frozen=True)
class ConcatAttrs:
    axis: int = 0


def _concat_infer(call: Any) -> Any:
    tup = call.args[0].struct_info
    if not isinstance(tup, TupleStructInfo):
        raise StructInfoError(f"concat: tensors must be a tuple of tensors, got {tup}")
    if not tup.fields:
        raise StructInfoError("concat: needs at least one tensor")
    for k, f in enumerate(tup.fields):
        if not isinstance(f, TensorStructInfo):
            raise StructInfoError(f"concat: tensors[{k}] must be a tensor, got {f}")
        if f.dtype != tup.fields[0].dtype:
            raise StructInfoError(
                f"concat: tensors[{k}] has dtype {f.dtype} but tensors[0] has "
                f"{tup.fields[0].dtype}"
            )
    dtype = tup.fields[0].dtype
    ndims = {arg_ndim(f) for f in tup.fields} - {-1}
    if len(ndims) > 1:
        raise StructInfoError(f"concat: tensors have different ranks {sorted(ndims)}")
    if not ndims:
        return tensor_sinfo(None, dtype, ndim=-1)
    ndim = ndims.pop()
    if ndim == 0:
        raise StructInfoError("concat: cannot concatenate rank-0 tensors")
    axis = normalize_axis(call.attrs.axis if call.attrs else 0, ndim, "concat")
    shapes = [arg_shape(f) for f in tup.fields]
    if any(s is None for s in shapes):
        return tensor_sinfo(None, dtype, ndim=ndim)
    return tensor_sinfo(_concat_shape(shapes, axis), dtype)


def _concat_shape(shapes: Sequence[Sequence[PrimExpr]], axis: int) -> list[PrimExpr]:
    out = list(shapes[0])
    for k, s in enumerate(shapes[1:], start=1):
        for d in range(len(out)):
            if d != axis and not dims_equal(s[d], out[d]):
                if const_int(s[d]) is not None and const_int(out[d]) is not None:
                    raise StructInfoError(
                        f"concat: tensors[{k}] has shape {fmt_shape(s)}, which differs from "
                        f"{fmt_shape(shapes[0])} outside axis {axis}"
                    )
    out[axis] = dims_sum([s[axis] for s in shapes])
    return out


def _concat_compute(tensors: Sequence[te.Tensor], attrs: ConcatAttrs | None = None) -> te.Tensor:
    if isinstance(tensors, te.Tensor):
        tensors = [tensors]
    axis = normalize_axis(attrs.axis if attrs else 0, tensors[0].ndim, "concat")
    out_shape = _concat_shape([t.shape for t in tensors], axis)
    # pieces of constant length 0 are never read
    parts = [t for t in tensors if const_int(t.shape[axis]) != 0] or [tensors[0]]
    offsets = [dims_sum([t.shape[axis] for t in parts[:k]]) for k in range(len(parts))]

    def body(*i: PrimExpr) -> PrimExpr:
        def load(k: int) -> PrimExpr:
            t, o = parts[k], offsets[k]
            # clamp: a select may evaluate both sides, so every load must stay in bounds
            pos = clamp_between(
                simplify(i[axis] - o),
                None if k == 0 else index_const(0),
                None if k == len(parts) - 1 else simplify(t.shape[axis] - 1),
            )
            return t(*[pos if d == axis else i[d] for d in range(len(i))])

        value = load(len(parts) - 1)
        for k in range(len(parts) - 2, -1, -1):
            value = tx.select(i[axis] < offsets[k + 1], load(k), value)
        return value

    # symbolic dims outside the axis are taken from the first tensor: the others must agree
    checks = equal_dims([(t.shape[d], out_shape[d], f"concat: tensors[{k}] {fmt_shape(t.shape)} "
                          f"differs from tensors[0] {fmt_shape(tensors[0].shape)} outside axis "
                          f"{axis}")
                         for k, t in enumerate(tensors[1:], start=1)
                         for d in range(len(out_shape)) if d != axis])
    return te.compute(out_shape, body, name="concat", attrs=assume(checks))


def _concat_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """The output gradient split back into the pieces (their lengths along ``axis`` must be
    known constants)."""
    fields = call.args[0].struct_info.fields
    if not as_dtype(fields[0].dtype).is_float:
        return [None]
    ndim = arg_ndim(call.struct_info)
    axis = normalize_axis(call.attrs.axis if call.attrs else 0, ndim, "concat")
    sizes = [const_int(arg_shape(f)[axis]) if arg_shape(f) is not None else None
             for f in fields]
    if any(s is None for s in sizes):
        raise KilnError(
            "concat gradient: the pieces' lengths along the concatenated axis must be known "
            f"constants, got {[str(arg_shape(f)) for f in fields]}"
        )
    if len(fields) == 1:
        return [Tuple((output_grad,))]
    parts = bb.emit(split(output_grad, tuple(_running_sums(sizes)[:-1]), axis))
    return [Tuple(tuple(TupleGetItem(parts, k) for k in range(len(fields))))]


def _running_sums(sizes: Sequence[int]) -> list[int]:
    out, total = [], 0
    for s in sizes:
        total += s
        out.append(total)
    return out


concat = declare_injective(
    "concat", ("tensors*",), _concat_infer, _concat_compute, ConcatAttrs,
    "Join tensors along ``axis`` (numpy ``concatenate``).",
    gradient=_concat_grad,
)


# =============================================================================================
# split
# =============================================================================================
@dataclass(frozen=True)
class SplitAttrs:
    """``indices_or_sections``: a number of equal sections, or split points (numpy ``split``)."""

    indices_or_sections: int | tuple[int, ...]
    axis: int = 0

    def __post_init__(self):
        v = self.indices_or_sections
        if isinstance(v, (list, tuple)):
            object.__setattr__(self, "indices_or_sections", int_tuple(v, "split", "indices"))
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise KilnError(f"split: sections must be a positive int or a tuple of ints: {v!r}")


def split_ranges(dim: PrimExpr, attrs: SplitAttrs) -> list[tuple[PrimExpr, PrimExpr]]:
    """(start, length) of each piece along the split axis."""
    spec = attrs.indices_or_sections
    if isinstance(spec, int):
        size = _exact_quotient([dim], [spec])
        if size is None:
            raise StructInfoError(
                f"split: an axis of length {dim} cannot be split into {spec} equal sections"
            )
        return [(dims_product([size, k]), size) for k in range(spec)]
    cd = const_int(dim)
    if cd is not None:  # numpy slice normalization of the split points
        pts = [0, *(slice(p).indices(cd)[1] for p in spec), cd]
        return [(index_const(lo), index_const(max(hi - lo, 0)))
                for lo, hi in zip(pts[:-1], pts[1:])]
    points: list[PrimExpr] = []
    for p in spec:
        if p >= 0:
            points.append(simplify(tx.min(index_const(p), dim)))
        else:
            points.append(simplify(tx.max(dim + p, index_const(0))))
    bounds = [index_const(0), *points, dim]
    ranges = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        length = simplify(tx.max(hi - lo, index_const(0)))
        ranges.append((lo, length))
    return ranges


def _split_infer(call: Any) -> Any:
    x, shape = known_shape(call, "split")
    ndim = arg_ndim(x)
    attrs = call.attrs
    if ndim < 0 or shape is None:
        spec = attrs.indices_or_sections
        count = spec if isinstance(spec, int) else len(spec) + 1
        if ndim >= 0:
            normalize_axis(attrs.axis, ndim, "split")
        return TupleStructInfo(tuple(tensor_sinfo(None, x.dtype, ndim=ndim)
                                     for _ in range(count)))
    axis = normalize_axis(attrs.axis, ndim, "split")
    fields = []
    for _, length in split_ranges(shape[axis], attrs):
        piece = list(shape)
        piece[axis] = length
        fields.append(tensor_sinfo(piece, x.dtype))
    return TupleStructInfo(tuple(fields))


def _split_compute(x: te.Tensor, attrs: SplitAttrs) -> tuple[te.Tensor, ...]:
    axis = normalize_axis(attrs.axis, x.ndim, "split")
    outs = []
    for k, (start, length) in enumerate(split_ranges(x.shape[axis], attrs)):
        shape = list(x.shape)
        shape[axis] = length

        def body(*i: PrimExpr, start: PrimExpr = start) -> PrimExpr:
            return x(*[simplify(i[d] + start) if d == axis else i[d] for d in range(x.ndim)])

        outs.append(te.compute(shape, body, name=f"split_{k}"))
    return tuple(outs)


def _split_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    """The pieces' gradients concatenated back (the pass gives an explicit Tuple)."""
    if not as_dtype(call.args[0].struct_info.dtype).is_float:
        return [None]
    if isinstance(output_grad, Tuple):
        pieces = list(output_grad.fields)
    else:
        n = len(call.struct_info.fields)
        pieces = [TupleGetItem(output_grad, k) for k in range(n)]
    return [concat(pieces, call.attrs.axis)]


split = declare_injective(
    "split", ("x",), _split_infer, _split_compute, SplitAttrs,
    "Split into a tuple of tensors along ``axis`` (numpy ``split``).",
    gradient=_split_grad,
)


# =============================================================================================
# squeeze / expand_dims
# =============================================================================================
@dataclass(frozen=True)
class SqueezeAttrs:
    """``axis``: dims to remove (each must have length 1); None removes every constant-1 dim."""

    axis: int | tuple[int, ...] | None = None

    def __post_init__(self):
        if self.axis is not None and not isinstance(self.axis, int):
            object.__setattr__(self, "axis", int_tuple(self.axis, "squeeze", "axis"))
        elif isinstance(self.axis, bool):
            raise KilnError(f"squeeze: axis must be an int, a tuple or None: {self.axis!r}")


def _squeeze_axes(shape: Sequence[PrimExpr] | None, ndim: int, axis: Any) -> tuple[int, ...]:
    if axis is None:
        if shape is None:
            raise StructInfoError("squeeze: axis=None needs a known input shape")
        return tuple(d for d, s in enumerate(shape) if const_int(s) == 1)
    axes = reduce_axes(axis, ndim, "squeeze")
    if shape is not None:
        for a in axes:
            c = const_int(shape[a])
            if c is not None and c != 1:
                raise StructInfoError(
                    f"squeeze: axis {a} has length {c}, only length-1 axes can be removed"
                )
    return axes


def _squeeze_infer(call: Any) -> Any:
    x, shape = known_shape(call, "squeeze")
    ndim = arg_ndim(x)
    axis = call.attrs.axis if call.attrs else None
    if ndim < 0:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    if shape is None and axis is None:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    axes = _squeeze_axes(shape, ndim, axis)
    if shape is None:
        return tensor_sinfo(None, x.dtype, ndim=ndim - len(axes))
    return tensor_sinfo([s for d, s in enumerate(shape) if d not in axes], x.dtype)


def _squeeze_compute(x: te.Tensor, attrs: SqueezeAttrs | None = None) -> te.Tensor:
    axes = _squeeze_axes(x.shape, x.ndim, attrs.axis if attrs else None)
    kept = [d for d in range(x.ndim) if d not in axes]

    def body(*i: PrimExpr) -> PrimExpr:
        return x(*[index_const(0) if d in axes else i[kept.index(d)] for d in range(x.ndim)])

    return te.compute([x.shape[d] for d in kept], body, name="squeeze")


def _squeeze_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [reshape(output_grad, shape_of(call.args[0], "squeeze gradient"))]


squeeze = declare_injective(
    "squeeze", ("x",), _squeeze_infer, _squeeze_compute, SqueezeAttrs,
    "Remove length-1 axes (numpy ``squeeze``); symbolic axes named in ``axis`` are assumed 1.",
    gradient=_squeeze_grad,
)


@dataclass(frozen=True)
class ExpandDimsAttrs:
    """``axis``: positions of the new length-1 axes in the output (numpy ``expand_dims``)."""

    axis: int | tuple[int, ...]

    def __post_init__(self):
        if not isinstance(self.axis, int) or isinstance(self.axis, bool):
            object.__setattr__(self, "axis", int_tuple(self.axis, "expand_dims", "axis"))


def _new_axes(ndim: int, axis: Any) -> tuple[int, ...]:
    """Output positions of the inserted axes (normalized against the output rank)."""
    items = axis if isinstance(axis, tuple) else (axis,)
    return reduce_axes(items, ndim + len(items), "expand_dims")


def _expand_shape(shape: Sequence[Any], axis: Any) -> list[Any]:
    new = _new_axes(len(shape), axis)
    it = iter(shape)
    return [1 if d in new else next(it) for d in range(len(shape) + len(new))]


def _expand_infer(call: Any) -> Any:
    x, shape = known_shape(call, "expand_dims")
    ndim = arg_ndim(x)
    if ndim < 0:
        return tensor_sinfo(None, x.dtype, ndim=-1)
    if shape is None:
        new = _new_axes(ndim, call.attrs.axis)
        return tensor_sinfo(None, x.dtype, ndim=ndim + len(new))
    return tensor_sinfo(_expand_shape(shape, call.attrs.axis), x.dtype)


def _expand_compute(x: te.Tensor, attrs: ExpandDimsAttrs) -> te.Tensor:
    new = _new_axes(x.ndim, attrs.axis)
    kept = [k for k in range(x.ndim + len(new)) if k not in new]
    return te.compute(
        _expand_shape(x.shape, attrs.axis), lambda *i: x(*[i[k] for k in kept]),
        name="expand_dims",
    )


def _expand_dims_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [reshape(output_grad, shape_of(call.args[0], "expand_dims gradient"))]


expand_dims = declare_injective(
    "expand_dims", ("x",), _expand_infer, _expand_compute, ExpandDimsAttrs,
    "Insert length-1 axes at ``axis`` (positions in the output).",
    gradient=_expand_dims_grad,
)


# =============================================================================================
# broadcast_to
# =============================================================================================


@dataclass(frozen=True)
class BroadcastToAttrs:
    shape: tuple[Any, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "broadcast_to"))


def _check_broadcast_to(shape: Sequence[PrimExpr], target: Sequence[PrimExpr]) -> None:
    """Rank and constant dims; a symbolic dim that may or may not fit is checked by the kernel
    while it runs (``broadcast_assumptions``)."""
    if len(shape) > len(target):
        raise StructInfoError(
            f"broadcast_to: cannot broadcast {fmt_shape(shape)} to the lower-rank "
            f"{fmt_shape(target)}"
        )
    off = len(target) - len(shape)
    for k, d in enumerate(shape):
        t = target[off + k]
        if const_int(d) == 1 or dims_equal(d, t):
            continue
        if const_int(d) is not None and const_int(t) is not None:
            raise StructInfoError(
                f"broadcast_to: cannot broadcast {fmt_shape(shape)} to {fmt_shape(target)}"
            )


def _broadcast_to_infer(call: Any) -> Any:
    x, shape = known_shape(call, "broadcast_to")
    target = tuple(as_dim(d) for d in call.attrs.shape)
    if shape is not None:
        _check_broadcast_to(shape, target)
    return tensor_sinfo(target, x.dtype)


def _broadcast_to_compute(x: te.Tensor, attrs: BroadcastToAttrs) -> te.Tensor:
    target = tuple(as_dim(d) for d in attrs.shape)
    _check_broadcast_to(x.shape, target)
    return te.compute(target, lambda *i: broadcast_load(x, i, target), name="broadcast_to",
                      attrs=broadcast_assumptions("broadcast_to", (x.shape,), ("x",), target))


def _broadcast_to_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [unbroadcast(output_grad, call.struct_info, call.args[0])]


broadcast_to = declare_injective(
    "broadcast_to", ("x",), _broadcast_to_infer, _broadcast_to_compute, BroadcastToAttrs,
    "Broadcast to ``shape`` (numpy ``broadcast_to``).",
    gradient=_broadcast_to_grad,
)


# =============================================================================================
# collapse_sum_like / collapse_sum_to: the adjoints of broadcasting
# =============================================================================================


def _collapse_axes(op: str, data: Sequence[Any], target: Sequence[Any]) -> tuple[int, ...]:
    """Axes of ``data`` summed to reach ``target`` (numpy broadcasting run backwards)."""
    if len(target) > len(data):
        raise StructInfoError(
            f"{op}: cannot collapse shape {fmt_shape(data)} to the higher-rank "
            f"{fmt_shape(target)}"
        )
    lead = len(data) - len(target)
    axes = list(range(lead))
    for t, td in enumerate(target):
        d = lead + t
        if dims_equal(data[d], td):
            continue
        if const_int(td) == 1:
            axes.append(d)
            continue
        raise StructInfoError(
            f"{op}: cannot collapse {fmt_shape(data)} to {fmt_shape(target)}: dimension {d} "
            f"({data[d]}) is not a broadcast of {td}"
        )
    return tuple(axes)


def _accumulator(dtype: DataType) -> DataType:
    return DataType("float32") if dtype.is_float and dtype.bits < 32 else dtype


def _collapse_compute(x: te.Tensor, target: Sequence[Any], name: str) -> te.Tensor:
    target = tuple(as_dim(d) for d in target)
    axes = _collapse_axes(name, x.shape, target)
    lead = x.ndim - len(target)
    if not axes:
        return te.compute(target, lambda *j: x(*j), name=name)
    acc = _accumulator(x.dtype)
    red = {a: te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes}

    def body(*j: PrimExpr) -> PrimExpr:
        idx = [red[d].var if d in red else j[d - lead] for d in range(x.ndim)]
        return te.sum(tx.cast(acc, x(*idx)), axis=list(red.values()))

    out = te.compute(target, body, name=name)
    if acc != x.dtype:
        out = te.compute(target, lambda *j: tx.cast(x.dtype, out(*j)), name=name + "_cast")
    return out


def _numeric(op: str, arg: str, sinfo: Any) -> None:
    dt = as_dtype(sinfo.dtype)
    if not (dt.is_float or dt.is_integer):
        raise StructInfoError(f"{op}: {arg} must be a numeric tensor, got dtype {dt}")


def _collapse_like_infer(call: Any) -> Any:
    op = "collapse_sum_like"
    data = tensor_arg(call, 0, op, "data")
    target = tensor_arg(call, 1, op, "collapse_target")
    _numeric(op, "data", data)
    dshape, tshape = arg_shape(data), arg_shape(target)
    if tshape is None:
        return tensor_sinfo(None, data.dtype, ndim=arg_ndim(target))
    if dshape is not None:
        _collapse_axes(op, dshape, tshape)
    return tensor_sinfo(tshape, data.dtype)


def _collapse_like_compute(data: te.Tensor, target: te.Tensor, attrs: Any = None) -> te.Tensor:
    """Sum ``data`` down to the shape of ``collapse_target``."""
    return _collapse_compute(data, target.shape, "collapse_sum_like")


def _collapse_like_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    data = call.args[0]
    return [broadcast_to(output_grad, shape_of(data, "collapse_sum_like gradient")), None]


collapse_sum_like = register_op(
    "collapse_sum_like",
    inputs=("data", "collapse_target"),
    infer=_collapse_like_infer,
    pattern=OpPattern.COMM_REDUCE,
    compute=_collapse_like_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_collapse_like_grad,
    doc="Sum ``data`` down to the shape of ``collapse_target`` (which ``data``'s shape must be "
    "a numpy broadcast of); the values of ``collapse_target`` are not used.",
)


@dataclass(frozen=True)
class CollapseSumToAttrs:
    """``shape``: the target shape (ints or PrimExprs); ``data`` must broadcast from it."""

    shape: tuple[Any, ...]

    def __post_init__(self):
        object.__setattr__(self, "shape", shape_attr_value(self.shape, "collapse_sum_to"))


def _collapse_to_infer(call: Any) -> Any:
    op = "collapse_sum_to"
    data = tensor_arg(call, 0, op, "data")
    _numeric(op, "data", data)
    target = tuple(as_dim(d) for d in call.attrs.shape)
    dshape = arg_shape(data)
    if dshape is not None:
        _collapse_axes(op, dshape, target)
    return tensor_sinfo(target, data.dtype)


def _collapse_to_compute(data: te.Tensor, attrs: CollapseSumToAttrs) -> te.Tensor:
    """Sum ``data`` down to ``shape``."""
    return _collapse_compute(data, attrs.shape, "collapse_sum_to")


def _collapse_to_grad(call: Any, output_grad: Any, bb: Any) -> list[Any]:
    return [broadcast_to(output_grad, shape_of(call.args[0], "collapse_sum_to gradient"))]


collapse_sum_to = register_op(
    "collapse_sum_to",
    inputs=("data",),
    attrs=CollapseSumToAttrs,
    infer=_collapse_to_infer,
    pattern=OpPattern.COMM_REDUCE,
    compute=_collapse_to_compute,
    mixed_precision=MixedPrecision.FOLLOW,
    gradient=_collapse_to_grad,
    doc="Sum ``data`` down to ``shape`` (the inverse of a numpy broadcast to data's shape).",
)


def unbroadcast(grad: Any, out_sinfo: Any, x: Any) -> Any:
    """The adjoint of a broadcast input ``x``: ``grad`` (shaped like ``out_sinfo``) summed down
    to ``x``'s shape, or ``grad`` itself when no broadcasting happened."""
    if shapes_equal(arg_shape(out_sinfo), arg_shape(x.struct_info)):
        return grad
    return collapse_sum_like(grad, x)
