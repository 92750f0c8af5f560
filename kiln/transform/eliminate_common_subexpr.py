"""EliminateCommonSubexpr: compute each distinct pure value of a block once.

Within one binding block, a binding whose value is *the same computation* as an earlier
binding's is removed and its uses read the earlier variable. "The same" means: a call of the
same operator (or ``call_tir`` of the same PrimFunc) with structurally equal attributes and
``sinfo_args`` and with arguments that are the very same variables (after earlier
replacements) or equal constants; or an equal Tuple / TupleGetItem. Only pure values qualify
(operator calls, ``call_tir``, tuples; never calls of graph or extern functions, which may have
effects). If a duplicate is a block output (a Var) and the earlier value lives in a DataflowVar,
the output is kept as an alias ``gv = lv`` so the DataflowVar does not escape the block.

The table of known values starts empty in every block and in every ``If`` branch: values are
never shared across blocks or between branches.

Constants take part by identity, or by value when small (up to
:data:`CONSTANT_COMPARE_ELEMENTS` elements), so large weights are never hashed.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..ir.module import IRModule
from ..ir.node import structural_equal, structural_hash
from .dead_code_elimination import op_is_pure
from .pass_infra import PassContext, function_pass
from .simplify_expr import RewriteMutator

__all__ = ["EliminateCommonSubexpr", "Exact", "attrs_equal", "attrs_key", "value_key"]

#: Constants with at most this many elements are compared by value; larger ones by identity.
CONSTANT_COMPARE_ELEMENTS = 64


def _const_key(c: gx.Constant) -> Any:
    if c.data.size <= CONSTANT_COMPARE_ELEMENTS:
        return ("const", str(c.data.dtype), c.data.shape, c.data.tobytes())
    return ("const-id", id(c))


def attrs_key(attrs: Any) -> Any:
    if attrs is None:
        return None
    if dataclasses.is_dataclass(attrs):
        return (type(attrs).__name__, structural_hash(
            tuple(getattr(attrs, f.name) for f in dataclasses.fields(attrs))))
    return structural_hash(attrs)


def attrs_equal(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is b
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a):
        return all(
            structural_equal(getattr(a, f.name), getattr(b, f.name), map_free_vars=False)
            for f in dataclasses.fields(a)
        )
    return structural_equal(a, b, map_free_vars=False)


def value_key(e: gx.Expr) -> Any:
    """A hashable key of a pure value (None when it must not be shared). Equal keys mean the
    same computation (the key is exact, not just a hash bucket)."""
    if isinstance(e, gx.Var):
        return ("var", id(e))
    if isinstance(e, gx.Constant):
        return _const_key(e)
    if isinstance(e, (gx.ShapeExpr, gx.PrimValue, gx.StringImm)):
        return ("leaf", type(e).__name__, Exact(e))
    if isinstance(e, gx.GlobalVar):
        return ("gvar", e.name)
    if isinstance(e, gx.Tuple):
        fields = tuple(value_key(f) for f in e.fields)
        return None if any(f is None for f in fields) else ("tuple", fields)
    if isinstance(e, gx.TupleGetItem):
        inner = value_key(e.tuple_value)
        return None if inner is None else ("get", inner, e.index)
    if isinstance(e, gx.Call) and isinstance(e.op, gx.Op) and op_is_pure(e.op.name):
        args = tuple(value_key(a) for a in e.args)
        if any(a is None for a in args):
            return None
        return ("call", e.op.name, Exact(e.attrs, attrs_key, attrs_equal), args,
                Exact(e.sinfo_args))
    return None


class Exact:
    """Wraps an IR value so it hashes structurally and compares exactly (no var renaming)."""

    __slots__ = ("value", "_hash", "_eq")

    def __init__(self, value: Any, key=None, eq=None):
        self.value = value
        self._hash = hash((key or structural_hash)(value))
        self._eq = eq or (lambda a, b: structural_equal(a, b, map_free_vars=False))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Exact) and self._hash == other._hash and self._eq(
            self.value, other.value)


class _CSE(RewriteMutator):
    def __init__(self, mod: IRModule | BlockBuilder | None):
        super().__init__(mod)
        self.table: dict[Any, gx.Var] = {}

    def _rebuild_block(self, b: gx.BindingBlock, dataflow: bool) -> gx.BindingBlock:
        saved, self.table = self.table, {}
        try:
            return super()._rebuild_block(b, dataflow)
        finally:
            self.table = saved

    def visit_with_new_scope(self, e: gx.Expr, params: tuple[gx.Var, ...] = ()) -> gx.Expr:
        saved, self.table = self.table, {}
        try:
            return super().visit_with_new_scope(e, params)
        finally:
            self.table = saved

    def rewrite(self, var: gx.Var, value: gx.Expr) -> gx.Expr | None:
        if isinstance(value, (gx.Var, gx.Constant)):
            return None
        key = value_key(value)
        if key is None:
            return None
        earlier = self.table.get(key)
        if earlier is not None:
            return earlier
        self.table[key] = var  # provisional: fixed up in visit_VarBinding if var is renamed
        return None

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        before = set(self.table)
        super().visit_VarBinding(b)
        new_var = self.var_remap.get(b.var, b.var)
        for k in set(self.table) - before:
            if self.table[k] is b.var:
                self.table[k] = new_var


@function_pass(opt_level=1)
class EliminateCommonSubexpr:
    """Bind each repeated pure computation of a block once and reuse its variable."""

    def transform_function(self, func: gx.Function, mod: IRModule,
                           ctx: PassContext) -> gx.Function:
        return _CSE(mod).visit(func)
