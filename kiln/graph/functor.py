"""Visitors and mutators over graph expressions.

Dispatch is by class name: ``visit_Call``, ``visit_Tuple``, ``visit_Function``... Bindings go
through ``visit_binding`` (-> ``visit_VarBinding`` / ``visit_MatchCast``), blocks through
``visit_binding_block`` (-> ``visit_BindingBlock`` / ``visit_DataflowBlock``), and every
variable *definition* (function parameter, binding target) through ``visit_var_def``.

:class:`ExprMutator` rebuilds only what changed: an expression whose children come back
unchanged is returned as is (same object, same struct_info). Changed expressions are
re-normalized through the mutator's :class:`BlockBuilder` (``self.builder``), so StructInfo is
re-inferred; when a bound value's StructInfo changes, its variable is replaced by a new one with
the new StructInfo and later uses are remapped (``self.var_remap``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..ir.errors import InternalError
from ..ir.module import IRModule
from ..ir.node import Node
from .block_builder import BlockBuilder
from .expr import (
    Binding,
    BindingBlock,
    Call,
    DataflowBlock,
    Expr,
    ExternFunc,
    Function,
    GlobalVar,
    If,
    MatchCast,
    Op,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
    VarBinding,
    is_leaf,
)
from .struct_info import sinfo_equal


class ExprVisitor:
    """Walks graph IR; override ``visit_<ClassName>`` (call the base to keep walking)."""

    def visit(self, x: Any) -> None:
        """Visit an expression, binding, block, or an IRModule's graph functions."""
        if isinstance(x, Expr):
            self.visit_expr(x)
        elif isinstance(x, Binding):
            self.visit_binding(x)
        elif isinstance(x, BindingBlock):
            self.visit_binding_block(x)
        elif isinstance(x, IRModule):
            for func in x.functions.values():
                if isinstance(func, Function):
                    self.visit_expr(func)
        else:
            raise InternalError(f"ExprVisitor cannot visit {type(x).__name__}")

    def visit_expr(self, e: Expr) -> None:
        method = getattr(self, "visit_" + type(e).__name__, None)
        if method is None:
            raise InternalError(f"{type(self).__name__} has no visit_{type(e).__name__}")
        method(e)

    # leaves
    def visit_Var(self, v: Var) -> None:
        pass

    def visit_DataflowVar(self, v: Var) -> None:
        self.visit_Var(v)

    def _leaf(self, e: Expr) -> None:
        pass

    visit_Constant = visit_GlobalVar = visit_Op = visit_ExternFunc = _leaf
    visit_ShapeExpr = visit_PrimValue = visit_StringImm = _leaf

    # compound
    def visit_Call(self, c: Call) -> None:
        self.visit_expr(c.op)
        for a in c.args:
            self.visit_expr(a)

    def visit_Tuple(self, t: Tuple) -> None:
        for f in t.fields:
            self.visit_expr(f)

    def visit_TupleGetItem(self, e: TupleGetItem) -> None:
        self.visit_expr(e.tuple_value)

    def visit_If(self, e: If) -> None:
        self.visit_expr(e.cond)
        self.visit_expr(e.true_branch)
        self.visit_expr(e.false_branch)

    def visit_SeqExpr(self, s: SeqExpr) -> None:
        for b in s.blocks:
            self.visit_binding_block(b)
        self.visit_expr(s.body)

    def visit_Function(self, f: Function) -> None:
        for p in f.params:
            self.visit_var_def(p)
        self.visit_expr(f.body)

    # blocks and bindings
    def visit_binding_block(self, b: BindingBlock) -> None:
        if isinstance(b, DataflowBlock):
            self.visit_DataflowBlock(b)
        else:
            self.visit_BindingBlock(b)

    def visit_BindingBlock(self, b: BindingBlock) -> None:
        for binding in b.bindings:
            self.visit_binding(binding)

    def visit_DataflowBlock(self, b: DataflowBlock) -> None:
        for binding in b.bindings:
            self.visit_binding(binding)

    def visit_binding(self, b: Binding) -> None:
        if isinstance(b, MatchCast):
            self.visit_MatchCast(b)
        else:
            self.visit_VarBinding(b)

    def visit_VarBinding(self, b: VarBinding) -> None:
        self.visit_expr(b.value)
        self.visit_var_def(b.var)

    def visit_MatchCast(self, b: MatchCast) -> None:
        self.visit_expr(b.value)
        self.visit_var_def(b.var)

    def visit_var_def(self, v: Var) -> None:
        pass


class ExprMutator:
    """Rebuilds graph IR bottom-up (see the module docstring).

    ``ExprMutator(mod)`` makes a builder over ``mod`` (so calls of module functions infer);
    ``ExprMutator(bb)`` shares an existing BlockBuilder (e.g. a pass's, to ``add_func``).
    """

    def __init__(self, mod: IRModule | BlockBuilder | None = None):
        self.builder = mod if isinstance(mod, BlockBuilder) else BlockBuilder(mod)
        self.var_remap: dict[Var, Var] = {}

    def visit(self, x: Any) -> Any:
        """Mutate an expression (typically a Function); returns the new one."""
        if isinstance(x, Expr):
            return self.visit_expr(x)
        raise InternalError(f"ExprMutator cannot visit {type(x).__name__}")

    def visit_expr(self, e: Expr) -> Expr:
        method = getattr(self, "visit_" + type(e).__name__, None)
        if method is None:
            raise InternalError(f"{type(self).__name__} has no visit_{type(e).__name__}")
        return method(e)

    # leaves
    def visit_Var(self, v: Var) -> Expr:
        return self.var_remap.get(v, v)

    def visit_DataflowVar(self, v: Var) -> Expr:
        return self.visit_Var(v)

    def _leaf(self, e: Expr) -> Expr:
        return e

    visit_Constant = visit_GlobalVar = visit_Op = visit_ExternFunc = _leaf
    visit_ShapeExpr = visit_PrimValue = visit_StringImm = _leaf

    # compound
    def visit_Call(self, c: Call) -> Expr:
        op = c.op if isinstance(c.op, (Op, GlobalVar, ExternFunc)) else self.visit_expr(c.op)
        args = tuple(self.visit_expr(a) for a in c.args)
        if op is c.op and all(a is b for a, b in zip(args, c.args)):
            return self.builder.normalize(c) if c.struct_info is None else c
        return self.builder.normalize(c.replace(op=op, args=args))

    def visit_Tuple(self, t: Tuple) -> Expr:
        fields = tuple(self.visit_expr(f) for f in t.fields)
        if all(a is b for a, b in zip(fields, t.fields)):
            return t
        return self.builder.normalize(Tuple(fields))

    def visit_TupleGetItem(self, e: TupleGetItem) -> Expr:
        tv = self.visit_expr(e.tuple_value)
        if tv is e.tuple_value:
            return e
        return self.builder.normalize(TupleGetItem(tv, e.index))

    def visit_If(self, e: If) -> Expr:
        cond = self.visit_expr(e.cond)
        tb = self.visit_with_new_scope(e.true_branch)
        fb = self.visit_with_new_scope(e.false_branch)
        if cond is e.cond and tb is e.true_branch and fb is e.false_branch:
            return e
        return self.builder.normalize(If(cond, tb, fb))

    def visit_Function(self, f: Function) -> Expr:
        params = tuple(self._def(p) for p in f.params)
        body = self.visit_with_new_scope(f.body, params)
        if body is f.body and all(a is b for a, b in zip(params, f.params)):
            if f.struct_info is not None and isinstance(f.body, SeqExpr):
                return f
            return self.builder.normalize(f, anf=True)  # complete a hand-built function
        ret = f.ret_struct_info
        old_body = f.body.struct_info
        if ret is not None and old_body is not None and body.struct_info is not None and (
            not sinfo_equal(old_body, body.struct_info)
        ):
            ret = None  # the result changed: derive it again from the new body
        return self.builder.normalize(Function(params, body, ret, f.attrs))

    def visit_SeqExpr(self, s: SeqExpr) -> Expr:
        blocks: list[BindingBlock] = []
        changed = False
        for b in s.blocks:
            nb = self.visit_binding_block(b)
            changed |= nb is not b
            if nb.bindings:
                blocks.append(nb)
            else:
                changed |= bool(b.bindings)
        # the result may itself need bindings (a mutated non-leaf body)
        self.builder.begin_binding_block()
        body = self.visit_expr(s.body)
        if body is not s.body and not is_leaf(body):
            body = self.builder.emit(body)
        tail = self.builder.end_block()
        if tail.bindings:
            blocks.append(tail)
            changed = True
        if not changed and body is s.body:
            return s
        return self.builder.normalize(SeqExpr(tuple(blocks), body))

    def visit_with_new_scope(self, e: Expr, params: tuple[Var, ...] = ()) -> Expr:
        """Visit a function body or branch in its own builder scope (result is a SeqExpr if
        any binding had to be emitted)."""
        self.builder.begin_scope(params)
        try:
            if isinstance(e, SeqExpr):
                return self.visit_expr(e)
            self.builder.begin_binding_block()
            new = self.visit_expr(e)
            block = self.builder.end_block()
            if not block.bindings:
                return new
            if not is_leaf(new):
                raise InternalError("a mutated non-SeqExpr body emitted bindings")
            return self.builder.normalize(SeqExpr((block,), new))
        finally:
            self.builder.end_scope()

    # blocks and bindings
    def visit_binding_block(self, b: BindingBlock) -> BindingBlock:
        if isinstance(b, DataflowBlock):
            return self.visit_DataflowBlock(b)
        return self.visit_BindingBlock(b)

    def _rebuild_block(self, b: BindingBlock, dataflow: bool) -> BindingBlock:
        if dataflow:
            self.builder.begin_dataflow_block()
        else:
            self.builder.begin_binding_block()
        for binding in b.bindings:
            self.visit_binding(binding)
        new = self.builder.end_block()
        if len(new.bindings) == len(b.bindings) and all(
            x is y for x, y in zip(new.bindings, b.bindings)
        ):
            return b
        return new

    def visit_BindingBlock(self, b: BindingBlock) -> BindingBlock:
        return self._rebuild_block(b, dataflow=False)

    def visit_DataflowBlock(self, b: DataflowBlock) -> BindingBlock:
        return self._rebuild_block(b, dataflow=True)

    def visit_binding(self, b: Binding) -> None:
        """Visit one binding, emitting its (possibly new) form into ``self.builder``.

        Calls emitted while rewriting it inherit its call's span (the model nodes it came from),
        so every pass built on this mutator keeps provenance without doing anything.
        """
        span = b.value.span if isinstance(b.value, Call) else None
        with self.builder.span(span):
            if isinstance(b, MatchCast):
                self.visit_MatchCast(b)
            else:
                self.visit_VarBinding(b)

    def visit_VarBinding(self, b: VarBinding) -> None:
        value = self.visit_expr(b.value)
        if value is not b.value:
            value = self.builder.normalize(value, anf=True)
        var = self._def(b.var)
        if value is b.value and var is b.var:
            self.builder.emit_normalized(b)
            return
        if value.struct_info is None:
            raise InternalError(f"binding of {b.var.name}: value has no struct_info")
        if not sinfo_equal(var.struct_info, value.struct_info):
            var = var.replace(struct_info=value.struct_info)
            self.var_remap[b.var] = var
        self.builder.emit_normalized(VarBinding(var, value))

    def visit_MatchCast(self, b: MatchCast) -> None:
        value = self.visit_expr(b.value)
        if value is not b.value:
            value = self.builder.normalize(value, anf=True)
        var = self._def(b.var)
        if value is b.value and var is b.var:
            self.builder.emit_normalized(b)
            return
        self.builder.emit_normalized(MatchCast(var, value, b.struct_info))

    def visit_var_def(self, v: Var) -> Var:
        """Called for every variable definition; return a different Var to rename it."""
        return v

    def _def(self, v: Var) -> Var:
        new = self.visit_var_def(v)
        if new is not v:
            self.var_remap[v] = new
        return new


def post_order_visit(expr: Any, fvisit: Callable[[Node], None]) -> None:
    """Call ``fvisit`` once on every expression and binding under ``expr``, children first."""
    seen: set[int] = set()

    class _V(ExprVisitor):
        def visit_expr(self, e: Expr) -> None:
            if id(e) in seen:
                return
            seen.add(id(e))
            super().visit_expr(e)
            fvisit(e)

        def visit_binding(self, b: Binding) -> None:
            super().visit_binding(b)
            fvisit(b)

    _V().visit(expr)


def free_vars(expr: Expr) -> list[Var]:
    """Graph variables used in ``expr`` but not defined inside it (first-use order)."""
    bound: set[int] = set()
    free: dict[int, Var] = {}

    class _V(ExprVisitor):
        def visit_var_def(self, v: Var) -> None:
            bound.add(id(v))

        def visit_Var(self, v: Var) -> None:
            if id(v) not in bound and id(v) not in free:
                free[id(v)] = v

    _V().visit(expr)
    return list(free.values())


def binding_uses(func: Function) -> dict[int, int]:
    """How many times each variable is used in the flat (A-normal form) body of ``func``: as a
    call operand, inside a tuple, as an alias or as the output; by ``id``. What a pass that fuses
    a chain asks: a value used once may stay inside the fused kernel."""
    counts: dict[int, int] = {}

    def visit(e: Any) -> None:
        if isinstance(e, Var):
            counts[id(e)] = counts.get(id(e), 0) + 1
        elif isinstance(e, Call):
            for a in e.args:
                visit(a)
        elif isinstance(e, Tuple):
            for f in e.fields:
                visit(f)
        elif isinstance(e, TupleGetItem):
            visit(e.tuple_value)

    for blk in func.body.blocks:
        for b in blk.bindings:
            visit(b.value)
    visit(func.body.body)
    return counts


def bound_vars(expr: Expr) -> list[Var]:
    """Graph variables defined inside ``expr`` (parameters and binding targets), in order."""
    out: list[Var] = []

    class _V(ExprVisitor):
        def visit_var_def(self, v: Var) -> None:
            out.append(v)

    _V().visit(expr)
    return out
