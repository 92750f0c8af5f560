"""Sequence and optional operators (ONNX ``Sequence*``, ``SplitToSequence``,
``ConcatFromSequence``, ``Optional*``), run by host functions (``kiln.runtime.sequence_funcs``).

Their values are first-class graph values: a sequence has a
:class:`~kiln.graph.struct_info.SequenceStructInfo` (the StructInfo its elements share, and its
length when known at compile time), an optional an
:class:`~kiln.graph.struct_info.OptionalStructInfo`. The inference below tracks what is known
statically -- the length through construct/insert/erase/split, the element's dtype, rank and
shape as the least common StructInfo of what went in -- so a ``sequence_at`` of a sequence of
``(2, 3)`` tensors is a ``(2, 3)`` tensor for the ops after it.

A sequence's length may be a run-time value and its elements may differ in shape, so there
is no loop nest to write: every op here is legalized to a host function call (the executor
holds a sequence as a Python list of arrays, an optional as None or its value). A result
tensor of unknown shape (``sequence_at`` of a sequence whose elements differ,
``concat_from_sequence``) has a known rank; the frontend ``match_cast``\\ s it to fresh
symbolic dims, bound when the step runs, as after ``image_decode``. Optional inputs of the ONNX
operators (an insert/erase position, a split) are trailing variadic arguments: present or not.

All of them are OPAQUE, never constant-folded (they return no tensors, or tensors of run-time
shape) and NON_DIFFERENTIABLE.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..graph.struct_info import (
    OptionalStructInfo,
    SequenceStructInfo,
    StructInfo,
    TensorStructInfo,
    struct_info_lca,
)
from ..ir.dtype import as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..runtime import sequence_funcs  # noqa: F401 - registers the host functions
from .common import arg_ndim, arg_shape, normalize_axis, tensor_arg, tensor_sinfo
from .host import register_host_op

__all__ = [
    "concat_from_sequence", "optional_get_element", "optional_has_element", "optional_none",
    "optional_wrap", "sequence_at", "sequence_construct", "sequence_empty", "sequence_erase",
    "select_value", "sequence_insert", "sequence_length", "split_to_sequence",
]


def _sequence_arg(call: Any, index: int, op: str) -> SequenceStructInfo:
    sinfo = call.args[index].struct_info
    if not isinstance(sinfo, SequenceStructInfo):
        raise StructInfoError(f"{op}: input {index} must be a sequence, got {sinfo}")
    return sinfo


def _tail(call: Any, index: int) -> list[Any]:
    """The optional trailing arguments (a variadic Tuple) of ``call``."""
    if len(call.args) <= index:
        return []
    tail = call.args[index]
    return list(tail.fields) if isinstance(tail, gx.Tuple) else [tail]


def _position_arg(call: Any, index: int, op: str) -> bool:
    """Whether the optional position argument is there (checked: a 0-d/1-element integer)."""
    tail = _tail(call, index)
    if len(tail) > 1:
        raise StructInfoError(f"{op}: at most one position, got {len(tail)}")
    if tail:
        s = tail[0].struct_info
        if not isinstance(s, TensorStructInfo) or not s.dtype.is_integer or s.ndim > 1:
            raise StructInfoError(f"{op}: position must be an integer scalar, got {s}")
    return bool(tail)


def _length_plus(length: tir.PrimExpr | None, delta: int) -> tir.PrimExpr | None:
    if length is None:
        return None
    if isinstance(length, tir.IntImm):
        return None if length.value + delta < 0 else tir.IntImm("int64", length.value + delta)
    return length + delta


def _merge_elems(a: StructInfo | None, b: StructInfo) -> StructInfo:
    """The element StructInfo of a sequence holding values of ``a`` (None: it is empty) and
    ``b``: their least common StructInfo; the dtypes must agree."""
    if a is None:
        return b
    if isinstance(a, TensorStructInfo) and isinstance(b, TensorStructInfo) and a.dtype != b.dtype:
        raise StructInfoError(f"sequence elements must share a dtype: {a.dtype} and {b.dtype}")
    return struct_info_lca(a, b)


def _known_elem(seq: SequenceStructInfo) -> StructInfo | None:
    """The element StructInfo, None for a sequence known to be empty (whatever was declared
    for its elements does not constrain what is inserted)."""
    return None if seq.static_length == 0 else seq.elem


# =============================================================================================
# sequences
# =============================================================================================
def _construct_infer(call: Any) -> Any:
    values = _tail(call, 0)
    if not values:
        raise StructInfoError("sequence_construct: needs at least one tensor "
                              "(sequence_empty makes an empty sequence)")
    elem = None
    for i, v in enumerate(values):
        if not isinstance(v.struct_info, TensorStructInfo):
            raise StructInfoError(f"sequence_construct: input {i} must be a tensor, got "
                                  f"{v.struct_info}")
        elem = _merge_elems(elem, v.struct_info)
    return SequenceStructInfo(elem, len(values))


sequence_construct = register_host_op(
    "sequence_construct", ("values*",), _construct_infer, None,
    "A sequence of the given tensors (which share a dtype), in order.")


@dataclass(frozen=True)
class SequenceEmptyAttrs:
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "dtype", str(as_dtype(self.dtype)))


sequence_empty = register_host_op(
    "sequence_empty", (),
    lambda call: SequenceStructInfo(TensorStructInfo(None, call.attrs.dtype), 0),
    SequenceEmptyAttrs, "An empty sequence of tensors of ``dtype``.")


def _insert_infer(call: Any) -> Any:
    seq = _sequence_arg(call, 0, "sequence_insert")
    value = tensor_arg(call, 1, "sequence_insert", "value")
    _position_arg(call, 2, "sequence_insert")
    if isinstance(seq.elem, TensorStructInfo) and seq.elem.dtype != value.dtype:
        raise StructInfoError(f"sequence_insert: a {value.dtype} tensor into a sequence of "
                              f"{seq.elem.dtype}")
    return SequenceStructInfo(_merge_elems(_known_elem(seq), value), _length_plus(seq.length, 1))


sequence_insert = register_host_op(
    "sequence_insert", ("seq", "value", "position*"), _insert_infer, None,
    "``seq`` with ``value`` inserted before ``position`` (ONNX: negative counts from the back; "
    "at the end when no position is given).")


def _erase_infer(call: Any) -> Any:
    seq = _sequence_arg(call, 0, "sequence_erase")
    _position_arg(call, 1, "sequence_erase")
    if seq.static_length == 0:
        raise StructInfoError("sequence_erase: the sequence is empty")
    return SequenceStructInfo(seq.elem, _length_plus(seq.length, -1))


sequence_erase = register_host_op(
    "sequence_erase", ("seq", "position*"), _erase_infer, None,
    "``seq`` without the element at ``position`` (the last one when none is given).")


def _elem_tensor(seq: SequenceStructInfo, op: str) -> TensorStructInfo:
    if not isinstance(seq.elem, TensorStructInfo):
        raise StructInfoError(f"{op}: the sequence must hold tensors, got {seq.elem}")
    if seq.elem.shape is None and seq.elem.ndim < 0:
        raise StructInfoError(f"{op}: the rank of the sequence's elements is unknown "
                              f"({seq}); kiln needs it to plan what follows")
    return seq.elem


def _at_infer(call: Any) -> Any:
    seq = _sequence_arg(call, 0, "sequence_at")
    pos = tensor_arg(call, 1, "sequence_at", "position")
    if not pos.dtype.is_integer or pos.ndim > 1:
        raise StructInfoError(f"sequence_at: position must be an integer scalar, got {pos}")
    return _elem_tensor(seq, "sequence_at")


sequence_at = register_host_op(
    "sequence_at", ("seq", "position"), _at_infer, None,
    "The element of ``seq`` at ``position`` (negative counts from the back).")


def _length_infer(call: Any) -> Any:
    _sequence_arg(call, 0, "sequence_length")
    return tensor_sinfo((), "int64")


sequence_length = register_host_op(
    "sequence_length", ("seq",), _length_infer, None,
    "The number of elements of ``seq`` as a 0-d int64 tensor.")


@dataclass(frozen=True)
class SplitToSequenceAttrs:
    """``axis`` to split; ``keepdims``: keep the axis when no split is given (pieces of 1)."""

    axis: int = 0
    keepdims: bool = True


def _split_infer(call: Any) -> Any:
    x = tensor_arg(call, 0, "split_to_sequence", "x")
    tail = _tail(call, 1)
    ndim = arg_ndim(x)
    if ndim < 0:
        raise StructInfoError("split_to_sequence: the input's rank must be known")
    if ndim == 0:
        raise StructInfoError("split_to_sequence: cannot split a 0-d tensor")
    axis = normalize_axis(call.attrs.axis, ndim, "split_to_sequence")
    shape = arg_shape(x)
    n = shape[axis] if shape is not None else None
    if not tail:
        if call.attrs.keepdims:
            elem_shape = None if shape is None else (*shape[:axis], 1, *shape[axis + 1:])
            elem = tensor_sinfo(elem_shape, x.dtype, ndim)
        else:
            elem_shape = None if shape is None else (*shape[:axis], *shape[axis + 1:])
            elem = tensor_sinfo(elem_shape, x.dtype, ndim - 1)
        return SequenceStructInfo(elem, n)
    split = tail[0].struct_info
    if not isinstance(split, TensorStructInfo) or not split.dtype.is_integer or split.ndim > 1:
        raise StructInfoError(f"split_to_sequence: split must be a 0-d or 1-d integer tensor, "
                              f"got {split}")
    sizes = _split_sizes(tail[0], n)
    if sizes is not None:
        piece = (*shape[:axis], sizes[0], *shape[axis + 1:]) if len(set(sizes)) == 1 else None
        return SequenceStructInfo(tensor_sinfo(piece, x.dtype, ndim), len(sizes))
    length = None
    if split.ndim == 1 and split.shape is not None:
        length = split.shape[0]
    return SequenceStructInfo(tensor_sinfo(None, x.dtype, ndim), length)


def _split_sizes(split: Any, n: Any) -> list[int] | None:
    """The piece sizes of a constant ``split`` over a static axis of ``n`` (None otherwise,
    or when they do not fit: the host function reports that)."""
    total = getattr(n, "value", None)
    if not isinstance(split, gx.Constant) or total is None:
        return None
    values = split.data.reshape(-1).tolist()
    if split.data.ndim == 0:
        size = int(values[0])
        if size <= 0:
            return None
        sizes = [size] * (total // size) + ([total % size] if total % size else [])
    else:
        sizes = [int(v) for v in values]
    if not sizes or any(v < 0 for v in sizes) or sum(sizes) != total:
        return None
    return sizes


split_to_sequence = register_host_op(
    "split_to_sequence", ("x", "split*"), _split_infer, SplitToSequenceAttrs,
    "Split ``x`` along ``axis`` into a sequence: pieces of 1 without ``split`` (the axis "
    "squeezed unless ``keepdims``), of ``split`` elements for a scalar (the last shorter), of "
    "the sizes of a 1-d ``split``.")


@dataclass(frozen=True)
class ConcatFromSequenceAttrs:
    """Concatenate along ``axis``, or stack along a new ``axis`` when ``new_axis``."""

    axis: int = 0
    new_axis: bool = False


def _concat_infer(call: Any) -> Any:
    seq = _sequence_arg(call, 0, "concat_from_sequence")
    elem = _elem_tensor(seq, "concat_from_sequence")
    ndim = arg_ndim(elem) + (1 if call.attrs.new_axis else 0)
    axis = normalize_axis(call.attrs.axis, ndim, "concat_from_sequence")
    shape = arg_shape(elem)
    n = seq.static_length
    if shape is not None and n is not None and n > 0:
        if call.attrs.new_axis:
            return tensor_sinfo((*shape[:axis], n, *shape[axis:]), elem.dtype)
        return tensor_sinfo((*shape[:axis], shape[axis] * n, *shape[axis + 1:]), elem.dtype)
    return tensor_sinfo(None, elem.dtype, ndim)


concat_from_sequence = register_host_op(
    "concat_from_sequence", ("seq",), _concat_infer, ConcatFromSequenceAttrs,
    "Concatenate the tensors of ``seq`` along ``axis`` (stack them along a new axis with "
    "``new_axis``).")


# =============================================================================================
# optionals
# =============================================================================================
def _wrap_infer(call: Any) -> Any:
    sinfo = call.args[0].struct_info
    if not isinstance(sinfo, (TensorStructInfo, SequenceStructInfo)):
        raise StructInfoError(f"optional_wrap: the value must be a tensor or a sequence, got "
                              f"{sinfo}")
    return OptionalStructInfo(sinfo)


optional_wrap = register_host_op(
    "optional_wrap", ("value",), _wrap_infer, None, "An optional holding ``value``.")


@dataclass(frozen=True)
class OptionalNoneAttrs:
    """The type an empty optional would hold: tensors of ``dtype`` (of rank ``ndim``, -1:
    unknown), or a sequence of them when ``sequence``."""

    dtype: str = "float32"
    ndim: int = -1
    sequence: bool = False

    def __post_init__(self):
        object.__setattr__(self, "dtype", str(as_dtype(self.dtype)))
        if self.ndim < -1:
            raise KilnError(f"optional_none: ndim must be >= -1, got {self.ndim}")


def _none_infer(call: Any) -> Any:
    a = call.attrs
    tensor = TensorStructInfo(None, a.dtype, a.ndim)
    return OptionalStructInfo(SequenceStructInfo(tensor) if a.sequence else tensor)


optional_none = register_host_op(
    "optional_none", (), _none_infer, OptionalNoneAttrs,
    "An optional holding no value (of the type the attributes describe).")


def _optional_arg(call: Any, op: str) -> OptionalStructInfo:
    sinfo = call.args[0].struct_info
    if not isinstance(sinfo, OptionalStructInfo):
        raise StructInfoError(f"{op}: the input must be an optional, got {sinfo}")
    return sinfo


optional_has_element = register_host_op(
    "optional_has_element", ("optional",),
    lambda call: (_optional_arg(call, "optional_has_element"), tensor_sinfo((), "bool"))[1],
    None, "Whether the optional holds a value (a 0-d bool tensor).")


def _get_infer(call: Any) -> Any:
    elem = _optional_arg(call, "optional_get_element").elem
    if isinstance(elem, TensorStructInfo) and elem.shape is None and elem.ndim < 0:
        raise StructInfoError("optional_get_element: the rank of the optional's tensor is "
                              "unknown; kiln needs it to plan what follows")
    return elem


optional_get_element = register_host_op(
    "optional_get_element", ("optional",), _get_infer, None,
    "The value of the optional (a run-time error when it holds none).")


# =============================================================================================
# choosing a value at run time
# =============================================================================================
def _select_infer(call: Any) -> Any:
    cond = tensor_arg(call, 0, "select_value", "cond")
    if not cond.dtype.is_bool or arg_ndim(cond) != 0:
        raise StructInfoError(f"select_value: cond must be a 0-d bool tensor, got {cond}")
    a, b = call.args[1].struct_info, call.args[2].struct_info
    kinds = (SequenceStructInfo, OptionalStructInfo)
    if not isinstance(a, kinds) or type(a) is not type(b):
        raise StructInfoError(f"select_value: both values must be sequences or both optionals, "
                              f"got {a} and {b}")
    merged = struct_info_lca(a, b)
    if not isinstance(merged, kinds):
        raise StructInfoError(f"select_value: the values differ in kind: {a} and {b}")
    return merged


select_value = register_host_op(
    "select_value", ("cond", "a", "b"), _select_infer, None,
    "``a`` when ``cond`` else ``b``, for sequences and optionals (an If on a run-time "
    "condition whose branches give them; tensors use ``where``).")
