"""Inline: replace calls of small private graph functions by the functions' bodies.

A call ``v = f(a, b)`` of a module-level graph function ``f`` is inlined when

- ``f`` is *private*: not named ``"main"`` and without a ``"global_symbol"`` attribute (an
  entry point may be called from outside, so it must stay), and
- ``f`` asks for it with the attribute ``"inline": True``, or it is called exactly once in the
  whole module (inlining then never duplicates code), or the pass was given its name in
  ``functions=``;

and it is *not* inlined when ``f`` has ``"inline": False``, is recursive (directly or through
other functions), or cannot be flattened into the call site: bindings with possible side
effects (see :func:`~kiln.transform.dead_code_elimination.is_pure`) cannot enter a dataflow
block, and functions with ``MatchCast`` bindings (which define symbolic variables of their own)
are never inlined.

Inlining flattens ``f``'s bindings into the caller's current block, with fresh variables (of the
block's kind: DataflowVars inside a dataflow block), parameters replaced by the arguments and
``f``'s symbolic dimensions replaced by the caller's sizes (bound from the arguments' shapes);
values are re-normalized so StructInfo is the caller's. ``v`` then reads ``f``'s result. Callees
are processed first, so nested calls inline all the way down. A private function that was
inlined and is no longer referenced is removed from the module.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import tir
from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import ExprMutator, ExprVisitor
from ..graph.struct_info import StructInfo, TensorStructInfo, TupleStructInfo, sinfo_equal
from ..ir.module import IRModule
from .bind_params import SymSubstituter
from .dead_code_elimination import Purity, reachable_functions
from .normalize import called_functions, callees_first
from .pass_infra import PassContext, module_pass
from .simplify_expr import can_alias

__all__ = ["Inline"]


def is_private(name: str, func: gx.Function) -> bool:
    """Not an entry point: may be inlined into its callers and dropped."""
    return name != "main" and "global_symbol" not in func.attrs


def _call_counts(mod: IRModule) -> dict[str, int]:
    counts: dict[str, int] = {}

    class _V(ExprVisitor):
        def visit_GlobalVar(self, gv: gx.GlobalVar) -> None:
            counts[gv.name] = counts.get(gv.name, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, gx.Function):
            _V().visit(func)
    return counts


def _recursive(mod: IRModule) -> set[str]:
    """Graph functions that can reach themselves through calls."""
    out = set()
    for name, func in mod.items():
        if isinstance(func, gx.Function):
            direct = [c for c in called_functions(func) if c in mod]
            if name in reachable_functions(mod, direct):
                out.add(name)
    return out


def _has_match_cast(func: gx.Function) -> bool:
    found = []

    class _V(ExprVisitor):
        def visit_MatchCast(self, b: gx.MatchCast) -> None:
            found.append(b)

    _V().visit(func)
    return bool(found)


def _bind_sym(param: StructInfo, arg: StructInfo, vmap: dict) -> None:
    """Bind the symbolic dims of a callee parameter from the caller's argument StructInfo."""
    if isinstance(param, TensorStructInfo) and isinstance(arg, TensorStructInfo):
        if param.shape is not None and arg.shape is not None:
            for p, a in zip(param.shape, arg.shape):
                if isinstance(p, tir.Var) and p not in vmap:
                    vmap[p] = a
    elif isinstance(param, TupleStructInfo) and isinstance(arg, TupleStructInfo):
        for p, a in zip(param.fields, arg.fields):
            _bind_sym(p, a, vmap)


class _BodyCopier(SymSubstituter):
    """Re-emits a callee's bindings into the caller's current block with fresh variables."""

    def __init__(self, bb: BlockBuilder, vmap: dict, args: dict[gx.Var, gx.Expr]):
        super().__init__(bb, vmap)
        self.args = args

    def visit_Var(self, v: gx.Var) -> gx.Expr:
        if v in self.args:
            return self.args[v]
        return super().visit_Var(v)

    def visit_var_def(self, v: gx.Var) -> gx.Var:
        sinfo = super().visit_var_def(v).struct_info
        cls = gx.DataflowVar if self.builder.current_block_is_dataflow() else gx.Var
        return cls(v.name, sinfo)

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        value = self.visit_expr(b.value)
        value = self.builder.normalize(value, anf=True)
        var = self._def(b.var)
        var = var.replace(struct_info=value.struct_info)
        self.var_remap[b.var] = var
        self.builder.emit_normalized(gx.VarBinding(var, value))


class _Inliner(ExprMutator):
    def __init__(self, bb: BlockBuilder, funcs: dict[str, Any], targets: set[str],
                 purity: Purity):
        super().__init__(bb)
        self.funcs = funcs
        self.targets = targets
        self.purity = purity
        self.inlined: set[str] = set()

    def _callee(self, value: gx.Expr) -> gx.Function | None:
        if not (isinstance(value, gx.Call) and isinstance(value.op, gx.GlobalVar)):
            return None
        name = value.op.name
        if name not in self.targets:
            return None
        func = self.funcs.get(name)
        if not isinstance(func, gx.Function) or not isinstance(func.body, gx.SeqExpr):
            return None
        if self.builder.current_block_is_dataflow() and not self.purity.function(name):
            return None
        if len(func.params) != len(value.args):
            return None
        return func

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        value = self.visit_expr(b.value)
        if value is not b.value:
            value = self.builder.normalize(value, anf=True)
        func = self._callee(value)
        if func is None:
            if value is b.value:
                self.builder.emit_normalized(b)
            else:
                var = self._def(b.var)
                if not _same(var.struct_info, value.struct_info):
                    var = var.replace(struct_info=value.struct_info)
                    self.var_remap[b.var] = var
                self.builder.emit_normalized(gx.VarBinding(var, value))
            return
        result = self._inline(func, value.args)
        self.inlined.add(value.op.name)
        if isinstance(result, gx.Var) and can_alias(b.var, result):
            self.var_remap[b.var] = result
            return
        result = self.builder.normalize(result, anf=True)
        var = b.var
        if not _same(var.struct_info, result.struct_info):
            var = var.replace(struct_info=result.struct_info)
            self.var_remap[b.var] = var
        self.builder.emit_normalized(gx.VarBinding(var, result))

    def _inline(self, func: gx.Function, args: tuple[gx.Expr, ...]) -> gx.Expr:
        vmap: dict = {}
        for p, a in zip(func.params, args):
            _bind_sym(p.struct_info, a.struct_info, vmap)
        copier = _BodyCopier(self.builder, vmap, dict(zip(func.params, args)))
        for blk in func.body.blocks:
            for binding in blk.bindings:
                copier.visit_binding(binding)
        return copier.visit_expr(func.body.body)


def _same(a: Any, b: Any) -> bool:
    return a is not None and b is not None and sinfo_equal(a, b)


@module_pass(opt_level=1)
class Inline:
    """Inline calls of private graph functions marked "inline" or called exactly once."""

    def __init__(self, functions: Iterable[str] = ()):
        if isinstance(functions, str):
            functions = (functions,)
        self.functions = tuple(functions)

    def _targets(self, mod: IRModule) -> set[str]:
        counts = _call_counts(mod)
        recursive = _recursive(mod)
        out = set()
        for name, func in mod.items():
            if not isinstance(func, gx.Function) or not is_private(name, func):
                continue
            flag = func.attrs.get("inline")
            if flag is False or name in recursive or _has_match_cast(func):
                continue
            if flag is True or counts.get(name, 0) == 1 or name in self.functions:
                out.add(name)
        return out

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        targets = self._targets(mod)
        if not targets:
            return mod.copy()
        bb = BlockBuilder(mod)
        current = dict(mod.items())
        inlined: set[str] = set()
        for name in callees_first(mod):
            func = current[name]
            purity = Purity(IRModule(current))
            inliner = _Inliner(bb, current, targets - {name}, purity)
            new = inliner.visit(func)
            inlined |= inliner.inlined
            if new is not func:
                bb.update_func(name, new)
                current[name] = new
        out = bb.get()
        roots = [n for n in out if n not in inlined]
        keep = reachable_functions(out, roots)
        for name in inlined:
            if name not in keep and is_private(name, out[name]):
                del out[name]
        return out
