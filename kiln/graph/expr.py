"""Graph-level expressions (Relax style): calls of operators on tensors, in A-normal form.

A graph function is a ``Function`` whose body is a ``SeqExpr``: a list of binding blocks (each a
list of ``var = value`` bindings; a ``DataflowBlock`` is a side-effect-free region whose local
variables are ``DataflowVar``\\ s) and a final result expression.

``struct_info`` design (every Expr has one once normalized):

- For variables it is a real field given at construction (``Var(name, struct_info)``) and part
  of the variable's identity: two variables pair up in structural equality only if their
  StructInfo agree.
- For every other expression it is a *derived* attribute (a keyword-only dataclass field,
  default None) that structural equality and hashing ignore. Leaves (``Constant``,
  ``ShapeExpr``, ``PrimValue``...), ``Tuple``/``TupleGetItem`` of normalized values,
  ``call_tir`` calls and ``Function``/``SeqExpr`` with a normalized body compute it at
  construction; an operator ``Call`` gets it from ``BlockBuilder.normalize``/``emit``, which runs
  the op's inference. That is the one place a frozen node is written after construction: the
  normalizer fills a ``None`` struct_info exactly once (it is a deterministic function of the
  node, like a cache) and never overwrites one. ``node.replace(...)`` on an expression drops the
  derived struct_info so a changed node is always re-inferred.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import field
from typing import Any

import numpy as np

from .. import tir
from ..ir.dtype import DataType, as_dtype
from ..ir.errors import KilnError, StructInfoError
from ..ir.node import Node, node, set_field
from ..ir.span import Span
from .struct_info import (
    FuncStructInfo,
    ObjectStructInfo,
    PrimStructInfo,
    ShapeStructInfo,
    StructInfo,
    TensorStructInfo,
    TupleStructInfo,
    as_shape,
    collect_sym_vars,
    erase_sym_vars,
)


def _sinfo_field() -> Any:
    return field(default=None, kw_only=True)


class Expr(Node):
    """Base of graph expressions; ``struct_info`` is set once normalized (see module doc)."""

    struct_info: StructInfo | None
    _ignore_fields = ("span", "struct_info")

    def replace(self, **changes: Any):
        """A copy with some fields changed; the derived struct_info is recomputed/re-inferred."""
        changes.setdefault("struct_info", None)
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def _fill_struct_info(self, sinfo: StructInfo) -> None:
        """Memoize the inferred StructInfo (normalizer only; never overwrites)."""
        if self.struct_info is None:
            set_field(self, "struct_info", sinfo)


def _check_sinfo(sinfo: Any, what: str) -> None:
    if sinfo is not None and not isinstance(sinfo, StructInfo):
        raise StructInfoError(f"{what}: struct_info must be a StructInfo, got {sinfo!r}")


# ---------------------------------------------------------------------------------------------
# variables and leaves
# ---------------------------------------------------------------------------------------------
@node
class Var(Expr):
    """A graph variable: a function parameter or the result of a binding."""

    name: str
    struct_info: StructInfo | None = None

    _is_var = True
    _type_fields = ("struct_info",)

    def __post_init__(self):
        _check_sinfo(self.struct_info, f"variable {self.name}")

    @property
    def name_hint(self) -> str:
        return self.name

    def replace(self, **changes: Any):
        """A copy (a *different* variable) with some fields changed; struct_info is kept."""
        return dataclasses.replace(self, **changes)


@node
class DataflowVar(Var):
    """A variable local to a dataflow block (not visible after the block)."""


@node
class GlobalVar(Expr):
    """Refers to a function of the IRModule by name (compared by name)."""

    name: str
    struct_info: StructInfo | None = _sinfo_field()

    @property
    def name_hint(self) -> str:
        return self.name


@node
class Op(Expr):
    """A registered operator, by name (``kiln.graph.op_registry.get_op_def(op.name)`` is its
    declaration)."""

    name: str
    struct_info: StructInfo | None = _sinfo_field()


@node
class ExternFunc(Expr):
    """A function provided by the runtime or a linked library, by symbol name."""

    symbol: str
    struct_info: StructInfo | None = _sinfo_field()


@node
class Constant(Expr):
    """A constant tensor. ``data`` is kept as a read-only view (not copied)."""

    data: np.ndarray
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        data = self.data
        if not isinstance(data, np.ndarray):
            data = np.asarray(data)
        if data.flags.writeable:
            data = data.view()
            data.flags.writeable = False
        dtype = DataType.from_numpy(data.dtype)
        set_field(self, "data", data)
        set_field(self, "struct_info", TensorStructInfo(data.shape, dtype))

    @property
    def dtype(self) -> DataType:
        return self.struct_info.dtype  # type: ignore[union-attr]


@node
class ShapeExpr(Expr):
    """A shape value, e.g. the target shape of a reshape: ``ShapeExpr((n, 4))``."""

    values: tuple[tir.PrimExpr, ...]
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        values = as_shape(self.values, "ShapeExpr")
        set_field(self, "values", values)
        set_field(self, "struct_info", ShapeStructInfo(values))


@node
class PrimValue(Expr):
    """A scalar value (python ints become int64)."""

    value: tir.PrimExpr
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        v = self.value
        if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)):
            v = tir.IntImm("int64", int(v))
        elif not isinstance(v, tir.PrimExpr):
            v = tir.convert(v)
        set_field(self, "value", v)
        set_field(self, "struct_info", PrimStructInfo(v.dtype, v))


@node
class StringImm(Expr):
    """A string value (e.g. an attribute passed as an argument)."""

    value: str
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        set_field(self, "struct_info", ObjectStructInfo())


# ---------------------------------------------------------------------------------------------
# compound expressions
# ---------------------------------------------------------------------------------------------
@node
class Call(Expr):
    """``op(*args)``: op is an ``Op``, a ``GlobalVar``, an ``ExternFunc`` or a function value.

    ``attrs`` is the op's attribute dataclass (or None); ``sinfo_args`` give the result's
    StructInfo where it cannot be inferred (``call_tir``, extern and PrimFunc calls).
    ``span`` names the model nodes the call was made from (:mod:`kiln.ir.span`); like
    struct_info it is ignored by structural equality and kept by ``replace``.
    """

    op: Expr
    args: tuple[Expr, ...]
    attrs: Any = None
    sinfo_args: tuple[StructInfo, ...] = ()
    struct_info: StructInfo | None = _sinfo_field()
    span: Span | None = field(default=None, kw_only=True)

    def with_span(self, span: Span | None) -> Call:
        """This call with ``span`` (struct_info kept: the value is the same)."""
        return self if span is self.span else dataclasses.replace(self, span=span)

    def __post_init__(self):
        if not isinstance(self.op, Expr):
            raise KilnError(f"Call: op must be an Op, GlobalVar, ExternFunc or Expr: {self.op!r}")
        if isinstance(self.args, (str, bytes)) or not isinstance(self.args, Sequence):
            raise KilnError(f"Call of {_callee_name(self.op)}: args must be a sequence")
        set_field(self, "args", tuple(as_expr(a) for a in self.args))
        sinfo_args = tuple(self.sinfo_args)
        for s in sinfo_args:
            _check_sinfo(s, f"Call of {_callee_name(self.op)} sinfo_args")
        set_field(self, "sinfo_args", sinfo_args)
        _check_sinfo(self.struct_info, f"Call of {_callee_name(self.op)}")
        if self.struct_info is None and isinstance(self.op, Op) and self.op.name == "call_tir":
            if len(sinfo_args) == 1:
                set_field(self, "struct_info", sinfo_args[0])


def _callee_name(op: Any) -> str:
    if isinstance(op, Op | GlobalVar):
        return op.name
    if isinstance(op, ExternFunc):
        return op.symbol
    return type(op).__name__


@node
class Tuple(Expr):
    """A tuple of values."""

    fields: tuple[Expr, ...]
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        if isinstance(self.fields, (str, bytes)) or not isinstance(self.fields, Sequence):
            raise KilnError(f"Tuple: fields must be a sequence, got {self.fields!r}")
        fields = tuple(as_expr(f) for f in self.fields)
        set_field(self, "fields", fields)
        if self.struct_info is None and all(f.struct_info is not None for f in fields):
            set_field(self, "struct_info", TupleStructInfo(tuple(f.struct_info for f in fields)))


@node
class TupleGetItem(Expr):
    """``tuple_value[index]``."""

    tuple_value: Expr
    index: int
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        if not isinstance(self.index, (int, np.integer)) or isinstance(self.index, bool):
            raise KilnError(f"TupleGetItem: index must be an int, got {self.index!r}")
        set_field(self, "index", int(self.index))
        ts = self.tuple_value.struct_info
        if self.struct_info is None and isinstance(ts, TupleStructInfo):
            if 0 <= self.index < len(ts.fields):
                set_field(self, "struct_info", ts.fields[self.index])


@node
class If(Expr):
    """``true_branch if cond else false_branch``; branches are SeqExprs once normalized."""

    cond: Expr
    true_branch: Expr
    false_branch: Expr
    struct_info: StructInfo | None = _sinfo_field()


# ---------------------------------------------------------------------------------------------
# bindings, blocks, sequences, functions
# ---------------------------------------------------------------------------------------------
class Binding(Node):
    """Base of ``VarBinding`` and ``MatchCast``: binds ``var`` in the rest of the scope."""

    var: Var
    value: Expr


@node
class VarBinding(Binding):
    """``var = value``."""

    var: Var
    value: Expr


@node
class MatchCast(Binding):
    """``var = match_cast(value, struct_info)``: asserts (at run time) and refines StructInfo.

    New symbolic variables in ``struct_info`` are defined here (bound from the value's shape).
    """

    var: Var
    value: Expr
    struct_info: StructInfo


@node
class BindingBlock(Node):
    """A list of bindings that may have side effects (run in order)."""

    bindings: tuple[Binding, ...]

    def __post_init__(self):
        set_field(self, "bindings", tuple(self.bindings))


@node
class DataflowBlock(BindingBlock):
    """A side-effect-free block; its local results are DataflowVars."""


@node
class SeqExpr(Expr):
    """Binding blocks followed by a result ``body``."""

    blocks: tuple[BindingBlock, ...]
    body: Expr
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        set_field(self, "blocks", tuple(self.blocks))
        if self.struct_info is None and self.body.struct_info is not None:
            set_field(self, "struct_info", self.body.struct_info)


@node
class Function(Expr):
    """A graph function. ``ret_struct_info`` defaults to the body's (symbolic dims not bound
    by the parameters are erased)."""

    params: tuple[Var, ...]
    body: Expr
    ret_struct_info: StructInfo | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    struct_info: StructInfo | None = _sinfo_field()

    def __post_init__(self):
        params = tuple(self.params)
        for p in params:
            if not isinstance(p, Var):
                raise KilnError(f"Function parameters must be Vars, got {p!r}")
            if p.struct_info is None:
                raise StructInfoError(f"Function parameter {p.name} has no struct_info")
        set_field(self, "params", params)
        set_field(self, "attrs", dict(self.attrs))
        _check_sinfo(self.ret_struct_info, "Function ret_struct_info")
        if self.ret_struct_info is None and self.body.struct_info is not None:
            keep = {id(v) for p in params for v in collect_sym_vars(p.struct_info)}
            set_field(self, "ret_struct_info", erase_sym_vars(self.body.struct_info, keep))
        if self.struct_info is None and self.ret_struct_info is not None:
            sinfo = FuncStructInfo(tuple(p.struct_info for p in params), self.ret_struct_info)
            set_field(self, "struct_info", sinfo)

    def with_attr(self, key: str, value: Any) -> Function:
        attrs = dict(self.attrs)
        attrs[key] = value
        return self.replace(attrs=attrs)


# ---------------------------------------------------------------------------------------------
# construction helpers
# ---------------------------------------------------------------------------------------------
def const(value: Any, dtype: Any = None) -> Constant:
    """A Constant from an array or python value. Python floats default to float32 and python
    ints to int64; numpy arrays and scalars keep their dtype unless ``dtype`` is given."""
    if isinstance(value, Constant):
        if dtype is None or as_dtype(dtype) == value.dtype:
            return value
        value = value.data
    if isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
    else:
        try:
            arr = np.asarray(value)
        except Exception as err:  # noqa: BLE001 - e.g. ragged lists
            raise KilnError(f"cannot make a constant from {value!r}: {err}") from err
        if dtype is None:
            if arr.dtype.kind == "f":
                arr = arr.astype(np.float32)
            elif arr.dtype.kind in "iu":
                arr = arr.astype(np.int64)
            elif arr.dtype.kind != "b":
                raise KilnError(f"cannot make a constant from {value!r} ({arr.dtype})")
    if dtype is not None:
        arr = arr.astype(as_dtype(dtype).to_numpy())
    return Constant(arr)


def _is_numeric_tree(x: Any) -> bool:
    if isinstance(x, (bool, int, float, np.generic)):
        return True
    if isinstance(x, (list, tuple)):
        return bool(x) and all(_is_numeric_tree(e) for e in x)
    return False


def as_expr(x: Any) -> Expr:
    """Convert a python value to a graph expression.

    Exprs pass through; numpy arrays and python/numpy scalars become Constants (float32 / int64
    by default); lists/tuples of numbers become a Constant array, other lists/tuples a Tuple of
    converted fields; TIR PrimExprs become PrimValues and strings StringImms.
    """
    if isinstance(x, Expr):
        return x
    if isinstance(x, tir.PrimExpr):
        return PrimValue(x)
    if isinstance(x, str):
        return StringImm(x)
    if isinstance(x, (np.ndarray, np.generic, bool, int, float)):
        return const(x)
    if isinstance(x, (list, tuple)):
        if _is_numeric_tree(x):
            return const(x)
        return Tuple(tuple(as_expr(e) for e in x))
    raise KilnError(f"cannot convert {type(x).__name__} {x!r} to a graph expression")


def call_tir(gvar: GlobalVar, args: Any, out_sinfo: Any) -> Call:
    """Call the PrimFunc ``gvar`` on ``args`` (destination passing: outputs are allocated by the
    caller). ``out_sinfo`` is the output's TensorStructInfo, or a list of them (one per output);
    it is also the call's StructInfo."""
    if not isinstance(gvar, GlobalVar):
        raise KilnError(f"call_tir: callee must be a GlobalVar, got {gvar!r}")
    if isinstance(args, Expr) and not isinstance(args, Tuple):
        args = Tuple((args,))
    elif not isinstance(args, Tuple):
        args = Tuple(tuple(as_expr(a) for a in args))
    if isinstance(out_sinfo, (list, tuple)):
        out = list(out_sinfo)
        out_sinfo = out[0] if len(out) == 1 else TupleStructInfo(tuple(out))
    tensors = out_sinfo.fields if isinstance(out_sinfo, TupleStructInfo) else (out_sinfo,)
    for i, s in enumerate(tensors):
        if not isinstance(s, TensorStructInfo):
            raise StructInfoError(
                f"call_tir {gvar.name}: output {i} must be a TensorStructInfo, got {s!r}"
            )
    return Call(Op("call_tir"), (gvar, args), None, (out_sinfo,))


def is_call_tir(expr: Any) -> bool:
    return isinstance(expr, Call) and isinstance(expr.op, Op) and expr.op.name == "call_tir"


_LEAVES = (Var, Constant, ShapeExpr, PrimValue, StringImm, GlobalVar, ExternFunc, Op)


def is_leaf(expr: Expr) -> bool:
    """True for values allowed as call arguments in A-normal form (a Tuple of leaves too)."""
    if isinstance(expr, _LEAVES):
        return True
    if isinstance(expr, Tuple):
        return all(is_leaf(f) for f in expr.fields)
    return False
