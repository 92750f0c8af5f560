"""BindParams: turn parameters of a graph function into constants (trained weights).

``BindParams("main", {"w": w_array, ...})`` removes the named parameters from ``main`` and
replaces their uses by Constants. Each value must match its parameter exactly: same dtype (no
silent casting), same rank, and every static dimension equal. A symbolic dimension of a bound
parameter is *bound* by the value's size: ``w: Tensor((n, 64))`` bound to a ``(128, 64)`` array
sets ``n = 128`` everywhere in the function (other parameters' shapes, reshape targets, shape
values...), and StructInfo is re-inferred so that shapes become static. Two values that give the
same symbolic dimension different sizes are an error naming both parameters.

Keys may be parameter names or the parameter Vars themselves. Errors are KilnErrors naming the
function and the parameter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import tir
from ..arith import simplify
from ..graph import expr as gx
from ..graph.functor import ExprMutator
from ..graph.struct_info import TensorStructInfo
from ..ir.dtype import DataType
from ..ir.errors import KilnError
from ..ir.module import IRModule
from .normalize import Reinferrer
from .pass_infra import PassContext, module_pass

__all__ = ["BindParams", "bind_params", "substitute_sym_vars"]


def _simplify(e: Any) -> Any:
    if isinstance(e, tir.PrimExpr) and not isinstance(e, (tir.IntImm, tir.Var)):
        return simplify(e)
    return e


def _subst(x: Any, vmap: Mapping[tir.Var, tir.PrimExpr]) -> Any:
    """Substitute symbolic vars in a StructInfo, PrimExpr or tuple of them (simplified)."""
    if x is None:
        return None
    new = tir.substitute(x, vmap)
    if isinstance(new, tuple):
        return tuple(_simplify(e) for e in new)
    return _simplify(new) if new is not x else x


def _subst_attrs(attrs: Any, vmap: Mapping[tir.Var, tir.PrimExpr]) -> Any:
    if attrs is None or not dataclasses.is_dataclass(attrs):
        return attrs
    def plain(v: Any) -> Any:  # a dimension that became constant is written as an int
        return v.value if isinstance(v, tir.IntImm) else v

    changes = {}
    for f in dataclasses.fields(attrs):
        old = getattr(attrs, f.name)
        new = _subst(old, vmap)
        if new is not old:
            changes[f.name] = tuple(plain(v) for v in new) if isinstance(new, tuple) else plain(
                new)
    return dataclasses.replace(attrs, **changes) if changes else attrs


class SymSubstituter(ExprMutator):
    """Replaces symbolic TIR variables throughout a graph function."""

    def __init__(self, mod: Any, vmap: Mapping[tir.Var, tir.PrimExpr]):
        super().__init__(mod)
        self.vmap = dict(vmap)

    def visit_var_def(self, v: gx.Var) -> gx.Var:
        sinfo = _subst(v.struct_info, self.vmap)
        return v if sinfo is v.struct_info else v.replace(struct_info=sinfo)

    def visit_ShapeExpr(self, e: gx.ShapeExpr) -> gx.Expr:
        values = _subst(e.values, self.vmap)
        return e if values is e.values else gx.ShapeExpr(values)

    def visit_PrimValue(self, e: gx.PrimValue) -> gx.Expr:
        value = _subst(e.value, self.vmap)
        return e if value is e.value else gx.PrimValue(value)

    def visit_Call(self, c: gx.Call) -> gx.Expr:
        op = c.op if isinstance(c.op, (gx.Op, gx.GlobalVar, gx.ExternFunc)) else self.visit_expr(
            c.op)
        args = tuple(self.visit_expr(a) for a in c.args)
        attrs = _subst_attrs(c.attrs, self.vmap)
        sinfo_args = tuple(_subst(s, self.vmap) for s in c.sinfo_args)
        if (op is c.op and attrs is c.attrs and all(a is b for a, b in zip(args, c.args))
                and all(a is b for a, b in zip(sinfo_args, c.sinfo_args))):
            return c
        return self.builder.normalize(
            c.replace(op=op, args=args, attrs=attrs, sinfo_args=sinfo_args))

    def visit_MatchCast(self, b: gx.MatchCast) -> None:
        value = self.visit_expr(b.value)
        if value is not b.value:
            value = self.builder.normalize(value, anf=True)
        sinfo = _subst(b.struct_info, self.vmap)
        var = self._def(b.var)
        if value is b.value and var is b.var and sinfo is b.struct_info:
            self.builder.emit_normalized(b)
            return
        self.builder.emit_normalized(gx.MatchCast(var, value, sinfo))


def substitute_sym_vars(func: gx.Function, vmap: Mapping[tir.Var, tir.PrimExpr],
                        mod: IRModule | None = None) -> gx.Function:
    """``func`` with the symbolic dimension variables of ``vmap`` replaced everywhere (var
    annotations, attributes, shape values, call_tir outputs, the result annotation)."""
    if not vmap:
        return func
    sub = SymSubstituter(mod, vmap)
    new = sub.visit(func)
    ret = _subst(func.ret_struct_info, vmap)
    if ret is not func.ret_struct_info:
        new = gx.Function(new.params, new.body, ret, new.attrs)
    return new


def _match_shape(fname: str, pname: str, sinfo: TensorStructInfo, value: np.ndarray,
                 vmap: dict[tir.Var, tir.PrimExpr], origin: dict[tir.Var, str]) -> None:
    want = f"{sinfo}"
    if sinfo.ndim >= 0 and sinfo.ndim != value.ndim:
        raise KilnError(
            f"BindParams: {fname} parameter {pname!r} expects {want} (rank {sinfo.ndim}) but the "
            f"value has shape {value.shape} (rank {value.ndim})"
        )
    if sinfo.shape is None:
        return
    for d, (dim, size) in enumerate(zip(sinfo.shape, value.shape)):
        if isinstance(dim, tir.IntImm):
            if dim.value != size:
                raise KilnError(
                    f"BindParams: {fname} parameter {pname!r} expects {want} but the value has "
                    f"shape {value.shape} (dimension {d}: {dim.value} vs {size})"
                )
        elif isinstance(dim, tir.Var):
            bound = vmap.get(dim)
            if bound is not None and bound.value != size:
                raise KilnError(
                    f"BindParams: {fname} parameter {pname!r} gives dimension {dim.name} the size "
                    f"{size}, but parameter {origin[dim]!r} gave it {bound.value}"
                )
            vmap[dim] = tir.IntImm("int64", int(size))
            origin.setdefault(dim, pname)
        else:
            expected = _simplify(tir.substitute(dim, vmap))
            if isinstance(expected, tir.IntImm) and expected.value != size:
                raise KilnError(
                    f"BindParams: {fname} parameter {pname!r} expects {want} but the value has "
                    f"shape {value.shape} (dimension {d} must be {expected.value})"
                )


def bind_params(mod: IRModule, params: Mapping[Any, Any], func_name: str = "main") -> IRModule:
    """Replace parameters of ``func_name`` named in ``params`` by constants (see module doc)."""
    if func_name not in mod:
        raise KilnError(f"BindParams: the module has no function named {func_name!r}")
    func = mod[func_name]
    if not isinstance(func, gx.Function):
        raise KilnError(f"BindParams: {func_name} is not a graph function")
    by_name: dict[str, list[gx.Var]] = {}
    for p in func.params:
        by_name.setdefault(p.name_hint, []).append(p)
    mapping: dict[gx.Var, gx.Constant] = {}
    vmap: dict[tir.Var, tir.PrimExpr] = {}
    origin: dict[tir.Var, str] = {}
    for key, value in params.items():
        if isinstance(key, gx.Var):
            if not any(key is p for p in func.params):
                raise KilnError(f"BindParams: {key.name_hint!r} is not a parameter of {func_name}")
            var = key
        else:
            found = by_name.get(key, [])
            if not found:
                raise KilnError(
                    f"BindParams: {func_name} has no parameter named {key!r}; its parameters "
                    f"are {[p.name_hint for p in func.params]}"
                )
            if len(found) > 1:
                raise KilnError(f"BindParams: {func_name} has {len(found)} parameters named "
                                f"{key!r}; pass the Var itself as the key")
            var = found[0]
        name = var.name_hint
        try:
            arr = np.asarray(value)
        except Exception as err:  # noqa: BLE001 - any failure to make an array is the user's
            raise KilnError(f"BindParams: value of parameter {name!r} is not an array: {err}"
                            ) from err
        sinfo = var.struct_info
        if not isinstance(sinfo, TensorStructInfo):
            raise KilnError(f"BindParams: parameter {name!r} of {func_name} is not a tensor "
                            f"({sinfo}); only tensors can be bound")
        try:
            got = DataType.from_numpy(arr.dtype)
        except Exception:  # noqa: BLE001 - object arrays, strings...
            raise KilnError(f"BindParams: value of parameter {name!r} has unsupported dtype "
                            f"{arr.dtype}") from None
        if got != sinfo.dtype:
            raise KilnError(
                f"BindParams: {func_name} parameter {name!r} expects dtype {sinfo.dtype} but the "
                f"value has dtype {got} (cast the array first)"
            )
        _match_shape(func_name, name, sinfo, arr, vmap, origin)
        mapping[var] = gx.Constant(np.array(arr, order="C"))
    new_params = tuple(p for p in func.params if p not in mapping)

    class _Bind(ExprMutator):
        def visit_Var(self, v: gx.Var) -> gx.Expr:
            c = mapping.get(v)
            return c if c is not None else super().visit_Var(v)

    stripped = gx.Function(new_params, func.body, func.ret_struct_info, func.attrs)
    new_func = _Bind(mod).visit(stripped)
    if vmap:
        new_func = substitute_sym_vars(new_func, vmap, mod)
        new_func = Reinferrer(mod).visit(new_func)
    return mod.with_function(func_name, new_func)


@module_pass(opt_level=0)
class BindParams:
    """Replace named parameters of a graph function by constant tensors."""

    def __init__(self, func_name: str = "main", params: Mapping[Any, Any] | None = None):
        if not isinstance(func_name, str):
            raise KilnError(f"BindParams: func_name must be a string, got {func_name!r}")
        self.func_name = func_name
        self.params = dict(params or {})

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        if not self.params:
            return mod.copy()
        return bind_params(mod, self.params, self.func_name)
