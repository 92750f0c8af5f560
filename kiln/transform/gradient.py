"""Gradient: reverse-mode automatic differentiation of a graph function.

``Gradient("main", require_grads=None)(mod)`` adds ``main_adjoint`` to the module: it takes the
same parameters as ``main`` and returns ``(result, (d result / d p for p in require_grads))``.
The result must be a float scalar (a loss): the gradient is that of one number, as in TVM's
Relax ``Gradient``. The adjoint function is ordinary graph IR (one dataflow block: the forward
bindings, then the backward ones), so every other pass, ``kiln.build`` and the memory planning
of the execution plan treat it like any function.

How it works:

- The forward bindings (A-normal form) are copied, then visited in reverse. Each value's
  *adjoint* starts unknown; the result's is 1. A binding passes its adjoint to its operands:
  an operator call through the ``gradient`` rule of its declaration (``kiln.op.registry``), a
  tuple field by field, ``t[i]`` to field ``i`` of ``t``, an alias to the aliased value.
- Contributions accumulate with ``add``; the first contribution is used as it is, so no zero
  tensor is ever made to start a sum (the idea of TVM's LazyGradientInit). Only a requested
  parameter that receives no gradient at all gets an explicit zero tensor (a broadcast scalar),
  and a field of a tuple-valued op's result that has no adjoint gets one when the op's rule
  needs the whole tuple (``split``).
- Only values that depend on a requested parameter are differentiated, and only float tensors
  carry gradients (an index or a mask has none).
- A non-differentiable operator (``gradient=NON_DIFFERENTIABLE``) or one without a rule is an
  error when a gradient must flow through it: the message names the operator, the binding,
  its input and the parameter whose gradient it blocks. A requested parameter whose every path
  to the result goes through such an operator is reported the same way, instead of silently
  getting a zero gradient.
- Bindings emitted by rules that turn out unused (an intermediate a rule shares between its
  inputs, when only one input needs a gradient) are removed at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..graph import expr as gx
from ..graph.block_builder import BlockBuilder
from ..graph.functor import free_vars
from ..graph.shape_utils import input_name
from ..graph.struct_info import (
    TensorStructInfo,
    TupleStructInfo,
    shapes_equal,
)
from ..ir.dtype import as_dtype
from ..ir.errors import InternalError, KilnError
from ..ir.module import IRModule
from ..op.common import scalar
from ..op.elementwise import add
from ..op.grad import zeros
from ..op.registry import NON_DIFFERENTIABLE, get_op_def
from .pass_infra import PassContext, module_pass

__all__ = ["Gradient", "gradient_function"]


@module_pass(opt_level=0, name="Gradient")
class Gradient:
    """Add ``<func>_adjoint``: the function's scalar result and its gradients (reverse mode)."""

    def __init__(self, func_name: str = "main",
                 require_grads: Sequence[gx.Var | str] | None = None):
        self.func_name = func_name
        self.require_grads = None if require_grads is None else list(require_grads)

    def transform_module(self, mod: IRModule, ctx: PassContext) -> IRModule:
        if self.func_name not in mod:
            raise KilnError(f"Gradient: the module has no function named {self.func_name!r}")
        func = mod[self.func_name]
        if not isinstance(func, gx.Function):
            raise KilnError(f"Gradient: {self.func_name} is not a graph function")
        name = f"{self.func_name}_adjoint"
        if name in mod:
            raise KilnError(f"Gradient: the module already has a function named {name!r}")
        bb = BlockBuilder(mod)
        gradient_function(bb, func, self.func_name, name, self.require_grads)
        return bb.get()


# ---------------------------------------------------------------------------------------------
# the transformation
# ---------------------------------------------------------------------------------------------
def _is_float_tensor(sinfo: Any) -> bool:
    return isinstance(sinfo, TensorStructInfo) and as_dtype(sinfo.dtype).is_float


def _carries_gradient(sinfo: Any) -> bool:
    if isinstance(sinfo, TupleStructInfo):
        return any(_carries_gradient(f) for f in sinfo.fields)
    return _is_float_tensor(sinfo)


def _resolve_params(func: gx.Function, fname: str, require: Sequence[Any] | None) -> list[int]:
    """Indices of the parameters to differentiate (default: every float tensor parameter)."""
    params = list(func.params)
    if require is None:
        idx = [k for k, p in enumerate(params) if _is_float_tensor(p.struct_info)]
        if not idx:
            raise KilnError(f"Gradient: {fname} has no float tensor parameter to differentiate")
        return idx
    idx = []
    for r in require:
        if isinstance(r, str):
            hits = [k for k, p in enumerate(params) if p.name == r]
            if len(hits) != 1:
                names = [p.name for p in params]
                raise KilnError(f"Gradient: {fname} has {'no' if not hits else 'several'} "
                                f"parameter(s) named {r!r} (parameters: {names})")
            k = hits[0]
        elif isinstance(r, gx.Var):
            hits = [k for k, p in enumerate(params) if p is r]
            if not hits:
                raise KilnError(f"Gradient: {r.name} is not a parameter of {fname}")
            k = hits[0]
        else:
            raise KilnError(f"Gradient: require_grads entries must be parameter Vars or names, "
                            f"got {r!r}")
        if not _is_float_tensor(params[k].struct_info):
            raise KilnError(f"Gradient: parameter {params[k].name} of {fname} is not a float "
                            f"tensor ({params[k].struct_info}); only float tensors have gradients")
        if k in idx:
            raise KilnError(f"Gradient: parameter {params[k].name} is requested twice")
        idx.append(k)
    return idx


def _bindings(func: gx.Function, fname: str) -> tuple[list[gx.VarBinding], gx.Expr]:
    """The function's bindings (all blocks, in order) and its result expression."""
    body = func.body
    if not isinstance(body, gx.SeqExpr):
        if not gx.is_leaf(body):
            raise KilnError(f"Gradient: {fname} is not normalized (run Normalize first)")
        return [], body
    out = []
    for block in body.blocks:
        for b in block.bindings:
            if not isinstance(b, gx.VarBinding):
                raise KilnError(f"Gradient: {fname}: binding {b.var.name} is a "
                                f"{type(b).__name__}, which Gradient does not support")
            v = b.value
            if isinstance(v, gx.Call) and not isinstance(v.op, gx.Op):
                raise KilnError(f"Gradient: {fname}: binding {b.var.name} calls a function "
                                f"({gx._callee_name(v.op)}); inline it first")
            if isinstance(v, gx.Call) and v.op.name == "call_tir":
                raise KilnError(f"Gradient: {fname}: binding {b.var.name} is a call_tir; "
                                "differentiate before LegalizeOps")
            if isinstance(v, gx.If | gx.Function | gx.SeqExpr):
                raise KilnError(f"Gradient: {fname}: binding {b.var.name} is a "
                                f"{type(v).__name__}, which Gradient does not support")
            out.append(b)
    return out, body.body


def _check_scalar_result(func: gx.Function, fname: str) -> None:
    ret = func.ret_struct_info
    ok = _is_float_tensor(ret) and (ret.ndim == 0)
    if not ok:
        raise KilnError(
            f"Gradient: {fname} must return a float scalar (a 0-d float tensor, e.g. a loss) to "
            f"be differentiated; it returns {ret}. Reduce it to one number first (kiln.op.sum "
            "or kiln.op.mean)"
        )


class _Adjoints:
    """Adjoint of every differentiated value: an emitted leaf for a tensor, a list (one entry
    per field, None where unknown) for a tuple; contributions accumulate with ``add``."""

    def __init__(self, bb: BlockBuilder, fname: str):
        self.bb = bb
        self.fname = fname
        self.adj: dict[int, Any] = {}
        self.deps: dict[int, int] = {}  # id(var) -> bitmask of requested params it depends on

    def get(self, var: gx.Var) -> Any:
        return self.adj.get(id(var))

    def contribute(self, target: gx.Expr, value: Any, what: str) -> None:
        """Add ``value`` (an expression, or a list for a tuple) to ``target``'s adjoint."""
        if value is None:
            return
        if isinstance(target, gx.Tuple):
            fields = self._fields(value, len(target.fields))
            for k, (f, v) in enumerate(zip(target.fields, fields)):
                self.contribute(f, v, f"{what}[{k}]")
            return
        if not isinstance(target, gx.Var) or not self.deps.get(id(target)):
            return  # a constant, or a value no requested parameter flows into
        sinfo = target.struct_info
        if not _carries_gradient(sinfo):
            return
        self.adj[id(target)] = self._add(self.adj.get(id(target)), value, sinfo, what)

    def contribute_field(self, target: gx.Expr, index: int, value: Any, what: str) -> None:
        if isinstance(target, gx.Tuple):
            self.contribute(target.fields[index], value, what)
            return
        sinfo = target.struct_info
        if not isinstance(target, gx.Var) or not isinstance(sinfo, TupleStructInfo):
            return
        if not self.deps.get(id(target)):
            return
        partial: list[Any] = [None] * len(sinfo.fields)
        partial[index] = value
        self.contribute(target, partial, what)

    def _fields(self, value: Any, n: int) -> list[Any]:
        if isinstance(value, list):
            return value
        if isinstance(value, gx.Tuple):
            return list(value.fields)
        return [gx.TupleGetItem(value, k) for k in range(n)]

    def _add(self, old: Any, new: Any, sinfo: Any, what: str) -> Any:
        if isinstance(sinfo, TupleStructInfo):
            new_f = self._fields(new, len(sinfo.fields))
            old_f = old if old is not None else [None] * len(sinfo.fields)
            return [self._add(o, v, s, f"{what}[{k}]") if v is not None else o
                    for k, (o, v, s) in enumerate(zip(old_f, new_f, sinfo.fields))]
        if not _is_float_tensor(sinfo):
            return old
        new = self._leaf(new, sinfo, what)
        if old is None:
            return new

        return self.bb.emit(add(old, new), "grad")

    def _leaf(self, expr: Any, sinfo: Any, what: str) -> Any:
        if not isinstance(expr, gx.Expr):
            raise InternalError(f"Gradient: {what}: a gradient rule returned {expr!r}")
        if not gx.is_leaf(expr):
            expr = self.bb.emit(expr, "grad")
        got = expr.struct_info
        if not (isinstance(got, TensorStructInfo) and as_dtype(got.dtype) == as_dtype(sinfo.dtype)
                and (sinfo.shape is None or got.shape is None
                     or shapes_equal(got.shape, sinfo.shape))):
            raise InternalError(
                f"Gradient of {self.fname}: {what}: the adjoint has StructInfo {got}, but the "
                f"value it belongs to has {sinfo} (a gradient rule is wrong)"
            )
        return expr

    def as_output_grad(self, var: gx.Var) -> Any:
        """The adjoint in the form gradient rules take: a leaf, or an explicit Tuple with
        zeros for fields that have none."""
        return self._materialize(self.adj[id(var)], var.struct_info)

    def _materialize(self, value: Any, sinfo: Any) -> Any:
        if isinstance(sinfo, TupleStructInfo):
            fields = value if isinstance(value, list) else [None] * len(sinfo.fields)
            return gx.Tuple(tuple(self._materialize(v, s) for v, s in zip(fields, sinfo.fields)))
        if value is None:
            return self.bb.emit(zeros(sinfo), "zeros")
        return value


def _substitute(expr: Any, old: gx.Expr, new: gx.Expr) -> Any:
    """``expr`` with the node ``old`` (by identity) replaced by ``new``."""
    if expr is old:
        return new
    if isinstance(expr, gx.Call):
        args = tuple(_substitute(a, old, new) for a in expr.args)
        return expr if all(a is b for a, b in zip(args, expr.args)) else expr.replace(args=args)
    if isinstance(expr, gx.Tuple):
        fields = tuple(_substitute(f, old, new) for f in expr.fields)
        return expr if all(a is b for a, b in zip(fields, expr.fields)) else gx.Tuple(fields)
    if isinstance(expr, gx.TupleGetItem):
        tv = _substitute(expr.tuple_value, old, new)
        return expr if tv is expr.tuple_value else gx.TupleGetItem(tv, expr.index)
    return expr


def _remap(expr: gx.Expr, remap: dict[int, gx.Var]) -> gx.Expr:
    """A copy of an A-normal-form value with variables renamed through ``remap``."""
    if isinstance(expr, gx.Var):
        return remap.get(id(expr), expr)
    if isinstance(expr, gx.Call):
        args = tuple(_remap(a, remap) for a in expr.args)
        return gx.Call(expr.op, args, expr.attrs, expr.sinfo_args)
    if isinstance(expr, gx.Tuple):
        return gx.Tuple(tuple(_remap(f, remap) for f in expr.fields))
    if isinstance(expr, gx.TupleGetItem):
        return gx.TupleGetItem(_remap(expr.tuple_value, remap), expr.index)
    return expr


def _leaves(expr: gx.Expr) -> list[gx.Var]:
    """The variables an A-normal-form value uses."""
    return free_vars(expr) if isinstance(expr, gx.Expr) else []


def gradient_function(bb: BlockBuilder, func: gx.Function, fname: str, name: str,
                      require_grads: Sequence[Any] | None = None) -> gx.GlobalVar:
    """Build the adjoint of ``func`` (called ``fname`` in messages) as function ``name`` of the
    module ``bb`` builds; returns its GlobalVar. See the module docstring."""
    _check_scalar_result(func, fname)
    wanted = _resolve_params(func, fname, require_grads)
    bindings, result = _bindings(func, fname)
    params = [gx.Var(p.name, p.struct_info) for p in func.params]
    remap = {id(p): q for p, q in zip(func.params, params)}
    # a public entry point (DeadCodeElimination keeps functions with a global_symbol)
    attrs = {**func.attrs, "global_symbol": name}
    state = _Adjoints(bb, fname)
    for bit, k in enumerate(wanted):
        state.deps[id(params[k])] = 1 << bit
    forward: list[tuple[gx.VarBinding, gx.Var, gx.Expr]] = []
    with bb.function(name, params, attrs):
        with bb.dataflow():
            for b in bindings:
                value = _remap(b.value, remap)
                var = bb.emit(value, b.var.name)
                remap[id(b.var)] = var
                new_value = bb.lookup_binding(var)
                dep = 0
                for v in _leaves(new_value):
                    dep |= state.deps.get(id(v), 0)
                state.deps[id(var)] = dep
                forward.append((b, var, new_value))
            out = _remap(result, remap)
            n_forward = len(forward)
            if isinstance(out, gx.Var) and state.deps.get(id(out)):
                state.adj[id(out)] = scalar(1, out.struct_info.dtype)
            for _, var, value in reversed(forward):
                if not state.deps.get(id(var)) or state.get(var) is None:
                    continue
                _backward_binding(state, var, value, fname, params, wanted)
            grads = []
            for k in wanted:
                p = params[k]
                g = state.get(p)
                if g is None:
                    _check_not_blocked(fname, func, bindings, result, k, wanted)

                    g = bb.emit(zeros(p.struct_info), f"d_{p.name}")
                grads.append(g)
            gv = bb.emit_output(gx.Tuple((out, gx.Tuple(tuple(grads)))), name_hint="gv")
        bb.emit_func_output(gv)
    gvar = gx.GlobalVar(name)
    adjoint = _sweep(bb.get()[name], n_forward)
    bb.update_func(gvar, adjoint)
    return gvar


def _backward_binding(state: _Adjoints, var: gx.Var, value: gx.Expr, fname: str,
                      params: list[gx.Var], wanted: list[int]) -> None:
    """Pass the adjoint of ``var = value`` on to the operands of ``value``."""
    adj = state.get(var)
    if isinstance(value, gx.Var | gx.Tuple):
        if isinstance(value, gx.Tuple) and not isinstance(adj, list):
            adj = state._fields(adj, len(value.fields))
        state.contribute(value, adj, f"binding {var.name}")
        return
    if isinstance(value, gx.TupleGetItem):
        state.contribute_field(value.tuple_value, value.index, adj, f"binding {var.name}")
        return
    if not isinstance(value, gx.Call):
        return  # constants and other leaves: nothing to pass on
    opdef = get_op_def(value.op.name)
    rule = opdef.gradient
    if rule is NON_DIFFERENTIABLE or rule is None:
        blocked = [k for k, a in enumerate(value.args) if _dep_of(state, a)]
        k = blocked[0]
        names = _param_names(_dep_of(state, value.args[k]), params, wanted)
        why = ("is not differentiable" if rule is NON_DIFFERENTIABLE
               else "declares no gradient rule (gradient= in its declaration)")
        raise KilnError(
            f"Gradient of {fname}: operator {opdef.name} (binding {var.name}) {why}, but the "
            f"gradient with respect to {names} must flow through its input "
            f"{input_name(value, k)}"
        )
    grad = state.as_output_grad(var)
    try:
        contribs = rule(value, grad, state.bb)
    except KilnError as err:
        raise KilnError(f"Gradient of {fname}: binding {var.name} ({opdef.name}): {err}"
                        ) from err
    if not isinstance(contribs, (list, tuple)) or len(contribs) != len(value.args):
        raise InternalError(
            f"Gradient: the gradient rule of {opdef.name} returned {contribs!r}; expected a list "
            f"of {len(value.args)} adjoint(s) (one per input)"
        )
    for k, (arg, c) in enumerate(zip(value.args, contribs)):
        if c is None or not _dep_of(state, arg):
            continue
        c = _substitute(c, value, var)
        state.contribute(arg, c, f"{opdef.name} (binding {var.name}) {input_name(value, k)}")


def _dep_of(state: _Adjoints, expr: gx.Expr) -> int:
    dep = 0
    for v in _leaves(expr):
        dep |= state.deps.get(id(v), 0)
    return dep


def _param_names(mask: int, params: list[gx.Var], wanted: list[int]) -> str:
    names = [params[k].name for bit, k in enumerate(wanted) if mask >> bit & 1]
    return ", ".join(names)


def _check_not_blocked(fname: str, func: gx.Function, bindings: list[gx.VarBinding],
                       result: gx.Expr, k: int, wanted: list[int]) -> None:
    """Raise when parameter ``k`` reaches the result only through non-differentiable ops."""
    param = func.params[k]
    dep: dict[int, bool] = {id(param): True}
    for b in bindings:
        dep[id(b.var)] = any(dep.get(id(v), False) for v in _leaves(b.value))
    live: set[int] = {id(v) for v in _leaves(result)}
    for b in reversed(bindings):
        if id(b.var) in live:
            live.update(id(v) for v in _leaves(b.value))
    for b in bindings:
        v = b.value
        if id(b.var) not in live or not isinstance(v, gx.Call):
            continue
        rule = get_op_def(v.op.name).gradient
        if rule is not NON_DIFFERENTIABLE and rule is not None:
            continue
        for i, a in enumerate(v.args):
            if any(dep.get(id(x), False) for x in _leaves(a)):
                why = "is not differentiable" if rule is NON_DIFFERENTIABLE else \
                    "declares no gradient rule"
                raise KilnError(
                    f"Gradient of {fname}: the gradient with respect to parameter {param.name} "
                    f"is blocked: {param.name} reaches the result only through operator "
                    f"{v.op.name} (binding {b.var.name}, {input_name(v, i)}), which {why}"
                )


def _sweep(func: gx.Function, n_forward: int) -> gx.Function:
    """Drop backward bindings whose variables are never used (forward bindings are kept as
    they were: they are the function being differentiated)."""
    body = func.body
    if len(body.blocks) != 1:
        return func
    bindings = list(body.blocks[0].bindings)
    used = {id(v) for v in _leaves(body.body)}
    keep = []
    for pos in range(len(bindings) - 1, -1, -1):
        b = bindings[pos]
        if pos >= n_forward and id(b.var) not in used:
            continue
        keep.append(b)
        used.update(id(v) for v in _leaves(b.value))
    keep.reverse()
    if len(keep) == len(bindings):
        return func
    new_body = gx.SeqExpr((gx.DataflowBlock(tuple(keep)),), body.body)
    return gx.Function(func.params, new_body, func.ret_struct_info, func.attrs)
