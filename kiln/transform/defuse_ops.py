"""DefuseOps: undo operator fusion at graph level.

A binding that calls a Primitive graph function (made by FuseOps), or ``call_tir``\\ s a fused
PrimFunc (made by FuseTIR, which records its Primitive function and member PrimFuncs in the
``kiln.fused_group`` attr), is replaced by the member ``call_tir`` bindings, in order, with the
call's arguments in place of the parameters; the original variable is bound to the member
result (or to a tuple of the results for a multi-output group). Member PrimFuncs are put back
into the module (under their recorded names where free), and Primitive functions and fused
PrimFuncs nothing calls any more are removed. ``DefuseOps()(FuseOps()(mod))`` gives back
``mod`` up to variable names (and likewise through FuseTIR).

Use it to debug a numerical difference that appears with fusion, or to re-run fusion with other
settings on an already fused module.
"""

from __future__ import annotations

from typing import Any

from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import ExprMutator
from ..ir.errors import KilnError
from ..ir.module import IRModule
from ..tir.function import PrimFunc
from .fuse_tir import FusedGroup, referenced_functions
from .pass_infra import PassContext, module_pass

__all__ = ["DefuseOps"]


def _member_bindings(func: gx.Function, name: str) -> list[gx.VarBinding]:
    body = func.body
    if not isinstance(body, gx.SeqExpr):
        raise KilnError(f"DefuseOps: Primitive function {name} has no binding blocks")
    out = []
    for block in body.blocks:
        for b in block.bindings:
            if not isinstance(b, gx.VarBinding):
                raise KilnError(f"DefuseOps: {name}: {b.var.name_hint} is not a plain binding")
            out.append(b)
    return out


class _Defuser(ExprMutator):
    """Expands calls of Primitive functions / fused PrimFuncs into their member bindings."""

    def __init__(self, bb: BlockBuilder, groups: dict[str, tuple[gx.Function, dict[str, str]]],
                 prims: dict[str, gx.Function]):
        super().__init__(bb)
        self.groups = groups  # fused PrimFunc name -> (Primitive function, member renames)
        self.prims = prims  # Primitive graph function name -> function

    def _target(self, value: gx.Expr) -> tuple[gx.Function, dict[str, str], Any, str] | None:
        if not isinstance(value, gx.Call):
            return None
        op = value.op
        if isinstance(op, gx.GlobalVar) and op.name in self.prims:
            return self.prims[op.name], {}, value.args, op.name
        if isinstance(op, gx.Op) and op.name == "call_tir":
            gv, args = value.args[0], value.args[1]
            if isinstance(gv, gx.GlobalVar) and gv.name in self.groups and isinstance(
                    args, gx.Tuple):
                func, rename = self.groups[gv.name]
                return func, rename, args.fields, gv.name
        return None

    def visit_VarBinding(self, b: gx.VarBinding) -> None:
        target = self._target(b.value)
        if target is None:
            super().visit_VarBinding(b)
            return
        func, rename, args, name = target
        args = [self.visit_expr(a) for a in args]
        if len(args) != len(func.params):
            raise KilnError(f"DefuseOps: call of {name} passes {len(args)} argument(s), the "
                            f"function takes {len(func.params)}")
        env: dict[gx.Var, gx.Expr] = dict(zip(func.params, args))
        result = func.body.body
        outs = list(result.fields) if isinstance(result, gx.Tuple) else [result]
        var = self._def(b.var)
        single = outs[0] if len(outs) == 1 else None
        for mb in _member_bindings(func, name):
            value = self._substitute(mb.value, env, rename)
            if mb.var is single:
                self.builder.emit_normalized(gx.VarBinding(var, value))
                env[mb.var] = var
            else:
                env[mb.var] = self.builder.emit(value, mb.var.name_hint)
        if single is None:
            tup = self.builder.normalize(gx.Tuple(tuple(env[v] for v in outs)))
            self.builder.emit_normalized(gx.VarBinding(var, tup))

    def _substitute(self, value: gx.Expr, env: dict[gx.Var, gx.Expr], rename: dict[str, str]
                    ) -> gx.Expr:
        if isinstance(value, gx.Call) and isinstance(value.op, gx.Op) and \
                value.op.name == "call_tir":
            gv, args = value.args[0], value.args[1]
            gv = gx.GlobalVar(rename.get(gv.name, gv.name))
            fields = [env.get(a, a) if isinstance(a, gx.Var) else a for a in args.fields]
            return self.builder.normalize(gx.call_tir(gv, fields, value.sinfo_args[0]))

        class _Sub(ExprMutator):
            def visit_Var(self, v: gx.Var) -> gx.Expr:
                return env.get(v, v)

        return self.builder.normalize(_Sub(self.builder).visit_expr(value))


@module_pass(opt_level=0)
class DefuseOps:
    """Expand calls of Primitive functions and fused PrimFuncs back into their member calls."""

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        prims = {n: f for n, f in mod.items()
                 if isinstance(f, gx.Function) and f.attrs.get("Primitive")}
        fused = {n: f for n, f in mod.items()
                 if isinstance(f, PrimFunc) and isinstance(f.attrs.get("kiln.fused_group"),
                                                           FusedGroup)}
        if not prims and not fused:
            return mod.copy()
        bb = BlockBuilder(mod)
        groups: dict[str, tuple[gx.Function, dict[str, str]]] = {}
        for name, pf in fused.items():
            record: FusedGroup = pf.attrs["kiln.fused_group"]
            rename = {}
            for mname, mfunc in record.members:
                rename[mname] = bb.add_func(mfunc, mname).name
            groups[name] = (record.func, rename)
        for name, func in mod.items():
            if isinstance(func, gx.Function) and name not in prims:
                new = _Defuser(bb, groups, prims).visit(func)
                if new is not func:
                    bb.update_func(name, new)
        out = bb.get()
        live = referenced_functions(out)
        for name in (*prims, *fused):
            if name not in live and name in out:
                del out[name]
        return out
