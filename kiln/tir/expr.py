"""TIR expressions (PrimExpr).

Every PrimExpr has a ``dtype`` (a :class:`~kiln.ir.DataType`, possibly a vector type). Python
operators build expressions: ``+ - * // % / -x`` (``//`` and ``%`` are *floor* division and
modulo, ``/`` is true division and needs a float operand), comparisons ``< <= > >=``,
``& | ~`` for logical and/or/not, and ``^ << >>`` for bitwise xor and shifts (bitwise
and/or/not: :func:`bitwise_and`, :func:`bitwise_or`, :func:`bitwise_not`). ``==`` stays
identity (nodes are dict keys); use :func:`eq` / :func:`ne` or ``a.equal(b)`` to build
equality tests. Python numbers are converted to the dtype of the other operand.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from dataclasses import field
from enum import IntEnum
from typing import Any

import numpy as np

from ..ir.dtype import DataType, as_dtype
from ..ir.errors import DTypeError, KilnError
from ..ir.node import Node, node, set_field


class PrimExpr(Node):
    """Base of all scalar/vector expressions."""

    dtype: DataType

    # ---- arithmetic ------------------------------------------------------------------------
    def __add__(self, o):
        return add(self, o)

    def __radd__(self, o):
        return add(o, self)

    def __sub__(self, o):
        return sub(self, o)

    def __rsub__(self, o):
        return sub(o, self)

    def __mul__(self, o):
        return mul(self, o)

    def __rmul__(self, o):
        return mul(o, self)

    def __truediv__(self, o):
        return div(self, o)

    def __rtruediv__(self, o):
        return div(o, self)

    def __floordiv__(self, o):
        return floordiv(self, o)

    def __rfloordiv__(self, o):
        return floordiv(o, self)

    def __mod__(self, o):
        return floormod(self, o)

    def __rmod__(self, o):
        return floormod(o, self)

    def __neg__(self):
        return sub(make_const(self.dtype, 0), self)

    # ---- comparisons / logic ---------------------------------------------------------------
    def __lt__(self, o):
        return _binary(LT, self, o)

    def __le__(self, o):
        return _binary(LE, self, o)

    def __gt__(self, o):
        return _binary(GT, self, o)

    def __ge__(self, o):
        return _binary(GE, self, o)

    def __and__(self, o):
        return logical_and(self, o)

    def __rand__(self, o):
        return logical_and(o, self)

    def __or__(self, o):
        return logical_or(self, o)

    def __ror__(self, o):
        return logical_or(o, self)

    def __invert__(self):
        return logical_not(self)

    def __xor__(self, o):
        return bitwise_xor(self, o)

    def __rxor__(self, o):
        return bitwise_xor(o, self)

    def __lshift__(self, o):
        return shift_left(self, o)

    def __rshift__(self, o):
        return shift_right(self, o)

    def equal(self, o) -> PrimExpr:
        return eq(self, o)

    def __bool__(self):
        raise KilnError(
            "a PrimExpr has no truth value; use kiln.arith.Analyzer().can_prove(expr) or "
            "compare IR with structural_equal"
        )

    __eq__ = Node.__eq__
    __hash__ = Node.__hash__

    def astype(self, dtype) -> PrimExpr:
        return cast(dtype, self)


# ---------------------------------------------------------------------------------------------
# leaves
# ---------------------------------------------------------------------------------------------
@node
class Var(PrimExpr):
    """A scalar variable (loop variable, symbolic shape dimension, or a handle parameter)."""

    name: str
    dtype: DataType = field(default_factory=lambda: DataType("int32"))

    _is_var = True
    _type_fields = ("dtype",)

    def __post_init__(self):
        set_field(self, "dtype", as_dtype(self.dtype))

    @property
    def name_hint(self) -> str:
        return self.name


@node
class SizeVar(Var):
    """A variable known to be non-negative (a symbolic shape dimension)."""


@node
class IntImm(PrimExpr):
    dtype: DataType
    value: int

    def __post_init__(self):
        dt = as_dtype(self.dtype)
        set_field(self, "dtype", dt)
        v = int(self.value)
        if dt.is_bool:
            v = 1 if v else 0
        elif dt.is_integer:
            lo, hi = dt.element.min_value(), dt.element.max_value()
            if not lo <= v <= hi:
                raise DTypeError(f"value {v} does not fit in {dt}")
        else:
            raise DTypeError(f"IntImm needs an integer or bool type, got {dt}")
        set_field(self, "value", v)


@node
class FloatImm(PrimExpr):
    dtype: DataType
    value: float

    def __post_init__(self):
        dt = as_dtype(self.dtype)
        if not dt.is_float:
            raise DTypeError(f"FloatImm needs a float type, got {dt}")
        set_field(self, "dtype", dt)
        set_field(self, "value", float(self.value))


@node
class StringImm(PrimExpr):
    value: str
    dtype: DataType = field(default_factory=lambda: DataType("handle"))


# ---------------------------------------------------------------------------------------------
# operators
# ---------------------------------------------------------------------------------------------
@node
class BinaryOp(PrimExpr):
    a: PrimExpr
    b: PrimExpr
    dtype: DataType = None  # type: ignore[assignment]

    _compare = False

    def __post_init__(self):
        if self.dtype is None:
            dt = self.a.dtype
            if self._compare:
                dt = DataType("bool").with_lanes(dt.lanes)
            set_field(self, "dtype", dt)


@node
class Add(BinaryOp):
    pass


@node
class Sub(BinaryOp):
    pass


@node
class Mul(BinaryOp):
    pass


@node
class Div(BinaryOp):
    """True division for floats; truncated division (C semantics) for integers."""


@node
class Mod(BinaryOp):
    """Truncated modulo (C ``%``) for integers."""


@node
class FloorDiv(BinaryOp):
    pass


@node
class FloorMod(BinaryOp):
    pass


@node
class Min(BinaryOp):
    pass


@node
class Max(BinaryOp):
    pass


@node
class CmpOp(BinaryOp):
    _compare = True


@node
class EQ(CmpOp):
    pass


@node
class NE(CmpOp):
    pass


@node
class LT(CmpOp):
    pass


@node
class LE(CmpOp):
    pass


@node
class GT(CmpOp):
    pass


@node
class GE(CmpOp):
    pass


@node
class And(BinaryOp):
    pass


@node
class Or(BinaryOp):
    pass


@node
class BitwiseAnd(BinaryOp):
    """Bitwise AND of two integers (of two bools: logical AND)."""


@node
class BitwiseOr(BinaryOp):
    """Bitwise OR of two integers (of two bools: logical OR)."""


@node
class BitwiseXor(BinaryOp):
    """Bitwise XOR of two integers (of two bools: ``a != b``). ``~a`` is ``a ^ all-ones``
    (:func:`bitwise_not`), so there is no separate NOT node to vectorize and simplify."""


@node
class ShiftLeft(BinaryOp):
    """``a << b`` in ``a``'s type, modular (bits past the top, the sign bit too, are dropped).

    Defined for every shift amount, unlike C: ``b`` outside ``[0, bits)`` gives 0 (numpy's
    ``left_shift`` and ONNX BitShift agree)."""


@node
class ShiftRight(BinaryOp):
    """``a >> b``: logical for unsigned types, arithmetic (sign-extending) for signed ones.

    Defined for every shift amount, unlike C: ``b`` outside ``[0, bits)`` gives the sign fill
    (-1 for a negative signed ``a``, else 0), like numpy's ``right_shift``."""


BIT_OPS: tuple[type[BinaryOp], ...] = (BitwiseAnd, BitwiseOr, BitwiseXor, ShiftLeft, ShiftRight)


@node
class Not(PrimExpr):
    a: PrimExpr
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.dtype is None:
            set_field(self, "dtype", self.a.dtype)


@node
class Select(PrimExpr):
    """``condition ? true_value : false_value`` (both sides may be evaluated)."""

    condition: PrimExpr
    true_value: PrimExpr
    false_value: PrimExpr
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.dtype is None:
            set_field(self, "dtype", self.true_value.dtype)


@node
class Cast(PrimExpr):
    dtype: DataType
    value: PrimExpr

    def __post_init__(self):
        set_field(self, "dtype", as_dtype(self.dtype))


@node
class Ramp(PrimExpr):
    """The vector ``[base, base + stride, ..., base + (lanes-1)*stride]``."""

    base: PrimExpr
    stride: PrimExpr
    lanes: int
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        set_field(self, "base", convert(self.base))
        if not isinstance(self.stride, PrimExpr):  # a Python number takes the base's type
            set_field(self, "stride", make_const(self.base.dtype, self.stride))
        if self.dtype is None:
            set_field(self, "dtype", self.base.dtype.with_lanes(self.lanes))


@node
class Broadcast(PrimExpr):
    """A scalar repeated over ``lanes`` lanes."""

    value: PrimExpr
    lanes: int
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        set_field(self, "value", convert(self.value))
        if self.dtype is None:
            set_field(self, "dtype", self.value.dtype.with_lanes(self.lanes))


@node
class Let(PrimExpr):
    var: Var
    value: PrimExpr
    body: PrimExpr
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.dtype is None:
            set_field(self, "dtype", self.body.dtype)


@node
class Call(PrimExpr):
    """A call of a math intrinsic (see :data:`INTRINSICS`) or an extern C function."""

    dtype: DataType
    op: str
    args: tuple[PrimExpr, ...]

    def __post_init__(self):
        set_field(self, "dtype", as_dtype(self.dtype))
        set_field(self, "args", tuple(convert(a) for a in self.args))


@node
class BufferLoad(PrimExpr):
    """``buffer[indices]``; a Ramp index makes a vector load. ``buffer`` is a
    :class:`kiln.tir.buffer.Buffer` (a module built on this one)."""

    buffer: Any
    indices: tuple[PrimExpr, ...]
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        idx = tuple(convert(i) for i in self.indices)
        set_field(self, "indices", idx)
        if self.dtype is None:
            lanes = builtins.max([i.dtype.lanes for i in idx] + [1])
            set_field(self, "dtype", self.buffer.dtype.with_lanes(lanes))


@node
class CommReducer(Node):
    """A commutative reducer: ``result``, an expression of ``lhs`` and ``rhs``, combines two
    values (substitute them for ``lhs``/``rhs``); ``identity`` is the neutral element.
    """

    lhs: Var
    rhs: Var
    result: PrimExpr
    identity: PrimExpr


@node
class Reduce(PrimExpr):
    """A reduction over ``axis`` (IterVars of kind COMM_REDUCE); exists only inside te.compute."""

    combiner: CommReducer
    source: PrimExpr
    axis: tuple[Any, ...]  # tuple[IterVar, ...]
    condition: PrimExpr | None = None
    dtype: DataType = None  # type: ignore[assignment]

    def __post_init__(self):
        if self.dtype is None:
            set_field(self, "dtype", self.source.dtype)


# ---------------------------------------------------------------------------------------------
# ranges and iteration variables (used by both expressions and statements)
# ---------------------------------------------------------------------------------------------
@node
class Range(Node):
    """The half-open interval ``[min, min + extent)``."""

    min: PrimExpr
    extent: PrimExpr

    def __post_init__(self):
        set_field(self, "min", convert(self.min))
        ext = convert(self.extent)
        if ext.dtype != self.min.dtype and isinstance(self.min, IntImm):
            set_field(self, "min", IntImm(ext.dtype, self.min.value))
        set_field(self, "extent", ext)

    @staticmethod
    def from_min_extent(min_value, extent) -> Range:
        return Range(min_value, extent)

    @staticmethod
    def from_bounds(begin, end) -> Range:
        begin, end = convert(begin), convert(end)
        return Range(begin, end - begin)


class IterType(IntEnum):
    DATA_PAR = 0
    COMM_REDUCE = 2
    ORDERED = 3
    OPAQUE = 4


@node
class IterVar(Node):
    """A block iteration variable with its domain and kind (spatial or reduction)."""

    dom: Range
    var: Var
    iter_type: IterType = IterType.DATA_PAR

    def __post_init__(self):
        if not isinstance(self.iter_type, IterType):
            set_field(self, "iter_type", IterType(self.iter_type))


def _iter_var_forward(name: str):
    """Arithmetic on an IterVar is arithmetic on its var (te: ``k * 2``, ``k1 < k2``)."""

    def method(self, *args):
        return getattr(self.var, name)(*args)

    method.__name__ = name
    return method


for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__neg__",
    "__lt__", "__le__", "__gt__", "__ge__", "equal", "astype",
):
    setattr(IterVar, _name, _iter_var_forward(_name))


# ---------------------------------------------------------------------------------------------
# constructors with type matching
# ---------------------------------------------------------------------------------------------
def make_const(dtype: Any, value: int | float | bool) -> PrimExpr:
    """A constant of ``dtype`` (vector types give a Broadcast)."""
    dt = as_dtype(dtype)
    scalar = dt.element
    if scalar.is_float:
        imm: PrimExpr = FloatImm(scalar, float(value))
    else:
        imm = IntImm(scalar, int(value))
    return imm if dt.lanes == 1 else Broadcast(imm, dt.lanes)


const = make_const


def convert(value: Any) -> PrimExpr:
    """Python scalar -> immediate (int32 if it fits, else int64; float32; bool)."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, IterVar):  # an iteration variable stands for its var
        return value.var
    if isinstance(value, bool):
        return IntImm("bool", int(value))
    if isinstance(value, int):
        return IntImm("int32" if -(2**31) <= value < 2**31 else "int64", value)
    if isinstance(value, float):
        return FloatImm("float32", value)
    try:
        if isinstance(value, np.generic):
            return make_const(DataType.from_numpy(value.dtype), value.item())
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, str):
        return StringImm(value)
    raise KilnError(f"cannot convert {value!r} of type {type(value).__name__} to a PrimExpr")


def _match(a: Any, b: Any) -> tuple[PrimExpr, PrimExpr]:
    """Bring two operands to one dtype (python scalars take the other side's type)."""
    a = a.var if isinstance(a, IterVar) else a
    b = b.var if isinstance(b, IterVar) else b
    if not isinstance(a, PrimExpr) and isinstance(b, PrimExpr):
        a = make_const(b.dtype, a) if not isinstance(a, bool) or b.dtype.is_bool else convert(a)
    elif not isinstance(b, PrimExpr) and isinstance(a, PrimExpr):
        b = make_const(a.dtype, b) if not isinstance(b, bool) or a.dtype.is_bool else convert(b)
    else:
        a, b = convert(a), convert(b)
    da, db = a.dtype, b.dtype
    if da == db:
        return a, b
    # lanes: broadcast a scalar to the other side's lanes
    if da.lanes != db.lanes:
        if da.lanes == 1:
            a = Broadcast(a, db.lanes)
        elif db.lanes == 1:
            b = Broadcast(b, da.lanes)
        else:
            raise DTypeError(f"lane mismatch: {da} vs {db}")
        da, db = a.dtype, b.dtype
        if da == db:
            return a, b
    ea, eb = da.element, db.element
    if ea.is_float and not eb.is_float:
        return a, cast(da, b)
    if eb.is_float and not ea.is_float:
        return cast(db, a), b
    if ea.is_float and eb.is_float:
        if ea.bits == eb.bits:
            raise DTypeError(f"operand types differ: {da} vs {db}")
        return (cast(db, a), b) if eb.bits > ea.bits else (a, cast(da, b))
    # integers/bools: widen to the larger
    if ea.is_bool and not eb.is_bool:
        return cast(db, a), b
    if eb.is_bool and not ea.is_bool:
        return a, cast(da, b)
    if ea.bits >= eb.bits:
        return a, cast(da, b) if not isinstance(b, IntImm) else IntImm(da, b.value)
    return (cast(db, a) if not isinstance(a, IntImm) else IntImm(db, a.value)), b


def _binary(cls: type[BinaryOp], a: Any, b: Any) -> PrimExpr:
    a, b = _match(a, b)
    return cls(a, b)


def add(a, b) -> PrimExpr:
    return _binary(Add, a, b)


def sub(a, b) -> PrimExpr:
    return _binary(Sub, a, b)


def mul(a, b) -> PrimExpr:
    return _binary(Mul, a, b)


def div(a, b) -> PrimExpr:
    """True division; integer operands are an error (use floordiv or truncdiv)."""
    a, b = _match(a, b)
    if not a.dtype.is_float:
        raise DTypeError("'/' on integer expressions is ambiguous; use // (floordiv) or truncdiv")
    return Div(a, b)


def truncdiv(a, b) -> PrimExpr:
    return _binary(Div, a, b)


def truncmod(a, b) -> PrimExpr:
    return _binary(Mod, a, b)


def floordiv(a, b) -> PrimExpr:
    a, b = _match(a, b)
    if a.dtype.is_float:
        return floor(Div(a, b))
    return FloorDiv(a, b)


def floormod(a, b) -> PrimExpr:
    a, b = _match(a, b)
    if a.dtype.is_float:
        return Sub(a, Mul(b, floor(Div(a, b))))
    return FloorMod(a, b)


def min(a, b) -> PrimExpr:  # noqa: A001 - mirrors tir.min
    return _binary(Min, a, b)


def max(a, b) -> PrimExpr:  # noqa: A001 - mirrors tir.max
    return _binary(Max, a, b)


def eq(a, b) -> PrimExpr:
    return _binary(EQ, a, b)


def ne(a, b) -> PrimExpr:
    return _binary(NE, a, b)


def lt(a, b) -> PrimExpr:
    return _binary(LT, a, b)


def le(a, b) -> PrimExpr:
    return _binary(LE, a, b)


def gt(a, b) -> PrimExpr:
    return _binary(GT, a, b)


def ge(a, b) -> PrimExpr:
    return _binary(GE, a, b)


def _as_bool(x: Any) -> PrimExpr:
    x = convert(x)
    if not x.dtype.is_bool:
        raise DTypeError(f"logical operator needs bool operands, got {x.dtype}")
    return x


def logical_and(a, b) -> PrimExpr:
    return And(_as_bool(a), _as_bool(b))


def logical_or(a, b) -> PrimExpr:
    return Or(_as_bool(a), _as_bool(b))


def logical_not(a) -> PrimExpr:
    return Not(_as_bool(a))


def _bits_operand(x: Any, what: str, allow_bool: bool = True) -> None:
    dt = x.dtype
    if not (dt.is_integer or (allow_bool and dt.is_bool)):
        kinds = "integer or bool" if allow_bool else "integer"
        raise DTypeError(f"{what} needs {kinds} operands, got {dt}")


def _bitwise(cls: type[BinaryOp], a: Any, b: Any) -> PrimExpr:
    a, b = _match(a, b)
    _bits_operand(a, cls.__name__)
    return cls(a, b)


def bitwise_and(a, b) -> PrimExpr:
    return _bitwise(BitwiseAnd, a, b)


def bitwise_or(a, b) -> PrimExpr:
    return _bitwise(BitwiseOr, a, b)


def bitwise_xor(a, b) -> PrimExpr:
    return _bitwise(BitwiseXor, a, b)


def bitwise_not(a) -> PrimExpr:
    """``~a``: ``a ^ -1`` (all bits set in ``a``'s type); a bool gives the logical NOT."""
    a = convert(a.var if isinstance(a, IterVar) else a)
    if a.dtype.is_bool:
        return Not(a)
    _bits_operand(a, "bitwise_not", allow_bool=False)
    el = a.dtype.element
    ones = make_const(a.dtype, el.max_value() if el.is_uint else -1)
    return BitwiseXor(a, ones)


def _shift(cls: type[BinaryOp], a: Any, b: Any) -> PrimExpr:
    """A shift keeps the type of the shifted value: the amount is converted to it."""
    a = convert(a.var if isinstance(a, IterVar) else a)
    b = b.var if isinstance(b, IterVar) else b
    _bits_operand(a, cls.__name__, allow_bool=False)
    b = make_const(a.dtype.element, b) if not isinstance(b, PrimExpr) else b
    _bits_operand(b, cls.__name__, allow_bool=False)
    if b.dtype.element != a.dtype.element:
        b = cast(a.dtype.element.with_lanes(b.dtype.lanes), b)
    a, b = _match(a, b)  # lanes
    return cls(a, b)


def shift_left(a, b) -> PrimExpr:
    """``a << b`` (see :class:`ShiftLeft` for amounts outside ``[0, bits)``)."""
    return _shift(ShiftLeft, a, b)


def shift_right(a, b) -> PrimExpr:
    """``a >> b`` (see :class:`ShiftRight` for amounts outside ``[0, bits)``)."""
    return _shift(ShiftRight, a, b)


def reinterpret(dtype: Any, value: Any) -> PrimExpr:
    """The bits of ``value`` read as ``dtype`` (same bits per lane, same lanes), e.g. a
    float32 as its int32 pattern. A ``Call`` of the ``reinterpret`` intrinsic, as in TVM;
    the C code generator copies the bits (no pointer punning, so no strict-aliasing UB)."""
    dt = as_dtype(dtype)
    value = convert(value)
    src = value.dtype
    if dt.lanes == 1 and src.lanes > 1:
        dt = dt.with_lanes(src.lanes)
    if src.lanes != dt.lanes or src.element.bits != dt.element.bits:
        raise DTypeError(f"reinterpret needs the same bits and lanes: {src} -> {dt}")
    if src.is_bool or dt.is_bool or src.is_handle or dt.is_handle:
        raise DTypeError(f"reinterpret of bool or handle types is not defined: {src} -> {dt}")
    if src == dt:
        return value
    return Call(dt, "reinterpret", (value,))


def select(cond, t, f) -> PrimExpr:
    t, f = _match(t, f)
    return Select(_as_bool(cond), t, f)


if_then_else = select


def cast(dtype: Any, value: Any) -> PrimExpr:
    dt = as_dtype(dtype)
    value = convert(value)
    if value.dtype == dt:
        return value
    if value.dtype.lanes != dt.lanes and value.dtype.lanes == 1:
        return Broadcast(cast(dt.element, value), dt.lanes)
    return Cast(dt, value)


# ---- math intrinsics ------------------------------------------------------------------------
# name -> number of arguments. Codegen maps each to its C function per dtype.
INTRINSICS: dict[str, int] = {
    "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "erf": 1, "sigmoid": 1,
    "fabs": 1, "floor": 1, "ceil": 1, "round": 1, "trunc": 1, "pow": 2,
    "sin": 1, "cos": 1, "log2": 1, "log1p": 1, "exp2": 1, "isnan": 1, "isinf": 1, "fmod": 2,
    "reinterpret": 1,  # bit copy to the call's dtype; build it with reinterpret()
    "fresh_seed": 0,  # uint64: a new value on every evaluation (kiln.op.random's seed kernel)
    "check_index": 4,  # an index checked while the kernel runs; build it with check_index()
    "rounded": 1,  # a float product rounded before any use; build it with rounded()
    "nextafter": 2,
}

#: Special functions evaluated in float64 by helper functions of the generated code
#: (``kiln/codegen/c/special_math.py``); build calls with :func:`special`.
SPECIAL_FUNCTIONS: dict[str, int] = {
    "bessel_j0": 1, "bessel_j1": 1, "bessel_y0": 1, "bessel_y1": 1, "bessel_i0": 1,
    "bessel_i1": 1, "bessel_k0": 1, "bessel_k1": 1, "bessel_k0e": 1, "bessel_k1e": 1,
    "airy_ai": 1, "spherical_j0": 1, "zeta": 2, "igamma": 2, "igammac": 2,
    "chebyshev_t": 2, "chebyshev_u": 2, "chebyshev_v": 2, "chebyshev_w": 2,
    "hermite_h": 2, "hermite_he": 2, "laguerre_l": 2, "legendre_p": 2,
}
INTRINSICS.update(SPECIAL_FUNCTIONS)


def rounded(value: Any) -> PrimExpr:
    """``value`` as a result of its own, rounded to its dtype before it is used.

    The C compiler fuses a product with an addition that uses it into one FMA (kiln compiles
    with ``-ffp-contract=fast``: GEMM-like loops need it), which skips the product's rounding.
    Inside one operator that is the operator's business; across the operators of a fused kernel
    it changes the model's result where the rounding matters: ``E[x^2] - E[x]^2`` whose
    ``E[x]^2`` overflows to inf gives ``inf - inf = NaN`` run node by node (onnxruntime, the
    ONNX reference) but ``fma(-m, m, inf) = inf`` fused. FuseTIR wraps each member's result that
    stays inside the kernel in it, so the fused kernel rounds as the operators would one after
    the other. Only a float product can be contracted; any other value is returned as it is.
    """
    v = convert(value)
    if not (v.dtype.is_float and isinstance(v, Mul)):
        return v
    return Call(v.dtype, "rounded", (v,))


def check_index(value: Any, n: Any, what: str, allow_negative: bool = True) -> PrimExpr:
    """``value``, an index along an axis of size ``n``, checked while the kernel runs.

    An index outside ``[-n, n)`` (``[0, n)`` without ``allow_negative``) makes the kernel
    record the failure, finish, and return an error: a
    :class:`~kiln.ir.errors.RuntimeCheckError` naming ``what``, the index and the model node
    (see ``kiln/codegen/c/func.py``). The result is the index in ``[0, n)``, a negative one
    counted from the end; after a failure it is 0, so the rest of the kernel reads in bounds.
    The check is a side effect that simplification keeps; ``hoist_checks`` moves a check out of
    the loops it does not depend on, so a gather checks each index once, not once per element
    of the row it picks.
    """
    v = cast("int64", convert(value))
    n = cast("int64", convert(n))
    lo = sub(IntImm("int64", 0), n) if allow_negative else IntImm("int64", 0)
    return Call(DataType("int64"), "check_index", (v, lo, n, StringImm(what)))


def is_check(node: Any) -> bool:
    """Whether ``node`` is a run-time check made by :func:`check_index`."""
    return isinstance(node, Call) and node.op == "check_index"


def call_intrin(name: str, *args: Any, dtype: Any = None) -> PrimExpr:
    if name not in INTRINSICS:
        raise KilnError(f"unknown intrinsic {name!r}")
    if len(args) != INTRINSICS[name]:
        raise KilnError(f"intrinsic {name} takes {INTRINSICS[name]} argument(s)")
    conv = [convert(a) for a in args]
    if len(conv) == 2:
        conv = list(_match(conv[0], conv[1]))
    if dtype is None:
        dtype = conv[0].dtype
        if name in ("isnan", "isinf"):
            dtype = DataType("bool").with_lanes(dtype.lanes)
    return Call(as_dtype(dtype), name, tuple(conv))


def special(name: str, *args: Any) -> PrimExpr:
    """The special function ``name`` (:data:`SPECIAL_FUNCTIONS`) of float operands of one
    dtype, evaluated in float64 and rounded once to that dtype."""
    if name not in SPECIAL_FUNCTIONS:
        raise KilnError(f"unknown special function {name!r}")
    conv = [convert(a) for a in args]
    dt = conv[0].dtype
    if not dt.is_float:
        raise DTypeError(f"{name} needs float operands, got {dt}")
    wide = DataType("float64").with_lanes(dt.lanes)
    return cast(dt, call_intrin(name, *[cast(wide, a) for a in conv]))


def _float_intrin(name: str):
    def f(x):
        x = convert(x)
        if not x.dtype.is_float:
            raise DTypeError(f"{name} needs a float operand, got {x.dtype}")
        return call_intrin(name, x)

    f.__name__ = name
    f.__doc__ = f"Elementwise {name} (floating point)."
    return f


exp = _float_intrin("exp")
log = _float_intrin("log")
sqrt = _float_intrin("sqrt")
rsqrt = _float_intrin("rsqrt")
tanh = _float_intrin("tanh")
erf = _float_intrin("erf")
sigmoid = _float_intrin("sigmoid")
floor = _float_intrin("floor")
ceil = _float_intrin("ceil")
round = _float_intrin("round")  # noqa: A001 - mirrors tir.round
trunc = _float_intrin("trunc")
sin = _float_intrin("sin")
cos = _float_intrin("cos")
log2 = _float_intrin("log2")
log1p = _float_intrin("log1p")
exp2 = _float_intrin("exp2")


def isnan(x) -> PrimExpr:
    return call_intrin("isnan", x)


def isinf(x) -> PrimExpr:
    return call_intrin("isinf", x)


def pow(x, y) -> PrimExpr:  # noqa: A001 - mirrors tir.pow
    return call_intrin("pow", x, y)


def fmod(x, y) -> PrimExpr:
    return call_intrin("fmod", x, y)


def fabs(x) -> PrimExpr:
    """Absolute value; integer operands give ``max(x, -x)``."""
    x = convert(x)
    if x.dtype.is_float:
        return call_intrin("fabs", x)
    if x.dtype.is_uint or x.dtype.is_bool:
        return x
    return Max(x, Sub(make_const(x.dtype, 0), x))


abs = fabs  # noqa: A001


def all_of(conds: Sequence[PrimExpr]) -> PrimExpr:
    """Conjunction of conditions (``True`` for an empty list)."""
    result: PrimExpr | None = None
    for c in conds:
        result = c if result is None else logical_and(result, c)
    return convert(True) if result is None else result


def any_of(conds: Sequence[PrimExpr]) -> PrimExpr:
    result: PrimExpr | None = None
    for c in conds:
        result = c if result is None else logical_or(result, c)
    return convert(False) if result is None else result
