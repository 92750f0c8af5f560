"""Normalize and InferStructInfo: bring hand-built or hand-edited graph IR back to normal form.

``Normalize`` puts every graph function in A-normal form (a nested non-leaf argument such as
``relu(add(x, y))`` gets its own binding, emitted right before its user, as a DataflowVar inside
a dataflow block) and fills every missing ``struct_info`` through the op registry, exactly like
``BlockBuilder.emit`` does while building. It keeps StructInfo that is already there; a
variable annotation that contradicts its value's inferred StructInfo (rather than just being
less specific) is a StructInfoError naming the variable.

``InferStructInfo`` re-infers *everything*: every call, tuple and branch is rebuilt so its
StructInfo comes fresh from inference, every bound variable whose StructInfo changed is replaced
(with its later uses) and every function's ``ret_struct_info`` is derived again from its body.
It is the tool after hand edits that changed shapes (e.g. a parameter given a new shape), where
the memoized StructInfo of the old nodes would be stale.

Both run over graph functions callees first, so a call of another graph function infers from
the callee's already-normalized signature.
"""

from __future__ import annotations

from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import ExprMutator, ExprVisitor
from ..graph.struct_info import StructInfo, sinfo_equal, struct_info_lca
from ..ir.errors import InternalError, StructInfoError
from ..ir.module import IRModule
from .pass_infra import PassContext, module_pass

__all__ = ["InferStructInfo", "Normalize", "callees_first", "called_functions", "covers"]


def covers(annotation: StructInfo, inferred: StructInfo) -> bool:
    """Whether an annotation describes every value the inferred StructInfo describes (it may be
    less specific: unknown shape, ObjectStructInfo)."""
    return sinfo_equal(struct_info_lca(annotation, inferred), annotation)


def called_functions(func: gx.Function) -> list[str]:
    """Names of the module functions ``func`` refers to (through GlobalVars), first-use order."""
    names: dict[str, None] = {}

    class _V(ExprVisitor):
        def visit_GlobalVar(self, gv: gx.GlobalVar) -> None:
            names.setdefault(gv.name)

    _V().visit(func)
    return list(names)


def callees_first(mod: IRModule) -> list[str]:
    """Names of the graph functions of ``mod`` ordered so that callees come before callers
    (a post-order of the call graph; functions in a cycle are ordered arbitrarily)."""
    graph = {n: f for n, f in mod.items() if isinstance(f, gx.Function)}
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(name: str) -> None:
        stack = [(name, iter(called_functions(graph[name])))]
        state[name] = 1
        while stack:
            cur, it = stack[-1]
            nxt = next((c for c in it if c in graph and c not in state), None)
            if nxt is None:
                stack.pop()
                state[cur] = 2
                order.append(cur)
            else:
                state[nxt] = 1
                stack.append((nxt, iter(called_functions(graph[nxt]))))

    for name in graph:
        if name not in state:
            visit(name)
    return order


class _Normalizer(ExprMutator):
    """ExprMutator that A-normalizes every bound value and fills missing StructInfo."""

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        value = self.visit_expr(b.value)
        # anf=True emits nested non-leaf arguments into the current block first
        value = self.builder.normalize(value, anf=True)
        var = self._def(b.var)
        if var.struct_info is None:
            var = var.replace(struct_info=value.struct_info)
            self.var_remap[b.var] = var
        elif not covers(var.struct_info, value.struct_info):
            raise StructInfoError(
                f"Normalize: variable {b.var.name} is annotated {var.struct_info} but its value "
                f"has {value.struct_info}; run InferStructInfo to re-derive annotations"
            )
        if value is b.value and var is b.var:
            self.builder.emit_normalized(b)
        else:
            self.builder.emit_normalized(gx.VarBinding(var, value))

    def visit_MatchCast(self, b: gx.MatchCast) -> None:
        value = self.builder.normalize(self.visit_expr(b.value), anf=True)
        var = self._def(b.var)
        if var.struct_info is None:
            var = var.replace(struct_info=b.struct_info)
            self.var_remap[b.var] = var
        if value is b.value and var is b.var:
            self.builder.emit_normalized(b)
        else:
            self.builder.emit_normalized(gx.MatchCast(var, value, b.struct_info))

    def visit_SeqExpr(self, s: gx.SeqExpr) -> gx.Expr:
        blocks: list[gx.BindingBlock] = []
        changed = False
        for blk in s.blocks:
            nb = self.visit_binding_block(blk)
            changed |= nb is not blk
            if nb.bindings:
                blocks.append(nb)
            else:
                changed = True
        self.builder.begin_binding_block()
        body = self.builder.normalize(self.visit_expr(s.body), anf=True)
        if not gx.is_leaf(body):
            body = self.builder.emit(body)
        tail = self.builder.end_block()
        if tail.bindings:
            blocks.append(tail)
            changed = True
        if not changed and body is s.body and s.struct_info is not None:
            return s
        return self.builder.normalize(gx.SeqExpr(tuple(blocks), body))

    def visit_Function(self, f: gx.Function) -> gx.Expr:
        if not isinstance(f.body, gx.SeqExpr):
            f = gx.Function(f.params, gx.SeqExpr((), f.body), f.ret_struct_info, f.attrs)
        return super().visit_Function(f)


class Reinferrer(_Normalizer):
    """Rebuilds every compound expression so its StructInfo is inferred again."""

    def visit_Call(self, c: gx.Call) -> gx.Expr:
        op = c.op if isinstance(c.op, (gx.Op, gx.GlobalVar, gx.ExternFunc)) else self.visit_expr(
            c.op)
        args = tuple(self.visit_expr(a) for a in c.args)
        return self.builder.normalize(c.replace(op=op, args=args))

    def visit_Tuple(self, t: gx.Tuple) -> gx.Expr:
        return self.builder.normalize(gx.Tuple(tuple(self.visit_expr(f) for f in t.fields)))

    def visit_TupleGetItem(self, e: gx.TupleGetItem) -> gx.Expr:
        return self.builder.normalize(gx.TupleGetItem(self.visit_expr(e.tuple_value), e.index))

    def visit_If(self, e: gx.If) -> gx.Expr:
        cond = self.visit_expr(e.cond)
        tb = self.visit_with_new_scope(e.true_branch)
        fb = self.visit_with_new_scope(e.false_branch)
        return self.builder.normalize(gx.If(cond, tb, fb))

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        value = self.builder.normalize(self.visit_expr(b.value), anf=True)
        var = self._def(b.var)
        if var.struct_info is None or not sinfo_equal(var.struct_info, value.struct_info):
            var = var.replace(struct_info=value.struct_info)
            self.var_remap[b.var] = var
        self.builder.emit_normalized(gx.VarBinding(var, value))

    def visit_SeqExpr(self, s: gx.SeqExpr) -> gx.Expr:
        blocks = [nb for nb in (self.visit_binding_block(b) for b in s.blocks) if nb.bindings]
        self.builder.begin_binding_block()
        body = self.builder.normalize(self.visit_expr(s.body), anf=True)
        if not gx.is_leaf(body):
            body = self.builder.emit(body)
        tail = self.builder.end_block()
        if tail.bindings:
            blocks.append(tail)
        return self.builder.normalize(gx.SeqExpr(tuple(blocks), body))

    def visit_Function(self, f: gx.Function) -> gx.Expr:
        if not isinstance(f.body, gx.SeqExpr):
            f = gx.Function(f.params, gx.SeqExpr((), f.body), f.ret_struct_info, f.attrs)
        params = tuple(self._def(p) for p in f.params)
        body = self.visit_with_new_scope(f.body, params)
        return self.builder.normalize(gx.Function(params, body, None, f.attrs))


def _run(mod: IRModule, mutator_cls: type[_Normalizer]) -> IRModule:
    bb = BlockBuilder(mod)
    for name in callees_first(mod):
        func = mod[name]
        new = mutator_cls(bb).visit(func)
        if not isinstance(new, gx.Function):
            raise InternalError(f"normalizing {name} gave a {type(new).__name__}")
        if new is not func:
            bb.update_func(name, new)
    return bb.get()


@module_pass(opt_level=0)
class Normalize:
    """Put graph functions in A-normal form and fill every missing StructInfo."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return _run(mod, _Normalizer)


@module_pass(opt_level=0)
class InferStructInfo:
    """Re-infer the StructInfo of every expression, bound variable and function result."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return _run(mod, Reinferrer)
