"""StructInfo: what the graph IR knows statically about a value (kind, shape, dtype).

Every normalized graph expression carries one. Shapes are tuples of TIR ``PrimExpr`` so they may
be symbolic: a symbolic dimension is a ``kiln.tir.Var`` of dtype ``int64`` (python ints given as
dimensions become ``int64`` ``IntImm`` immediates). A shape of ``None`` means "unknown shape",
with the rank still known when ``ndim >= 0``.

StructInfo nodes are ordinary immutable IR nodes: structural equality maps symbolic dimension
variables up to consistent renaming, exactly like variables elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import tir
from ..arith import Analyzer, simplify
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import StructInfoError
from ..ir.node import Node, node, set_field, structural_equal


class StructInfo(Node):
    """Base of all StructInfo kinds."""


def as_dim(value: Any, what: str = "dimension") -> tir.PrimExpr:
    """A shape dimension as an ``int64`` PrimExpr (python/numpy ints become ``IntImm``)."""
    if isinstance(value, (bool, np.bool_)):
        raise StructInfoError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, (int, np.integer)):
        if int(value) < 0:
            raise StructInfoError(f"{what} must be non-negative, got {int(value)}")
        return tir.IntImm("int64", int(value))
    if isinstance(value, tir.IntImm):
        if not value.dtype.is_integer or value.dtype.is_bool:
            raise StructInfoError(f"{what} must be an integer, got {value.dtype} {value.value}")
        if value.value < 0:
            raise StructInfoError(f"{what} must be non-negative, got {value.value}")
        return value if value.dtype == "int64" else tir.IntImm("int64", value.value)
    if isinstance(value, tir.PrimExpr):
        if value.dtype != "int64":
            raise StructInfoError(
                f"{what} must be an int64 expression (symbolic dims are tir.Var(name, 'int64')), "
                f"got {value.dtype}"
            )
        if isinstance(value, tir.Var):
            return value
        return simplify_dim(value, what)
    raise StructInfoError(f"{what} must be an int or an int64 PrimExpr, got {value!r}")


_FOLD = {
    tir.Add: lambda a, b: a + b,
    tir.Sub: lambda a, b: a - b,
    tir.Mul: lambda a, b: a * b,
    tir.FloorDiv: lambda a, b: a // b if b else None,
    tir.FloorMod: lambda a, b: a % b if b else None,
    tir.Min: min,
    tir.Max: max,
}


def _fold_const(e: tir.PrimExpr) -> int | None:
    """The value of an integer expression made only of constants (None otherwise)."""
    if isinstance(e, tir.IntImm):
        return e.value
    fn = _FOLD.get(type(e))
    if fn is None:
        return None
    a = _fold_const(e.a)
    b = _fold_const(e.b) if a is not None else None
    return None if b is None else fn(a, b)


def simplify_dim(e: tir.PrimExpr, what: str = "dimension") -> tir.PrimExpr:
    """Fold a computed dimension (``(h + 2 * p - k) // s + 1``) to a constant, or simplify it
    with ``kiln.arith`` when symbolic, so shapes inferred by ops stay readable and comparable."""
    value = _fold_const(e)
    if value is not None:
        if value < 0:
            raise StructInfoError(f"{what} must be non-negative, got {value}")
        return tir.IntImm("int64", value)
    try:
        out = simplify(e)
    except Exception:  # noqa: BLE001 - simplification is an optimization only
        return e
    if isinstance(out, tir.IntImm) and out.value < 0:
        raise StructInfoError(f"{what} must be non-negative, got {out.value}")
    return out if isinstance(out, tir.PrimExpr) and out.dtype == "int64" else e


def as_shape(values: Sequence[Any], what: str = "shape") -> tuple[tir.PrimExpr, ...]:
    """A shape tuple of ``int64`` PrimExprs (see :func:`as_dim`)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise StructInfoError(f"{what} must be a sequence of dimensions, got {values!r}")
    return tuple(as_dim(v, f"{what}[{i}]") for i, v in enumerate(values))


def _static_value(dim: tir.PrimExpr) -> int | None:
    return dim.value if isinstance(dim, tir.IntImm) else None


def _check_ndim(shape: tuple | None, ndim: int, kind: str) -> int:
    if not isinstance(ndim, (int, np.integer)) or ndim < -1:
        raise StructInfoError(f"{kind}: ndim must be an int >= -1, got {ndim!r}")
    if shape is None:
        return int(ndim)
    if ndim != -1 and ndim != len(shape):
        raise StructInfoError(f"{kind}: ndim={ndim} disagrees with a shape of {len(shape)} dims")
    return len(shape)


@node
class ObjectStructInfo(StructInfo):
    """Nothing is known about the value (the top of the StructInfo lattice)."""


@node
class PrimStructInfo(StructInfo):
    """A scalar of ``dtype``; ``value`` is its PrimExpr value when known (e.g. a shape var)."""

    dtype: DataType
    value: tir.PrimExpr | None = None

    def __post_init__(self):
        set_field(self, "dtype", as_dtype(self.dtype))
        if self.value is not None and not isinstance(self.value, tir.PrimExpr):
            set_field(self, "value", tir.make_const(self.dtype, self.value))


@node
class ShapeStructInfo(StructInfo):
    """A shape value (a tuple of int64): ``values`` when known, else just its ``ndim``."""

    values: tuple[tir.PrimExpr, ...] | None = None
    ndim: int = -1

    def __post_init__(self):
        if self.values is not None:
            set_field(self, "values", as_shape(self.values, "ShapeStructInfo values"))
        set_field(self, "ndim", _check_ndim(self.values, self.ndim, "ShapeStructInfo"))


@node
class TensorStructInfo(StructInfo):
    """A tensor of ``dtype`` whose shape is ``shape`` (None: unknown, rank ``ndim`` or -1)."""

    shape: tuple[tir.PrimExpr, ...] | None
    dtype: DataType
    ndim: int = -1

    def __post_init__(self):
        if self.shape is not None:
            set_field(self, "shape", as_shape(self.shape, "tensor shape"))
        set_field(self, "dtype", as_dtype(self.dtype))
        set_field(self, "ndim", _check_ndim(self.shape, self.ndim, "TensorStructInfo"))

    @property
    def is_static(self) -> bool:
        """True when every dimension is a known integer."""
        return self.shape is not None and all(isinstance(d, tir.IntImm) for d in self.shape)

    def static_shape(self) -> tuple[int, ...]:
        """The shape as python ints; StructInfoError if any dimension is unknown or symbolic."""
        if not self.is_static:
            raise StructInfoError(f"tensor shape is not static: {self}")
        return tuple(d.value for d in self.shape)  # type: ignore[union-attr]

    def dim(self, i: int) -> tir.PrimExpr:
        """Dimension ``i`` (negative counts from the end); the shape must be known."""
        if self.shape is None:
            raise StructInfoError(f"tensor shape is unknown: {self}")
        if not -len(self.shape) <= i < len(self.shape):
            raise StructInfoError(f"dimension {i} out of range for a {len(self.shape)}-d tensor")
        return self.shape[i]

    def with_shape(self, shape: Sequence[Any] | None, ndim: int = -1) -> TensorStructInfo:
        return TensorStructInfo(None if shape is None else tuple(shape), self.dtype, ndim)

    def with_dtype(self, dtype: Any) -> TensorStructInfo:
        return TensorStructInfo(self.shape, dtype, self.ndim)


@node
class TupleStructInfo(StructInfo):
    """A tuple whose elements have the StructInfo in ``fields``."""

    fields: tuple[StructInfo, ...]

    def __post_init__(self):
        fields = tuple(self.fields)
        for i, f in enumerate(fields):
            if not isinstance(f, StructInfo):
                raise StructInfoError(f"TupleStructInfo field {i} is not a StructInfo: {f!r}")
        set_field(self, "fields", fields)


@node
class SequenceStructInfo(StructInfo):
    """An ONNX sequence: an ordered list of values that each have StructInfo ``elem`` (in
    practice a tensor; its shape unknown when the elements differ), ``length`` elements when
    known at compile time (a PrimExpr, usually an ``IntImm``), else None.

    Unlike a tuple, a sequence's length may be a run-time value (``SequenceInsert`` in a
    loop, ``SplitToSequence`` of a run-time split), so its elements are not separate graph
    values: operators on sequences run as host functions (``kiln.op.sequence``) and the
    executor holds the value as a Python list of arrays.
    """

    elem: StructInfo
    length: tir.PrimExpr | None = None

    def __post_init__(self):
        if not isinstance(self.elem, StructInfo):
            raise StructInfoError(f"SequenceStructInfo elem is not a StructInfo: {self.elem!r}")
        if self.length is not None:
            set_field(self, "length", as_dim(self.length, "sequence length"))

    @property
    def static_length(self) -> int | None:
        """The length as an int when it is a known constant, else None."""
        return self.length.value if isinstance(self.length, tir.IntImm) else None


@node
class OptionalStructInfo(StructInfo):
    """An ONNX optional: either no value (None) or a value with StructInfo ``elem``. Which
    one is known only at run time; the executor holds None or the value."""

    elem: StructInfo

    def __post_init__(self):
        if not isinstance(self.elem, StructInfo):
            raise StructInfoError(f"OptionalStructInfo elem is not a StructInfo: {self.elem!r}")


@node
class FuncStructInfo(StructInfo):
    """A function taking ``params`` (None: unknown signature) and returning ``ret``."""

    params: tuple[StructInfo, ...] | None
    ret: StructInfo

    def __post_init__(self):
        if self.params is not None:
            set_field(self, "params", tuple(self.params))


# ---------------------------------------------------------------------------------------------
# queries used by the normalizer and by op authors
# ---------------------------------------------------------------------------------------------
def dims_equal(a: tir.PrimExpr, b: tir.PrimExpr) -> bool:
    """True when two dimensions are provably equal (same constant, same var, or arith says so)."""
    va, vb = _static_value(a), _static_value(b)
    if va is not None and vb is not None:
        return va == vb
    if structural_equal(a, b, map_free_vars=False):
        return True
    analyzer = _analyzer()
    if analyzer is None:
        return False
    try:
        return bool(analyzer.can_prove_equal(a, b))
    except Exception:  # noqa: BLE001 - the analyzer is an optimization; be conservative
        return False


def dims_differ(a: tir.PrimExpr, b: tir.PrimExpr) -> bool:
    """True when two dimensions are provably different (only decided for constants)."""
    va, vb = _static_value(a), _static_value(b)
    return va is not None and vb is not None and va != vb


def _analyzer():
    try:
        return Analyzer()
    except Exception:  # noqa: BLE001
        return None


def shapes_equal(a: Sequence[tir.PrimExpr] | None, b: Sequence[tir.PrimExpr] | None) -> bool:
    """Both known, same rank, every dimension provably equal."""
    if a is None or b is None or len(a) != len(b):
        return False
    return all(dims_equal(x, y) for x, y in zip(a, b))


def sinfo_equal(a: StructInfo, b: StructInfo) -> bool:
    """Identical StructInfo, symbolic variables compared by identity (no renaming)."""
    return structural_equal(a, b, map_free_vars=False)


def struct_info_lca(a: StructInfo, b: StructInfo) -> StructInfo:
    """The most specific StructInfo that describes values of both ``a`` and ``b``.

    Used for the two branches of an ``If``: equal parts are kept, differing dimensions make the
    shape unknown (keeping the rank if it agrees), differing kinds give ObjectStructInfo.
    """
    if sinfo_equal(a, b):
        return a
    if isinstance(a, TensorStructInfo) and isinstance(b, TensorStructInfo):
        if a.dtype != b.dtype:
            return ObjectStructInfo()
        if shapes_equal(a.shape, b.shape):
            return a
        return TensorStructInfo(None, a.dtype, a.ndim if a.ndim == b.ndim else -1)
    if isinstance(a, TupleStructInfo) and isinstance(b, TupleStructInfo):
        if len(a.fields) != len(b.fields):
            return ObjectStructInfo()
        return TupleStructInfo(tuple(struct_info_lca(x, y) for x, y in zip(a.fields, b.fields)))
    if isinstance(a, ShapeStructInfo) and isinstance(b, ShapeStructInfo):
        if shapes_equal(a.values, b.values):
            return a
        return ShapeStructInfo(None, a.ndim if a.ndim == b.ndim else -1)
    if isinstance(a, PrimStructInfo) and isinstance(b, PrimStructInfo) and a.dtype == b.dtype:
        return PrimStructInfo(a.dtype)
    if isinstance(a, SequenceStructInfo) and isinstance(b, SequenceStructInfo):
        same = a.length is not None and b.length is not None and dims_equal(a.length, b.length)
        return SequenceStructInfo(struct_info_lca(a.elem, b.elem), a.length if same else None)
    if isinstance(a, OptionalStructInfo) and isinstance(b, OptionalStructInfo):
        return OptionalStructInfo(struct_info_lca(a.elem, b.elem))
    return ObjectStructInfo()


def collect_sym_vars(sinfo: StructInfo | None) -> list[tir.Var]:
    """The symbolic TIR variables used in a StructInfo (first-use order, no duplicates)."""
    if sinfo is None:
        return []
    return tir.collect_vars(sinfo)


def erase_sym_vars(sinfo: StructInfo, keep: set[int]) -> StructInfo:
    """Forget parts of ``sinfo`` that mention symbolic vars not in ``keep`` (a set of ids).

    A function's return StructInfo may only mention variables its caller can bind (those in the
    parameters); anything defined inside the body is erased to "unknown" (rank kept).
    """

    def ok(exprs: Sequence[Any] | None) -> bool:
        return all(id(v) in keep for v in tir.collect_vars(tuple(exprs or ())))

    if isinstance(sinfo, TensorStructInfo):
        return sinfo if ok(sinfo.shape) else TensorStructInfo(None, sinfo.dtype, sinfo.ndim)
    if isinstance(sinfo, ShapeStructInfo):
        return sinfo if ok(sinfo.values) else ShapeStructInfo(None, sinfo.ndim)
    if isinstance(sinfo, PrimStructInfo):
        if sinfo.value is None or ok((sinfo.value,)):
            return sinfo
        return PrimStructInfo(sinfo.dtype)
    if isinstance(sinfo, TupleStructInfo):
        fields = tuple(erase_sym_vars(f, keep) for f in sinfo.fields)
        same = all(x is y for x, y in zip(fields, sinfo.fields))
        return sinfo if same else TupleStructInfo(fields)
    if isinstance(sinfo, FuncStructInfo):
        return sinfo  # a function's own signature binds its variables
    if isinstance(sinfo, SequenceStructInfo):
        elem = erase_sym_vars(sinfo.elem, keep)
        length = sinfo.length if sinfo.length is None or ok((sinfo.length,)) else None
        same = elem is sinfo.elem and length is sinfo.length
        return sinfo if same else SequenceStructInfo(elem, length)
    if isinstance(sinfo, OptionalStructInfo):
        elem = erase_sym_vars(sinfo.elem, keep)
        return sinfo if elem is sinfo.elem else OptionalStructInfo(elem)
    return sinfo
